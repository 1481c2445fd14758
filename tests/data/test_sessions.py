"""The one session-file loader (memkern ingest / demo --file): layouts and whole-file validation."""
from __future__ import annotations

import json

import pytest

from memkern.data import DatasetFormatError
from memkern.data.sessions import load_session_file, load_sessions, parse_sessions


def _w(tmp_path, data, name="s.json"):
    p = tmp_path / name
    p.write_text(json.dumps(data))
    return p


def test_bundled_layout_with_questions(tmp_path):
    f = load_session_file(_w(tmp_path, {"user": "Maya", "sessions": [
        {"session_id": "a", "date": "2026-01-01", "turns": [{"role": "user", "content": "hi", "mood": "ok"}]},
        [{"text": "bare session, text instead of content"}]],
        "questions": [{"question": "Who?", "answer": "Maya"}, {"question": "Where?"}]}))
    assert f.layout == "bundled" and f.user == "Maya"
    assert f.sessions[0] == {"session_id": "a", "date": "2026-01-01",
                             "turns": [{"role": "user", "content": "hi", "mood": "ok"}]}
    assert f.sessions[1]["session_id"] == "s2" and f.sessions[1]["turns"][0]["content"].startswith("bare")
    assert f.questions == [{"question": "Who?", "answer": "Maya"}, {"question": "Where?", "answer": None}]


def test_longmemeval_shared_sessions_once_and_locomo_dia_ids():
    s1 = [{"role": "user", "content": "I am a nurse.", "has_answer": True}]
    s2 = [{"role": "user", "content": "I like tea."}]
    q = {"question_id": "q1", "question_type": "t", "question": "?", "answer": "!", "question_date": None,
         "haystack_session_ids": ["a", "b", "a"], "haystack_dates": ["2023/05/20 (Sat) 02:21", "2023/05/21 (Sun) 10:00",
                                                                "2023/05/20 (Sat) 02:21"],
         "haystack_sessions": [s1, s2, s1], "answer_session_ids": ["a"]}
    f = parse_sessions([q, dict(q, question_id="q2")])
    assert f.layout == "longmemeval" and [s["session_id"] for s in f.sessions] == ["a", "b"]
    conv = {"speaker_a": "Ann", "speaker_b": "Bob", "session_1": [
        {"speaker": "Ann", "dia_id": "D1:1", "text": "Hello"}, {"speaker": "Bob", "dia_id": "D1:2", "text": "Hi"}]}
    f = parse_sessions({"sample_id": "c", "conversation": conv, "qa": []})
    assert f.layout == "locomo" and f.sessions[0]["session_id"] == "c:session_1"
    assert [(t["role"], t["dia_id"]) for t in f.sessions[0]["turns"]] == [("user", "D1:1"), ("assistant", "D1:2")]


@pytest.mark.parametrize("data, where", [
    ({"sessions": [[{"role": "user", "content": "ok"}]] * 4 + [[{"role": "user", "content": 7}]]},
     r"sessions\[4\]\[0\]\.content: expected a str, got int 7"),
    ({"sessions": [{"turns": [{"content": "ok"}, {"content": "x", "role": 3}]}]}, r"sessions\[0\]\.turns\[1\]\.role"),
    ({"sessions": [{"turns": "nope"}]}, r"sessions\[0\]\.turns: expected a list of turns"),
    ({"sessions": [{"session_id": None, "turns": []}]}, r"sessions\[0\]\.session_id"),
    ({"sessions": [{"date": 5, "turns": []}]}, r"sessions\[0\]\.date"),
    ({"sessions": []}, "sessions: expected at least one session"),
    ({"sessions": [[]], "questions": [{"question": 3}]}, r"questions\[0\]\.question"),
    ([[{"content": "a"}], ["not a turn"]], r"\[1\]\[0\]: expected a turn object"),
    ([], "root: expected at least one session"),
    ("text", "root: expected a JSON list"),
    ([{"question_id": "q", "haystack_sessions": []}], r"question\[0\] \(q\)\.question_type"),
    ([{"conversation": {"speaker_a": "A", "session_1": []}, "qa": [{"question": "?", "answer": None, "category": 1}]}],
     r"qa\[0\]\.answer"),
])
def test_errors_name_the_field(tmp_path, data, where):
    p = _w(tmp_path, data)
    with pytest.raises(DatasetFormatError, match=where):
        load_sessions(p)
    with pytest.raises(DatasetFormatError, match=str(p)):
        load_sessions(p)
