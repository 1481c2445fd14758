"""The checks of the store's arguments, and the limits they enforce.

Every function here validates and normalises one kind of argument the store takes, raising the
errors of :func:`memkern.errors.bad_arg` (the argument's name, what was expected, what came); none
touches a store. :mod:`memkern.store.prepare` composes them into the checks of whole calls.

Dtypes follow one rule, "convert where lossless, refuse otherwise": stored embeddings are float32;
float16 / bfloat16 are widened; float64 is accepted only when every value is exactly representable
in float32 (else :class:`~memkern.MemkernTypeError` asks for an explicit ``.astype(np.float32)``);
integer, bool and complex arrays, NaN and inf are refused; non-contiguous arrays are copied. Queries
are never stored, so float64 queries are rounded to float32.
"""
from __future__ import annotations

import math
import struct
from typing import Any, Sequence

import numpy as np

from . import reference as _lexical
from ..errors import MemkernKeyError, MemkernTypeError, MemkernValueError, bad_arg
from ..base.validate import (MAX_QUERY_CHARS, check_float, check_int, check_namespace_str,
                             check_text, check_time, check_turn, check_utf8, is_int, json_text, short)

#: Score written beside a ``-1`` padding id: the lowest finite float32.
PAD_SCORE: float = float(np.finfo(np.float32).min)

#: Default beam width of a search (``ef``); ``max(ef, k)`` is used. Measured: recall@10 >= 0.95
#: against exact search on clustered 384-d data with M=16, ef_construction=200 (tests/store/test_store.py
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
MAX_ID = (1 << 63) - 1

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
MODES = {"dense": 0, "lexical": 1, "hybrid": 2}
FUSIONS = _lexical.FUSIONS
TIME_FIELDS = {"event": 0, "created": 1, "updated": 2}
LEVELS = {"topic": 0, "turn": 1}
METRICS = ("ip", "l2", "cos")
FSYNC_MODES = ("always", "batch", "never")

def check_namespace(namespace: Any) -> str:
    """A namespace: a non-empty str of at most ``MAX_NAMESPACE_CHARS`` characters, valid UTF-8."""
    return check_namespace_str(namespace)


def check_integer(v: Any, name: str, lo: int, hi: int, none_ok: bool = False) -> int | None:
    """An int (not bool) in ``lo..hi``; the bound is checked before any conversion to C++
    (:func:`memkern.base.validate.check_int`, the store's convention: a non-int is a TypeError)."""
    return check_int(name, v, lo, hi, none_ok=none_ok, type_error=True)


NO_TIMES = np.zeros(0, dtype=np.float64)


def event_array(times: Sequence[float | None]) -> np.ndarray:
    """float64 ``[n]``, NaN where a record has no event time (the native encoding of "none")."""
    return np.array([math.nan if t is None else t for t in times], dtype=np.float64)


def check_event_time(t: Any, name: str) -> float | None:
    """``None`` or unix seconds in ``[MIN_TIME, MAX_TIME]`` (float)."""
    return check_time(name, t, none_ok=True)


def check_real(v: Any, name: str, lo: float, hi: float, open_low: bool = False) -> float:
    """A finite real (not bool) in ``[lo, hi]`` (``(lo, hi]`` with ``open_low``):
    :func:`memkern.base.validate.check_float`, the store's message."""
    rng = f"{'(' if open_low else '['}{lo:g}, {hi:g}]"
    return check_float(name, v, lo, hi, low_open=open_low, finite=True, expected=f"a finite real in {rng}",
                       type_error=True)


def check_texts(texts: Any, count: int | None) -> list[str]:
    """The query texts of a lexical / hybrid search: one str per query (``count`` of them when
    ``count`` is not ``None``), each at most :data:`MAX_QUERY_TEXT` characters."""
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
        return b"s" + check_utf8(v, where).encode("utf-8")
    raise bad_arg(where, "a str, int, float or bool", type(v).__name__, MemkernTypeError)


def compile_filter(flt: Any) -> list[tuple[str, list[bytes]]]:
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
        check_utf8(key, "filter")
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


def check_time_range(tr: Any) -> tuple[bool, float, float]:
    """``time_range`` -> ``(set, start, end)``: ``(False, -inf, inf)`` for ``None``."""
    if tr is None:
        return False, -math.inf, math.inf
    if isinstance(tr, (str, bytes)) or not isinstance(tr, (tuple, list)) or len(tr) != 2:
        raise bad_arg("time_range", "a (start, end) pair of unix seconds or None", tr)
    lo = -math.inf if tr[0] is None else check_time("time_range", tr[0])
    hi = math.inf if tr[1] is None else check_time("time_range", tr[1])
    if lo > hi:
        raise bad_arg("time_range", "start <= end", tr)
    return True, lo, hi

def check_id(x: Any, name: str = "id") -> int:
    """A record id: an int (or 0-d integer tensor) in ``0..MAX_ID``; out of range is a
    :class:`~memkern.MemkernKeyError` (no such id can exist)."""
    if is_torch(x) and x.ndim == 0 and not x.dtype.is_floating_point and not x.dtype.is_complex:
        x = x.item()  # 0-d integer tensor
    if not is_int(x):
        raise bad_arg(name, "an int", type(x).__name__, MemkernTypeError)
    v = int(x)
    if v < 0 or v > MAX_ID:
        raise MemkernKeyError(f"{name}: unknown id {short(v)} (ids are in 0..2**63-1)")
    return v


def check_ids(ids: Any, name: str = "ids") -> np.ndarray:
    """Record ids (sequence, numpy or torch) -> C-contiguous int64 ``[n]``."""
    if is_torch(ids):
        ids = ids.detach().cpu().numpy()
    arr = np.asarray(ids)
    if arr.dtype == object and arr.ndim == 1:
        ints = [v for v in arr.tolist() if isinstance(v, int) and not isinstance(v, bool)]
        if len(ints) == arr.size:  # Python ints beyond 64 bits
            raise MemkernKeyError(f"{name}: unknown id {short(max(ints, key=abs))} (ids are in 0..2**63-1)")
    if arr.dtype == object or arr.dtype.kind not in "iu" or arr.dtype == np.bool_:
        if arr.size == 0:
            return np.zeros(0, dtype=np.int64)
        raise bad_arg(name, "integer ids", f"dtype {arr.dtype}", MemkernTypeError)
    if arr.ndim != 1:
        raise bad_arg(name, "a 1-D sequence of ids", f"shape {tuple(arr.shape)}")
    if arr.size and arr.min() < 0:
        raise MemkernKeyError(f"{name}: unknown id {int(arr.min())} (ids are in 0..2**63-1)")
    if arr.size and arr.dtype.kind == "u" and int(arr.max()) > MAX_ID:
        raise MemkernKeyError(f"{name}: unknown id {int(arr.max())} (ids are in 0..2**63-1)")
    return np.ascontiguousarray(arr, dtype=np.int64)


def is_torch(x: Any) -> bool:
    """Whether ``x`` is a torch tensor (without importing torch)."""
    mod = type(x).__module__
    return mod.startswith("torch") and hasattr(x, "detach")


def as_float32(x: Any, name: str, stored: bool) -> np.ndarray:
    """numpy / torch (CPU) -> C-contiguous float32 following the module's dtype rule."""
    if stored and type(x) is np.ndarray and x.dtype is F32 and x.flags.c_contiguous and stored_rows_ok(x):
        # Fast path (the common case: a float32 vector from an embedder): one native pass applies
        # the engine's own rule (finite, norm <= MAX_NORM); anything else takes the checks below,
        # which name the first bad value.
        return x
    if is_torch(x):
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
    norms = None
    if stored and arr.ndim >= 1 and arr.size:
        # |<q, x>| <= ||q|| ||x||: with both norms <= 1e18 every score is finite in float32.
        # (Queries are checked by the native search itself, which names ``queries``: no extra
        # numpy passes on the search path.) A float32 squared never overflows float64, so the
        # norms are finite exactly when every value is: one pass checks both.
        norms = np.sqrt(np.square(arr, dtype=np.float64).sum(axis=-1))
    if not (np.isfinite(norms).all() if norms is not None else np.isfinite(arr).all()):
        bad = np.argwhere(~np.isfinite(arr))[0]
        raise bad_arg(name, "finite values", f"NaN or inf at index {tuple(int(i) for i in bad)}")
    if norms is not None and norms.max() > MAX_NORM:
        at = np.unravel_index(int(np.argmax(norms)), norms.shape)
        raise bad_arg(name, f"vectors with an L2 norm <= {MAX_NORM:g} (scores must stay finite in float32)",
                      f"norm {float(norms.max()):.3g} at row {tuple(int(i) for i in at)}")
    return np.ascontiguousarray(arr)


def as_vector(x: Any, dim: int, name: str) -> np.ndarray:
    """One stored vector as float32 ``[dim]`` (a ``[1, dim]`` row is accepted)."""
    arr = as_float32(x, name, stored=True)
    if arr.ndim == 2 and arr.shape[0] == 1:
        arr = arr[0]
    if arr.ndim != 1 or arr.shape[0] != dim:
        raise bad_arg(name, f"shape [{dim}]", f"shape {list(arr.shape)}")
    return arr


F32 = np.dtype(np.float32)  # the one float32 dtype object of native byte order


def stored_rows_ok(x: np.ndarray) -> bool:
    """Whether a C-contiguous float32 array is non-empty, finite, and every row (last axis) has an
    L2 norm <= ``MAX_NORM``: the engine's rule for stored vectors, in one native pass (bound to
    ``memkern._store.stored_rows_ok`` on first use)."""
    global stored_rows_ok
    from .native import native_module

    stored_rows_ok = native_module().stored_rows_ok
    return stored_rows_ok(x)


def all_finite(q: np.ndarray) -> bool:
    """Whether every value of a float32 array is finite: one native pass, no temporaries (bound to
    ``memkern._store.all_finite`` on first use)."""
    global all_finite
    from .native import native_module

    all_finite = native_module().all_finite
    return all_finite(q)


def as_queries(queries: Any, dim: int) -> np.ndarray:
    """Search queries as a C-contiguous float32 ``[B, dim]`` matrix (a ``[dim]`` vector is one query)."""
    if type(queries) is np.ndarray and queries.dtype is F32 and 1 <= queries.ndim <= 2 and queries.shape[-1] == dim:
        # Fast path (one query per call is the common case): one native pass for finiteness;
        # NaN / inf take the full check below, which names the first bad index.
        q = np.ascontiguousarray(queries if queries.ndim == 2 else queries[None, :])
        if all_finite(q):
            return q
    q = as_float32(queries, "queries", stored=False)
    if q.ndim == 1:
        q = q[None, :]
    if q.ndim != 2 or q.shape[1] != dim:
        raise bad_arg("queries", f"shape [B, {dim}] or [{dim}]", f"shape {list(np.shape(queries))}")
    return np.ascontiguousarray(q)


def as_matrix(x: Any, dim: int, name: str, rows: int | None, stored: bool = True) -> np.ndarray:
    """Vectors as float32 ``[rows, dim]`` (any row count when ``rows`` is ``None``)."""
    arr = as_float32(x, name, stored=stored)
    if arr.ndim != 2 or arr.shape[1] != dim or (rows is not None and arr.shape[0] != rows):
        exp = f"[{rows if rows is not None else 'n'}, {dim}]"
        raise bad_arg(name, f"shape {exp}", f"shape {list(arr.shape)}")
    return arr

def check_turns(turns: Any, name: str = "turns") -> list[dict]:
    """Turns: ``None`` (no turns) or a list of dicts with str ``role`` and ``content``; copied."""
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


def check_meta(meta: Any, name: str = "meta") -> dict:
    """``None`` (``{}``) or a JSON-compatible dict."""
    if meta is None:
        return {}
    if not isinstance(meta, dict):
        raise bad_arg(name, "a dict", type(meta).__name__, MemkernTypeError)
    json_text(meta, name)
    return meta


def check_turn_texts(texts: Any, turns: list[dict], te: Any, name: str) -> list[str] | None:
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
    return [check_summary(t, f"{name}[{i}]") for i, t in enumerate(texts)]


def check_summary(summary: Any, name: str = "summary") -> str:
    """A record text: a str, valid UTF-8, at most ``MAX_TEXT_CHARS`` characters."""
    return check_text(name, summary)

def check_engine_options(M: Any, ef_construction: Any, ef_search: Any, num_threads: Any, flat_limit: Any,
                          id_range: Any) -> tuple[int, int]:
    """Checks the engine options :class:`MemoryStore` and :class:`~memkern.InMemoryStore` share;
    returns ``(id_base, id_end)`` of ``id_range``."""
    check_int("M", M, 2, 4096)
    check_int("ef_construction", ef_construction, 1, 1 << 20)
    check_int("ef_search", ef_search, 1, MAX_EF, none_ok=True)
    check_int("num_threads", num_threads, 1, 256)
    check_integer(flat_limit, "flat_limit", 0, 1 << 24)
    id_base, id_end = 0, (1 << 63) - 1
    if id_range is not None:
        if (not isinstance(id_range, tuple) or len(id_range) != 2
                or any(isinstance(x, bool) or not isinstance(x, int) for x in id_range)
                or not 0 <= id_range[0] < id_range[1] <= id_end):
            raise bad_arg("id_range", "a tuple (first, end) of ints with 0 <= first < end <= 2**63 - 1", id_range)
        id_base, id_end = id_range
    return id_base, id_end


def turn_matrix(te: Any, dim: int, turns: list[dict], name: str) -> np.ndarray | None:
    """``turn_embeddings`` of one record: ``None``, or float32 ``[len(turns), dim]`` with at least
    one turn."""
    if te is None:
        return None
    m = as_matrix(te, dim, name, len(turns))
    if len(turns) == 0:
        raise bad_arg(name, "None when there are no turns", f"shape {list(m.shape)}")
    return m
