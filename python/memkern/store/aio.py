"""``AsyncMemoryStore``: the memory store for asyncio code.

Every method is a coroutine that checks its arguments in the calling task (bad input raises at
once, with the same error as :class:`memkern.MemoryStore`, and nothing is scheduled), then runs the
store call in a thread pool. The native store releases the GIL around its batch work (``add_batch``,
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
from .engine import (
    _check_event_time,
    _check_texts,
    _check_time_range,
    _compile_filter,
    MAX_CANDIDATES,
    MAX_EF,
    MAX_K,
    MAX_RESULTS,
    MemoryStore,
    _as_float32,
    _as_matrix,
    _as_vector,
    _check_id,
    _check_ids,
    _check_int,
    _check_meta,
    _check_namespace,
    _check_summary,
    _check_turns,
    _is_torch,
)

__all__ = ["AsyncMemoryStore"]

_SEARCH_LEVELS = ("topic", "turn", "turn+topic")


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
            _check_int(max_workers, "max_workers", 1, 1024)
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

    # ------------------------------------------------------------------ argument checks (in the caller's task)
    def _vec(self, x: Any, name: str) -> np.ndarray:
        return _as_vector(x, self._store.dim, name)

    def _turns_and_matrix(self, turns: Any, te: Any, name: str = "turns", te_name: str = "turn_embeddings"):
        tl = _check_turns(turns, name)
        if te is not None:
            m = _as_matrix(te, self._store.dim, te_name, len(tl))
            if len(tl) == 0:
                raise bad_arg(te_name, "None when there are no turns", f"shape {list(m.shape)}")
            te = m
        return tl, te

    # ------------------------------------------------------------------ writes
    async def add(self, namespace: str, summary: str, embedding: Any, turns: list[dict] | None = None,
                  meta: dict | None = None, *, turn_embeddings: Any = None, **kwargs: Any) -> int:
        """:meth:`memkern.MemoryStore.add` in the pool; returns the new id."""
        self._check_open()
        ns = _check_namespace(namespace)
        s = _check_summary(summary)
        e = self._vec(embedding, "embedding")
        tl, te = self._turns_and_matrix(turns, turn_embeddings)
        m = _check_meta(meta)
        _check_event_time(kwargs.get("event_time"), "event_time")
        return await self._run(self._store.add, ns, s, e, tl, m, turn_embeddings=te, **kwargs)

    async def add_batch(self, namespace: str, summaries: Sequence[str], embeddings: Any,
                        turns: Sequence[list[dict] | None] | None = None, metas: Sequence[dict | None] | None = None,
                        *, turn_embeddings: Sequence[Any] | None = None, **kwargs: Any) -> np.ndarray:
        """:meth:`memkern.MemoryStore.add_batch` in the pool (one atomic call); returns int64 ids ``[n]``."""
        self._check_open()
        ns = _check_namespace(namespace)
        if isinstance(summaries, str) or not isinstance(summaries, Sequence):
            raise bad_arg("summaries", "a list of str", type(summaries).__name__, MemkernTypeError)
        sums = [_check_summary(s, f"summaries[{i}]") for i, s in enumerate(summaries)]
        n = len(sums)
        emb = _as_matrix(embeddings, self._store.dim, "embeddings", n)
        for name, v in (("turns", turns), ("metas", metas), ("turn_embeddings", turn_embeddings)):
            if v is not None and len(v) != n:
                raise bad_arg(name, f"None or a list of {n} entries", f"length {len(v)}")
        tl, tes = [], []
        for i in range(n):
            t, te = self._turns_and_matrix(turns[i] if turns is not None else None,
                                           turn_embeddings[i] if turn_embeddings is not None else None,
                                           f"turns[{i}]", f"turn_embeddings[{i}]")
            tl.append(t)
            tes.append(te)
        ml = [_check_meta(metas[i] if metas is not None else None, f"metas[{i}]") for i in range(n)]
        et = kwargs.get("event_times")
        if et is not None:
            if isinstance(et, (str, bytes)) or not hasattr(et, "__len__") or len(et) != n:
                raise bad_arg("event_times", f"None or a list of {n} floats / None",
                              f"length {len(et)}" if hasattr(et, "__len__") else type(et).__name__)
            for i, t in enumerate(et):
                _check_event_time(t, f"event_times[{i}]")
        return await self._run(self._store.add_batch, ns, sums, emb, tl, ml,
                               turn_embeddings=tes if turn_embeddings is not None else None, **kwargs)

    async def merge(self, id: int, summary: str, embedding: Any, turns: list[dict] | None = None, *,
                    meta: dict | None = None, turn_embeddings: Any = None, **kwargs: Any) -> int:
        """:meth:`memkern.MemoryStore.merge` in the pool; returns the new version."""
        self._check_open()
        rid = _check_id(id)
        s = _check_summary(summary)
        e = self._vec(embedding, "embedding")
        tl, te = self._turns_and_matrix(turns, turn_embeddings)
        m = _check_meta(meta) if meta is not None else None
        _check_event_time(kwargs.get("event_time"), "event_time")
        return await self._run(self._store.merge, rid, s, e, tl, meta=m, turn_embeddings=te, **kwargs)

    async def update(self, id: int, summary: str | None = None, embedding: Any = None,
                     turns: list[dict] | None = None, meta: dict | None = None, *, turn_embeddings: Any = None,
                     **kwargs: Any) -> int:
        """:meth:`memkern.MemoryStore.update` in the pool; returns the new version."""
        self._check_open()
        rid = _check_id(id)
        if summary is None and embedding is None and turns is None and meta is None and not kwargs:
            raise bad_arg("update", "at least one of summary, embedding, turns, meta", "none")
        s = _check_summary(summary) if summary is not None else None
        e = self._vec(embedding, "embedding") if embedding is not None else None
        tl = _check_turns(turns) if turns is not None else None
        if turn_embeddings is not None:
            if tl is None:
                raise bad_arg("turn_embeddings", "to come with turns", "no turns")
            tl, turn_embeddings = self._turns_and_matrix(tl, turn_embeddings)
        m = _check_meta(meta) if meta is not None else None
        _check_event_time(kwargs.get("event_time"), "event_time")
        return await self._run(self._store.update, rid, s, e, tl, m, turn_embeddings=turn_embeddings, **kwargs)

    async def invalidate(self, id: int, reason: str = "") -> None:
        self._check_open()
        rid = _check_id(id)
        if not isinstance(reason, str):
            raise bad_arg("reason", "a str", type(reason).__name__, MemkernTypeError)
        return await self._run(self._store.invalidate, rid, reason)

    async def delete(self, id: int) -> None:
        self._check_open()
        return await self._run(self._store.delete, _check_id(id))

    # ------------------------------------------------------------------ reads
    async def get(self, id: int) -> Any:
        self._check_open()
        return await self._run(self._store.get, _check_id(id))

    async def get_batch(self, ids: Iterable[int]) -> list:
        self._check_open()
        arr = _check_ids(list(ids) if not hasattr(ids, "__array__") and not _is_torch(ids) else ids)
        return await self._run(self._store.get_batch, arr)

    async def history(self, id: int) -> list:
        self._check_open()
        return await self._run(self._store.history, _check_id(id))

    async def embeddings(self, ids: Any) -> np.ndarray:
        self._check_open()
        return await self._run(self._store.embeddings, _check_ids(ids))

    async def turns_with_topics(self, ids: Iterable[int]) -> list:
        self._check_open()
        if _is_torch(ids):
            ids = ids.detach().cpu().numpy()
        flat = np.asarray(ids if hasattr(ids, "__len__") else list(ids)).ravel()
        _check_ids(flat[flat >= 0] if flat.size else np.zeros(0, dtype=np.int64))
        return await self._run(self._store.turns_with_topics, flat)

    async def search(self, namespace: str, queries: Any, k: int = 20, ef: int | None = None,
                     include_invalidated: bool = False, *, level: str = "topic", alpha: float = 1.0,
                     candidates: int | None = None, **kwargs: Any) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`memkern.MemoryStore.search` in the pool (same arguments, including the keyword
        ones of newer stores, passed through); returns ``(ids int64 [B, k], scores float32 [B, k])``."""
        self._check_open()
        ns = _check_namespace(namespace)
        B = None
        if queries is not None:
            q = _as_float32(queries, "queries", stored=False)
            if q.ndim == 1:
                q = q[None, :]
            if q.ndim != 2 or q.shape[1] != self._store.dim:
                raise bad_arg("queries", f"shape [B, {self._store.dim}] or [{self._store.dim}]",
                              f"shape {list(np.shape(queries))}")
            kk = _check_int(k, "k", 1, MAX_K)
            if kk * q.shape[0] > MAX_RESULTS:
                raise bad_arg("k", f"B * k <= {MAX_RESULTS} result slots (B = {q.shape[0]} queries)", k)
            queries = np.ascontiguousarray(q)
            B = q.shape[0]
        else:
            _check_int(k, "k", 1, MAX_K)
        _check_int(ef, "ef", 1, MAX_EF, none_ok=True)
        if level not in _SEARCH_LEVELS:
            raise bad_arg("level", '"topic", "turn" or "turn+topic"', level)
        if level == "turn+topic":
            _check_int(candidates, "candidates", 1, MAX_CANDIDATES, none_ok=True)
        mode = kwargs.get("mode", "dense")
        if mode not in ("dense", "lexical", "hybrid"):
            raise bad_arg("mode", '"dense", "lexical" or "hybrid"', mode)
        if mode != "dense":
            _check_texts(kwargs.get("texts"), B)
        _compile_filter(kwargs.get("filter"))
        _check_time_range(kwargs.get("time_range"))
        return await self._run(self._store.search, ns, queries, k, ef, include_invalidated, level=level, alpha=alpha,
                               candidates=candidates, **kwargs)

    async def namespaces(self) -> list[str]:
        self._check_open()
        return await self._run(self._store.namespaces)

    async def ids(self, namespace: str, include_invalidated: bool = False, *, level: str = "topic") -> np.ndarray:
        self._check_open()
        return await self._run(self._store.ids, _check_namespace(namespace), include_invalidated, level=level)

    async def count(self, namespace: str, include_invalidated: bool = False, *, level: str = "topic") -> int:
        self._check_open()
        return await self._run(self._store.count, _check_namespace(namespace), include_invalidated, level=level)

    # ------------------------------------------------------------------ maintenance
    async def flush(self) -> None:
        self._check_open()
        return await self._run(self._store.flush)

    async def compact(self) -> None:
        self._check_open()
        return await self._run(self._store.compact)
