"""Hostile export paths and import files: clear memkern errors naming the line and field, CLI exit
2 with one line, nothing written; reranker payloads checked before they are installed; a damaged
reranker file never blocks a namespace."""
from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from memkern import MemkernValueError, Reranker, StoreCorruptedError
from memkern import cli
from memkern.base.paths import reranker_file
from memkern.store import MemoryStore
from memkern.store.transfer import export_store, import_store

D = 8


def _store(path: Path) -> Path:
    with MemoryStore(path, dim=D) as s:
        t = s.add("alice", "topic", np.ones(D, np.float32), turns=[{"role": "user", "content": "hi"}],
                  turn_embeddings=np.ones((1, D), np.float32))
        s.add("alice", "second", np.full(D, 0.5, np.float32), meta={"k": [1, 2]}, event_time=1.7e9)
        assert s.get(t).turn_ids
    return path


def _files(path: Path) -> dict:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file() and p.name != "LOCK"}


# ----------------------------------------------------------------------------------- export paths


@pytest.mark.parametrize("target", ["wal.log", "CURRENT", "WAL.LOG", "rerankers/alice.pt", "new.jsonl",
                                    "sub/../new.jsonl"])
def test_export_refuses_paths_inside_the_store(tmp_path, capsys, target):
    src = _store(tmp_path / "S")
    (src / "rerankers").mkdir(exist_ok=True)
    before = _files(src)
    out = src / target
    with pytest.raises(MemkernValueError, match=r"^out: expected a path outside the store folder"):
        export_store(src, out)
    assert cli.main(["export", "--store", str(src), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("memkern: error: out: expected a path outside")
    assert _files(src) == before
    with MemoryStore(src) as s:  # still opens, unchanged
        assert s.count("alice") == 2


def test_export_refuses_links_into_the_store_and_other_stores(tmp_path):
    src = _store(tmp_path / "S")
    other = _store(tmp_path / "T")
    before, before_other = _files(src), _files(other)
    (tmp_path / "sym.jsonl").symlink_to(src / "wal.log")
    os.link(src / "wal.log", tmp_path / "hard.jsonl")
    (tmp_path / "dirlink").symlink_to(src)
    for out in (tmp_path / "sym.jsonl", tmp_path / "hard.jsonl", tmp_path / "dirlink" / "x.jsonl",
                other / "wal.log", other / "export.jsonl", src):
        with pytest.raises(MemkernValueError, match=r"^out: expected "):
            export_store(src, out)
    assert _files(src) == before and _files(other) == before_other
    stats = export_store(src, tmp_path / "ok.jsonl")  # beside the store is fine
    assert stats["records"] == 3 and (tmp_path / "ok.jsonl").stat().st_mode & 0o777 == 0o600


# ----------------------------------------------------------------------------------- import files


def _export_lines(tmp_path) -> list[str]:
    export_store(_store(tmp_path / "src"), tmp_path / "x.jsonl")
    return (tmp_path / "x.jsonl").read_text().splitlines()


def _rec(lines: list[str], i: int) -> dict:
    return json.loads(lines[i])


def _hostile(lines: list[str]) -> dict[str, tuple[list[str], str]]:
    """name -> (file lines, expected message regex)."""
    h, end = lines[0], lines[-1]
    topic, turn, second = (_rec(lines, i) for i in (1, 2, 3))
    swapped = []  # a turn whose id is below its topic's id (ids ascending, links consistent)
    t2, tu2 = dict(topic, id=5, turn_ids=[4]), dict(turn, id=4, topic_id=5)
    swapped = [h, json.dumps(tu2), json.dumps(t2), json.dumps(second | {"id": 6}), end]
    deep = "[" * 100_000 + "]" * 100_000
    return {
        "5000-digit id": ([h, '{"kind": "record", "id": ' + "9" * 5000 + "}", end],
                          r"line 2: expected one JSON object with ints of at most 40 digits, got an int of 5000"),
        "5000-digit meta": ([h, lines[1].replace('"meta": {}', '"meta": {"n": ' + "7" * 5000 + "}"), end],
                            r"line 2: .*ints of at most 40 digits"),
        "deep": ([h, deep, end], r"line 2: expected one JSON object nested at most 64 levels deep"),
        "deep meta": ([h, json.dumps(dict(second, versions=[dict(second["versions"][0], meta={"a": json.loads(
            "[" * 40 + "]" * 40)})]))], r"line 2: versions\[0\]\.meta: expected JSON nested at most 32"),
        "turn below topic": (swapped, r"line 2: topic_id: expected the id of a topic record before this turn"),
        "NaN": ([h, lines[3].replace('"created_at": ', '"created_at": NaN, "x": '), end],
                r"line 2: expected one JSON object \(finite JSON numbers\), got NaN"),
        "time 5e11": ([h, json.dumps(dict(second, event_time=5e11)), end],
                      r"line 2: event_time: expected unix seconds in \[-62135596800, 253402300799\]"),
        "time int 39 digits": ([h, json.dumps(dict(second, created_at=10 ** 38)), end],
                               r"line 2: created_at: expected unix seconds in .*an int of about 39 digits"),
        "surrogate": ([h, json.dumps(dict(second, versions=[dict(second["versions"][0], summary="\ud800")])), end],
                      r"line 2: versions\[0\]\.summary: expected a str encodable as UTF-8"),
        "huge role": ([h, json.dumps(dict(topic, versions=[dict(topic["versions"][0], turns=[
            {"role": "r" * 300, "content": "x"}])])), end], r"line 2: versions\[0\]\.turns\[0\]\['role'\]: expected a str of at most 256"),
        "namespace list": ([h.replace('"namespaces": ["alice"]', '"namespaces": [["alice"]]'), end],
                           r"line 1: namespaces\[0\]: expected a non-empty str, got 'list'"),
        "kind list": ([h, '{"kind": ["record"]}', end], r"line 2: kind: expected"),
        "truncated": ([h, lines[1][: len(lines[1]) // 2]], r"line 2: expected one JSON object, got invalid JSON"),
        "turn id list of bools": ([h, json.dumps(dict(topic, turn_ids=[True])), end], r"line 2: turn_ids: expected"),
    }


@pytest.mark.parametrize("name", ["5000-digit id", "5000-digit meta", "deep", "deep meta", "turn below topic",
                                  "NaN", "time 5e11", "time int 39 digits", "surrogate", "huge role",
                                  "namespace list", "kind list", "truncated", "turn id list of bools"])
def test_hostile_import_files_give_memkern_errors(tmp_path, capsys, name):
    lines, match = _hostile(_export_lines(tmp_path))[name]
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(MemkernValueError, match=match):
        import_store(tmp_path / "dst", bad)
    assert not (tmp_path / "dst").exists()
    assert cli.main(["import", "--store", str(tmp_path / "dst"), "--in", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("memkern: error: ")
    assert not (tmp_path / "dst").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


# ----------------------------------------------------------------------------------- reranker payloads


def _reranker_line(ns: str, kind: str, data: bytes) -> str:
    return json.dumps({"kind": "reranker", "namespace": ns, "file": kind, "sha256": hashlib.sha256(data).hexdigest(),
                       "data": base64.b64encode(data).decode()})


def _with_reranker(lines: list[str], data: bytes, kind: str = "state") -> list[str]:
    end = json.loads(lines[-1])
    return lines[:-1] + [_reranker_line("alice", kind, data), json.dumps(dict(end, rerankers=1))]


def _pickled(obj) -> bytes:
    import io

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


class _Evil:
    def __reduce__(self):
        return (os.system, ("touch /tmp/memkern-pwned",))


@pytest.mark.parametrize("payload, match", [
    (b"not a reranker at all", r"an unreadable file"),
    (pickle.dumps(_Evil()), r"an unreadable file"),
    ("dim 4", r"a reranker of dim 8 \(the store's\), got 'dim 4'"),
    ("nan weights", r"finite"),
    ("extra key", r"with the keys"),
    ("plain dict", r"with the keys"),
    ("wrong shape", r"\['Wq'\]: expected a floating tensor \[8, 8\]"),
])
def test_a_reranker_file_that_is_not_a_reranker_is_refused(tmp_path, payload, match):
    if payload == "dim 4":
        payload = _pickled(Reranker(4).state_dict())
    elif payload == "nan weights":
        sd = Reranker(D).state_dict()
        sd["Wm"][0, 0] = float("nan")
        payload = _pickled(sd)
    elif payload == "extra key":
        payload = _pickled(dict(Reranker(D).state_dict(), extra=torch.zeros(1)))
    elif payload == "plain dict":
        payload = _pickled({"a": 1})
    elif payload == "wrong shape":
        sd = Reranker(D).state_dict()
        sd["Wq"] = torch.zeros(D, D + 1)
        payload = _pickled(sd)
    lines = _with_reranker(_export_lines(tmp_path), payload)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(MemkernValueError, match=r"line \d+: data.*" + match):
        import_store(tmp_path / "dst", bad)
    assert not (tmp_path / "dst").exists() and not os.path.exists("/tmp/memkern-pwned")


def test_bad_reward_buffers_are_refused_and_a_real_one_is_installed(tmp_path):
    from memkern.loops.rmm.feedback import _selection_to_dict

    rr = Reranker(D, top_m=2)
    sel = rr.select(torch.randn(1, D), torch.randn(1, 5, D))
    good = _pickled([(_selection_to_dict(sel), torch.tensor([1.0, -1.0]))])
    lines = _export_lines(tmp_path)
    for data in (_pickled([({"indices": 1}, torch.zeros(2))]), _pickled([(_selection_to_dict(sel), torch.zeros(7))]),
                 _pickled("text"), _pickled([(_selection_to_dict(sel), torch.tensor([9.0, 0.0]))])):
        bad = tmp_path / "bad.jsonl"
        bad.write_text("\n".join(_with_reranker(lines, data, "buffer")) + "\n")
        with pytest.raises(MemkernValueError, match=r"data"):
            import_store(tmp_path / "dst", bad)
        assert not (tmp_path / "dst").exists()
    ok = tmp_path / "ok.jsonl"
    ok.write_text("\n".join(_with_reranker(lines, good, "buffer")) + "\n")
    res = import_store(tmp_path / "dst", ok)
    assert res.rerankers == ["alice.buffer.pt"]
    assert reranker_file(tmp_path / "dst", "alice", ".buffer.pt").read_bytes() == good


def test_a_damaged_reranker_file_never_blocks_the_namespace(tmp_path, caplog):
    """`rerankers/<ns>.pt` holding garbage (or a reranker of another dim): the namespace goes on with
    a fresh reranker, the file is kept aside as <ns>.pt.damaged, a warning names it."""
    from fakes_rmm import HashEmbedder, ScriptedChat
    from memkern import RMM

    path = tmp_path / "s"
    with MemoryStore(path, dim=16) as st:
        st.add_batch("u", [f"memory {i}" for i in range(8)], np.eye(8, 16, dtype=np.float32) + 0.1)
    rr = reranker_file(path, "u")
    for garbage in (b"\x80\x04garbage", _pickled(Reranker(4).state_dict())):
        rr.parent.mkdir(exist_ok=True)
        rr.write_bytes(garbage)
        with pytest.raises(StoreCorruptedError, match=r"reranker file .*u\.pt"):
            Reranker.load_checked(rr, 16)
        with MemoryStore(path) as st, caplog.at_level(logging.WARNING, logger="memkern"):
            rmm = RMM(st, chat_model=ScriptedChat(lambda p: '{"answer": "x", "citations": [0]}'),
                      embedder=HashEmbedder(16), namespace="u", top_k=6, top_m=2)
            out = rmm.respond("memory 3")
            assert out.answer and rmm.reranker.dim == 16
            rmm.close()
        assert "kept as" in caplog.text and "u.pt.damaged" in caplog.text
        assert reranker_file(path, "u", ".pt.damaged").read_bytes() == garbage
        assert Reranker.load_checked(rr, 16).dim == 16  # the fresh one was saved in its place
        caplog.clear()


def test_import_never_creates_a_store_inside_another(tmp_path, capsys):
    src = _store(tmp_path / "S")
    export_store(src, tmp_path / "x.jsonl")
    before = _files(src)
    for target in (src / "rerankers", src / "nested", src / "snapdir" / "deeper"):
        with pytest.raises(MemkernValueError, match=r"^store: expected a path outside every memkern store folder"):
            import_store(target, tmp_path / "x.jsonl")
    assert cli.main(["import", "--store", str(src / "nested"), "--in", str(tmp_path / "x.jsonl")]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert _files(src) == before and not (src / "nested").exists()
    import_store(tmp_path / "beside", tmp_path / "x.jsonl")  # beside it is fine
    with MemoryStore(tmp_path / "beside") as s:
        assert s.count("alice") == 2
