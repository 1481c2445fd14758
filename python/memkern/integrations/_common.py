"""What every adapter shares: one embedding function from any embedder, one way to open a store."""
from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..errors import MemkernTypeError, MemkernValueError, bad_arg
from ..base.validate import MAX_TEXT_CHARS
from ..base.validate import check_text as _check_text

__all__ = ["EmbedFn", "as_embed_fn", "open_store", "release_store", "check_text", "check_texts", "apply_writes",
           "time_kw", "TIME_KEYS", "pop_time_kw", "record_time"]

#: The time / recency keyword arguments every adapter's search takes (meaning as in
#: :meth:`memkern.MemoryStore.search`; ``time_range`` ends may be dates, see :func:`time_kw`).
TIME_KEYS = ("time_range", "time_field", "recency", "recency_weight", "now")


def time_kw(store: Any, time_range: Any = None, time_field: Any = "event", recency: Any = None,
            recency_weight: Any = None, now: Any = None) -> dict:
    """The checked time keywords of an adapter's search, to pass on to ``store.search``
    (``{}`` when none is set).

    ``time_range``: ``(start, end)``, each unix seconds, a :class:`datetime.datetime` (aware, or
    naive = UTC; e.g. a LangGraph ``Item.created_at``), a date or a date string
    (:func:`memkern.text.template.event_seconds`), or ``None`` (open); keeps ``start <= t < end``.
    ``time_field``: ``"event"`` (the conversation date written as ``event_time``, else
    ``created_at``), ``"created"`` or ``"updated"``. ``recency``: half-life in seconds of a
    recency prior of weight ``recency_weight`` (default 0.1) measured from ``now``. Raises the
    store's errors (naming the argument); a store whose ``search`` lacks one raises
    :class:`memkern.MemkernValueError` naming it.
    """
    from ..protocols import missing_search_keywords
    from ..store import DEFAULT_RECENCY_WEIGHT, check_search_filters
    from ..text.template import time_range_seconds

    kw = check_search_filters(None, time_range_seconds(time_range), time_field, recency,
                              DEFAULT_RECENCY_WEIGHT if recency_weight is None else recency_weight, now)
    missing = missing_search_keywords(store, kw)
    if missing:
        raise MemkernValueError(f"{missing[0]}: expected none, got {missing[0]}, which this store's search does not take")
    return kw


def pop_time_kw(store: Any, kwargs: dict) -> dict:
    """:func:`time_kw` of the :data:`TIME_KEYS` in a framework call's ``**kwargs`` (removed from it)."""
    return time_kw(store, **{k: kwargs.pop(k) for k in TIME_KEYS if k in kwargs})


def record_time(r: Any, time_field: str) -> float:
    """A record's time for ``time_field`` (``"event"``: ``event_time``, else ``created_at``)."""
    if time_field == "created":
        return float(r.created_at)
    if time_field == "updated":
        return float(r.updated_at)
    et = getattr(r, "event_time", None)
    return float(r.created_at if et is None else et)


def in_time_range(r: Any, kw: dict) -> bool:
    """Whether record ``r`` passes ``kw["time_range"]`` (:func:`time_kw`; none: True)."""
    tr = kw.get("time_range")
    if tr is None:
        return True
    t = record_time(r, kw.get("time_field", "event"))
    return (tr[0] is None or t >= tr[0]) and (tr[1] is None or t < tr[1])


def check_text(text: Any, name: str, max_chars: int = MAX_TEXT_CHARS) -> str:
    """A str encodable as UTF-8 (what the store keeps) of at most ``max_chars`` characters, else an
    error naming ``name`` (:func:`memkern.base.validate.check_text`)."""
    return _check_text(name, text, max_chars=max_chars)


def check_texts(texts: Any, name: str) -> list[str]:
    if isinstance(texts, (str, bytes)) or not isinstance(texts, (list, tuple)):
        try:
            texts = list(texts)
        except TypeError:
            raise bad_arg(name, "a list of str", type(texts).__name__, MemkernTypeError) from None
    return [check_text(t, f"{name}[{i}]") for i, t in enumerate(texts)]


class EmbedFn:
    """Texts -> float32 ``[n, d]`` from a memkern ``Embedder`` (``encode(texts, kind)``), a
    LangChain ``Embeddings`` (``embed_documents`` / ``embed_query``), a LlamaIndex embedding
    (``get_text_embedding_batch`` / ``get_query_embedding``) or a callable ``list[str] -> [n, d]``.
    Outputs are checked (shape ``[n, d]``, finite) and errors name ``embedder``."""

    def __init__(self, embedder: Any, dim: int | None = None):
        self.embedder = embedder
        if hasattr(embedder, "encode") and hasattr(embedder, "dim"):
            self.kind = "memkern"
        elif hasattr(embedder, "embed_documents") and hasattr(embedder, "embed_query"):
            self.kind = "langchain"
        elif hasattr(embedder, "get_text_embedding_batch") and hasattr(embedder, "get_query_embedding"):
            self.kind = "llamaindex"
        elif callable(embedder):
            self.kind = "callable"
        else:
            raise bad_arg("embedder", "None, a memkern Embedder, a LangChain Embeddings, a LlamaIndex "
                          "embedding or a callable list[str] -> [n, d]", type(embedder).__name__, MemkernTypeError)
        self._dim = int(embedder.dim) if self.kind == "memkern" else dim

    @property
    def dim(self) -> int:
        if self._dim is None:            # probe once
            self._dim = int(self(["dimension probe"]).shape[1])
        return self._dim

    def __call__(self, texts: Sequence[str], kind: str = "passage") -> np.ndarray:
        texts = list(texts)
        e = self.embedder
        if not texts:
            return np.zeros((0, self._dim or 0), dtype=np.float32)
        if self.kind == "memkern":
            out = e.encode(texts, kind=kind)
        elif self.kind == "langchain":
            out = ([e.embed_query(t) for t in texts] if kind == "query" else e.embed_documents(texts))
        elif self.kind == "llamaindex":
            out = ([e.get_query_embedding(t) for t in texts] if kind == "query" else e.get_text_embedding_batch(texts))
        else:
            out = e(texts)
        try:
            arr = np.asarray(out, dtype=np.float32)
        except (TypeError, ValueError):
            raise bad_arg("embedder", "vectors of floats", type(out).__name__, MemkernTypeError) from None
        if arr.ndim != 2 or arr.shape[0] != len(texts) or (self._dim is not None and arr.shape[1] != self._dim):
            raise bad_arg("embedder", f"an output of shape [{len(texts)}, {self._dim or 'd'}]", f"shape {list(arr.shape)}")
        if not np.isfinite(arr).all():
            raise bad_arg("embedder", "finite vectors", "NaN or inf")
        return np.ascontiguousarray(arr)


def as_embed_fn(embedder: Any, dim: int | None = None) -> EmbedFn:
    """``None`` -> memkern's offline default :class:`memkern.models.Embedder` (MiniLM, 384-d)."""
    if isinstance(embedder, EmbedFn):
        return embedder
    if embedder is None:
        from ..models import Embedder

        embedder = Embedder()
    return EmbedFn(embedder, dim)


# ------------------------------------------------------------------------------- shared stores
_OPEN: dict[str, list] = {}          # resolved path -> [store, refcount]
_OPEN_LOCK = threading.Lock()


def open_store(store_or_path: Any, dim: int | None, name: str = "store_or_path",
               dim_name: str = "embedder") -> tuple[Any, bool]:
    """``(store, owned)``: a store object is used as is (its ``dim`` must equal ``dim`` unless
    ``dim`` is None); a path opens (or creates, metric ``"ip"``; creating needs ``dim``) a
    :class:`memkern.MemoryStore` there. Opening the same
    path twice in one process shares one store (a store directory may be opened once per process),
    released by :func:`release_store` when the last user closes."""
    if isinstance(store_or_path, (str, os.PathLike)):
        from ..store.engine import MemoryStore

        key = str(Path(store_or_path).resolve())
        with _OPEN_LOCK:
            hit = _OPEN.get(key)
            if hit is not None and not hit[0].closed:
                store = hit[0]
                hit[1] += 1
            else:
                p = Path(store_or_path)
                exists = (p / "CURRENT").exists() or (p / "wal.log").exists()
                # an existing store is opened with its own dim, checked below against ``dim``
                store = MemoryStore(store_or_path, dim=None if exists else dim, metric=None)
                _OPEN[key] = [store, 1]
        owned = True
    elif hasattr(store_or_path, "search") and hasattr(store_or_path, "add_batch") and hasattr(store_or_path, "dim"):
        store, owned = store_or_path, False
    else:
        raise bad_arg(name, "a memkern store or a path", type(store_or_path).__name__, MemkernTypeError)
    if dim is not None and int(store.dim) != int(dim):
        if owned:
            release_store(store)
        raise MemkernValueError(f"{dim_name}: expected the store's dim {store.dim}, got {dim}")
    return store, owned


def release_store(store: Any) -> None:
    """Drop one reference to a store opened by :func:`open_store`; the last one closes it."""
    with _OPEN_LOCK:
        for key, hit in list(_OPEN.items()):
            if hit[0] is store:
                hit[1] -= 1
                if hit[1] <= 0:
                    del _OPEN[key]
                    store.close()
                return


def placeholder(dim: int) -> np.ndarray:
    """The vector stored for a record that is not searched by similarity (any metric accepts it)."""
    v = np.zeros(dim, dtype=np.float32)
    v[0] = 1.0
    return v



def apply_writes(store: Any, updates: list | None = None, adds: list | None = None,
                 deletes: list | None = None) -> list:
    """Apply one adapter call's writes as close to all-or-nothing as the store allows.

    ``updates``: ``(record id, update kwargs)``; ``adds``: ``(namespace, summaries, embeddings
    [n, d], metas)`` groups (one atomic ``add_batch`` each); ``deletes``: record ids (last). If a
    write raises (e.g. an I/O error), the writes already made are undone before the error
    propagates: added records are deleted, updated ones get their previous content back (as one
    more version). Deletes run last, so a failure there only leaves earlier deletes of the same
    call applied. Returns the new ids of each add group (int64 arrays), in order.
    """
    added: list = []
    updated: list = []
    try:
        for rid, kw in updates or ():
            old = store.get(rid)
            old.embedding  # read now (records load their vector lazily)
            store.update(rid, **kw)
            updated.append(old)
        out = []
        for ns, summaries, embs, metas in adds or ():
            ids = np.asarray(store.add_batch(ns, summaries, embs, metas=metas), dtype=np.int64)
            added.extend(ids.tolist())
            out.append(ids)
        for rid in deletes or ():
            store.delete(rid)
        return out
    except BaseException:
        for rid in added:
            try:
                store.delete(rid)
            except Exception:  # pragma: no cover - best effort while failing
                pass
        for old in reversed(updated):
            try:
                store.update(old.id, summary=old.summary, embedding=old.embedding, meta=old.meta)
            except Exception:  # pragma: no cover
                pass
        raise
