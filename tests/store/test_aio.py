"""AsyncMemoryStore (issue 14 item 5): under asyncio.gather load, results equal the sync store's,
nothing is lost, bad input raises before anything is scheduled, close while busy is clean."""
from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

import memkern
from memkern import MemkernKeyError, MemkernTypeError, MemkernValueError
from memkern.store.aio import AsyncMemoryStore
from memkern.store.memory import InMemoryStore
from memkern.store import MemoryStore

D = 16


def vecs(n, seed):
    return np.random.default_rng(seed).standard_normal((n, D)).astype(np.float32)


def run(coro):
    return asyncio.run(coro)


def test_exported():
    assert memkern.AsyncMemoryStore is AsyncMemoryStore and "AsyncMemoryStore" in memkern.__all__


@pytest.mark.parametrize("kind", ["native", "inmemory"])
def test_gather_load_equals_sync(tmp_path, kind):
    """200 concurrent adds (single and batch, with turns) then 120 concurrent searches at every
    level: every write landed once, and every search equals the same search made synchronously."""
    x = vecs(400, 1)
    sync = MemoryStore(tmp_path / "s", dim=D, fsync="never") if kind == "native" else InMemoryStore(D)

    async def main():
        async with AsyncMemoryStore(sync, max_workers=4) as s:
            singles = [s.add("u", f"one {i}", x[i], [{"role": "user", "content": f"t{i}"}],
                             {"i": i}, turn_embeddings=x[i:i + 1]) for i in range(150)]
            batches = [s.add_batch("v" if j % 2 else "u", [f"b{j}-{r}" for r in range(5)], x[150 + 5 * j:155 + 5 * j])
                       for j in range(50)]
            ids = await asyncio.gather(*singles, *batches)
            q = vecs(30, 2)
            searches = [s.search(ns, q[i:i + 3], k=7, level=level)
                        for i in range(0, 30, 3) for ns in ("u", "v") for level in ("topic", "turn", "turn+topic")]
            searches += [s.get(int(ids[i])) for i in range(0, 150, 5)] + [s.count("u"), s.count("v")]
            searches += [s.search("u", q[:3], k=7, mode="hybrid", texts=["one 1", "b3-2 one", "t7"],
                                  filter={"i": {"$in": list(range(0, 150, 2))}}),
                         s.search("u", None, k=7, mode="lexical", texts=["one 12", "b4"])]
            got = await asyncio.gather(*searches)
            return ids, got, q

    ids, got, q = run(main())
    singles, batches = ids[:150], [b.tolist() for b in ids[150:]]
    flat = singles + [i for b in batches for i in b]
    assert len(set(flat)) == 400  # nothing lost, nothing doubled
    assert all(sync.get(i).summary == f"one {n}" and sync.get(i).meta == {"i": n} for n, i in enumerate(singles))
    assert sync.count("u") == 150 + 125 and sync.count("v") == 125 and sync.count("u", level="turn") == 150
    k = 0
    for i in range(0, 30, 3):
        for ns in ("u", "v"):
            for level in ("topic", "turn", "turn+topic"):
                want = sync.search(ns, q[i:i + 3], k=7, level=level)
                np.testing.assert_array_equal(got[k][0], want[0])
                np.testing.assert_array_equal(got[k][1], want[1])
                k += 1
    assert [r.id for r in got[k:k + 30]] == [int(singles[i]) for i in range(0, 150, 5)]
    assert got[k + 30:k + 32] == [275, 125]
    for g, want in zip(got[k + 32:], (sync.search("u", q[:3], k=7, mode="hybrid", texts=["one 1", "b3-2 one", "t7"],
                                                  filter={"i": {"$in": list(range(0, 150, 2))}}),
                                      sync.search("u", None, k=7, mode="lexical", texts=["one 12", "b4"]))):
        np.testing.assert_array_equal(g[0], want[0])
        assert (g[0] >= 0).sum() > 0
    sync.close()


def test_bad_input_raises_before_scheduling(tmp_path):
    calls = []

    class Spy(InMemoryStore):
        def add(self, *a, **kw):
            calls.append("add")
            return super().add(*a, **kw)

        def search(self, *a, **kw):
            calls.append("search")
            return super().search(*a, **kw)

        def run(self, call):
            calls.append(type(call).__name__)
            return super().run(call)

    inner = Spy(D)

    async def main():
        async with AsyncMemoryStore(inner, max_workers=2) as s:
            cases = [
                (s.add("", "x", vecs(1, 0)[0]), MemkernValueError, "namespace"),
                (s.add("u", 5, vecs(1, 0)[0]), MemkernTypeError, "summary"),
                (s.add("u", "x", vecs(1, 0)[0][:3]), MemkernValueError, r"embedding: expected shape \[16\]"),
                (s.add("u", "x", np.full(D, np.nan, np.float32)), MemkernValueError, "NaN"),
                (s.add("u", "x", vecs(1, 0)[0], [{"role": "user"}]), MemkernValueError, "content"),
                (s.add("u", "x", vecs(1, 0)[0], [{"role": "u", "content": "c"}], turn_embeddings=vecs(2, 0)),
                 MemkernValueError, "turn_embeddings"),
                (s.add_batch("u", ["a"], vecs(2, 0)), MemkernValueError, "embeddings"),
                (s.search("u", vecs(1, 0), k=0), MemkernValueError, "k: expected"),
                (s.search("u", vecs(1, 0)[:, :4]), MemkernValueError, "queries"),
                (s.search("u", vecs(1, 0), level="chunk"), MemkernValueError, "level"),
                (s.get("3"), MemkernTypeError, "id"),
                (s.get(-1), MemkernKeyError, "unknown id"),
                (s.embeddings([0.5]), MemkernTypeError, "ids"),
                (s.add("u", "x", vecs(1, 0)[0], event_time=float("nan")), MemkernValueError, "event_time"),
                (s.search("u", vecs(2, 0), mode="lexical", texts=["one"]), MemkernValueError, "texts"),
                (s.search("u", vecs(1, 0), mode="fuzzy"), MemkernValueError, "mode"),
                (s.search("u", vecs(1, 0), filter={"a": {"$gt": 1}}), MemkernValueError, "filter"),
                (s.search("u", vecs(1, 0), time_range=(5, 1)), MemkernValueError, "time_range"),
            ]
            for coro, err, match in cases:
                with pytest.raises(err, match=match):
                    await coro
            assert calls == []  # nothing reached the store
            with pytest.raises(MemkernKeyError, match="unknown id 7"):
                await s.get(7)  # a valid call fails in the store with the store's error
            rid = await s.add("u", "ok", vecs(1, 0)[0])
            assert calls == ["AddCall"] and inner.get(rid).summary == "ok"  # prepared here, run there

    run(main())


def test_close_while_busy(tmp_path):
    """aclose() while 60 calls are in flight: the calls that started complete (their writes are
    in the store after reopening), calls made after the close began are refused cleanly, the
    store and the pool are closed, and a second close is a no-op."""
    path = tmp_path / "c"
    x = vecs(60, 3)

    async def main():
        s = AsyncMemoryStore(path, dim=D, max_workers=3, fsync="always")
        started = [asyncio.ensure_future(s.add_batch("u", [f"m{i}-{j}" for j in range(4)], np.repeat(x[i:i + 1], 4, 0)))
                   for i in range(40)]
        started += [asyncio.ensure_future(s.search("u", x[i], k=3)) for i in range(20)]
        await asyncio.sleep(0)  # let them reach the pool
        closing = asyncio.ensure_future(s.aclose())
        await asyncio.sleep(0)
        with pytest.raises(MemkernValueError, match="closed"):
            await s.add("u", "late", x[0])
        results = await asyncio.gather(*started, return_exceptions=True)
        await closing
        await s.aclose()
        assert s.closed and s.store.closed
        return results

    results = run(main())
    assert not any(isinstance(r, BaseException) for r in results), [r for r in results if isinstance(r, BaseException)]
    acked = [int(i) for r in results[:40] for i in r]
    with MemoryStore(path) as st:
        assert st.count("u") == 160 and sorted(st.ids("u").tolist()) == sorted(acked)
        assert "late" not in {st.get(i).summary for i in acked}


def test_event_loop_is_not_blocked(tmp_path):
    """A slow store call runs in the pool: the loop keeps ticking meanwhile."""
    inner = InMemoryStore(D)
    gate = threading.Event()

    real_run = inner.run

    def slow_run(call):
        gate.wait(5)
        return real_run(call)

    inner.run = slow_run  # every prepared call runs through it
    inner.add("u", "x", vecs(1, 0)[0])

    async def main():
        async with AsyncMemoryStore(inner, max_workers=2) as s:
            task = asyncio.ensure_future(s.search("u", vecs(1, 0), k=1))
            ticks = 0
            t0 = time.monotonic()
            while time.monotonic() - t0 < 0.2:
                await asyncio.sleep(0.01)
                ticks += 1
            assert not task.done() and ticks >= 5
            gate.set()
            ids, _ = await task
            assert ids[0, 0] == 0

    run(main())


def test_wrapping_rules(tmp_path):
    inner = InMemoryStore(D)
    with pytest.raises(MemkernValueError, match="dim/metric"):
        AsyncMemoryStore(inner, dim=D)
    inner.close()
    with pytest.raises(MemkernValueError, match="open store"):
        AsyncMemoryStore(inner)

    async def main():
        async with AsyncMemoryStore(tmp_path / "w", dim=D, max_workers=1) as s:
            assert s.dim == D and s.path == tmp_path / "w"
            await s.add("u", "x", vecs(1, 0)[0])
        wrapped = InMemoryStore(D)
        async with AsyncMemoryStore(wrapped) as s:
            await s.add("u", "x", vecs(1, 0)[0])
        assert not wrapped.closed and wrapped.count("u") == 1  # the caller's store stays open

    run(main())
    with MemoryStore(tmp_path / "w") as st:
        assert st.count("u") == 1


def test_close_waits_for_running_calls(tmp_path):
    """Calls already running in the pool finish on an open store: the store is closed only after
    them, even when the pool has a free thread for the close (here: 3 calls held at a gate)."""
    gate = threading.Event()

    async def main():
        s = AsyncMemoryStore(tmp_path / "g", dim=D, max_workers=4)
        real = s.store.run

        def gated(call):
            gate.wait(5)
            return real(call)

        s.store.run = gated
        calls = [asyncio.ensure_future(s.add("u", f"m{i}", vecs(1, i)[0])) for i in range(3)]
        await asyncio.sleep(0.05)  # all three are running (blocked at the gate)
        closing = asyncio.ensure_future(s.aclose())
        await asyncio.sleep(0.05)
        assert not closing.done() and not s.store.closed  # waiting for the running calls
        gate.set()
        ids = await asyncio.gather(*calls)
        await closing
        assert s.store.closed
        return ids

    ids = run(main())
    with MemoryStore(tmp_path / "g") as st:
        assert sorted(st.ids("u").tolist()) == sorted(ids)
