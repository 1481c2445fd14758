"""MemkernStore's TTL as LangGraph's BaseStore defines it: ``put(..., ttl=minutes)``, the ``ttl=``
TTLConfig (``default_ttl``, ``refresh_on_read``, ``sweep_interval_minutes``), ``refresh_ttl`` on
get / search, expired items never returned, ``sweep_ttl`` / ``start_ttl_sweeper`` /
``stop_ttl_sweeper``, and expiries that survive a reopen. Time is an injected clock."""
from __future__ import annotations

import asyncio
import time

import pytest

pytest.importorskip("langgraph")

from langgraph.store.base import GetOp, PutOp, SearchOp  # noqa: E402

from fakes_embed import HashEmbedder  # noqa: E402
from memkern import MemkernTypeError, MemkernValueError  # noqa: E402
from memkern.integrations.langgraph import MemkernStore, REFRESH_SLACK  # noqa: E402
from memkern.integrations.langgraph.namespaces import EXPIRES  # noqa: E402


class Clock:
    def __init__(self, t: float = 1_800_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, minutes: float) -> None:
        self.t += minutes * 60.0


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def lg(tmp_path, clock):
    s = MemkernStore(tmp_path / "store", embedder=HashEmbedder(), clock=clock)
    yield s
    s.close()


def _keys(items):
    return [i.key for i in items]


def test_expired_items_are_never_returned_until_swept(lg, clock):
    assert lg.supports_ttl
    lg.put(("a",), "short", {"text": "green tea"}, ttl=1)
    lg.put(("a",), "forever", {"text": "black tea"})
    lg.put(("b",), "only", {"text": "green tea"}, ttl=1)
    clock.advance(0.9)
    assert lg.get(("a",), "short", refresh_ttl=False).value == {"text": "green tea"}
    assert sorted(lg.list_namespaces()) == [("a",), ("b",)]
    clock.advance(0.2)                                           # 1.1 min: both TTL items expired
    assert lg.get(("a",), "short") is None and lg.get(("b",), "only") is None
    assert _keys(lg.search(("a",))) == ["forever"]
    assert _keys(lg.search((), query="green tea")) == ["forever"]
    assert lg.list_namespaces() == [("a",)]
    assert lg.store.count("lg.a") == 2                           # still stored: not yet swept
    assert lg.sweep_ttl() == 2
    assert lg.store.count("lg.a") == 1 and lg.store.count("lg.b") == 0
    assert lg.sweep_ttl() == 0
    lg.put(("a",), "short", {"text": "new"}, ttl=1)             # an expired key can be written again
    assert lg.get(("a",), "short").value == {"text": "new"}


def test_query_search_fills_the_page_past_expired_best_matches(lg, clock):
    lg.put(("d",), "best", {"text": "apple apple pie"}, ttl=1)
    lg.put(("d",), "next", {"text": "apple tart"})
    lg.put(("d",), "other", {"text": "car"})
    clock.advance(2)
    assert _keys(lg.search(("d",), query="apple pie", limit=1)) == ["next"]
    assert _keys(lg.search(("d",), query="apple pie", limit=1, offset=1)) == ["other"]


def test_reads_refresh_unless_told_not_to(lg, clock):
    ns = ("r",)
    for k in ("g", "s", "q", "n"):
        lg.put(ns, k, {"text": f"tea {k}"}, ttl=1)
    clock.advance(0.8)
    lg.get(ns, "g")                                              # refresh_ttl defaults to True
    lg.search(ns, filter={"text": "tea s"})
    lg.search(ns, query="tea q", filter={"text": "tea q"})
    lg.get(ns, "n", refresh_ttl=False)
    lg.search(ns, filter={"text": "tea n"}, refresh_ttl=False)
    clock.advance(0.5)                                           # 1.3 min since the puts, 0.5 since the reads
    assert lg.get(ns, "n", refresh_ttl=False) is None
    assert sorted(_keys(lg.search(ns, refresh_ttl=False))) == ["g", "q", "s"]
    clock.advance(0.6)                                           # 1.1 min since the reads
    assert lg.search(ns) == []


def test_ttl_config_default_and_refresh_on_read(tmp_path, clock):
    cfg = {"default_ttl": 2, "refresh_on_read": False}
    with MemkernStore(tmp_path / "s", embedder=HashEmbedder(), ttl=cfg, clock=clock) as lg:
        assert lg.ttl_config == cfg
        lg.put(("c",), "dflt", {"v": 1})                         # default_ttl: 2 minutes
        lg.put(("c",), "never", {"v": 2}, ttl=None)              # explicit None: no expiry
        lg.put(("c",), "pinned", {"v": 3})
        clock.advance(1.5)
        lg.get(("c",), "dflt")                                   # refresh_on_read=False: no refresh
        lg.get(("c",), "pinned", refresh_ttl=True)               # but asked for
        clock.advance(1)
        assert lg.get(("c",), "dflt") is None
        assert lg.get(("c",), "pinned").value == {"v": 3}
        clock.advance(10_000)
        assert _keys(lg.search(("c",))) == ["never"]
        # BaseStore's batch takes PutOp.ttl as given: None there means no expiry
        lg.batch([PutOp(("c",), "raw", {"v": 4})])
        clock.advance(10)
        assert lg.get(("c",), "raw").value == {"v": 4}


def test_a_put_replaces_the_ttl(lg, clock):
    lg.put(("p",), "k", {"v": 1}, ttl=1)
    lg.put(("p",), "k", {"v": 2}, ttl=None)                      # now never expires
    lg.put(("p",), "j", {"v": 1}, ttl=60)
    lg.put(("p",), "j", {"v": 2}, ttl=1)                         # a shorter TTL takes over at once
    clock.advance(2)
    assert lg.get(("p",), "k").value == {"v": 2}
    assert lg.get(("p",), "j") is None
    # in one batch the read refreshes, then the put's own TTL wins
    lg.put(("p",), "b", {"v": 1}, ttl=1)
    assert lg.batch([GetOp(("p",), "b"), PutOp(("p",), "b", {"v": 2}, ttl=None)])[0].value == {"v": 1}
    clock.advance(5)
    assert lg.get(("p",), "b").value == {"v": 2}


def test_expiries_survive_reopen_and_refreshes_write_seldom(tmp_path, clock):
    emb = HashEmbedder()
    with MemkernStore(tmp_path / "s", embedder=emb, clock=clock) as lg:
        lg.put(("x",), "plain", {"text": "a"}, ttl=1)
        lg.put(("x",), "read", {"text": "b"}, ttl=10)
        first = lg.get(("x",), "read", refresh_ttl=False)
        clock.advance(5)
        for _ in range(20):                                      # 20 refreshes within the slack: one rewrite
            lg.get(("x",), "read")
            clock.advance(0.01)
        rid = lg._keys[("lg.x", "read")]
        assert len(lg.store.history(rid)) == 2
        again = lg.get(("x",), "read")
        assert again.updated_at == first.updated_at and again.value == {"text": "b"}
        stored = lg.store.get(rid).meta[EXPIRES]
        assert stored >= clock() + 10 * 60 - 1 and stored <= clock() + (10 + 10 * REFRESH_SLACK) * 60
    clock.advance(9.5)                                           # 14.7 min after the put, 9.5 after the read
    with MemkernStore(tmp_path / "s", embedder=emb, clock=clock) as lg:
        assert lg.get(("x",), "plain") is None
        assert lg.get(("x",), "read", refresh_ttl=False).value == {"text": "b"}
        assert lg.sweep_ttl() == 1
        clock.advance(2)                                         # past the stored expiry (<= 1 min slack)
        assert lg.get(("x",), "read") is None
        assert lg.sweep_ttl() == 1 and lg.store.count("lg.x") == 0


def test_sweeper_thread_deletes_and_stops(tmp_path, clock):
    cfg = {"sweep_interval_minutes": 0.001}                     # 60 ms
    with MemkernStore(tmp_path / "s", embedder=HashEmbedder(), ttl=cfg, clock=clock) as lg:
        fut = lg.start_ttl_sweeper()                             # started by the constructor: the same one
        assert lg.start_ttl_sweeper() is fut and not fut.done()
        lg.put(("w",), "k", {"v": 1}, ttl=1)
        lg.put(("w",), "keep", {"v": 2})
        clock.advance(2)
        deadline = time.monotonic() + 5
        while lg.store.count("lg.w") > 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert lg.store.count("lg.w") == 1 and lg.get(("w",), "keep").value == {"v": 2}
        assert lg.stop_ttl_sweeper(timeout=2) and fut.result(timeout=2) is None
        # started by hand; cancelling its future stops it too
        fut2 = lg.start_ttl_sweeper(sweep_interval_minutes=0.001)
        assert fut2 is not fut
        fut2.cancel()
        deadline = time.monotonic() + 5
        while lg._sweeper.is_alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not lg._sweeper.is_alive() and lg.stop_ttl_sweeper()
    assert lg._sweeper is None                                   # close() stopped it


def test_async_methods_take_refresh_ttl(lg, clock):
    async def main():
        await lg.aput(("z",), "k", {"text": "x"}, ttl=1)
        clock.advance(0.9)
        await lg.aget(("z",), "k", refresh_ttl=False)
        await lg.asearch(("z",), refresh_ttl=False)
        clock.advance(0.2)
        return await lg.aget(("z",), "k"), await lg.alist_namespaces(), await lg.asweep_ttl()

    assert asyncio.run(main()) == (None, [], 1)


@pytest.mark.parametrize("kw,err,where", [
    (dict(ttl={"default_ttl": 0}), MemkernValueError, "default_ttl"),
    (dict(ttl={"default_ttl": "5"}), MemkernTypeError, "default_ttl"),
    (dict(ttl={"sweep_interval_minutes": -1}), MemkernValueError, "sweep_interval_minutes"),
    (dict(ttl={"refresh_on_read": 1}), MemkernTypeError, "refresh_on_read"),
    (dict(ttl={"omit_expired": False}), MemkernValueError, "omit_expired"),
    (dict(ttl={"bogus": 1}), MemkernValueError, "ttl"),
    (dict(ttl=5), MemkernTypeError, "ttl"),
    (dict(clock=5), MemkernTypeError, "clock"),
])
def test_bad_ttl_settings_raise(tmp_path, kw, err, where):
    with pytest.raises(err, match=where):
        MemkernStore(tmp_path / "s", embedder=HashEmbedder(), **kw)


def test_bad_ttl_arguments_raise_and_write_nothing(lg):
    for bad, err in [(0, MemkernValueError), (float("inf"), MemkernValueError), (True, MemkernTypeError),
                     ("1", MemkernTypeError)]:
        with pytest.raises(err, match="ttl"):
            lg.put(("a",), "k", {"v": 1}, ttl=bad)
    with pytest.raises(MemkernTypeError, match="refresh_ttl"):
        lg.batch([SearchOp(("a",), refresh_ttl="yes")])
    with pytest.raises(MemkernValueError, match="sweep_interval_minutes"):
        lg.start_ttl_sweeper(0)
    assert lg.get(("a",), "k") is None and lg.list_namespaces() == []
