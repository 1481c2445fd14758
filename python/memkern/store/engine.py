"""The persistent memory store: topic records + one vector index per namespace (C++, ``memkern._store``).

``MemoryStore`` is an embedded store opened on a directory (like SQLite). Every write goes to a
write-ahead log (length + CRC32 + sync watermark per entry, format version in the header) before it
is applied; periodic snapshots (the namespaces changed since the last one, packed into one file,
plus the graphs of large namespaces), written by a background thread while calls go on, bound the
log; reopening loads the last snapshot and replays the log. One process at a time may open a store
for writing (a ``LOCK`` file); any number of processes may open it ``read_only`` meanwhile, each a
consistent view that :meth:`MemoryStore.refresh` brings up to date. Within a process any number of
threads may read while one writes. The store's folders are created 0700 and its files 0600.

Scores are "higher is better" for every metric:

* ``"ip"``: the inner product ``<q, x>``;
* ``"cos"``: the cosine similarity (vectors are L2-normalised when stored, so
  :meth:`MemoryStore.embeddings` returns unit vectors);
* ``"l2"``: the negative squared distance ``-||q - x||^2``.

Padding: when fewer than ``k`` records match, ids are ``-1`` and scores are :data:`PAD_SCORE`, the
lowest finite float32 (``-3.4028235e38``): finite, never NaN, and below every real score.

Dtypes and limits: the checks of :mod:`memkern.store.checks` (float32 stored, lossless conversions
only); every write and search is prepared there and in :mod:`memkern.store.prepare`, then run.

Indexes (an exact scan up to ``flat_limit`` records, an HNSW graph past it) and two-level memory
(topic records owning turn records, ``level="turn"`` / ``"turn+topic"``): ``docs/store.md``.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from . import reference as _lexical
from ..base.paths import default_store_path
from ..base.telemetry import traced
from ..base.validate import check_choice, check_float, check_int, check_text
from ..errors import MemkernKeyError, MemkernTypeError, MemkernValueError, bad_arg
from .checks import (DEFAULT_EF_SEARCH, DEFAULT_FLAT_LIMIT, DEFAULT_RECENCY_WEIGHT, FSYNC_MODES, LEVELS, METRICS,
                     PAD_SCORE, check_engine_options, check_id, check_ids, check_namespace, is_torch)
from .native import native_level, native_module
from .prepare import (check_search_filters, dense_args, prepare_add, prepare_add_batch, prepare_merge, prepare_search,
                      prepare_update)
from .record import Record, record_from, turns_with_topics

logger = logging.getLogger("memkern")

__all__ = ["MemoryStore", "Record", "PAD_SCORE", "default_store_path", "check_search_filters"]


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
    read_only : bool
        Open an existing store as a reader while another process may hold it for writing (as
        SQLite's readers beside its one writer): no ``LOCK`` is taken and nothing on disk changes.
        The view is the live snapshot plus every log entry intact at the open; :meth:`refresh`
        applies what the writer logged since, each entry whole (a search never sees half a
        write), possibly before the writer's fsync of it returned. Writes raise
        :class:`~memkern.MemkernValueError`; ``dim`` / ``metric``, when given, must match.

    Notes
    -----
    Thread safety: any number of threads may call read methods (``get``, ``search``,
    ``embeddings``, ...) while one thread writes; writes are serialised. ``add_batch`` and
    ``search`` release the GIL. One process may open a store at a time (others get
    :class:`~memkern.MemkernError`).
    """

    def __init__(self, path: str | os.PathLike | None = None, dim: int | None = None, metric: str | None = None, *,
                 fsync: str = "always", M: int = 16, ef_construction: int = 200, ef_search: int | None = None,
                 snapshot_every: int = 50_000, fsync_interval: float = 1.0, num_threads: int = 1,
                 flat_limit: int = DEFAULT_FLAT_LIMIT, id_range: tuple[int, int] | None = None,
                 read_only: bool = False) -> None:
        self._native = None
        if path is not None and not isinstance(path, (str, os.PathLike)):
            raise bad_arg("path", "a str or os.PathLike", type(path).__name__, MemkernTypeError)
        p = Path(path) if path is not None else default_store_path()
        if "\0" in str(p):
            raise bad_arg("path", "a path without NUL characters", str(p))
        if dim is not None:
            check_int("dim", dim, 1, 65536)
        if metric is not None:
            check_choice("metric", metric, METRICS, expected='"ip", "l2" or "cos"')
        check_choice("fsync", fsync, FSYNC_MODES, expected='"always", "batch" or "never"')
        check_int("snapshot_every", snapshot_every, 0, (1 << 64) - 1)
        id_base, id_end = check_engine_options(M, ef_construction, ef_search, num_threads, flat_limit, id_range)
        check_float("fsync_interval", fsync_interval, 0, finite=True, expected="finite seconds >= 0")
        if not isinstance(read_only, bool):
            raise bad_arg("read_only", "a bool", type(read_only).__name__, MemkernTypeError)
        self._path = p
        if read_only:
            self._reader_args = (os.fsencode(p), int(dim or 0), metric or "", int(num_threads))
            self._native = native_module().Store.open_read_only(*self._reader_args)
        else:
            p.parent.mkdir(parents=True, exist_ok=True)
            exists = (p / "CURRENT").exists() or (p / "wal.log").exists()
            if not exists and dim is None:
                raise bad_arg("dim", f"an int to create a new store at {p}", None)
            native_metric = metric if metric is not None else ("" if exists else "ip")
            self._native = native_module().Store(
                os.fsencode(p), int(dim or 0), native_metric, int(M), int(ef_construction), fsync,
                float(fsync_interval), int(snapshot_every), int(num_threads), int(flat_limit), int(id_base), int(id_end),
            )
        self._dim = int(self._native.dim)  # fixed for the store's life (the search path reads it)
        self.ef_search = int(ef_search) if ef_search is not None else DEFAULT_EF_SEARCH
        logger.info(
            "memkern store %s opened%s: dim=%d metric=%s fsync=%s, %d namespace(s), %d log entries replayed, "
            "distance kernel %s",
            p, " read_only" if read_only else "", self._native.dim, self._native.metric, fsync, len(self._native.namespaces()),
            getattr(self._native, "replayed_entries", 0), native_module().Store.simd_kernel,
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
    def read_only(self) -> bool:
        """Whether this is a read-only view (``MemoryStore(path, read_only=True)``)."""
        return self._native is not None and bool(self._native.read_only)

    def refresh(self) -> int:
        """Bring a read-only view up to date with the writer: apply the log entries it wrote since
        the open or the last refresh, following its log across snapshots. Searches in other threads
        wait while they are applied. A view two snapshots behind (or whose store was replaced) is
        reopened, logged at INFO. A store opened for writing is always current.

        Returns
        -------
        int
            Log entries applied (after a reopen: those the new view replayed); ``0`` for a writer.
        """
        n = int(self._n().refresh())
        if n >= 0:
            return n
        fresh = native_module().Store.open_read_only(*self._reader_args)
        old, self._native = self._native, fresh
        old.close()
        logger.info("memkern store %s: the read-only view fell behind the writer's snapshots and was reopened",
                    self._path)
        return int(fresh.replayed_entries)

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
    def add(self, namespace: str, summary: str, embedding: Any, turns: list[dict] | None = None,
            meta: dict | None = None, *, turn_embeddings: Any = None, event_time: float | None = None,
            turn_texts: Sequence[str] | None = None) -> int:
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
        return prepare_add(n.dim, namespace, summary, embedding, turns, meta, turn_embeddings=turn_embeddings,
                           event_time=event_time, turn_texts=turn_texts).run(self)

    @traced("memkern.store.add_batch", args=("namespace", "summaries"))
    def add_batch(self, namespace: str, summaries: Sequence[str], embeddings: Any,
                  turns: Sequence[list[dict] | None] | None = None, metas: Sequence[dict | None] | None = None, *,
                  turn_embeddings: Sequence[Any] | None = None, event_times: Sequence[float | None] | None = None,
                  turn_texts: Sequence[Sequence[str] | None] | None = None) -> np.ndarray:
        """Add ``n`` topic records in one atomic, logged call; returns their ids, int64 ``[n]``.

        ``embeddings`` is float32 ``[n, d]``; ``turns`` / ``metas`` are ``None`` or length-``n``
        lists; ``turn_embeddings`` is ``None`` or a length-``n`` list of ``[len(turns[i]), d]``
        arrays (or ``None`` entries); ``event_times`` is ``None`` or a length-``n`` list of unix
        seconds or ``None``; ``turn_texts`` is ``None`` or a length-``n`` list of turn-text lists
        (or ``None`` entries) (see :meth:`add`). The GIL is released while the index is built.
        """
        n = self._n()
        return prepare_add_batch(n.dim, namespace, summaries, embeddings, turns, metas, turn_embeddings=turn_embeddings,
                                 event_times=event_times, turn_texts=turn_texts).run(self)

    @traced("memkern.store.merge", args=("id",))
    def merge(self, id: int, summary: str, embedding: Any, turns: list[dict] | None = None, *,
              meta: dict | None = None, turn_embeddings: Any = None, event_time: float | None = None,
              turn_texts: Sequence[str] | None = None) -> int:
        """Merge new content into record ``id``: a new version with the new summary and embedding
        and the *union* of the old and new turns (old turns first, a turn already kept dropped
        (:func:`memkern.base.turns.turn_key`), none ever lost). The previous version stays readable through :meth:`history`. Returns the new
        version number. ``turn_embeddings`` (``[len(turns), d]``) adds turn records for the turns
        that are new; it is required when the record already has turn records and new turns come.
        ``event_time`` replaces the record's event time (``None`` keeps it); new turn records get
        the record's resulting event time. ``turn_texts`` (one per turn of ``turns``) are the new turn
        records' texts, as in :meth:`add`."""
        n = self._n()
        return prepare_merge(n.dim, id, summary, embedding, turns, meta=meta, turn_embeddings=turn_embeddings,
                             event_time=event_time, turn_texts=turn_texts).run(self)

    @traced("memkern.store.update", args=("id",))
    def update(self, id: int, summary: str | None = None, embedding: Any = None, turns: list[dict] | None = None,
               meta: dict | None = None, *, turn_embeddings: Any = None, event_time: float | None = None,
               turn_texts: Sequence[str] | None = None) -> int:
        """Write a new version of ``id`` replacing the given fields (``None`` keeps a field);
        returns the new version number. Replacing the turns of a topic that has turn records
        needs ``turn_embeddings`` for the new turns (the old turn records are then deleted).
        ``event_time`` replaces the record's event time (``None`` keeps it). ``turn_texts`` (one per
        turn, with ``turn_embeddings``) are the new turn records' texts, as in :meth:`add`."""
        n = self._n()
        return prepare_update(n.dim, id, summary, embedding, turns, meta, turn_embeddings=turn_embeddings,
                              event_time=event_time, turn_texts=turn_texts).run(self)

    @traced("memkern.store.invalidate", args=("id",))
    def invalidate(self, id: int, reason: str = "") -> None:
        """Mark ``id`` invalidated (kept, readable, excluded from search unless
        ``include_invalidated=True``). Invalidating twice raises :class:`MemkernValueError`."""
        n = self._n()
        rid = check_id(id)
        check_text("reason", reason)
        n.invalidate(rid, reason)

    @traced("memkern.store.delete", args=("id",))
    def delete(self, id: int) -> None:
        """Delete ``id`` (and its turn records): gone from search and ``get`` at once, from disk
        after :meth:`compact`. Deleting an unknown or already deleted id raises
        :class:`MemkernKeyError`."""
        n = self._n()
        n.delete(check_id(id))

    # ------------------------------------------------------------------ reads
    def get(self, id: int) -> Record:
        """The current version of record ``id`` (unknown / deleted id: :class:`MemkernKeyError`)."""
        return record_from(self._n().get(check_id(id)), self)

    @traced("memkern.store.get_batch", args=("ids",))
    def get_batch(self, ids: Iterable[int]) -> list[Record]:
        """Records for ``ids`` (int64 ``[n]``), in order; any unknown id raises before anything
        is returned."""
        arr = check_ids(list(ids) if not hasattr(ids, "__array__") and not is_torch(ids) else ids)
        return [record_from(d, self) for d in self._n().get_batch(arr)]

    def topic_ids(self, ids: Any) -> np.ndarray:
        """The topic of each record of ``ids`` (int64 ``[n]``): a turn record's topic id, ``-1``
        for a topic; one call, no record is read into Python. Unknown ids raise
        :class:`MemkernKeyError`."""
        return self._n().parents(check_ids(ids))

    def turns_with_topics(self, ids: Iterable[int]) -> list[tuple[Record, Record]]:
        """For turn record ids (e.g. from ``search(..., level="turn+topic")``, ``-1`` padding
        skipped): ``(turn record, its topic record)`` pairs in order, so a prompt can show the best
        turns with their topic summary. A topic id raises :class:`MemkernValueError`."""
        return turns_with_topics(self, ids)

    def history(self, id: int) -> list[Record]:
        """All versions of ``id``, oldest first (the last one is the current version)."""
        n = self._n()
        rid = check_id(id)
        cur = n.get(rid)
        return [record_from(cur, self, v) for v in n.history(rid)]

    def embeddings(self, ids: Any) -> np.ndarray:
        """Stored vectors of ``ids`` (int64 ``[n]``) as float32 ``[n, d]``, in one call. For
        metric ``"cos"`` these are the L2-normalised vectors."""
        arr = check_ids(ids)
        return self._n().embeddings(arr)

    @traced("memkern.store.search", args=("namespace", "queries", "k", "level"))
    def search(self, namespace: str, queries: Any, k: int = 20, ef: int | None = None,
               include_invalidated: bool = False, *, level: str = "topic", alpha: float = 1.0,
               candidates: int | None = None, mode: str = "dense", texts: Sequence[str] | None = None,
               fusion: str = _lexical.DEFAULT_FUSION, lexical_weight: float = _lexical.DEFAULT_LEXICAL_WEIGHT,
               filter: dict | None = None, time_range: tuple[float | None, float | None] | None = None,
               time_field: str = "event", recency: float | None = None,
               recency_weight: float = DEFAULT_RECENCY_WEIGHT, now: float | None = None,
               neighbour_weight: float = 0.0, group_weight: float = 0.0, group_key: str | None = None) -> tuple[np.ndarray, np.ndarray]:
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
        n = self._native
        if n is not None and (mode == "dense" and filter is None and time_range is None and recency is None
                              and (level == "topic" or level == "turn")
                              and neighbour_weight == 0.0 and group_weight == 0.0 and group_key is None):
            # The plain dense search (prepare_search's "search" call) without its general dispatch.
            # A closed store is found by the engine (check_open) instead of a call before it; its
            # error is still the one of every other call, and comes before any argument error.
            try:
                return n.search(*dense_args(self._dim, self.ef_search, namespace, queries, k, ef,
                                            include_invalidated, level))
            except Exception:
                if n.closed:
                    self._n()
                raise
        n = self._n()
        return prepare_search(n.dim, self.ef_search, namespace, queries, k, ef, include_invalidated, level=level,
                              alpha=alpha, candidates=candidates, mode=mode, texts=texts, fusion=fusion,
                              lexical_weight=lexical_weight, filter=filter, time_range=time_range,
                              time_field=time_field, recency=recency, recency_weight=recency_weight, now=now,
                              neighbour_weight=neighbour_weight, group_weight=group_weight,
                              group_key=group_key).run(self)

    def run(self, call: Any) -> Any:
        """Run a call prepared by :mod:`memkern.store.prepare` (``prepare_add`` etc., checked
        against this store's ``dim``) in the engine; returns what the matching method returns (a closed
        store raises as every call does: the call reaches the engine through :attr:`native`)."""
        return call.run(self)

    def namespaces(self) -> list[str]:
        """Namespaces that hold at least one record (sorted)."""
        return list(self._n().namespaces())

    def ids(self, namespace: str, include_invalidated: bool = False, *, level: str = "topic") -> np.ndarray:
        """All record ids of ``namespace`` at ``level`` ("topic" or "turn"), ascending, int64 ``[n]``
        (invalidated ones only with ``include_invalidated``)."""
        ns = check_namespace(namespace)
        if level not in LEVELS:
            raise bad_arg("level", '"topic" or "turn"', level)
        return self._n().ids(ns, bool(include_invalidated), native_level(level))

    def count(self, namespace: str, include_invalidated: bool = False, *, level: str = "topic") -> int:
        """Number of records of ``namespace`` at ``level`` ("topic" or "turn"). Invalidated
        records are excluded unless ``include_invalidated``; deleted ones are never counted."""
        ns = check_namespace(namespace)
        if level not in LEVELS:
            raise bad_arg("level", '"topic" or "turn"', level)
        return int(self._n().count(ns, bool(include_invalidated), native_level(level)))

    def __contains__(self, id: object) -> bool:
        try:
            return bool(self._n().contains(check_id(id)))
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

