"""RMM: Reflective Memory Management around a :class:`memkern.MemoryStore`.

Prospective reflection (:meth:`RMM.end_session`): a finished session is split into topic memories
(:mod:`memkern.extract`), and each enters the bank by ADD / MERGE / UPDATE / INVALIDATE / NOOP
(:mod:`memkern.update`).

Retrospective reflection (:meth:`RMM.respond`): the query is embedded, the store returns the top-K
(default 20) memories, the reranker samples the top-M (default 5), the chat model answers from
them and cites the ones it used by number; citations become rewards (+1 cited, -1 uncited), which
are buffered and fed to ``reranker.update`` every ``batch_size`` (default 4) responses. The
reranker's state (and the not-yet-used reward buffer) is persisted per namespace under
``<store.path>/rerankers/``.

Two-level memory (``retrieval="turn+topic"``, opt-in): every write also stores each turn of a
topic as its own turn record (embedded once per session, ``kind="passage"``); :meth:`RMM.respond`
searches turns scored as ``sim(q, turn) + alpha * sim(q, its topic)``, groups the best
``4 * top_k`` turns by topic (rank order) into up to ``top_k`` candidate topics, lets the reranker
choose ``top_m`` of them (candidate vector: best turn + ``alpha`` * topic, so a fresh reranker keeps
the turn+topic order), and shows the model each chosen topic's summary with
only its best retrieved turns (at most ``turns_per_memory``). The default ``retrieval="topic"``
retrieves topic records and shows their raw turns as before.

Every call records a ``timings`` dict (seconds, ``time.perf_counter``) and logs it at debug level.
"""
from __future__ import annotations

import dataclasses
import inspect as _inspect
import logging
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from .errors import MemkernTypeError, MemkernValueError, bad_arg
from .extract import EmbeddingExtractor, LLMExtractor, Topic, validate_turns
from .jsonrepair import JSONRepairError, coerce_int, parse_json
from .paths import check_namespace, reranker_file
from .protocols import ChatModel as ChatModelProtocol
from .protocols import Decider, Embedder as EmbedderProtocol, Extractor, Store, TurnStore
from .prompts import rmm as prompts
from .update import (
    Candidate,
    EmbeddingDecider,
    LLMDecider,
    UpdateResult,
    apply_decision,
)

log = logging.getLogger("memkern")

__all__ = ["RMM", "Response", "UpdateResult", "parse_answer"]


@dataclass
class Response:
    """Result of :meth:`RMM.respond`.

    Attributes
    ----------
    answer : str
        The model's answer (citation markers removed).
    memory_ids : list[int]
        Store ids of the memories shown to the model, in prompt order (``[i]`` in the prompt is
        ``memory_ids[i]``).
    citations : list[int]
        Prompt indices the model cited (subset of ``range(len(memory_ids))``).
    rewards : list[float]
        ``+1`` for each cited memory, ``-1`` for each uncited one, aligned with ``memory_ids``.
    timings : dict[str, float]
        Seconds: ``embed`` (query, and the answer when citations are inferred), ``retrieve``
        (search + embeddings fetch), ``rerank``, ``generate`` (prompt + model call), ``update``
        (rewards, buffering, the reranker step and save when due), ``total``.
    raw : str
        The model's raw output.
    parsed : bool
        Whether the output parsed as the requested JSON (else citations came from ``[i]`` markers).
    citation_source : str
        ``"model"`` (the model's citations / markers) or ``"similarity"`` (the model cited
        nothing at all; memories with cosine ``>= cite_fallback`` to the answer were credited).
    turn_ids : list[list[int]]
        Aligned with ``memory_ids``: the turn record ids shown under each memory, in the order
        shown (conversation order). ``retrieval="turn+topic"`` only; empty lists in topic mode.
    """

    answer: str
    memory_ids: list[int]
    citations: list[int]
    rewards: list[float]
    timings: dict[str, float] = field(default_factory=dict)
    raw: str = ""
    parsed: bool = True
    citation_source: str = "model"
    turn_ids: list[list[int]] = field(default_factory=list)


_MARKER = re.compile(r"\[\s*(\d+(?:\s*,\s*\d+)*)\s*\]")


def parse_answer(text: str, n_memories: int) -> tuple[str, list[int], bool]:
    """Parse a cited answer: JSON ``{"answer", "citations"}`` (repaired) or ``[i]`` markers.

    Parameters
    ----------
    text : str
        Raw model output.
    n_memories : int
        Number of memories shown (valid citations are ``0..n_memories-1``; others dropped).

    Returns
    -------
    (answer, citations, parsed) : tuple[str, list[int], bool]
        ``citations`` sorted and unique; ``parsed`` False when the JSON could not be recovered.
    """
    answer, cites, parsed, _ = _parse_answer(text, n_memories)
    return answer, cites, parsed


def _parse_answer(text: str, n_memories: int) -> tuple[str, list[int], bool, bool]:
    """:func:`parse_answer` (same arguments) plus ``cited_at_all``: whether the output had a
    citations field or ``[i]`` markers at all."""
    answer: str | None = None
    cites: list[int] = []
    parsed = False
    has_field = False
    try:
        value = parse_json(text, dict)
        a = value.get("answer", value.get("response"))
        if a is not None:
            answer = a if isinstance(a, str) else str(a)
            parsed = True
            has_field = any(k in value for k in ("citations", "citation", "sources"))
            raw = value.get("citations", value.get("citation", value.get("sources", [])))
            if not isinstance(raw, list):
                raw = [raw]
            for x in raw:
                if isinstance(x, str) and "," in x:
                    cites += [c for c in (coerce_int(p) for p in x.split(",")) if c is not None]
                else:
                    c = coerce_int(x)
                    if c is not None:
                        cites.append(c)
    except JSONRepairError:
        pass
    if answer is None:
        # No usable JSON: the text before any JSON-looking debris is the answer.
        answer = text.split("{")[0].strip() or text.strip()
    for m in _MARKER.finditer(answer):
        has_field = True
        cites += [int(p) for p in m.group(1).split(",")]
    answer = " ".join(_MARKER.sub("", answer).split())
    cites = sorted({c for c in cites if 0 <= c < n_memories})
    return answer, cites, parsed, has_field


def _normalize(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def _namespace_ids(store: Store, namespace: str, include_invalidated: bool = True) -> list[int]:
    """All topic-record ids of ``namespace``, sorted (``store.ids``; turn records excluded)."""
    return sorted(int(i) for i in np.asarray(store.ids(namespace, include_invalidated=include_invalidated)).reshape(-1))


def _component(name: str, value: Any, proto: type) -> tuple[Any, str]:
    """``(object, "custom")`` for a user object meeting ``proto``, ``(None, value)`` for the
    built-in names ``"llm"`` / ``"embedding"``; a ``MemkernTypeError`` / ``MemkernValueError``
    naming ``name`` otherwise."""
    if isinstance(value, proto):
        return value, "custom"
    expected = f"'llm', 'embedding' or a memkern.protocols.{proto.__name__}"
    if not isinstance(value, str):
        raise bad_arg(name, expected, type(value).__name__, MemkernTypeError)
    if value not in ("llm", "embedding"):
        raise bad_arg(name, expected, value)
    return None, value


class RMM:
    """Reflective Memory Management: prospective + retrospective reflection over a store.

    Parameters
    ----------
    store : memkern.protocols.Store
        Where memories live (one namespace per user / agent), e.g. :class:`memkern.MemoryStore`.
        ``retrieval="turn+topic"`` needs a :class:`memkern.protocols.TurnStore`.
    chat_model : memkern.protocols.ChatModel, optional
        ``generate(prompts, max_new_tokens=None, json=False, seed=None) -> list[str]``.
        ``None``: the offline default (SmolLM2-135M-Instruct), built on first use.
    embedder : memkern.protocols.Embedder, optional
        ``encode(texts, kind="passage"|"query") -> float32 [n, d]`` with ``d == store.dim``.
        ``None``: the offline default (all-MiniLM-L6-v2), built on first use.
    reranker : memkern.Reranker, optional
        ``None``: the reranker persisted for this namespace under ``<store.path>/rerankers/``, or
        a fresh ``Reranker(store.dim, top_m=top_m)``.
    namespace : str
        The bank's key; a valid name (:func:`memkern.paths.check_namespace`: 1-128 characters of
        ``A-Z a-z 0-9 _ - . @ :``, not starting with ``.``, no ``..``), checked before its reranker
        file paths are built.
    extractor : {"llm", "embedding"} or memkern.protocols.Extractor
        Topic extraction (see :mod:`memkern.extract`), by name or your own object.
    decider : {"llm", "embedding"} or memkern.protocols.Decider, optional
        Update decisions, by name or your own object; ``None``: the same kind as ``extractor``
        (``"llm"`` when ``extractor`` is an object).
    top_k, top_m : int
        Retrieved candidates (K) and memories shown to the model (M).
    batch_size : int
        Responses whose rewards are buffered before one ``reranker.update``.
    seed : int
        Seeds reranker sampling (``seed + response index``) and generation.
    answer_max_new_tokens, extract_max_new_tokens, decide_max_new_tokens : int
        Generation budgets (keep small for CPU models).
    candidates_k : int
        Existing memories compared with each new topic.
    embedding_threshold : float
        Topic-boundary similarity of the embedding extractor.
    coverage_threshold : float or None
        With the llm extractor, user statements whose similarity to every extracted summary is
        below this become extra topics (:func:`memkern.extract.complete_coverage`); None: off.
    decider_kwargs : dict, optional
        Passed to :class:`~memkern.update.LLMDecider` / :class:`~memkern.update.EmbeddingDecider`.
    cite_fallback : float or None
        When the model's answer has no citation field and no ``[i]`` marker at all, credit the
        shown memories whose cosine similarity to the answer is ``>= cite_fallback`` (0.5;
        ``Response.citation_source == "similarity"``). ``None``: no citation, all rewards -1.
    explore : bool
        ``True`` (the paper's way): the reranker *samples* the top-M (Gumbel-top-M at its ``tau``),
        which explores but may show weaker memories; ``False``: the reranker's top-M by score
        (no noise; rewards still train it).
    save_every : int
        Save the reranker every this many updates (default 1: after each update). Saving writes
        the whole reranker state, replay buffer included (~10 MB at the default capacity), so
        larger values cut the amortised per-response cost; :meth:`close` always saves.
    persist : bool
        Save the reranker (and the pending reward buffer) under the store's directory.
    retrieval : {"topic", "turn+topic"}
        ``"topic"`` (default): search topic records, show their raw turns. ``"turn+topic"``:
        two-level memory (see the module docstring); needs a :class:`memkern.MemoryStore`.
        Topics written in topic mode have no turn records and are not found by turn search until
        :meth:`index_turns` gives them some.
    alpha : float
        ``retrieval="turn+topic"``: weight of the topic similarity in a turn's score.
    turns_per_memory : int
        ``retrieval="turn+topic"``: best retrieved turns shown under each memory.
    """

    def __init__(
        self,
        store: Store,
        chat_model: ChatModelProtocol | None = None,
        embedder: EmbedderProtocol | None = None,
        reranker: Any = None,
        namespace: str = "default",
        extractor: str | Extractor = "llm",
        decider: str | Decider | None = None,
        top_k: int = 20,
        top_m: int = 5,
        batch_size: int = 4,
        seed: int = 0,
        answer_max_new_tokens: int = 64,
        extract_max_new_tokens: int = 160,
        decide_max_new_tokens: int = 64,
        candidates_k: int = 5,
        persist: bool = True,
        embedding_threshold: float = 0.25,
        coverage_threshold: float | None = 0.45,
        decider_kwargs: dict | None = None,
        cite_fallback: float | None = 0.5,
        save_every: int = 1,
        explore: bool = True,
        retrieval: str = "topic",
        alpha: float = 1.0,
        turns_per_memory: int = 3,
    ):
        check_namespace(namespace)  # before any path is built from it (reranker files)
        if not isinstance(store, Store):
            raise bad_arg("store", "a memkern.protocols.Store (e.g. memkern.MemoryStore)", type(store).__name__,
                          MemkernTypeError)
        for name, v, proto in (("chat_model", chat_model, ChatModelProtocol), ("embedder", embedder, EmbedderProtocol)):
            if v is not None and not isinstance(v, proto):
                raise bad_arg(name, f"None or a memkern.protocols.{proto.__name__}", type(v).__name__, MemkernTypeError)
        custom_extractor, extractor = _component("extractor", extractor, Extractor)
        if decider is None:
            decider = "llm" if custom_extractor is not None else extractor
        custom_decider, decider = _component("decider", decider, Decider)
        for name, v in (("top_k", top_k), ("top_m", top_m), ("batch_size", batch_size), ("candidates_k", candidates_k)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise bad_arg(name, "a positive int", v)
        if top_m > top_k:
            raise bad_arg("top_m", f"<= top_k ({top_k})", top_m)
        if retrieval not in ("topic", "turn+topic"):
            raise bad_arg("retrieval", "'topic' or 'turn+topic'", retrieval)
        if retrieval == "turn+topic" and not isinstance(store, TurnStore):
            raise bad_arg("store", "a store with two-level memory (memkern.MemoryStore) for retrieval='turn+topic'",
                          type(store).__name__, MemkernTypeError)
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.floating)) or not np.isfinite(alpha):
            raise bad_arg("alpha", "a finite float", alpha)
        if isinstance(turns_per_memory, bool) or not isinstance(turns_per_memory, int) or turns_per_memory < 1:
            raise bad_arg("turns_per_memory", "a positive int", turns_per_memory)
        self.retrieval = retrieval
        self.alpha = float(alpha)
        self.turns_per_memory = turns_per_memory
        self.store = store
        self.namespace = namespace
        self.extractor_kind = extractor
        self.decider_kind = decider
        self.top_k, self.top_m, self.batch_size = top_k, top_m, batch_size
        self.seed = int(seed)
        self.answer_max_new_tokens = int(answer_max_new_tokens)
        self.extract_max_new_tokens = int(extract_max_new_tokens)
        self.decide_max_new_tokens = int(decide_max_new_tokens)
        self.candidates_k = candidates_k
        self.persist = bool(persist)
        self.embedding_threshold = float(embedding_threshold)
        self.coverage_threshold = None if coverage_threshold is None else float(coverage_threshold)
        self._decider_kwargs = dict(decider_kwargs or {})
        self.cite_fallback = None if cite_fallback is None else float(cite_fallback)
        if isinstance(save_every, bool) or not isinstance(save_every, int) or save_every < 1:
            raise bad_arg("save_every", "a positive int", save_every)
        self.save_every = save_every
        self.explore = bool(explore)
        self._chat_model = chat_model
        self._embedder = embedder
        self._reranker = reranker
        self._extractor: Extractor | None = custom_extractor
        self._decider: Decider | None = custom_decider
        self._buffer: list[tuple[Any, np.ndarray]] = []
        self.n_responses = 0
        self.n_updates = 0
        self.last_update_stats: dict[str, Any] = {}
        if embedder is not None and embedder.dim != store.dim:
            raise bad_arg("embedder.dim", f"store.dim ({store.dim})", embedder.dim)
        self._load_buffer()

    # ------------------------------------------------------------------ lazily built components
    @property
    def chat_model(self) -> ChatModelProtocol:
        if self._chat_model is None:
            from .models import ChatModel

            log.info("rmm: building the offline default chat model")
            self._chat_model = ChatModel()
        return self._chat_model

    @property
    def embedder(self) -> EmbedderProtocol:
        if self._embedder is None:
            from .models import Embedder

            log.info("rmm: building the offline default embedder")
            self._embedder = Embedder()
            if self._embedder.dim != self.store.dim:
                raise bad_arg("embedder.dim", f"store.dim ({self.store.dim})", self._embedder.dim)
        return self._embedder

    def _reranker_path(self, suffix: str = ".pt") -> str | None:
        path = self.store.path  # Store protocol: None for a store that is not on disk
        if not path or not self.persist:
            return None
        return os.fspath(reranker_file(path, self.namespace, suffix))

    @property
    def reranker(self) -> Any:
        if self._reranker is None:
            from .reranker import Reranker

            path = self._reranker_path()
            if path and os.path.exists(path):
                load = _inspect.getattr_static(Reranker, "load", None)
                if isinstance(load, (classmethod, staticmethod)):
                    self._reranker = Reranker.load(path)
                else:
                    self._reranker = Reranker(self.store.dim, top_m=self.top_m)
                    self._reranker.load(path)
                log.info("rmm: loaded the reranker of namespace %r from %s", self.namespace, path)
            else:
                self._reranker = Reranker(self.store.dim, top_m=self.top_m)
                log.info("rmm: fresh reranker for namespace %r (dim %d, top_m %d)", self.namespace, self.store.dim, self.top_m)
        return self._reranker

    @property
    def extractor(self) -> Extractor:
        if self._extractor is None:
            if self.extractor_kind == "llm":
                cov = self.coverage_threshold
                self._extractor = LLMExtractor(
                    self.chat_model, max_new_tokens=self.extract_max_new_tokens,
                    embed=None if cov is None else self._embed, coverage_threshold=0.45 if cov is None else cov,
                )
            else:
                self._extractor = EmbeddingExtractor(self.embedder, threshold=self.embedding_threshold)
        return self._extractor

    @property
    def decider(self) -> Decider:
        if self._decider is None:
            if self.decider_kind == "llm":
                self._decider = LLMDecider(self.chat_model, max_new_tokens=self.decide_max_new_tokens, **self._decider_kwargs)
            else:
                kw = dict(self._decider_kwargs)
                kw.setdefault("embed", self._embed)
                self._decider = EmbeddingDecider(**kw)
        return self._decider

    def _embed(self, texts: list[str], kind: str = "passage") -> np.ndarray:
        emb = np.asarray(self.embedder.encode(list(texts), kind=kind), dtype=np.float32)
        if emb.ndim != 2 or emb.shape != (len(texts), self.store.dim):
            raise bad_arg("embedder.encode(...)", f"float32 [{len(texts)}, {self.store.dim}]", tuple(emb.shape))
        return emb

    # ------------------------------------------------------------------ prospective reflection
    def end_session(self, turns: Sequence[dict], session_id: str | int | None = None, timestamp: str | None = None) -> list[UpdateResult]:
        """Prospective reflection: extract the session's topics and fold them into the bank.

        Parameters
        ----------
        turns : list of dict
            The session's turns (``role``, ``content``; extra keys kept). Each stored turn gets
            ``session_id`` and ``turn_index`` unless it has them.
        session_id : str or int, optional
            Defaults to a counter-based id.
        timestamp : str, optional
            Stored in each new record's ``meta``.

        Returns
        -------
        list[UpdateResult]
            One per topic; ``results[0].timings`` (shared by all) holds ``extract``, ``embed``,
            ``decide`` and ``update`` seconds.
        """
        return self.end_sessions([turns], [session_id], [timestamp])[0]

    def end_sessions(
        self,
        sessions: Sequence[Sequence[dict]],
        session_ids: Sequence[Any] | None = None,
        timestamps: Sequence[Any] | None = None,
        extract_batch: int = 4,
        progress: Any = None,
    ) -> list[list[UpdateResult]]:
        """Prospective reflection over several sessions, in order (extraction batched).

        Extraction of up to ``extract_batch`` sessions runs as one batched model call; updates
        are applied session by session so later sessions see earlier ones. ``progress`` is an
        optional callable ``progress(n_sessions_done)``.
        """
        if isinstance(sessions, (str, bytes)) or not isinstance(sessions, Sequence):
            raise bad_arg("sessions", "a list of sessions (lists of turn dicts)", type(sessions).__name__, MemkernTypeError)
        n = len(sessions)
        session_ids = list(session_ids) if session_ids is not None else [None] * n
        timestamps = list(timestamps) if timestamps is not None else [None] * n
        if len(session_ids) != n or len(timestamps) != n:
            raise bad_arg("session_ids/timestamps", f"{n} entries", (len(session_ids), len(timestamps)))
        prepared = []
        for i, turns in enumerate(sessions):
            turns = validate_turns(turns, f"sessions[{i}]")
            sid = session_ids[i]
            if sid is None:
                sid = f"s{int(time.time() * 1000)}-{i}"
            sid = str(sid)
            annotated = []
            for j, t in enumerate(turns):
                t = dict(t)
                t.setdefault("session_id", sid)
                t.setdefault("turn_index", j)
                if timestamps[i] is not None:
                    t.setdefault("timestamp", timestamps[i])
                annotated.append(t)
            prepared.append((sid, annotated, timestamps[i]))
        out: list[list[UpdateResult]] = []
        for start in range(0, n, max(1, int(extract_batch))):
            chunk = prepared[start : start + extract_batch]
            t0 = time.perf_counter()
            topics_per = self.extractor.extract_batch([c[1] for c in chunk], seed=self.seed)
            t_extract = (time.perf_counter() - t0) / max(1, len(chunk))
            for (sid, turns, ts), topics in zip(chunk, topics_per):
                res = self._fold(topics, turns, sid, ts, t_extract)
                out.append(res)
                if progress is not None:
                    progress(len(out))
        return out

    def _candidates(self, embs: np.ndarray) -> list[list[Candidate]]:
        if self.store.count(self.namespace) == 0:
            return [[] for _ in range(len(embs))]
        k = min(self.candidates_k, max(1, self.store.count(self.namespace)))
        ids, _ = self.store.search(self.namespace, embs, k=k)
        ids = np.asarray(ids)
        out = []
        for row, e in zip(ids, _normalize(embs)):
            valid = [int(i) for i in row if i >= 0]
            if not valid:
                out.append([])
                continue
            sims = _normalize(self.store.embeddings(valid)) @ e
            cands = [Candidate(i, self.store.get(i).summary, float(s)) for i, s in zip(valid, sims)]
            cands.sort(key=lambda c: -c.similarity)
            out.append(cands)
        return out

    def _fold(self, topics: list[Topic], turns: list[dict], sid: str, ts: Any, t_extract: float) -> list[UpdateResult]:
        timings = {"extract": t_extract}
        if not topics:
            timings.update(embed=0.0, decide=0.0, update=0.0, total=t_extract)
            return []
        t0 = time.perf_counter()
        embs = self._embed([tp.summary for tp in topics])
        # Two-level memory: every turn of the session embedded once, in one batch.
        turn_embs = self._embed([str(t["content"]) for t in turns]) if self.two_level and turns else None
        timings["embed"] = time.perf_counter() - t0
        # Topics of one session that repeat each other are folded together first.
        keep: list[int] = []
        ne = _normalize(embs)
        for i in range(len(topics)):
            dup = next((j for j in keep if float(ne[i] @ ne[j]) >= 0.95), None)
            if dup is None:
                keep.append(i)
            else:
                topics[dup].turns = sorted(set(topics[dup].turns) | set(topics[i].turns))
        topics = [topics[i] for i in keep]
        embs = embs[keep]
        t0 = time.perf_counter()
        cands = self._candidates(embs)
        t_search = time.perf_counter() - t0
        t0 = time.perf_counter()
        items = [(tp.summary, c) for tp, c in zip(topics, cands)]
        decisions = self.decider.decide_batch(items, seed=self.seed)
        timings["decide"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        results = []
        for tp, e, c, d in zip(topics, embs, cands, decisions):
            meta = {"session_id": sid, "source": tp.source}
            if ts is not None:
                meta["timestamp"] = ts
            te = None
            if self.two_level:
                te = turn_embs[list(tp.turns)] if tp.turns else np.zeros((0, self.store.dim), np.float32)
            r = apply_decision(
                self.store, self.namespace, tp.summary, e, [turns[i] for i in tp.turns], d, c,
                embed=lambda texts: self._embed(texts), meta=meta, topic_source=tp.source, turn_embeddings=te,
            )
            results.append(r)
        timings["update"] = time.perf_counter() - t0 + t_search
        timings["total"] = sum(timings[k] for k in ("extract", "embed", "decide", "update"))
        for r in results:
            r.timings = timings
        log.debug(
            "rmm.end_session %s: %d topics -> %s; timings %s", sid, len(results),
            [r.action for r in results], {k: round(v * 1000, 2) for k, v in timings.items()},
        )
        return results

    # ------------------------------------------------------------------ retrospective reflection
    def respond(self, query: str, session_turns: Sequence[dict] | None = None) -> Response:
        """Retrospective reflection: retrieve, rerank, answer with citations, learn from them.

        Parameters
        ----------
        query : str
        session_turns : list of dict, optional
            The current session so far (shown to the model after the memories).

        Returns
        -------
        Response
        """
        if not isinstance(query, str) or not query.strip():
            raise bad_arg("query", "a non-empty str", query)
        if session_turns is not None:
            session_turns = validate_turns(session_turns, "session_turns")
        timings: dict[str, float] = {}
        t0 = time.perf_counter()
        q = self._embed([query], kind="query")
        timings["embed"] = time.perf_counter() - t0
        ids, cand, m_sel, sel, best_turns = self._retrieve_and_rerank(q, timings)
        cand_sel = np.asarray(self.store.embeddings(m_sel), np.float32) if len(m_sel) else None
        t0 = time.perf_counter()
        if self.two_level:
            # Each chosen topic's summary with only its best retrieved turns, in conversation order.
            memories, shown = [], []
            for i in m_sel:
                trs = sorted(best_turns[int(i)][1], key=_turn_order)
                memories.append({"summary": best_turns[int(i)][0].summary, "turns": [t.turn for t in trs]})
                shown.append([int(t.id) for t in trs])
            msgs = prompts.answer_messages(query, memories, session_turns, max_turns_per_memory=self.turns_per_memory,
                                           selected_turns=True)
        else:
            records = [self.store.get(int(i)) for i in m_sel]
            memories = [{"summary": r.summary, "turns": r.turns} for r in records]
            shown = [[] for _ in m_sel]
            msgs = prompts.answer_messages(query, memories, session_turns)
        raw = self.chat_model.generate([msgs], max_new_tokens=self.answer_max_new_tokens, json=True, seed=self.seed)[0]
        timings["generate"] = time.perf_counter() - t0
        answer, cites, parsed, cited_at_all = _parse_answer(raw, len(m_sel))
        citation_source = "model"
        if not cited_at_all and self.cite_fallback is not None and len(m_sel) and answer:
            # The model gave no citation field at all: attribute the answer to the memories it
            # is similar to (cosine >= cite_fallback), so the reranker still gets a signal.
            t0 = time.perf_counter()
            a = _normalize(self._embed([answer]))[0]
            timings["embed"] += time.perf_counter() - t0
            sims = _normalize(cand_sel) @ a
            cites = [i for i, x in enumerate(sims) if float(x) >= self.cite_fallback]
            citation_source = "similarity"
        t0 = time.perf_counter()
        rewards = [1.0 if i in cites else -1.0 for i in range(len(m_sel))]
        self.n_responses += 1
        if sel is not None:
            self._buffer.append((sel, np.asarray(rewards, dtype=np.float32)))
            if len(self._buffer) >= self.batch_size:
                self.flush()
        timings["update"] = time.perf_counter() - t0
        timings["total"] = sum(timings[k] for k in ("embed", "retrieve", "rerank", "generate", "update"))
        log.debug("rmm.respond: %d memories, cited %s; timings %s", len(m_sel), cites, {k: round(v * 1000, 2) for k, v in timings.items()})
        return Response(answer, [int(i) for i in m_sel], cites, rewards, timings, raw, parsed, citation_source, shown)

    @property
    def two_level(self) -> bool:
        """Whether this RMM runs two-level memory (``retrieval="turn+topic"``)."""
        return self.retrieval == "turn+topic"

    def _retrieve_turn_topic(self, q: np.ndarray) -> tuple[np.ndarray, dict[int, tuple[Any, list[Any], float]]]:
        """Turn+topic search, grouped by topic.

        Searches ``4 * top_k`` turns scored ``sim(q, turn) + alpha * sim(q, topic)`` and walks
        them best first: the first ``top_k`` distinct topics become the candidates (in order of
        their best turn), each keeping its best ``turns_per_memory`` retrieved turns.

        Returns
        -------
        ids : int64 [n]
            Candidate topic ids, ``n <= top_k``.
        groups : dict
            ``topic id -> (topic record, [turn records, best first], best turn+topic score)``.
        """
        groups: dict[int, tuple[Any, list[Any], float]] = {}
        if self.store.count(self.namespace, level="turn") == 0:
            return np.zeros(0, np.int64), groups
        tids, scores = self.store.search(self.namespace, q, k=4 * self.top_k, level="turn+topic", alpha=self.alpha)
        tids, scores = np.asarray(tids).reshape(-1), np.asarray(scores).reshape(-1)
        keep = tids >= 0
        pairs = self.store.turns_with_topics(tids[keep])
        for (turn, topic), s in zip(pairs, scores[keep]):
            g = groups.get(int(topic.id))
            if g is None:
                if len(groups) >= self.top_k:
                    continue
                groups[int(topic.id)] = g = (topic, [], float(s))
            if len(g[1]) < self.turns_per_memory:
                g[1].append(turn)
        return np.fromiter(groups, dtype=np.int64, count=len(groups)), groups

    def _retrieve_and_rerank(self, q: np.ndarray, timings: dict[str, float]):
        """Top-K search then top-M selection.

        Returns (candidate ids, candidates, selected ids, selection, groups); ``groups`` is the
        turn+topic grouping of :meth:`_retrieve_turn_topic` (empty in topic mode).
        """
        import torch

        t0 = time.perf_counter()
        groups: dict[int, tuple[Any, list[Any], float]] = {}
        if self.store.count(self.namespace) == 0:
            timings["retrieve"] = time.perf_counter() - t0
            timings["rerank"] = 0.0
            return np.zeros(0, np.int64), None, np.zeros(0, np.int64), None, groups
        if self.two_level:
            ids, groups = self._retrieve_turn_topic(q)
        else:
            ids, _ = self.store.search(self.namespace, q, k=self.top_k)
            ids = np.asarray(ids).reshape(-1)
            ids = ids[ids >= 0].astype(np.int64)
        emb = np.asarray(self.store.embeddings(ids), dtype=np.float32) if len(ids) else np.zeros((0, self.store.dim), np.float32)
        if self.two_level and len(ids):
            # Reranker candidate = best turn + alpha * topic: a fresh reranker's score q . c is then
            # exactly the turn+topic retrieval score (the topic vector alone would re-rank by topic).
            best = np.asarray(self.store.embeddings([int(groups[int(i)][1][0].id) for i in ids]), dtype=np.float32)
            emb = best + np.float32(self.alpha) * emb
        timings["retrieve"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        n = len(ids)
        if n <= self.top_m:
            # Nothing to choose: every candidate is shown, the reranker neither samples nor learns.
            timings["rerank"] = time.perf_counter() - t0
            return ids, emb, ids, None, groups
        cand = torch.zeros(1, self.top_k, self.store.dim, dtype=torch.float32)
        cand[0, :n] = torch.from_numpy(emb)
        mask = torch.zeros(1, self.top_k, dtype=torch.bool)
        mask[0, :n] = True
        sel = self.reranker.select(torch.from_numpy(q), cand, mask=mask, seed=self.seed + self.n_responses,
                                   greedy=not self.explore)
        picks = [int(i) for i in sel.indices[0].tolist()]
        bad = [i for i in picks if not 0 <= i < n]
        if bad:
            raise MemkernValueError(f"reranker.select: expected indices of unmasked candidates in [0, {n}), got {picks}")
        timings["rerank"] = time.perf_counter() - t0
        return ids, emb, ids[picks], sel, groups

    # ------------------------------------------------------------------ reranker learning
    @property
    def pending(self) -> int:
        """Responses whose rewards wait in the buffer."""
        return len(self._buffer)

    def flush(self) -> dict | None:
        """Feed the buffered rewards to ``reranker.update`` now (also called every ``batch_size``)."""
        if not self._buffer:
            return None
        import torch

        sels = [s for s, _ in self._buffer]
        rewards = torch.from_numpy(np.stack([r for _, r in self._buffer]).astype(np.float32))
        sel = _cat_selections(sels)
        stats = self.reranker.update(sel, rewards)
        self._buffer.clear()
        self.n_updates += 1
        self.last_update_stats = dict(stats or {})
        if self.n_updates % self.save_every == 0:
            self.save()
        log.debug("rmm: reranker update %d on %d responses: %s", self.n_updates, rewards.shape[0], self.last_update_stats)
        return self.last_update_stats

    def _buffer_path(self) -> str | None:
        return self._reranker_path(".buffer.pt")

    def save(self) -> None:
        """Persist the reranker and the pending reward buffer under ``<store.path>/rerankers/``."""
        path = self._reranker_path()
        if path is None:
            return
        import torch

        os.makedirs(os.path.dirname(path), exist_ok=True)
        if self._reranker is not None:
            tmp = self._reranker_path(".pt.tmp")
            self._reranker.save(tmp)
            os.replace(tmp, path)
        bpath = self._buffer_path()
        if self._buffer:
            data = [(_selection_to_dict(s), torch.as_tensor(np.asarray(r, np.float32))) for s, r in self._buffer]
            btmp = self._reranker_path(".buffer.pt.tmp")
            torch.save(data, btmp)
            os.replace(btmp, bpath)
        elif os.path.exists(bpath):
            os.remove(bpath)

    def _load_buffer(self) -> None:
        bpath = self._buffer_path()
        if not bpath or not os.path.exists(bpath):
            return
        import torch

        from .reranker import Selection

        try:
            data = torch.load(bpath, weights_only=True)
            self._buffer = [(Selection(**d), np.asarray(r, np.float32)) for d, r in data]
        except Exception as exc:  # a stale buffer must never block the memory
            log.warning("rmm: ignoring unreadable reward buffer %s (%s)", bpath, exc)
            self._buffer = []

    def close(self) -> None:
        """Persist the reranker and any pending rewards (call at the end of a process)."""
        if self._buffer or self._reranker is not None:
            self.save()

    def index_turns(self) -> int:
        """Give every active topic of the namespace that lacks turn records one per turn.

        For a bank written in topic mode and then used with ``retrieval="turn+topic"``: the
        missing turns are embedded (``kind="passage"``) and the topic gets a new version with the
        same summary, embedding and turns (``store.update``). Needs a two-level store.

        Returns
        -------
        int
            Number of topics given turn records.
        """
        if not isinstance(self.store, TurnStore):
            raise bad_arg("store", "a store with two-level memory (memkern.protocols.TurnStore)", type(self.store).__name__,
                          MemkernTypeError)
        from .update import _full_turn_matrix, _has_all_turn_records

        done = 0
        for i in _namespace_ids(self.store, self.namespace, include_invalidated=False):
            r = self.store.get(i)
            if not r.turns or _has_all_turn_records(r):
                continue
            te = _full_turn_matrix(self.store, r, r.turns, [], np.zeros((0, self.store.dim), np.float32), self._embed)
            self.store.update(i, turns=r.turns, turn_embeddings=te)
            done += 1
        log.info("rmm.index_turns: %d topic(s) of namespace %r given turn records", done, self.namespace)
        return done

    # ------------------------------------------------------------------ inspection
    def inspect(self, include_invalidated: bool = True) -> list[dict[str, Any]]:
        """The namespace's memory bank: one dict per record, ordered by id.

        Keys: ``id``, ``summary``, ``version``, ``status``, ``turns`` (count), ``turn_records``
        (count of its turn records, two-level memory), ``sessions`` (session ids of its turns),
        ``meta``.
        """
        out = []
        for i in sorted(_namespace_ids(self.store, self.namespace, include_invalidated)):
            r = self.store.get(i)
            if not include_invalidated and str(getattr(r, "status", "active")).lower() != "active":
                continue
            sessions = []
            for t in r.turns or []:
                s = t.get("session_id")
                if s is not None and s not in sessions:
                    sessions.append(s)
            out.append({
                "id": int(r.id), "summary": r.summary, "version": int(getattr(r, "version", 1)),
                "status": str(getattr(r, "status", "active")), "turns": len(r.turns or []),
                "turn_records": len(getattr(r, "turn_ids", ()) or ()), "sessions": sessions, "meta": dict(r.meta or {}),
            })
        return out

    def stats(self) -> dict[str, Any]:
        """Summary of the namespace: record counts by status, responses, reranker updates."""
        bank = self.inspect()
        by_status: dict[str, int] = {}
        for r in bank:
            by_status[r["status"]] = by_status.get(r["status"], 0) + 1
        return {
            "namespace": self.namespace, "records": len(bank), "by_status": by_status,
            "responses": self.n_responses, "reranker_updates": self.n_updates, "pending_rewards": self.pending,
        }


def _turn_order(turn_record: Any) -> int:
    """A turn record's position in its topic's turn list (old sessions first: conversation order)."""
    pos = (turn_record.meta or {}).get("turn_position", 0)
    return int(pos) if isinstance(pos, int) else 0


def _selection_to_dict(sel: Any) -> dict:
    if dataclasses.is_dataclass(sel):
        return {f.name: _detach(getattr(sel, f.name)) for f in dataclasses.fields(sel)}
    return {k: _detach(v) for k, v in vars(sel).items()}


def _detach(v: Any) -> Any:
    return v.detach() if hasattr(v, "detach") else v


def _cat_selections(sels: Sequence[Any]) -> Any:
    """Concatenate per-response selections along the batch dimension."""
    if len(sels) == 1:
        return sels[0]
    cat = getattr(type(sels[0]), "cat", None)
    if callable(cat):
        return cat(list(sels))
    import torch

    first = sels[0]
    fields = [f.name for f in dataclasses.fields(first)] if dataclasses.is_dataclass(first) else list(vars(first))
    values = {}
    for name in fields:
        vals = [getattr(s, name) for s in sels]
        if isinstance(vals[0], torch.Tensor) and vals[0].dim() >= 1:
            values[name] = torch.cat(vals, 0)
        else:
            values[name] = vals[0]
    return type(first)(**values)
