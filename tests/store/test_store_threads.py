"""Many reader threads with one writer: no crash, isolation, consistent counts."""
from __future__ import annotations

import threading

import numpy as np

from memkern.store import MemoryStore

D = 32


def test_readers_and_writer(tmp_path):
    rng = np.random.default_rng(0)
    base = rng.standard_normal((200, D)).astype(np.float32)
    s = MemoryStore(tmp_path / "t", dim=D, fsync="never", snapshot_every=400)
    other = set(s.add_batch("other", ["o"] * 200, base).tolist())
    started = [0]  # records whose add began
    acked = [0]  # records whose add returned
    mine: set[int] = set()
    errors: list[BaseException] = []
    stop = threading.Event()

    def writer():
        try:
            w = np.random.default_rng(1)
            for step in range(120):
                n = int(w.integers(1, 12))
                started[0] += n
                ids = s.add_batch("u", [f"s{step}"] * n, w.standard_normal((n, D)).astype(np.float32))
                mine.update(ids.tolist())
                acked[0] += n
                if step % 10 == 5:
                    s.invalidate(int(ids[0]), "r")
                if step % 15 == 7:
                    s.merge(int(ids[-1]), "m", w.standard_normal(D).astype(np.float32), [])
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)
        finally:
            stop.set()

    def reader(seed):
        try:
            r = np.random.default_rng(seed)
            last = 0
            while not stop.is_set():
                lo = acked[0]
                c = s.count("u", include_invalidated=True)
                hi = started[0]
                assert lo <= c <= hi, (lo, c, hi)
                assert c >= last  # the writer only adds
                last = c
                ids, sc = s.search("u", r.standard_normal((4, D)).astype(np.float32), k=15, include_invalidated=True)
                got = ids[ids >= 0]
                assert not (set(got.tolist()) & other)  # isolation holds while writing
                assert np.isfinite(sc).all()
                for i in got[:3]:
                    rec = s.get(int(i))
                    assert rec.namespace == "u"
                e = s.embeddings(got[:5])
                assert e.shape == (min(5, len(got)), D)
                io, _ = s.search("other", base[:2], k=1)
                assert io[:, 0].tolist() == [0, 1]
        except BaseException as e:
            errors.append(e)
            stop.set()

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(4)] + [threading.Thread(target=writer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors[0]
    assert s.count("u", include_invalidated=True) == acked[0] == len(mine)
    assert s.count("u") == acked[0] - 12
    s.close()
    with MemoryStore(tmp_path / "t") as s2:
        assert s2.count("u", include_invalidated=True) == acked[0] and s2.count("other") == 200


def test_search_releases_gil(tmp_path):
    """Two threads searching overlap: each holds the GIL only briefly."""
    import time

    rng = np.random.default_rng(2)
    x = rng.standard_normal((3000, 64)).astype(np.float32)
    with MemoryStore(tmp_path / "g", dim=64, fsync="never") as s:
        s.add_batch("u", [""] * 3000, x)
        q = rng.standard_normal((1200, 64)).astype(np.float32)  # ~0.15 s: long enough to count the ticks
        ticks = [0]
        done = threading.Event()

        def ticker():  # pure-Python thread: only runs while the search does not hold the GIL
            while not done.is_set():
                ticks[0] += 1
                time.sleep(0.0005)

        t = threading.Thread(target=ticker)
        t.start()
        t0 = time.perf_counter()
        s.search("u", q, k=10, ef=400)
        elapsed = time.perf_counter() - t0
        done.set()
        t.join()
    assert elapsed > 0.05
    assert ticks[0] >= 0.2 * elapsed / 0.0005 * 0.5, (ticks[0], elapsed)


def test_small_reads_keep_the_gil_unless_a_writer_holds_the_store(tmp_path):
    """A single get / one-query search runs with the GIL held (no GIL hand-off per call); only when
    a writer holds the store does it release the GIL to wait, and then it still returns the right
    record."""
    from memkern import _store

    rng = np.random.default_rng(3)
    s = MemoryStore(tmp_path / "g", dim=D, fsync="always")
    vecs = rng.standard_normal((50, D)).astype(np.float32)
    ids = s.add_batch("u", [f"t{i}" for i in range(50)], vecs).tolist()
    w0 = _store._test_gil_waits()
    for i in ids:
        assert s.get(i).summary == f"t{ids.index(i)}"
        assert int(s.search("u", vecs[ids.index(i)], k=1)[0][0][0]) == i
    assert _store._test_gil_waits() == w0  # quiet store: nothing released, nothing waited

    stop = threading.Event()

    def writer():
        w = np.random.default_rng(4)
        while not stop.is_set():
            s.add("v", "w", w.standard_normal(D).astype(np.float32))  # durable: holds the store over its sync

    t = threading.Thread(target=writer)
    t.start()
    try:
        for _ in range(3000):
            j = int(rng.integers(0, 50))
            assert s.get(ids[j]).summary == f"t{j}"
            assert int(s.search("u", vecs[j], k=1)[0][0][0]) == ids[j]
            if _store._test_gil_waits() > w0 + 5:
                break
    finally:
        stop.set()
        t.join()
    assert _store._test_gil_waits() > w0  # some reads met the writer and waited with the GIL released
    s.close()
