"""Time to live of LangGraph items: ``TTLConfig`` checks, expiry tracking, refresh on read and the
sweeper (``sweep_ttl``, ``start_ttl_sweeper``, ``stop_ttl_sweeper``)."""
from __future__ import annotations

import asyncio
import heapq
import math
import threading
from collections import defaultdict
from concurrent.futures import Future
from typing import Any

import numpy as np

from langgraph.store.base import TTLConfig

from ...errors import MemkernTypeError, bad_arg
from .namespaces import EXPIRES, TTL, UPDATED

#: A refresh that rewrites a record stores an expiry this fraction of the TTL past the exact one.
REFRESH_SLACK = 0.1
TTL_KEYS = ("refresh_on_read", "default_ttl", "sweep_interval_minutes", "omit_expired")


def check_minutes(v: Any, name: str, *, none_ok: bool = True) -> float | None:
    """A positive finite number of minutes (``None`` where allowed)."""
    if v is None and none_ok:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise bad_arg(name, "a positive number of minutes" + (" or None" if none_ok else ""), type(v).__name__,
                      MemkernTypeError)
    if not math.isfinite(float(v)) or float(v) <= 0:
        raise bad_arg(name, "a positive finite number of minutes", v)
    return float(v)


def check_ttl_config(ttl: Any) -> dict | None:
    if ttl is None:
        return None
    if not isinstance(ttl, dict):
        raise bad_arg("ttl", "a TTLConfig dict or None", type(ttl).__name__, MemkernTypeError)
    for k in ttl:
        if k not in TTL_KEYS:
            raise bad_arg("ttl", f"TTLConfig keys among {list(TTL_KEYS)}", k)
    for k in ("refresh_on_read", "omit_expired"):
        if k in ttl and not isinstance(ttl[k], bool):
            raise bad_arg(f"ttl[{k!r}]", "True or False", ttl[k], MemkernTypeError)
    if ttl.get("omit_expired") is False:
        raise bad_arg("ttl['omit_expired']", "True (expired items are never returned)", False)
    check_minutes(ttl.get("default_ttl"), "ttl['default_ttl']")
    check_minutes(ttl.get("sweep_interval_minutes"), "ttl['sweep_interval_minutes']")
    return TTLConfig(**ttl)




class TTLMixin:
    """The TTL bookkeeping of :class:`~memkern.integrations.langgraph.MemkernStore`: the expiry of
    each item with a TTL, refreshes on read, and the sweeper that deletes expired items."""

    # ------------------------------------------------------------------ TTL bookkeeping (under self._lock)
    def _track(self, rid: int, ns: str, key: str, minutes: float, exact: float, stored: float) -> None:
        self._ttl[rid] = [ns, key, minutes, exact, stored]
        self._expired.discard(rid)
        if exact < self._heap_t.get(rid, math.inf):
            heapq.heappush(self._heap, (exact, rid))
            self._heap_t[rid] = exact

    def _untrack(self, rid: int) -> None:
        self._ttl.pop(rid, None)
        self._expired.discard(rid)          # its heap entry is dropped when it comes up

    def _collect(self, now: float) -> None:
        """Move the items whose exact expiry is ``<= now`` into ``_expired`` (amortised
        O(log n) per expiry or refresh, never a scan of every TTL item)."""
        heap = self._heap
        while heap and heap[0][0] <= now:
            t, rid = heapq.heappop(heap)
            if self._heap_t.get(rid) != t:
                continue                    # a stale entry (a shorter TTL pushed an earlier one)
            del self._heap_t[rid]
            entry = self._ttl.get(rid)
            if entry is None:
                continue
            if entry[3] > now:              # refreshed since: wait for the new expiry
                heapq.heappush(heap, (entry[3], rid))
                self._heap_t[rid] = entry[3]
            else:
                self._expired.add(rid)

    def _view(self) -> tuple[float, frozenset, dict]:
        """``(now, expired ids, expired count per namespace)`` for one batch."""
        now = float(self._clock())
        with self._lock:
            self._collect(now)
            expired = frozenset(self._expired)
            per_ns: dict[str, int] = defaultdict(int)
            for rid in expired:
                per_ns[self._ttl[rid][0]] += 1
        return now, expired, per_ns

    def _refresh(self, rids: list[int], now: float) -> None:
        """Restart the TTL of the items ``rids`` just read; rewrite a record only when its stored
        expiry falls behind the exact one."""
        with self._lock:
            for rid in dict.fromkeys(rids):
                entry = self._ttl.get(rid)
                if entry is None or rid in self._expired:
                    continue
                exact = max(entry[3], now + entry[2] * 60.0)
                entry[3] = exact
                if entry[4] >= exact or rid not in self.store:
                    continue
                r = self.store.get(rid)
                meta = dict(r.meta)
                if meta.get(TTL) is None:
                    continue
                meta[EXPIRES] = exact + REFRESH_SLACK * entry[2] * 60.0
                meta.setdefault(UPDATED, float(r.updated_at))
                self.store.update(rid, meta=meta)
                entry[4] = meta[EXPIRES]

    def sweep_ttl(self) -> int:
        """Delete the expired items from the memkern store; returns how many were deleted."""
        now = float(self._clock())
        n = 0
        with self._lock:
            self._collect(now)
            for rid in sorted(self._expired):
                ns, key = self._ttl[rid][:2]
                if rid in self.store:
                    self.store.delete(rid)
                    n += 1
                if self._keys.get((ns, key)) == rid:
                    del self._keys[(ns, key)]
                self._untrack(rid)
        return n

    async def asweep_ttl(self) -> int:
        """:meth:`sweep_ttl` in a worker thread."""
        return await asyncio.to_thread(self.sweep_ttl)

    def start_ttl_sweeper(self, sweep_interval_minutes: float | None = None) -> Future:
        """Run :meth:`sweep_ttl` every ``sweep_interval_minutes`` (default: the config's, else 5)
        in a daemon thread. Returns a ``concurrent.futures.Future`` done when the sweeper stops
        (cancelling it stops it); a sweeper already running is kept and its future returned."""
        interval = check_minutes(sweep_interval_minutes, "sweep_interval_minutes")
        if interval is None:
            interval = float((self.ttl_config or {}).get("sweep_interval_minutes") or 5)
        with self._lock:
            if self._sweeper is not None and self._sweeper.is_alive():
                return self._sweep_future
            stop = self._sweep_stop = threading.Event()
            fut: Future = Future()
            fut.add_done_callback(lambda f: stop.set() if f.cancelled() else None)

            def loop() -> None:
                try:
                    while not stop.wait(interval * 60.0):
                        try:
                            self.sweep_ttl()
                        except Exception:      # a failed sweep is retried next interval
                            _log.exception("memkern LangGraph TTL sweep failed")
                finally:
                    if not fut.done():
                        fut.set_result(None)

            self._sweep_future = fut
            self._sweeper = threading.Thread(target=loop, name="memkern-lg-ttl", daemon=True)
            self._sweeper.start()
            return fut

    def stop_ttl_sweeper(self, timeout: float | None = None) -> bool:
        """Stop the sweeper thread; ``True`` once it has stopped (or none ran) within ``timeout``
        seconds (``None``: wait)."""
        t = self._sweeper
        if t is None:
            return True
        self._sweep_stop.set()
        if t is not threading.current_thread():
            t.join(timeout)
        if t.is_alive():
            return False
        self._sweeper = None
        return True

    def _refresh_default(self, refresh_ttl: bool | None) -> bool:
        if refresh_ttl is not None:
            return refresh_ttl
        return (self.ttl_config or {}).get("refresh_on_read", True)

