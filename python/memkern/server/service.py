"""The operations ``memkern serve`` (HTTP) and ``memkern mcp`` (MCP tools) expose, over one store.

:class:`MemoryService` holds one :class:`memkern.MemoryStore` and serves any number of threads:

- The native store is thread-safe on its own (``csrc/store/store.cpp``: a ``std::shared_mutex``,
  shared for reads, unique for each write; ``search`` and ``add_batch`` release the GIL).
- Python-level read-modify-write paths (prospective reflection: search candidates, decide, write;
  ``update`` / ``delete`` of a record; ``respond``, which mutates the namespace's reranker and
  reward buffer) run under one lock *per namespace*, so different users proceed in parallel and
  one user's writes are applied one after the other (no lost MERGE, no double ADD of one fact).
  A raw add (``infer=False``) is one atomic ``add_batch`` with nothing read first: no lock.
- The embedder is shared through a batching queue (:class:`~memkern.server.shared_models.BatchingEmbedder`): concurrent
  requests' texts are embedded together, first come first served, by one thread at a time
  (Hugging Face fast tokenizers and the embedder's query cache are not thread-safe); the chat model
  runs one call at a time under a lock.

Every argument is validated before anything is written, with the same messages as the Python API
(``memkern`` errors naming the argument); ``infer=False`` adds are one atomic ``add_batch``.
"""
from __future__ import annotations

import itertools
import json
import logging
import math
import threading
import uuid
from collections import OrderedDict
from typing import Any, Sequence

import numpy as np

from ..errors import MemkernError, MemkernKeyError, MemkernTypeError, MemkernValueError, bad_arg
from ..ingest.extract import validate_turns
from ..protocols import missing_search_keywords, supports_event_time
from ..store import DEFAULT_RECENCY_WEIGHT
from ..text.template import event_seconds
from ..base.validate import check_text, iso_time
from . import scopes as S
from .ledger import FeedbackLedger
from .platform import Platform
from .readiness import Readiness
from .search_args import DEFAULT_FUSION, DEFAULT_LEXICAL_WEIGHT, check_json_size, filter_kw, mode_kw
from .limits import BusyError, ConflictError, Limits
from .shared_models import BatchingEmbedder, LockedChatModel

log = logging.getLogger("memkern")

#: The webhook event of each prospective-reflection action (NOOP: none).
WEBHOOK_EVENT = {"ADD": "ADD", "MERGE": "UPDATE", "UPDATE": "UPDATE", "INVALIDATE": "UPDATE"}

#: Query embeddings the served default embedder keeps (an exact LRU; ``--query-cache``).
DEFAULT_QUERY_CACHE = 4096

__all__ = ["BusyError", "ConflictError", "Limits", "MemoryService"]


def _check_text(value: Any, arg: str, limit: int) -> str:
    """A non-blank str of at most ``limit`` characters, valid UTF-8 (:func:`memkern.base.validate.check_text`)."""
    return check_text(arg, value, max_chars=limit, nonempty=True)


def _check_limit(value: Any, arg: str, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= hi:
        raise bad_arg(arg, f"an int in 1..{hi}", value)
    return value


def _check_memory_id(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < (1 << 63):
        raise bad_arg("memory_id", "a memory id (an int >= 0)", value)
    return value


def _unknown_memory(memory_id: int) -> MemkernKeyError:
    """The one error of an id that is unknown, deleted or outside the caller's scope (the same
    message in every case, so a caller learns nothing about other scopes' ids)."""
    return MemkernKeyError(f"memory_id: expected the id of a memory in the given scope, got {memory_id}")


class MemoryService:
    """mem0-shaped memory operations over one store, safe to call from many threads.

    Parameters
    ----------
    store : memkern.MemoryStore
        Served for the service's lifetime (the caller closes it, after :meth:`close`).
    embedder : memkern.protocols.Embedder, optional
        ``None``: the offline default (all-MiniLM-L6-v2) built with ``embedder_options``, by
        :meth:`load` or on first use.
    chat_model : memkern.protocols.ChatModel, optional
        Used by :meth:`respond` only. ``None``: the offline default (SmolLM2-135M-Instruct),
        built on first use.
    limits : Limits
    rmm_kwargs : dict, optional
        Extra :class:`memkern.RMM` arguments for :meth:`respond` (e.g. ``top_k``, ``top_m``).
    embed_batch : int
        Most texts embedded in one model call when concurrent requests share the embedder (1: every
        request embedded on its own, still first come first served).
    embedder_options : dict, optional
        :class:`memkern.Embedder` arguments of the default embedder (default
        ``{"query_cache": 4096}``: repeated search queries are answered from an exact LRU of
        their embeddings).
    max_rmms : int
        RMM instances (one per namespace that responded; each holds a reranker) kept in memory;
        the least recently used one beyond that is saved and dropped.
    """

    def __init__(self, store: Any, embedder: Any = None, chat_model: Any = None, *, limits: Limits | None = None,
                 rmm_kwargs: dict | None = None, embed_batch: int = 64, max_rmms: int = 64,
                 max_responses: int = 4096, embedder_options: dict | None = None):
        if isinstance(embed_batch, bool) or not isinstance(embed_batch, int) or embed_batch < 1:
            raise bad_arg("embed_batch", "an int >= 1", embed_batch)
        self.embed_batch = embed_batch
        self.embedder_options = {"query_cache": DEFAULT_QUERY_CACHE, **(embedder_options or {})}
        self.store = store
        self.limits = limits or Limits()
        self._embedder_raw = embedder
        self._chat_raw = chat_model
        self._chat_lock = threading.Lock()
        self._build_lock = threading.Lock()
        self._embedder: BatchingEmbedder | None = None if embedder is None else BatchingEmbedder(embedder, embed_batch)
        self._chat: LockedChatModel | None = None if chat_model is None else LockedChatModel(chat_model, self._chat_lock)
        self._ns_locks: dict[str, threading.Lock] = {}
        self._ns_locks_guard = threading.Lock()
        self._rmms: OrderedDict[str, Any] = OrderedDict()
        self._rmms_guard = threading.Lock()
        self.rmm_kwargs = dict(rmm_kwargs or {})
        self.max_rmms = int(max_rmms)
        # response_id -> (namespace, memkern.loops.rmm.Response); for feedback.
        self._responses: OrderedDict[str, tuple[str, Any]] = OrderedDict()
        self._responses_guard = threading.Lock()
        self.max_responses = int(max_responses)
        self._feedback_given = FeedbackLedger(getattr(store, "path", None), keep=16 * self.max_responses)
        self._respond_slots = threading.BoundedSemaphore(self.limits.max_pending_responds)
        self._counter = itertools.count()
        self.readiness = Readiness()
        #: mem0's platform features (project settings, webhooks, exports, profiles); :meth:`_emit` feeds its webhooks
        self.platform = Platform(self)

    def _emit(self, event: str, scope: S.Scope, rows: list[tuple[int, str | None]]) -> None:
        """Tell the platform (webhooks) of an applied write: ``event`` ADD / UPDATE / DELETE, ``rows``
        ``(memory id, text)``."""
        if rows and self.platform.state["webhooks"]:
            ids = scope.as_dict()
            self.platform.memory_event(event, [{"id": i, "memory": t, **ids} for i, t in rows])

    # ------------------------------------------------------------------ components
    @property
    def embedder(self) -> BatchingEmbedder:
        if self._embedder is None:
            with self._build_lock:
                if self._embedder is None:
                    from ..models import Embedder

                    log.info("serve: building the offline default embedder")
                    emb = Embedder(**self.embedder_options)
                    if emb.dim != self.store.dim:
                        raise bad_arg("embedder.dim", f"store.dim ({self.store.dim})", emb.dim)
                    self._embedder = BatchingEmbedder(emb, self.embed_batch)
        return self._embedder

    @property
    def chat_model(self) -> LockedChatModel:
        if self._chat is None:
            with self._build_lock:
                if self._chat is None:
                    from ..models import ChatModel

                    log.info("serve: building the offline default chat model")
                    self._chat = LockedChatModel(ChatModel(), self._chat_lock)
        return self._chat

    def load(self) -> None:
        """Load the models now instead of on the first request: build the embedder (the offline
        default when none was given; its width checked against the store's) and run it once on a
        query and a passage, so the first request costs what later ones do. The chat model is
        built when one was given (the default one stays built on the first respond)."""
        self._embed(["warm-up"], kind="query")
        self._embed(["warm-up"], kind="passage")
        if self._chat is not None:
            self._chat.count_tokens("warm-up")

    def start_loading(self, freeze_gc: bool = False) -> bool:
        """:meth:`load` in a background thread, once (``False`` when already started); its
        progress is :attr:`readiness` (what ``GET /health/ready`` reports). A request that needs
        the embedder meanwhile waits for it to be built. ``freeze_gc``: then keep everything the
        process holds out of later garbage collections (``gc.freeze``; ``memkern serve`` does)."""
        return self.readiness.start(self.load, freeze_gc=freeze_gc)

    def ready(self) -> tuple[bool, str]:
        """``(True, "ready")`` once the store is open and :meth:`load` has finished, else
        ``(False, why)``."""
        if getattr(self.store, "closed", False):
            return False, "store: expected open, got closed"
        if self.readiness.state != "ready":
            return False, self.readiness.detail()
        return True, "ready"

    def _embed(self, texts: list[str], kind: str = "passage") -> np.ndarray:
        emb = np.asarray(self.embedder.encode(list(texts), kind=kind), dtype=np.float32)
        if emb.shape != (len(texts), self.store.dim):
            raise bad_arg("embedder.encode(...)", f"float32 [{len(texts)}, {self.store.dim}]", tuple(emb.shape))
        return emb

    def ns_lock(self, namespace: str) -> threading.Lock:
        """The lock that serialises the read-modify-write paths of ``namespace``."""
        with self._ns_locks_guard:
            lock = self._ns_locks.get(namespace)
            if lock is None:
                lock = self._ns_locks[namespace] = threading.Lock()
            return lock

    # ------------------------------------------------------------------ validation
    def check_messages(self, messages: Any, arg: str = "messages", max_chars: int | None = None) -> list[dict]:
        """Turn dicts (``role``, default ``"user"``, and ``content`` str; other keys kept); a str is
        one user message.

        Each ``content`` is non-blank and holds at most ``max_text_chars`` characters
        (``max_chars``, when given, bounds their sum); the other keys of a message are JSON of at
        most ``max_meta_bytes``; everything keeps to the shared bounds
        (:func:`memkern.ingest.extract.validate_turns`, :func:`memkern.base.validate.check_turn`: ``role``
        length, UTF-8, JSON nesting)."""
        lim = self.limits
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        if isinstance(messages, list) and len(messages) > lim.max_messages:
            raise bad_arg(arg, f"at most {lim.max_messages} messages", f"{len(messages)} messages")
        turns = validate_turns(messages, arg)
        if not turns:
            raise bad_arg(arg, "at least one message", "[]")
        out = []
        total = 0
        for i, t in enumerate(turns):
            _check_text(t["content"], f"{arg}[{i}].content", lim.max_text_chars)
            total += len(t["content"])
            if max_chars is not None and total > max_chars:
                raise bad_arg(arg, f"contents of at most {max_chars} characters in all", f"more ({total} by "
                              f"{arg}[{i}])")
            t = dict(t)
            t.setdefault("role", "user")
            extra = {k: v for k, v in t.items() if k not in ("role", "content")}
            if extra:
                check_json_size(extra, f"{arg}[{i}]", lim.max_meta_bytes)
            out.append(t)
        return out

    def check_metadata(self, metadata: Any, arg: str = "metadata") -> dict | None:
        """``None`` or a JSON object of at most ``max_meta_bytes`` (compact JSON)."""
        if metadata is None:
            return None
        if not isinstance(metadata, dict):
            raise bad_arg(arg, "a JSON object", type(metadata).__name__, MemkernTypeError)
        check_json_size(metadata, arg, self.limits.max_meta_bytes)
        return metadata

    def _record_json(self, r: Any, score: float | None = None) -> dict:
        scope = S.decode(r.namespace)
        d = {"id": int(r.id), "memory": r.summary}
        if score is not None:
            d["score"] = float(score) if math.isfinite(score) else None
        d.update(
            (scope or S.Scope()).as_dict(),
            namespace=r.namespace, metadata=dict(r.meta or {}), version=int(r.version), status=r.status,
            created_at=iso_time(r.created_at), updated_at=iso_time(r.updated_at),
            event_time=iso_time(getattr(r, "event_time", None)),
        )
        return d

    def search_kw(self, filters: Any = None, time_range: Any = None, time_field: Any = "event", recency: Any = None,
                  recency_weight: Any = DEFAULT_RECENCY_WEIGHT, now: Any = None, filter: Any = None) -> dict:
        """The checked ``store.search`` filter and time keywords of a request (``{}`` when none is
        set): :func:`memkern.server.search_args.filter_kw`. ``filters`` (mem0's name) or ``filter``
        (the store's): metadata equality / ``$eq`` / ``$in``; ``time_range``: ``[start, end]``,
        each unix seconds, a date string or null (open); ``time_field``: ``"event"`` (the
        conversation's date, ``created`` where there is none), ``"created"`` or ``"updated"``;
        ``recency``: half-life in seconds of a recency prior weighted ``recency_weight`` and
        measured from ``now`` (default: the current time). Meaning as in
        :meth:`memkern.MemoryStore.search`.
        """
        return filter_kw(self.store, self.limits.max_meta_bytes, filters, filter, time_range, time_field, recency,
                         recency_weight, now)

    # ------------------------------------------------------------------ operations
    def add(self, messages: Any, *, user_id=None, agent_id=None, run_id=None, metadata: dict | None = None,
            infer: bool = True, date: Any = None) -> dict:
        """Add a conversation to the scope's memory.

        ``infer=True`` (default): prospective reflection with the LLM-free embedding extractor and
        decider (topics ADDed, MERGEd into, UPDATE or INVALIDATE existing memories, or NOOP).
        ``infer=False``: every message is stored as it is, one memory each, in one atomic write.
        ``date``: the conversation's date (unix seconds or a date string,
        :func:`memkern.text.template.event_seconds`), written to the records' ``event_time`` (what
        ``time_range`` / ``recency`` with ``time_field="event"`` use) and, with ``infer=True``,
        to the turns and ``meta["date"]`` (:meth:`memkern.RMM.end_session`).

        Returns ``{"results": [{"id", "memory", "event"}]}`` (``event``: the action applied).
        """
        scope = S.make_scope(user_id, agent_id, run_id)
        ns = S.encode(scope)
        turns = self.check_messages(messages)
        metadata = self.check_metadata(metadata)
        if not isinstance(infer, bool):
            raise bad_arg("infer", "a bool", infer, MemkernTypeError)
        et = event_seconds(date, "date")
        if et is not None and not supports_event_time(self.store):
            raise MemkernValueError("date: expected none, got a date, which this store's writes do not take")
        if not infer:
            embs = self._embed([t["content"] for t in turns])
            # One atomic native write, no read before it: no namespace lock needed.
            ids = self.store.add_batch(ns, [t["content"] for t in turns], embs, turns=[[t] for t in turns],
                                       metas=[dict(metadata or {}) for _ in turns],
                                       **({"event_times": [et] * len(turns)} if et is not None else {}))
            out = [{"id": int(i), "memory": t["content"], "event": "ADD"} for i, t in zip(ids, turns)]
            self._emit("ADD", scope, [(r["id"], r["memory"]) for r in out])
            return {"results": out}
        if metadata:
            raise bad_arg("metadata", "no metadata with infer=true (pass infer=false to keep it on raw messages)",
                          metadata)
        from ..loops.rmm import RMM

        with self.ns_lock(ns):
            # A throwaway RMM: prospective reflection needs no reranker, so nothing is persisted.
            rmm = RMM(self.store, embedder=self.embedder, chat_model=self._chat, namespace=ns, extractor="embedding",
                      decider="embedding", persist=False)
            results = rmm.end_session(turns, session_id=run_id, date=date)
        out = [{"id": int(r.id), "memory": r.summary, "event": r.action} for r in results]
        for event in ("ADD", "UPDATE"):
            self._emit(event, scope, [(r["id"], r["memory"]) for r in out if WEBHOOK_EVENT.get(r["event"]) == event])
        return {"results": out}

    def search(self, query: Any, *, user_id=None, agent_id=None, run_id=None, limit: int = 10,
               filters: dict | None = None, threshold: float | None = None, time_range: Any = None,
               time_field: Any = "event", recency: Any = None, recency_weight: Any = DEFAULT_RECENCY_WEIGHT,
               now: Any = None, mode: Any = "dense", fusion: Any = DEFAULT_FUSION,
               lexical_weight: Any = DEFAULT_LEXICAL_WEIGHT, filter: Any = None) -> dict:
        """The ``limit`` best memories of every scope that contains the given ids (see
        :mod:`memkern.server.scopes`), best first: ``{"results": [{"id", "memory", "score", ...}]}``.

        ``mode`` (``"dense"``, ``"lexical"``: BM25 over the query text, ``"hybrid"``: both fused),
        ``fusion``, ``lexical_weight``, ``filters`` / ``filter`` (metadata equality / ``$eq`` /
        ``$in``), ``time_range``, ``time_field`` and the recency prior (``recency``,
        ``recency_weight``, ``now``) mean what they mean in :meth:`memkern.MemoryStore.search`, with
        its defaults, and are checked by its checks (:mod:`memkern.server.search_args`). Each
        matching scope is searched on its own and the lists merged by score (``threshold``: the
        lowest score kept), so a one-scope search returns exactly what the store's search returns.
        """
        scope = S.make_scope(user_id, agent_id, run_id)
        query = _check_text(query, "query", self.limits.max_text_chars)
        limit = _check_limit(limit, "limit", self.limits.max_limit)
        if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, (int, float))
                                      or not math.isfinite(threshold)):
            raise bad_arg("threshold", "a finite number or null", threshold)
        kw = self.search_kw(filters, time_range, time_field, recency, recency_weight, now, filter=filter)
        kw.update(mode_kw(self.store, query, limit, kw, mode, fusion, lexical_weight))
        namespaces = S.matching(self.store.namespaces(), scope)
        if not namespaces:
            return {"results": []}
        q = None if kw.get("mode") == "lexical" else self._embed([query], kind="query")
        hits: list[tuple[float, int]] = []
        for ns in namespaces:
            ids, scores = self.store.search(ns, q, k=limit, **kw)
            ids, scores = np.asarray(ids)[0], np.asarray(scores)[0]
            keep = (ids >= 0) & np.isfinite(scores)
            hits += zip(scores[keep].tolist(), ids[keep].tolist())
        hits.sort(key=lambda h: (-h[0], h[1]))
        if threshold is not None:
            hits = [h for h in hits if h[0] >= threshold]
        out = []
        for score, rid in hits[:limit]:
            try:
                r = self.store.get(int(rid))
            except KeyError:  # deleted between the search and this read
                continue
            out.append(self._record_json(r, score))
        return {"results": out}

    def list(self, *, user_id=None, agent_id=None, run_id=None, limit: int = 100, offset: int = 0) -> dict:
        """The active memories of the matching scopes, by id, skipping the ``offset`` smallest ids
        and keeping the next ``limit``: ``{"results": [...], "count": all of them}``. Only those
        ``limit`` records are read (the id lists are native arrays, merged before any record is
        fetched)."""
        scope = S.make_scope(user_id, agent_id, run_id)
        limit = _check_limit(limit, "limit", self.limits.max_limit)
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise bad_arg("offset", "an int >= 0", offset)
        parts = [np.asarray(self.store.ids(ns), dtype=np.int64) for ns in S.matching(self.store.namespaces(), scope)]
        if not parts:
            return {"results": [], "count": 0}
        ids = np.concatenate(parts)
        count, end = len(ids), offset + limit
        if len(ids) > end:
            ids = np.partition(ids, end - 1)[:end]
        out = []
        for rid in np.sort(ids)[offset:].tolist():
            try:
                out.append(self._record_json(self.store.get(int(rid))))
            except KeyError:  # deleted since the id list was read
                continue
        return {"results": out, "count": count}

    def delete_scope(self, *, user_id=None, agent_id=None, run_id=None) -> dict:
        """Delete every memory of every scope that contains the given ids (at least one):
        ``{"deleted": n}``. Each namespace is cleared under its lock."""
        scope = S.make_scope(user_id, agent_id, run_id)
        n = 0
        for ns in S.matching(self.store.namespaces(), scope):
            gone = []
            with self.ns_lock(ns):
                for rid in np.asarray(self.store.ids(ns, include_invalidated=True), dtype=np.int64).tolist():
                    try:
                        self.store.delete(int(rid))
                        gone.append((int(rid), None))
                    except KeyError:  # deleted meanwhile
                        continue
            n += len(gone)
            self._emit("DELETE", S.decode(ns), gone)
        return {"deleted": n}

    def entities(self, within: S.Scope | None = None) -> list[dict]:
        """The users, agents and runs that have active memories, in scopes ``within`` contains
        (``None``: every scope): ``[{"type": "user"|"agent"|"run", "name", "total_memories"}]``,
        sorted by type and name."""
        totals: dict[tuple[str, str], int] = {}
        for ns in S.matching(self.store.namespaces(), within or S.Scope()):
            n = int(self.store.count(ns))
            if not n:
                continue
            for key, value in S.decode(ns).as_dict().items():
                if value is not None:
                    t = (key[:-3], value)
                    totals[t] = totals.get(t, 0) + n
        return [{"type": t, "name": name, "total_memories": n} for (t, name), n in sorted(totals.items())]

    def owned(self, memory_id: Any, *, user_id=None, agent_id=None, run_id=None, history: bool = False,
              any_scope: bool = False) -> Any:
        """The record ``memory_id`` (its versions with ``history``), if it belongs to a server
        scope that contains the given ids (at least one required, unless ``any_scope``: then no
        id means every server scope), else the same :class:`MemkernKeyError` as an unknown id: a
        caller never learns whether an id outside its scope exists, nor reaches a namespace that
        is not a scope (``memkern ingest -n``'s, a framework adapter's)."""
        scope = S.make_scope(user_id, agent_id, run_id, required=not any_scope)
        memory_id = _check_memory_id(memory_id)
        try:
            found = self.store.history(memory_id) if history else self.store.get(memory_id)
        except KeyError:
            raise _unknown_memory(memory_id) from None
        rec = found[-1] if history else found
        s = S.decode(rec.namespace)
        if s is None or not scope.contains(s):
            raise _unknown_memory(memory_id)
        return found

    def get(self, memory_id: int, *, user_id=None, agent_id=None, run_id=None, any_scope: bool = False) -> dict:
        """One memory (its current version) of the caller's scope (:meth:`owned`)."""
        return self._record_json(self.owned(memory_id, user_id=user_id, agent_id=agent_id, run_id=run_id,
                                            any_scope=any_scope))

    def update(self, memory_id: int, *, text: str | None = None, metadata: dict | None = None, user_id=None,
               agent_id=None, run_id=None, any_scope: bool = False) -> dict:
        """A new version of the memory (of the caller's scope, :meth:`owned`) with ``text``
        (re-embedded) and/or ``metadata`` replaced."""
        scope = dict(user_id=user_id, agent_id=agent_id, run_id=run_id, any_scope=any_scope)
        rec = self.owned(memory_id, **scope)
        if text is None and metadata is None:
            raise bad_arg("text/metadata", "at least one of them", None)
        if text is not None:
            text = _check_text(text, "text", self.limits.max_text_chars)
        metadata = self.check_metadata(metadata)
        emb = self._embed([text])[0] if text is not None else None
        with self.ns_lock(rec.namespace):
            try:
                self.store.update(memory_id, summary=text, embedding=emb, meta=metadata)
            except KeyError:  # deleted meanwhile
                raise _unknown_memory(memory_id) from None
        out = self.get(memory_id, **scope)
        self._emit("UPDATE", S.decode(rec.namespace), [(int(memory_id), out["memory"])])
        return out

    def delete(self, memory_id: int, *, user_id=None, agent_id=None, run_id=None, any_scope: bool = False) -> dict:
        """Delete the memory (of the caller's scope, :meth:`owned`): gone from search and get at
        once, from the files at the next compaction."""
        rec = self.owned(memory_id, user_id=user_id, agent_id=agent_id, run_id=run_id, any_scope=any_scope)
        with self.ns_lock(rec.namespace):
            try:
                self.store.delete(memory_id)
            except KeyError:  # deleted meanwhile
                raise _unknown_memory(memory_id) from None
        self._emit("DELETE", S.decode(rec.namespace), [(int(memory_id), rec.summary)])
        return {"id": int(memory_id), "deleted": True}

    def history(self, memory_id: int, *, user_id=None, agent_id=None, run_id=None, any_scope: bool = False) -> dict:
        """Every version of the memory (of the caller's scope, :meth:`owned`), oldest first, with
        the event that made it."""
        versions = self.owned(memory_id, user_id=user_id, agent_id=agent_id, run_id=run_id, history=True,
                              any_scope=any_scope)
        out = []
        prev = None
        for v in versions:
            out.append({
                "memory_id": int(v.id), "version": int(v.version), "event": "ADD" if prev is None else "UPDATE",
                "old_memory": prev, "new_memory": v.summary, "metadata": dict(v.meta or {}),
                "created_at": iso_time(v.created_at), "updated_at": iso_time(v.updated_at),
            })
            prev = v.summary
        return {"results": out}

    # ------------------------------------------------------------------ RMM loop
    def _rmm(self, ns: str) -> Any:
        """The namespace's RMM (kept; the least recently used beyond ``max_rmms`` saved and dropped)."""
        from ..loops.rmm import RMM

        with self._rmms_guard:
            rmm = self._rmms.get(ns)
            if rmm is not None:
                self._rmms.move_to_end(ns)
                return rmm
            rmm = RMM(self.store, embedder=self.embedder, chat_model=self.chat_model, namespace=ns,
                      extractor="embedding", decider="embedding", **self.rmm_kwargs)
            self._rmms[ns] = rmm
            for old in list(self._rmms)[:-1]:
                if len(self._rmms) <= self.max_rmms:
                    break
                lock = self.ns_lock(old)
                if lock.acquire(blocking=False):  # never wait here (another thread may hold it)
                    try:
                        self._rmms.pop(old).close()
                    finally:
                        lock.release()
            return rmm

    def respond(self, query: Any, *, user_id=None, agent_id=None, run_id=None,
                session_turns: Sequence[dict] | None = None, filters: dict | None = None, time_range: Any = None,
                time_field: Any = "event", recency: Any = None, recency_weight: Any = DEFAULT_RECENCY_WEIGHT,
                now: Any = None, filter: Any = None) -> dict:
        """Retrospective reflection in the scope's namespace: retrieve, rerank, answer with
        citations (the citations train the namespace's reranker). Returns the answer, the memories
        shown and a ``response_id`` for :meth:`feedback`. ``filters`` (or ``filter``) / ``time_range`` /
        ``time_field`` / ``recency`` / ``recency_weight`` / ``now`` (as in :meth:`search`) limit
        the first-stage search; the reranker chooses among the memories that pass.

        The query and the ``session_turns`` contents hold at most ``limits.max_respond_chars``
        characters together (the prompt grows with them); at most
        ``limits.max_pending_responds`` responds run or wait at once (one more raises
        :class:`BusyError`)."""
        scope = S.make_scope(user_id, agent_id, run_id)
        ns = S.encode(scope)
        budget = self.limits.max_respond_chars
        query = _check_text(query, "query", min(budget, self.limits.max_text_chars))
        if session_turns is not None:
            session_turns = self.check_messages(session_turns, "session_turns", max_chars=budget - len(query))
        kw = self.search_kw(filters, time_range, time_field, recency, recency_weight, now, filter=filter)
        if not self._respond_slots.acquire(blocking=False):
            raise BusyError(f"respond: expected at most {self.limits.max_pending_responds} responds at once, got "
                            "one more (retry later)")
        try:
            with self.ns_lock(ns):
                rmm = self._rmm(ns)
                resp = rmm.respond(query, session_turns=session_turns, **kw)
                memories = [self._record_json(self.store.get(i)) for i in resp.memory_ids]
        finally:
            self._respond_slots.release()
        rid = uuid.uuid4().hex
        with self._responses_guard:
            self._responses[rid] = (ns, resp)
            while len(self._responses) > self.max_responses:
                self._responses.popitem(last=False)
        return {"response_id": rid, "answer": resp.answer, "citations": list(resp.citations),
                "rewards": list(resp.rewards), "memories": memories, "citation_source": resp.citation_source,
                "timings": dict(resp.timings)}

    def feedback(self, response_id: Any, rewards: Any, *, scope: S.Scope | None = None) -> dict:
        """Explicit feedback on an earlier response: ``rewards`` (one number in [-1, 1] per memory
        shown, in order) train the namespace's reranker like the model's citations do.

        Accepted once per response: a second call raises :class:`ConflictError` (HTTP 409), also
        after a restart (the accepted ids are kept under the store's folder). ``scope``: the
        caller's own scope (an API key bound to one); a response of another scope is unknown."""
        if not isinstance(response_id, str):
            raise bad_arg("response_id", "a str", type(response_id).__name__, MemkernTypeError)
        unknown = bad_arg("response_id", "the id of one of this server's recent responses",
                          response_id[:64] + ("..." if len(response_id) > 64 else ""), MemkernKeyError)
        with self._responses_guard:
            entry = self._responses.get(response_id)
        if entry is not None and scope is not None and not scope.contains(S.decode(entry[0]) or S.Scope()):
            raise unknown
        if response_id in self._feedback_given:
            raise ConflictError(f"response_id: expected a response without feedback yet, got {response_id!r}, "
                                "whose feedback was already accepted")
        if entry is None:
            raise unknown
        ns, resp = entry
        with self.ns_lock(ns):
            if response_id in self._feedback_given:  # a concurrent call won
                raise ConflictError(f"response_id: expected a response without feedback yet, got {response_id!r}, "
                                    "whose feedback was already accepted")
            rmm = self._rmm(ns)
            n = len(resp.memory_ids)
            if (isinstance(rewards, (str, bytes)) or not isinstance(rewards, (list, tuple)) or len(rewards) != n
                    or not all(not isinstance(r, bool) and isinstance(r, (int, float)) and -1.0 <= r <= 1.0
                               for r in rewards)):
                raise bad_arg("rewards", f"{n} numbers in [-1, 1] (one per memory shown)", rewards)
            self._feedback_given.add(response_id)  # durable before the reranker sees it
            applied = rmm.feedback(resp, rewards)
        if not applied:
            return {"response_id": response_id, "applied": False,
                    "reason": "the reranker made no choice for this response (every candidate was shown)"}
        return {"response_id": response_id, "applied": True, "pending": rmm.pending}

    def close(self) -> None:
        """Finish the platform's jobs and webhook calls; save every kept RMM's reranker and reward buffer."""
        self.platform.close()
        with self._rmms_guard:
            for ns, rmm in list(self._rmms.items()):
                with self.ns_lock(ns):
                    rmm.close()
            self._rmms.clear()
