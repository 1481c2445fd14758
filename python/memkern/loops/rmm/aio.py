"""RMM's thread safety and async API: one lock per RMM, and ``arespond`` / ``aretrieve`` /
``aend_session`` in a thread pool.

An :class:`memkern.RMM` may be shared by threads (a web server's worker pool) and by coroutines
(``asyncio.gather`` over :meth:`AsyncStage.arespond`). Everything that reads or changes its
learning state runs under the instance's re-entrant lock (:func:`locked`): ``respond`` (the
reranker's draw uses the response counter as its seed offset, and its rewards go to the buffer),
``end_sessions`` (search candidates, decide, write: a read-modify-write of the namespace),
``flush`` / ``feedback`` (the reranker step and the buffer) and ``save`` / ``close``. Without it,
a flush running while another response appends its rewards clears rewards that were never used,
and two responses draw with one seed. Calls on one RMM therefore run one at a time; different RMMs
(namespaces) run in parallel, and the native store releases the GIL for its searches.
"""
from __future__ import annotations

import asyncio
import functools
import threading
from concurrent.futures import Executor
from typing import Any, Callable, Sequence, TypeVar

__all__ = ["AsyncStage", "locked"]

F = TypeVar("F", bound=Callable[..., Any])


def locked(fn: F) -> F:
    """Run the method under its RMM's lock (``self._lock``, an ``RLock``: locked methods may call
    each other)."""

    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        with self._lock:
            return fn(self, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


class AsyncStage:
    """``arespond`` / ``aend_session`` of :class:`memkern.RMM` (a mixin; the lock is made in
    ``RMM.__init__`` by :meth:`_init_lock`)."""

    _lock: threading.RLock

    def _init_lock(self) -> None:
        self._lock = threading.RLock()

    async def arespond(self, query: str, session_turns: Sequence[dict] | None = None, *,
                       executor: Executor | None = None, **filters: Any) -> Any:
        """:meth:`respond` run in a thread pool (``executor``, default: the event loop's), so the
        event loop keeps serving while the models and the store work. Safe under
        ``asyncio.gather``: concurrent calls on one RMM are serialised by its lock (every response's
        rewards reach the reranker exactly once). ``filters``: :meth:`respond`'s ``filter``,
        ``time_range``, ``time_field``, ``recency``, ``recency_weight``, ``now``. Returns the
        :class:`~memkern.loops.rmm.Response`."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(executor, functools.partial(self.respond, query, session_turns, **filters))

    async def aend_session(self, turns: Sequence[dict], session_id: str | int | None = None, date: Any = None, *,
                           timestamp: Any = None, executor: Executor | None = None) -> Any:
        """:meth:`end_session` run in a thread pool (``executor``, default: the event loop's); the
        same arguments."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            executor, functools.partial(self.end_session, turns, session_id, date, timestamp=timestamp))

    async def aretrieve(self, query: str, turns: int | None = None, *, explore: bool | None = None,
                        executor: Executor | None = None, **filters: Any) -> Any:
        """:meth:`retrieve` run in a thread pool (``executor``, default: the event loop's), under
        the RMM's lock so that it never reads the reranker halfway through an update.
        ``filters``: :meth:`retrieve`'s ``filter``, ``time_range``, ``time_field``, ``recency``,
        ``recency_weight``, ``now``. Returns the :class:`~memkern.loops.rmm.Retrieval`."""
        loop = asyncio.get_running_loop()

        def run() -> Any:
            with self._lock:
                return self.retrieve(query, turns, explore=explore, **filters)

        return await loop.run_in_executor(executor, run)
