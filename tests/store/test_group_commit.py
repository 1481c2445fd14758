"""Group commit under ``fsync="always"``: concurrent writers share one fdatasync, none returns
before the sync covering its entry, and a failed shared sync acknowledges none of its group.

The long version (rates at 1-16 writers, crash trials with several writers) is
``bench/bench_group_commit.py`` and ``bench/bench_crash.py --writers``.
"""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from memkern import MemkernError, MemoryStore
from memkern.store.prepare import prepare_add_batch
from store_faults_common import _no_fault, bench_crash, native  # noqa: F401  (_no_fault: autouse)

D = 16


def emb(i: int) -> np.ndarray:
    return np.random.default_rng(i).standard_normal(D).astype(np.float32)


def big_batch(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, D)).astype(np.float32)


def run_threads(fns) -> list:
    """Runs each callable in its own thread; returns each one's result or exception."""
    out: list = [None] * len(fns)

    def go(i):
        try:
            out[i] = fns[i]()
        except BaseException as e:  # noqa: BLE001 - reported to the test
            out[i] = e

    ts = [threading.Thread(target=go, args=(i,)) for i in range(len(fns))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return out


def leader_and_queue(s: MemoryStore, n_small: int):
    """A slow first write (a large add_batch) and ``n_small`` one-record adds that queue behind it."""
    started = threading.Event()
    call = prepare_add_batch(D, "big", [f"b{j}" for j in range(3000)], big_batch(3000, 1))

    def slow():
        started.set()
        return call.run(s)  # straight into the native store (the GIL released)

    def small(i):
        def f():
            started.wait()
            time.sleep(0.02)  # the slow write is inside the store by now
            return s.add("small", f"s{i}", emb(i))
        return f

    return [slow] + [small(i) for i in range(n_small)]


def test_concurrent_writers_share_fsyncs_and_all_land(tmp_path):
    """16 threads adding under fsync="always": every record is there after a reopen, and fewer
    fdatasyncs ran than writes (commit_groups counts them; the io counter agrees)."""
    p = tmp_path / "s"
    s = MemoryStore(p, dim=D, fsync="always", snapshot_every=0)
    c0 = native()._test_io_counters()
    syncs0 = c0["syncs"]
    per = 25

    def writer(w):
        def f():
            return [s.add(f"w{w}", f"w{w}-{j}", emb(1000 * w + j)) for j in range(per)]
        return f

    out = run_threads([writer(w) for w in range(16)])
    assert all(isinstance(o, list) for o in out), out
    c1 = native()._test_io_counters()
    syncs = c1["syncs"] - syncs0
    groups, writes = s._native.commit_groups, s._native.grouped_writes
    assert writes == 16 * per
    assert 0 < c1["sync_ns"] - c0["sync_ns"], c1  # the time inside the syncs is counted
    assert syncs == groups, (syncs, groups)  # one fdatasync per group, none per write
    s.close()
    with MemoryStore(p) as s2:
        for w in range(16):
            got = s2.get_batch(out[w])
            assert [r.summary for r in got] == [f"w{w}-{j}" for j in range(per)]
            np.testing.assert_array_equal(s2.embeddings(out[w]), np.stack([emb(1000 * w + j) for j in range(per)]))


def test_writers_queued_behind_a_slow_write_share_one_fsync(tmp_path):
    """While one long write holds the writer lock, the writers that arrive queue and then go in one
    group: one fdatasync for all of them."""
    s = MemoryStore(tmp_path / "s", dim=D, fsync="always", snapshot_every=0)
    out = run_threads(leader_and_queue(s, 8))
    assert not [o for o in out if isinstance(o, BaseException)], out
    assert s._native.grouped_writes == 9
    assert s._native.commit_groups < 9  # at least two small writes shared a sync
    assert s.count("small") == 8 and s.count("big") == 3000
    s.close()


def test_a_failed_group_fsync_acknowledges_none_of_the_group(tmp_path):
    """The second fdatasync (the queued writers' group) fails: each of those writes raises, the live
    store refuses reads and writes until reopened (it holds them in memory), and the reopened store
    holds the first write only."""
    p = tmp_path / "s"
    s = MemoryStore(p, dim=D, fsync="always", snapshot_every=0)
    native()._test_set_fault("fsync:2")
    try:
        out = run_threads(leader_and_queue(s, 8))
    finally:
        native()._test_set_fault("")
    first, rest = out[0], out[1:]
    assert not isinstance(first, BaseException), first
    assert rest and all(isinstance(o, MemkernError) for o in rest), rest
    assert s._native.commit_groups < 9  # a group of several writes failed: they were in memory
    with pytest.raises(MemkernError, match="reopened"):
        s.count("small")
    with pytest.raises(MemkernError, match="reopened"):
        s.add("small", "refused", emb(99))
    s.close()
    with MemoryStore(p) as s2:
        assert s2.count("big") == 3000
        assert s2.count("small") == 0
        i = s2.add("small", "after", emb(98))  # the log takes appends at a clean boundary
    with MemoryStore(p) as s3:
        assert s3.get(i).summary == "after" and s3.count("small") == 1


def test_a_raising_write_in_a_group_leaves_the_others(tmp_path):
    """A write that fails its checks inside a group raises alone; the group's other writes land
    (and are synced although the group's last write raised before logging)."""
    p = tmp_path / "s"
    s = MemoryStore(p, dim=D, fsync="always", snapshot_every=0)
    fns = leader_and_queue(s, 6)

    def bad():
        time.sleep(0.06)  # queued after the small writes: the last of their group
        return s.delete(10 ** 12)  # unknown id: a KeyError, nothing logged

    fns.append(bad)
    syncs0 = native()._test_io_counters()["syncs"]
    out = run_threads(fns)
    syncs = native()._test_io_counters()["syncs"] - syncs0
    assert isinstance(out[-1], MemkernError), out[-1]
    assert not [o for o in out[:-1] if isinstance(o, BaseException)], out
    assert syncs == s._native.commit_groups  # the group whose last write raised was synced too
    s.close()
    with MemoryStore(p) as s2:
        assert s2.count("small") == 6


@pytest.mark.slow
def test_sigkill_campaign_with_several_writers(tmp_path):
    """30 trials of ``bench/bench_crash.py --writers 4``: four threads writing at once (grouped
    commits), faults injected, SIGKILLed at a random moment; every acknowledged write is there
    exactly, every raised one left nothing, and the store always opens."""
    st = bench_crash().run_writers_campaign(30, tmp_path, 4, seed=5, log=None)
    assert st.problems == []
    assert st.trials == 30 and st.acked > 200 and st.killed_in_flight > 0
    assert st.failed > 0  # injected faults did make grouped writes raise
