"""The store suite: every operation and every refused input (a refused call changes nothing).

Tests taking the ``store`` or ``make_store`` fixture run on both stores (the native
``MemoryStore`` on disk and the engine with persistence off, ``InMemoryStore``, tests/conftest.py); the ones about files,
locks, the log and reopening are MemoryStore's alone."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

import memkern
from memkern import MemkernError, MemkernKeyError, MemkernTypeError, MemkernValueError
from memkern.store import PAD_SCORE, MemoryStore, Record, default_store_path

D = 16


def vecs(n: int, seed: int = 0, d: int = D) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, d)).astype(np.float32)


def turns(*contents: str, session: str = "s1") -> list[dict]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": c, "session_id": session, "turn_index": i}
            for i, c in enumerate(contents)]


@pytest.fixture
def store(make_store):
    return make_store(D)


def snapshot_state(s: MemoryStore, ns: str = "u") -> tuple:
    """Everything observable about namespace ns (to check that refused calls change nothing)."""
    ids, scores = s.search(ns, vecs(3, 99), k=50, include_invalidated=True)
    recs = [s.get(int(i)) for i in ids[0] if i >= 0]
    return (s.count(ns, include_invalidated=True), s.count(ns), ids.tolist(), scores.tolist(),
            [(r.id, r.summary, r.version, r.status, json.dumps(r.turns), json.dumps(r.meta)) for r in recs],
            s.namespaces())


# ------------------------------------------------------------------------------- basics


def test_public_names():
    from memkern.store.memory import InMemoryStore

    assert memkern.MemoryStore is MemoryStore
    assert memkern.Record is Record
    assert memkern.InMemoryStore is InMemoryStore and "InMemoryStore" in memkern.__all__


def test_closed_store_refuses(store):
    rid = store.add("u", "x", vecs(1)[0])
    store.close()
    store.close()  # idempotent
    assert store.closed
    for call in (lambda: store.add("u", "x", vecs(1)[0]), lambda: store.search("u", vecs(1)),
                 lambda: store.get(rid), lambda: store.count("u")):
        with pytest.raises(MemkernValueError, match="closed"):
            call()


def test_add_get_roundtrip(store):
    e = vecs(1)[0]
    t = turns("héllo wörld ✓", "fine, 谢谢")
    t[0]["timestamp"] = "2024-01-02T03:04:05"
    t[1]["extra"] = {"nested": [1, 2.5, None, True]}
    rid = store.add("u", "greeting ✓", e, t, {"k": [1, "x"]})
    assert isinstance(rid, int) and rid >= 0
    r = store.get(rid)
    assert (r.id, r.namespace, r.summary, r.version, r.status) == (rid, "u", "greeting ✓", 1, "active")
    assert r.turns == t and r.meta == {"k": [1, "x"]}
    assert r.invalidated_reason is None and r.level == "topic" and r.topic_id is None
    assert r.created_at == r.updated_at > 0
    np.testing.assert_array_equal(r.embedding, e)
    assert r.embedding.dtype == np.float32
    with pytest.raises(Exception):
        r.summary = "x"  # frozen


def test_add_batch_ids_and_search_exact_small(store):
    e = vecs(30)
    ids = store.add_batch("u", [f"s{i}" for i in range(30)], e, metas=[{"i": i} for i in range(30)])
    assert ids.dtype == np.int64 and ids.shape == (30,) and len(set(ids.tolist())) == 30
    q = vecs(4, 7)
    got, sc = store.search("u", q, k=5, ef=200)
    assert got.shape == (4, 5) and got.dtype == np.int64 and sc.dtype == np.float32
    exact = q @ e.T
    for b in range(4):
        order = np.argsort(-exact[b])[:5]
        np.testing.assert_array_equal(got[b], ids[order])
        np.testing.assert_allclose(sc[b], exact[b][order], rtol=1e-5, atol=1e-5)
    assert [store.get(int(i)).meta["i"] for i in ids[:3]] == [0, 1, 2]


@pytest.mark.parametrize("metric", ["ip", "l2", "cos"])
def test_scores_higher_is_better(make_store, metric):
    e = vecs(20, 1)
    with make_store(D, metric, name=metric) as s:
        ids = s.add_batch("u", ["x"] * 20, e)
        q = vecs(2, 5)
        got, sc = s.search("u", q, k=20, ef=100)
        if metric == "ip":
            ref = q @ e.T
        elif metric == "l2":
            ref = -((q[:, None, :] - e[None]) ** 2).sum(-1)
        else:
            en = e / np.linalg.norm(e, axis=1, keepdims=True)
            ref = (q / np.linalg.norm(q, axis=1, keepdims=True)) @ en.T
        for b in range(2):
            order = np.argsort(-ref[b])
            np.testing.assert_array_equal(got[b], ids[order])
            np.testing.assert_allclose(sc[b], ref[b][order], rtol=1e-4, atol=1e-4)
            assert np.all(np.diff(sc[b]) <= 1e-6)
        if metric == "cos":
            np.testing.assert_allclose(np.linalg.norm(s.embeddings(ids), axis=1), 1.0, rtol=1e-6)


def test_padding_finite(store):
    store.add_batch("u", ["a", "b"], vecs(2))
    ids, sc = store.search("u", vecs(1)[0], k=5)
    assert ids.shape == (1, 5)
    assert (ids[0, 2:] == -1).all() and (ids[0, :2] >= 0).all()
    assert np.isfinite(sc).all() and (sc[0, 2:] == PAD_SCORE).all() and PAD_SCORE == np.finfo(np.float32).min
    ids, sc = store.search("nobody", vecs(2), k=3)
    assert (ids == -1).all() and (sc == PAD_SCORE).all()


def test_namespaces_isolated_at_any_k(store):
    a = store.add_batch("alice", ["a"] * 40, vecs(40, 1))
    b = store.add_batch("bob", ["b"] * 25, vecs(25, 2))
    q = vecs(3, 3)
    for k in (1, 10, 25, 40, 65, 200):
        ia, _ = store.search("alice", q, k=k)
        ib, _ = store.search("bob", q, k=k)
        assert set(ia[ia >= 0].tolist()) <= set(a.tolist())
        assert set(ib[ib >= 0].tolist()) <= set(b.tolist())
        assert (ia >= 0).sum(1).tolist() == [min(k, 40)] * 3
        assert (ib >= 0).sum(1).tolist() == [min(k, 25)] * 3
    assert store.namespaces() == ["alice", "bob"]
    assert store.count("alice") == 40 and store.count("bob") == 25 and store.count("carol") == 0


# ------------------------------------------------------------------------------- versions


def test_merge_keeps_history_and_unions_turns(store):
    e = vecs(3)
    t1 = turns("a", "b")
    rid = store.add("u", "v1", e[0], t1, {"m": 1})
    t2 = [t1[1], {"role": "user", "content": "c", "session_id": "s2", "turn_index": 0}]
    v = store.merge(rid, "v2", e[1], t2)
    assert v == 2
    r = store.get(rid)
    assert r.version == 2 and r.summary == "v2" and r.meta == {"m": 1}
    assert r.turns == t1 + [t2[1]]  # union, old first, duplicate dropped
    np.testing.assert_array_equal(r.embedding, e[1])
    h = store.history(rid)
    assert [x.version for x in h] == [1, 2] and [x.summary for x in h] == ["v1", "v2"]
    assert h[0].turns == t1
    np.testing.assert_array_equal(h[0].embedding, e[0])
    np.testing.assert_array_equal(h[1].embedding, e[1])
    ids, _ = store.search("u", e[1], k=1)  # the index follows the new embedding
    assert ids[0, 0] == rid


def test_update_replaces_fields(store):
    e = vecs(2)
    rid = store.add("u", "v1", e[0], turns("a"), {"m": 1})
    assert store.update(rid, meta={"m": 2}) == 2
    assert store.update(rid, summary="v3", turns=turns("z")) == 3
    r = store.get(rid)
    assert (r.summary, r.turns, r.meta, r.version) == ("v3", turns("z"), {"m": 2}, 3)
    np.testing.assert_array_equal(r.embedding, e[0])
    assert store.update(rid, embedding=e[1]) == 4
    np.testing.assert_array_equal(store.get(rid).embedding, e[1])
    assert [x.summary for x in store.history(rid)] == ["v1", "v1", "v3", "v3"]
    with pytest.raises(MemkernValueError, match="at least one"):
        store.update(rid)


def test_invalidate_excluded_unless_asked(store):
    e = vecs(5)
    ids = store.add_batch("u", list("abcde"), e)
    store.invalidate(int(ids[0]), "user said it was wrong")
    r = store.get(int(ids[0]))
    assert r.status == "invalidated" and r.invalidated_reason == "user said it was wrong"
    got, _ = store.search("u", e[0], k=5)
    assert ids[0] not in got and (got[0, :4] >= 0).all() and got[0, 4] == -1
    got, _ = store.search("u", e[0], k=5, include_invalidated=True)
    assert got[0, 0] == ids[0]
    assert store.count("u") == 4 and store.count("u", include_invalidated=True) == 5
    with pytest.raises(MemkernValueError, match="already invalidated"):
        store.invalidate(int(ids[0]), "again")


def test_delete(store, tmp_path):
    e = vecs(4)
    ids = store.add_batch("u", list("abcd"), e)
    store.delete(int(ids[1]))
    with pytest.raises(MemkernKeyError, match="deleted"):
        store.get(int(ids[1]))
    with pytest.raises(MemkernKeyError, match="deleted"):
        store.delete(int(ids[1]))
    with pytest.raises(MemkernKeyError):
        store.embeddings([int(ids[1])])
    got, _ = store.search("u", e[1], k=4)
    assert ids[1] not in got and got[0, 3] == -1
    assert store.count("u") == 3 and int(ids[1]) not in store and int(ids[0]) in store


def test_compact_removes_deleted_bytes(tmp_path):
    path = tmp_path / "c"
    e = vecs(50)
    secret = "SECRET-TOPIC-TEXT-42"
    with MemoryStore(path, dim=D) as s:
        ids = s.add_batch("u", [secret if i == 7 else f"t{i}" for i in range(50)], e)
        s.snapshot()
        s.delete(int(ids[7]))
        s.add_batch("gone", ["only"], vecs(1, 3))
        s.delete(int(s.search("gone", vecs(1, 3), k=1)[0][0, 0]))

        def all_bytes():
            return b"".join(p.read_bytes() for p in path.rglob("*") if p.is_file())

        assert secret.encode() in all_bytes()  # still in the old snapshot before compaction
        s.compact()
        data = all_bytes()
        assert secret.encode() not in data
        assert e[7].tobytes() not in data
        assert s.namespaces() == ["u"] and s.count("u") == 49
        got, _ = s.search("u", e, k=1, ef=200)
        keep = np.arange(50) != 7
        np.testing.assert_array_equal(got[keep, 0], ids[keep])
        with pytest.raises(MemkernKeyError):
            s.get(int(ids[7]))
    with MemoryStore(path) as s:
        assert s.count("u") == 49 and s.get(int(ids[8])).summary == "t8"


def test_get_batch_embeddings(store):
    e = vecs(6)
    ids = store.add_batch("u", list("abcdef"), e)
    recs = store.get_batch(ids[[4, 0, 2]])
    assert [r.summary for r in recs] == ["e", "a", "c"]
    assert [r.summary for r in store.get_batch([int(ids[1])])] == ["b"]
    out = store.embeddings(ids[::-1].copy())
    assert out.shape == (6, D) and out.dtype == np.float32
    np.testing.assert_array_equal(out, e[::-1])
    np.testing.assert_array_equal(store.embeddings(torch.from_numpy(ids[:2].copy())), e[:2])
    assert store.embeddings([]).shape == (0, D)
    with pytest.raises(MemkernKeyError, match="unknown id 999"):
        store.get_batch([int(ids[0]), 999])
    with pytest.raises(MemkernTypeError):
        store.embeddings(np.array([0.5]))


def test_unknown_ids(store):
    with pytest.raises(MemkernKeyError, match="unknown id 5"):
        store.get(5)
    with pytest.raises(KeyError):  # plain KeyError works too
        store.get(-3)
    for call in (lambda: store.delete(5), lambda: store.invalidate(5, "x"), lambda: store.history(5),
                 lambda: store.merge(5, "s", vecs(1)[0]), lambda: store.update(5, summary="s")):
        with pytest.raises(MemkernKeyError):
            call()
    with pytest.raises(MemkernTypeError, match="id"):
        store.get("3")
    with pytest.raises(MemkernTypeError, match="id"):
        store.get(True)


# ------------------------------------------------------------------------------- input validation


def test_dtype_rules(store):
    e = vecs(3)
    store.add("u", "f32", e[0])
    rid = store.add("u", "f16", e[1].astype(np.float16))
    np.testing.assert_array_equal(store.get(rid).embedding, e[1].astype(np.float16).astype(np.float32))
    rid = store.add("u", "f64 exact", e[2].astype(np.float64))
    np.testing.assert_array_equal(store.get(rid).embedding, e[2])
    rid = store.add("u", "torch", torch.from_numpy(e[0]).to(torch.bfloat16))
    np.testing.assert_array_equal(store.get(rid).embedding, torch.from_numpy(e[0]).to(torch.bfloat16).float().numpy())
    rid = store.add("u", "torch grad", torch.from_numpy(e[1]).requires_grad_())
    np.testing.assert_array_equal(store.get(rid).embedding, e[1])
    before = snapshot_state(store)
    lossy = np.random.default_rng(0).standard_normal(D)  # float64, not representable
    with pytest.raises(MemkernTypeError, match=r"float64.*astype"):
        store.add("u", "x", lossy)
    with pytest.raises(MemkernTypeError, match="dtype int64"):
        store.add("u", "x", np.arange(D))
    with pytest.raises(MemkernTypeError, match="bool"):
        store.add("u", "x", np.ones(D, dtype=bool))
    with pytest.raises(MemkernTypeError):
        store.add("u", "x", torch.arange(D))
    with pytest.raises(MemkernTypeError, match="float64"):
        store.add_batch("u", ["a", "b"], np.random.default_rng(1).standard_normal((2, D)))
    assert snapshot_state(store) == before
    # float64 queries are rounded (never stored)
    ids, _ = store.search("u", e[:1].astype(np.float64) + 1e-12, k=1)
    assert ids[0, 0] >= 0


def test_non_contiguous_and_torch(store):
    big = vecs(8, 3, d=2 * D)
    nc = big[:, ::2]
    assert not nc.flags["C_CONTIGUOUS"]
    ids = store.add_batch("u", list("abcdefgh"), nc)
    np.testing.assert_array_equal(store.embeddings(ids), np.ascontiguousarray(nc))
    t = torch.from_numpy(vecs(2, 4)).t().contiguous().t()  # a transposed view
    ids2 = store.add_batch("u", ["x", "y"], t)
    np.testing.assert_array_equal(store.embeddings(ids2), vecs(2, 4))
    got, _ = store.search("u", torch.from_numpy(nc[::2]), k=1, ef=50)
    np.testing.assert_array_equal(got[:, 0], ids[::2])


@pytest.mark.parametrize(
    "call, err, match",
    [
        (lambda s, e: s.add("u", "x", e[0][:-1]), MemkernValueError, r"embedding: expected shape \[16\]"),
        (lambda s, e: s.add("u", "x", e[:2]), MemkernValueError, "embedding: expected shape"),
        (lambda s, e: s.add("u", "x", np.full(D, np.nan, np.float32)), MemkernValueError, "NaN or inf"),
        (lambda s, e: s.add("u", "x", np.where(np.arange(D) == 3, np.inf, e[0]).astype(np.float32)),
         MemkernValueError, "NaN or inf"),
        (lambda s, e: s.add("", "x", e[0]), MemkernValueError, "namespace: expected a non-empty str"),
        (lambda s, e: s.add(3, "x", e[0]), MemkernTypeError, "namespace"),
        (lambda s, e: s.add("u", None, e[0]), MemkernTypeError, "summary"),
        (lambda s, e: s.add("u", "x", e[0], [{"role": "user"}]), MemkernValueError, r"turns\[0\].*content"),
        (lambda s, e: s.add("u", "x", e[0], [{"role": "user", "content": 3}]), MemkernTypeError, "content"),
        (lambda s, e: s.add("u", "x", e[0], {"role": "user", "content": "c"}), MemkernTypeError, "turns"),
        (lambda s, e: s.add("u", "x", e[0], [{"role": "u", "content": "c", "x": object()}]), MemkernTypeError,
         "JSON"),
        (lambda s, e: s.add("u", "x", e[0], None, {"x": float("nan")}), MemkernTypeError, "meta"),
        (lambda s, e: s.add("u", "x", e[0], None, [1]), MemkernTypeError, "meta"),
        (lambda s, e: s.add_batch("u", ["a", "b"], e[:3]), MemkernValueError, r"embeddings: expected shape \[2, 16\]"),
        (lambda s, e: s.add_batch("u", ["a", "b"], np.stack([e[0], np.full(D, np.nan, np.float32)])),
         MemkernValueError, r"NaN or inf at index \(1, 0\)"),
        (lambda s, e: s.add_batch("u", ["a", "b"], e[:2], turns=[turns("x")]), MemkernValueError, "turns"),
        (lambda s, e: s.add_batch("u", ["a", 7], e[:2]), MemkernTypeError, r"summaries\[1\]"),
        (lambda s, e: s.add_batch("u", "ab", e[:2]), MemkernTypeError, "summaries"),
        (lambda s, e: s.add_batch("u", ["a", "b"], e[:2], metas=[{}, {"k": {1, 2}}]), MemkernTypeError,
         r"metas\[1\]"),
        (lambda s, e: s.search("u", e[:, :-1]), MemkernValueError, "queries: expected shape"),
        (lambda s, e: s.search("u", e, k=0), MemkernValueError, "k: expected"),
        (lambda s, e: s.search("u", e, ef=0), MemkernValueError, "ef: expected"),
        (lambda s, e: s.search("u", e, level="chunk"), MemkernValueError, "level"),
        (lambda s, e: s.search("", e), MemkernValueError, "namespace"),
        (lambda s, e: s.search("u", np.full((1, D), np.nan)), MemkernValueError, "queries"),
        (lambda s, e: s.count("u", level="x"), MemkernValueError, "level"),
        (lambda s, e: s.invalidate(0, 5), MemkernTypeError, "reason"),
        (lambda s, e: s.merge(0, "s", e[0][:3]), MemkernValueError, "embedding"),
        (lambda s, e: s.update(0, embedding=np.full(D, np.inf, np.float32)), MemkernValueError, "NaN or inf"),
    ],
)
def test_refused_calls_change_nothing(store, call, err, match):
    e = vecs(4)
    store.add_batch("u", ["a", "b", "c", "d"], e, turns=[turns("x")] * 4)
    before = snapshot_state(store)
    with pytest.raises(err, match=match):
        call(store, e)
    assert snapshot_state(store) == before


def test_cos_zero_vector_refused(make_store):
    with make_store(D, "cos", name="z") as s:
        with pytest.raises(MemkernValueError, match="nonzero"):
            s.add_batch("u", ["a", "b"], np.stack([vecs(1)[0], np.zeros(D, np.float32)]))
        assert s.count("u") == 0 and s.namespaces() == []


# ------------------------------------------------------------------------------- lifecycle


def test_reopen_dim_metric_rules(tmp_path):
    p = tmp_path / "r"
    with pytest.raises(MemkernValueError, match="dim"):
        MemoryStore(p)  # new store needs dim
    with MemoryStore(p, dim=D, metric="l2") as s:
        rid = s.add("u", "x", vecs(1)[0])
    with MemoryStore(p) as s:  # dim and metric come from the store
        assert (s.dim, s.metric) == (D, "l2") and s.get(rid).summary == "x"
    with pytest.raises(MemkernValueError, match=r'holds dim=16, metric="l2"; it was opened with dim=8'):
        MemoryStore(p, dim=8)
    with pytest.raises(MemkernValueError, match=r'holds dim=16, metric="l2".*metric="ip"'):
        MemoryStore(p, dim=D, metric="ip")
    with pytest.raises(MemkernValueError, match="metric"):
        MemoryStore(tmp_path / "m", dim=D, metric="dot")
    with pytest.raises(MemkernValueError, match="fsync"):
        MemoryStore(tmp_path / "m", dim=D, fsync="sometimes")
    with pytest.raises(MemkernValueError, match="dim"):
        MemoryStore(tmp_path / "m", dim=0)


def test_lock_and_close(tmp_path):
    p = tmp_path / "l"
    s = MemoryStore(p, dim=D)
    with pytest.raises(MemkernError, match="already open"):
        MemoryStore(p)
    s.close()
    s.close()  # idempotent
    assert s.closed
    with pytest.raises(MemkernValueError, match="closed"):
        s.add("u", "x", vecs(1)[0])
    with pytest.raises(MemkernValueError, match="closed"):
        s.search("u", vecs(1))
    with MemoryStore(p) as s2:
        assert s2.count("u") == 0
    assert s2.closed


def test_persistence_all_fields(tmp_path):
    p = tmp_path / "p"
    e = vecs(5)
    with MemoryStore(p, dim=D, fsync="batch") as s:
        ids = s.add_batch("u", list("abcde"), e, turns=[turns("q", "a")] * 5, metas=[{"i": i} for i in range(5)])
        s.merge(int(ids[0]), "a2", e[4], turns("r"))
        s.invalidate(int(ids[1]), "wrong")
        s.delete(int(ids[2]))
        before = snapshot_state(s)
        hist = [(r.version, r.summary, r.turns) for r in s.history(int(ids[0]))]
        r0 = s.get(int(ids[0]))
    for _ in range(2):  # after close (snapshot) and again
        with MemoryStore(p) as s:
            assert snapshot_state(s) == before
            assert [(r.version, r.summary, r.turns) for r in s.history(int(ids[0]))] == hist
            assert s.get(int(ids[0])) == r0
            with pytest.raises(MemkernKeyError, match="deleted"):
                s.delete(int(ids[2]))
            nid = s.add("u", "new", e[0])
            assert nid > max(ids)  # ids never reused
            s.delete(nid)


def test_log_replay_without_close(tmp_path):
    """Writes that were only logged (no snapshot, no close) come back."""
    import subprocess
    import sys

    p = tmp_path / "w"
    code = f"""
import numpy as np, os
from memkern.store import MemoryStore
s = MemoryStore({str(p)!r}, dim={D}, snapshot_every=0)
e = np.random.default_rng(0).standard_normal((20, {D})).astype(np.float32)
ids = s.add_batch("u", [f"t{{i}}" for i in range(20)], e)
s.merge(int(ids[0]), "m", e[1], [{{"role": "user", "content": "c"}}])
s.invalidate(int(ids[3]), "r")
s.delete(int(ids[4]))
os._exit(0)  # no close, no snapshot
"""
    subprocess.run([sys.executable, "-c", code], check=True)
    assert not (p / "CURRENT").exists()
    e = np.random.default_rng(0).standard_normal((20, D)).astype(np.float32)
    with MemoryStore(p, num_threads=2) as s:  # the replay inserts with 2 threads
        assert s.count("u") == 18 and s.count("u", include_invalidated=True) == 19
        assert s.get(0).summary == "m" and s.get(0).version == 2 and s.get(3).status == "invalidated"
        np.testing.assert_array_equal(s.embeddings([0, 1, 2]), e[[1, 1, 2]])


def test_default_path(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert default_store_path() == tmp_path / "xdg" / "memkern" / "default"
    with MemoryStore(dim=D) as s:
        assert s.path == tmp_path / "xdg" / "memkern" / "default"
        s.add("u", "x", vecs(1)[0])
    assert (tmp_path / "xdg" / "memkern" / "default" / "CURRENT").exists()
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_store_path() == tmp_path / "home" / ".local" / "share" / "memkern" / "default"
    # $MEMKERN_STORE wins, for the Python API and the CLI alike (one definition: memkern.base.paths)
    monkeypatch.setenv("MEMKERN_STORE", str(tmp_path / "env-store"))
    from memkern.cli.common import default_store_path as cli_default

    assert default_store_path() == cli_default() == tmp_path / "env-store"
    with MemoryStore(dim=D) as s:
        assert s.path == tmp_path / "env-store"


def test_snapshot_every_truncates_log(tmp_path):
    p = tmp_path / "s"
    with MemoryStore(p, dim=D, snapshot_every=10) as s:
        for i in range(25):
            s.add("u", f"t{i}", vecs(1, i)[0])
            s._native.wait_snapshot()  # the automatic snapshot is written by a background thread
        assert (p / "CURRENT").exists() and s._native.generation == 2
        assert [Path(f).name for f in s._native.log_files] == ["wal.log"]
        assert os.path.getsize(p / "wal.log") < 5 * (D * 4 + 200)
    with MemoryStore(p) as s:
        assert s.count("u") == 25 and s.get(24).summary == "t24"


def test_ids_listing(store):
    ids = store.add_batch("u", list("abcd"), vecs(4))
    store.add("v", "x", vecs(1, 5)[0])
    store.invalidate(int(ids[1]), "r")
    store.delete(int(ids[2]))
    assert store.ids("u").tolist() == [int(ids[0]), int(ids[3])]
    assert store.ids("u", include_invalidated=True).tolist() == [int(ids[0]), int(ids[1]), int(ids[3])]
    assert store.ids("u", level="turn").tolist() == [] and store.ids("nobody").dtype == np.int64
    with pytest.raises(MemkernValueError, match="level"):
        store.ids("u", level="x")


@pytest.mark.slow
def test_parallel_insert(tmp_path):
    """num_threads=2 inserts a batch's vectors concurrently: same records, same search quality."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3000, D)).astype(np.float32)
    q = rng.standard_normal((50, D)).astype(np.float32)
    exact = np.argsort(-(q @ x.T), axis=1)[:, :10]
    with MemoryStore(tmp_path / "p", dim=D, num_threads=2, snapshot_every=0) as s:
        ids = s.add_batch("u", [f"s{i}" for i in range(3000)], x, turns=[turns("t")] * 3000,
                          turn_embeddings=[x[i:i + 1] for i in range(3000)])
        assert s.count("u") == 3000 and s.count("u", level="turn") == 3000
        got, _ = s.search("u", q, k=10, ef=400)
        hit = np.mean([len(set(got[b].tolist()) & set(ids[exact[b]].tolist())) / 10 for b in range(50)])
        assert hit >= 0.99
        np.testing.assert_array_equal(s.embeddings(ids), x)
        assert [r.summary for r in s.get_batch(ids[[0, 2999]])] == ["s0", "s2999"]
    with pytest.raises(MemkernValueError, match="num_threads"):
        MemoryStore(tmp_path / "q", dim=D, num_threads=0)
