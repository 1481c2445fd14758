"""The :class:`RMM` class: settings, components, and :meth:`RMM.respond`, which runs the stages.

The stages live in their own modules and are mixed into :class:`RMM`:
:mod:`~memkern.loops.rmm.reflect` (prospective reflection), :mod:`~memkern.loops.rmm.retrieve` (retrieval and
rerank), :mod:`~memkern.loops.rmm.feedback` (citations -> rewards, reward buffer, reranker
persistence). Bank inspection is :mod:`memkern.store.bank`.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ...store.bank import Bank
from ...errors import MemkernTypeError, bad_arg
from ...ingest.extract import EXTRACTORS, LLMExtractor, make_extractor, validate_turns
from ...base.paths import check_namespace
from ...store import DEFAULT_RECENCY_WEIGHT
from ...ingest import prompts
from ...protocols import ChatModel as ChatModelProtocol
from ...protocols import Decider, Embedder as EmbedderProtocol, Extractor, Store, TurnStore
from ...text.template import TurnTemplate
from ...ingest.apply import AppendDecider, EmbeddingDecider, LLMDecider
from ...base.validate import MAX_QUERY_CHARS, check_text
from .aio import AsyncStage, locked
from .config import RMMConfig
from .feedback import FeedbackStage, _parse_answer
from .reflect import ReflectStage
from .retrieve import RetrieveStage, _normalize
from .supersede import SupersedeStage
from .timeprior import TimeStage

#: Built-in decider names (``"add"``: :class:`memkern.ingest.apply.AppendDecider`).
DECIDERS = ("llm", "embedding", "add")

log = logging.getLogger("memkern")

__all__ = ["RMM", "Response"]


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
    explored : bool
        The memories shown were a sampled draw (a share ``RMMConfig.explore`` of the calls), not
        the reranker's best.
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
    selection: Any = field(default=None, repr=False, compare=False)
    explored: bool = False


def _component(name: str, value: Any, proto: type, names: tuple[str, ...] = ("llm", "embedding")) -> tuple[Any, str]:
    """``(object, "custom")`` for a user object meeting ``proto``, ``(None, value)`` for the
    built-in ``names``; a ``MemkernTypeError`` / ``MemkernValueError`` naming ``name`` otherwise."""
    if isinstance(value, proto):
        return value, "custom"
    expected = ", ".join(repr(n) for n in names) + f" or a memkern.protocols.{proto.__name__}"
    if not isinstance(value, str):
        raise bad_arg(name, expected, type(value).__name__, MemkernTypeError)
    if value not in names:
        raise bad_arg(name, expected, value)
    return None, value


def _setting(name: str) -> property:
    """A read-only attribute of :class:`RMM` showing ``self.config.<name>``."""
    return property(lambda self: getattr(self.config, name), doc=f"``config.{name}`` (:class:`RMMConfig`).")


class RMM(ReflectStage, RetrieveStage, TimeStage, SupersedeStage, FeedbackStage, AsyncStage):
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
        The bank's key; a valid name (:func:`memkern.base.paths.check_namespace`: 1-128 characters of
        ``A-Z a-z 0-9 _ - . @ :``, not starting with ``.``, no ``..``), checked before its reranker
        file paths are built.
    extractor : {"embedding", "llm", "window", "sentences"} or memkern.protocols.Extractor
        Topic extraction (see :mod:`memkern.ingest.extract`), by name or your own object:
        ``"embedding"`` (the default; no chat model) is TextTiling-like segmentation of each
        session into contiguous topics, from the same turn vectors the turn records get (each turn
        is embedded once); ``"window"`` fixed windows; ``"llm"`` topic summaries written by the chat
        model.
    decider : {"llm", "embedding", "add"} or memkern.protocols.Decider, optional
        Update decisions, by name or your own object. ``None``: ``"add"``
        (:class:`memkern.ingest.apply.AppendDecider`: every dialogue stretch kept) with the
        ``"embedding"`` / ``"window"`` extractors, ``"embedding"`` with ``"sentences"``,
        ``"llm"`` with the llm extractor or an extractor object.
    config : RMMConfig, optional
        The settings (``top_k``, ``top_m``, ``batch_size``, ``seed``, generation budgets,
        thresholds, ``retrieval``, ...; see :class:`RMMConfig`). ``None``: the defaults.
    **overrides
        Any :class:`RMMConfig` field by name (``RMM(store, top_k=10)``), replacing that field of
        ``config``: a supported shorthand, not deprecated. The effective settings are
        ``self.config``; each is also readable as ``self.<field>``. An unknown name raises
        :class:`memkern.MemkernTypeError`.
    """

    top_k = _setting("top_k")
    top_m = _setting("top_m")
    batch_size = _setting("batch_size")
    seed = _setting("seed")
    answer_max_new_tokens = _setting("answer_max_new_tokens")
    extract_max_new_tokens = _setting("extract_max_new_tokens")
    decide_max_new_tokens = _setting("decide_max_new_tokens")
    candidates_k = _setting("candidates_k")
    persist = _setting("persist")
    embedding_threshold = _setting("embedding_threshold")
    coverage_threshold = _setting("coverage_threshold")
    cite_fallback = _setting("cite_fallback")
    save_every = _setting("save_every")
    explore = _setting("explore")

    @property
    def retrieval(self) -> str:
        """The retrieval mode in effect: ``"topic"`` or ``"turn+topic"`` (``config.retrieval``,
        with ``"auto"`` resolved against the store)."""
        return self._retrieval
    alpha = _setting("alpha")
    turns_per_memory = _setting("turns_per_memory")

    def __init__(
        self,
        store: Store,
        chat_model: ChatModelProtocol | None = None,
        embedder: EmbedderProtocol | None = None,
        reranker: Any = None,
        namespace: str = "default",
        extractor: str | Extractor = "embedding",
        decider: str | Decider | None = None,
        *,
        config: RMMConfig | None = None,
        **overrides: Any,
    ):
        check_namespace(namespace)  # before any path is built from it (reranker files)
        if not isinstance(store, Store):
            raise bad_arg("store", "a memkern.protocols.Store (e.g. memkern.MemoryStore)", type(store).__name__,
                          MemkernTypeError)
        for name, v, proto in (("chat_model", chat_model, ChatModelProtocol), ("embedder", embedder, EmbedderProtocol)):
            if v is not None and not isinstance(v, proto):
                raise bad_arg(name, f"None or a memkern.protocols.{proto.__name__}", type(v).__name__, MemkernTypeError)
        custom_extractor, extractor = _component("extractor", extractor, Extractor, EXTRACTORS)
        if decider is None:
            # dialogue stretches (embedding / window extractors) are all kept; summaries are decided
            decider = {"embedding": "add", "window": "add", "sentences": "embedding"}.get(extractor, "llm")
        custom_decider, decider = _component("decider", decider, Decider, DECIDERS)
        if config is None:
            config = RMMConfig().with_overrides(**overrides)
        elif not isinstance(config, RMMConfig):
            raise bad_arg("config", "None or a memkern.loops.rmm.RMMConfig", type(config).__name__, MemkernTypeError)
        else:
            config = config.with_overrides(**overrides)
        self.config: RMMConfig = config
        self.turn_template = TurnTemplate(config.template)
        self.text_template = self.turn_template if config.text_template is None else TurnTemplate(config.text_template)
        self._retrieval = config.retrieval
        if self._retrieval == "auto":
            self._retrieval = "turn+topic" if isinstance(store, TurnStore) else "topic"
        if self._retrieval == "turn+topic" and not isinstance(store, TurnStore):
            raise bad_arg("store", "a store with two-level memory (memkern.MemoryStore) for retrieval='turn+topic'",
                          type(store).__name__, MemkernTypeError)
        self.store = store
        self.namespace = namespace
        self.extractor_kind = extractor
        self.decider_kind = decider
        self._chat_model = chat_model
        self._embedder = embedder
        self._reranker = reranker
        self._extractor: Extractor | None = custom_extractor
        self._decider: Decider | None = custom_decider
        self._hybrid: bool | None = None  # RetrieveStage.hybrid_turns, decided on first use
        self._buffer: list[tuple[Any, np.ndarray]] = []
        self.n_responses = 0
        self.n_updates = 0
        self.last_update_stats: dict[str, Any] = {}
        self._init_lock()
        if embedder is not None and embedder.dim != store.dim:
            raise bad_arg("embedder.dim", f"store.dim ({store.dim})", embedder.dim)
        self._load_buffer()

    # ------------------------------------------------------------------ lazily built components
    @property
    def chat_model(self) -> ChatModelProtocol:
        if self._chat_model is None:
            from ...models import ChatModel

            log.info("rmm: building the offline default chat model")
            self._chat_model = ChatModel()
        return self._chat_model

    @property
    def embedder(self) -> EmbedderProtocol:
        if self._embedder is None:
            from ...models import Embedder

            log.info("rmm: building the offline default embedder")
            self._embedder = Embedder()
            if self._embedder.dim != self.store.dim:
                raise bad_arg("embedder.dim", f"store.dim ({self.store.dim})", self._embedder.dim)
        return self._embedder

    @property
    def extractor(self) -> Extractor:
        if self._extractor is None:
            if self.extractor_kind == "llm":
                cov = self.coverage_threshold
                self._extractor = LLMExtractor(
                    self.chat_model, max_new_tokens=self.extract_max_new_tokens,
                    embed=None if cov is None else self._embed, coverage_threshold=0.45 if cov is None else cov,
                )
            elif self.extractor_kind == "sentences":
                self._extractor = make_extractor("sentences", embedder=self.embedder, threshold=self.embedding_threshold)
            elif self.extractor_kind == "window":
                self._extractor = make_extractor("window", template=self.turn_template)
            else:
                self._extractor = make_extractor("embedding", embedder=self.embedder, template=self.turn_template)
        return self._extractor

    @property
    def decider(self) -> Decider:
        if self._decider is None:
            if self.decider_kind == "llm":
                self._decider = LLMDecider(self.chat_model, max_new_tokens=self.decide_max_new_tokens,
                                           **self.config.decider_kwargs)
            elif self.decider_kind == "add":
                self._decider = AppendDecider(**self.config.decider_kwargs)
            else:
                kw = dict(self.config.decider_kwargs)
                kw.setdefault("embed", self._embed)
                self._decider = EmbeddingDecider(**kw)
        return self._decider

    def _embed(self, texts: list[str], kind: str = "passage") -> np.ndarray:
        emb = np.asarray(self.embedder.encode(list(texts), kind=kind), dtype=np.float32)
        if emb.ndim != 2 or emb.shape != (len(texts), self.store.dim):
            raise bad_arg("embedder.encode(...)", f"float32 [{len(texts)}, {self.store.dim}]", tuple(emb.shape))
        return emb

    # ------------------------------------------------------------------ retrospective reflection
    @locked
    def respond(self, query: str, session_turns: Sequence[dict] | None = None, *, filter: Any = None,
                time_range: Any = None, time_field: str = "event", recency: Any = None,
                recency_weight: Any = DEFAULT_RECENCY_WEIGHT, now: Any = None) -> Response:
        """Retrospective reflection: retrieve, rerank, answer with citations, learn from them.

        Parameters
        ----------
        query : str
        session_turns : list of dict, optional
            The current session so far (shown to the model after the memories).
        filter, time_range, time_field, recency, recency_weight, now : optional
            First-stage search filters, as in :meth:`retrieve`; the reranker chooses (and learns)
            among the records that pass. The question's time term (``config.time_prior``) reads
            relative times from ``now``, else from the latest date of ``session_turns``, else
            from the namespace's latest event time (:mod:`memkern.loops.rmm.timeprior`).

        Returns
        -------
        Response
        """
        check_text("query", query, max_chars=MAX_QUERY_CHARS, nonempty=True)
        if session_turns is not None:
            session_turns = validate_turns(session_turns, "session_turns")
        search_kw = self._first_stage(query, None,
                                      self._search_filters(filter, time_range, time_field, recency, recency_weight, now))
        timings: dict[str, float] = {}
        t0 = time.perf_counter()
        time_q = self._time_query(query, now, search_kw, session_turns)
        q = self._embed([query], kind="query")
        timings["embed"] = time.perf_counter() - t0
        ids, cand, m_sel, sel, best_turns = self._retrieve_and_rerank(q, timings, search_kw=search_kw, time_q=time_q)
        cand_sel = np.asarray(self.store.embeddings(m_sel), np.float32) if len(m_sel) else None
        t0 = time.perf_counter()
        memories, shown, _ = self._shown_memories(m_sel, best_turns)
        if self.two_level:
            msgs = prompts.answer_messages(query, memories, session_turns, max_turns_per_memory=self.turns_per_memory,
                                           selected_turns=True)
        else:
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
        rewards = self._record_rewards(sel, cites, len(m_sel))
        timings["update"] = time.perf_counter() - t0
        timings["total"] = sum(timings[k] for k in ("embed", "retrieve", "rerank", "generate", "update"))
        log.debug("rmm.respond: %d memories, cited %s; timings %s", len(m_sel), cites, {k: round(v * 1000, 2) for k, v in timings.items()})
        return Response(answer, [int(i) for i in m_sel], cites, rewards, timings, raw, parsed, citation_source, shown,
                        selection=sel, explored=sel is not None and not bool(getattr(sel, "greedy", True)))

    # ------------------------------------------------------------------ inspection
    @property
    def bank(self) -> Bank:
        """The namespace's :class:`memkern.store.bank.Bank` (inspect / stats / reset, no models)."""
        return Bank(self.store, self.namespace)

    def inspect(self, include_invalidated: bool = True) -> list[dict[str, Any]]:
        """The namespace's memory bank: one dict per record, ordered by id
        (:meth:`memkern.store.bank.Bank.inspect`).

        Keys: ``id``, ``summary``, ``version``, ``status``, ``turns`` (count), ``turn_records``
        (count of its turn records, two-level memory), ``sessions`` (session ids of its turns),
        ``meta``.
        """
        return self.bank.inspect(include_invalidated)

    def stats(self) -> dict[str, Any]:
        """Summary of the namespace: record counts by status, responses, reranker updates."""
        return {**self.bank.stats(), "responses": self.n_responses, "reranker_updates": self.n_updates,
                "pending_rewards": self.pending}
