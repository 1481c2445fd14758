"""LoCoMo loader: published format -> internal form, evidence parsing, clear errors."""
from __future__ import annotations

import json
import logging

import pytest

from memkern.data import DatasetFormatError, load_locomo
from samples import locomo_sample as _sample


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


@pytest.mark.parametrize("answer, expect", [("a lake", "a lake"), (2022, "2022"), (3.5, "3.5"), ("", "")])
def test_answers_strings_and_numbers(tmp_path, answer, expect):
    s = _sample()
    s["qa"][0]["answer"] = answer
    assert load_locomo(_write(tmp_path, [s])).conversations[0].questions[0].answer == expect


@pytest.mark.parametrize("answer", [{"x": 1}, None, ["a"], True])
def test_answers_of_other_types_are_rejected(tmp_path, answer):
    """Issue 10 item 11: {"x": 1} and null became the strings "{'x': 1}" and "None"."""
    s = _sample()
    s["qa"][1]["answer"] = answer
    with pytest.raises(DatasetFormatError, match=r"sample\[0\] \(conv-1\)\.qa\[1\]\.answer: expected a string or a number"):
        load_locomo(_write(tmp_path, [s]))


def test_adversarial_answer_is_used_without_answer(tmp_path):
    s = _sample()
    s["qa"][2]["answer"] = None  # null answer + adversarial_answer: the adversarial one
    q = load_locomo(_write(tmp_path, [s])).conversations[0].questions[2]
    assert q.answer == "a lake" and q.question_type == "category_5"
    s["qa"][2]["adversarial_answer"] = {"x": 1}
    with pytest.raises(DatasetFormatError, match=r"qa\[2\]\.adversarial_answer: expected a string or a number"):
        load_locomo(_write(tmp_path, [s]))


@pytest.mark.parametrize("cat", [0, 6, 99, -1, "99", "x", True, 2.5])
def test_category_outside_1_to_5_is_rejected(tmp_path, cat):
    s = _sample()
    s["qa"][0]["category"] = cat
    with pytest.raises(DatasetFormatError, match=r"qa\[0\]\.category: expected"):
        load_locomo(_write(tmp_path, [s]))


def test_category_as_numeric_string(tmp_path):
    s = _sample()
    s["qa"][0]["category"] = "4"
    assert load_locomo(_write(tmp_path, [s])).conversations[0].questions[0].question_type == "category_4"


@pytest.mark.parametrize("sep", [",", ", ", ";", "; ", " ", "  ", "\t", " ,", ";,", " ; "])
def test_evidence_separators_of_the_published_file(tmp_path, sep):
    """Issue 17 item 6: the published file joins evidence ids with "; ", "," and spaces (e.g.
    "D8:6; D9:17", "D9:1 D4:4 D4:6"). Each separator, alone or combined, splits; removing any of
    them from the split pattern fails one of these cases."""
    s = _sample()
    s["qa"][0]["evidence"] = [sep.join(["D2:1", "D1:2", "D1:1"])]
    caplog_free = load_locomo(_write(tmp_path, [s]))
    q = caplog_free.conversations[0].questions[0]
    assert q.evidence_turn_ids == ["D2:1", "D1:2", "D1:1"]
    assert q.evidence_session_ids == ["session_2", "session_1"]
    assert caplog_free.meta["dropped_evidence"] == 1  # only the fixture's unknown D9:9


def test_evidence_sample_with_every_published_separator(tmp_path):
    """One LoCoMo-format sample whose evidence strings use the published joins side by side."""
    s = _sample()
    s["conversation"]["session_3"] = [{"speaker": "Caroline", "dia_id": f"D3:{k}", "text": f"turn {k}"}
                                      for k in range(1, 8)]
    s["conversation"]["session_3_date_time"] = "2:00 pm on 1 June, 2023"
    s["qa"] = [
        {"question": "a?", "answer": "x", "category": 1, "evidence": ["D3:6; D3:7"]},
        {"question": "b?", "answer": "x", "category": 1, "evidence": ["D3:1 D3:4 D3:6"]},
        {"question": "c?", "answer": "x", "category": 1, "evidence": ["D3:2,D3:3", "D1:1, D2:2"]},
        {"question": "d?", "answer": "x", "category": 1, "evidence": ["D3:5;D1:2 D2:1,D3:1"]},
    ]
    ds = load_locomo(_write(tmp_path, [s]))
    got = [q.evidence_turn_ids for q in ds.conversations[0].questions]
    assert got == [["D3:6", "D3:7"], ["D3:1", "D3:4", "D3:6"], ["D3:2", "D3:3", "D1:1", "D2:2"],
                   ["D3:5", "D1:2", "D2:1", "D3:1"]]
    assert ds.meta["dropped_evidence"] == 0


def test_unreadable_files_are_clear_memkern_errors(tmp_path):
    # a folder is read as per-conversation files: an empty one says what it expected
    with pytest.raises(DatasetFormatError, match=r"LoCoMo folder .*: expected \*\.json conversation files, got none"):
        load_locomo(tmp_path)
    p = tmp_path / "bad.json"
    p.write_bytes(b'[{"sample_id": "\xff\xfe"}]')
    with pytest.raises(DatasetFormatError, match=r"LoCoMo file .*bad\.json'?: expected UTF-8 text"):
        load_locomo(p)
    p.write_text('{"a": ' * 50_000 + "1" + "}" * 50_000)
    with pytest.raises(DatasetFormatError, match=r"LoCoMo file .*bad\.json'?: expected JSON nested at most"):
        load_locomo(p)


def _per_conversation(sample):
    """A sample in the per-conversation layout: the conversation's fields and qa at the top level."""
    return {**sample["conversation"], "qa": sample["qa"], "event_summary": {"ignored": True}}


def test_per_conversation_files_and_folders(tmp_path):
    ref = load_locomo(_write(tmp_path, [_sample("conv-3"), _sample("conv-26")]))
    d = tmp_path / "convs"
    d.mkdir()
    for sid in ("conv-26", "conv-3"):
        (d / f"{sid}.json").write_text(json.dumps(_per_conversation(_sample(sid))))
    (d / "notes.txt").write_text("not a conversation")
    one = load_locomo(d / "conv-26.json")  # one file: the sample id is the file name
    assert [c.conversation_id for c in one.conversations] == ["conv-26"]
    assert one.conversations[0].questions[0].question_id == "conv-26/q0"
    both = load_locomo(d)  # a folder: natural name order (conv-3 before conv-26)
    assert [c.conversation_id for c in both.conversations] == ["conv-3", "conv-26"]
    assert both.content_hash() == ref.content_hash()
    picked = load_locomo(d, conversations=["conv-26"])
    assert [c.conversation_id for c in picked.conversations] == ["conv-26"]
    assert load_locomo(tmp_path / "locomo.json", conversations=["conv-26", "conv-3"]).n_questions == 6
    # a folder with conversations given opens only those files
    (d / "conv-9.json").write_text("{broken")
    assert len(load_locomo(d, conversations=["conv-3"]).conversations) == 1
    with pytest.raises(DatasetFormatError, match="conv-9"):
        load_locomo(d)
    with pytest.raises(DatasetFormatError, match="conv-77"):
        load_locomo(d, conversations=["conv-3", "conv-77"])
    with pytest.raises(DatasetFormatError, match="conv-77"):
        load_locomo(tmp_path / "locomo.json", conversations=["conv-77"])
    with pytest.raises(DatasetFormatError, match="conversations"):
        load_locomo(d, conversations="conv-3")
    # a file with a sample_id keeps it
    (d / "renamed.json").write_text(json.dumps({**_per_conversation(_sample("x")), "sample_id": "conv-5"}))
    assert load_locomo(d / "renamed.json").conversations[0].conversation_id == "conv-5"
