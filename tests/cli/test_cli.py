"""The RMM commands: demo (real offline models, trimmed), ingest / ask / inspect / forget."""
from __future__ import annotations

import json

import pytest

from fakes_rmm import HashEmbedder, ScriptedChat
from memkern.cli import main
from memkern.cli import common as C


def _sessions_file(tmp_path, layout):
    s1 = [{"role": "user", "content": "I work as a nurse at the city hospital."},
          {"role": "assistant", "content": "Busy job!"}]
    s2 = [{"role": "user", "content": "My dog Pepper is a beagle and loves the beach."}]
    if layout == "bundled":
        data = {"sessions": [{"session_id": "a", "date": "2026-01-01", "turns": s1},
                             {"session_id": "b", "date": "2026-01-02", "turns": s2}]}
    elif layout == "list":
        data = [s1, s2]
    elif layout == "longmemeval":
        q = {"question_id": "q1", "question_type": "single-session-user", "question": "?", "answer": "!",
             "question_date": "2026/01/03", "haystack_session_ids": ["a", "b"],
             "haystack_dates": ["2026/01/01", "2026/01/02"], "haystack_sessions": [s1, s2],
             "answer_session_ids": ["a"]}
        data = [q, dict(q, question_id="q2")]  # sessions shared by two questions: ingested once
    else:  # locomo
        conv = {"speaker_a": "Maya", "speaker_b": "Bot",
                "session_1": [{"speaker": "Maya", "dia_id": "D1:1", "text": s1[0]["content"]},
                              {"speaker": "Bot", "dia_id": "D1:2", "text": "Busy job!"}],
                "session_1_date_time": "1 January 2026",
                "session_2": [{"speaker": "Maya", "dia_id": "D2:1", "text": s2[0]["content"]}],
                "session_2_date_time": "2 January 2026"}
        data = [{"sample_id": "c1", "conversation": conv, "qa": []}]
    p = tmp_path / f"{layout}.json"
    p.write_text(json.dumps(data))
    return p


@pytest.mark.parametrize("layout", ["bundled", "list", "longmemeval", "locomo"])
def test_load_sessions_layouts(tmp_path, layout):
    sessions = C.load_sessions(_sessions_file(tmp_path, layout))
    assert len(sessions) == 2
    assert sessions[0]["turns"][0] == {**sessions[0]["turns"][0], "role": "user",
                                       "content": "I work as a nurse at the city hospital."}
    assert sessions[0]["turns"][1]["role"] == "assistant"
    if layout in ("bundled", "longmemeval"):
        assert [s["session_id"] for s in sessions] == ["a", "b"]


def test_bundled_sample_is_package_data():
    p = C.sample_conversation_path()
    assert p.is_file() and p.parent.name == "data"
    sessions = C.load_sessions(p)
    raw = json.loads(p.read_text())
    assert 6 <= len(sessions) <= 10 and len(raw["questions"]) >= 3
    assert all(s["turns"] and s["session_id"] for s in sessions)


@pytest.fixture
def fake_models(monkeypatch):
    """ingest / ask / demo with fast fake models (the demo's real-model run is tested below)."""
    emb = HashEmbedder(384)
    chat = ScriptedChat(lambda msgs: '{"answer": "A nurse.", "citations": [0]}')
    monkeypatch.setattr(C, "build_models", lambda args, need_chat=True: (chat, emb))
    return chat, emb


def test_ingest_ask_inspect_forget(tmp_path, fake_models, capsys):
    store = tmp_path / "store"
    f = _sessions_file(tmp_path, "bundled")
    assert main(["ingest", str(f), "--store", str(store), "-n", "maya", "--extractor", "embedding", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "ingested 2 sessions" in out and "ADD 2" in out
    assert main(["ingest", str(f), "--store", str(store), "-n", "other", "--extractor", "embedding", "--no-progress"]) == 0
    capsys.readouterr()

    assert main(["ask", "What is my job?", "--store", str(store), "-n", "maya"]) == 0
    out = capsys.readouterr().out
    assert "answer: A nurse." in out and "cited" in out and "nurse" in out

    assert main(["ask", "What is my job?", "--store", str(store), "-n", "maya", "--json"]) == 0
    resp = json.loads(capsys.readouterr().out)
    assert resp["answer"] == "A nurse." and resp["citations"] == [0] and resp["rewards"][0] == 1.0

    assert main(["inspect", "--store", str(store), "-n", "maya"]) == 0
    out = capsys.readouterr().out
    assert "namespaces maya, other" in out and "2 records (2 active)" in out and "Pepper" in out
    assert main(["inspect", "--store", str(store), "-n", "maya", "--json"]) == 0
    bank = json.loads(capsys.readouterr().out)["records"]
    assert len(bank) == 2
    rid = bank[0]["id"]
    assert main(["inspect", "--store", str(store), "--id", str(rid)]) == 0
    assert "turns:" in capsys.readouterr().out

    assert main(["forget", "--store", str(store), "--id", str(rid)]) == 0
    assert f"deleted record #{rid}" in capsys.readouterr().out
    assert main(["forget", "--store", str(store), "--namespace", "maya"]) == 0
    assert "1 records" in capsys.readouterr().out
    from memkern.store import MemoryStore

    with MemoryStore(str(store)) as s:
        assert s.count("maya", include_invalidated=True) == 0
        assert s.count("other") == 2  # other namespaces untouched
    assert not (store / "rerankers" / "maya.pt").exists()


def test_turn_topic_retrieval_flags(tmp_path, fake_models, capsys):
    """--retrieval turn+topic (and the default, auto): ingest stores turn records; ask on a
    topic-mode bank indexes its turns once, then answers from turn+topic retrieval."""
    from memkern.store import MemoryStore

    store = tmp_path / "store"
    f = _sessions_file(tmp_path, "bundled")
    common = ["--store", str(store), "--extractor", "embedding", "--no-progress"]
    assert main(["ingest", str(f), "-n", "two", "--retrieval", "turn+topic", *common]) == 0
    assert main(["ingest", str(f), "-n", "one", "--retrieval", "topic", *common]) == 0
    capsys.readouterr()
    with MemoryStore(str(store)) as s:
        assert s.count("two", level="turn") > 0
        assert s.count("one", level="turn") == 0
    assert main(["ask", "What is my job?", "--store", str(store), "-n", "one", "--retrieval", "turn+topic",
                 "--alpha", "0.5", "--json"]) == 0
    captured = capsys.readouterr()
    assert "indexed the turns of" in captured.err
    assert json.loads(captured.out)["answer"] == "A nurse."
    with MemoryStore(str(store)) as s:
        assert s.count("one", level="turn") == s.count("two", level="turn")


def test_ask_missing_store_is_a_clear_error(tmp_path, fake_models, capsys):
    assert main(["ask", "hi?", "--store", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("memkern: error: --store: expected an existing memkern store")
    assert not (tmp_path / "nope").exists()


def test_demo_fake_models_full_flow(tmp_path, fake_models, capsys, monkeypatch):
    monkeypatch.setattr("memkern.models.setup_default_models", lambda progress=True: {})
    store = tmp_path / "store"
    for _ in range(2):  # rerun: the namespace is reset, not appended to
        assert main(["demo", "--store", str(store), "--extractor", "embedding", "--no-progress", "--questions", "4"]) == 0
        out = capsys.readouterr().out
    assert "reset: " in out and "old records removed" in out
    assert "session s8" in out and "Memory bank of namespace 'demo'" in out
    assert out.count("answer: A nurse.") == 4 and "Reranker: 1 update(s) from 4 responses" in out
    assert "decisions: ADD" in out and "per session (s): extract" in out
    from memkern.store import MemoryStore

    with MemoryStore(str(store)) as s:
        n_active = s.count("demo")
    # 8 sessions; the TextTiling extractor keeps a short session as one topic and the embedding
    # decider may fold a repeated one into an older memory
    assert 5 <= n_active <= 30


@pytest.mark.slow
def test_demo_real_models(tmp_path, capsys):
    """`memkern demo` with the offline default models, trimmed to 3 sessions and 1 question."""
    store = tmp_path / "store"
    rc = main(["demo", "--store", str(store), "--sessions", "3", "--questions", "1", "--no-progress"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "session s1" in out and "session s3" in out and "session s4" not in out
    assert "Memory bank of namespace 'demo'" in out
    assert "Q1: What is my job now?" in out and "answer:" in out and "timings (ms)" in out
    assert "decisions: ADD" in out
