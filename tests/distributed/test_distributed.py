"""memkern.distributed.ShardedStore on a local Ray instance: routing, ids, equality with one
MemoryStore, a shard killed mid-write, resumable rebalance."""
from __future__ import annotations

import hashlib
import json
import threading
import time

import numpy as np
import pytest

from _ray_local import local_ray

from memkern import MemoryStore
from memkern.errors import MemkernKeyError, MemkernValueError

D = 16


@pytest.fixture(scope="module")
def ray():
    return local_ray()


def _vecs(n, seed):
    return np.random.default_rng(seed).standard_normal((n, D)).astype(np.float32)


def _fill(store, namespaces, per=12):
    """The same records into any store; returns {namespace: [ids]}."""
    out = {}
    for j, ns in enumerate(namespaces):
        v = _vecs(per, j)
        turns = [[{"role": "user", "content": f"{ns} turn {i}"}] for i in range(per)]
        out[ns] = [int(i) for i in store.add_batch(ns, [f"{ns} memory {i}" for i in range(per)], v, turns,
                                                   [{"i": i} for i in range(per)])]
    return out


def test_shard_of_is_blake2b_mod_n():
    """The routing hash is blake2b-64 (little endian) of the UTF-8 namespace, mod N: stable in every process."""
    from memkern.distributed.sharded import shard_of

    for ns in ("alice", "bob", "ünïcode", "user-123456"):
        h = int.from_bytes(hashlib.blake2b(ns.encode("utf-8"), digest_size=8).digest(), "little")
        for n in (1, 2, 3, 7, 64):
            assert shard_of(ns, n) == h % n
    counts = np.bincount([shard_of(f"user-{i}", 4) for i in range(4000)], minlength=4)
    assert counts.min() > 900  # spread evenly


@pytest.mark.slow
def test_same_results_as_one_store(ray, tmp_path):
    from memkern.distributed import ShardedStore
    from memkern.protocols import Store, TurnStore

    names = [f"user-{i}" for i in range(9)]
    with MemoryStore(tmp_path / "one", dim=D, metric="cos") as one, \
            ShardedStore(tmp_path / "sharded", dim=D, metric="cos", shards=3) as sh:
        assert isinstance(sh, Store) and isinstance(sh, TurnStore)
        a, b = _fill(one, names), _fill(sh, names)
        # each namespace sits on its routed shard, and the id names that shard
        for ns in names:
            assert {i >> 48 for i in b[ns]} == {sh.shard_of(ns)}
        assert len({sh.shard_of(ns) for ns in names}) == 3
        assert sh.namespaces() == one.namespaces() == sorted(names)
        q = _vecs(5, 99)
        to_one = {g: l for ns in names for g, l in zip(b[ns], a[ns])}
        for ns in names:
            i1, s1 = one.search(ns, q, k=4)
            i2, s2 = sh.search(ns, q, k=4, level="topic")  # keyword arguments pass through
            np.testing.assert_array_equal(np.vectorize(to_one.get)(i2), i1)
            np.testing.assert_array_equal(s2, s1)
            assert sh.count(ns) == one.count(ns) == 12
        # the multi-namespace fan-out returns the same, in request order
        many = sh.search_many([(ns, q) for ns in reversed(names)], k=4)
        for ns, (ids, sc) in zip(reversed(names), many):
            np.testing.assert_array_equal(ids, sh.search(ns, q, k=4)[0])
        # ids spanning all shards: one call per shard, merged in the caller's order
        mixed = [b[names[0]][3], b[names[4]][0], b[names[8]][11], b[names[0]][1]]
        recs = sh.get_batch(mixed)
        assert [r.id for r in recs] == mixed
        assert [r.summary for r in recs] == [one.get(to_one[g]).summary for g in mixed]
        np.testing.assert_array_equal(sh.embeddings(mixed), one.embeddings([to_one[g] for g in mixed]))
        np.testing.assert_array_equal(recs[1].embedding, one.embeddings([to_one[mixed[1]]])[0])
        # writes by id reach the right shard
        g = b[names[5]][2]
        assert sh.update(g, summary="changed") == 2
        assert sh.get(g).summary == "changed" and len(sh.history(g)) == 2
        sh.invalidate(g, "stale")
        assert sh.count(names[5]) == 11 and sh.count(names[5], include_invalidated=True) == 12
        sh.delete(b[names[5]][3])
        assert b[names[5]][3] not in sh and g in sh
        with pytest.raises(MemkernKeyError):
            sh.get(b[names[5]][3])
        with pytest.raises(MemkernKeyError, match="shard 40"):
            sh.get((40 << 48) | 1)
        with pytest.raises(MemkernValueError, match="k"):   # the shard's own validation, unwrapped
            sh.search(names[0], q, k=0)
        with pytest.raises(TypeError, match="namespace"):
            sh.search(123, q)


@pytest.mark.slow
def test_reopen_keeps_layout_and_refuses_other_counts(ray, tmp_path):
    from memkern.distributed import ShardedStore

    with ShardedStore(tmp_path, dim=D, shards=2) as sh:
        ids = _fill(sh, ["a", "b", "c"])
    with ShardedStore(tmp_path) as sh:
        assert sh.shards == 2 and sh.dim == D
        assert sh.get(ids["b"][4]).summary == "b memory 4"
    with pytest.raises(MemkernValueError, match="rebalance"):
        ShardedStore(tmp_path, shards=3)
    # the shards' store options are checked in the caller, before anything is written
    with pytest.raises(MemkernValueError, match="fsync"):
        ShardedStore(tmp_path / "new", dim=D, shards=2, fsync="sometimes")
    with pytest.raises(TypeError, match="colour"):
        ShardedStore(tmp_path / "new", dim=D, shards=2, colour="red")
    assert not (tmp_path / "new").exists()
    # each shard directory is a plain MemoryStore holding exactly its routed namespaces
    from memkern.distributed.sharded import shard_of

    for s in range(2):
        with MemoryStore(tmp_path / f"shard-{s:03d}") as one:
            assert one.namespaces() == sorted(ns for ns in "abc" if shard_of(ns, 2) == s)


@pytest.mark.slow
def test_killed_shard_loses_no_acknowledged_write(ray, tmp_path):
    """ray.kill on a shard actor while a writer runs: the actor restarts from its directory and every
    write that returned is there, once; writes in flight raise ShardUnavailableError."""
    from memkern.distributed import ShardedStore, ShardUnavailableError

    sh = ShardedStore(tmp_path, dim=D, shards=2)
    try:
        ns = "victim"
        s = sh.shard_of(ns)
        pid0 = ray.get(sh.actors[s].ping.remote())
        acked: dict[int, str] = {}
        failed = []
        stop = threading.Event()

        def writer():
            i = 0
            while not stop.is_set() and i < 400:
                text = f"write {i}"
                try:
                    rid = sh.add_batch(ns, [text, text + "b"], _vecs(2, i))
                    acked[int(rid[0])] = text
                    acked[int(rid[1])] = text + "b"
                except ShardUnavailableError:
                    failed.append(i)
                i += 1

        t = threading.Thread(target=writer)
        t.start()
        while len(acked) < 40:
            time.sleep(0.01)
        ray.kill(sh.actors[s], no_restart=False)
        time.sleep(0.5)
        while len(acked) < 200 and t.is_alive():
            time.sleep(0.02)
        stop.set()
        t.join()
        pid1 = ray.get(sh.actors[s].ping.remote())
        assert pid1 != pid0  # restarted
        ids = sorted(acked)
        recs = sh.get_batch(ids)
        assert [r.summary for r in recs] == [acked[i] for i in ids]
        # nothing twice, nothing half: a batch is atomic, so the count is even and covers the acks
        n = sh.count(ns)
        assert n % 2 == 0 and len(acked) <= n <= len(acked) + 2 * len(failed)
    finally:
        sh.close()


def _state(sh, names):
    """Every record of ``names`` (topics and turns): the record, its whole history, its vector."""
    out = {}
    for ns in names:
        for level in ("topic", "turn"):
            for i in sh.ids(ns, include_invalidated=True, level=level):
                i = int(i)
                out[i] = (sh.get(i), sh.history(i), sh.embeddings([i])[0].tobytes())
    return out


@pytest.mark.slow
def test_rebalance_resumes_after_a_crash(ray, tmp_path):
    """A rebalance crashed after its first move, resumed on reopen: every record keeps its id, its
    whole version history (texts, ops, vectors, timestamps), created_at / updated_at, event time,
    status and reason, and its topic <-> turn links; ids route to their new shards, and ids written
    after the move never collide with moved ones."""
    from memkern.distributed import ShardedStore
    from memkern.distributed.sharded import shard_of

    names = [f"t{i}" for i in range(10)]
    sh = ShardedStore(tmp_path, dim=D, metric="cos", shards=2)
    ids = _fill(sh, names, per=6)
    gone = ids["t3"][0]
    sh.invalidate(ids["t1"][2], "old")
    sh.delete(gone)
    for j, ns in enumerate(names):  # a history, an event time and turn records on every namespace
        sh.update(ids[ns][1], summary=f"{ns} memory 1 v2", embedding=_vecs(1, 100 + j)[0], meta={"v": 2})
        sh.add(ns, f"{ns} with turns", _vecs(1, 200 + j)[0], [{"role": "user", "content": "a"},
                                                              {"role": "assistant", "content": "b"}],
               turn_embeddings=_vecs(2, 300 + j), event_time=1_700_000_000.5 + j)
    q = _vecs(3, 7)
    before = {ns: [[r.summary for r in sh.get_batch(row[row >= 0])] for row in sh.search(ns, q, k=5)[0]]
              for ns in names}
    state = _state(sh, names)
    assert any(r.turn_ids for r, _, _ in state.values()) and any(len(h) == 2 for _, h, _ in state.values())
    moving = [ns for ns in names if shard_of(ns, 2) != shard_of(ns, 3)]
    assert len(moving) >= 2
    sh._crash_after_moves = 1  # test hook: raise after the first namespace is copied and deleted
    with pytest.raises(RuntimeError, match="simulated crash"):
        sh.rebalance(3)
    journal = json.loads((tmp_path / "rebalance.json").read_text())
    assert [m["state"] for m in journal["moves"]].count("done") == 1
    sh.close()
    sh = ShardedStore(tmp_path)  # reopening resumes the journal
    try:
        assert sh.shards == 3 and not (tmp_path / "rebalance.json").exists()
        # every namespace on exactly one shard: its routed one (no copy left on its old shard)
        assert sum(s["namespaces"] for s in sh.shard_stats()) == len(names)
        for ns in names:
            assert sh.count(ns) == (6 if ns == "t3" else 7 if ns != "t1" else 6)
            assert sh.count(ns, include_invalidated=True) == (6 if ns == "t3" else 7)
            after = [[r.summary for r in sh.get_batch(row[row >= 0])] for row in sh.search(ns, q, k=5)[0]]
            assert after == before[ns]
        # ids, histories, timestamps, event times, status, links: all as they were
        assert _state(sh, names) == state
        assert gone not in sh
        moved_ids = [i for ns in moving for i in sh.ids(ns, include_invalidated=True)]
        assert all(int(sh._route(np.array([i]))[0]) == shard_of(sh.get(int(i)).namespace, 3) for i in moved_ids)
        assert any(int(i) >> 48 != shard_of(ns, 3) for ns in moving for i in sh.ids(ns))  # off their home shard
        # new records of a moved namespace get ids of its new shard's own range: no collision
        ns = moving[0]
        new = sh.add(ns, "after the move", _vecs(1, 999)[0])
        assert new >> 48 == shard_of(ns, 3) and new not in state
        assert sh.get(new).summary == "after the move" and sh.count(ns) == 8 - (ns in ("t1", "t3"))
    finally:
        sh.close()
    with ShardedStore(tmp_path) as sh:  # the routing table is durable
        st = _state(sh, names)
        assert {i: st[i] for i in state} == state and new in st


@pytest.mark.slow
def test_rebalance_back_and_forth_keeps_ids(ray, tmp_path):
    """2 -> 3 -> 2 shards: namespaces that move back onto a shard they left (its deleted ids not
    compacted away yet) land with their ids again; the routing table drops records back home."""
    from memkern.distributed import ShardedStore

    names = [f"b{i}" for i in range(8)]
    with ShardedStore(tmp_path, dim=D, shards=2) as sh:
        _fill(sh, names, per=3)
        state = _state(sh, names)
        assert sh.rebalance(3)["namespaces"] >= 1
        assert _state(sh, names) == state
        out = sh.rebalance(2)
        assert out["namespaces"] >= 1
        assert _state(sh, names) == state
        assert sh._moved_ids.size == 0  # every record is back on its home shard


def test_import_records_refuses_colliding_ids(tmp_path):
    """The id-preserving import is refused (nothing written) for an id the store holds, one it
    deleted and has not compacted, and one in its own unused range; a valid one is durable."""
    from memkern.store.transfer import export_records, import_records

    with MemoryStore(tmp_path / "a", dim=D, metric="cos") as a:
        ids = a.add_batch("u", ["x", "y"], _vecs(2, 1))
        a.update(int(ids[0]), summary="x2", embedding=_vecs(1, 2)[0])
        recs = export_records(a, [int(i) for i in ids])
    far = [dict(r, id=r["id"] + (5 << 48)) for r in recs]
    with MemoryStore(tmp_path / "b", dim=D, metric="cos", id_range=(1 << 48, 2 << 48)) as b:
        own = int(b.add("v", "own", _vecs(1, 3)[0]))
        assert own == 1 << 48
        with pytest.raises(MemkernKeyError, match="already in store"):
            import_records(b, "u", [dict(recs[0], id=own)])
        with pytest.raises(MemkernValueError, match="own unused id range"):
            import_records(b, "u", [dict(recs[0], id=own + 1)])
        assert import_records(b, "u", recs) == 2  # ids 0 and 1: another shard's range
        b.delete(int(recs[1]["id"]))
        with pytest.raises(MemkernKeyError, match="compact"):
            import_records(b, "u", [recs[1]])
        with pytest.raises(MemkernValueError, match="versions"):
            import_records(b, "u", far[:1] + [dict(far[1], versions=[])])  # a bad record: nothing written
        with pytest.raises(MemkernKeyError, match="already in store"):
            import_records(b, "u", far[:1] + recs[:1])  # refused by the store: nothing written either
        assert b.count("u", include_invalidated=True) == 1 and int(far[0]["id"]) not in b
        hi = dict(recs[0], id=(3 << 48) + 5)  # another shard's range above this one: allowed, next id stays
        assert import_records(b, "u", [hi]) == 1 and b.get((3 << 48) + 5).summary == "x2"
    with MemoryStore(tmp_path / "b", id_range=(1 << 48, 2 << 48)) as b:  # replayed from the log
        r = b.get(0)
        assert (r.summary, r.version, [h.summary for h in b.history(0)]) == ("x2", 2, ["x", "x2"])
        assert export_records(b, [0])[0] == recs[0]
        assert int(b.add("v", "next", _vecs(1, 4)[0])) == own + 1
    with MemoryStore(tmp_path / "b", id_range=(1 << 48, 2 << 48)) as b:  # from a snapshot too
        b.snapshot()
    with MemoryStore(tmp_path / "b", id_range=(1 << 48, 2 << 48)) as b:
        assert export_records(b, [0])[0] == recs[0]


@pytest.mark.slow
def test_readme_ray_example_runs(ray, capsys):
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "scale-out.md").read_text(encoding="utf-8")
    section = text[text.index("# Scale-out on Ray"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert "ShardedStore(" in code and "rebalance(3)" in code
    exec(compile(code, "docs/scale-out.md", "exec"), {"__name__": "readme_ray_example"})
    out = capsys.readouterr().out
    assert "alice likes tea" in out and "shard 0 holds" in out


@pytest.mark.slow
def test_rebalance_crash_between_copy_and_journal(ray, tmp_path):
    """A crash after the destination holds the copy but before the journal says so: the resumed
    move replaces that copy (nothing twice) and the source keeps its records until then."""
    from memkern.distributed import ShardedStore
    from memkern.distributed.sharded import shard_of

    names = [f"n{i}" for i in range(8)]
    sh = ShardedStore(tmp_path, dim=D, shards=1)
    _fill(sh, names, per=3)
    sh._crash_after_copy = True
    with pytest.raises(RuntimeError, match="after a copy"):
        sh.rebalance(2)
    sh.close()
    moving = [ns for ns in names if shard_of(ns, 2) == 1]
    assert moving
    with MemoryStore(tmp_path / "shard-001") as dst:   # the copy landed; the journal still says pending
        assert len(dst.namespaces()) == 1
    with ShardedStore(tmp_path) as sh:
        assert sh.shards == 2
        assert all(sh.count(ns) == 3 for ns in names)
        assert sum(s["namespaces"] for s in sh.shard_stats()) == len(names)


def test_filtered_search_over_shard_ranges_and_imported_ids(tmp_path):
    """A filter matching most records (the bitmap path of a filtered graph search: ef=10 keeps the
    exact-scan path out) on a store whose ids start at 2**48, then also holding imported ids from
    far away (a span too sparse for a bitmap): every answer matches, recall is high, and no
    allocation proportional to the id values happens."""
    from memkern.store.transfer import export_records, import_records

    n, far = 1800, 700
    with MemoryStore(tmp_path / "src", dim=D, metric="ip", id_range=(5 << 48, 6 << 48)) as src:
        src.add_batch("u", [f"far {i}" for i in range(far)], _vecs(far, 2), metas=[{"g": 1}] * far)
        moved = export_records(src, [int(i) for i in src.ids("u")])
    with MemoryStore(tmp_path / "b", dim=D, metric="ip", id_range=(1 << 48, 2 << 48)) as b:
        b.add_batch("u", [f"own {i}" for i in range(n)], _vecs(n, 1), metas=[{"g": int(i % 10 != 0)} for i in range(n)])
        q = _vecs(4, 3)

        def check():
            ids, _ = b.search("u", q, k=10, ef=10, filter={"g": 1})
            ok = np.array([int(i) for i in b.ids("u") if b.get(int(i)).meta["g"] == 1])
            exact = ok[np.argsort(-(b.embeddings(ok) @ q.T), axis=0)[:10].T]
            assert all(b.get(int(i)).meta["g"] == 1 for i in ids.ravel())
            assert np.mean([len(set(a.tolist()) & set(e.tolist())) / 10 for a, e in zip(ids, exact)]) >= 0.7
            return ids

        assert (check() >= 1 << 48).all()
        import_records(b, "u", moved)  # ids 5 << 48 + i beside 1 << 48 + j: the hash-set path
        assert (check() >= 5 << 48).any()
