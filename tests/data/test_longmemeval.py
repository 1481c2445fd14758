"""LongMemEval loader: published format -> internal form, clear errors on bad files, round trip."""
from __future__ import annotations

import json

import pytest

from memkern.data import DatasetFormatError, generate_history, load_longmemeval, to_longmemeval


def _item(qid="q1", **over):
    d = {
        "question_id": qid,
        "question_type": "knowledge-update",
        "question": "Where do I work now?",
        "answer": "Nimbus",
        "question_date": "2023/06/01 (Thu) 10:00",
        "haystack_session_ids": ["sA", "sB"],
        "haystack_dates": ["2023/05/01 (Mon) 09:00", "2023/05/20 (Sat) 02:21"],
        "haystack_sessions": [
            [{"role": "user", "content": "I work at Acme.", "has_answer": True},
             {"role": "assistant", "content": "Nice."}],
            [{"role": "user", "content": "Weather talk."},
             {"role": "assistant", "content": "Sure."},
             {"role": "user", "content": "I moved to Nimbus!", "has_answer": True}],
        ],
        "answer_session_ids": ["sA", "sB"],
    }
    d.update(over)
    return d


def _write(tmp_path, data, name="lme.json"):
    p = tmp_path / name
    p.write_text(json.dumps(data))
    return p


def test_load_maps_turns_evidence_and_dates(tmp_path):
    ds = load_longmemeval(_write(tmp_path, [_item(), _item("q2", answer_session_ids=["sB"])]))
    assert len(ds.conversations) == 2 and ds.n_questions == 2
    c = ds.conversations[0]
    assert [s.session_id for s in c.sessions] == ["sA", "sB"]
    assert [t.turn_id for t in c.turns()] == ["sA#0", "sA#1", "sB#0", "sB#1", "sB#2"]
    assert c.sessions[1].date == "2023/05/20 (Sat) 02:21" and c.sessions[1].turns[2].date == c.sessions[1].date
    q = c.questions[0]
    assert q.evidence_turn_ids == ["sA#0", "sB#2"]
    assert q.evidence_session_ids == ["sA", "sB"] and q.question_type == "knowledge-update"
    # evidence restricted to the answer sessions when they carry has_answer turns
    assert ds.conversations[1].questions[0].evidence_turn_ids == ["sB#2"]
    assert ds.meta["source"].endswith("lme.json")
    # ids are stable: loading twice gives the same content hash
    assert load_longmemeval(tmp_path / "lme.json").content_hash() == ds.content_hash()


def test_limit_and_no_evidence(tmp_path):
    it = _item()
    for s in it["haystack_sessions"]:
        for t in s:
            t.pop("has_answer", None)
    ds = load_longmemeval(_write(tmp_path, [it, _item("q2")]), limit=1)
    assert ds.n_questions == 1 and ds.conversations[0].questions[0].evidence_turn_ids == []


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d.pop("question"), "question[0] (q1).question"),
    (lambda d: d.pop("haystack_sessions"), "haystack_sessions"),
    (lambda d: d.update(haystack_dates=["x"]), "haystack_sessions"),
    (lambda d: d.update(answer_session_ids="sA"), "answer_session_ids"),
    (lambda d: d["haystack_sessions"][1][0].pop("content"), "haystack_sessions[1][0].content"),
    (lambda d: d["haystack_sessions"][0][0].update(role=3), "haystack_sessions[0][0].role"),
])
def test_bad_fields_name_the_field(tmp_path, mutate, field):
    d = _item()
    mutate(d)
    with pytest.raises(DatasetFormatError, match=field.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(").replace(")", r"\)")):
        load_longmemeval(_write(tmp_path, [d]))


def test_bad_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="LongMemEval"):
        load_longmemeval(tmp_path / "missing.json")
    p = tmp_path / "trunc.json"
    p.write_text(json.dumps([_item()])[:-40])
    with pytest.raises(DatasetFormatError, match="expected valid JSON"):
        load_longmemeval(p)
    with pytest.raises(DatasetFormatError, match="root: expected a JSON list"):
        load_longmemeval(_write(tmp_path, {"a": 1}))
    with pytest.raises(DatasetFormatError, match="duplicate"):
        load_longmemeval(_write(tmp_path, [_item(), _item()]))
    with pytest.raises(ValueError):  # DatasetFormatError is a ValueError
        load_longmemeval(_write(tmp_path, [_item(question_id=None)]))


def test_generated_round_trip_keeps_evidence(tmp_path):
    ds = generate_history(1, 6, seed=3)
    p = _write(tmp_path, to_longmemeval(ds), "gen.json")
    back = load_longmemeval(p)
    assert back.n_questions == ds.n_questions
    orig = {q.question_id: (c, q) for c, q in ds.questions()}
    for c2, q2 in back.questions():
        c1, q1 = orig[q2.question_id]
        t1, t2 = c1.turn_map(), c2.turn_map()
        assert sorted(q2.evidence_turn_ids) == sorted(q1.evidence_turn_ids)
        assert [t2[e].content for e in sorted(q2.evidence_turn_ids)] == [t1[e].content for e in sorted(q1.evidence_turn_ids)]
        assert q2.evidence_session_ids == q1.evidence_session_ids and q2.answer == q1.answer


@pytest.mark.parametrize("value, expect", [(True, True), (False, False), (1, True), (0, False)])
def test_has_answer_accepts_booleans_and_0_1(tmp_path, value, expect):
    d = _item()
    d["haystack_sessions"][0][0]["has_answer"] = value
    ds = load_longmemeval(_write(tmp_path, [d]))
    assert ds.conversations[0].sessions[0].turns[0].has_answer is expect


@pytest.mark.parametrize("value", ["no", "false", "yes", 2, -1, 0.5, None, [], {}])
def test_has_answer_rejects_non_booleans(tmp_path, value):
    """Issue 10 item 11: "no" was read as True (bool("no")); now any non-boolean is an error
    naming the field and its path."""
    d = _item()
    d["haystack_sessions"][1][2]["has_answer"] = value
    with pytest.raises(DatasetFormatError, match=r"question\[0\] \(q1\)\.haystack_sessions\[1\]\[2\]\.has_answer: "
                                                 r"expected true, false, 0 or 1"):
        load_longmemeval(_write(tmp_path, [d]))


def test_unreadable_files_are_clear_memkern_errors(tmp_path):
    """A directory, a non-UTF-8 file and deep nesting: a DatasetFormatError naming the file."""
    from memkern import MemkernError

    with pytest.raises(DatasetFormatError, match=f"LongMemEval file '{tmp_path}': expected a file, got a directory"):
        load_longmemeval(tmp_path)
    p = tmp_path / "latin1.json"
    p.write_bytes(json.dumps([_item(answer="caf\u00e9")], ensure_ascii=False).encode("latin-1"))
    with pytest.raises(DatasetFormatError, match=r"latin1\.json'?: expected UTF-8 text"):
        load_longmemeval(p)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(DatasetFormatError, match=r"deep\.json'?: expected JSON nested at most 64 levels"):
        load_longmemeval(deep)
    deep.write_text("[" * 200 + "]" * 200)  # parses, but deeper than any published format
    with pytest.raises(DatasetFormatError, match="nested at most 64"):
        load_longmemeval(deep)
    with pytest.raises(MemkernError, match="expected an existing path"):  # also a FileNotFoundError
        load_longmemeval(tmp_path / "missing.json")
