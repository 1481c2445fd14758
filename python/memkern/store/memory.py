"""``InMemoryStore``: the store engine with persistence off.

:class:`InMemoryStore` is a :class:`memkern.MemoryStore` whose native layer is
``memkern._store.Store.in_memory(...)``: the same C++ engine (ids, versions and history,
invalidation and deletion, two-level memory, lexical / hybrid search, filters, time ranges, the
recency prior, padding and tie order are one code), whose writes take the same encode -> apply
path but are never appended to a log. No directory, log, snapshot or lock file is ever created.

Differences from a :class:`~memkern.MemoryStore` on disk:

* **Not persisted.** ``path`` is ``None``; the records are gone when the store is closed or
  collected. ``flush`` and ``snapshot`` have nothing to write (they check that the store is open
  and return); ``compact`` rebuilds the indexes without deleted vectors and forgets deleted ids
  (so :func:`memkern.store.transfer.import_records` may reuse them), writing nothing. RMM keeps no
  reranker file for such a store (``RMM.save`` is a no-op, as the Store protocol says for
  ``path=None``). :func:`memkern.export_store` / :func:`memkern.import_store` move its content to
  and from files.
* **Exact by default.** ``flat_limit`` defaults to ``Store.max_flat_limit`` (2**24): every
  namespace is answered by an exact scan; pass ``flat_limit=1024`` (``MemoryStore``'s default) for
  HNSW graphs past 1,024 records.
"""
from __future__ import annotations

import numpy as np

from ..errors import MemkernValueError
from .checks import DEFAULT_EF_SEARCH, METRICS, check_engine_options
from .engine import MemoryStore
from .native import native_module
from ..base.validate import check_choice, check_int

__all__ = ["InMemoryStore"]



class InMemoryStore(MemoryStore):
    """A memory store held in process memory: the native engine with persistence off.

    Implements :class:`memkern.protocols.Store` and :class:`memkern.protocols.TurnStore` with
    :class:`MemoryStore`'s code, checks and errors; nothing is written to disk.

    Parameters
    ----------
    dim : int
        Embedding size, 1..65536.
    metric : {"ip", "l2", "cos"}
        Similarity (default ``"ip"``); see :mod:`memkern.store` for the scores.
    ef_search : int, optional
        Default search beam width of HNSW graphs (``None``: :data:`~memkern.store.DEFAULT_EF_SEARCH`).
    M, ef_construction, num_threads : int
        As for :class:`MemoryStore`.
    flat_limit : int, optional
        A namespace level holding at most this many records is searched by exact scan, past it by an
        HNSW graph. ``None`` (default): ``2**24``, exact at any practical size.
    id_range : (int, int), optional
        ``(first, end)``: the ids this store hands out (as for :class:`MemoryStore`).

    Examples
    --------
    >>> import numpy as np, memkern
    >>> s = memkern.InMemoryStore(dim=4)
    >>> rid = s.add("alice", "likes tea", np.array([1, 0, 0, 0], np.float32))
    >>> s.search("alice", np.array([1, 0, 0, 0], np.float32), k=2)[0].tolist()
    [[0, -1]]
    """

    def __init__(self, dim: int, metric: str = "ip", *, ef_search: int | None = None, M: int = 16,
                 ef_construction: int = 200, num_threads: int = 1, flat_limit: int | None = None,
                 id_range: tuple[int, int] | None = None) -> None:
        self._native = None
        self._path = None
        check_int("dim", dim, 1, 65536)
        check_choice("metric", metric, METRICS, expected='"ip", "l2" or "cos"')
        nat = native_module().Store
        if flat_limit is None:
            flat_limit = int(nat.max_flat_limit)
        id_base, id_end = check_engine_options(M, ef_construction, ef_search, num_threads, flat_limit, id_range)
        self._native = nat.in_memory(int(dim), metric, int(M), int(ef_construction), int(num_threads),
                                     int(flat_limit), int(id_base), int(id_end))
        self._options = {"ef_search": ef_search, "M": int(M), "ef_construction": int(ef_construction),
                         "num_threads": int(num_threads), "flat_limit": int(flat_limit)}
        self._id_range = id_range
        self._dim = int(self._native.dim)  # fixed for the store's life (the search path reads it)
        self.ef_search = int(ef_search) if ef_search is not None else DEFAULT_EF_SEARCH

    @property
    def path(self) -> None:
        """``None``: the store is not on disk (the Store protocol's value for such stores)."""
        return None

    def __repr__(self) -> str:
        if self.closed:
            return "InMemoryStore(closed)"
        return f"InMemoryStore(dim={self.dim}, metric={self.metric!r})"

    def _n(self):
        if self._native is None or self._native.closed:
            raise MemkernValueError("in-memory store: expected an open store, got a closed one")
        return self._native

    def flush(self) -> None:
        """Nothing to write: checks that the store is open."""
        self._n().flush()

    def snapshot(self, wait: bool = True) -> None:
        """Nothing to write: checks ``wait`` and that the store is open."""
        super().snapshot(wait)

    def compact(self) -> None:
        """Rebuild the indexes without deleted vectors, drop empty namespaces and forget deleted ids
        (nothing is written)."""
        self._n().compact()

    def close(self) -> None:
        """Release the records (idempotent). Nothing is persisted."""
        if self._native is not None and not self._native.closed:
            self._native.close()


# ------------------------------------------------------------------ exact cos inputs (export / import)

def _cos_normalize(rows: np.ndarray) -> np.ndarray:
    """float32 ``[n, d]`` rows L2-normalised bit for bit as the native store does (``prepare_vector``):
    the sum of squares accumulated in float64 in index order (``cumsum`` is sequential, unlike
    ``sum``), ``1 / sqrt`` rounded to float32, then one float32 product per value. Zero rows stay."""
    rows = np.asarray(rows, dtype=np.float32).reshape(len(rows), -1)
    if rows.shape[1] == 0:
        return rows.copy()
    s = np.cumsum(np.square(rows.astype(np.float64)), axis=1)[:, -1]
    inv = np.ones(len(rows), dtype=np.float32)
    nz = s > 0
    inv[nz] = (1.0 / np.sqrt(s[nz])).astype(np.float32)
    return rows * inv[:, None]


def _cos_preimage(v: np.ndarray) -> np.ndarray | None:
    """A float32 vector that :func:`_cos_normalize` maps to the unit vector ``v`` exactly, or
    ``None`` (rare: about 1 in 500 vectors at d <= 8, none seen at d >= 64).

    Storing ``v`` itself renormalises it, which moves ~15% of unit vectors by one ulp. Search:
    for scales ``c`` next to 1 (1 first, then float32 neighbours), take per value the float32
    neighbours of ``v / c`` whose product with ``c`` rounds back to ``v``, and keep the first
    choice whose own normalisation scale is exactly ``c``."""
    v = np.asarray(v, dtype=np.float32)
    if np.array_equal(_cos_normalize(v[None])[0], v):
        return v
    cands, a, b = [np.float32(1)], np.float32(1), np.float32(1)
    for _ in range(12):
        a, b = np.nextafter(a, np.float32(2)), np.nextafter(b, np.float32(0))
        cands += [a, b]
    cols = np.arange(len(v))
    for c in cands:
        y = (v.astype(np.float64) / np.float64(c)).astype(np.float32)
        xs = np.stack([y, np.nextafter(y, np.float32(np.inf)), np.nextafter(y, np.float32(-np.inf))])
        ok = (xs * c) == v[None]
        if not ok.any(axis=0).all():
            continue
        mag = np.abs(xs).astype(np.float64)
        for j in (np.argmax(ok, axis=0), np.argmin(np.where(ok, mag, np.inf), axis=0),
                  np.argmax(np.where(ok, mag, -np.inf), axis=0)):
            x = xs[j, cols]
            if np.array_equal(_cos_normalize(x[None])[0], v):
                return x
    return None
