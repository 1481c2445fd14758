"""``InMemoryStore``: the memory store in process memory, in pure Python + numpy (no native code).

:class:`InMemoryStore` is :class:`memkern.MemoryStore`'s front end (every argument check, error
type and message, the dtype rules and the limits are the same code) over :class:`_PyStore`, a
pure-Python twin of the native ``memkern._store.Store`` (see ``_store.pyi``): same ids (assigned in
order, never reused), versions and history, invalidation and deletion (a topic's turn records
follow it), two-level memory (``level="turn"`` / ``"turn+topic"`` with ``alpha`` and
``candidates``), lexical / hybrid search, metadata filters, time ranges and the recency prior
(the native ``search_ex``, BM25 by :mod:`memkern.store.reference`), the same padding (``-1`` /
:data:`~memkern.store.PAD_SCORE`) and the same tie order (equal scores: lower id first).

Differences from :class:`~memkern.MemoryStore`:

* **Not persisted.** ``path`` is ``None``; ``flush`` and ``snapshot`` have nothing to write (they
  only check that the store is open); the records are gone when the object is. RMM keeps no
  reranker file for such a store (``RMM.save`` is a no-op, as the Store protocol says for
  ``path=None``). :func:`memkern.export_store` / :func:`memkern.import_store` move its content to
  and from files.
* **Always exact.** Every search is an exact scan (``ef`` is checked, then unused), so results
  equal a :class:`~memkern.MemoryStore` whose indexes are flat (``flat_limit``); for larger
  namespaces they are what HNSW approximates. Scores are computed in float64 and rounded to
  float32 (the native store computes in float32), so scores agree to float32 rounding.
* **Costs:** each dense search scans the namespace: ``O(n d)`` per query with numpy (no
  per-record Python loop); a metadata filter or time range is evaluated per record in Python, and
  BM25 walks the postings of the query's terms in Python; writes are Python (tens of us per
  record). Meant for tests, notebooks and small agents, and as the reference implementation of
  the Store protocol (``bench/bench_inmemory.py`` measures it against MemoryStore).

Thread safety: every call holds one lock (readers and writers are serialised); numpy releases the
GIL inside the scans.
"""
from __future__ import annotations

import bisect
import json
import math
import struct
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np

from ..errors import MemkernKeyError, MemkernValueError, bad_arg
from ..base.validate import TIME_RANGE_TEXT
from .engine import (
    DEFAULT_EF_SEARCH,
    MAX_TIME,
    MIN_TIME,
    MAX_ALPHA,
    MAX_CANDIDATES,
    MAX_K,
    MAX_NORM,
    MAX_RESULTS,
    PAD_SCORE,
    MemoryStore,
    _as_queries,
    _check_int,
)

__all__ = ["InMemoryStore"]

_METRICS = ("ip", "l2", "cos")
_TOPIC, _TURN = 0, 1
_OPS = {0: "add", 1: "merge", 2: "update"}
_F32_MAX = float(np.finfo(np.float32).max)


# ----------------------------------------------------------------------------------- records


@dataclass
class _Version:
    version: int
    summary: str
    turns_json: str
    meta_json: str
    embedding: np.ndarray  # float32 [d] (a copy)
    updated_at: float
    op: int


@dataclass
class _Rec:
    id: int
    ns: str
    level: int
    parent: int
    summary: str
    turns_json: str
    meta_json: str
    created_at: float
    updated_at: float
    status: str = "active"
    reason: str = ""
    version: int = 1
    op: int = 0
    history: list = field(default_factory=list)  # older _Version, oldest first
    children: list = field(default_factory=list)  # turn record ids of a topic
    event_time: float | None = None  # the conversation's own date (unix seconds)
    canon: dict = field(default_factory=dict)  # filterable meta: top-level key -> canonical bytes


def _canonical(v: Any) -> bytes | None:
    """The canonical bytes of a top-level meta value (the native filter's encoding, see
    ``memkern.store`` / ``filter.h``): JSON equality, ``1 == 1.0``, ``True != 1``; ``None`` for
    values that are not filterable (null, objects, arrays)."""
    if isinstance(v, bool):
        return b"b1" if v else b"b0"
    if isinstance(v, (int, float)):
        try:
            f = float(v)
        except OverflowError:
            f = math.inf if v > 0 else -math.inf
        return b"n" + struct.pack("<d", f + 0.0)
    if isinstance(v, str):
        return b"s" + v.encode("utf-8")
    return None


def _canon_meta(meta_json: str) -> dict:
    try:
        meta = json.loads(meta_json)
    except ValueError:
        return {}
    if not isinstance(meta, dict):
        return {}
    out = {}
    for key, v in meta.items():
        c = _canonical(v)
        if c is not None:
            out[key] = c
    return out


class _Lexical:
    """BM25 postings of one (namespace, level): every record it holds (active and invalidated;
    deleted ones removed), its text the record's summary, tokenised by
    :func:`memkern.store.reference.tokenize`."""

    __slots__ = ("post", "lens", "total")

    def __init__(self):
        self.post: dict[str, dict[int, int]] = {}
        self.lens: dict[int, int] = {}
        self.total = 0

    def put(self, rid: int, text: str) -> None:
        from .reference import tokenize

        self.remove(rid)
        toks = tokenize(text)
        self.lens[rid] = len(toks)
        self.total += len(toks)
        for t, tf in Counter(toks).items():
            self.post.setdefault(t, {})[rid] = tf

    def remove(self, rid: int) -> None:
        n = self.lens.pop(rid, None)
        if n is None:
            return
        self.total -= n
        for t in [t for t, p in self.post.items() if rid in p]:
            del self.post[t][rid]
            if not self.post[t]:
                del self.post[t]

    def search(self, terms: list[str], depth: int, allow) -> list[tuple[float, int]]:
        """Top ``depth`` (BM25, id) of the allowed records holding a query term (float64)."""
        from .reference import B as _B, K1 as _K1

        N = len(self.lens)
        if N == 0 or depth == 0 or self.total == 0:
            return []
        avgdl = self.total / N
        acc: dict[int, float] = {}
        for t in dict.fromkeys(terms):
            p = self.post.get(t)
            if not p:
                continue
            df = len(p)
            idf = math.log(1.0 + (N - df + 0.5) / (df + 0.5))
            for rid, tf in p.items():
                acc[rid] = acc.get(rid, 0.0) + idf * tf * (_K1 + 1.0) / (
                    tf + _K1 * (1.0 - _B + _B * self.lens[rid] / avgdl))
        hits = [(sc, rid) for rid, sc in acc.items() if allow(rid)]
        hits.sort(key=lambda e: (-e[0], e[1]))
        return hits[:depth]


    def coverage(self, terms: list[str], depth: int, allow) -> list[tuple[float, int]]:
        """Top ``depth`` (idf-weighted query-term coverage, id) of the allowed records holding a
        query term (float64; :func:`memkern.store.reference.coverage_scores`)."""
        N = len(self.lens)
        if N == 0 or depth == 0:
            return []
        acc: dict[int, float] = {}
        total = 0.0
        for t in dict.fromkeys(terms):
            p = self.post.get(t)
            df = len(p) if p else 0
            idf = math.log(1.0 + (N - df + 0.5) / (df + 0.5))
            total += idf
            for rid in (p or ()):
                acc[rid] = acc.get(rid, 0.0) + idf
        if not total > 0.0:
            return []
        hits = [(sc / total, rid) for rid, sc in acc.items() if allow(rid)]
        hits.sort(key=lambda e: (-e[0], e[1]))
        return hits[:depth]

class _Vectors:
    """The vectors of one (namespace, level): rows in a growing float32 matrix, an id per row,
    removal by moving the last row into the hole (row order is irrelevant: ties go by id)."""

    __slots__ = ("mat", "ids", "row", "n", "invalid", "parent")

    def __init__(self, dim: int):
        self.mat = np.zeros((4, dim), dtype=np.float32)
        self.ids = np.zeros(4, dtype=np.int64)
        self.invalid = np.zeros(4, dtype=bool)
        self.parent = np.full(4, -1, dtype=np.int64)  # a turn record's topic id (-1 for topics)
        self.row: dict[int, int] = {}
        self.n = 0

    def put(self, rid: int, vec: np.ndarray, parent: int = -1) -> None:
        r = self.row.get(rid)
        if r is None:
            if self.n == len(self.ids):
                self.mat = np.concatenate([self.mat, np.zeros_like(self.mat)])
                self.ids = np.concatenate([self.ids, np.zeros_like(self.ids)])
                self.invalid = np.concatenate([self.invalid, np.zeros_like(self.invalid)])
                self.parent = np.concatenate([self.parent, np.full_like(self.parent, -1)])
            r = self.n
            self.n += 1
            self.row[rid] = r
            self.ids[r] = rid
            self.invalid[r] = False
            self.parent[r] = parent
        self.mat[r] = vec

    def remove(self, rid: int) -> None:
        r = self.row.pop(rid)
        last = self.n - 1
        if r != last:
            moved = int(self.ids[last])
            self.mat[r] = self.mat[last]
            self.ids[r] = moved
            self.invalid[r] = self.invalid[last]
            self.parent[r] = self.parent[last]
            self.row[moved] = r
        self.n = last

    def vector(self, rid: int) -> np.ndarray:
        return self.mat[self.row[rid]].copy()


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


def _finite32(x: np.ndarray) -> np.ndarray:
    """float64 scores -> float32, clamped into the finite range (the native ``finite_score``)."""
    return np.clip(np.nan_to_num(x, nan=PAD_SCORE), PAD_SCORE, _F32_MAX).astype(np.float32)


def _top(scores32: np.ndarray, ids: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The best ``k`` of one row: score descending, then id ascending (the native order)."""
    n = scores32.shape[0]
    if n > k:
        # Keep everything tied with the k-th score, so the id tie-break is exact.
        kth = np.partition(scores32, n - k)[n - k]
        keep = np.flatnonzero(scores32 >= kth)
        scores32, ids = scores32[keep], ids[keep]
    order = np.lexsort((ids, -scores32.astype(np.float64)))[:k]
    return ids[order], scores32[order]



def _fuse(dl: list[tuple[float, int]], ll: list[tuple[float, int]], fusion: int, w: float) -> list[tuple[float, int]]:
    """The hybrid fusion of a dense and a lexical list ((score, id), best first) by the reference
    (:mod:`memkern.store.reference`): 0 rrf, 1 weighted, 2 coverage; the lists get weights ``1 - w`` and ``w``."""
    from .reference import coverage_fusion, rrf, weighted_fusion

    def pair(L):
        return [rid for _, rid in L], [sc for sc, _ in L]

    if fusion == 0:
        ids, sc = rrf([pair(dl)[0], pair(ll)[0]], [1.0 - w, w])
    elif fusion == 1:
        ids, sc = weighted_fusion([pair(dl), pair(ll)], [1.0 - w, w])
    else:
        ids, sc = coverage_fusion(pair(dl), pair(ll), w)
    return [(float(x), int(i)) for x, i in zip(sc, ids)]

# ----------------------------------------------------------------------------------- the twin


class _PyStore:
    """Pure-Python twin of the native ``memkern._store.Store`` (the interface in ``_store.pyi``):
    takes the validated, C-contiguous float32 input :class:`~memkern.MemoryStore` passes, and
    raises the native layer's errors with its messages."""

    simd_kernel = "numpy"

    def __init__(self, dim: int, metric: str):
        self.dim = int(dim)
        self.metric = metric
        self.closed = False
        self.last_snapshot_error = ""
        self.replayed_entries = 0
        self.recovered_torn_tail = False
        self._recs: dict[int, _Rec] = {}
        self._tomb: set[int] = set()
        self._vec: dict[tuple[str, int], _Vectors] = {}
        self._lex: dict[tuple[str, int], _Lexical] = {}
        self._next = 0
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ helpers
    def _check_open(self) -> None:
        if self.closed:
            raise MemkernValueError("store <in memory> is closed")

    def _rec(self, rid: int, what: str) -> _Rec:
        r = self._recs.get(int(rid))
        if r is None:
            if int(rid) in self._tomb:
                raise MemkernKeyError(f"{what}: id {int(rid)} was deleted")
            raise MemkernKeyError(f"{what}: unknown id {int(rid)}")
        return r

    def _index(self, ns: str, level: int) -> _Vectors:
        idx = self._vec.get((ns, level))
        if idx is None:
            idx = self._vec[(ns, level)] = _Vectors(self.dim)
        return idx

    def _vector_of(self, r: _Rec) -> np.ndarray:
        return self._vec[(r.ns, r.level)].vector(r.id)

    def _prepare(self, rows: np.ndarray) -> np.ndarray:
        """Copy (+ L2-normalise for "cos", as the native ``prepare_vector``: the sum of squares in
        float64, the scale rounded to float32, the product in float32). Zero rows stay zero."""
        out = np.array(rows, dtype=np.float32, copy=True).reshape(-1, self.dim)
        return _cos_normalize(out) if self.metric == "cos" else out

    def _validate_rows(self, emb: np.ndarray) -> None:
        """The native ``validate_items`` vector checks (finite, norm bound, nonzero for cos)."""
        emb = np.asarray(emb, dtype=np.float32).reshape(-1, self.dim)
        bad = ~np.isfinite(emb).all(axis=1)
        if bad.any():
            raise MemkernValueError(f"embeddings: expected finite values, got a NaN/inf in row {int(np.argmax(bad))}")
        s = np.square(emb, dtype=np.float64).sum(axis=1)
        norms = np.sqrt(s)
        if len(norms) and norms.max() > MAX_NORM:
            i = int(np.argmax(norms))
            raise MemkernValueError("embeddings: expected an L2 norm <= 1e18 (scores must stay finite in float32), "
                                    f"got {norms[i]:.3g} in row {i}")
        if self.metric == "cos" and (s == 0).any():
            i = int(np.argmax(s == 0))
            raise MemkernValueError(f'embeddings: metric "cos" needs nonzero vectors, row {i} is zero')

    def _check_queries(self, q: Any, k: int, ef: int) -> np.ndarray:
        """The native ``check_query``; returns ``q`` as float32 ``[B, dim]`` (shape and dtype checked
        by :func:`memkern.store._as_queries`, the one query-matrix check)."""
        q = _as_queries(q, self.dim)
        if k > MAX_K:
            raise MemkernValueError(f"k: expected 1..{MAX_K}, got {k}")
        if ef > MAX_K:
            raise MemkernValueError(f"ef: expected 1..{MAX_K}, got {ef}")
        if k and q.shape[0] > MAX_RESULTS // k:
            raise MemkernValueError(f"k: expected B * k <= {MAX_RESULTS} result slots, got B={q.shape[0]}, k={k}")
        bad = ~np.isfinite(q).all(axis=1)
        if bad.any():
            raise MemkernValueError(f"queries: expected finite values, got a NaN/inf in row {int(np.argmax(bad))}")
        norms = np.sqrt(np.square(q, dtype=np.float64).sum(axis=1))
        if len(norms) and norms.max() > MAX_NORM:
            b = int(np.argmax(norms))
            raise MemkernValueError("queries: expected an L2 norm <= 1e18 (scores must stay finite in float32), "
                                    f"got {norms[b]:.3g} in row {b}")
        return q

    def _scores(self, q: np.ndarray, mat: np.ndarray) -> np.ndarray:
        """float64 scores ``[B, n]`` (higher is better) of prepared queries against stored rows."""
        q64, m64 = q.astype(np.float64), mat.astype(np.float64)
        if self.metric == "l2":
            d = (q64 * q64).sum(1)[:, None] + (m64 * m64).sum(1)[None, :] - 2.0 * (q64 @ m64.T)
            return -np.maximum(d, 0.0)
        return q64 @ m64.T

    def _new_items(self, ns: str, summaries, turns, metas, emb, levels, parents, now: float,
                   event_times=None) -> list[int]:
        """Validate then apply new records (the native ``add``: all or nothing). ``event_times``:
        float64 ``[n]`` (NaN: none) or empty (none for all)."""
        n = len(summaries)
        emb = np.asarray(emb, dtype=np.float32)
        if len(turns) != n or len(metas) != n or len(levels) != n or len(parents) != n:
            raise MemkernValueError("add: summaries, turns, metas, levels and parents must have the same length")
        if emb.shape != (n, self.dim):
            raise MemkernValueError(f"embeddings: expected shape [{n}, {self.dim}]")
        et = np.full(n, np.nan) if event_times is None or len(event_times) == 0 else np.asarray(event_times, np.float64)
        if et.shape != (n,):
            raise MemkernValueError(f"event_times: expected {n} values, got {et.size}")
        self._validate_rows(emb)
        for i in range(n):
            if not np.isnan(et[i]) and not MIN_TIME <= et[i] <= MAX_TIME:
                raise MemkernValueError(f"event_times: expected {TIME_RANGE_TEXT} or None, got "
                                        f"{et[i]:.3g} in row {i}")
            lv, p = int(levels[i]), int(parents[i])
            if lv not in (_TOPIC, _TURN):
                raise MemkernValueError("level: expected topic or turn")
            if lv == _TOPIC:
                if p != -1:
                    raise MemkernValueError("parent: topics have no parent")
            elif p >= 0:
                pr = self._rec(p, "topic_id")
                if pr.level != _TOPIC:
                    raise MemkernValueError(f"topic_id: record {p} is a turn, not a topic")
            elif p <= -2:
                j = -2 - p
                if j >= i or int(levels[j]) != _TOPIC:
                    raise MemkernValueError("parent: batch reference must name an earlier topic")
            else:
                raise MemkernValueError("parent: a turn record needs its topic")
        first = self._next
        vecs = self._prepare(emb)
        ids = []
        for i in range(n):
            rid = first + i
            lv, p = int(levels[i]), int(parents[i])
            parent = first + (-2 - p) if p <= -2 else p
            r = _Rec(rid, ns, lv, parent, summaries[i], turns[i], metas[i], now, now)
            r.event_time = None if np.isnan(et[i]) else float(et[i])
            if parent >= 0:
                pr = self._recs[parent]
                r.ns = pr.ns  # a turn lives in its topic's namespace
                pr.children.append(rid)
                if pr.status == "invalidated":
                    r.status, r.reason = "invalidated", pr.reason
            r.canon = _canon_meta(r.meta_json)
            self._recs[rid] = r
            self._lex.setdefault((r.ns, lv), _Lexical()).put(rid, r.summary)
            idx = self._index(r.ns, lv)
            idx.put(rid, vecs[i], parent)
            idx.invalid[idx.row[rid]] = r.status == "invalidated"
            ids.append(rid)
        self._next = first + n
        return ids

    def _remove(self, rid: int) -> None:
        r = self._recs[rid]
        for x in [*r.children, rid]:
            xr = self._recs.pop(x, None)
            if xr is None:
                continue
            self._vec[(xr.ns, xr.level)].remove(x)
            self._lex[(xr.ns, xr.level)].remove(x)
            self._tomb.add(x)
        if r.parent >= 0 and r.parent in self._recs:
            ch = self._recs[r.parent].children
            if rid in ch:
                ch.remove(rid)

    # ------------------------------------------------------------------ writes
    def add(self, ns, summaries, turns, metas, emb, levels, parents, event_times=None) -> np.ndarray:
        with self._lock:
            self._check_open()
            if not ns:
                raise MemkernValueError("namespace: expected a non-empty string, got ''")
            if len(summaries) == 0:
                return np.zeros(0, dtype=np.int64)
            return np.asarray(self._new_items(ns, list(summaries), list(turns), list(metas), emb, levels, parents,
                                              time.time(), event_times), dtype=np.int64)

    def new_version(self, rid, op, summary, emb, turns_json, meta_json, c_summaries, c_turns, c_metas, c_emb,
                    replace_children, event_time=None, c_event_times=None):
        with self._lock:
            self._check_open()
            if int(op) not in (1, 2):
                raise MemkernValueError(f"op: expected merge or update, got {int(op)}")
            r = self._rec(rid, "id")
            m = len(c_summaries)
            if m and r.level != _TOPIC:
                raise MemkernValueError(f"turn_embeddings: record {rid} is a turn")
            if emb is not None:
                emb = np.asarray(emb, dtype=np.float32)
                if emb.shape != (1, self.dim):
                    raise MemkernValueError(f"embedding: expected shape [1, {self.dim}]")
                self._validate_rows(emb)
            c_emb = np.asarray(c_emb, dtype=np.float32).reshape(-1, self.dim)
            if c_emb.shape[0] != m:
                raise MemkernValueError(f"embeddings: expected shape [{m}, {self.dim}]")
            self._validate_rows(c_emb)
            if event_time is not None and not MIN_TIME <= event_time <= MAX_TIME:
                raise MemkernValueError(f"event_time: expected {TIME_RANGE_TEXT}, got {event_time:.3g}")
            cet = np.full(m, np.nan) if c_event_times is None or len(c_event_times) == 0 else np.asarray(
                c_event_times, np.float64)
            if cet.shape != (m,):
                raise MemkernValueError(f"event_times: expected {m} values, got {cet.size}")
            if (~np.isnan(cet) & ~((cet >= MIN_TIME) & (cet <= MAX_TIME))).any():
                raise MemkernValueError(f"event_times: expected {TIME_RANGE_TEXT} or None")
            now = time.time()
            # validated: apply (old turn records out, the new version, the new turn records in)
            if replace_children:
                for c in list(r.children):
                    self._remove(c)
            r.history.append(_Version(r.version, r.summary, r.turns_json, r.meta_json, self._vector_of(r),
                                      r.updated_at, r.op))
            if summary is not None:
                r.summary = summary
                self._lex[(r.ns, r.level)].put(r.id, summary)
            if emb is not None:
                self._vec[(r.ns, r.level)].put(r.id, self._prepare(emb)[0])
            if turns_json is not None:
                r.turns_json = turns_json
            if meta_json is not None:
                r.meta_json = meta_json
                r.canon = _canon_meta(meta_json)
            r.updated_at = now
            r.version += 1
            r.op = int(op)
            if event_time is not None:
                r.event_time = float(event_time)
            child_ids = self._new_items(r.ns, list(c_summaries), list(c_turns), list(c_metas), c_emb,
                                        np.full(m, _TURN, np.uint8), np.full(m, rid, np.int64), now, cet) if m else []
            return r.version, np.asarray(child_ids, dtype=np.int64)

    def invalidate(self, rid, reason) -> None:
        with self._lock:
            self._check_open()
            r = self._rec(rid, "id")
            if r.status == "invalidated":
                raise MemkernValueError(f"id: record {rid} is already invalidated")
            now = time.time()
            for x in [rid, *r.children]:
                xr = self._recs[x]
                if xr.status == "invalidated":
                    continue
                xr.status, xr.reason, xr.updated_at = "invalidated", reason, now
                idx = self._vec[(xr.ns, xr.level)]
                idx.invalid[idx.row[x]] = True

    def delete(self, rid) -> list[int]:
        with self._lock:
            self._check_open()
            r = self._rec(rid, "id")
            ids = [*r.children, int(rid)]
            self._remove(int(rid))
            return ids

    # ------------------------------------------------------------------ reads
    def _view(self, r: _Rec) -> SimpleNamespace:
        """The twin of the native ``StoredRecord`` (same attributes and enum types)."""
        from .. import _store

        return SimpleNamespace(
            id=r.id, namespace=r.ns, level=_store.Level.topic if r.level == _TOPIC else _store.Level.turn,
            parent=r.parent, status=getattr(_store.Status, r.status), version=r.version,
            op=_store.Op(int(r.op)), created_at=r.created_at, updated_at=r.updated_at,
            event_time=r.event_time, summary=r.summary, turns_json=r.turns_json, meta_json=r.meta_json,
            reason=r.reason, children=list(r.children), embedding=self._vector_of(r))

    def contains(self, rid) -> bool:
        with self._lock:
            return int(rid) in self._recs

    def parents(self, ids) -> np.ndarray:
        with self._lock:
            self._check_open()
            for i in ids:
                self._rec(int(i), "ids")
            return np.asarray([self._recs[int(i)].parent for i in ids], dtype=np.int64)

    def get(self, rid) -> SimpleNamespace:
        with self._lock:
            self._check_open()
            return self._view(self._rec(rid, "id"))

    def get_batch(self, ids) -> list[SimpleNamespace]:
        with self._lock:
            self._check_open()
            recs = [self._rec(int(i), "ids") for i in np.asarray(ids).reshape(-1)]
            return [self._view(r) for r in recs]

    def history(self, rid) -> list[SimpleNamespace]:
        with self._lock:
            self._check_open()
            r = self._rec(rid, "id")
            cur = _Version(r.version, r.summary, r.turns_json, r.meta_json, self._vector_of(r), r.updated_at, r.op)
            from .. import _store

            return [SimpleNamespace(version=v.version, op=_store.Op(int(v.op)), updated_at=v.updated_at,
                                    summary=v.summary, turns_json=v.turns_json, meta_json=v.meta_json,
                                    embedding=v.embedding.copy()) for v in [*r.history, cur]]

    def embeddings(self, ids) -> np.ndarray:
        with self._lock:
            self._check_open()
            recs = [self._rec(int(i), "ids") for i in np.asarray(ids).reshape(-1)]
            out = np.zeros((len(recs), self.dim), dtype=np.float32)
            for j, r in enumerate(recs):
                out[j] = self._vec[(r.ns, r.level)].mat[self._vec[(r.ns, r.level)].row[r.id]]
            return out

    def _live(self, ns: str, level: int, include_invalidated: bool):
        """(ids [n], float32 rows [n, d]) of one index, invalidated rows dropped unless asked."""
        idx = self._vec.get((ns, level))
        if idx is None or idx.n == 0:
            return np.zeros(0, np.int64), np.zeros((0, self.dim), np.float32)
        ids, mat = idx.ids[:idx.n], idx.mat[:idx.n]
        if not include_invalidated:
            keep = ~idx.invalid[:idx.n]
            ids, mat = ids[keep], mat[keep]
        return ids.copy(), mat.copy()

    def search(self, ns, q, k, ef, include_invalidated, level):
        with self._lock:
            self._check_open()
            if int(level) not in (_TOPIC, _TURN):
                raise MemkernValueError("level: expected topic or turn")
            q = self._check_queries(q, int(k), int(ef))
            ids, mat = self._live(ns, int(level), bool(include_invalidated))
        B = q.shape[0]
        out_ids = np.full((B, k), -1, dtype=np.int64)
        out_sc = np.full((B, k), PAD_SCORE, dtype=np.float32)
        if len(ids) == 0 or k == 0:
            return out_ids, out_sc
        sc = _finite32(self._scores(self._prepare(q), mat))
        for b in range(B):  # one partial sort per query row
            i, s = _top(sc[b], ids, k)
            out_ids[b, :len(i)] = i
            out_sc[b, :len(s)] = s
        return out_ids, out_sc

    def search_turn_topic(self, ns, q, k, ef, include_invalidated, alpha, candidates):
        """The native turn+topic search: candidates are the top ``candidates`` turns plus every
        (active, unless asked) turn of the top ``candidates`` topics; each is scored exactly as
        ``sim(q, turn) + alpha * sim(q, its topic)``."""
        with self._lock:
            self._check_open()
            q = self._check_queries(q, int(k), int(ef))
            if candidates > MAX_CANDIDATES:
                raise MemkernValueError(f"candidates: expected 1..{MAX_CANDIDATES}, got {candidates}")
            if not math.isfinite(alpha) or abs(alpha) > MAX_ALPHA:
                raise MemkernValueError(f"alpha: expected a finite float in [-100, 100], got {alpha:.3g}")
            B = q.shape[0]
            out_ids = np.full((B, k), -1, dtype=np.int64)
            out_sc = np.full((B, k), PAD_SCORE, dtype=np.float32)
            t_idx, p_idx = self._vec.get((ns, _TURN)), self._vec.get((ns, _TOPIC))
            if t_idx is None or p_idx is None or t_idx.n == 0 or p_idx.n == 0 or k == 0:
                return out_ids, out_sc
            inc = bool(include_invalidated)
            all_t_ids, all_t = t_idx.ids[:t_idx.n].copy(), t_idx.mat[:t_idx.n].copy()
            t_ok = np.ones(t_idx.n, bool) if inc else ~t_idx.invalid[:t_idx.n]
            all_p_ids, all_p = p_idx.ids[:p_idx.n].copy(), p_idx.mat[:p_idx.n].copy()
            p_ok = np.ones(p_idx.n, bool) if inc else ~p_idx.invalid[:p_idx.n]
            parent = t_idx.parent[:t_idx.n].copy()
        C = max(int(candidates), int(k))
        qp = self._prepare(q)
        t_sc = self._scores(qp, all_t)  # [B, nt] float64
        p_sc = self._scores(qp, all_p)  # [B, np]
        by_id = np.argsort(all_p_ids)  # the topic row of each turn's parent, vectorised
        parent_row = by_id[np.searchsorted(all_p_ids[by_id], parent)]
        t32, p32 = _finite32(t_sc), _finite32(p_sc)  # the native index returns float32 similarities
        ok_t_ids, ok_p_ids = all_t_ids[t_ok], all_p_ids[p_ok]
        for b in range(B):
            top_p, _ = _top(p32[b][p_ok], ok_p_ids, C)
            top_t, _ = _top(t32[b][t_ok], ok_t_ids, C)
            chosen = np.isin(all_t_ids, top_t) | (np.isin(parent, top_p) & t_ok)
            score = t32[b][chosen].astype(np.float64) + float(np.float32(alpha)) * p32[b][parent_row[chosen]]
            i, s = _top(_finite32(score), all_t_ids[chosen], k)
            out_ids[b, :len(i)] = i
            out_sc[b, :len(s)] = s
        return out_ids, out_sc

    def search_turn_topic_ex(self, ns, q, texts, k, ef, include_invalidated, mode, fusion, lexical_weight, clauses,
                             has_time, t_lo, t_hi, time_field, half_life, recency_weight, now, candidates, alpha,
                             neighbour_weight, group_weight, group_key):
        """The native ``search_turn_topic_ex`` (two-level search with a first stage and context
        terms; ``TurnSearchSpec`` in ``csrc/include/memkern/store.h``, arguments validated by
        :meth:`MemoryStore.search`), computed the same way: exact lists, fusion, context terms."""
        with self._lock:
            self._check_open()
            mode, k = int(mode), int(k)
            for name, v in (("alpha", alpha), ("neighbour_weight", neighbour_weight), ("group_weight", group_weight)):
                if not math.isfinite(v) or abs(v) > MAX_ALPHA:
                    raise MemkernValueError(f"{name}: expected a finite float in [-100, 100], got {v:.6g}")
            q = self._check_queries(q, k, int(ef))
            B = q.shape[0]
            if mode != 0 and len(texts) != B:
                raise MemkernValueError(f"texts: expected {B} texts (one per query), got {len(texts)}")
            out_ids = np.full((B, k), -1, dtype=np.int64)
            out_sc = np.full((B, k), PAD_SCORE, dtype=np.float32)
            t_idx = self._vec.get((ns, _TURN))
            if t_idx is None or t_idx.n == 0 or k == 0:
                return out_ids, out_sc
            from .reference import tokenize

            qterms = [tokenize(t) for t in texts] if mode != 0 else []
            recs, inc, field_ = self._recs, bool(include_invalidated), int(time_field)
            clauses = [(key, set(vals)) for key, vals in clauses]

            def t_of(r: _Rec) -> float:
                if field_ == 1:
                    return r.created_at
                if field_ == 2:
                    return r.updated_at
                return r.created_at if r.event_time is None else r.event_time

            def allow(rid: int) -> bool:
                r = recs[rid]
                if not inc and r.status == "invalidated":
                    return False
                if has_time and not (t_lo <= t_of(r) < t_hi):
                    return False
                for key, vals in clauses:
                    v = r.canon.get(key)
                    if v is None and r.parent in recs:
                        v = recs[r.parent].canon.get(key)
                    if v is None or v not in vals:
                        return False
                return True

            t_ids = t_idx.ids[:t_idx.n].copy()
            ok = np.fromiter((allow(int(i)) for i in t_ids), dtype=bool, count=len(t_ids))
            qp = self._prepare(q)
            t_sc = _finite32(self._scores(qp, t_idx.mat[:t_idx.n]))  # [B, nt] (the index's float32 scores)
            t_row = {int(i): j for j, i in enumerate(t_ids)}
            p_idx = self._vec.get((ns, _TOPIC))
            p_ids = p_idx.ids[:p_idx.n].copy() if p_idx is not None else np.zeros(0, np.int64)
            p_sc = _finite32(self._scores(qp, p_idx.mat[:p_idx.n])) if len(p_ids) else np.zeros((B, 0), np.float32)
            p_row = {int(i): j for j, i in enumerate(p_ids)}
            p_ok = np.ones(len(p_ids), bool) if inc else ~p_idx.invalid[:len(p_ids)] if len(p_ids) else p_ids >= 0

            def group_of(rid: int) -> str:
                r = recs[rid]
                if group_key:
                    v = r.canon.get(group_key)
                    if v is None:
                        v = recs[r.parent].canon.get(group_key)
                    if v is not None:
                        return "v" + v.hex()
                return f"t{r.parent}"

            members: dict[str, list[int]] = {}
            if neighbour_weight != 0.0:
                for rid in sorted(int(i) for i, o in zip(t_ids, ok) if o):
                    members.setdefault(group_of(rid), []).append(rid)
            lex = self._lex.get((ns, _TURN))
            C = max(int(candidates), k)
            topic_children = mode == 0 and alpha != 0.0 and len(p_ids) > 0
            allowed_ids = t_ids[ok]
            for b in range(B):
                dl: list[tuple[float, int]] = []
                if mode != 1 and len(allowed_ids):
                    di, ds = _top(t_sc[b][ok], allowed_ids, C)
                    dl = [(float(x), int(i)) for x, i in zip(ds, di)]
                ll: list[tuple[float, int]] = []
                if mode != 0 and lex is not None:
                    score_lex = lex.coverage if (mode == 2 and int(fusion) == 2) else lex.search
                    ll = score_lex(qterms[b], C, allow)
                s0 = dl if mode == 0 else ll if mode == 1 else _fuse(dl, ll, int(fusion), float(lexical_weight))
                base = {rid: sc for sc, rid in s0}
                if topic_children:
                    ti, _ = _top(p_sc[b][p_ok], p_ids[p_ok], C)
                    for tp in ti:
                        for c in recs[int(tp)].children:
                            if c not in base and allow(c):
                                base[c] = float(t_sc[b][t_row[c]])
                nb: dict[int, float] = {}
                gbest: dict[str, float] = {}
                if neighbour_weight != 0.0 or group_weight != 0.0:
                    for t in sorted(base):
                        g = group_of(t)
                        bt = base[t]
                        if group_weight != 0.0:
                            gbest[g] = max(gbest.get(g, 0.0), bt)
                        if neighbour_weight == 0.0:
                            continue
                        m = members.get(g, [])
                        j = bisect.bisect_left(m, t)
                        if j == len(m) or m[j] != t:
                            continue
                        for u in ((m[j - 1],) if j > 0 else ()) + ((m[j + 1],) if j + 1 < len(m) else ()):
                            nb[u] = max(nb.get(u, 0.0), bt)  # t's base reaches both its neighbours
                res = []
                cands = list(base.items()) + [(u, float(t_sc[b][t_row[u]]) if mode == 0 else 0.0)
                                              for u in nb if u not in base]
                for t, own in cands:
                    sc = own
                    r = recs[t]
                    if alpha != 0.0:
                        j = p_row.get(r.parent)
                        sc += alpha * (float(p_sc[b][j]) if j is not None else 0.0)
                    if neighbour_weight != 0.0 and t in nb:
                        sc += neighbour_weight * nb[t]
                    if group_weight != 0.0:
                        sc += group_weight * gbest.get(group_of(t), 0.0)
                    if half_life > 0:
                        sc += recency_weight * 2.0 ** (-max(0.0, now - t_of(r)) / half_life)
                    res.append((sc, t))
                res.sort(key=lambda e: (-e[0], e[1]))
                res = res[:k]
                out_ids[b, :len(res)] = [rid for _, rid in res]
                out_sc[b, :len(res)] = _finite32(np.array([sc for sc, _ in res], dtype=np.float64))
            return out_ids, out_sc

    def search_ex(self, ns, q, texts, k, ef, include_invalidated, level, mode, fusion, lexical_weight, clauses,
                  has_time, t_lo, t_hi, time_field, half_life, recency_weight, now, candidates):
        """The native ``search_ex`` (lexical / hybrid search, meta filter, time range, recency
        prior; arguments validated by :meth:`MemoryStore.search`): exact dense list, BM25 list,
        fusion (``csrc/include/memkern/fusion.h``) and prior exactly as the native store computes them."""
        with self._lock:
            self._check_open()
            level, mode, k = int(level), int(mode), int(k)
            if level not in (_TOPIC, _TURN):
                raise MemkernValueError("level: expected topic or turn")
            q = self._check_queries(q, k, int(ef))
            B = q.shape[0]
            if mode != 0 and len(texts) != B:
                raise MemkernValueError(f"texts: expected {B} texts (one per query), got {len(texts)}")
            out_ids = np.full((B, k), -1, dtype=np.int64)
            out_sc = np.full((B, k), PAD_SCORE, dtype=np.float32)
            idx = self._vec.get((ns, level))
            if idx is None or idx.n == 0 or k == 0:
                return out_ids, out_sc
            from .reference import tokenize

            qterms = [tokenize(t) for t in texts] if mode != 0 else []
            recs, inc = self._recs, bool(include_invalidated)
            field_ = int(time_field)
            clauses = [(key, set(vals)) for key, vals in clauses]

            def t_of(r: _Rec) -> float:
                if field_ == 1:
                    return r.created_at
                if field_ == 2:
                    return r.updated_at
                return r.created_at if r.event_time is None else r.event_time

            def allow(rid: int) -> bool:
                r = recs[rid]
                if not inc and r.status == "invalidated":
                    return False
                if has_time and not (t_lo <= t_of(r) < t_hi):
                    return False
                for key, vals in clauses:
                    v = r.canon.get(key)
                    if v is None and r.level == _TURN and r.parent in recs:
                        v = recs[r.parent].canon.get(key)
                    if v is None or v not in vals:
                        return False
                return True

            ids = idx.ids[:idx.n].copy()
            if clauses or has_time:  # evaluated per record (Python), like the native predicate
                keep = np.fromiter((allow(int(i)) for i in ids), dtype=bool, count=len(ids))
            else:
                keep = np.ones(idx.n, dtype=bool) if inc else ~idx.invalid[:idx.n]
            ids, mat = ids[keep], idx.mat[:idx.n][keep].copy()
            lex = self._lex.get((ns, level))
            rescore = half_life > 0
            depth = max(k, int(candidates)) if (mode == 2 or rescore) else k
            dense_sc = _finite32(self._scores(self._prepare(q), mat)) if mode != 1 and len(ids) else None
            allowed = set(ids.tolist())
            times = {int(i): t_of(recs[int(i)]) for i in ids} if rescore else {}
            for b in range(B):
                dl: list[tuple[float, int]] = []
                if dense_sc is not None:
                    di, ds = _top(dense_sc[b], ids, depth)
                    dl = [(float(x), int(i)) for x, i in zip(ds, di)]
                ll: list[tuple[float, int]] = []
                if mode != 0 and lex is not None:
                    score_lex = lex.coverage if (mode == 2 and int(fusion) == 2) else lex.search
                    ll = score_lex(qterms[b], depth, allowed.__contains__)
                if mode == 0:
                    res = dl
                elif mode == 1:
                    res = ll
                else:
                    res = _fuse(dl, ll, int(fusion), float(lexical_weight))
                if rescore:
                    res = [(sc + recency_weight * 2.0 ** (-max(0.0, now - times[rid]) / half_life), rid)
                           for sc, rid in res]
                res.sort(key=lambda e: (-e[0], e[1]))
                res = res[:k]
                out_ids[b, :len(res)] = [rid for _, rid in res]
                out_sc[b, :len(res)] = _finite32(np.array([sc for sc, _ in res], dtype=np.float64))
            return out_ids, out_sc

    def namespaces(self) -> list[str]:
        with self._lock:
            self._check_open()
            return sorted({ns for (ns, _), idx in self._vec.items() if idx.n > 0})

    def count(self, ns, include_invalidated, level) -> int:
        with self._lock:
            self._check_open()
            if int(level) not in (_TOPIC, _TURN):
                raise MemkernValueError("level: expected topic or turn")
            idx = self._vec.get((ns, int(level)))
            if idx is None:
                return 0
            return idx.n if include_invalidated else int(idx.n - idx.invalid[:idx.n].sum())

    def ids(self, ns, include_invalidated, level) -> np.ndarray:
        with self._lock:
            self._check_open()
            if int(level) not in (_TOPIC, _TURN):
                raise MemkernValueError("level: expected topic or turn")
            ids, _ = self._live(ns, int(level), bool(include_invalidated))
            return np.sort(ids)

    # ------------------------------------------------------------------ maintenance
    def flush(self) -> None:
        with self._lock:
            self._check_open()  # nothing to make durable: the store lives in memory

    def snapshot(self) -> None:
        with self._lock:
            self._check_open()

    def snapshot_async(self) -> None:
        self.snapshot()

    def wait_snapshot(self) -> None:
        pass

    def compact(self) -> None:
        """Forget deleted ids (afterwards they read as unknown, as after the native compaction) and
        drop empty namespaces; ids are still never reused."""
        with self._lock:
            self._check_open()
            self._tomb.clear()
            for key in [key for key, idx in self._vec.items() if idx.n == 0]:
                del self._vec[key]
                self._lex.pop(key, None)
            for idx in self._vec.values():  # shrink to fit
                cap = max(4, idx.n)
                idx.mat, idx.ids, idx.invalid = idx.mat[:cap].copy(), idx.ids[:cap].copy(), idx.invalid[:cap].copy()
                idx.parent = idx.parent[:cap].copy()

    def memory_bytes(self) -> int:
        with self._lock:
            b = sum(idx.mat.nbytes + idx.ids.nbytes + idx.invalid.nbytes + 100 * len(idx.row)
                    for idx in self._vec.values())
            for r in self._recs.values():
                b += 200 + len(r.summary) + len(r.turns_json) + len(r.meta_json) + len(r.reason) + 8 * len(r.children)
                b += sum(150 + len(v.summary) + len(v.turns_json) + len(v.meta_json) + v.embedding.nbytes
                         for v in r.history)
            return b

    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
            self._recs.clear()
            self._vec.clear()
            self._lex.clear()
            self._tomb.clear()

    def index_kind(self, ns, level) -> str:
        with self._lock:
            self._check_open()
            return "flat" if (ns, int(level)) in self._vec else ""


# ----------------------------------------------------------------------------------- the store


class InMemoryStore(MemoryStore):
    """A memory store held in process memory (pure Python + numpy; nothing is written to disk).

    Implements :class:`memkern.protocols.Store` and :class:`memkern.protocols.TurnStore` with
    :class:`MemoryStore`'s semantics, argument checks and errors (it is its front end over a
    Python twin of the native store; see the module docstring for the differences: no
    persistence, ``path`` is ``None``, exact search).

    Parameters
    ----------
    dim : int
        Embedding size, 1..65536.
    metric : {"ip", "l2", "cos"}
        Similarity (default ``"ip"``); see :mod:`memkern.store` for the scores.
    ef_search : int, optional
        Accepted for symmetry with :class:`MemoryStore` (searches are exact; ``ef`` is checked
        and unused).

    Examples
    --------
    >>> import numpy as np, memkern
    >>> s = memkern.InMemoryStore(dim=4)
    >>> rid = s.add("alice", "likes tea", np.array([1, 0, 0, 0], np.float32))
    >>> s.search("alice", np.array([1, 0, 0, 0], np.float32), k=2)[0].tolist()
    [[0, -1]]
    """

    def __init__(self, dim: int, metric: str = "ip", *, ef_search: int | None = None) -> None:
        self._native = None
        self._path = None
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or not 1 <= int(dim) <= 65536:
            raise bad_arg("dim", "an int in 1..65536", dim)
        if metric not in _METRICS:
            raise bad_arg("metric", '"ip", "l2" or "cos"', metric)
        if ef_search is not None:
            _check_int(ef_search, "ef_search", 1, MAX_K, none_ok=True)
        self._native = _PyStore(int(dim), metric)
        self.ef_search = int(ef_search) if ef_search is not None else DEFAULT_EF_SEARCH

    @property
    def path(self) -> None:
        """``None``: the store is not on disk (the Store protocol's value for such stores)."""
        return None

    def __repr__(self) -> str:
        if self.closed:
            return "InMemoryStore(closed)"
        return f"InMemoryStore(dim={self.dim}, metric={self.metric!r})"

    def __del__(self) -> None:
        pass

    def _n(self):
        if self._native is None or self._native.closed:
            raise MemkernValueError("store <in memory>: expected an open store, got a closed one")
        return self._native

    def close(self) -> None:
        """Release the records (idempotent). Nothing is persisted."""
        if self._native is not None:
            self._native.close()
