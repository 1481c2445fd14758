"""LoCoMo loader: published format -> internal form, evidence parsing, clear errors."""
from __future__ import annotations

import json
import logging

import pytest

from memkern.data import DatasetFormatError, load_locomo


def _sample(sid="conv-1"):
    return {
        "sample_id": sid,
        "conversation": {
            "speaker_a": "Caroline", "speaker_b": "Melanie",
            "session_1_date_time": "1:56 pm on 8 May, 2023",
            "session_1": [
                {"speaker": "Caroline", "dia_id": "D1:1", "text": "I went to a support group yesterday."},
                {"speaker": "Melanie", "dia_id": "D1:2", "text": "That's great!"},
            ],
            "session_2_date_time": "1:14 pm on 25 May, 2023",
            "session_2": [
                {"speaker": "Melanie", "dia_id": "D2:1", "text": "I painted a lake.", "blip_caption": "a painting"},
                {"speaker": "Caroline", "dia_id": "D2:2", "text": "Lovely."},
            ],
        },
        "qa": [
            {"question": "When did Caroline go to the group?", "answer": "7 May 2023", "evidence": ["D1:1"], "category": 2},
            {"question": "What did Melanie paint?", "answer": "a lake", "evidence": ["D2:1; D1:2"], "category": 1},
            {"question": "What did Caroline paint?", "adversarial_answer": "a lake", "evidence": ["D2:1", "D9:9"],
             "category": 5},
        ],
    }


def _write(tmp_path, data):
    p = tmp_path / "locomo.json"
    p.write_text(json.dumps(data))
    return p


def test_load_maps_sessions_turns_questions(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="memkern"):
        ds = load_locomo(_write(tmp_path, [_sample(), _sample("conv-2")]))
    assert len(ds.conversations) == 2 and ds.n_questions == 6
    c = ds.conversations[0]
    assert [s.session_id for s in c.sessions] == ["session_1", "session_2"]
    assert c.sessions[0].date == "1:56 pm on 8 May, 2023"
    t = c.turn_map()
    assert t["D1:1"].role == "user" and t["D1:1"].speaker == "Caroline"
    assert t["D2:1"].role == "assistant" and "a painting" in t["D2:1"].content
    q0, q1, q2 = c.questions
    assert q0.evidence_turn_ids == ["D1:1"] and q0.question_type == "category_2"
    assert q1.evidence_turn_ids == ["D2:1", "D1:2"] and q1.evidence_session_ids == ["session_2", "session_1"]
    assert q2.answer == "a lake" and q2.evidence_turn_ids == ["D2:1"]  # unknown D9:9 dropped
    assert ds.meta["dropped_evidence"] == 2 and "D9:9" in caplog.text
    assert load_locomo(tmp_path / "locomo.json", limit=1).n_questions == 3


@pytest.mark.parametrize("mutate, field", [
    (lambda s: s.pop("conversation"), r"sample\[0\].conversation"),
    (lambda s: s["conversation"].pop("speaker_a"), "conversation.speaker_a"),
    (lambda s: s["conversation"]["session_1"][1].pop("dia_id"), r"session_1\[1\].dia_id"),
    (lambda s: s["conversation"]["session_2"][0].update(text=None), r"session_2\[0\].text"),
    (lambda s: s["qa"][0].pop("category"), r"qa\[0\].category"),
    (lambda s: s["qa"][1].pop("answer"), r"qa\[1\].answer"),
    (lambda s: s["qa"][0].update(evidence="D1:1"), r"qa\[0\].evidence"),
    (lambda s: s["conversation"]["session_2"][1].update(dia_id="D1:1"), "duplicate"),
    (lambda s: [s["conversation"].pop(k) for k in ("session_1", "session_2")], "session_1"),
])
def test_bad_fields_name_the_field(tmp_path, mutate, field):
    s = _sample()
    mutate(s)
    with pytest.raises(DatasetFormatError, match=field):
        load_locomo(_write(tmp_path, [s]))


def test_bad_files(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_locomo(tmp_path / "nope.json")
    with pytest.raises(DatasetFormatError, match="root"):
        load_locomo(_write(tmp_path, "hello"))
    p = tmp_path / "bad.json"
    p.write_text("[{")
    with pytest.raises(DatasetFormatError, match="valid JSON"):
        load_locomo(p)
