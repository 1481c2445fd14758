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


def test_rebalance_resumes_after_a_crash(ray, tmp_path):
    from memkern.distributed import ShardedStore
    from memkern.distributed.sharded import shard_of

    names = [f"t{i}" for i in range(10)]
    sh = ShardedStore(tmp_path, dim=D, metric="cos", shards=2)
    ids = _fill(sh, names, per=6)
    gone = ids["t3"][0]
    sh.invalidate(ids["t1"][2], "old")
    sh.delete(gone)
    q = _vecs(3, 7)
    before = {ns: [[r.summary for r in sh.get_batch(row[row >= 0])] for row in sh.search(ns, q, k=5)[0]]
              for ns in names}
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
            assert sh.count(ns) == (5 if ns == "t3" else 6 if ns != "t1" else 5)
            assert sh.count(ns, include_invalidated=True) == (5 if ns == "t3" else 6)
            assert {int(i) >> 48 for i in sh.ids(ns, include_invalidated=True)} == {shard_of(ns, 3)}
            after = [[r.summary for r in sh.get_batch(row[row >= 0])] for row in sh.search(ns, q, k=5)[0]]
            assert after == before[ns]
        moved = dict(zip(*np.load(tmp_path / "moved-ids-0.npz").values()))
        assert moved and all(int(o) >> 48 != int(n) >> 48 for o, n in moved.items())
        for ns in moving:
            new = moved[ids[ns][1]]
            assert sh.get(int(new)).summary == f"{ns} memory 1"
            assert sh.get(int(new)).turns == [{"role": "user", "content": f"{ns} turn 1"}]
    finally:
        sh.close()


def test_readme_ray_example_runs(ray, capsys):
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Scale-out on Ray"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert "ShardedStore(" in code and "rebalance(3)" in code
    exec(compile(code, "README.md#scale-out-on-ray", "exec"), {"__name__": "readme_ray_example"})
    out = capsys.readouterr().out
    assert "alice likes tea" in out and "shard 0 holds" in out


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
