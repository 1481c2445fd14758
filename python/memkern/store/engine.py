"""The persistent memory store: topic records + one vector index per namespace (C++, ``memkern._store``).

``MemoryStore`` is an embedded store opened on a directory (like SQLite). Every write goes to a
write-ahead log (length + CRC32 + sync watermark per entry, format version in the header) before it
is applied; periodic snapshots (the namespaces changed since the last one, packed into one file,
plus the graphs of large namespaces), written by a background thread while calls go on, bound the
log; reopening loads the last snapshot and replays the log. One process at a time may open a store
(a ``LOCK`` file); within that process any number of threads may read while one writes. The
store's folders are created 0700 and its files 0600.

Scores are "higher is better" for every metric:

* ``"ip"``: the inner product ``<q, x>``;
* ``"cos"``: the cosine similarity (vectors are L2-normalised when stored, so
  :meth:`MemoryStore.embeddings` returns unit vectors);
* ``"l2"``: the negative squared distance ``-||q - x||^2``.

Padding: when fewer than ``k`` records match, ids are ``-1`` and scores are :data:`PAD_SCORE`, the
lowest finite float32 (``-3.4028235e38``): finite, never NaN, and below every real score.

Dtypes (the issue's rule "convert where lossless, refuse otherwise"): stored embeddings are float32.
float32 is taken as is, float16 / bfloat16 are widened (lossless); float64 is accepted only when
every value is exactly representable in float32, otherwise :class:`~memkern.MemkernTypeError` asks
for an explicit ``.astype(np.float32)``. Integer, bool and complex arrays are refused. Queries to
:meth:`MemoryStore.search` are never stored, so float64 queries are rounded to float32 (what the
index computes with anyway). Non-contiguous arrays are copied. NaN / inf values are refused.

Indexes: each namespace (and level) starts as an exact index (a flat scan, exact results) and is
promoted to an HNSW graph on the add that takes it past ``flat_limit`` records (default 1,024, where
the graph starts to search faster than a scan); :meth:`MemoryStore.compact` demotes graphs that
shrank to ``flat_limit`` or fewer. Memory grows with the records: a namespace of 20 records costs
its vectors plus ~8 kB (not the ~2.7 MB of a preallocated graph), graphs grow geometrically and are
shrunk to fit when a store is opened.

Limits (checked before anything is allocated; the native layer checks them again): ``k``, ``ef``
and ``candidates`` at most :data:`MAX_K` (2**20), ``B * k`` at most :data:`MAX_RESULTS`; stored
vectors and queries have an L2 norm of at most :data:`MAX_NORM` (1e18), so every score is finite;
``|alpha|`` at most :data:`MAX_ALPHA`; ``meta`` and turn dicts have str keys and nest at most
:data:`MAX_JSON_DEPTH` deep; text is valid UTF-8 (no lone surrogates); ids are ``0..2**63-1``.

Two-level memory: ``add``/``add_batch``/``merge`` take optional ``turn_embeddings`` (one row per
turn); each turn is then also stored as its own *turn record* (same namespace, separate index
level) linked to its topic (``Record.topic_id``; the topic's ``Record.turn_ids``). ``search(...,
level="turn")`` searches turns, ``level="turn+topic"`` scores each turn as
``sim(q, turn) + alpha * sim(q, its topic)``. Deleting / invalidating a topic deletes / invalidates
its turns.
"""
from __future__ import annotations

import json
import logging
import math
import os
import struct
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from . import reference as _lexical
from ..errors import MemkernKeyError, MemkernTypeError, MemkernValueError, StoreCorruptedError, bad_arg
from ..base.turns import turn_key
from ..base.validate import (MAX_JSON_DEPTH, MAX_NAMESPACE_CHARS, MAX_QUERY_CHARS, MAX_TIME, MIN_TIME,  # noqa: F401
                       MAX_TEXT_CHARS, _short, check_choice, check_float, check_int, check_json, check_namespace_str,
                       check_text,
                       check_time, check_turn, check_utf8, is_int, json_text)
from ..base.telemetry import traced

logger = logging.getLogger("memkern")

__all__ = ["MemoryStore", "Record", "PAD_SCORE", "default_store_path", "check_search_filters"]

#: Score written beside a ``-1`` padding id: the lowest finite float32.
PAD_SCORE: float = float(np.finfo(np.float32).min)

#: Default beam width of a search (``ef``); ``max(ef, k)`` is used. Measured: recall@10 >= 0.95
#: against exact search on clustered 384-d data with M=16, ef_construction=200 (tests/test_store.py
#: and bench/bench_store.py check it).
DEFAULT_EF_SEARCH = 128

#: Largest ``k`` / ``ef`` / ``candidates`` of a search, and largest ``B * k`` (result slots) of one
#: call; the native store checks the same limits (``memkern._store.Store.max_k`` etc.).
MAX_K = 1 << 20
MAX_EF = 1 << 20
MAX_CANDIDATES = 1 << 20
MAX_RESULTS = 1 << 26
#: Largest L2 norm of a stored embedding or a query: scores then stay finite in float32.
MAX_NORM = 1e18
#: Largest ``|alpha|`` of a ``level="turn+topic"`` search (keeps its scores finite).
MAX_ALPHA = 100.0
#: Deepest nesting of ``meta`` / turn dicts: :data:`memkern.base.validate.MAX_JSON_DEPTH` (imported above).
#: Default of ``flat_limit``: namespaces (per level) up to this many records are searched by exact scan.
DEFAULT_FLAT_LIMIT = 1024
_MAX_ID = (1 << 63) - 1

#: Largest query text of a lexical / hybrid search (characters): :data:`memkern.base.validate.MAX_QUERY_CHARS`.
MAX_QUERY_TEXT = MAX_QUERY_CHARS
#: Largest filter: keys, values over all keys, and characters of one key or string value.
MAX_FILTER_KEYS = 64
MAX_FILTER_VALUES = 4096
MAX_FILTER_STR = 4096
#: Times (``time_range`` / ``now`` / ``event_time``) are unix seconds in ``[MIN_TIME, MAX_TIME]``
#: (:data:`memkern.base.validate.MIN_TIME` / :data:`~memkern.base.validate.MAX_TIME`: years 1-9999 UTC,
#: imported above); a recency half-life is at most ``MAX_TIME`` seconds.
#: Default and largest |weight| of the recency prior.
DEFAULT_RECENCY_WEIGHT = 0.1
MAX_RECENCY_WEIGHT = 1e6
_MODES = {"dense": 0, "lexical": 1, "hybrid": 2}
_FUSIONS = _lexical.FUSIONS
_TIME_FIELDS = {"event": 0, "created": 1, "updated": 2}
_LEVELS = {"topic": 0, "turn": 1}
_METRICS = ("ip", "l2", "cos")
_FSYNC = ("always", "batch", "never")


from ..base.paths import default_store_path  # noqa: E402  (the one definition; re-exported here)


def _native():
    from .. import _store

    return _store


def _level(name: str) -> Any:
    """The native ``Level`` of a level name already checked to be in ``_LEVELS`` (its values
    are the enum's integer values)."""
    return getattr(_native().Level, name)


# ----------------------------------------------------------------------------------- records


@dataclass(frozen=True)
class Record:
    """One version of a memory record (what :meth:`MemoryStore.get` and ``history`` return).

    Attributes
    ----------
    id : int
        Record id (int64, unique in the store; never reused).
    namespace : str
        The user / agent key the record belongs to.
    summary : str
        Topic summary (for a turn record: its text, what lexical search matches: the
        ``turn_texts`` entry it was written with, else the turn's ``content``).
    turns : list[dict]
        The raw dialogue turns (``role``, ``content`` and any extra keys, as given).
    meta : dict
        Free JSON-compatible metadata.
    version : int
        1 for a new record, +1 for each ``merge`` / ``update``.
    status : str
        ``"active"`` or ``"invalidated"`` (the record's current status, also on older versions).
    created_at, updated_at : float
        Unix times (seconds) of the first version and of this version.
    event_time : float or None
        The conversation's own time of the record (unix seconds, e.g. the session date), as given
        to ``add(..., event_time=)``; ``None`` when none was given. Turn records carry their
        topic's. ``search(time_field="event")`` falls back to ``created_at`` where it is ``None``.
    invalidated_reason : str or None
        The reason given to :meth:`MemoryStore.invalidate`.
    level : str
        ``"topic"`` or ``"turn"``.
    topic_id : int or None
        For a turn record, the topic it belongs to.
    turn_ids : tuple[int, ...]
        For a topic, the ids of its turn records (two-level memory), oldest first.
    embedding : np.ndarray
        float32 ``[d]``: this record's own copy of the vector as it was when the record was read
        (a later ``update`` / ``merge`` of the id does not change it).
    """

    id: int
    namespace: str
    summary: str
    turns: list
    meta: dict
    version: int
    status: str
    created_at: float
    updated_at: float
    invalidated_reason: str | None = None
    level: str = "topic"
    topic_id: int | None = None
    turn_ids: tuple = ()
    event_time: float | None = None
    _embedding: Any = field(default=None, repr=False, compare=False)
    _store: Any = field(default=None, repr=False, compare=False)

    @property
    def embedding(self) -> np.ndarray:
        if self._embedding is None:
            store = self._store() if self._store is not None else None
            if store is None:
                raise MemkernValueError(f"Record {self.id}: its store is gone; embedding unavailable")
            object.__setattr__(self, "_embedding", store.embeddings([self.id])[0])
        return self._embedding

    @property
    def turn(self) -> dict | None:
        """For a turn record, its turn dict (``None`` for topics)."""
        return self.turns[0] if self.level == "turn" and self.turns else None


def _loads(text: str, rid: Any, what: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        raise StoreCorruptedError(f"record {rid}: stored {what} is not valid JSON") from None


_ENUM_NAMES: Any = None  # ({Level: name}, {Status: name}) once the native module is loaded


def _enum_names() -> Any:
    global _ENUM_NAMES
    if _ENUM_NAMES is None:
        nat = _native()
        _ENUM_NAMES = ({e: e.name for e in nat.Level.__members__.values()},
                       {e: e.name for e in nat.Status.__members__.values()})
    return _ENUM_NAMES


def _record_from(r: Any, store: "MemoryStore", v: Any = None) -> Record:
    """The public :class:`Record` of a native ``StoredRecord`` ``r``; with ``v`` (one of its
    ``StoredVersion``s from ``history``), that version's fields over the record's current ones."""
    level_names, status_names = _ENUM_NAMES or _enum_names()
    src = r if v is None else v
    rid = r.id
    status = status_names[r.status]
    parent = r.parent
    return Record(
        id=rid,
        namespace=r.namespace,
        summary=src.summary,
        turns=_loads(src.turns_json, rid, "turns"),
        meta=_loads(src.meta_json, rid, "meta"),
        version=src.version,
        status=status,
        created_at=r.created_at,
        updated_at=src.updated_at,
        invalidated_reason=r.reason if status == "invalidated" else None,
        level=level_names[r.level],
        topic_id=parent if parent >= 0 else None,
        turn_ids=tuple(r.children),
        event_time=r.event_time,
        _embedding=src.embedding,
        _store=weakref.ref(store),
    )


# ----------------------------------------------------------------------------------- validation


#: The UTF-8 check (:func:`memkern.base.validate.check_utf8`), under the name the store's callers use.
_check_utf8 = check_utf8


def _check_namespace(namespace: Any) -> str:
    return check_namespace_str(namespace)


def _check_int(v: Any, name: str, lo: int, hi: int, none_ok: bool = False) -> int | None:
    """An int (not bool) in ``lo..hi``; the bound is checked before any conversion to C++
    (:func:`memkern.base.validate.check_int`, the store's convention: a non-int is a TypeError)."""
    return check_int(name, v, lo, hi, none_ok=none_ok, type_error=True)


_NO_TIMES = np.zeros(0, dtype=np.float64)


def _event_array(times: Sequence[float | None]) -> np.ndarray:
    """float64 ``[n]``, NaN where a record has no event time (the native encoding of "none")."""
    return np.array([math.nan if t is None else t for t in times], dtype=np.float64)


def _check_event_time(t: Any, name: str) -> float | None:
    return check_time(name, t, none_ok=True)


def _check_real(v: Any, name: str, lo: float, hi: float, open_low: bool = False) -> float:
    """A finite real (not bool) in ``[lo, hi]`` (``(lo, hi]`` with ``open_low``):
    :func:`memkern.base.validate.check_float`, the store's message."""
    rng = f"{'(' if open_low else '['}{lo:g}, {hi:g}]"
    return check_float(name, v, lo, hi, low_open=open_low, finite=True, expected=f"a finite real in {rng}",
                       type_error=True)


def _check_texts(texts: Any, count: int | None) -> list[str]:
    if texts is None:
        raise bad_arg("texts", 'one query str per query for mode="lexical" / "hybrid"', None)
    if isinstance(texts, str) or not isinstance(texts, Sequence):
        raise bad_arg("texts", "a list of str", type(texts).__name__, MemkernTypeError)
    if count is not None and len(texts) != count:
        raise bad_arg("texts", f"{count} texts (one per query)", f"{len(texts)} texts")
    if len(texts) == 0:
        raise bad_arg("texts", "at least one query text", "an empty list")
    return [check_text(f"texts[{i}]", t, max_chars=MAX_QUERY_TEXT) for i, t in enumerate(texts)]


def _canonical_filter_value(v: Any, where: str) -> bytes:
    """The canonical bytes of a filter value (same encoding as ``csrc/include/memkern/filter.h``)."""
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, bool):
        return b"b1" if v else b"b0"
    if isinstance(v, int):
        try:
            f = float(v)
        except OverflowError:
            raise bad_arg(where, "a str, int, float or bool (ints within float range)", v) from None
        return b"n" + struct.pack("<d", f + 0.0)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise bad_arg(where, "a finite number", v)
        return b"n" + struct.pack("<d", v + 0.0)  # + 0.0: -0.0 -> 0.0
    if isinstance(v, str):
        if len(v) > MAX_FILTER_STR:
            raise bad_arg(where, f"a str of at most {MAX_FILTER_STR} characters", f"{len(v)} characters")
        return b"s" + _check_utf8(v, where).encode("utf-8")
    raise bad_arg(where, "a str, int, float or bool", type(v).__name__, MemkernTypeError)


def _compile_filter(flt: Any) -> list[tuple[str, list[bytes]]]:
    """``filter`` -> ``[(key, sorted canonical values)]`` for the native predicate (AND of keys)."""
    if flt is None:
        return []
    form = "{key: value}, {key: {'$eq': value}} or {key: {'$in': [values]}}"
    if not isinstance(flt, dict):
        raise bad_arg("filter", f"a dict {form}", type(flt).__name__, MemkernTypeError)
    if len(flt) > MAX_FILTER_KEYS:
        raise bad_arg("filter", f"at most {MAX_FILTER_KEYS} keys", f"{len(flt)} keys")
    out, total = [], 0
    for key, cond in flt.items():
        if not isinstance(key, str) or not key:
            raise bad_arg("filter", "non-empty str keys", key, MemkernTypeError if not isinstance(key, str) else MemkernValueError)
        if len(key) > MAX_FILTER_STR:
            raise bad_arg("filter", f"keys of at most {MAX_FILTER_STR} characters", f"{len(key)} characters")
        _check_utf8(key, "filter")
        where = f"filter[{key!r}]"
        if isinstance(cond, dict):
            if len(cond) != 1 or next(iter(cond)) not in ("$eq", "$in"):
                raise bad_arg(where, "{'$eq': value} or {'$in': [values]}", cond)
            op, val = next(iter(cond.items()))
            if op == "$eq":
                vals = [val]
            else:
                if isinstance(val, (str, bytes, dict)) or not isinstance(val, (list, tuple, set, frozenset)):
                    raise bad_arg(f"{where}['$in']", "a list of values", type(val).__name__, MemkernTypeError)
                vals = list(val)
        else:
            vals = [cond]
        total += len(vals)
        if total > MAX_FILTER_VALUES:
            raise bad_arg("filter", f"at most {MAX_FILTER_VALUES} values in all", f"more ({total}+)")
        canon = sorted({_canonical_filter_value(v, where) for v in vals})
        out.append((key, canon))
    return out


def _check_time_range(tr: Any) -> tuple[bool, float, float]:
    if tr is None:
        return False, -math.inf, math.inf
    if isinstance(tr, (str, bytes)) or not isinstance(tr, (tuple, list)) or len(tr) != 2:
        raise bad_arg("time_range", "a (start, end) pair of unix seconds or None", tr)
    lo = -math.inf if tr[0] is None else check_time("time_range", tr[0])
    hi = math.inf if tr[1] is None else check_time("time_range", tr[1])
    if lo > hi:
        raise bad_arg("time_range", "start <= end", tr)
    return True, lo, hi


def check_search_filters(filter: Any = None, time_range: Any = None, time_field: str = "event",
                         recency: Any = None, recency_weight: Any = DEFAULT_RECENCY_WEIGHT,
                         now: Any = None) -> dict:
    """Check :meth:`MemoryStore.search`'s ``filter`` / ``time_range`` / ``time_field`` /
    ``recency`` / ``recency_weight`` / ``now`` with the same checks and messages ``search`` uses,
    before any search runs (RMM, the adapters and the server call it on their inputs).

    Returns
    -------
    dict
        The keyword arguments to pass on to ``search``: those that are set (``time_field``,
        ``recency_weight`` and ``now`` only with a ``time_range`` or ``recency`` that uses them);
        ``{}`` when nothing is set.
    """
    _compile_filter(filter)
    if time_field not in _TIME_FIELDS:
        raise bad_arg("time_field", '"event", "created" or "updated"', time_field)
    _check_time_range(time_range)
    if recency is not None:
        _check_real(recency, "recency", 0.0, MAX_TIME, open_low=True)
    _check_real(recency_weight, "recency_weight", -MAX_RECENCY_WEIGHT, MAX_RECENCY_WEIGHT)
    if now is not None:
        check_time("now", now)
    kw: dict = {}
    if filter is not None:
        kw["filter"] = filter
    if time_range is not None:
        kw["time_range"] = tuple(time_range)
    if recency is not None:
        kw["recency"] = recency
        kw["recency_weight"] = recency_weight
        if now is not None:
            kw["now"] = now
    if time_range is not None or recency is not None:
        kw["time_field"] = time_field
    return kw


def _check_id(x: Any, name: str = "id") -> int:
    if _is_torch(x) and x.ndim == 0 and not x.dtype.is_floating_point and not x.dtype.is_complex:
        x = x.item()  # 0-d integer tensor
    if not is_int(x):
        raise bad_arg(name, "an int", type(x).__name__, MemkernTypeError)
    v = int(x)
    if v < 0 or v > _MAX_ID:
        raise MemkernKeyError(f"{name}: unknown id {_short(v)} (ids are in 0..2**63-1)")
    return v


def _check_ids(ids: Any, name: str = "ids") -> np.ndarray:
    if _is_torch(ids):
        ids = ids.detach().cpu().numpy()
    arr = np.asarray(ids)
    if arr.dtype == object and arr.ndim == 1:
        ints = [v for v in arr.tolist() if isinstance(v, int) and not isinstance(v, bool)]
        if len(ints) == arr.size:  # Python ints beyond 64 bits
            raise MemkernKeyError(f"{name}: unknown id {_short(max(ints, key=abs))} (ids are in 0..2**63-1)")
    if arr.dtype == object or arr.dtype.kind not in "iu" or arr.dtype == np.bool_:
        if arr.size == 0:
            return np.zeros(0, dtype=np.int64)
        raise bad_arg(name, "integer ids", f"dtype {arr.dtype}", MemkernTypeError)
    if arr.ndim != 1:
        raise bad_arg(name, "a 1-D sequence of ids", f"shape {tuple(arr.shape)}")
    if arr.size and arr.min() < 0:
        raise MemkernKeyError(f"{name}: unknown id {int(arr.min())} (ids are in 0..2**63-1)")
    if arr.size and arr.dtype.kind == "u" and int(arr.max()) > _MAX_ID:
        raise MemkernKeyError(f"{name}: unknown id {int(arr.max())} (ids are in 0..2**63-1)")
    return np.ascontiguousarray(arr, dtype=np.int64)


def _is_torch(x: Any) -> bool:
    mod = type(x).__module__
    return mod.startswith("torch") and hasattr(x, "detach")


def _as_float32(x: Any, name: str, stored: bool) -> np.ndarray:
    """numpy / torch (CPU) -> C-contiguous float32 following the module's dtype rule."""
    if _is_torch(x):
        import torch

        if x.device.type != "cpu":
            raise bad_arg(name, "a CPU tensor or numpy array", f"tensor on {x.device}", MemkernTypeError)
        x = x.detach()
        if x.dtype in (torch.float16, torch.bfloat16):
            x = x.float()  # lossless widening
        elif x.dtype not in (torch.float32, torch.float64):
            raise bad_arg(name, "a floating tensor (float32, or lossless float16/bfloat16)", f"dtype {x.dtype}",
                          MemkernTypeError)
        x = x.numpy()
    try:
        arr = np.asarray(x)
    except Exception as e:  # ragged lists etc.
        raise bad_arg(name, "an array of floats", type(x).__name__, MemkernTypeError) from e
    if arr.dtype == np.float32:
        pass
    elif arr.dtype == np.float16:
        arr = arr.astype(np.float32)
    elif arr.dtype == np.float64:
        if not np.isfinite(arr).all():
            raise bad_arg(name, "finite values", "NaN or inf")
        f32 = arr.astype(np.float32)
        if stored and not np.array_equal(f32.astype(np.float64), arr):
            raise MemkernTypeError(
                f"{name}: expected float32 (or float16, or float64 values exactly representable in float32), "
                f"got float64 values that lose precision in float32; convert explicitly with .astype(np.float32)"
            )
        arr = f32
    else:
        raise bad_arg(name, "a float32 array (float16 and exact float64 are converted)", f"dtype {arr.dtype}",
                      MemkernTypeError)
    if not np.isfinite(arr).all():
        bad = np.argwhere(~np.isfinite(arr))[0]
        raise bad_arg(name, "finite values", f"NaN or inf at index {tuple(int(i) for i in bad)}")
    if stored and arr.ndim >= 1 and arr.size:
        # |<q, x>| <= ||q|| ||x||: with both norms <= 1e18 every score is finite in float32.
        # (Queries are checked by the native search itself, which names ``queries``: no extra
        # numpy passes on the search path.)
        norms = np.sqrt(np.square(arr, dtype=np.float64).sum(axis=-1))
        if norms.max() > MAX_NORM:
            at = np.unravel_index(int(np.argmax(norms)), norms.shape)
            raise bad_arg(name, f"vectors with an L2 norm <= {MAX_NORM:g} (scores must stay finite in float32)",
                          f"norm {float(norms.max()):.3g} at row {tuple(int(i) for i in at)}")
    return np.ascontiguousarray(arr)


def _as_vector(x: Any, dim: int, name: str) -> np.ndarray:
    arr = _as_float32(x, name, stored=True)
    if arr.ndim == 2 and arr.shape[0] == 1:
        arr = arr[0]
    if arr.ndim != 1 or arr.shape[0] != dim:
        raise bad_arg(name, f"shape [{dim}]", f"shape {list(arr.shape)}")
    return arr


def _as_queries(queries: Any, dim: int) -> np.ndarray:
    """Search queries as a C-contiguous float32 ``[B, dim]`` matrix (a ``[dim]`` vector is one query)."""
    q = _as_float32(queries, "queries", stored=False)
    if q.ndim == 1:
        q = q[None, :]
    if q.ndim != 2 or q.shape[1] != dim:
        raise bad_arg("queries", f"shape [B, {dim}] or [{dim}]", f"shape {list(np.shape(queries))}")
    return np.ascontiguousarray(q)


def _as_matrix(x: Any, dim: int, name: str, rows: int | None, stored: bool = True) -> np.ndarray:
    arr = _as_float32(x, name, stored=stored)
    if arr.ndim != 2 or arr.shape[1] != dim or (rows is not None and arr.shape[0] != rows):
        exp = f"[{rows if rows is not None else 'n'}, {dim}]"
        raise bad_arg(name, f"shape {exp}", f"shape {list(arr.shape)}")
    return arr


#: The JSON value check and serializer (:func:`memkern.base.validate.check_json` / ``json_text``):
#: ``check_json`` stays importable from here (the framework adapters use it).
_json_text = json_text


def _check_turns(turns: Any, name: str = "turns") -> list[dict]:
    if turns is None:
        return []
    if isinstance(turns, (str, bytes, dict)) or not isinstance(turns, Sequence):
        raise bad_arg(name, "a list of turn dicts", type(turns).__name__, MemkernTypeError)
    out = []
    for i, t in enumerate(turns):
        if not isinstance(t, dict):
            raise bad_arg(f"{name}[{i}]", "a dict with 'role' and 'content'", type(t).__name__, MemkernTypeError)
        check_turn(t, f"{name}[{i}]")
        out.append(dict(t))
    return out


def _check_meta(meta: Any, name: str = "meta") -> dict:
    if meta is None:
        return {}
    if not isinstance(meta, dict):
        raise bad_arg(name, "a dict", type(meta).__name__, MemkernTypeError)
    json_text(meta, name)
    return meta


def _check_turn_texts(texts: Any, turns: list[dict], te: Any, name: str) -> list[str] | None:
    """``texts`` checked: None, or one valid UTF-8 str per turn given with turn embeddings."""
    if texts is None:
        return None
    if te is None:
        raise bad_arg(name, "None unless turn_embeddings are given (turn texts belong to turn records)",
                      type(texts).__name__)
    if isinstance(texts, (str, bytes)) or not isinstance(texts, Sequence):
        raise bad_arg(name, f"a list of {len(turns)} str", type(texts).__name__, MemkernTypeError)
    if len(texts) != len(turns):
        raise bad_arg(name, f"one str per turn ({len(turns)})", f"length {len(texts)}")
    return [_check_summary(t, f"{name}[{i}]") for i, t in enumerate(texts)]


def _check_summary(summary: Any, name: str = "summary") -> str:
    return check_text(name, summary)


# ----------------------------------------------------------------------------------- the store


def turns_with_topics(store: Any, ids: Iterable[int]) -> list[tuple[Record, Record]]:
    """``(turn record, its topic record)`` pairs for turn record ids (``-1`` padding skipped), read
    through ``store.get_batch`` (two batched reads): what :meth:`MemoryStore.turns_with_topics`
    and the sharded store return. A topic id raises :class:`MemkernValueError` naming ``ids``."""
    if _is_torch(ids):
        ids = ids.detach().cpu().numpy()
    flat = np.asarray(ids if hasattr(ids, "__len__") else list(ids)).ravel()
    arr = _check_ids(flat[flat >= 0] if flat.size else np.zeros(0, dtype=np.int64))
    turns_ = store.get_batch(arr)
    for t in turns_:
        if t.level != "turn":
            raise bad_arg("ids", "turn record ids", f"topic id {t.id}")
    topics = {r.id: r for r in store.get_batch(sorted({t.topic_id for t in turns_}))}
    return [(t, topics[t.topic_id]) for t in turns_]


def _check_engine_options(M: Any, ef_construction: Any, ef_search: Any, num_threads: Any, flat_limit: Any,
                          id_range: Any) -> tuple[int, int]:
    """Checks the engine options :class:`MemoryStore` and :class:`~memkern.InMemoryStore` share;
    returns ``(id_base, id_end)`` of ``id_range``."""
    check_int("M", M, 2, 4096)
    check_int("ef_construction", ef_construction, 1, 1 << 20)
    check_int("ef_search", ef_search, 1, MAX_EF, none_ok=True)
    check_int("num_threads", num_threads, 1, 256)
    _check_int(flat_limit, "flat_limit", 0, 1 << 24)
    id_base, id_end = 0, (1 << 63) - 1
    if id_range is not None:
        if (not isinstance(id_range, tuple) or len(id_range) != 2
                or any(isinstance(x, bool) or not isinstance(x, int) for x in id_range)
                or not 0 <= id_range[0] < id_range[1] <= id_end):
            raise bad_arg("id_range", "a tuple (first, end) of ints with 0 <= first < end <= 2**63 - 1", id_range)
        id_base, id_end = id_range
    return id_base, id_end


class MemoryStore:
    """Persistent memory bank: records + a vector index per namespace (exact scan, HNSW when large), on a directory.

    Parameters
    ----------
    path : str or os.PathLike, optional
        Store directory (created if missing). ``None``: :func:`default_store_path`.
    dim : int, optional
        Embedding size. Required to create a store; an existing store uses its stored ``dim`` and
        a different value raises :class:`~memkern.MemkernValueError` saying what the store holds.
    metric : {"ip", "l2", "cos"}, optional
        Similarity; ``None`` means ``"ip"`` for a new store and the stored metric otherwise.
    fsync : {"always", "batch", "never"}
        When the log is forced to disk: after every write call (default, safe against power loss),
        on the first write at least ``fsync_interval`` seconds after the previous fsync ("batch"),
        or only on ``flush``/snapshot/``close`` ("never"). Every
        acknowledged write survives a *process* kill in every mode (the bytes are in the OS when the
        call returns); the modes differ only for an OS crash or power loss.
    M, ef_construction : int
        HNSW graph parameters of new stores (an existing store keeps its own).
    ef_search : int, optional
        Default search beam width (``max(ef, k)`` is used); ``None``: :data:`DEFAULT_EF_SEARCH`.
    snapshot_every : int
        Snapshot (and retire the log written before it) after this many logged record operations,
        in a background thread: the write that reaches the count returns at once, and no call
        waits for the snapshot's files (it copies the namespaces changed since the last snapshot
        under the reader lock, a few milliseconds at a time, and a write to one not copied yet
        copies it first). ``0`` disables automatic snapshots (``close`` still writes one). After
        a crash, opening replays about this many operations (re-inserting their vectors), so it
        bounds recovery time.
    fsync_interval : float
        Seconds between fsyncs in ``fsync="batch"`` mode.
    num_threads : int
        Threads that insert the vectors of one batch (``add_batch``, log replay) into the HNSW
        graphs, and that answer the queries of one ``search`` call (when the batch is large
        enough to be worth it; results are the same as with one thread). 1 (default) builds the
        same graph on every run; more threads are faster on several cores but make the graph (and
        so rare near-ties in results) vary between runs.
    flat_limit : int
        A namespace level holding at most this many records is searched by exact scan; past it,
        by an HNSW graph (0: always a graph). Not stored: a store may be reopened with another
        value (existing indexes change kind on their next add, or on ``compact``).
    id_range : (int, int), optional
        ``(first, end)``: the ids this store hands out lie in ``[first, end)`` (default
        ``(0, 2**63 - 1)``). Not stored: pass the same range on every open. A
        :class:`~memkern.distributed.ShardedStore` gives each shard its own range, so ids are unique
        across shards and a record moved between shards (:func:`memkern.store.transfer.import_records`)
        keeps its id.

    Notes
    -----
    Thread safety: any number of threads may call read methods (``get``, ``search``,
    ``embeddings``, ...) while one thread writes; writes are serialised. ``add_batch`` and
    ``search`` release the GIL. One process may open a store at a time (others get
    :class:`~memkern.MemkernError`).
    """

    def __init__(
        self,
        path: str | os.PathLike | None = None,
        dim: int | None = None,
        metric: str | None = None,
        *,
        fsync: str = "always",
        M: int = 16,
        ef_construction: int = 200,
        ef_search: int | None = None,
        snapshot_every: int = 50_000,
        fsync_interval: float = 1.0,
        num_threads: int = 1,
        flat_limit: int = DEFAULT_FLAT_LIMIT,
        id_range: tuple[int, int] | None = None,
    ) -> None:
        self._native = None
        if path is not None and not isinstance(path, (str, os.PathLike)):
            raise bad_arg("path", "a str or os.PathLike", type(path).__name__, MemkernTypeError)
        p = Path(path) if path is not None else default_store_path()
        if "\0" in str(p):
            raise bad_arg("path", "a path without NUL characters", str(p))
        if dim is not None:
            check_int("dim", dim, 1, 65536)
        if metric is not None:
            check_choice("metric", metric, _METRICS, expected='"ip", "l2" or "cos"')
        check_choice("fsync", fsync, _FSYNC, expected='"always", "batch" or "never"')
        check_int("snapshot_every", snapshot_every, 0, (1 << 64) - 1)
        id_base, id_end = _check_engine_options(M, ef_construction, ef_search, num_threads, flat_limit, id_range)
        check_float("fsync_interval", fsync_interval, 0, finite=True, expected="finite seconds >= 0")
        p.parent.mkdir(parents=True, exist_ok=True)
        exists = (p / "CURRENT").exists() or (p / "wal.log").exists()
        if not exists and dim is None:
            raise bad_arg("dim", f"an int to create a new store at {p}", None)
        native_metric = metric if metric is not None else ("" if exists else "ip")
        self._native = _native().Store(
            os.fsencode(p), int(dim or 0), native_metric, int(M), int(ef_construction), fsync, float(fsync_interval),
            int(snapshot_every), int(num_threads), int(flat_limit), int(id_base), int(id_end),
        )
        self._path = p
        self.ef_search = int(ef_search) if ef_search is not None else DEFAULT_EF_SEARCH
        logger.info(
            "memkern store %s opened: dim=%d metric=%s fsync=%s, %d namespace(s), %d log entries replayed, "
            "distance kernel %s",
            p, self._native.dim, self._native.metric, fsync, len(self._native.namespaces()),
            getattr(self._native, "replayed_entries", 0), _native().Store.simd_kernel,
        )
        if getattr(self._native, "recovered_torn_tail", False):
            logger.warning("memkern store %s: the last log entry was torn (an interrupted write that no later "
                           "entry shows was synced) and was discarded; everything before it was recovered", p)

    # ------------------------------------------------------------------ properties
    @property
    def path(self) -> Path:
        """The store directory."""
        return self._path

    @property
    def dim(self) -> int:
        return int(self._native.dim)

    @property
    def metric(self) -> str:
        return str(self._native.metric)

    @property
    def closed(self) -> bool:
        return self._native is None or bool(self._native.closed)

    @property
    def last_snapshot_error(self) -> str | None:
        """Why the last automatic snapshot (``snapshot_every``, or the one ``close`` writes) failed,
        ``None`` when it succeeded or none ran. Such a failure never fails a write (every write is
        already durable in the log): it is logged as a warning on the ``"memkern"`` logger (by the
        next call that writes, since the background thread writes the snapshot) and the snapshot
        is retried ``snapshot_every`` operations later."""
        if self._native is None:
            return None
        return str(self._native.last_snapshot_error) or None

    def __repr__(self) -> str:
        if self.closed:
            return f"MemoryStore({str(self._path)!r}, closed)"
        return f"MemoryStore({str(self._path)!r}, dim={self.dim}, metric={self.metric!r})"

    def __enter__(self) -> "MemoryStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:  # best effort; close() is the documented way
        try:
            if self._native is not None and not self._native.closed:
                self._native.close()
        except Exception:
            pass

    def _n(self):
        if self._native is None or self._native.closed:
            raise MemkernValueError(f"store {self._path}: expected an open store, got a closed one")
        return self._native

    @property
    def native(self):
        """The open store's native layer, for tools that need operations the public API does not
        offer (:mod:`memkern.store.transfer` reads each version's op and writes versions with a given
        op): a ``memkern._store.Store`` (methods and limits typed in ``memkern/_store.pyi``; an
        :class:`~memkern.InMemoryStore`'s is ``Store.in_memory(...)``, the same engine). Its calls
        take already-validated arguments (the checks of this class's methods are skipped).

        Raises
        ------
        MemkernValueError
            The store is closed.
        """
        return self._n()

    # ------------------------------------------------------------------ writes
    @traced("memkern.store.add", args=("namespace",))
    def add(
        self,
        namespace: str,
        summary: str,
        embedding: Any,
        turns: list[dict] | None = None,
        meta: dict | None = None,
        *,
        turn_embeddings: Any = None,
        event_time: float | None = None,
        turn_texts: Sequence[str] | None = None,
    ) -> int:
        """Add one topic record; returns its id (int64).

        Parameters
        ----------
        namespace : str
            Non-empty user / agent key.
        summary : str
        embedding : array-like float32 ``[d]``
        turns : list of dict, optional
            Turns with at least ``role`` and ``content`` (str); other JSON-compatible keys are kept.
        meta : dict, optional
        turn_embeddings : array-like float32 ``[len(turns), d]``, optional
            Also store each turn as a turn record linked to this topic (two-level memory).
        turn_texts : list of str, optional
            With ``turn_embeddings``: each turn record's text (``len(turns)`` strings), what
            lexical / hybrid search matches, e.g. the turn rendered with its speaker and date
            (:mod:`memkern.text.template`). Default: each turn's ``content``. The turn dicts are kept
            as given either way.
        event_time : float, optional
            The conversation's own time (unix seconds, years 1-9999: ``MIN_TIME <= t <= MAX_TIME``), kept as
            ``Record.event_time`` (also on the turn records) for ``search(time_range=...)`` and
            the recency prior.
        """
        n = self._n()
        ns = _check_namespace(namespace)
        summary = _check_summary(summary)
        vec = _as_vector(embedding, n.dim, "embedding")
        turns_l = _check_turns(turns)
        meta_d = _check_meta(meta)
        te = self._turn_matrix(turn_embeddings, turns_l, "turn_embeddings")
        tt = _check_turn_texts(turn_texts, turns_l, te, "turn_texts")
        et = _check_event_time(event_time, "event_time")
        ids = self._add_items(n, ns, [summary], vec[None, :], [turns_l], [meta_d], [te], [et], [tt])
        return int(ids[0])

    @traced("memkern.store.add_batch", args=("namespace", "summaries"))
    def add_batch(
        self,
        namespace: str,
        summaries: Sequence[str],
        embeddings: Any,
        turns: Sequence[list[dict] | None] | None = None,
        metas: Sequence[dict | None] | None = None,
        *,
        turn_embeddings: Sequence[Any] | None = None,
        event_times: Sequence[float | None] | None = None,
        turn_texts: Sequence[Sequence[str] | None] | None = None,
    ) -> np.ndarray:
        """Add ``n`` topic records in one atomic, logged call; returns their ids, int64 ``[n]``.

        ``embeddings`` is float32 ``[n, d]``; ``turns`` / ``metas`` are ``None`` or length-``n``
        lists; ``turn_embeddings`` is ``None`` or a length-``n`` list of ``[len(turns[i]), d]``
        arrays (or ``None`` entries); ``event_times`` is ``None`` or a length-``n`` list of unix
        seconds or ``None``; ``turn_texts`` is ``None`` or a length-``n`` list of turn-text lists
        (or ``None`` entries) (see :meth:`add`). The GIL is released while the index is built.
        """
        n = self._n()
        ns = _check_namespace(namespace)
        if isinstance(summaries, str) or not isinstance(summaries, Sequence):
            raise bad_arg("summaries", "a list of str", type(summaries).__name__, MemkernTypeError)
        count = len(summaries)
        sums = [_check_summary(s, f"summaries[{i}]") for i, s in enumerate(summaries)]
        emb = _as_matrix(embeddings, n.dim, "embeddings", count)
        if turns is not None and len(turns) != count:
            raise bad_arg("turns", f"None or a list of {count} turn lists", f"length {len(turns)}")
        if metas is not None and len(metas) != count:
            raise bad_arg("metas", f"None or a list of {count} dicts", f"length {len(metas)}")
        if turn_embeddings is not None and len(turn_embeddings) != count:
            raise bad_arg("turn_embeddings", f"None or a list of {count} arrays", f"length {len(turn_embeddings)}")
        tl = [_check_turns(turns[i] if turns is not None else None, f"turns[{i}]") for i in range(count)]
        ml = [_check_meta(metas[i] if metas is not None else None, f"metas[{i}]") for i in range(count)]
        te = [
            self._turn_matrix(turn_embeddings[i] if turn_embeddings is not None else None, tl[i], f"turn_embeddings[{i}]")
            for i in range(count)
        ]
        if event_times is not None:
            if isinstance(event_times, (str, bytes)) or not isinstance(event_times, (Sequence, np.ndarray)):
                raise bad_arg("event_times", f"None or a list of {count} floats / None", type(event_times).__name__,
                              MemkernTypeError)
            if len(event_times) != count:
                raise bad_arg("event_times", f"None or a list of {count} floats / None", f"length {len(event_times)}")
            et = [_check_event_time(event_times[i], f"event_times[{i}]") for i in range(count)]
        else:
            et = [None] * count
        if turn_texts is not None and (isinstance(turn_texts, (str, bytes)) or not isinstance(turn_texts, Sequence)
                                       or len(turn_texts) != count):
            raise bad_arg("turn_texts", f"None or a list of {count} lists of str / None",
                          f"length {len(turn_texts)}" if isinstance(turn_texts, Sequence) else type(turn_texts).__name__)
        tt = [_check_turn_texts(turn_texts[i] if turn_texts is not None else None, tl[i], te[i], f"turn_texts[{i}]")
              for i in range(count)]
        return self._add_items(n, ns, sums, emb, tl, ml, te, et, tt)

    def _turn_matrix(self, te: Any, turns: list[dict], name: str) -> np.ndarray | None:
        if te is None:
            return None
        m = _as_matrix(te, self.dim, name, len(turns))
        if len(turns) == 0:
            raise bad_arg(name, "None when there are no turns", f"shape {list(m.shape)}")
        return m

    @staticmethod
    def _turn_item(turn: dict, pos: int, text: str | None = None) -> tuple[str, str, str]:
        return (turn["content"] if text is None else text), _json_text([turn], "turns"), \
            _json_text({"turn_position": pos}, "meta")

    def _add_items(self, n, ns, sums, emb, tl, ml, te, et, tt=None) -> np.ndarray:
        has_et = any(t is not None for t in et)
        if not any(t is not None for t in te):
            levels = np.zeros(len(sums), dtype=np.uint8)
            parents = np.full(len(sums), -1, dtype=np.int64)
            return n.add(ns, sums, [_json_text(t, "turns") for t in tl], [_json_text(m, "meta") for m in ml], emb,
                         levels, parents, _event_array(et) if has_et else _NO_TIMES)
        # Two-level: each topic is followed by its turn records (parent = batch index of the topic).
        S, T, Mt, rows, lv, par, topic_pos, E = [], [], [], [], [], [], [], []
        for i in range(len(sums)):
            topic_pos.append(len(S))
            ti = len(S)
            S.append(sums[i]); T.append(_json_text(tl[i], "turns")); Mt.append(_json_text(ml[i], "meta"))
            rows.append(emb[i]); lv.append(0); par.append(-1); E.append(et[i])
            if te[i] is not None:
                for j, turn in enumerate(tl[i]):
                    s, t, m = self._turn_item(turn, j, tt[i][j] if tt and tt[i] is not None else None)
                    S.append(s); T.append(t); Mt.append(m); rows.append(te[i][j]); lv.append(1); par.append(-2 - ti)
                    E.append(et[i])  # a turn record carries its topic's event time
        ids = n.add(ns, S, T, Mt, np.ascontiguousarray(np.stack(rows), dtype=np.float32),
                    np.asarray(lv, dtype=np.uint8), np.asarray(par, dtype=np.int64),
                    _event_array(E) if has_et else _NO_TIMES)
        return np.ascontiguousarray(ids[topic_pos], dtype=np.int64)

    @traced("memkern.store.merge", args=("id",))
    def merge(
        self,
        id: int,
        summary: str,
        embedding: Any,
        turns: list[dict] | None = None,
        *,
        meta: dict | None = None,
        turn_embeddings: Any = None,
        event_time: float | None = None,
        turn_texts: Sequence[str] | None = None,
    ) -> int:
        """Merge new content into record ``id``: a new version with the new summary and embedding
        and the *union* of the old and new turns (old turns first, a turn already kept dropped
        (:func:`memkern.base.turns.turn_key`), none ever lost). The previous version stays readable through :meth:`history`. Returns the new
        version number. ``turn_embeddings`` (``[len(turns), d]``) adds turn records for the turns
        that are new; it is required when the record already has turn records and new turns come.
        ``event_time`` replaces the record's event time (``None`` keeps it); new turn records get
        the record's resulting event time. ``turn_texts`` (one per turn of ``turns``) are the new turn
        records' texts, as in :meth:`add`."""
        n = self._n()
        rid = _check_id(id)
        summary = _check_summary(summary)
        vec = _as_vector(embedding, n.dim, "embedding")
        new_turns = _check_turns(turns)
        meta_d = _check_meta(meta) if meta is not None else None
        te = self._turn_matrix(turn_embeddings, new_turns, "turn_embeddings")
        tt = _check_turn_texts(turn_texts, new_turns, te, "turn_texts")
        et = _check_event_time(event_time, "event_time")
        cur = self._get_raw(rid)
        old_turns = _loads(cur.turns_json, rid, "turns")
        seen = {turn_key(t) for t in old_turns}
        merged = list(old_turns)
        new_rows = []
        for j, t in enumerate(new_turns):
            k = turn_key(t)
            if k not in seen:
                seen.add(k)
                merged.append(t)
                new_rows.append((len(merged) - 1, t, j))
        if cur.children and new_rows and te is None:
            raise bad_arg("turn_embeddings", f"embeddings for the new turns (record {rid} has turn records)", None)
        cs, ct, cm, ce = self._child_args(n, te, new_rows, tt)
        child_t = et if et is not None else cur.event_time
        version, _ = n.new_version(rid, _native().Op.merge, summary, vec[None, :], _json_text(merged, "turns"),
                                   _json_text(meta_d, "meta") if meta_d is not None else None, cs, ct, cm, ce,
                                   False, et, _event_array([child_t] * len(cs)) if child_t is not None and cs
                                   else _NO_TIMES)
        return int(version)

    def _child_args(self, n, te, rows, tt=None):
        if te is None or not rows:
            return [], [], [], np.zeros((0, n.dim), dtype=np.float32)
        cs, ct, cm = [], [], []
        for pos, t, j in rows:
            s, tj, m = self._turn_item(t, pos, tt[j] if tt is not None else None)
            cs.append(s); ct.append(tj); cm.append(m)
        ce = np.ascontiguousarray(te[[j for _, _, j in rows]], dtype=np.float32)
        return cs, ct, cm, ce

    @traced("memkern.store.update", args=("id",))
    def update(
        self,
        id: int,
        summary: str | None = None,
        embedding: Any = None,
        turns: list[dict] | None = None,
        meta: dict | None = None,
        *,
        turn_embeddings: Any = None,
        event_time: float | None = None,
        turn_texts: Sequence[str] | None = None,
    ) -> int:
        """Write a new version of ``id`` replacing the given fields (``None`` keeps a field);
        returns the new version number. Replacing the turns of a topic that has turn records
        needs ``turn_embeddings`` for the new turns (the old turn records are then deleted).
        ``event_time`` replaces the record's event time (``None`` keeps it). ``turn_texts`` (one per
        turn, with ``turn_embeddings``) are the new turn records' texts, as in :meth:`add`."""
        n = self._n()
        rid = _check_id(id)
        if summary is None and embedding is None and turns is None and meta is None and event_time is None:
            raise bad_arg("update", "at least one of summary, embedding, turns, meta, event_time", "none")
        et = _check_event_time(event_time, "event_time")
        s = _check_summary(summary) if summary is not None else None
        vec = _as_vector(embedding, n.dim, "embedding")[None, :] if embedding is not None else None
        tl = _check_turns(turns) if turns is not None else None
        m = _check_meta(meta) if meta is not None else None
        te = None
        if turn_embeddings is not None:
            if tl is None:
                raise bad_arg("turn_embeddings", "to come with turns", "no turns")
            te = self._turn_matrix(turn_embeddings, tl, "turn_embeddings")
        tt = _check_turn_texts(turn_texts, tl or [], te, "turn_texts")
        cur = self._get_raw(rid)
        old_children = list(cur.children)
        if tl is not None and old_children and te is None:
            raise bad_arg("turn_embeddings", f"embeddings for the new turns (record {rid} has turn records)", None)
        rows = [(j, t, j) for j, t in enumerate(tl)] if (te is not None and tl) else []
        cs, ct, cm, ce = self._child_args(n, te, rows, tt)
        # Old turn records are replaced by the new ones in the same atomic log entry.
        child_t = et if et is not None else cur.event_time
        version, _ = n.new_version(rid, _native().Op.update, s, vec, _json_text(tl, "turns") if tl is not None else None,
                                   _json_text(m, "meta") if m is not None else None, cs, ct, cm, ce,
                                   te is not None, et, _event_array([child_t] * len(cs)) if child_t is not None and cs
                                   else _NO_TIMES)
        return int(version)

    @traced("memkern.store.invalidate", args=("id",))
    def invalidate(self, id: int, reason: str = "") -> None:
        """Mark ``id`` invalidated (kept, readable, excluded from search unless
        ``include_invalidated=True``). Invalidating twice raises :class:`MemkernValueError`."""
        n = self._n()
        rid = _check_id(id)
        check_text("reason", reason)
        n.invalidate(rid, reason)

    @traced("memkern.store.delete", args=("id",))
    def delete(self, id: int) -> None:
        """Delete ``id`` (and its turn records): gone from search and ``get`` at once, from disk
        after :meth:`compact`. Deleting an unknown or already deleted id raises
        :class:`MemkernKeyError`."""
        n = self._n()
        n.delete(_check_id(id))

    # ------------------------------------------------------------------ reads
    def _get_raw(self, rid: int) -> Any:  # a native StoredRecord
        return self._n().get(rid)

    def get(self, id: int) -> Record:
        """The current version of record ``id`` (unknown / deleted id: :class:`MemkernKeyError`)."""
        return _record_from(self._get_raw(_check_id(id)), self)

    @traced("memkern.store.get_batch", args=("ids",))
    def get_batch(self, ids: Iterable[int]) -> list[Record]:
        """Records for ``ids`` (int64 ``[n]``), in order; any unknown id raises before anything
        is returned."""
        arr = _check_ids(list(ids) if not hasattr(ids, "__array__") and not _is_torch(ids) else ids)
        return [_record_from(d, self) for d in self._n().get_batch(arr)]

    def topic_ids(self, ids: Any) -> np.ndarray:
        """The topic of each record of ``ids`` (int64 ``[n]``): a turn record's topic id, ``-1``
        for a topic; one call, no record is read into Python. Unknown ids raise
        :class:`MemkernKeyError`."""
        return self._n().parents(_check_ids(ids))

    def turns_with_topics(self, ids: Iterable[int]) -> list[tuple[Record, Record]]:
        """For turn record ids (e.g. from ``search(..., level="turn+topic")``, ``-1`` padding
        skipped): ``(turn record, its topic record)`` pairs in order, so a prompt can show the best
        turns with their topic summary. A topic id raises :class:`MemkernValueError`."""
        return turns_with_topics(self, ids)

    def history(self, id: int) -> list[Record]:
        """All versions of ``id``, oldest first (the last one is the current version)."""
        n = self._n()
        rid = _check_id(id)
        cur = n.get(rid)
        return [_record_from(cur, self, v) for v in n.history(rid)]

    def embeddings(self, ids: Any) -> np.ndarray:
        """Stored vectors of ``ids`` (int64 ``[n]``) as float32 ``[n, d]``, in one call. For
        metric ``"cos"`` these are the L2-normalised vectors."""
        arr = _check_ids(ids)
        return self._n().embeddings(arr)

    @traced("memkern.store.search", args=("namespace", "queries", "k", "level"))
    def search(
        self,
        namespace: str,
        queries: Any,
        k: int = 20,
        ef: int | None = None,
        include_invalidated: bool = False,
        *,
        level: str = "topic",
        alpha: float = 1.0,
        candidates: int | None = None,
        mode: str = "dense",
        texts: Sequence[str] | None = None,
        fusion: str = _lexical.DEFAULT_FUSION,
        lexical_weight: float = _lexical.DEFAULT_LEXICAL_WEIGHT,
        filter: dict | None = None,
        time_range: tuple[float | None, float | None] | None = None,
        time_field: str = "event",
        recency: float | None = None,
        recency_weight: float = DEFAULT_RECENCY_WEIGHT,
        now: float | None = None,
        neighbour_weight: float = 0.0,
        group_weight: float = 0.0,
        group_key: str | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """k best records of ``namespace`` for each query: dense (vectors), lexical (BM25) or both.

        Parameters
        ----------
        namespace : str
        queries : array-like float ``[B, d]`` or ``[d]`` (a 1-D query is searched as ``B = 1``)
        k : int
            1..:data:`MAX_K`, and ``B * k <= MAX_RESULTS``; ``k`` above the namespace's record
            count is fine (``-1`` padding).
        ef : int, optional
            Beam width (``max(ef, k)``); default ``self.ef_search``.
        include_invalidated : bool
        level : {"topic", "turn", "turn+topic"}
            What to return: topic ids, turn record ids, or turn record ids ranked by
            ``sim(q, turn) + alpha * sim(q, topic)`` (with ``mode="dense"`` and nothing else set;
            otherwise see *Two-level search* below).
        alpha : float
            Weight of the topic similarity for ``level="turn+topic"``.
        candidates : int, optional
            ``level="turn+topic"``: how many turns and topics the index returns before the exact
            rescoring (all turns of the candidate topics are rescored). ``mode="hybrid"`` or a
            ``recency`` prior: how many results each first-stage list returns before fusion /
            rescoring. Default ``max(4k, 50)``.
        mode : {"dense", "lexical", "hybrid"}
            ``"dense"``: vector similarity (``queries``). ``"lexical"``: BM25 (k1 = 1.2,
            b = 0.75) of ``texts`` against the records' text (a topic's summary, a turn record's
            turn text), tokenised by :func:`memkern.store.reference.tokenize`; only records sharing a
            term with the query are hits. ``"hybrid"``: both lists fused (``fusion``).
            ``mode="dense"`` with no ``filter`` / ``time_range`` / ``recency`` is the plain
            vector search, at its plain cost.
        texts : list of str, optional
            One query text per query (``B``), each at most :data:`MAX_QUERY_TEXT` characters;
            required for ``"lexical"`` / ``"hybrid"``. ``queries`` may be ``None`` for ``"lexical"``.
        fusion : {"coverage", "rrf", "weighted"}
            ``"coverage"`` (default): ``(1 - w) * dense + w * coverage / max(coverage)``, the
            dense scores min-max normalised to [0, 1] over the dense list, and the lexical list
            ranked and scored by idf-weighted query-term coverage
            (:func:`memkern.store.reference.coverage_scores`, not BM25), divided by the list's best. ``"rrf"``: ``(1 - w) / (60 + rank_dense) + w / (60 + rank_lexical)``
            (ranks from 1, a list that misses a record adds 0). ``"weighted"``: ``(1 - w) * dense
            + w * lexical`` with each list's scores (BM25 for the lexical one) min-max normalised
            to [0, 1] over its own results. Same definitions as
            :func:`memkern.store.reference.coverage_fusion` / :func:`memkern.store.reference.rrf` /
            :func:`memkern.store.reference.weighted_fusion`. The default (``"coverage"``, ``w = 0.35``) is
            the best measured on tuning dialogues (``bench/bench_lexical.py``; it beat RRF and
            min-max fusion at every weight tried): it helps most when the records' vectors
            embed the content and their texts also carry the names (e.g. vectors of the turn
            content, texts ``"{speaker}: {content}"``), so that names are matched lexically.
        lexical_weight : float
            ``w`` above, in [0, 1] (default 0.35).
        filter : dict, optional
            Metadata filter on the records' ``meta`` (top-level keys; a turn record also sees its
            topic's keys where its own meta lacks them): ``{"user": "alice"}`` or
            ``{"user": {"$eq": "alice"}}`` (equality), ``{"tag": {"$in": ["a", "b"]}}`` (any of);
            several keys must all hold. Values are str / int / float / bool with JSON equality
            (``1 == 1.0``, ``True != 1``). At most :data:`MAX_FILTER_KEYS` keys and
            :data:`MAX_FILTER_VALUES` values in all. Applied inside the index search (hnswlib's
            filter functor, the exact scan's predicate, the BM25 candidates' check, or an exact
            scan of the records whose meta matches when they are few), never by over-fetching:
            ``k`` results come back whenever ``k`` records match.
        time_range : (start, end), optional
            Unix seconds, either may be ``None``; keeps records with ``start <= t < end``, ``t``
            taken from ``time_field``. Applied inside the search like ``filter``.
        time_field : {"event", "created", "updated"}
            ``"event"``: the record's ``event_time`` (falling back to ``created_at`` when it has
            none); ``"created"`` / ``"updated"``: ``created_at`` / ``updated_at``.
        recency : float, optional
            Half-life in seconds of a recency prior: each candidate's score (the fused score in
            ``"hybrid"``) gets ``recency_weight * 2 ** (-max(now - t, 0) / recency)`` added, ``t``
            from ``time_field``, and the best ``k`` are kept.
        recency_weight : float
            Weight of the prior, in the unit of the mode's score (finite, ``|w| <= 1e6``).
        now : float, optional
            The time the prior measures ages from (default ``time.time()``).
        neighbour_weight, group_weight : float
            ``level="turn+topic"`` only: weights of the context terms (``|w| <= 100``, default 0).
        group_key : str, optional
            ``level="turn+topic"`` only: the meta key whose value (on the turn record, else on its
            topic) groups turns, e.g. ``"session_id"``; ``None``: a turn's topic is its group.

        Two-level search
        ----------------
        ``level="turn+topic"`` with ``mode="lexical"`` / ``"hybrid"``, a ``filter`` /
        ``time_range`` / ``recency``, or a context weight runs in one native call
        (``csrc/include/memkern/store.h``, ``TurnSearchSpec``): a first stage over the turn records
        (the turn-level search of ``mode``, filters applied inside it, lists ``candidates`` deep),
        whose score ``base(t)`` is the similarity (dense), BM25 (lexical) or fused score (hybrid)
        and 0 for turns outside the lists (``S0``); then, for every turn of ``S0`` and every
        neighbour of one::

            score(t) = own(t) + alpha * sim(q, topic(t))
                       + neighbour_weight * max(0, base(prev t), base(next t))
                       + group_weight * max(0, best base(u) of S0's turns u in t's group)
                       (+ the recency prior)

        ``own(t) = base(t)`` on ``S0``; a neighbour outside ``S0`` gets its similarity (dense) or 0.
        ``prev`` / ``next``: the turns of the same group (``group_key``) adjacent in id order
        (write order: conversation order for turns written in order) that pass the filter.
        Dense mode also adds every turn of the top ``candidates`` topics to ``S0`` when
        ``alpha != 0`` (as the plain two-level search does).

        Returns
        -------
        ids : np.ndarray int64 ``[B, k]``
            Best first; ``-1`` padding when fewer than ``k`` records match (unknown namespaces
            give all padding). Only ``namespace``'s records are ever returned.
        scores : np.ndarray float32 ``[B, k]``
            Higher is better: similarity (see module docstring), BM25 score, or fused score
            (+ the recency prior); :data:`PAD_SCORE` beside padding.
        """
        turn_ctx = (neighbour_weight, group_weight, group_key) != (0.0, 0.0, None)
        if level == "turn+topic" and (mode != "dense" or filter is not None or time_range is not None
                                      or recency is not None or turn_ctx):
            return self._search_turn_topic_ex(
                namespace, queries, k, ef, include_invalidated, alpha, candidates, mode, texts, fusion,
                lexical_weight, filter, time_range, time_field, recency, recency_weight, now, neighbour_weight,
                group_weight, group_key)
        if turn_ctx:
            raise bad_arg("neighbour_weight / group_weight / group_key", 'the defaults unless level="turn+topic"',
                          (neighbour_weight, group_weight, group_key))
        if (mode != "dense" or filter is not None or time_range is not None or recency is not None):
            return self._search_ex(namespace, queries, k, ef, include_invalidated, level, candidates, mode, texts,
                                   fusion, lexical_weight, filter, time_range, time_field, recency,
                                   recency_weight, now)
        n = self._n()
        ns = _check_namespace(namespace)
        q = _as_queries(queries, n.dim)
        k = _check_int(k, "k", 1, MAX_K)
        if k * q.shape[0] > MAX_RESULTS:
            raise bad_arg("k", f"B * k <= {MAX_RESULTS} result slots (B = {q.shape[0]} queries)", k)
        ef = self.ef_search if ef is None else _check_int(ef, "ef", 1, MAX_EF, none_ok=True)
        if level == "turn+topic":
            check_float("alpha", alpha, -MAX_ALPHA, MAX_ALPHA, finite=True)
            c = _check_int(candidates, "candidates", 1, MAX_CANDIDATES, none_ok=True)
            if c is None:
                c = min(max(4 * k, 50), MAX_CANDIDATES)
            return n.search_turn_topic(ns, q, k, int(ef), bool(include_invalidated), float(alpha), c)
        if level not in _LEVELS:
            raise bad_arg("level", '"topic", "turn" or "turn+topic"', level)
        return n.search(ns, q, int(k), int(ef), bool(include_invalidated), _level(level))

    def _first_stage(self, n, queries, k, ef, candidates, mode, texts, fusion, lexical_weight, flt, time_range,
                     time_field, recency, recency_weight, now) -> tuple:
        """The checked arguments of a lexical / hybrid / filtered search (both native calls):
        ``(q, texts, k, ef, candidates, mode, fusion, w, clauses, has_time, t_lo, t_hi, time_field,
        half_life, recency_weight, now)``."""
        if mode not in _MODES:
            raise bad_arg("mode", '"dense", "lexical" or "hybrid"', mode)
        B = None
        q = None
        if queries is None:
            if mode != "lexical":
                raise bad_arg("queries", f'query vectors for mode="{mode}"', None)
        else:
            q = _as_queries(queries, n.dim)
            B = q.shape[0]
        tl: list[str] = []
        if mode != "dense":
            tl = _check_texts(texts, B)
            B = len(tl)
            if q is None:
                q = np.zeros((B, n.dim), dtype=np.float32)
        k = _check_int(k, "k", 1, MAX_K)
        if k * B > MAX_RESULTS:
            raise bad_arg("k", f"B * k <= {MAX_RESULTS} result slots (B = {B} queries)", k)
        ef = self.ef_search if ef is None else _check_int(ef, "ef", 1, MAX_EF, none_ok=True)
        c = _check_int(candidates, "candidates", 1, MAX_CANDIDATES, none_ok=True)
        if c is None:
            c = min(max(4 * k, 50), MAX_CANDIDATES)
        if fusion not in _FUSIONS:
            raise bad_arg("fusion", '"coverage", "rrf" or "weighted"', fusion)
        w = _check_real(lexical_weight, "lexical_weight", 0.0, 1.0)
        clauses = _compile_filter(flt)
        if time_field not in _TIME_FIELDS:
            raise bad_arg("time_field", '"event", "created" or "updated"', time_field)
        has_time, t_lo, t_hi = _check_time_range(time_range)
        half_life = 0.0
        if recency is not None:
            half_life = _check_real(recency, "recency", 0.0, MAX_TIME, open_low=True)
        rw = _check_real(recency_weight, "recency_weight", -MAX_RECENCY_WEIGHT, MAX_RECENCY_WEIGHT)
        t_now = time.time() if now is None else check_time("now", now)
        return (q, tl, k, int(ef), c, _MODES[mode], _FUSIONS[fusion], w, clauses, has_time, t_lo, t_hi,
                _TIME_FIELDS[time_field], half_life, rw, t_now)

    def _search_turn_topic_ex(self, namespace, queries, k, ef, include_invalidated, alpha, candidates, mode, texts,
                              fusion, lexical_weight, flt, time_range, time_field, recency, recency_weight, now,
                              neighbour_weight, group_weight, group_key):
        """search(level="turn+topic") with a lexical list, a filter, a time range, a recency prior or
        context terms (validated here, computed in one native call; see *Two-level search*)."""
        n = self._n()
        ns = _check_namespace(namespace)
        (q, tl, k, ef, c, mode_i, fusion_i, w, clauses, has_time, t_lo, t_hi, tf, half_life, rw,
         t_now) = self._first_stage(n, queries, k, ef, candidates, mode, texts, fusion, lexical_weight, flt,
                                    time_range, time_field, recency, recency_weight, now)
        a = check_float("alpha", alpha, -MAX_ALPHA, MAX_ALPHA, finite=True)
        nw = check_float("neighbour_weight", neighbour_weight, -MAX_ALPHA, MAX_ALPHA, finite=True)
        gw = check_float("group_weight", group_weight, -MAX_ALPHA, MAX_ALPHA, finite=True)
        if group_key is not None:
            if not isinstance(group_key, str):
                raise bad_arg("group_key", "None or a str (a meta key)", type(group_key).__name__, MemkernTypeError)
            if not group_key or len(group_key) > MAX_FILTER_STR:
                raise bad_arg("group_key", f"a meta key of 1..{MAX_FILTER_STR} characters", group_key)
            _check_utf8(group_key, "group_key")
        if not hasattr(n, "search_turn_topic_ex"):
            raise bad_arg("level", f'a store whose engine runs the two-level hybrid search ({type(self).__name__} '
                          'does not); use mode="dense" without filters or context weights', "turn+topic",
                          MemkernValueError)
        return n.search_turn_topic_ex(ns, q, tl, k, ef, bool(include_invalidated), mode_i, fusion_i, w, clauses,
                                      has_time, t_lo, t_hi, tf, half_life, rw, t_now, c, float(a), float(nw),
                                      float(gw), group_key or "")

    def _search_ex(self, namespace, queries, k, ef, include_invalidated, level, candidates, mode, texts, fusion,
                   lexical_weight, flt, time_range, time_field, recency, recency_weight, now):
        """search() with a lexical list, a filter, a time range or a recency prior (validated here,
        computed in one native call)."""
        n = self._n()
        ns = _check_namespace(namespace)
        if mode not in _MODES:
            raise bad_arg("mode", '"dense", "lexical" or "hybrid"', mode)
        if level not in _LEVELS:
            raise bad_arg("level", '"topic", "turn" or "turn+topic"', level)
        (q, tl, k, ef, c, mode_i, fusion_i, w, clauses, has_time, t_lo, t_hi, tf, half_life, rw,
         t_now) = self._first_stage(n, queries, k, ef, candidates, mode, texts, fusion, lexical_weight, flt,
                                    time_range, time_field, recency, recency_weight, now)
        return n.search_ex(ns, q, tl, k, ef, bool(include_invalidated), _level(level), mode_i, fusion_i, w, clauses,
                           has_time, t_lo, t_hi, tf, half_life, rw, t_now, c)

    def namespaces(self) -> list[str]:
        """Namespaces that hold at least one record (sorted)."""
        return list(self._n().namespaces())

    def ids(self, namespace: str, include_invalidated: bool = False, *, level: str = "topic") -> np.ndarray:
        """All record ids of ``namespace`` at ``level`` ("topic" or "turn"), ascending, int64 ``[n]``
        (invalidated ones only with ``include_invalidated``)."""
        ns = _check_namespace(namespace)
        if level not in _LEVELS:
            raise bad_arg("level", '"topic" or "turn"', level)
        return self._n().ids(ns, bool(include_invalidated), _level(level))

    def count(self, namespace: str, include_invalidated: bool = False, *, level: str = "topic") -> int:
        """Number of records of ``namespace`` at ``level`` ("topic" or "turn"). Invalidated
        records are excluded unless ``include_invalidated``; deleted ones are never counted."""
        ns = _check_namespace(namespace)
        if level not in _LEVELS:
            raise bad_arg("level", '"topic" or "turn"', level)
        return int(self._n().count(ns, bool(include_invalidated), _level(level)))

    def __contains__(self, id: object) -> bool:
        try:
            return bool(self._n().contains(_check_id(id)))
        except (MemkernKeyError, MemkernTypeError):
            return False

    # ------------------------------------------------------------------ maintenance
    def flush(self) -> None:
        """Force the log to disk (fsync)."""
        self._n().flush()

    def snapshot(self, wait: bool = True) -> None:
        """Write a snapshot now and retire the log files it holds; other threads' calls go on
        meanwhile.

        ``wait=True``: in this thread (after the background one, if one is running); raises on
        failure (nothing is lost: the log keeps every write). ``wait=False``: hand it to the
        background thread, as the automatic snapshot does, and return at once; a failure is then
        reported like the automatic one's (:attr:`last_snapshot_error`, a warning)."""
        if not isinstance(wait, bool):
            raise bad_arg("wait", "a bool", type(wait).__name__, MemkernTypeError)
        if wait:
            self._n().snapshot()
        else:
            self._n().snapshot_async()

    def compact(self) -> None:
        """Remove deleted records and their vectors (graphs holding deleted points are rebuilt),
        drop empty namespaces, write a snapshot and truncate the log: afterwards deleted data is
        no longer in the store's files."""
        self._n().compact()

    def memory_bytes(self) -> int:
        """Approximate heap bytes held by the native store (records + graphs)."""
        return int(self._n().memory_bytes())

    def close(self) -> None:
        """Wait for a background snapshot in progress, snapshot if the log holds anything (only the
        namespaces changed since the last snapshot are written), fsync, release the lock. Idempotent.

        A failed snapshot here is logged and kept in :attr:`last_snapshot_error`, not raised: every
        acknowledged write is already in the log, which the next open replays. Raises only when
        the final fsync of the log fails (the store is released all the same)."""
        if self._native is not None and not self._native.closed:
            self._native.close()
