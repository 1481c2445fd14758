"""``MemkernStore``: LangGraph's ``BaseStore`` on a memkern store (see :mod:`memkern.integrations.langgraph`)."""
from __future__ import annotations

import asyncio
import functools
import json
import threading
import time as _time
from collections import defaultdict
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime, timezone
from typing import Any, Iterable, Sequence

import numpy as np

from langgraph.store.base import (
    NOT_PROVIDED,
    BaseStore,
    GetOp,
    Item,
    ListNamespacesOp,
    MatchCondition,
    PutOp,
    SearchItem,
    SearchOp,
    TTLConfig,
)
from langgraph.store.base.embed import get_text_at_path, tokenize_path

from ...errors import MemkernTypeError, bad_arg
from ...base.validate import MAX_ID_CHARS, MAX_QUERY_CHARS
from .. import filters as F
from .._common import (
    apply_writes,
    as_embed_fn,
    check_text,
    in_time_range,
    open_store,
    placeholder,
    release_store,
    time_kw,
)
from ..values import check_json_value
from .namespaces import (EXPIRES, INDEXED, KEY, RESERVED, TTL, UPDATED, MemkernNamespaceError, check_labels,
                         decode_namespace, encode_namespace, ns_matches)
from .query import parse_filter
from .ttl import TTLMixin, check_minutes, check_ttl_config

_CHUNK = 256


def _utc(t: float) -> datetime:
    return datetime.fromtimestamp(float(t), tz=timezone.utc)


def _check_count(v: Any, name: str, lo: int) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise bad_arg(name, f"an int >= {lo}", type(v).__name__, MemkernTypeError)
    if int(v) < lo:
        raise bad_arg(name, f"an int >= {lo}", int(v))
    return int(v)




class MemkernStore(TTLMixin, BaseStore):
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
    ttl : TTLConfig, optional
        LangGraph's TTL settings (``default_ttl``, ``refresh_on_read``, ``sweep_interval_minutes``;
        ``omit_expired`` may only be ``True``): see the module doc.
    clock : callable, optional
        ``() -> unix seconds`` for TTLs (default :func:`time.time`).
    """

    supports_ttl = True

    def __init__(self, store_or_path: Any, embedder: Any = None, *, fields: Sequence[str] | None = None,
                 max_workers: int = 4, ttl: TTLConfig | None = None, clock: Any = None) -> None:
        self.ttl_config = check_ttl_config(ttl)
        if clock is not None and not callable(clock):
            raise bad_arg("clock", "a callable () -> unix seconds", type(clock).__name__, MemkernTypeError)
        self._clock = clock or _time.time
        self._embed = as_embed_fn(embedder)
        self.fields = self._check_fields(["$"] if fields is None else fields, "fields")
        self._max_workers = _check_count(max_workers, "max_workers", 1)
        self.store, self._owned = open_store(store_or_path, self._embed.dim)
        self._lock = threading.RLock()
        self._pool: ThreadPoolExecutor | None = None
        self._keys: dict[tuple[str, str], int] = {}
        # TTL items: rid -> [namespace, key, minutes, exact expiry, stored expiry]
        self._ttl: dict[int, list] = {}
        self._heap: list[tuple[float, int]] = []      # (time, rid): one live entry per tracked rid, time <= expiry
        self._heap_t: dict[int, float] = {}
        self._expired: set[int] = set()
        self._sweeper: threading.Thread | None = None
        self._sweep_stop = threading.Event()
        self._sweep_future: Future | None = None
        self._load_keys()
        if self.ttl_config and self.ttl_config.get("sweep_interval_minutes"):
            self.start_ttl_sweeper()

    # ------------------------------------------------------------------ lifecycle
    def _load_keys(self) -> None:
        """(memkern namespace, key) -> record id and the TTLs, from the records (the store is the
        only truth)."""
        for ns in self.store.namespaces():
            if decode_namespace(ns) is None:
                continue
            ids = np.asarray(self.store.ids(ns, include_invalidated=True))
            for s in range(0, len(ids), _CHUNK):
                for r in self.store.get_batch(ids[s:s + _CHUNK]):
                    key = r.meta.get(KEY)
                    if isinstance(key, str):
                        self._keys[(ns, key)] = int(r.id)
                        if r.meta.get(TTL) is not None:
                            e = float(r.meta[EXPIRES])
                            self._track(int(r.id), ns, key, float(r.meta[TTL]), e, e)

    def close(self) -> None:
        """Stop the TTL sweeper and the thread pool; close the store if this object opened it.
        Idempotent."""
        self.stop_ttl_sweeper()
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

    @staticmethod
    def _check_refresh(v: Any, name: str) -> bool:
        if not isinstance(v, bool):
            raise bad_arg(name, "True or False", v, MemkernTypeError)
        return v

    def _check_op(self, op: Any, i: int) -> Any:
        where = f"ops[{i}]"
        if isinstance(op, GetOp):
            ns = encode_namespace(op.namespace, f"{where}.namespace")
            check_text(op.key, f"{where}.key", MAX_ID_CHARS)
            return ("get", ns, op.key, self._check_refresh(op.refresh_ttl, f"{where}.refresh_ttl"))
        if isinstance(op, PutOp):
            ns = encode_namespace(op.namespace, f"{where}.namespace")
            check_text(op.key, f"{where}.key", MAX_ID_CHARS)
            if op.value is None:
                return ("delete", ns, op.key)
            ttl = op.ttl
            if ttl is NOT_PROVIDED:
                ttl = (self.ttl_config or {}).get("default_ttl")
            ttl = check_minutes(ttl, f"{where}.ttl")
            value = op.value
            if not isinstance(value, dict):
                if hasattr(value, "keys") and hasattr(value, "__getitem__"):
                    value = dict(value)
                else:
                    raise bad_arg(f"{where}.value", "a dict (or None to delete)", type(value).__name__, MemkernTypeError)
            check_json_value(value, f"{where}.value")
            for r in RESERVED:
                if r in value:
                    raise bad_arg(f"{where}.value", f"no reserved key {r!r}", r)
            if op.index is False:
                fields = None
            elif op.index is None:
                fields = self.fields
            else:
                fields = self._check_fields(op.index, f"{where}.index")
            return ("put", ns, op.key, value, fields, ttl)
        if isinstance(op, SearchOp):
            prefix = check_labels(op.namespace_prefix, f"{where}.namespace_prefix")
            tree = parse_filter(op.filter, f"{where}.filter")
            limit = _check_count(op.limit, f"{where}.limit", 0)
            offset = _check_count(op.offset, f"{where}.offset", 0)
            if op.query is not None:
                check_text(op.query, f"{where}.query", MAX_QUERY_CHARS)
            refresh = self._check_refresh(op.refresh_ttl, f"{where}.refresh_ttl")
            return ("search", prefix, tree, limit, offset, op.query or None, refresh)
        if isinstance(op, ListNamespacesOp):
            for j, c in enumerate(op.match_conditions or ()):
                if c.match_type not in ("prefix", "suffix"):
                    raise bad_arg(f"{where}.match_conditions[{j}].match_type", "'prefix' or 'suffix'", c.match_type)
                check_labels(c.path, f"{where}.match_conditions[{j}].path", wildcards=True)
            if op.max_depth is not None:
                _check_count(op.max_depth, f"{where}.max_depth", 1)
            limit = _check_count(op.limit, f"{where}.limit", 0)
            offset = _check_count(op.offset, f"{where}.offset", 0)
            return ("list", tuple(op.match_conditions or ()), op.max_depth, limit, offset)
        raise bad_arg(where, "a GetOp, PutOp, SearchOp or ListNamespacesOp", type(op).__name__, MemkernTypeError)

    # ------------------------------------------------------------------ the batch
    def batch(self, ops: Iterable[Any]) -> list[Any]:
        """Run ``ops`` in order: reads see the state before the batch (refreshing the TTLs of what
        they return), then the puts / deletes are applied (last one per key wins). Every op is
        validated first: a bad op raises before any read or write."""
        if isinstance(ops, (str, bytes, dict)):
            raise bad_arg("ops", "an iterable of ops", type(ops).__name__, MemkernTypeError)
        try:
            ops = list(ops)
        except TypeError:
            raise bad_arg("ops", "an iterable of ops", type(ops).__name__, MemkernTypeError) from None
        return self._run([self._check_op(op, i) for i, op in enumerate(ops)])

    def _run(self, plan: list[tuple], tkw: dict | None = None) -> list[Any]:
        view = self._view()
        results: list[Any] = [None] * len(plan)
        writes: dict[tuple[str, str], tuple] = {}
        touched: list[int] = []
        for i, p in enumerate(plan):
            kind = p[0]
            if kind == "get":
                item, rid = self._get(p[1], p[2], view)
                results[i] = item
                if p[3] and rid is not None:
                    touched.append(rid)
            elif kind == "search":
                items, rids = self._search(*p[1:6], tkw, view)
                results[i] = items
                if p[6]:
                    touched.extend(rids)
            elif kind == "list":
                results[i] = self._list(*p[1:], view)
            else:
                writes.pop((p[1], p[2]), None)
                writes[(p[1], p[2])] = p
        touched = [rid for rid in touched if rid in self._ttl]
        if touched:
            self._refresh(touched, view[0])
        if writes:
            self._apply(list(writes.values()), view[0])
        return results

    async def abatch(self, ops: Iterable[Any]) -> list[Any]:
        """:meth:`batch` in this store's thread pool."""
        ops = list(ops) if not isinstance(ops, (str, bytes, dict)) else ops
        return await asyncio.get_running_loop().run_in_executor(self._executor(), self.batch, ops)

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            with self._lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(self._max_workers, thread_name_prefix="memkern-lg")
        return self._pool

    # ------------------------------------------------------------------ reads
    def _item(self, r: Any, cls: type = Item, **extra: Any) -> Any:
        meta = r.meta
        value = {k: v for k, v in meta.items() if k not in RESERVED}
        ns = decode_namespace(r.namespace)
        return cls(namespace=ns, key=meta[KEY], value=value, created_at=_utc(r.created_at),
                   updated_at=_utc(meta.get(UPDATED, r.updated_at)), **extra)

    def _get(self, ns: str, key: str, view: tuple) -> tuple[Item | None, int | None]:
        rid = self._keys.get((ns, key))
        if rid is None or rid in view[1]:
            return None, None
        try:
            return self._item(self.store.get(rid)), rid
        except KeyError:          # deleted by a concurrent batch
            return None, None

    def _namespaces(self, prefix: tuple) -> list[str]:
        out = []
        for ns in self.store.namespaces():
            t = decode_namespace(ns)
            if t is not None and t[:len(prefix)] == prefix:
                out.append(ns)
        return out

    def _search(self, prefix: tuple, tree: Any, limit: int, offset: int, query: str | None,
                tkw: dict | None, view: tuple) -> tuple[list[SearchItem], list[int]]:
        tkw = tkw or {}
        if limit == 0:
            return [], []
        _, expired, per_ns = view
        want = offset + limit
        if query is not None:
            q = self._embed([query], kind="query")[0]
            full = F.node("and", [F.Cond(INDEXED, "eq", True), tree])
            hits = []
            for ns in self._namespaces(prefix):
                # ask for as many more as this namespace holds expired items, then drop them
                ids, scores, recs = F.search(self.store, ns, q, want + per_ns.get(ns, 0), full, **tkw)
                hits.extend(h for h in zip(scores.tolist(), ids.tolist(), recs) if h[1] not in expired)
            hits.sort(key=lambda h: (-h[0], h[1]))
            page = hits[offset:want]
            return [self._item(r, SearchItem, score=float(s)) for s, _, r in page], [rid for _, rid, _ in page]
        out: list[Any] = []
        for ns in self._namespaces(prefix):
            ids = np.asarray(self.store.ids(ns))
            if per_ns.get(ns):
                ids = ids[~np.isin(ids, np.fromiter(expired, np.int64, len(expired)))]
            for s in range(0, len(ids), _CHUNK):
                for r in self.store.get_batch(ids[s:s + _CHUNK]):
                    if KEY in r.meta and F.matches(tree, r.meta) and in_time_range(r, tkw):
                        out.append(r)
                        if len(out) >= want:
                            break
                if len(out) >= want:
                    break
            if len(out) >= want:
                break
        page = out[offset:want]
        return [self._item(x, SearchItem) for x in page], [int(x.id) for x in page]

    def _list(self, conds: tuple, max_depth: int | None, limit: int, offset: int, view: tuple) -> list[tuple]:
        per_ns = view[2]
        found = set()
        for ns in self.store.namespaces():
            t = decode_namespace(ns)
            if t is None or self.store.count(ns) <= per_ns.get(ns, 0):
                continue
            if all(ns_matches(c, t) for c in conds):
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

    def _apply(self, writes: list[tuple], now: float) -> None:
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
            after: list[tuple] = []          # (ns, key, ttl minutes, expiry) per put, for the TTL books
            for i, w in enumerate(puts):
                _, ns, key, value, _, ttl = w
                meta = dict(value)
                meta[KEY] = key
                meta[INDEXED] = i in row
                if ttl is not None:
                    meta[TTL] = ttl
                    meta[EXPIRES] = now + ttl * 60.0
                after.append((ns, key, ttl, meta.get(EXPIRES)))
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
            for ns, key, ttl, exp in after:
                rid = self._keys[(ns, key)]
                if ttl is None:
                    self._untrack(rid)
                else:
                    self._track(rid, ns, key, ttl, exp, exp)
            for d in dels:
                rid = self._keys.pop(d, None)
                if rid is not None:
                    self._untrack(rid)

    # ------------------------------------------------------------------ public API with memkern errors
    def put(self, namespace: tuple[str, ...], key: str, value: dict, index: Any = None, *,
            ttl: Any = NOT_PROVIDED) -> None:
        if isinstance(namespace, tuple) and namespace and namespace[0] == "langgraph":
            raise MemkernNamespaceError(f"namespace: expected a root label other than 'langgraph', got {namespace!r}")
        self.batch([PutOp(check_labels(namespace, "namespace", allow_empty=False), key, value, index=index, ttl=ttl)])

    def get(self, namespace: tuple[str, ...], key: str, *, refresh_ttl: bool | None = None) -> Item | None:
        return self.batch([GetOp(check_labels(namespace, "namespace", allow_empty=False), key,
                                 self._refresh_default(refresh_ttl))])[0]

    def delete(self, namespace: tuple[str, ...], key: str) -> None:
        self.batch([PutOp(check_labels(namespace, "namespace", allow_empty=False), key, None)])

    def _timed_search(self, op: SearchOp, time: dict) -> list[SearchItem]:
        """One search op with the time keywords of :meth:`search` (checked before anything runs)."""
        tkw = time_kw(self.store, **time)
        if "recency" in tkw and op.query is None:
            raise bad_arg("recency", "a search with a query (the prior re-ranks similarity scores)", tkw["recency"])
        return self._run([self._check_op(op, 0)], tkw)[0]

    def search(self, namespace_prefix: tuple[str, ...], /, *, query: str | None = None, filter: dict | None = None,
               limit: int = 10, offset: int = 0, refresh_ttl: bool | None = None, time_range: Any = None,
               time_field: str = "event", recency: Any = None, recency_weight: Any = None,
               now: Any = None) -> list[SearchItem]:
        """LangGraph's ``search``, plus the time keywords of the module doc."""
        op = SearchOp(check_labels(namespace_prefix, "namespace_prefix"), filter, limit, offset, query,
                      self._refresh_default(refresh_ttl))
        time = dict(time_range=time_range, time_field=time_field, recency=recency, recency_weight=recency_weight,
                    now=now)
        if time_range is None and recency is None and time_field == "event" and recency_weight is None and now is None:
            return self.batch([op])[0]
        return self._timed_search(op, time)

    def list_namespaces(self, *, prefix: Sequence[str] | None = None, suffix: Sequence[str] | None = None,
                        max_depth: int | None = None, limit: int = 100, offset: int = 0) -> list[tuple[str, ...]]:
        conds = []
        if prefix:
            conds.append(MatchCondition(match_type="prefix", path=check_labels(prefix, "prefix", wildcards=True)))
        if suffix:
            conds.append(MatchCondition(match_type="suffix", path=check_labels(suffix, "suffix", wildcards=True)))
        return self.batch([ListNamespacesOp(match_conditions=tuple(conds), max_depth=max_depth, limit=limit,
                                            offset=offset)])[0]

    async def aput(self, namespace: tuple[str, ...], key: str, value: dict, index: Any = None, *,
                   ttl: Any = NOT_PROVIDED) -> None:
        if isinstance(namespace, tuple) and namespace and namespace[0] == "langgraph":
            raise MemkernNamespaceError(f"namespace: expected a root label other than 'langgraph', got {namespace!r}")
        await self.abatch([PutOp(check_labels(namespace, "namespace", allow_empty=False), key, value, index=index,
                                 ttl=ttl)])

    async def aget(self, namespace: tuple[str, ...], key: str, *, refresh_ttl: bool | None = None) -> Item | None:
        return (await self.abatch([GetOp(check_labels(namespace, "namespace", allow_empty=False), key,
                                         self._refresh_default(refresh_ttl))]))[0]

    async def adelete(self, namespace: tuple[str, ...], key: str) -> None:
        await self.abatch([PutOp(check_labels(namespace, "namespace", allow_empty=False), key, None)])

    async def asearch(self, namespace_prefix: tuple[str, ...], /, *, query: str | None = None,
                      filter: dict | None = None, limit: int = 10, offset: int = 0,
                      refresh_ttl: bool | None = None, time_range: Any = None, time_field: str = "event",
                      recency: Any = None, recency_weight: Any = None, now: Any = None) -> list[SearchItem]:
        """:meth:`search` in this store's thread pool (the same time keywords)."""
        return await asyncio.get_running_loop().run_in_executor(
            self._executor(), functools.partial(self.search, namespace_prefix, query=query, filter=filter,
                                                limit=limit, offset=offset, refresh_ttl=refresh_ttl,
                                                time_range=time_range, time_field=time_field, recency=recency,
                                                recency_weight=recency_weight, now=now))

    async def alist_namespaces(self, *, prefix: Sequence[str] | None = None, suffix: Sequence[str] | None = None,
                               max_depth: int | None = None, limit: int = 100,
                               offset: int = 0) -> list[tuple[str, ...]]:
        return await asyncio.get_running_loop().run_in_executor(
            self._executor(), functools.partial(self.list_namespaces, prefix=prefix, suffix=suffix,
                                                max_depth=max_depth, limit=limit, offset=offset))

