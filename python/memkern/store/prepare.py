"""Prepare, then run: every store write and search is checked apart from the engine call.

A :class:`~memkern.MemoryStore` operation is two steps:

1. ``prepare_<op>(dim, ...)`` validates and normalises the arguments with the checks of
   :mod:`memkern.store.checks` (raising the errors that name the argument) and encodes them for the
   engine (float32 matrices, JSON texts, enum codes). It reads nothing from a store and has no side
   effects, so it runs wherever the caller is.
2. ``store.run(call)`` runs the prepared call in the native engine (the GIL released where the
   engine releases it).

``MemoryStore.add`` is ``store.run(prepare_add(store.dim, ...))``, and so on for ``add_batch``,
``merge``, ``update`` and ``search``. :class:`~memkern.store.aio.AsyncMemoryStore` prepares in the
calling task (bad input raises there, before anything is scheduled) and runs in its pool; the
adapters and servers check their search options with :func:`check_search_filters`. No check exists
twice.

A prepared call is a frozen value holding only checked, encoded arguments; its ``run(store)``
method is what ``store.run`` calls.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, NamedTuple, Sequence

import numpy as np

from . import checks as _checks  # _checks.all_finite: the native check, bound on first use
from . import reference as _lexical
from ..base.turns import turn_key
from ..base.validate import MAX_NAMESPACE_CHARS, MAX_TIME, check_float, check_time, check_utf8, json_text
from ..errors import MemkernTypeError, MemkernValueError, bad_arg
from .checks import (DEFAULT_RECENCY_WEIGHT, FUSIONS, LEVELS, MAX_ALPHA, MAX_CANDIDATES, MAX_EF, MAX_FILTER_STR,
                     MAX_K, MAX_RECENCY_WEIGHT, MAX_RESULTS, MODES, NO_TIMES, TIME_FIELDS, F32, as_matrix, as_queries,
                     as_vector, check_event_time, check_id, check_integer, check_meta, check_namespace, check_real,
                     check_summary, check_texts, check_time_range, check_turn_texts, check_turns, compile_filter,
                     event_array, turn_matrix)
from .native import native_level, native_module
from .record import loads

__all__ = ["AddCall", "VersionCall", "SearchCall", "prepare_add", "prepare_add_batch",
           "prepare_merge", "prepare_update", "prepare_search", "dense_args", "check_search_filters"]


# ----------------------------------------------------------------------------------- writes


def _turn_item(turn: dict, pos: int, text: str | None = None) -> tuple[str, str, str]:
    """A turn record's (text, turns JSON, meta JSON): its text defaults to the turn's content."""
    return (turn["content"] if text is None else text), json_text([turn], "turns"), \
        json_text({"turn_position": pos}, "meta")


@dataclass(frozen=True)
class AddCall:
    """A checked ``add`` / ``add_batch``: the arguments of the engine's one ``add`` call.

    Attributes
    ----------
    namespace : str
    texts, turns_json, metas_json : list of str
        One per row: topic summaries and turn texts, their turns and meta as JSON.
    rows : np.ndarray float32 ``[R, d]``
        The vectors, each topic followed by its turn records' vectors.
    levels : np.ndarray uint8 ``[R]``
        0 for a topic, 1 for a turn record.
    parents : np.ndarray int64 ``[R]``
        -1 for a topic; ``-2 - i`` for a turn of the topic at row ``i``.
    event_times : np.ndarray float64 ``[R]`` or ``[0]``
        NaN where a row has none; empty when no row has one.
    topic_rows : np.ndarray int64 ``[n]`` or None
        The rows of the topics (``None``: every row is a topic).
    single : bool
        ``add`` (returns an int) rather than ``add_batch`` (returns int64 ``[n]``).
    """

    namespace: str
    texts: list
    turns_json: list
    metas_json: list
    rows: np.ndarray
    levels: np.ndarray
    parents: np.ndarray
    event_times: np.ndarray
    topic_rows: np.ndarray | None
    single: bool

    def run(self, store: Any) -> Any:
        ids = store.native.add(self.namespace, self.texts, self.turns_json, self.metas_json, self.rows,
                               self.levels, self.parents, self.event_times)
        if self.topic_rows is not None:
            ids = np.ascontiguousarray(ids[self.topic_rows], dtype=np.int64)
        return int(ids[0]) if self.single else ids


def _constant(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


_ONE_TOPIC_LEVEL = _constant(np.zeros(1, dtype=np.uint8))        # levels / parents of one topic row
_ONE_TOPIC_PARENT = _constant(np.full(1, -1, dtype=np.int64))


def _add_call(ns, sums, emb, tl, ml, te, et, tt, single: bool) -> AddCall:
    has_et = any(t is not None for t in et)
    if not any(t is not None for t in te):
        n = len(sums)
        return AddCall(ns, sums, [json_text(t, "turns") for t in tl], [json_text(m, "meta") for m in ml], emb,
                       _ONE_TOPIC_LEVEL if n == 1 else np.zeros(n, dtype=np.uint8),
                       _ONE_TOPIC_PARENT if n == 1 else np.full(n, -1, dtype=np.int64),
                       event_array(et) if has_et else NO_TIMES, None, single)
    # Two-level: each topic is followed by its turn records (parent = -2 - the topic's row).
    S, T, Mt, rows, lv, par, topic_pos, E = [], [], [], [], [], [], [], []
    for i in range(len(sums)):
        topic_pos.append(len(S))
        ti = len(S)
        S.append(sums[i]); T.append(json_text(tl[i], "turns")); Mt.append(json_text(ml[i], "meta"))
        rows.append(emb[i]); lv.append(0); par.append(-1); E.append(et[i])
        if te[i] is not None:
            for j, turn in enumerate(tl[i]):
                s, t, m = _turn_item(turn, j, tt[i][j] if tt and tt[i] is not None else None)
                S.append(s); T.append(t); Mt.append(m); rows.append(te[i][j]); lv.append(1); par.append(-2 - ti)
                E.append(et[i])  # a turn record carries its topic's event time
    return AddCall(ns, S, T, Mt, np.ascontiguousarray(np.stack(rows), dtype=np.float32),
                   np.asarray(lv, dtype=np.uint8), np.asarray(par, dtype=np.int64),
                   event_array(E) if has_et else NO_TIMES, np.asarray(topic_pos, dtype=np.int64), single)


def prepare_add(dim: int, namespace: Any, summary: Any, embedding: Any, turns: Any = None, meta: Any = None, *,
                turn_embeddings: Any = None, event_time: Any = None, turn_texts: Any = None) -> AddCall:
    """Check :meth:`MemoryStore.add`'s arguments (same parameters, and the store's ``dim``)."""
    ns = check_namespace(namespace)
    s = check_summary(summary)
    vec = as_vector(embedding, dim, "embedding")
    tl = check_turns(turns)
    m = check_meta(meta)
    te = turn_matrix(turn_embeddings, dim, tl, "turn_embeddings")
    tt = check_turn_texts(turn_texts, tl, te, "turn_texts")
    et = check_event_time(event_time, "event_time")
    return _add_call(ns, [s], vec[None, :], [tl], [m], [te], [et], [tt], True)


def prepare_add_batch(dim: int, namespace: Any, summaries: Any, embeddings: Any, turns: Any = None,
                      metas: Any = None, *, turn_embeddings: Any = None, event_times: Any = None,
                      turn_texts: Any = None) -> AddCall:
    """Check :meth:`MemoryStore.add_batch`'s arguments (same parameters, and the store's ``dim``)."""
    ns = check_namespace(namespace)
    if isinstance(summaries, str) or not isinstance(summaries, Sequence):
        raise bad_arg("summaries", "a list of str", type(summaries).__name__, MemkernTypeError)
    count = len(summaries)
    sums = [check_summary(s, f"summaries[{i}]") for i, s in enumerate(summaries)]
    emb = as_matrix(embeddings, dim, "embeddings", count)
    if turns is not None and len(turns) != count:
        raise bad_arg("turns", f"None or a list of {count} turn lists", f"length {len(turns)}")
    if metas is not None and len(metas) != count:
        raise bad_arg("metas", f"None or a list of {count} dicts", f"length {len(metas)}")
    if turn_embeddings is not None and len(turn_embeddings) != count:
        raise bad_arg("turn_embeddings", f"None or a list of {count} arrays", f"length {len(turn_embeddings)}")
    tl = [check_turns(turns[i] if turns is not None else None, f"turns[{i}]") for i in range(count)]
    ml = [check_meta(metas[i] if metas is not None else None, f"metas[{i}]") for i in range(count)]
    te = [turn_matrix(turn_embeddings[i] if turn_embeddings is not None else None, dim, tl[i],
                      f"turn_embeddings[{i}]") for i in range(count)]
    if event_times is not None:
        if isinstance(event_times, (str, bytes)) or not isinstance(event_times, (Sequence, np.ndarray)):
            raise bad_arg("event_times", f"None or a list of {count} floats / None", type(event_times).__name__,
                          MemkernTypeError)
        if len(event_times) != count:
            raise bad_arg("event_times", f"None or a list of {count} floats / None", f"length {len(event_times)}")
        et = [check_event_time(event_times[i], f"event_times[{i}]") for i in range(count)]
    else:
        et = [None] * count
    if turn_texts is not None and (isinstance(turn_texts, (str, bytes)) or not isinstance(turn_texts, Sequence)
                                   or len(turn_texts) != count):
        raise bad_arg("turn_texts", f"None or a list of {count} lists of str / None",
                      f"length {len(turn_texts)}" if isinstance(turn_texts, Sequence) else type(turn_texts).__name__)
    tt = [check_turn_texts(turn_texts[i] if turn_texts is not None else None, tl[i], te[i], f"turn_texts[{i}]")
          for i in range(count)]
    return _add_call(ns, sums, emb, tl, ml, te, et, tt, False)


def _child_args(dim: int, te: np.ndarray | None, rows: list, tt: list | None) -> tuple:
    """The new turn records of a ``merge`` / ``update``: (texts, turns JSON, meta JSON, float32
    ``[c, d]``) for ``rows`` = ``[(position, turn, index in te)]``."""
    if te is None or not rows:
        return [], [], [], np.zeros((0, dim), dtype=np.float32)
    cs, ct, cm = [], [], []
    for pos, t, j in rows:
        s, tj, m = _turn_item(t, pos, tt[j] if tt is not None else None)
        cs.append(s); ct.append(tj); cm.append(m)
    return cs, ct, cm, np.ascontiguousarray(te[[j for _, _, j in rows]], dtype=np.float32)


def _child_times(t: float | None, count: int) -> np.ndarray:
    return event_array([t] * count) if t is not None and count else NO_TIMES


@dataclass(frozen=True)
class VersionCall:
    """A checked ``merge`` or ``update`` (``op``): the new summary (``None`` keeps it), vector
    ``[1, d]`` (or ``None``), turns, meta and the new turn records' inputs. Running it reads the
    record and writes its new version in one log entry: ``merge`` keeps the union of the old and new
    turns and adds turn records for the new ones; ``update`` replaces the turns given, and their
    turn records with them."""

    op: str
    id: int
    summary: str | None
    vector: np.ndarray | None
    turns: list | None
    meta_json: str | None
    turn_embeddings: np.ndarray | None
    turn_texts: list | None
    event_time: float | None

    def run(self, store: Any) -> int:
        n = store.native
        rid, te = self.id, self.turn_embeddings
        cur = n.get(rid)
        if self.op == "merge":
            old_turns = loads(cur.turns_json, rid, "turns")
            seen = {turn_key(t) for t in old_turns}
            turns = list(old_turns)
            rows = []
            for j, t in enumerate(self.turns):
                k = turn_key(t)
                if k not in seen:
                    seen.add(k)
                    turns.append(t)
                    rows.append((len(turns) - 1, t, j))
            missing = cur.children and rows and te is None
        else:
            turns = self.turns
            rows = [(j, t, j) for j, t in enumerate(turns)] if (te is not None and turns) else []
            missing = turns is not None and cur.children and te is None
        if missing:
            raise bad_arg("turn_embeddings", f"embeddings for the new turns (record {rid} has turn records)", None)
        cs, ct, cm, ce = _child_args(n.dim, te, rows, self.turn_texts)
        child_t = self.event_time if self.event_time is not None else cur.event_time
        op = native_module().Op.merge if self.op == "merge" else native_module().Op.update
        version, _ = n.new_version(rid, op, self.summary, self.vector,
                                   json_text(turns, "turns") if turns is not None else None, self.meta_json,
                                   cs, ct, cm, ce, self.op == "update" and te is not None, self.event_time,
                                   _child_times(child_t, len(cs)))
        return int(version)


def prepare_merge(dim: int, id: Any, summary: Any, embedding: Any, turns: Any = None, *, meta: Any = None,
                  turn_embeddings: Any = None, event_time: Any = None, turn_texts: Any = None) -> VersionCall:
    """Check :meth:`MemoryStore.merge`'s arguments (same parameters, and the store's ``dim``)."""
    rid = check_id(id)
    s = check_summary(summary)
    vec = as_vector(embedding, dim, "embedding")
    tl = check_turns(turns)
    m = check_meta(meta) if meta is not None else None
    te = turn_matrix(turn_embeddings, dim, tl, "turn_embeddings")
    tt = check_turn_texts(turn_texts, tl, te, "turn_texts")
    et = check_event_time(event_time, "event_time")
    return VersionCall("merge", rid, s, vec[None, :], tl, json_text(m, "meta") if m is not None else None, te, tt, et)


def prepare_update(dim: int, id: Any, summary: Any = None, embedding: Any = None, turns: Any = None,
                   meta: Any = None, *, turn_embeddings: Any = None, event_time: Any = None,
                   turn_texts: Any = None) -> VersionCall:
    """Check :meth:`MemoryStore.update`'s arguments (same parameters, and the store's ``dim``)."""
    rid = check_id(id)
    if summary is None and embedding is None and turns is None and meta is None and event_time is None:
        raise bad_arg("update", "at least one of summary, embedding, turns, meta, event_time", "none")
    et = check_event_time(event_time, "event_time")
    s = check_summary(summary) if summary is not None else None
    vec = as_vector(embedding, dim, "embedding")[None, :] if embedding is not None else None
    tl = check_turns(turns) if turns is not None else None
    m = check_meta(meta) if meta is not None else None
    te = None
    if turn_embeddings is not None:
        if tl is None:
            raise bad_arg("turn_embeddings", "to come with turns", "no turns")
        te = turn_matrix(turn_embeddings, dim, tl, "turn_embeddings")
    tt = check_turn_texts(turn_texts, tl or [], te, "turn_texts")
    return VersionCall("update", rid, s, vec, tl, json_text(m, "meta") if m is not None else None, te, tt, et)


# ----------------------------------------------------------------------------------- search


class SearchCall(NamedTuple):
    """A checked ``search``: which of the engine's four searches runs (``"search"``,
    ``"search_turn_topic"``, ``"search_ex"`` or ``"search_turn_topic_ex"``) and its arguments.
    Running it returns ``(ids int64 [B, k], scores float32 [B, k])``. (A tuple: it is built on
    every query.)"""

    method: str
    args: tuple

    def run(self, store: Any) -> tuple[np.ndarray, np.ndarray]:
        fn = getattr(store.native, self.method, None)
        if fn is None:
            raise bad_arg("level", f'a store whose engine runs the two-level hybrid search ({type(store).__name__} '
                          'does not); use mode="dense" without filters or context weights', "turn+topic",
                          MemkernValueError)
        return fn(*self.args)


def _candidates(candidates: Any, k: int) -> int:
    c = check_integer(candidates, "candidates", 1, MAX_CANDIDATES, none_ok=True)
    return min(max(4 * k, 50), MAX_CANDIDATES) if c is None else c


def _k_ef(k: Any, ef: Any, B: int, ef_default: int) -> tuple[int, int]:
    k = check_integer(k, "k", 1, MAX_K)
    if k * B > MAX_RESULTS:
        raise bad_arg("k", f"B * k <= {MAX_RESULTS} result slots (B = {B} queries)", k)
    return k, int(ef_default if ef is None else check_integer(ef, "ef", 1, MAX_EF, none_ok=True))


def _first_stage(dim, ef_default, queries, k, ef, candidates, mode, texts, fusion, lexical_weight, flt, time_range,
                 time_field, recency, recency_weight, now) -> tuple:
    """The checked arguments of a lexical / hybrid / filtered search (both ``_ex`` engine calls):
    ``(q, texts, k, ef, candidates, mode, fusion, w, clauses, has_time, t_lo, t_hi, time_field,
    half_life, recency_weight, now)``."""
    if mode not in MODES:
        raise bad_arg("mode", '"dense", "lexical" or "hybrid"', mode)
    B = None
    q = None
    if queries is None:
        if mode != "lexical":
            raise bad_arg("queries", f'query vectors for mode="{mode}"', None)
    else:
        q = as_queries(queries, dim)
        B = q.shape[0]
    tl: list[str] = []
    if mode != "dense":
        tl = check_texts(texts, B)
        B = len(tl)
        if q is None:
            q = np.zeros((B, dim), dtype=np.float32)
    k, ef = _k_ef(k, ef, B, ef_default)
    c = _candidates(candidates, k)
    if fusion not in FUSIONS:
        raise bad_arg("fusion", '"coverage", "rrf" or "weighted"', fusion)
    w = check_real(lexical_weight, "lexical_weight", 0.0, 1.0)
    clauses = compile_filter(flt)
    if time_field not in TIME_FIELDS:
        raise bad_arg("time_field", '"event", "created" or "updated"', time_field)
    has_time, t_lo, t_hi = check_time_range(time_range)
    half_life = 0.0
    if recency is not None:
        half_life = check_real(recency, "recency", 0.0, MAX_TIME, open_low=True)
    rw = check_real(recency_weight, "recency_weight", -MAX_RECENCY_WEIGHT, MAX_RECENCY_WEIGHT)
    t_now = time.time() if now is None else check_time("now", now)
    return (q, tl, k, ef, c, MODES[mode], FUSIONS[fusion], w, clauses, has_time, t_lo, t_hi,
            TIME_FIELDS[time_field], half_life, rw, t_now)


def _check_level(level: Any) -> None:
    if level not in LEVELS:
        raise bad_arg("level", '"topic", "turn" or "turn+topic"', level)


def prepare_search(dim: int, ef_default: int, namespace: Any, queries: Any, k: Any = 20, ef: Any = None,
                   include_invalidated: Any = False, *, level: Any = "topic", alpha: Any = 1.0,
                   candidates: Any = None, mode: Any = "dense", texts: Any = None,
                   fusion: Any = _lexical.DEFAULT_FUSION, lexical_weight: Any = _lexical.DEFAULT_LEXICAL_WEIGHT,
                   filter: Any = None, time_range: Any = None, time_field: Any = "event", recency: Any = None,
                   recency_weight: Any = DEFAULT_RECENCY_WEIGHT, now: Any = None, neighbour_weight: Any = 0.0,
                   group_weight: Any = 0.0, group_key: Any = None) -> SearchCall:
    """Check :meth:`MemoryStore.search`'s arguments (same parameters and defaults, with the store's
    ``dim`` and default ``ef``) and choose the engine call: the plain dense search (or its
    ``turn+topic`` form) when only vectors are given, else the one-call search with lexical lists,
    filters, time and context terms."""
    ns = check_namespace(namespace)
    inv = bool(include_invalidated)
    turn_ctx = (neighbour_weight, group_weight, group_key) != (0.0, 0.0, None)
    ex = mode != "dense" or filter is not None or time_range is not None or recency is not None
    if level == "turn+topic" and (ex or turn_ctx):
        (q, tl, k, ef, c, mode_i, fusion_i, w, clauses, has_time, t_lo, t_hi, tf, half_life, rw,
         t_now) = _first_stage(dim, ef_default, queries, k, ef, candidates, mode, texts, fusion, lexical_weight,
                               filter, time_range, time_field, recency, recency_weight, now)
        a = check_float("alpha", alpha, -MAX_ALPHA, MAX_ALPHA, finite=True)
        nw = check_float("neighbour_weight", neighbour_weight, -MAX_ALPHA, MAX_ALPHA, finite=True)
        gw = check_float("group_weight", group_weight, -MAX_ALPHA, MAX_ALPHA, finite=True)
        if group_key is not None:
            if not isinstance(group_key, str):
                raise bad_arg("group_key", "None or a str (a meta key)", type(group_key).__name__, MemkernTypeError)
            if not group_key or len(group_key) > MAX_FILTER_STR:
                raise bad_arg("group_key", f"a meta key of 1..{MAX_FILTER_STR} characters", group_key)
            check_utf8(group_key, "group_key")
        return SearchCall("search_turn_topic_ex", (ns, q, tl, k, ef, inv, mode_i, fusion_i, w, clauses, has_time,
                                                   t_lo, t_hi, tf, half_life, rw, t_now, c, float(a), float(nw),
                                                   float(gw), group_key or ""))
    if turn_ctx:
        raise bad_arg("neighbour_weight / group_weight / group_key", 'the defaults unless level="turn+topic"',
                      (neighbour_weight, group_weight, group_key))
    if ex:
        if mode not in MODES:
            raise bad_arg("mode", '"dense", "lexical" or "hybrid"', mode)
        _check_level(level)
        (q, tl, k, ef, c, mode_i, fusion_i, w, clauses, has_time, t_lo, t_hi, tf, half_life, rw,
         t_now) = _first_stage(dim, ef_default, queries, k, ef, candidates, mode, texts, fusion, lexical_weight,
                               filter, time_range, time_field, recency, recency_weight, now)
        return SearchCall("search_ex", (ns, q, tl, k, ef, inv, native_level(level), mode_i, fusion_i, w, clauses,
                                        has_time, t_lo, t_hi, tf, half_life, rw, t_now, c))
    if level == "turn+topic":
        q = as_queries(queries, dim)
        k, ef = _k_ef(k, ef, q.shape[0], ef_default)
        a = check_float("alpha", alpha, -MAX_ALPHA, MAX_ALPHA, finite=True)
        return SearchCall("search_turn_topic", (ns, q, k, ef, inv, float(a), _candidates(candidates, k)))
    return SearchCall("search", dense_args(dim, ef_default, ns, queries, k, ef, inv, level))


def dense_args(dim: int, ef_default: int, namespace: Any, queries: Any, k: Any = 20, ef: Any = None,
               include_invalidated: Any = False, level: Any = "topic") -> tuple:
    """The checked arguments of the engine's plain dense ``search`` (``level`` "topic" or
    "turn"): ``(namespace, q float32 [B, d], k, ef, include_invalidated, native level)``, what
    :func:`prepare_search` puts in its ``SearchCall("search", ...)``; ``MemoryStore.search`` calls
    it directly for that case. Same checks and errors as the general path, with cheap tests first."""
    if not (type(namespace) is str and 0 < len(namespace) <= MAX_NAMESPACE_CHARS and namespace.isascii()):
        namespace = check_namespace(namespace)
    q = queries
    if not (type(q) is np.ndarray and q.dtype is F32 and q.ndim == 2 and q.shape[1] == dim and _checks.all_finite(q)):
        q = as_queries(queries, dim)  # (the engine call makes a float32 [B, d] C-contiguous without copying it)
    if not (type(k) is int and 1 <= k <= MAX_K and k * q.shape[0] <= MAX_RESULTS
            and (ef is None or (type(ef) is int and 1 <= ef <= MAX_EF))):
        k, ef = _k_ef(k, ef, q.shape[0], ef_default)
    if level != "topic" and level != "turn":
        _check_level(level)
        raise bad_arg("level", '"topic" or "turn" for the plain dense search', level)
    return namespace, q, k, ef_default if ef is None else ef, bool(include_invalidated), native_level(level)


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
    compile_filter(filter)
    if time_field not in TIME_FIELDS:
        raise bad_arg("time_field", '"event", "created" or "updated"', time_field)
    check_time_range(time_range)
    if recency is not None:
        check_real(recency, "recency", 0.0, MAX_TIME, open_low=True)
    check_real(recency_weight, "recency_weight", -MAX_RECENCY_WEIGHT, MAX_RECENCY_WEIGHT)
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
