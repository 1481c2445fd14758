"""LangGraph ``BaseStore`` on memkern's store: ``MemkernStore(store_or_path, embedder=None)``.

Every LangGraph item is one memkern topic record:

* namespace tuple ``("users", "alice")`` <-> memkern namespace ``"lg.users.alice"``
  (:func:`encode_namespace` / :func:`decode_namespace`; LangGraph labels are non-empty str without
  ``"."`` or NUL, so the encoding is reversible; memkern namespaces without the ``"lg."`` prefix
  belong to other users of the store and are never touched);
* ``value`` -> the record's ``meta`` (its top-level keys are what filters see), plus two reserved
  keys: ``"__lg_key__"`` (the item key) and ``"__lg_indexed__"`` (whether it has a text vector);
* the texts at the index fields (default ``["$"]``: the whole value as JSON; LangGraph's path syntax,
  e.g. ``["text", "tags[*]"]``) -> joined by newlines into the record's ``summary``, embedded once
  as the record's vector. An item with ``index=False`` or no text at its fields is stored with a
  placeholder vector and ``"__lg_indexed__": false``; it is returned by searches without a
  ``query`` and never by similarity searches.

``put`` of an existing key writes a new version of the record (``created_at`` kept, ``history``
readable through the memkern store); ``delete`` deletes it. ``search(prefix, query=..., filter=...)``
searches every namespace under ``prefix`` (a query: by similarity, best first, ``score`` = the
store's score, i.e. cosine for the default normalised embedder; no query: oldest first) with the
filter grammar of :mod:`memkern.integrations.filters` (LangGraph's ``$eq $ne $gt $gte $lt $lte``
plus ``$in $nin $contains $exists $and $or $not``). ``batch`` reads against the state before the
batch and then applies its puts (the last put of a key wins), like LangGraph's ``InMemoryStore``;
every op is validated before anything is written. ``abatch`` runs ``batch`` in a thread pool (the
native store releases the GIL).

Time: ``search`` / ``asearch`` also take ``time_range=(start, end)`` (datetimes such as an item's
``created_at`` / ``updated_at``, dates, date strings or unix seconds; ``None`` for an open end),
``time_field`` (``"created"`` / ``"updated"``: the items' ``created_at`` / ``updated_at``;
``"event"``, the default: the record's ``event_time``, else ``created_at``) and, with a
``query``, a recency prior (``recency`` half-life in seconds, ``recency_weight``, ``now``), all
applied inside the store's search (:func:`memkern.integrations._common.time_kw`). Without a query
the time range filters the listing.

Errors: bad namespaces raise :class:`MemkernNamespaceError` (both a
:class:`memkern.MemkernValueError` and LangGraph's ``InvalidNamespaceError``); every other bad
argument raises the memkern error the Python API raises, naming the argument.
"""
from __future__ import annotations

import asyncio
import functools
import json
import threading
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from typing import Any, Iterable, Sequence

import numpy as np

try:
    from langgraph.store.base import (
        NOT_PROVIDED,
        BaseStore,
        GetOp,
        InvalidNamespaceError,
        Item,
        ListNamespacesOp,
        MatchCondition,
        PutOp,
        SearchItem,
        SearchOp,
    )
    from langgraph.store.base.embed import get_text_at_path, tokenize_path
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError("memkern.integrations.langgraph needs LangGraph: pip install 'memkern[langgraph]'") from e

from ..errors import MemkernTypeError, MemkernValueError, bad_arg
from ..base.validate import MAX_ID_CHARS, MAX_QUERY_CHARS
from . import filters as F
from ._common import (apply_writes, as_embed_fn, check_text, in_time_range, open_store, placeholder, release_store,
                      time_kw)
from .values import check_json_value

__all__ = ["MemkernStore", "MemkernNamespaceError", "encode_namespace", "decode_namespace", "PREFIX"]

#: memkern namespaces of LangGraph items start with this label.
PREFIX = "lg"
_SEP = "."
KEY = "__lg_key__"
INDEXED = "__lg_indexed__"
_RESERVED = (KEY, INDEXED)
_CHUNK = 256


class MemkernNamespaceError(MemkernValueError, InvalidNamespaceError):
    """A namespace tuple that cannot be stored (LangGraph's ``InvalidNamespaceError`` too)."""


def _check_labels(namespace: Any, name: str, *, wildcards: bool = False, allow_empty: bool = True) -> tuple:
    if isinstance(namespace, list):
        namespace = tuple(namespace)
    if not isinstance(namespace, tuple):
        raise bad_arg(name, "a tuple of str labels", type(namespace).__name__, MemkernTypeError)
    if not namespace and not allow_empty:
        raise MemkernNamespaceError(f"{name}: expected a non-empty tuple of labels, got ()")
    for i, label in enumerate(namespace):
        if not isinstance(label, str):
            raise MemkernNamespaceError(f"{name}[{i}]: expected a str label, got {type(label).__name__}")
        if not label:
            raise MemkernNamespaceError(f"{name}[{i}]: expected a non-empty label, got ''")
        if _SEP in label or "\x00" in label:
            raise MemkernNamespaceError(f"{name}[{i}]: expected a label without '.' or NUL, got {label!r}")
        if label == "*" and not wildcards:
            pass  # a literal '*' label is fine in a stored namespace
        check_text(label, f"{name}[{i}]")
    return namespace


def encode_namespace(namespace: Sequence[str], name: str = "namespace") -> str:
    """``("users", "alice")`` -> ``"lg.users.alice"`` (labels validated; errors name ``name``)."""
    labels = _check_labels(namespace, name, allow_empty=False)
    return _SEP.join((PREFIX, *labels))


def decode_namespace(ns: str) -> tuple[str, ...] | None:
    """Inverse of :func:`encode_namespace`; ``None`` for a memkern namespace that is not one of
    this adapter's (another prefix, an empty label)."""
    parts = ns.split(_SEP)
    if len(parts) < 2 or parts[0] != PREFIX or any(not p for p in parts[1:]):
        return None
    return tuple(parts[1:])


def _utc(t: float) -> datetime:
    return datetime.fromtimestamp(float(t), tz=timezone.utc)


def _ns_matches(cond: MatchCondition, ns: tuple) -> bool:
    path = tuple(cond.path)
    if len(ns) < len(path):
        return False
    pairs = zip(ns, path) if cond.match_type == "prefix" else zip(reversed(ns), reversed(path))
    return all(p == "*" or p == n for n, p in pairs)


def _check_count(v: Any, name: str, lo: int) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise bad_arg(name, f"an int >= {lo}", type(v).__name__, MemkernTypeError)
    if int(v) < lo:
        raise bad_arg(name, f"an int >= {lo}", int(v))
    return int(v)


class MemkernStore(BaseStore):
    """A LangGraph ``BaseStore`` backed by :class:`memkern.MemoryStore` and an embedder.

    Parameters
    ----------
    store_or_path : MemoryStore (or any memkern store) or str / os.PathLike
        An open store (not closed by :meth:`close`) or a directory to open / create (dim = the
        embedder's, metric ``"ip"``; closed by :meth:`close`).
    embedder : optional
        ``None``: memkern's offline default :class:`memkern.models.Embedder` (MiniLM, 384-d). Or a
        memkern ``Embedder``, a LangChain ``Embeddings``, or a callable ``list[str] -> [n, d]``.
    fields : list of str, optional
        Default index fields of a put (LangGraph path syntax); default ``["$"]`` (the whole value).
    max_workers : int
        Threads of the pool that runs :meth:`abatch`.
    """

    supports_ttl = False

    def __init__(self, store_or_path: Any, embedder: Any = None, *, fields: Sequence[str] | None = None,
                 max_workers: int = 4) -> None:
        self._embed = as_embed_fn(embedder)
        self.fields = self._check_fields(["$"] if fields is None else fields, "fields")
        self._max_workers = _check_count(max_workers, "max_workers", 1)
        self.store, self._owned = open_store(store_or_path, self._embed.dim)
        self._lock = threading.RLock()
        self._pool: ThreadPoolExecutor | None = None
        self._keys: dict[tuple[str, str], int] = {}
        self._load_keys()

    # ------------------------------------------------------------------ lifecycle
    def _load_keys(self) -> None:
        """(memkern namespace, key) -> record id, from the records (the store is the only truth)."""
        for ns in self.store.namespaces():
            if decode_namespace(ns) is None:
                continue
            ids = np.asarray(self.store.ids(ns, include_invalidated=True))
            for s in range(0, len(ids), _CHUNK):
                for r in self.store.get_batch(ids[s:s + _CHUNK]):
                    key = r.meta.get(KEY)
                    if isinstance(key, str):
                        self._keys[(ns, key)] = int(r.id)

    def close(self) -> None:
        """Stop the thread pool; close the store if this object opened it. Idempotent."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        if self._owned:
            self._owned = False
            release_store(self.store)

    def __enter__(self) -> "MemkernStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ validation
    @staticmethod
    def _check_fields(fields: Any, name: str) -> list[str]:
        if isinstance(fields, str) or not isinstance(fields, (list, tuple)):
            raise bad_arg(name, "a list of field paths (str)", type(fields).__name__, MemkernTypeError)
        out = []
        for i, f in enumerate(fields):
            check_text(f, f"{name}[{i}]")
            if not f:
                raise bad_arg(f"{name}[{i}]", "a non-empty field path", f)
            out.append(f)
        return out

    def _check_op(self, op: Any, i: int) -> Any:
        where = f"ops[{i}]"
        if isinstance(op, GetOp):
            ns = encode_namespace(op.namespace, f"{where}.namespace")
            check_text(op.key, f"{where}.key", MAX_ID_CHARS)
            return ("get", ns, op.key)
        if isinstance(op, PutOp):
            ns = encode_namespace(op.namespace, f"{where}.namespace")
            check_text(op.key, f"{where}.key", MAX_ID_CHARS)
            if op.ttl is not None and op.ttl is not NOT_PROVIDED:
                raise bad_arg(f"{where}.ttl", "None (MemkernStore does not expire items)", op.ttl)
            if op.value is None:
                return ("delete", ns, op.key)
            value = op.value
            if not isinstance(value, dict):
                if hasattr(value, "keys") and hasattr(value, "__getitem__"):
                    value = dict(value)
                else:
                    raise bad_arg(f"{where}.value", "a dict (or None to delete)", type(value).__name__, MemkernTypeError)
            check_json_value(value, f"{where}.value")
            for r in _RESERVED:
                if r in value:
                    raise bad_arg(f"{where}.value", f"no reserved key {r!r}", r)
            if op.index is False:
                fields = None
            elif op.index is None:
                fields = self.fields
            else:
                fields = self._check_fields(op.index, f"{where}.index")
            return ("put", ns, op.key, value, fields)
        if isinstance(op, SearchOp):
            prefix = _check_labels(op.namespace_prefix, f"{where}.namespace_prefix")
            tree = F.parse(op.filter, f"{where}.filter")
            limit = _check_count(op.limit, f"{where}.limit", 0)
            offset = _check_count(op.offset, f"{where}.offset", 0)
            if op.query is not None:
                check_text(op.query, f"{where}.query", MAX_QUERY_CHARS)
            return ("search", prefix, tree, limit, offset, op.query or None)
        if isinstance(op, ListNamespacesOp):
            for j, c in enumerate(op.match_conditions or ()):
                if c.match_type not in ("prefix", "suffix"):
                    raise bad_arg(f"{where}.match_conditions[{j}].match_type", "'prefix' or 'suffix'", c.match_type)
                _check_labels(c.path, f"{where}.match_conditions[{j}].path", wildcards=True)
            if op.max_depth is not None:
                _check_count(op.max_depth, f"{where}.max_depth", 1)
            limit = _check_count(op.limit, f"{where}.limit", 0)
            offset = _check_count(op.offset, f"{where}.offset", 0)
            return ("list", tuple(op.match_conditions or ()), op.max_depth, limit, offset)
        raise bad_arg(where, "a GetOp, PutOp, SearchOp or ListNamespacesOp", type(op).__name__, MemkernTypeError)

    # ------------------------------------------------------------------ the batch
    def batch(self, ops: Iterable[Any]) -> list[Any]:
        """Run ``ops`` in order: reads see the state before the batch, then the puts / deletes are
        applied (last one per key wins). Every op is validated first: a bad op raises before any
        read or write."""
        if isinstance(ops, (str, bytes, dict)):
            raise bad_arg("ops", "an iterable of ops", type(ops).__name__, MemkernTypeError)
        try:
            ops = list(ops)
        except TypeError:
            raise bad_arg("ops", "an iterable of ops", type(ops).__name__, MemkernTypeError) from None
        plan = [self._check_op(op, i) for i, op in enumerate(ops)]
        results: list[Any] = [None] * len(plan)
        writes: dict[tuple[str, str], tuple] = {}
        for i, p in enumerate(plan):
            kind = p[0]
            if kind == "get":
                results[i] = self._get(p[1], p[2])
            elif kind == "search":
                results[i] = self._search(*p[1:])
            elif kind == "list":
                results[i] = self._list(*p[1:])
            else:
                writes.pop((p[1], p[2]), None)
                writes[(p[1], p[2])] = p
        if writes:
            self._apply(list(writes.values()))
        return results

    async def abatch(self, ops: Iterable[Any]) -> list[Any]:
        """:meth:`batch` in this store's thread pool."""
        ops = list(ops) if not isinstance(ops, (str, bytes, dict)) else ops
        if self._pool is None:
            with self._lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(self._max_workers, thread_name_prefix="memkern-lg")
        return await asyncio.get_running_loop().run_in_executor(self._pool, self.batch, ops)

    # ------------------------------------------------------------------ reads
    def _item(self, r: Any, cls: type = Item, **extra: Any) -> Any:
        meta = r.meta
        value = {k: v for k, v in meta.items() if k not in _RESERVED}
        ns = decode_namespace(r.namespace)
        return cls(namespace=ns, key=meta[KEY], value=value, created_at=_utc(r.created_at),
                   updated_at=_utc(r.updated_at), **extra)

    def _get(self, ns: str, key: str) -> Item | None:
        rid = self._keys.get((ns, key))
        if rid is None:
            return None
        try:
            return self._item(self.store.get(rid))
        except KeyError:          # deleted by a concurrent batch
            return None

    def _namespaces(self, prefix: tuple) -> list[str]:
        out = []
        for ns in self.store.namespaces():
            t = decode_namespace(ns)
            if t is not None and t[:len(prefix)] == prefix:
                out.append(ns)
        return out

    def _search(self, prefix: tuple, tree: Any, limit: int, offset: int, query: str | None,
                tkw: dict | None = None) -> list[SearchItem]:
        tkw = tkw or {}
        if limit == 0:
            return []
        want = offset + limit
        if query is not None:
            q = self._embed([query], kind="query")[0]
            full = F.node("and", [F.Cond(INDEXED, "eq", True), tree])
            hits = []
            for ns in self._namespaces(prefix):
                ids, scores, recs = F.search(self.store, ns, q, want, full, **tkw)
                hits.extend(zip(scores.tolist(), ids.tolist(), recs))
            hits.sort(key=lambda h: (-h[0], h[1]))
            return [self._item(r, SearchItem, score=float(s)) for s, _, r in hits[offset:want]]
        out: list[SearchItem] = []
        for ns in self._namespaces(prefix):
            ids = np.asarray(self.store.ids(ns))
            for s in range(0, len(ids), _CHUNK):
                for r in self.store.get_batch(ids[s:s + _CHUNK]):
                    if KEY in r.meta and F.matches(tree, r.meta) and in_time_range(r, tkw):
                        out.append(r)
                        if len(out) >= want:
                            return [self._item(x, SearchItem) for x in out[offset:want]]
        return [self._item(x, SearchItem) for x in out[offset:want]]

    def _list(self, conds: tuple, max_depth: int | None, limit: int, offset: int) -> list[tuple]:
        found = set()
        for ns in self.store.namespaces():
            t = decode_namespace(ns)
            if t is None or self.store.count(ns) == 0:
                continue
            if all(_ns_matches(c, t) for c in conds):
                found.add(t[:max_depth] if max_depth is not None else t)
        return sorted(found)[offset:offset + limit]

    # ------------------------------------------------------------------ writes
    def _texts(self, value: dict, fields: list[str] | None) -> list[str]:
        if fields is None:
            return []
        texts: list[str] = []
        for f in fields:
            texts.extend(get_text_at_path(value, f if f == "$" else tokenize_path(f)))
        return texts

    def _apply(self, writes: list[tuple]) -> None:
        """Embed every indexed put in one embedder call, then write (one ``add_batch`` per
        namespace for new keys)."""
        puts = [w for w in writes if w[0] == "put"]
        texts = [self._texts(w[3], w[4]) for w in puts]
        joined = ["\n".join(t) for t in texts]
        todo = [i for i, t in enumerate(texts) if t]
        vecs = self._embed([joined[i] for i in todo], kind="passage") if todo else None
        row = {i: vecs[j] for j, i in enumerate(todo)} if todo else {}
        ph = placeholder(self.store.dim)
        with self._lock:
            new: dict[str, list] = defaultdict(list)
            updates = []
            for i, w in enumerate(puts):
                _, ns, key, value, _ = w
                meta = dict(value)
                meta[KEY] = key
                meta[INDEXED] = i in row
                summary = joined[i] if i in row else json.dumps(value, ensure_ascii=False, sort_keys=True)
                vec = row.get(i, ph)
                rid = self._keys.get((ns, key))
                if rid is not None and rid in self.store:
                    updates.append((rid, dict(summary=summary, embedding=vec, meta=meta)))
                else:
                    new[ns].append((key, summary, vec, meta))
            dels = [(w[1], w[2]) for w in writes if w[0] == "delete" and self._keys.get((w[1], w[2])) is not None]
            groups = list(new.items())
            ids = apply_writes(self.store, updates,
                               [(ns, [s for _, s, _, _ in items], np.stack([v for _, _, v, _ in items]),
                                 [m for _, _, _, m in items]) for ns, items in groups],
                               [self._keys[d] for d in dels if self._keys[d] in self.store])
            for (ns, items), rids in zip(groups, ids):
                for (key, *_), rid in zip(items, rids.tolist()):
                    self._keys[(ns, key)] = int(rid)
            for d in dels:
                self._keys.pop(d, None)

    # ------------------------------------------------------------------ public API with memkern errors
    def put(self, namespace: tuple[str, ...], key: str, value: dict, index: Any = None, *,
            ttl: Any = NOT_PROVIDED) -> None:
        if isinstance(namespace, tuple) and namespace and namespace[0] == "langgraph":
            raise MemkernNamespaceError(f"namespace: expected a root label other than 'langgraph', got {namespace!r}")
        self.batch([PutOp(_check_labels(namespace, "namespace", allow_empty=False), key, value, index=index, ttl=ttl)])

    def get(self, namespace: tuple[str, ...], key: str, *, refresh_ttl: bool | None = None) -> Item | None:
        return self.batch([GetOp(_check_labels(namespace, "namespace", allow_empty=False), key)])[0]

    def delete(self, namespace: tuple[str, ...], key: str) -> None:
        self.batch([PutOp(_check_labels(namespace, "namespace", allow_empty=False), key, None)])

    def _timed_search(self, op: SearchOp, time: dict) -> list[SearchItem]:
        """One search op with the time keywords of :meth:`search` (checked before anything runs)."""
        tkw = time_kw(self.store, **time)
        if "recency" in tkw and op.query is None:
            raise bad_arg("recency", "a search with a query (the prior re-ranks similarity scores)", tkw["recency"])
        plan = self._check_op(op, 0)
        return self._search(*plan[1:], tkw)

    def search(self, namespace_prefix: tuple[str, ...], /, *, query: str | None = None, filter: dict | None = None,
               limit: int = 10, offset: int = 0, refresh_ttl: bool | None = None, time_range: Any = None,
               time_field: str = "event", recency: Any = None, recency_weight: Any = None,
               now: Any = None) -> list[SearchItem]:
        """LangGraph's ``search``, plus the time keywords of the module doc."""
        op = SearchOp(_check_labels(namespace_prefix, "namespace_prefix"), filter, limit, offset, query)
        time = dict(time_range=time_range, time_field=time_field, recency=recency, recency_weight=recency_weight,
                    now=now)
        if time_range is None and recency is None and time_field == "event" and recency_weight is None and now is None:
            return self.batch([op])[0]
        return self._timed_search(op, time)

    def list_namespaces(self, *, prefix: Sequence[str] | None = None, suffix: Sequence[str] | None = None,
                        max_depth: int | None = None, limit: int = 100, offset: int = 0) -> list[tuple[str, ...]]:
        conds = []
        if prefix:
            conds.append(MatchCondition(match_type="prefix", path=_check_labels(prefix, "prefix", wildcards=True)))
        if suffix:
            conds.append(MatchCondition(match_type="suffix", path=_check_labels(suffix, "suffix", wildcards=True)))
        return self.batch([ListNamespacesOp(match_conditions=tuple(conds), max_depth=max_depth, limit=limit,
                                            offset=offset)])[0]

    async def aput(self, namespace: tuple[str, ...], key: str, value: dict, index: Any = None, *,
                   ttl: Any = NOT_PROVIDED) -> None:
        if isinstance(namespace, tuple) and namespace and namespace[0] == "langgraph":
            raise MemkernNamespaceError(f"namespace: expected a root label other than 'langgraph', got {namespace!r}")
        await self.abatch([PutOp(_check_labels(namespace, "namespace", allow_empty=False), key, value, index=index,
                                 ttl=ttl)])

    async def aget(self, namespace: tuple[str, ...], key: str, *, refresh_ttl: bool | None = None) -> Item | None:
        return (await self.abatch([GetOp(_check_labels(namespace, "namespace", allow_empty=False), key)]))[0]

    async def adelete(self, namespace: tuple[str, ...], key: str) -> None:
        await self.abatch([PutOp(_check_labels(namespace, "namespace", allow_empty=False), key, None)])

    async def asearch(self, namespace_prefix: tuple[str, ...], /, *, query: str | None = None,
                      filter: dict | None = None, limit: int = 10, offset: int = 0,
                      refresh_ttl: bool | None = None, time_range: Any = None, time_field: str = "event",
                      recency: Any = None, recency_weight: Any = None, now: Any = None) -> list[SearchItem]:
        """:meth:`search` in this store's thread pool (the same time keywords)."""
        if time_range is None and recency is None and time_field == "event" and recency_weight is None and now is None:
            return (await self.abatch([SearchOp(_check_labels(namespace_prefix, "namespace_prefix"), filter, limit,
                                                offset, query)]))[0]
        if self._pool is None:
            with self._lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(self._max_workers, thread_name_prefix="memkern-lg")
        return await asyncio.get_running_loop().run_in_executor(
            self._pool, functools.partial(self.search, namespace_prefix, query=query, filter=filter, limit=limit,
                                          offset=offset, time_range=time_range, time_field=time_field,
                                          recency=recency, recency_weight=recency_weight, now=now))

    async def alist_namespaces(self, *, prefix: Sequence[str] | None = None, suffix: Sequence[str] | None = None,
                               max_depth: int | None = None, limit: int = 100,
                               offset: int = 0) -> list[tuple[str, ...]]:
        conds = []
        if prefix:
            conds.append(MatchCondition(match_type="prefix", path=_check_labels(prefix, "prefix", wildcards=True)))
        if suffix:
            conds.append(MatchCondition(match_type="suffix", path=_check_labels(suffix, "suffix", wildcards=True)))
        return (await self.abatch([ListNamespacesOp(match_conditions=tuple(conds), max_depth=max_depth, limit=limit,
                                                    offset=offset)]))[0]
