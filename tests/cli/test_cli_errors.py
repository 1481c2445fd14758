"""Command-line hardening: namespace names and paths, one-line errors with exit codes, atomic ingest.

Regression tests of issue 10 items 5 (path traversal), 6 (ingest atomicity) and 7 (tracebacks).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from fakes_rmm import HashEmbedder, ScriptedChat
from memkern import MemkernError, MemkernTypeError, MemkernValueError
from memkern.cli import main
from memkern.cli import common as C
from memkern.base.paths import check_namespace, path_in, reranker_file
from memkern.store import MemoryStore


@pytest.fixture
def fake_models(monkeypatch):
    emb = HashEmbedder(384)
    chat = ScriptedChat(lambda msgs: '{"answer": "A nurse.", "citations": [0]}')
    monkeypatch.setattr(C, "build_models", lambda args, need_chat=True: (chat, emb))
    monkeypatch.setattr("memkern.models.setup_default_models", lambda progress=True: {})
    return chat, emb


def _store(path, dim=384, records=(("maya", "I work as a nurse."),)):
    with MemoryStore(str(path), dim=dim, metric="cos") as s:
        for ns, text in records:
            s.add(ns, text, np.random.default_rng(len(text)).standard_normal(dim).astype(np.float32),
                  turns=[{"role": "user", "content": text}])
    return path


def _victims(folder, name="model"):
    """Files a traversal would delete: ``<folder>/<name>.pt`` and ``.buffer.pt``."""
    folder.mkdir(parents=True, exist_ok=True)
    files = [folder / f"{name}.pt", folder / f"{name}.buffer.pt"]
    for f in files:
        f.write_bytes(b"precious")
    return files


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("memkern: error: ")
    return lines[0]


# ------------------------------------------------------------------ namespace names and paths

@pytest.mark.parametrize("name", ["default", "demo", "user-1", "a.b", "x@y.com", "tenant:42", "A_b-C.d@e:f", "a" * 128,
                                  "a.", "v1.2.3"])
def test_valid_namespace_names(name):
    assert check_namespace(name) == name


@pytest.mark.parametrize("name", ["", ".", "..", ".hidden", "../x", "../../x", "/any/dir/model", "a/b", "a\\b",
                                  "a\x00b", "a..b", "a b", "é", "a" * 129, "x\n", "~root", "*"])
def test_invalid_namespace_names(name):
    with pytest.raises(MemkernValueError, match="namespace: expected a namespace name of 1-128 characters"):
        check_namespace(name)


def test_namespace_must_be_a_str():
    with pytest.raises(MemkernTypeError, match="namespace"):
        check_namespace(3)


def test_path_in_refuses_escapes(tmp_path):
    root = tmp_path / "store"
    root.mkdir()
    assert path_in(root, "rerankers", "a.pt") == root.resolve() / "rerankers" / "a.pt"
    for parts in (("..", "x.pt"), ("/etc/passwd",), ("a", "..", "..", "x"), (".",)):
        with pytest.raises(MemkernValueError, match="expected a path inside"):
            path_in(root, *parts)
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "rerankers").symlink_to(outside)  # a link inside the folder pointing out of it
    with pytest.raises(MemkernValueError, match="expected a path inside"):
        reranker_file(root, "victim")


def test_forget_absolute_namespace_touches_nothing_outside(tmp_path, capsys):
    """Issue 10 item 5: `forget -n /any/dir/model` deleted /any/dir/model.pt and .buffer.pt."""
    store = _store(tmp_path / "S")
    victims = _victims(tmp_path / "any" / "dir")
    rc = main(["forget", "--store", str(store), "-n", str(tmp_path / "any" / "dir" / "model")])
    line = _one_line(capsys)
    assert rc == 2 and "--namespace" in line and "expected a namespace name" in line
    assert all(f.read_bytes() == b"precious" for f in victims)


def test_forget_relative_traversal_touches_nothing_outside(tmp_path, capsys):
    """`-n ../../x` once S/rerankers exists: S/rerankers/../../x.pt is outside S."""
    store = _store(tmp_path / "a" / "S")
    (store / "rerankers").mkdir()
    victims = _victims(tmp_path / "a", "x")
    assert main(["forget", "--store", str(store), "-n", "../../x"]) == 2
    assert "--namespace" in _one_line(capsys)
    assert all(f.exists() for f in victims)
    with MemoryStore(str(store)) as s:
        assert s.count("maya") == 1


def test_forget_through_a_symlinked_rerankers_folder_touches_nothing_outside(tmp_path, capsys):
    """A valid name, but S/rerankers links out of the store: refused before any record is deleted."""
    store = _store(tmp_path / "S", records=(("victim", "hello there"),))
    victims = _victims(tmp_path / "elsewhere", "victim")
    (store / "rerankers").symlink_to(tmp_path / "elsewhere")
    assert main(["forget", "--store", str(store), "-n", "victim"]) == 2
    assert "expected a path inside" in _one_line(capsys)
    assert all(f.exists() for f in victims)
    with MemoryStore(str(store)) as s:
        assert s.count("victim") == 1


def test_demo_absolute_namespace_is_refused_before_anything(tmp_path, capsys, monkeypatch):
    """`demo -n /abs/x` deleted /abs/x.pt before the name was checked; now the name is refused
    before models are set up and before the store is opened or created."""
    def no_setup(progress=True):
        raise AssertionError("models set up before the namespace was checked")

    monkeypatch.setattr("memkern.models.setup_default_models", no_setup)
    victims = _victims(tmp_path / "abs")
    store = tmp_path / "S"
    assert main(["demo", "--store", str(store), "-n", str(tmp_path / "abs" / "x")]) == 2
    assert main(["demo", "--store", str(store), "-n", str(tmp_path / "abs" / "model")]) == 2
    err = capsys.readouterr().err
    assert err.count("memkern: error: argument --namespace/-n: expected a namespace name") == 2
    assert err.count("(see 'memkern demo --help')") == 2
    assert all(f.exists() for f in victims) and not store.exists()


def test_rmm_checks_the_namespace_and_never_writes_outside(tmp_path):
    from memkern.loops.rmm import RMM

    store = MemoryStore(str(tmp_path / "S"), dim=384, metric="cos")
    try:
        for bad in ("../x", "/abs/x", ".hidden", "a/b"):
            with pytest.raises(MemkernValueError, match="namespace"):
                RMM(store, embedder=HashEmbedder(384), namespace=bad)
        outside = tmp_path / "out"
        outside.mkdir()
        (tmp_path / "S" / "rerankers").symlink_to(outside)
        with pytest.raises(MemkernValueError, match="expected a path inside"):
            RMM(store, embedder=HashEmbedder(384), namespace="ok").save()
        assert list(outside.iterdir()) == []
    finally:
        store.close()


# ------------------------------------------------------------------ ingest: all or nothing

def _sessions(n=5, bad_at=None):
    out = []
    for i in range(n):
        content = 7 if i == bad_at else f"Session {i}: I adopted a cat named Tom number {i} and I love hiking."
        out.append({"session_id": f"s{i}", "date": f"2026-01-0{i + 1}",
                    "turns": [{"role": "user", "content": content}, {"role": "assistant", "content": "Nice!"}]})
    return {"sessions": out}


def _write(tmp_path, data, name="in.json"):
    p = tmp_path / name
    p.write_text(json.dumps(data))
    return p


def _state(store_path, ns="maya"):
    with MemoryStore(str(store_path)) as s:
        ids = [int(i) for i in s.ids(ns, include_invalidated=True)]
        return [(r.id, r.version, r.status, r.summary, json.dumps(r.turns)) for r in s.get_batch(ids)]


def test_ingest_bad_fifth_session_writes_nothing(tmp_path, fake_models, capsys):
    """Issue 10 item 6: 4 good sessions and a 5th with `content: 7` exited 1, left a record in the
    store and named sessions[0][0]. Now: exit 2, the 5th session named, nothing written."""
    f = _write(tmp_path, _sessions(5, bad_at=4))
    new = tmp_path / "new"
    assert main(["ingest", str(f), "--store", str(new), "-n", "maya", "--no-progress"]) == 2
    line = _one_line(capsys)
    assert "sessions[4].turns[0].content: expected a str, got int 7" in line and str(f) in line
    assert not new.exists()  # no store created
    old = _store(tmp_path / "old")
    before = _state(old)
    assert main(["ingest", str(f), "--store", str(old), "-n", "maya", "--no-progress"]) == 2
    _one_line(capsys)
    assert _state(old) == before
    # a bare list of sessions names the index the same way
    bare = _write(tmp_path, [s["turns"] for s in _sessions(5, bad_at=4)["sessions"]], "bare.json")
    assert main(["ingest", str(bare), "--store", str(new), "--no-progress"]) == 2
    assert "[4][0].content: expected a str" in _one_line(capsys) and not new.exists()


@pytest.mark.parametrize("date, what", [
    ("garbage date", "expected a date string in a known format"),
    ("99999-01-01", "expected a date string in a known format"),
    ("9999999999999", "expected a date string in a known format"),  # unix seconds past year 9999
])
def test_ingest_refuses_unreadable_session_dates(tmp_path, fake_models, capsys, date, what):
    """Such dates were kept as text with no event time (exit 0); end_session(date=...) refuses them.
    Now ingest refuses them the same way: exit 2, one line naming the session and field, nothing
    written, into a new store or an existing one."""
    data = _sessions(3)
    data["sessions"][2]["date"] = date
    f = _write(tmp_path, data)
    new = tmp_path / "new"
    assert main(["ingest", str(f), "--store", str(new), "-n", "maya", "--no-progress"]) == 2
    line = _one_line(capsys)
    assert "sessions[2] (session 's2').date: " + what in line and repr(date) in line, line
    assert not new.exists()
    old = _store(tmp_path / "old")
    before = _state(old)
    assert main(["ingest", str(f), "--store", str(old), "-n", "maya", "--no-progress"]) == 2
    _one_line(capsys)
    assert _state(old) == before


def test_ingest_dates_become_event_times(tmp_path, fake_models, capsys):
    f = _write(tmp_path, _sessions(2))
    store = tmp_path / "S"
    assert main(["ingest", str(f), "--store", str(store), "-n", "maya", "--no-progress"]) == 0
    with MemoryStore(str(store)) as s:
        times = sorted(s.get(int(i)).event_time for i in s.ids("maya"))
    assert times and all(t is not None for t in times)
    assert min(times) >= 1767225600.0  # 2026-01-01


@pytest.mark.parametrize("body, what", [
    ('{"sessions": [{"session_id": "a", "turns": [{"role": "user", "content": "x", "n": ' + "9" * 5000 + '}]}]}',
     "ints of at most 40 digits"),
    ("[" * 100_000 + "]" * 100_000, "nested at most 64 levels deep"),
    ('{"sessions": [{"session_id": "a", "turns": [{"role": "user", "content": "x", "n": NaN}]}]}',
     "finite JSON numbers"),
    ('{"sessions": [{"session_id": "a", "turns": [{"role": "user", "content": "\\ud800"}]}]}',
     "no lone surrogates"),
    ('{"sessions": [{"session_id": "a", "turns": [{"role": "user", "content": "x", "n": ' + "9" * 30 + '}]}]}',
     "an int within int64"),
])
def test_ingest_hostile_files_exit_2_and_write_nothing(tmp_path, fake_models, capsys, body, what):
    f = tmp_path / "in.json"
    f.write_text(body)
    new = tmp_path / "new"
    assert main(["ingest", str(f), "--store", str(new), "-n", "maya", "--no-progress"]) == 2
    assert what in _one_line(capsys)
    assert not new.exists()


def test_ingest_invalid_namespace_creates_no_store(tmp_path, fake_models, capsys):
    f = _write(tmp_path, _sessions(2))
    store = tmp_path / "S"
    assert main(["ingest", str(f), "--store", str(store), "-n", "../evil"]) == 2
    assert "--namespace" in _one_line(capsys)
    assert not store.exists()


def test_ingest_model_failure_leaves_the_store_as_it_was(tmp_path, fake_models, capsys):
    """A failure while models run (here the embedder, on its 3rd call) changes nothing."""
    _, emb = fake_models
    store = tmp_path / "S"
    f = _write(tmp_path, _sessions(3))
    assert main(["ingest", str(f), "--store", str(store), "-n", "maya", "--no-progress"]) == 0
    capsys.readouterr()
    before = _state(store)
    calls = {"n": 0}
    real = emb.encode

    def flaky(texts, kind="passage", **kw):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("embedder crashed")
        return real(texts, kind=kind, **kw)

    emb.encode = flaky
    f2 = _write(tmp_path, _sessions(5), "more.json")
    assert main(["ingest", str(f2), "--store", str(store), "-n", "maya", "--no-progress"]) == 1
    assert _one_line(capsys) == "memkern: error: RuntimeError: embedder crashed"
    assert _state(store) == before
    # and with a fresh store path, nothing is created
    calls["n"] = 0
    assert main(["ingest", str(f2), "--store", str(tmp_path / "fresh"), "-n", "maya", "--no-progress"]) == 1
    _one_line(capsys)
    assert not (tmp_path / "fresh").exists()


def _bank(store, ns="maya"):
    ids = [int(i) for i in store.ids(ns, include_invalidated=True)]
    return sorted((r.status, r.summary, json.dumps(r.turns, sort_keys=True)) for r in store.get_batch(ids))


@pytest.mark.parametrize("retrieval", ["topic", "turn+topic"])
def test_ingest_lands_as_one_batch_and_matches_a_direct_run(tmp_path, fake_models, capsys, monkeypatch, retrieval):
    """Staged ingest gives the same memories as folding the sessions into the store directly (the
    second file updates memories of the first), and a fresh namespace's memories land in one
    add_batch call (no add / merge / update / invalidate on the real store)."""
    from memkern.loops.rmm import RMM

    chat, emb = fake_models
    a = _sessions(5)
    b = {"sessions": [dict(s, session_id="b" + s["session_id"]) for s in _sessions(3)["sessions"]]
         + [{"session_id": "c", "turns": [{"role": "user", "content": "I now live in Porto and work as a baker."}]}]}
    fa, fb = _write(tmp_path, a, "a.json"), _write(tmp_path, b, "b.json")
    calls = []
    for name in ("add", "merge", "update", "add_batch", "invalidate"):
        orig = getattr(MemoryStore, name)

        def spy(self, *args, _orig=orig, _name=name, **kw):
            if os.path.basename(str(self.path)) != "stage":
                calls.append(_name)
            return _orig(self, *args, **kw)

        monkeypatch.setattr(MemoryStore, name, spy)
    store = tmp_path / "S"
    common = ["--store", str(store), "-n", "maya", "--no-progress", "--retrieval", retrieval]
    assert main(["ingest", str(fa), *common]) == 0
    assert calls == ["add_batch"]
    assert main(["ingest", str(fb), *common]) == 0
    out = capsys.readouterr().out
    assert "ingested 4 sessions" in out
    monkeypatch.undo()
    with MemoryStore(str(tmp_path / "direct"), dim=384, metric="cos") as d:
        rmm = RMM(d, chat_model=chat, embedder=emb, namespace="maya", extractor="embedding", persist=False,
                  retrieval=retrieval)
        for data in (a, b):
            ss = C.load_sessions(_write(tmp_path, data, "tmp.json"))
            for start in range(0, len(ss), 4):
                chunk = ss[start : start + 4]
                rmm.end_sessions([s["turns"] for s in chunk], [s["session_id"] for s in chunk],
                                 dates=[s.get("date") for s in chunk])
        want = _bank(d)
        want_turns = d.count("maya", level="turn")
    with MemoryStore(str(store)) as s:
        assert _bank(s) == want
        assert s.count("maya", level="turn") == want_turns
        if retrieval == "turn+topic":
            assert want_turns > 0
        versions = [s.get(int(i)).version for i in s.ids("maya", include_invalidated=True)]
    assert max(versions) >= 2  # the second file changed memories of the first: the test covers it


def test_commit_failure_rolls_back(tmp_path, monkeypatch):
    """A failure after the atomic add_batch (here: an invalidation) deletes the new records again
    and writes the changed older records back to their previous content."""
    from memkern.cli.ingest import Plan, _fields, commit

    path = _store(tmp_path / "S", records=(("maya", "old one"), ("maya", "old two")))
    with MemoryStore(str(path)) as s:
        old_ids = [int(i) for i in s.ids("maya")]
        before = {i: (s.get(i).summary, json.dumps(s.get(i).turns)) for i in old_ids}
        changed = dict(_fields(s, s.get(old_ids[0])), summary="changed", turns=[{"role": "user", "content": "x"}])
        vec = np.ones(384, np.float32)
        new = [dict(summary=f"new {k}", embedding=vec, turns=[{"role": "user", "content": f"n{k}"}], meta={},
                    turn_embeddings=None, invalidated=None) for k in range(2)]
        plan = Plan(new=new, changed=[(old_ids[0], changed)], invalidate=[(old_ids[1], "superseded")])

        def boom(*a, **k):
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(s, "invalidate", boom)
        with pytest.raises(OSError, match="No space"):
            commit(s, "maya", plan)
        assert sorted(int(i) for i in s.ids("maya", include_invalidated=True)) == old_ids
        assert {i: (s.get(i).summary, json.dumps(s.get(i).turns)) for i in old_ids} == before
        assert all(s.get(i).status == "active" for i in old_ids)
        monkeypatch.undo()
        added = commit(s, "maya", plan)  # the same plan, without the failure, lands
        assert len(added) == 2 and s.get(old_ids[0]).summary == "changed"
        assert s.get(old_ids[1]).status == "invalidated"


# ------------------------------------------------------------------ one-line errors, exit codes

@pytest.fixture
def files(tmp_path):
    good = _write(tmp_path, _sessions(2), "good.json")
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{not json")
    latin = tmp_path / "latin.json"
    latin.write_bytes(b'{"sessions": [[{"role": "user", "content": "caf\xe9"}]]}')
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 50_000 + "]" * 50_000)
    lme = _write(tmp_path, [{"question_id": "q1", "question_type": "t", "question": "?", "answer": "!",
                             "question_date": None, "haystack_session_ids": ["a"], "haystack_dates": ["d"],
                             "haystack_sessions": [[{"role": "user", "content": "hi", "has_answer": "no"}]],
                             "answer_session_ids": ["a"]}], "lme.json")
    store = _store(tmp_path / "S")
    store4 = _store(tmp_path / "S4", dim=4)
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "wal.log").write_bytes(b"\x00garbage" * 20)
    return {"good": str(good), "bad_json": str(bad_json), "latin": str(latin), "deep": str(deep), "lme": str(lme),
            "store": str(store), "store4": str(store4), "corrupt": str(corrupt), "missing": str(tmp_path / "missing.json"),
            "nostore": str(tmp_path / "nostore"), "dir": str(tmp_path), "tmp": tmp_path}


# (argv with {placeholders}, exit code, text the one line must contain)
BAD = [
    (["frobnicate"], 2, "invalid choice: 'frobnicate'"),
    (["ingest"], 2, "the following arguments are required: FILE"),
    (["ingest", "{missing}", "--store", "{nostore}"], 2, "argument FILE: expected an existing file"),
    (["ingest", "{dir}", "--store", "{nostore}"], 2, "argument FILE: expected a file"),
    (["ingest", "{bad_json}", "--store", "{nostore}"], 2, "bad.json': expected valid JSON"),
    (["ingest", "{latin}", "--store", "{nostore}"], 2, "latin.json': expected UTF-8 text"),
    (["ingest", "{deep}", "--store", "{nostore}"], 2, "deep.json': expected JSON nested at most 64"),
    (["ingest", "{lme}", "--store", "{nostore}"], 2, "haystack_sessions[0][0].has_answer: expected true, false"),
    (["ingest", "{good}", "--store", "{nostore}", "-n", "../../x"], 2, "argument --namespace/-n: expected a namespace"),
    (["ingest", "{good}", "--store", "{nostore}", "--limit", "-1"], 2, "argument --limit: expected an integer >= 1"),
    (["ingest", "{good}", "--store", "{nostore}", "--threads", "0"], 2, "argument --threads: expected an integer >= 1"),
    (["ingest", "{good}", "--store", "{nostore}", "--alpha", "nan"], 2, "argument --alpha: expected a finite number"),
    (["ingest", "{good}", "--store", "{good}"], 2, "--store: expected a store directory"),
    (["ingest", "{good}", "--store", "{nostore}", "--extractor", "regex"], 2, "argument --extractor: invalid choice"),
    (["ingest", "{good}", "--store", "{store4}"], 2, "--embedder: expected an embedder of the store's dimension 4"),
    (["eval"], 2, "expected a command after 'memkern eval'"),
    (["ask", "q?", "--store", "{nostore}"], 2, "--store: expected an existing memkern store directory"),
    (["ask", "  ", "--store", "{store}"], 2, "argument QUESTION: expected a non-empty text"),
    (["ask", "q?", "--store", "{store}", "--top-k", "0"], 2, "argument --top-k: expected an integer >= 1"),
    (["ask", "q?", "--store", "{store}", "--top-k", "3", "--top-m", "5"], 2, "--top-m: expected <= --top-k (3)"),
    (["ask", "q?", "--store", "{store}", "-n", "/etc/x"], 2, "argument --namespace/-n"),
    (["inspect", "--store", "{nostore}"], 2, "--store: expected an existing memkern store directory"),
    (["inspect", "--store", "{store}", "--id", "abc"], 2, "argument --id: expected an integer >= 0"),
    (["inspect", "--store", "{store}", "--id", "9999"], 2, "--id: expected the id of a record"),
    (["inspect", "--store", "{corrupt}"], 1, "wal.log"),
    (["forget", "--store", "{store}"], 2, "one of the arguments --namespace/-n --id is required"),
    (["forget", "--store", "{store}", "-n", "/any/dir/model"], 2, "argument --namespace/-n"),
    (["forget", "--store", "{store}", "--id", "123456"], 2, "--id: expected the id of a record"),
    (["forget", "--store", "{store}", "--id", "-5"], 2, "argument --id: expected an integer >= 0"),
    (["demo", "--store", "{nostore}", "-n", "/abs/x"], 2, "argument --namespace/-n"),
    (["demo", "--store", "{nostore}", "--sessions", "-3"], 2, "argument --sessions: expected an integer >= 1"),
    (["demo", "--store", "{nostore}", "--file", "{missing}"], 2, "argument --file: expected an existing file"),
    (["demo", "--store", "{nostore}", "--file", "{bad_json}"], 2, "expected valid JSON"),
    (["models", "frob"], 2, "invalid choice: 'frob'"),
    (["eval", "memory", "nope"], 2, "argument experiment: invalid choice"),
    (["eval", "memory", "granularity", "--longmemeval", "{missing}"], 2, "argument --longmemeval: expected an existing"),
    (["eval", "memory", "granularity", "--users", "0"], 2, "argument --users: expected an integer >= 1"),
    (["eval", "memory", "reflection", "--test-frac", "1.5"], 2, "argument --test-frac: expected a finite number > 0.0"),
    (["eval", "memory", "granularity", "--granularities", "words"], 2, "argument --granularities: invalid choice"),
    (["eval", "reread", "--data", "{missing}"], 2, "argument --data: expected an existing file"),
    (["eval", "reread", "--lengths", "abc"], 2, "argument --lengths: expected comma-separated token counts"),
    (["eval", "reread", "--openai-url", "http://127.0.0.1:9/v1"], 2, "--openai-model: expected a model name"),
    (["eval", "reread", "--max-rereads", "-1"], 2, "argument --max-rereads: expected an integer >= 0"),
]


@pytest.mark.parametrize("argv, code, text", BAD, ids=[" ".join(a)[:60] for a, _, _ in BAD])
def test_bad_input_is_one_line_with_exit_code(argv, code, text, files, fake_models, capsys):
    argv = [a.format(**files) for a in argv]
    assert main(argv) == code
    line = _one_line(capsys)
    assert text in line, line
    # one prefix: the message after it never starts with the program's name again
    assert line.startswith("memkern: error: ") and not line[len("memkern: error: "):].startswith("memkern"), line
    assert not os.path.exists(files["nostore"])  # nothing created on bad input


def test_debug_shows_the_traceback(files, capsys):
    assert main(["--debug", "inspect", "--store", files["store"], "--id", "9999"]) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and err.rstrip().splitlines()[-1].startswith("memkern: error:")
    assert main(["inspect", "--store", files["store"], "--id", "9999", "--debug"]) == 2  # after the command too
    assert "Traceback" in capsys.readouterr().err


def test_error_line_of_a_real_process(files):
    """The installed entry point: one stderr line, exit code 2, no traceback; --debug adds it."""
    cmd = [sys.executable, "-m", "memkern", "forget", "--store", files["store"], "--id", "424242"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.splitlines() == [
        f"memkern: error: --id: expected the id of a record in {files['store']}, got 424242"]
    r = subprocess.run(cmd[:3] + ["--debug"] + cmd[3:], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" in r.stderr


def test_exit_code_classes():
    from memkern.cli.main import exit_code
    from memkern.errors import BackendUnavailableError, MemkernKeyError, StoreCorruptedError

    assert exit_code(MemkernValueError("x")) == 2 and exit_code(MemkernKeyError("x")) == 2
    assert exit_code(StoreCorruptedError("x")) == 1 and exit_code(BackendUnavailableError("x")) == 1
    assert exit_code(OSError(28, "full")) == 1 and exit_code(RuntimeError("x")) == 1
    assert exit_code(MemkernError("x")) == 1 and exit_code(KeyboardInterrupt()) == 130
