"""``AsyncMemoryStore``: the memory store for asyncio code.

Every method is a coroutine that prepares its call in the calling task (:mod:`memkern.store.prepare`:
bad input raises at once, with the same error as :class:`memkern.MemoryStore`, and nothing is
scheduled), then runs it in a thread pool. The native store releases the GIL around its batch work (``add_batch``,
``search``, ``get_batch``, ``embeddings``, ...) and serialises writers while readers run
concurrently, so many coroutines can share one store without blocking the event loop.

Closing: :meth:`AsyncMemoryStore.aclose` (or leaving ``async with``) refuses new calls at once,
waits for the calls already running to finish (their results are delivered, every acknowledged
write is in the store), then closes the store, if this object opened it, and the pool.

Consistency: each call is one store call, atomic as in :class:`~memkern.MemoryStore`. Two
concurrent ``merge`` / ``update`` calls on the same id both land, in the order the store
serialises them (each reads the record it builds on, so a concurrent write of the same id can be
superseded; give each id one writer for read-modify-write sequences).
"""
from __future__ import annotations

import asyncio
import functools
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from ..errors import MemkernTypeError, MemkernValueError, bad_arg
from .checks import check_id, check_ids, check_integer, check_namespace, is_torch
from .engine import MemoryStore
from .prepare import prepare_add, prepare_add_batch, prepare_merge, prepare_search, prepare_update

__all__ = ["AsyncMemoryStore"]


class AsyncMemoryStore:
    """Async front end of a :class:`~memkern.MemoryStore` (or :class:`~memkern.InMemoryStore`).

    Parameters
    ----------
    store : MemoryStore, str or os.PathLike, optional
        An open store to wrap (it stays the caller's: :meth:`aclose` does not close it), or a
        store directory to open (``None``: the default store); then ``dim``, ``metric`` and
        ``store_kwargs`` go to :class:`~memkern.MemoryStore` and :meth:`aclose` closes it.
    max_workers : int
        Threads of the pool (default ``min(8, cpu_count)``); ignored when ``executor`` is given.
    executor : concurrent.futures.Executor, optional
        Use this pool instead (it is not shut down on close).

    Examples
    --------
    >>> async def main(path, vecs):
    ...     async with AsyncMemoryStore(path, dim=vecs.shape[1]) as s:
    ...         ids = await asyncio.gather(*(s.add("u", f"m{i}", v) for i, v in enumerate(vecs)))
    ...         return await s.search("u", vecs[:2], k=3)
    """

    def __init__(self, store: Any = None, dim: int | None = None, metric: str | None = None, *,
                 max_workers: int | None = None, executor: Any = None, **store_kwargs: Any) -> None:
        self._store: MemoryStore | None = None
        self._own_pool = executor is None
        self._pool = None
        if isinstance(store, MemoryStore):
            if dim is not None or metric is not None or store_kwargs:
                raise bad_arg("dim/metric/store_kwargs", "none when an open store is given",
                              {"dim": dim, "metric": metric, **store_kwargs})
            if store.closed:
                raise bad_arg("store", "an open store", repr(store))
            self._owns_store = False
            self._store = store
        else:
            self._store = MemoryStore(store, dim, metric, **store_kwargs)
            self._owns_store = True
        if max_workers is not None:
            check_integer(max_workers, "max_workers", 1, 1024)
        self._pool = executor or ThreadPoolExecutor(max_workers=max_workers or min(8, os.cpu_count() or 1),
                                                    thread_name_prefix="memkern-aio")
        self._inflight: set[asyncio.Future] = set()
        self._lock = threading.Lock()
        self._closing = False
        self._closed = False

    # ------------------------------------------------------------------ plumbing
    @property
    def store(self) -> MemoryStore:
        """The wrapped synchronous store."""
        return self._store

    @property
    def dim(self) -> int:
        return self._store.dim

    @property
    def metric(self) -> str:
        return self._store.metric

    @property
    def path(self) -> Any:
        return self._store.path

    @property
    def closed(self) -> bool:
        return self._closed or self._closing

    def __repr__(self) -> str:
        return f"AsyncMemoryStore({self._store!r}{', closed' if self.closed else ''})"

    async def __aenter__(self) -> "AsyncMemoryStore":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    def _check_open(self) -> None:
        if self._closing or self._closed:
            raise MemkernValueError(f"AsyncMemoryStore {self._store.path}: expected an open store, got a closed one")

    async def _run(self, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` (arguments already checked) in the pool."""
        self._check_open()
        loop = asyncio.get_running_loop()
        fut = loop.run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))
        self._inflight.add(fut)
        try:
            return await fut
        finally:
            self._inflight.discard(fut)

    async def aclose(self) -> None:
        """Refuse new calls, wait for running ones, then close (idempotent)."""
        if self._closed:
            return
        self._closing = True
        while self._inflight:
            await asyncio.gather(*list(self._inflight), return_exceptions=True)
        if not self._closed:
            self._closed = True
            try:
                if self._owns_store:
                    await asyncio.get_running_loop().run_in_executor(self._pool, self._store.close)
            finally:
                if self._own_pool:
                    self._pool.shutdown(wait=True)

    # ------------------------------------------------------------------ writes (prepared here, run in the pool)
    async def add(self, namespace: str, summary: str, embedding: Any, turns: list[dict] | None = None,
                  meta: dict | None = None, **kwargs: Any) -> int:
        """:meth:`memkern.MemoryStore.add` (same arguments); returns the new id."""
        self._check_open()
        call = prepare_add(self._store.dim, namespace, summary, embedding, turns, meta, **kwargs)
        return await self._run(self._store.run, call)

    async def add_batch(self, namespace: str, summaries: Sequence[str], embeddings: Any,
                        turns: Sequence[list[dict] | None] | None = None, metas: Sequence[dict | None] | None = None,
                        **kwargs: Any) -> np.ndarray:
        """:meth:`memkern.MemoryStore.add_batch` (same arguments, one atomic call); returns int64 ids ``[n]``."""
        self._check_open()
        call = prepare_add_batch(self._store.dim, namespace, summaries, embeddings, turns, metas, **kwargs)
        return await self._run(self._store.run, call)

    async def merge(self, id: int, summary: str, embedding: Any, turns: list[dict] | None = None,
                    **kwargs: Any) -> int:
        """:meth:`memkern.MemoryStore.merge` (same arguments); returns the new version."""
        self._check_open()
        call = prepare_merge(self._store.dim, id, summary, embedding, turns, **kwargs)
        return await self._run(self._store.run, call)

    async def update(self, id: int, summary: str | None = None, embedding: Any = None,
                     turns: list[dict] | None = None, meta: dict | None = None, **kwargs: Any) -> int:
        """:meth:`memkern.MemoryStore.update` (same arguments); returns the new version."""
        self._check_open()
        call = prepare_update(self._store.dim, id, summary, embedding, turns, meta, **kwargs)
        return await self._run(self._store.run, call)

    async def invalidate(self, id: int, reason: str = "") -> None:
        self._check_open()
        rid = check_id(id)
        if not isinstance(reason, str):
            raise bad_arg("reason", "a str", type(reason).__name__, MemkernTypeError)
        return await self._run(self._store.invalidate, rid, reason)

    async def delete(self, id: int) -> None:
        self._check_open()
        return await self._run(self._store.delete, check_id(id))

    # ------------------------------------------------------------------ reads
    async def get(self, id: int) -> Any:
        self._check_open()
        return await self._run(self._store.get, check_id(id))

    async def get_batch(self, ids: Iterable[int]) -> list:
        self._check_open()
        arr = check_ids(list(ids) if not hasattr(ids, "__array__") and not is_torch(ids) else ids)
        return await self._run(self._store.get_batch, arr)

    async def history(self, id: int) -> list:
        self._check_open()
        return await self._run(self._store.history, check_id(id))

    async def embeddings(self, ids: Any) -> np.ndarray:
        self._check_open()
        return await self._run(self._store.embeddings, check_ids(ids))

    async def turns_with_topics(self, ids: Iterable[int]) -> list:
        self._check_open()
        if is_torch(ids):
            ids = ids.detach().cpu().numpy()
        flat = np.asarray(ids if hasattr(ids, "__len__") else list(ids)).ravel()
        check_ids(flat[flat >= 0] if flat.size else np.zeros(0, dtype=np.int64))
        return await self._run(self._store.turns_with_topics, flat)

    async def search(self, namespace: str, queries: Any, k: int = 20, ef: int | None = None,
                     include_invalidated: bool = False, **kwargs: Any) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`memkern.MemoryStore.search` (same arguments); returns ``(ids int64 [B, k], scores
        float32 [B, k])``."""
        self._check_open()
        call = prepare_search(self._store.dim, self._store.ef_search, namespace, queries, k, ef,
                              include_invalidated, **kwargs)
        return await self._run(self._store.run, call)

    async def namespaces(self) -> list[str]:
        self._check_open()
        return await self._run(self._store.namespaces)

    async def ids(self, namespace: str, include_invalidated: bool = False, *, level: str = "topic") -> np.ndarray:
        self._check_open()
        return await self._run(self._store.ids, check_namespace(namespace), include_invalidated, level=level)

    async def count(self, namespace: str, include_invalidated: bool = False, *, level: str = "topic") -> int:
        self._check_open()
        return await self._run(self._store.count, check_namespace(namespace), include_invalidated, level=level)

    # ------------------------------------------------------------------ maintenance
    async def flush(self) -> None:
        self._check_open()
        return await self._run(self._store.flush)

    async def compact(self) -> None:
        self._check_open()
        return await self._run(self._store.compact)
