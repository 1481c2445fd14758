"""Export / import (issue 14 item 6): exact round trips between both stores, every line checked
before anything is written, atomic (a failure or a kill leaves the target as it was), the CLI."""
from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from fakes_rmm import HashEmbedder
from memkern import MemkernError, MemkernValueError
from memkern import cli
from memkern.store.memory import InMemoryStore
from memkern.base.paths import reranker_file
from memkern.store import MemoryStore
from memkern.store.transfer import export_store, import_store

D = 8


def fill(s, seed: int = 0) -> dict:
    """Two namespaces with turn records, merged / updated versions, an invalidated topic, an
    invalidated single turn, deleted records (id gaps, also at the top); returns facts."""
    rng = np.random.default_rng(seed)
    v = lambda n: rng.standard_normal((n, D)).astype(np.float32)  # noqa: E731
    conv = lambda n, t: [{"role": "user", "content": f"{t}-{i}", "turn_index": i, "x": {"deep": [i, 1.5]}}  # noqa
                         for i in range(n)]
    a = s.add_batch("alice", ["tea ✓", "cats", "jobs", "gone"], v(4), turns=[conv(2, "t"), conv(1, "c"), None, None],
                    metas=[{"k": 1}, {}, {"u": [1, None, True]}, {}], turn_embeddings=[v(2), v(1), None, None],
                    event_times=[1.7e9, None, -5.5, None])
    s.merge(int(a[0]), "tea, green", v(1)[0], [{"role": "user", "content": "new"}], turn_embeddings=v(1))
    s.update(int(a[1]), summary="cats!", meta={"m": 2})
    s.update(int(a[1]), embedding=v(1)[0])
    s.invalidate(int(a[2]), "outdated")
    s.delete(int(a[3]))
    b = s.add("bob", "bob 1", v(1)[0], conv(3, "b"), turn_embeddings=v(3))
    s.update(int(a[1]), event_time=1234.5)
    s.invalidate(s.get(b).turn_ids[1], "single turn")
    s.update(s.get(b).turn_ids[0], summary="edited turn")
    s.delete(s.get(int(a[0])).turn_ids[0])
    top = s.add("bob", "last", v(1)[0])
    s.delete(top)
    return {"alice": a, "bob": b}


def reranker_files(root, ns: str, seed: int = 0) -> tuple[bytes, bytes]:
    """A real reranker state (trained one step) and a real pending reward buffer of ``ns`` under
    ``root/rerankers/``; returns their bytes."""
    import torch

    from memkern import Reranker
    from memkern.loops.rmm.feedback import _selection_to_dict

    g = torch.Generator().manual_seed(seed)
    rr = Reranker(D, top_m=2, seed=seed)
    sel = rr.select(torch.randn(1, D, generator=g), torch.randn(1, 5, D, generator=g))
    rr.update(sel, torch.tensor([[1.0, -1.0]]))
    path = reranker_file(root, ns)
    rr.save(path)
    buf = reranker_file(root, ns, ".buffer.pt")
    torch.save([(_selection_to_dict(sel), torch.tensor([1.0, -1.0]))], buf)
    return path.read_bytes(), buf.read_bytes()


def state(s) -> dict:
    """Everything readable but the timestamps (imports carry the import time)."""
    out = {"ns": s.namespaces()}
    q = np.random.default_rng(9).standard_normal((2, D)).astype(np.float32)
    for ns in out["ns"]:
        for level in ("topic", "turn"):
            for rid in s.ids(ns, True, level=level).tolist():
                r = s.get(rid)
                out[rid] = (r.namespace, r.summary, r.turns, r.meta, r.version, r.status, r.invalidated_reason,
                            r.event_time,
                            r.level, r.topic_id, r.turn_ids, r.embedding.tobytes(),
                            [(h.version, h.summary, h.turns, h.meta, h.embedding.tobytes()) for h in s.history(rid)])
            for inc in (False, True):
                out[(ns, level, inc)] = (s.count(ns, inc, level=level), s.search(ns, q, k=9, level=level,
                                                                                  include_invalidated=inc)[0].tolist())
    return out


def lines(path) -> list[dict]:
    return [json.loads(x) for x in Path(path).read_text().splitlines()]


def untimed(objs: list[dict]) -> list[dict]:
    out = []
    for o in objs:
        o = {k: v for k, v in o.items() if k not in ("created_at", "updated_at")}
        if "versions" in o:
            o["versions"] = [{k: v for k, v in x.items() if k != "updated_at"} for x in o["versions"]]
        out.append(o)
    return out


@pytest.mark.parametrize("metric", ["ip", "l2", "cos"])
def test_round_trip_native_exact(tmp_path, metric):
    src = tmp_path / "src"
    with MemoryStore(src, dim=D, metric=metric) as s:
        fill(s)
        rr_bytes, buf_bytes = reranker_files(src, "alice")
        reranker_file(src, "nobody", ".pt").write_bytes(b"not exported")
        want = state(s)
        stats = export_store(s, tmp_path / "x.jsonl")
    assert stats["records"] == len([k for k in want if isinstance(k, int)])
    assert sorted(stats["rerankers"]) == ["alice.buffer.pt", "alice.pt"]
    objs = lines(tmp_path / "x.jsonl")
    assert objs[0]["kind"] == "header" and objs[0]["dim"] == D and objs[0]["metric"] == metric
    assert objs[-1] == {"kind": "end", "records": stats["records"], "rerankers": 2}
    res = import_store(tmp_path / "dst", tmp_path / "x.jsonl")
    assert not res.renumbered and all(k == v for k, v in res.id_map.items())
    with MemoryStore(tmp_path / "dst") as d:
        assert (d.dim, d.metric) == (D, metric)
        assert state(d) == want  # ids, versions, links, statuses, reasons, embedding bits, search
        export_store(d, tmp_path / "y.jsonl")
        nid = d.add("alice", "after", np.ones(D, np.float32))
        assert nid > max(k for k in want if isinstance(k, int))  # ids never reused
    assert reranker_file(tmp_path / "dst", "alice").read_bytes() == rr_bytes
    assert reranker_file(tmp_path / "dst", "alice", ".buffer.pt").read_bytes() == buf_bytes
    assert not reranker_file(tmp_path / "dst", "nobody").exists()
    assert untimed(lines(tmp_path / "y.jsonl")) == untimed(objs)  # the same file again
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_round_trip_between_both_stores(tmp_path):
    mem = InMemoryStore(D, "cos")
    fill(mem, seed=3)
    want = state(mem)
    export_store(mem, tmp_path / "m.jsonl")
    import_store(tmp_path / "n", tmp_path / "m.jsonl")
    with MemoryStore(tmp_path / "n") as n:
        assert state(n) == want
        export_store(n, tmp_path / "n.jsonl", namespaces=["bob"])
    back = InMemoryStore(D, "cos")
    res = import_store(back, tmp_path / "n.jsonl")
    assert back.namespaces() == ["bob"] and res.namespaces == ["bob"]
    assert {k: v for k, v in state(back).items() if k == "ns" or (isinstance(k, int) and v[0] == "bob")
            or (isinstance(k, tuple) and k[0] == "bob")} == \
        {k: v for k, v in want.items() if (isinstance(k, int) and v[0] == "bob") or (isinstance(k, tuple)
                                                                                   and k[0] == "bob")} | {"ns": ["bob"]}
    with pytest.raises(MemkernValueError, match="never written"):
        import_store(back, tmp_path / "n.jsonl")
    with pytest.raises(MemkernValueError, match="dim mismatch"):
        import_store(InMemoryStore(D + 1, "cos"), tmp_path / "n.jsonl")


def test_without_embeddings_reembeds(tmp_path):
    src = InMemoryStore(D, "ip")
    fill(src)
    export_store(src, tmp_path / "x.jsonl", embeddings=False)
    assert all("embedding" not in v for o in lines(tmp_path / "x.jsonl")[1:-1] for v in o["versions"])
    with pytest.raises(MemkernValueError, match="embedder"):
        import_store(tmp_path / "d", tmp_path / "x.jsonl")
    assert not (tmp_path / "d").exists()
    emb = HashEmbedder(D)
    import_store(tmp_path / "d", tmp_path / "x.jsonl", embedder=emb)
    with MemoryStore(tmp_path / "d") as d:
        for rid in d.ids("alice", True).tolist():
            r = d.get(rid)
            assert r.summary == src.get(rid).summary and r.version == src.get(rid).version
            np.testing.assert_array_equal(r.embedding, emb.encode([r.summary])[0])


def _export(tmp_path) -> Path:
    with MemoryStore(tmp_path / "src", dim=D) as s:
        fill(s)
        export_store(s, tmp_path / "x.jsonl")
    return tmp_path / "x.jsonl"


def _corrupt(path: Path, lineno: int, fn) -> Path:
    ls = path.read_text().splitlines()
    ls[lineno - 1] = fn(ls[lineno - 1])
    out = path.with_name("bad.jsonl")
    out.write_text("\n".join(ls) + "\n")
    return out


def _set(field, value, version=None):
    def fn(text):
        o = json.loads(text)
        if version is None:
            o[field] = value
        else:
            o["versions"][version][field] = value
        return json.dumps(o)
    return fn


@pytest.mark.parametrize("lineno, fn, match", [
    (4, lambda t: t[:-5], r"line 4: expected one JSON object, got invalid JSON"),
    (4, _set("embedding", base64.b64encode(np.ones(D + 1, "<f4").tobytes()).decode(), 0),
     r"line 4: versions\[0\]\.embedding: expected 8 float32 values .*dim mismatch"),
    (4, _set("embedding", base64.b64encode(np.array([np.nan] * D, "<f4").tobytes()).decode(), 0),
     r"line 4: versions\[0\]\.embedding: expected finite values"),
    (4, _set("turns", [{"role": "user"}], 0), r"line 4: versions\[0\]\.turns\[0\]: expected a dict with a 'content'"),
    (4, _set("version", 3, 0), r"line 4: versions\[0\]\.version: expected 1"),
    (4, _set("status", "gone"), r"line 4: status: expected"),
    (4, _set("id", 0), r"line 4: id: expected ids unique"),
    (4, _set("id", 10**6), r"line 5: id: expected ascending ids"),
    (4, _set("namespace", "carol"), r"line 4: namespace: expected one of the header's namespaces"),
    (2, _set("turn_ids", [999]), r"record 0: turn_ids: expected ascending ids of turn records"),
    (1, _set("dim", 9), r"line 2: versions\[0\]\.embedding: expected 9 float32 values .*dim mismatch"),
    (1, _set("format_version", 2), r"line 1: format_version: expected 1"),
])
def test_bad_line_writes_nothing(tmp_path, lineno, fn, match):
    bad = _corrupt(_export(tmp_path), lineno, fn)
    with pytest.raises(MemkernValueError, match=match):
        import_store(tmp_path / "dst", bad)
    assert not (tmp_path / "dst").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_truncated_and_tampered_files(tmp_path):
    x = _export(tmp_path)
    ls = x.read_text().splitlines()
    (tmp_path / "t.jsonl").write_text("\n".join(ls[:-3]) + "\n")
    with pytest.raises(MemkernValueError, match="end line"):
        import_store(tmp_path / "dst", tmp_path / "t.jsonl")
    (tmp_path / "c.jsonl").write_text("\n".join(ls[:5] + ls[6:]) + "\n")  # a record line dropped
    with pytest.raises(MemkernValueError):
        import_store(tmp_path / "dst", tmp_path / "c.jsonl")
    (tmp_path / "e.jsonl").write_text("")
    with pytest.raises(MemkernValueError, match="empty file"):
        import_store(tmp_path / "dst", tmp_path / "e.jsonl")
    assert not (tmp_path / "dst").exists()


def test_reranker_checksum_is_checked(tmp_path):
    with MemoryStore(tmp_path / "src", dim=D) as s:
        fill(s)
        reranker_files(tmp_path / "src", "alice")
        export_store(s, tmp_path / "x.jsonl")
    n = len((tmp_path / "x.jsonl").read_text().splitlines())
    bad = _corrupt(tmp_path / "x.jsonl", n - 1, _set("data", base64.b64encode(b"other").decode()))
    with pytest.raises(MemkernValueError, match=f"line {n - 1}: sha256"):
        import_store(tmp_path / "dst", bad)
    assert not (tmp_path / "dst").exists()


def _files(path: Path) -> list:
    return sorted((str(p.relative_to(path)), p.read_bytes()) for p in path.rglob("*") if p.is_file() and p.name != "LOCK")


def test_import_into_an_existing_store_adds_namespaces(tmp_path):
    src = InMemoryStore(D)
    fill(src)
    reranker_dir = tmp_path / "r"
    export_store(src, tmp_path / "x.jsonl")
    with MemoryStore(tmp_path / "dst", dim=D) as d:
        keep = d.add_batch("keep", ["mine", "also mine"], np.ones((2, D), np.float32))
        d.delete(int(keep[1]))
        before = state(d)
    res = import_store(tmp_path / "dst", tmp_path / "x.jsonl")
    assert res.renumbered and sorted(res.id_map) == sorted(k for k in state(src) if isinstance(k, int))
    assert min(res.id_map.values()) > int(keep[1])  # numbered after the store's own ids
    with MemoryStore(tmp_path / "dst") as d:
        after = state(d)
        assert d.namespaces() == ["alice", "bob", "keep"]
        assert {k: v for k, v in after.items() if (isinstance(k, int) and v[0] == "keep") or
                (isinstance(k, tuple) and k[0] == "keep")} == \
            {k: v for k, v in before.items() if k != "ns"}
        inv = {v: k for k, v in res.id_map.items()}
        for new_id in res.id_map.values():  # every imported record as in the source, links mapped
            r, s0 = d.get(new_id), src.get(inv[new_id])
            assert (r.summary, r.turns, r.meta, r.version, r.status, r.invalidated_reason, r.event_time, r.level) == \
                (s0.summary, s0.turns, s0.meta, s0.version, s0.status, s0.invalidated_reason, s0.event_time, s0.level)
            assert r.turn_ids == tuple(res.id_map[c] for c in s0.turn_ids)
            assert r.topic_id == (None if s0.topic_id is None else res.id_map[s0.topic_id])
            np.testing.assert_array_equal(r.embedding, s0.embedding)
            assert [h.summary for h in d.history(new_id)] == [h.summary for h in src.history(inv[new_id])]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_existing_store_refusals_leave_it_untouched(tmp_path):
    x = _export(tmp_path)  # namespaces alice, bob
    with MemoryStore(tmp_path / "dst", dim=D) as d:
        d.add("bob", "mine", np.ones(D, np.float32))
    before = _files(tmp_path / "dst")
    with pytest.raises(MemkernValueError, match=r"namespaces: .*never merges.*\['bob'\]"):
        import_store(tmp_path / "dst", x)
    assert _files(tmp_path / "dst") == before
    with MemoryStore(tmp_path / "other", dim=D + 1) as d:
        d.add("z", "z", np.ones(D + 1, np.float32))
    before = _files(tmp_path / "other")
    with pytest.raises(MemkernValueError, match="dim mismatch"):
        import_store(tmp_path / "other", x)
    assert _files(tmp_path / "other") == before
    with MemoryStore(tmp_path / "rr", dim=D) as d:  # a reranker file of "alice" but no records
        d.add("z", "z", np.ones(D, np.float32))
    reranker_file(tmp_path / "rr", "alice").parent.mkdir()
    reranker_file(tmp_path / "rr", "alice").write_bytes(b"old")
    with pytest.raises(MemkernValueError, match="alice"):
        import_store(tmp_path / "rr", x)
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "f").write_text("not a store")
    with pytest.raises(MemkernValueError, match="store"):
        import_store(tmp_path / "junk", x)
    with MemoryStore(tmp_path / "held", dim=D):
        with pytest.raises(MemkernError, match="already open"):
            import_store(tmp_path / "held", x)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    (tmp_path / "empty").mkdir()
    import_store(tmp_path / "empty", x)  # an empty directory is a new store
    with MemoryStore(tmp_path / "empty") as d:
        assert d.namespaces() == ["alice", "bob"]


def test_id_gaps_beyond_the_limit_are_renumbered(tmp_path):
    mem = InMemoryStore(D)
    ids = mem.add_batch("u", ["a", "b"], np.eye(D, dtype=np.float32)[:2], turns=[[{"role": "u", "content": "x"}], None],
                        turn_embeddings=[np.eye(D, dtype=np.float32)[2:3], None])
    export_store(mem, tmp_path / "x.jsonl")
    objs = lines(tmp_path / "x.jsonl")
    shift = 10_000
    for o in objs[1:-1]:  # move every id far up: the gaps outnumber the records
        o["id"] += shift
        o["topic_id"] = None if o["topic_id"] is None else o["topic_id"] + shift
        o["turn_ids"] = [c + shift for c in o["turn_ids"]]
    (tmp_path / "s.jsonl").write_text("".join(json.dumps(o) + "\n" for o in objs))
    res = import_store(tmp_path / "d", tmp_path / "s.jsonl")
    assert res.renumbered and res.id_map == {shift + int(ids[0]): 0, shift + 1: 1, shift + int(ids[1]): 2}
    with MemoryStore(tmp_path / "d") as d:
        assert d.get(0).turn_ids == (1,) and d.get(1).topic_id == 0 and d.get(2).summary == "b"


_KILL = textwrap.dedent("""
    import os, signal, sys
    import memkern.store.transfer.write as T
    from memkern.store import MemoryStore
    at = sys.argv[1]
    if at == "records":
        real = T.native
        class Proxy:
            def __init__(self, n): self.n, self.calls = n, 0
            def __getattr__(self, name): return getattr(self.n, name)
            def new_version(self, *a):
                self.calls += 1
                if self.calls == 2:
                    os.kill(os.getpid(), signal.SIGKILL)
                return self.n.new_version(*a)
        T.native = lambda s: Proxy(real(s))
    else:
        def snap(self):
            os.kill(os.getpid(), signal.SIGKILL)
        MemoryStore.snapshot = snap
    from memkern import cli
    sys.exit(cli.main(["import", "--store", sys.argv[2], "--in", sys.argv[3]]))
""")


@pytest.mark.slow
@pytest.mark.parametrize("at", ["records", "before-rename"])
@pytest.mark.parametrize("target", ["absent", "empty dir", "existing store"])
def test_kill_mid_import_leaves_target_unchanged(tmp_path, at, target):
    x = _export(tmp_path)
    dst = tmp_path / "dst"
    if target == "empty dir":
        dst.mkdir()
    before = None
    if target == "existing store":
        with MemoryStore(dst, dim=D, snapshot_every=0) as d:
            d.add("keep", "mine", np.ones(D, np.float32))
        with MemoryStore(dst) as d:
            before = state(d)
    proc = subprocess.run([sys.executable, "-c", _KILL, at, str(dst), str(x)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == -9, proc.stderr[-2000:]
    if before is None:
        assert dst.exists() == (target == "empty dir") and (not dst.exists() or list(dst.iterdir()) == [])
    else:
        with MemoryStore(dst) as d:
            assert state(d) == before
    leftovers = [p for p in tmp_path.iterdir() if p.name.startswith(".dst.import-")]
    assert len(leftovers) == 1  # the half-built store, beside the target, never read
    assert cli.main(["import", "--store", str(dst), "--in", str(x)]) == 0  # a rerun succeeds
    with MemoryStore(dst) as d, MemoryStore(tmp_path / "src") as s:
        if before is None:
            assert state(d) == state(s)
        else:
            assert d.namespaces() == ["alice", "bob", "keep"] and d.count("alice") == s.count("alice")


def test_cli_export_import_and_one_line_errors(tmp_path, capsys):
    with MemoryStore(tmp_path / "src", dim=D) as s:
        fill(s)
        want = state(s)
    out = tmp_path / "x.jsonl"
    assert cli.main(["export", "--store", str(tmp_path / "src"), "--out", str(out), "--namespace", "bob"]) == 0
    assert "exported" in capsys.readouterr().out
    assert lines(out)[0]["namespaces"] == ["bob"]
    assert cli.main(["export", "--store", str(tmp_path / "src"), "--out", str(out)]) == 0
    assert cli.main(["import", "--store", str(tmp_path / "dst"), "--in", str(out)]) == 0
    assert "imported" in capsys.readouterr().out
    with MemoryStore(tmp_path / "dst") as d:
        assert state(d) == want
    bad = _corrupt(out, 3, lambda t: t.replace('"versions"', '"versionz"'))
    for argv in (["import", "--store", str(tmp_path / "dst"), "--in", str(out)],
                 ["import", "--store", str(tmp_path / "new"), "--in", str(bad)],
                 ["import", "--store", str(tmp_path / "new"), "--in", str(tmp_path / "missing.jsonl")],
                 ["export", "--store", str(tmp_path / "src"), "--out", str(out), "--namespace", "carol"],
                 ["export", "--store", str(tmp_path / "nothing"), "--out", str(out)]):
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("memkern: error: ") and err.count("\n") == 1, (argv, err)
    assert not (tmp_path / "new").exists()


def test_cli_import_without_embeddings_uses_the_embedder(tmp_path, capsys, monkeypatch):
    from memkern.cli import common as C

    emb = HashEmbedder(D)
    built = []
    monkeypatch.setattr(C, "build_models", lambda args, need_chat=True: built.append(args.embedder) or (None, emb))
    src = InMemoryStore(D)
    fill(src)
    export_store(src, tmp_path / "x.jsonl", embeddings=False)
    assert cli.main(["import", "--store", str(tmp_path / "d"), "--in", str(tmp_path / "x.jsonl"),
                     "--embedder", "my-model"]) == 0
    assert built == ["my-model"]
    with MemoryStore(tmp_path / "d") as d:
        r = d.get(int(d.ids("bob")[0]))
        np.testing.assert_array_equal(r.embedding, emb.encode([r.summary])[0])
    export_store(src, tmp_path / "y.jsonl")
    assert cli.main(["import", "--store", str(tmp_path / "e"), "--in", str(tmp_path / "y.jsonl")]) == 0
    assert built == ["my-model"]  # a file with vectors needs no model


def test_import_into_a_store_with_an_unsnapshotted_log(tmp_path):
    """The target's writes are only in its log (killed without close): the import snapshots it
    before copying, so closing the old handle after the swap writes nothing into the new store."""
    x = _export(tmp_path)
    code = textwrap.dedent(f"""
        import os, numpy as np
        from memkern.store import MemoryStore
        s = MemoryStore({str(tmp_path / 'dst')!r}, dim={D}, snapshot_every=0)
        s.add_batch("keep", ["a", "b"], np.ones((2, {D}), np.float32))
        os._exit(0)
    """)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    assert not (tmp_path / "dst" / "CURRENT").exists()
    res = import_store(tmp_path / "dst", x)
    for _ in range(2):
        with MemoryStore(tmp_path / "dst") as d:
            assert d.namespaces() == ["alice", "bob", "keep"] and d.count("keep") == 2
            assert d.get(min(res.id_map.values())).namespace == "alice"
