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
store's score, i.e. cosine for the default normalised embedder; no query: oldest first).

Filters (:func:`parse_filter`): plain values and LangGraph's operators ``$eq $ne $gt $gte $lt $lte``
mean what they mean in LangGraph's ``InMemoryStore``: a missing key reads as ``None``, equality is
Python's (``1 == 1.0 == True``), a dict value matches a sub-dict holding its keys (operators may
sit at any depth), a list matches element-wise, ``$gt`` / ``$gte`` / ``$lt`` / ``$lte`` compare
``float(value)`` with ``float(operand)`` (numbers, bools, numeric strings). Where ``InMemoryStore``
raises (``float()`` of a missing, non-numeric or nested value) the item does not match, as in a
database-backed store. memkern adds ``$in $nin $contains $exists`` (per key) and ``$and $or $not``
with the semantics of :mod:`memkern.integrations.filters`. Equality with a str is pushed into the
store's own filtered search; the rest is evaluated on the records. ``batch`` reads against the state before the
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

TTL (``supports_ttl``): ``put(..., ttl=minutes)`` (``None``: never expires; not given: the
``default_ttl`` of the ``ttl=`` :class:`TTLConfig` of the constructor) makes an item expire that
many minutes after its last write or read; ``get`` / ``search`` with ``refresh_ttl`` (default:
``refresh_on_read``, itself default ``True``) restart its clock. An expired item is never returned
by ``get`` / ``search`` nor counted by ``list_namespaces``; :meth:`MemkernStore.sweep_ttl` deletes
the expired items from the memkern store, and :meth:`MemkernStore.start_ttl_sweeper` (started by
the constructor when the config has ``sweep_interval_minutes``) runs it in a thread until
:meth:`MemkernStore.stop_ttl_sweeper` or :meth:`MemkernStore.close`. The TTL and expiry live in the
record's ``meta`` (keys ``"__lg_ttl__"``, ``"__lg_expires__"``), so they survive a reopen. A read
that refreshes keeps the exact expiry in memory and rewrites the record only when its stored expiry
falls behind, then storing ``REFRESH_SLACK`` (a tenth of the TTL) more: one write per item per tenth
of its TTL at most; after a reopen an item may so live up to a tenth of its TTL longer, never less.
Such a rewrite keeps ``Item.updated_at`` (kept in ``"__lg_updated__"``); the memkern record's own
``updated_at`` (``time_field="updated"``) is that of the rewrite.

Errors: bad namespaces raise :class:`MemkernNamespaceError` (both a
:class:`memkern.MemkernValueError` and LangGraph's ``InvalidNamespaceError``); every other bad
argument raises the memkern error the Python API raises, naming the argument.
"""
from __future__ import annotations

import asyncio
import functools
import heapq
import json
import logging
import math
import threading
import time as _time
from collections import defaultdict
from concurrent.futures import Future, ThreadPoolExecutor
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
        TTLConfig,
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

__all__ = ["MemkernStore", "MemkernNamespaceError", "encode_namespace", "decode_namespace", "parse_filter",
           "PREFIX", "REFRESH_SLACK"]

_log = logging.getLogger(__name__)

#: memkern namespaces of LangGraph items start with this label.
PREFIX = "lg"
_SEP = "."
KEY = "__lg_key__"
INDEXED = "__lg_indexed__"
TTL = "__lg_ttl__"            # minutes
EXPIRES = "__lg_expires__"    # unix seconds (durable; >= the exact expiry)
UPDATED = "__lg_updated__"    # the last value write, kept across a TTL refresh rewrite
_RESERVED = (KEY, INDEXED, TTL, EXPIRES, UPDATED)
#: A refresh that rewrites a record stores an expiry this fraction of the TTL past the exact one.
REFRESH_SLACK = 0.1
_TTL_KEYS = ("refresh_on_read", "default_ttl", "sweep_interval_minutes", "omit_expired")
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


def _check_minutes(v: Any, name: str, *, none_ok: bool = True) -> float | None:
    """A positive finite number of minutes (``None`` where allowed)."""
    if v is None and none_ok:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise bad_arg(name, "a positive number of minutes" + (" or None" if none_ok else ""), type(v).__name__,
                      MemkernTypeError)
    if not math.isfinite(float(v)) or float(v) <= 0:
        raise bad_arg(name, "a positive finite number of minutes", v)
    return float(v)


def _check_ttl_config(ttl: Any) -> dict | None:
    if ttl is None:
        return None
    if not isinstance(ttl, dict):
        raise bad_arg("ttl", "a TTLConfig dict or None", type(ttl).__name__, MemkernTypeError)
    for k in ttl:
        if k not in _TTL_KEYS:
            raise bad_arg("ttl", f"TTLConfig keys among {list(_TTL_KEYS)}", k)
    for k in ("refresh_on_read", "omit_expired"):
        if k in ttl and not isinstance(ttl[k], bool):
            raise bad_arg(f"ttl[{k!r}]", "True or False", ttl[k], MemkernTypeError)
    if ttl.get("omit_expired") is False:
        raise bad_arg("ttl['omit_expired']", "True (expired items are never returned)", False)
    _check_minutes(ttl.get("default_ttl"), "ttl['default_ttl']")
    _check_minutes(ttl.get("sweep_interval_minutes"), "ttl['sweep_interval_minutes']")
    return TTLConfig(**ttl)


# ------------------------------------------------------------------------------- the filter grammar
_LG_OPS = ("$eq", "$ne", "$gt", "$gte", "$lt", "$lte")
_EXT_OPS = {"$in": "in", "$nin": "nin", "$contains": "contains", "$exists": "exists"}
_ORDER = {"$gt": float.__gt__, "$gte": float.__ge__, "$lt": float.__lt__, "$lte": float.__le__}


def _is_ops(d: dict) -> bool:
    return any(isinstance(k, str) and k.startswith("$") for k in d)


def _check_operand(want: Any, where: str) -> None:
    """Refuse, before anything runs, what InMemoryStore would raise on: an unknown operator at any
    depth, an order operand ``float()`` does not take."""
    if isinstance(want, dict):
        if _is_ops(want):
            for o, w in want.items():
                if o not in _LG_OPS:
                    raise bad_arg(where, f"an operator in {list(_LG_OPS)}", o)
                if o in _ORDER:
                    try:
                        if isinstance(w, bool):
                            raise TypeError
                        float(w)
                    except (TypeError, ValueError, OverflowError):
                        raise bad_arg(f"{where}[{o!r}]", "a number or numeric str", w, MemkernTypeError) from None
                else:
                    _check_operand(w, f"{where}[{o!r}]")
        else:
            for k, w in want.items():
                _check_operand(w, f"{where}[{k!r}]")
    elif isinstance(want, (list, tuple)):
        for i, w in enumerate(want):
            _check_operand(w, f"{where}[{i}]")


def _lg_op(have: Any, op: str, want: Any) -> bool:
    if op == "$eq":
        return have == want
    if op == "$ne":
        return have != want
    try:
        a, b = float(have), float(want)
    except (TypeError, ValueError, OverflowError):
        return False
    return _ORDER[op](a, b)


def _lg_match(have: Any, want: Any) -> bool:
    """``have`` (a value, ``None`` when missing) against a LangGraph filter value ``want``."""
    if isinstance(want, dict):
        if _is_ops(want):
            return all(_lg_op(have, o, w) for o, w in want.items())
        return isinstance(have, dict) and all(_lg_match(have.get(k), w) for k, w in want.items())
    if isinstance(want, (list, tuple)):
        return (isinstance(have, (list, tuple)) and len(have) == len(want)
                and all(_lg_match(h, w) for h, w in zip(have, want)))
    return have == want


def _key_pred(key: str, want: Any) -> F.Pred:
    return F.Pred(lambda meta: _lg_match(meta.get(key), want), f"{key}: {want!r}")


def parse_filter(filter: Any, name: str = "filter", _depth: int = 0) -> Any:
    """A LangGraph ``search`` filter (module doc) -> the tree :func:`memkern.integrations.filters.search`
    evaluates; bad filters raise naming ``name`` and the key."""
    F.check_depth(_depth, name)
    if filter is None:
        return None
    if not isinstance(filter, dict):
        raise bad_arg(name, "a dict or None", type(filter).__name__, MemkernTypeError)
    parts: list[Any] = []
    for key, v in filter.items():
        if not isinstance(key, str):
            raise bad_arg(name, "str keys", f"key {key!r}", MemkernTypeError)
        where = f"{name}[{key!r}]"
        if key in ("$and", "$or"):
            if isinstance(v, (str, dict)) or not isinstance(v, (list, tuple)):
                raise bad_arg(where, "a list of filters", type(v).__name__, MemkernTypeError)
            parts.append(F.node(key[1:], [parse_filter(f, f"{where}[{i}]", _depth + 1) for i, f in enumerate(v)]))
            continue
        if key == "$not":
            parts.append(F.node("not", [parse_filter(v, where, _depth + 1)]))
            continue
        if key.startswith("$"):
            raise bad_arg(name, "'$and', '$or', '$not' or a value key", key)
        if key in _RESERVED:
            raise bad_arg(name, "a value key (not one of the adapter's reserved keys)", key)
        check_json_value(v, where)
        if isinstance(v, dict) and _is_ops(v):
            for o, operand in v.items():
                if o in _EXT_OPS:
                    parts.append(F.cond(key, _EXT_OPS[o], operand, name))
                elif o not in _LG_OPS:
                    raise bad_arg(where, f"an operator in {list(_LG_OPS) + list(_EXT_OPS)}", o)
                elif o == "$eq" and isinstance(operand, str) and key:
                    parts.append(F.Cond(key, "eq", operand))            # str == str: the store's own filter
                else:
                    _check_operand({o: operand}, where)
                    parts.append(_key_pred(key, {o: operand}))
        elif isinstance(v, str) and key:
            parts.append(F.Cond(key, "eq", v))
        else:
            _check_operand(v, where)
            parts.append(_key_pred(key, v))
    return F.node("and", parts)


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
    ttl : TTLConfig, optional
        LangGraph's TTL settings (``default_ttl``, ``refresh_on_read``, ``sweep_interval_minutes``;
        ``omit_expired`` may only be ``True``): see the module doc.
    clock : callable, optional
        ``() -> unix seconds`` for TTLs (default :func:`time.time`).
    """

    supports_ttl = True

    def __init__(self, store_or_path: Any, embedder: Any = None, *, fields: Sequence[str] | None = None,
                 max_workers: int = 4, ttl: TTLConfig | None = None, clock: Any = None) -> None:
        self.ttl_config = _check_ttl_config(ttl)
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
        interval = _check_minutes(sweep_interval_minutes, "sweep_interval_minutes")
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

    def _refresh_default(self, refresh_ttl: bool | None) -> bool:
        if refresh_ttl is not None:
            return refresh_ttl
        return (self.ttl_config or {}).get("refresh_on_read", True)

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
            ttl = _check_minutes(ttl, f"{where}.ttl")
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
            return ("put", ns, op.key, value, fields, ttl)
        if isinstance(op, SearchOp):
            prefix = _check_labels(op.namespace_prefix, f"{where}.namespace_prefix")
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
                _check_labels(c.path, f"{where}.match_conditions[{j}].path", wildcards=True)
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
        value = {k: v for k, v in meta.items() if k not in _RESERVED}
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
        self.batch([PutOp(_check_labels(namespace, "namespace", allow_empty=False), key, value, index=index, ttl=ttl)])

    def get(self, namespace: tuple[str, ...], key: str, *, refresh_ttl: bool | None = None) -> Item | None:
        return self.batch([GetOp(_check_labels(namespace, "namespace", allow_empty=False), key,
                                 self._refresh_default(refresh_ttl))])[0]

    def delete(self, namespace: tuple[str, ...], key: str) -> None:
        self.batch([PutOp(_check_labels(namespace, "namespace", allow_empty=False), key, None)])

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
        op = SearchOp(_check_labels(namespace_prefix, "namespace_prefix"), filter, limit, offset, query,
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
        return (await self.abatch([GetOp(_check_labels(namespace, "namespace", allow_empty=False), key,
                                         self._refresh_default(refresh_ttl))]))[0]

    async def adelete(self, namespace: tuple[str, ...], key: str) -> None:
        await self.abatch([PutOp(_check_labels(namespace, "namespace", allow_empty=False), key, None)])

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
