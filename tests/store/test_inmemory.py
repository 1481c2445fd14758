"""InMemoryStore against MemoryStore: the same operations give the same observable store (ids,
records, versions, links, errors, exact search), HNSW compared with the exact scan, the
protocols, and RMM's real loop on an InMemoryStore."""
from __future__ import annotations

import json

import numpy as np
import pytest

import memkern
from memkern import _store
from memkern import protocols as P
from memkern.errors import MemkernError, MemkernValueError
from memkern.store.memory import InMemoryStore
from memkern.store import PAD_SCORE, MemoryStore

D = 8


def rows(rng, n):
    return rng.standard_normal((n, D)).astype(np.float32)


def conv(rng, n, tag):
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"{tag}-{i}-{int(rng.integers(3))}",
             "turn_index": i} for i in range(n)]


def observable(s, namespaces=("a", "b")) -> dict:
    """Everything a user can read from a store (timestamps aside: each store has its own clock)."""
    out = {"namespaces": s.namespaces()}
    rng = np.random.default_rng(1234)
    q = rows(rng, 3)
    for ns in namespaces:
        for level in ("topic", "turn"):
            for inc in (False, True):
                ids = s.ids(ns, inc, level=level).tolist()
                out[(ns, level, inc)] = (ids, s.count(ns, inc, level=level))
                for rid in ids:
                    r = s.get(rid)
                    out[rid] = (r.namespace, r.summary, json.dumps(r.turns), json.dumps(r.meta), r.version,
                                r.status, r.invalidated_reason, r.level, r.topic_id, r.turn_ids, r.event_time,
                                r.embedding.tobytes())
                    out[("h", rid)] = [(h.version, h.summary, json.dumps(h.turns), json.dumps(h.meta),
                                        h.embedding.tobytes()) for h in s.history(rid)]
        for level in ("topic", "turn", "turn+topic"):
            for inc in (False, True):
                ids, sc = s.search(ns, q, k=12, include_invalidated=inc, level=level)
                out[("search", ns, level, inc)] = (ids.tolist(), sc)
        for level in ("topic", "turn"):  # lexical, hybrid, filters, time ranges (the native search_ex)
            texts = ["merged s1 x-0-1 b0", "upd u-1-2", "m-0-0 zzz"]
            for j, kw in enumerate((dict(mode="lexical", texts=texts), dict(mode="hybrid", texts=texts),
                                    dict(mode="hybrid", texts=texts, fusion="weighted", lexical_weight=0.3),
                                    dict(filter={"k": {"$in": [0, 2]}}), dict(filter={"j": 1}, mode="hybrid", texts=texts),
                                    dict(time_range=(1.2e9, None), time_field="event"))):
                ids, sc = s.search(ns, None if kw.get("mode") == "lexical" else q, k=6, level=level, **kw)
                out[("search", ns, level, "ex", j)] = (ids.tolist(), sc)
    return out


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(key, tuple) and key[0] == "search":
            (ia, sa), (ib, sb) = a[key], b[key]
            assert ia == ib, key
            np.testing.assert_allclose(sa, sb, rtol=1e-5, atol=1e-5, err_msg=str(key))
        else:
            assert a[key] == b[key], key


def random_ops(s, seed: int, n_ops: int = 60) -> list:
    """Apply a seeded random mix of every write (and refused writes) to ``s``; returns what each
    call returned or raised (type and message), so two stores can be compared call by call."""
    rng = np.random.default_rng(seed)
    log = []

    def call(fn, *a, **kw):
        try:
            r = fn(*a, **kw)
            log.append(("ok", r.tolist() if isinstance(r, np.ndarray) else r))
        except MemkernError as e:
            log.append((type(e).__name__, str(e)))

    known: list[int] = []
    for _ in range(n_ops):
        op = rng.choice(["add", "add_batch", "merge", "update", "update_turns", "invalidate", "delete", "bad"],
                        p=[0.15, 0.15, 0.15, 0.15, 0.1, 0.1, 0.1, 0.1])
        ns = str(rng.choice(["a", "b"]))
        pick = int(rng.choice(known)) if known and rng.random() < 0.9 else int(rng.integers(0, 200))
        if op == "add":
            t = conv(rng, int(rng.integers(0, 4)), "x")
            te = rows(rng, len(t)) if t and rng.random() < 0.7 else None
            et = float(rng.integers(10**9, 2 * 10**9)) if rng.random() < 0.5 else None
            call(s.add, ns, f"s{rng.integers(99)}", rows(rng, 1)[0], t, {"k": int(rng.integers(3))}, turn_embeddings=te,
                 event_time=et)
        elif op == "add_batch":
            m = int(rng.integers(1, 5))
            ts = [conv(rng, int(rng.integers(1, 3)), f"b{j}") for j in range(m)]
            tes = [rows(rng, len(t)) if rng.random() < 0.6 else None for t in ts]
            call(s.add_batch, ns, [f"b{j}" for j in range(m)], rows(rng, m), ts, [{"j": j} for j in range(m)],
                 turn_embeddings=tes)
        elif op == "merge":
            t = conv(rng, int(rng.integers(0, 3)), "m")
            te = rows(rng, len(t)) if t and rng.random() < 0.7 else None
            call(s.merge, pick, "merged", rows(rng, 1)[0], t, turn_embeddings=te,
                 event_time=float(rng.integers(10**9)) if rng.random() < 0.3 else None)
        elif op == "update":
            call(s.update, pick, summary="upd" if rng.random() < 0.5 else None, meta={"u": 1},
                 embedding=rows(rng, 1)[0] if rng.random() < 0.5 else None)
        elif op == "update_turns":
            t = conv(rng, int(rng.integers(1, 3)), "u")
            call(s.update, pick, turns=t, turn_embeddings=rows(rng, len(t)) if rng.random() < 0.7 else None)
        elif op == "invalidate":
            call(s.invalidate, pick, f"r{rng.integers(9)}")
        elif op == "delete":
            call(s.delete, pick)
        else:
            bad = int(rng.integers(4))
            if bad == 0:
                call(s.add, ns, "x", rows(rng, 1)[0][:-1])
            elif bad == 1:
                call(s.add, ns, "x", rows(rng, 1)[0], [{"role": "user"}])
            elif bad == 2:
                call(s.merge, pick, "x", rows(rng, 1)[0], conv(rng, 2, "q"), turn_embeddings=rows(rng, 3))
            else:
                call(s.search, ns, rows(rng, 1), k=0)
        if log[-1][0] == "ok" and op in ("add", "add_batch"):
            r = log[-1][1]
            known.extend(r if isinstance(r, list) else [r])
            for rid in list(r if isinstance(r, list) else [r]):
                known.extend(s.get(rid).turn_ids)
    return log


@pytest.mark.parametrize("metric", ["ip", "l2", "cos"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_same_operations_same_store(tmp_path, metric, seed):
    """A random mix of every write (refused ones included) on both stores: every call returns or
    raises the same (type and message), and afterwards everything readable is equal (records,
    versions, links, embedding bits, ids, counts; search ids equal, scores to float32 rounding)."""
    with MemoryStore(tmp_path / "n", dim=D, metric=metric, fsync="never", flat_limit=1 << 20) as nat:
        mem = InMemoryStore(D, metric)
        la, lb = random_ops(nat, seed), random_ops(mem, seed)
        assert la == lb
        assert sum(1 for x in la if x[0] != "ok") >= 5 and sum(1 for x in la if x[0] == "ok") >= 20
        assert_same(observable(nat), observable(mem))
        nat.compact()
        mem.compact()
        assert_same(observable(nat), observable(mem))


def test_exact_scan_vs_hnsw(tmp_path):
    """Where MemoryStore searches an HNSW graph (approximate), InMemoryStore's exact scan is the
    reference: equal to numpy brute force, and the graph's recall@10 against it is high."""
    rng = np.random.default_rng(5)
    x = rows(rng, 1500)
    q = rows(rng, 40)
    mem = InMemoryStore(D, "ip")
    ids_m = mem.add_batch("u", [f"s{i}" for i in range(len(x))], x)
    got_m, sc_m = mem.search("u", q, k=10)
    ref = q.astype(np.float64) @ x.astype(np.float64).T
    want = np.argsort(-ref, axis=1, kind="stable")[:, :10]
    np.testing.assert_array_equal(got_m, ids_m[want])
    np.testing.assert_allclose(sc_m, np.take_along_axis(ref, want, 1), rtol=1e-6, atol=1e-6)
    with MemoryStore(tmp_path / "h", dim=D, flat_limit=0) as nat:
        assert nat._n().index_kind("u", _store.Level.topic) == ""
        ids_n = nat.add_batch("u", [f"s{i}" for i in range(len(x))], x)
        assert nat._n().index_kind("u", _store.Level.topic) == "hnsw"
        np.testing.assert_array_equal(ids_n, ids_m)
        got_n, _ = nat.search("u", q, k=10)
        recall = np.mean([len(set(got_n[b]) & set(got_m[b])) / 10 for b in range(len(q))])
        assert recall >= 0.95


def test_ties_go_to_the_lower_id():
    s = InMemoryStore(D, "ip")
    v = np.ones(D, np.float32)
    ids = s.add_batch("u", list("abcde"), np.stack([v] * 5))
    s.delete(int(ids[1]))
    got, sc = s.search("u", v, k=6)
    assert got[0].tolist() == [int(ids[0]), int(ids[2]), int(ids[3]), int(ids[4]), -1, -1]
    assert sc[0, 4] == PAD_SCORE and sc[0, 0] == sc[0, 3] == float(D)


def test_protocols_and_no_path():
    s = memkern.InMemoryStore(dim=4)
    assert isinstance(s, P.Store) and isinstance(s, P.TurnStore)
    assert s.path is None and s.closed is False and repr(s) == "InMemoryStore(dim=4, metric='ip')"
    empty = s.memory_bytes()
    s.add_batch("u", ["x" * 1000] * 50, np.ones((50, 4), np.float32))
    assert s.memory_bytes() >= empty + 50 * (1000 + 16)
    s.flush()
    s.close()
    assert repr(s) == "InMemoryStore(closed)"
    with pytest.raises(MemkernValueError, match="closed"):
        s.flush()
    for bad, match in (({"dim": 0}, "dim"), ({"dim": 4, "metric": "dot"}, "metric"), ({"dim": True}, "dim")):
        with pytest.raises(MemkernValueError, match=match):
            InMemoryStore(**bad)


def test_rmm_respond_loop_on_in_memory_store():
    """RMM's whole loop (extract -> decide -> store, retrieve -> rerank -> answer -> citations ->
    reward) on an InMemoryStore, with the fake chat backend."""
    from fakes_rmm import HashEmbedder, ScriptedChat
    from memkern.loops.rmm import RMM

    dim = 32
    store = InMemoryStore(dim, "cos")
    emb = HashEmbedder(dim)

    def respond(msgs):
        system = msgs[0]["content"]
        if "extract long-term memories" in system:
            user = msgs[-1]["content"]
            topic = "The user has a beagle named Pepper." if "Pepper" in user else "The user works as a nurse."
            return json.dumps({"topics": [{"summary": topic, "turns": [0]}]})
        if "memory bank" in system:
            return '{"action": "ADD"}'
        return '{"answer": "Pepper", "citations": [0]}'

    rmm = RMM(store, chat_model=ScriptedChat(respond), embedder=emb, namespace="u", persist=False,
              coverage_threshold=None, top_k=2, top_m=1, batch_size=1, extractor="llm")
    rmm.end_session([{"role": "user", "content": "My dog Pepper is a beagle."}], session_id="s1")
    rmm.end_session([{"role": "user", "content": "I work as a nurse."}], session_id="s2")
    assert store.count("u") == 2
    resp = rmm.respond("What is my dog's name?")
    assert resp.answer == "Pepper"
    assert resp.memory_ids and store.get(resp.memory_ids[0]).summary == "The user has a beagle named Pepper."
    assert store.path is None


def _open_files() -> set[str]:
    """Regular files this process holds open (/proc/self/fd)."""
    import os

    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            t = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if t.startswith("/") and os.path.isfile(t):
            out.add(t)
    return out


def test_memory_mode_creates_no_file(tmp_path, monkeypatch):
    """Every operation of the engine in memory mode (writes, refused writes, search, compact,
    flush, snapshot, close) leaves the working directory and the data folder empty, moves none of
    the store's write / fsync / rename counters and holds no file open; the same calls on a disk
    store do all three (the check can fail)."""
    import os
    from memkern.store.transfer import export_records, import_records

    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    data = os.environ["XDG_DATA_HOME"]
    data_before = sorted(os.listdir(data))
    rng = np.random.default_rng(3)

    def session(s, other):
        ids = s.add_batch("a", ["x", "y", "z"], rows(rng, 3))
        tid = s.add("a", "topic", rows(rng, 1)[0], turns=conv(rng, 3, "t"), turn_embeddings=rows(rng, 3))
        s.merge(int(ids[0]), "x2", rows(rng, 1)[0])
        s.update(int(ids[1]), summary="y2")
        s.invalidate(int(ids[2]), "old")
        s.delete(int(ids[1]))
        with pytest.raises(MemkernError):
            s.delete(int(ids[1]))
        s.search("a", rows(rng, 2), k=3, level="turn+topic", alpha=0.5)
        s.search("a", rows(rng, 2), k=3, mode="hybrid", texts=["x", "topic"], filter={"k": 1})
        import_records(other, "a", export_records(s, [tid]))
        s.flush()
        s.snapshot()
        s.snapshot(wait=False)
        s.compact()
        s.close()
        s.close()

    counters = _store._test_io_counters()
    held = _open_files()
    mem = InMemoryStore(D, "cos", id_range=(0, 1000))
    other = InMemoryStore(D, "cos", id_range=(1000, 2000))
    assert mem.native.in_memory_mode and mem.native.path == "" and mem.native.log_files == []
    session(mem, other)
    assert _open_files() - held == set()
    other.close()
    assert _store._test_io_counters() == counters
    assert list(work.iterdir()) == [] and sorted(os.listdir(data)) == data_before
    # the same session on disk writes, syncs and holds its LOCK / log open
    disk = MemoryStore(work / "d", dim=D, metric="cos", id_range=(0, 1000))
    assert not disk.native.in_memory_mode and (work / "d" / "LOCK").exists()
    assert _open_files() - held
    session(disk, InMemoryStore(D, "cos", id_range=(1000, 2000)))
    assert _store._test_io_counters()["writes"] > counters["writes"]


def test_memory_mode_maintenance():
    """flush / snapshot are checks only; compact drops deleted vectors and forgets deleted ids (an
    import of one is refused before and accepted after); the engine's closed / bad-argument errors
    name the in-memory store."""
    from memkern.errors import MemkernKeyError
    from memkern.store.transfer import export_records, import_records

    rng = np.random.default_rng(4)
    src = InMemoryStore(D, "ip", id_range=(0, 100))
    dst = InMemoryStore(D, "ip", id_range=(100, 200), flat_limit=2)
    ids = src.add_batch("u", ["a", "b", "c"], rows(rng, 3))
    recs = export_records(src, [int(i) for i in ids])
    assert import_records(dst, "u", recs) == 3
    assert dst.native.index_kind("u", _store.Level.topic) == "hnsw"
    dst.delete(int(ids[0]))
    dst.flush()
    dst.snapshot()
    with pytest.raises(MemkernKeyError, match=r"was deleted from in-memory store .*compact\(\) it first"):
        import_records(dst, "u", recs[:1])
    dst.compact()
    assert dst.native.index_kind("u", _store.Level.topic) == "flat"  # 2 live vectors <= flat_limit
    assert import_records(dst, "u", recs[:1]) == 1
    assert sorted(dst.ids("u").tolist()) == sorted(int(i) for i in ids)
    with pytest.raises(MemkernValueError, match="in-memory store: its id range ends at 200"):
        InMemoryStore(D, id_range=(199, 200)).add_batch("u", ["a", "b"], rows(rng, 2))
    for bad, match in (({"M": 1}, "^M: "), ({"flat_limit": -1}, "^flat_limit: "), ({"id_range": (5, 5)}, "^id_range: "),
                       ({"num_threads": 0}, "^num_threads: "), ({"ef_search": 0}, "^ef_search: ")):
        with pytest.raises(MemkernValueError, match=match):
            InMemoryStore(D, **bad)
    n = dst.native
    dst.close()
    with pytest.raises(MemkernValueError, match="^in-memory store: expected an open store"):
        dst.search("u", rows(rng, 1), k=1)
    with pytest.raises(MemkernValueError, match="^in-memory store is closed"):
        n.flush()
