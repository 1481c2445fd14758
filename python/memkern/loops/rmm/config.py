"""RMM settings: one :class:`RMMConfig` instead of ~20 constructor arguments.

``RMM(store, config=RMMConfig(top_k=10), ...)``. Every field can also be given to :class:`RMM` as a
keyword argument (``RMM(store, top_k=10)``): a documented override of the same-named field of
``config`` (or of the defaults), not deprecated. The config is frozen; derive variants with
:func:`dataclasses.replace`. Values are checked when the config is built, with the messages the
constructor always gave.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ...errors import MemkernTypeError, bad_arg
from ...base.validate import check_choice, check_float, check_int
from ...text.template import DEFAULT_TEMPLATE, TurnTemplate
from .timeprior import TIME_PRIORS

__all__ = ["RMMConfig", "RETRIEVAL_MODES", "TURN_STAGES"]

#: The values of :attr:`RMMConfig.retrieval`.
RETRIEVAL_MODES = ("auto", "topic", "turn+topic")
#: The values of :attr:`RMMConfig.turn_stage`.
TURN_STAGES = ("hybrid", "dense", "lexical")


@dataclass(frozen=True)
class RMMConfig:
    """Settings of :class:`memkern.RMM` (everything but the store, namespace and components).

    Attributes
    ----------
    top_k, top_m : int
        Retrieved candidates (K, default 20) and memories shown to the model (M, default 5);
        ``1 <= top_m <= top_k``.
    batch_size : int
        Responses whose rewards are buffered before one ``reranker.update`` (default 4).
    seed : int
        Seeds generation, and the fresh reranker an RMM builds (``Reranker(seed=seed)``: its
        exploration draws and replay picks).
    answer_max_new_tokens, extract_max_new_tokens, decide_max_new_tokens : int
        Generation budgets (keep small for CPU models).
    candidates_k : int
        Existing memories compared with each new topic.
    persist : bool
        Save the reranker (and the pending reward buffer) under the store's directory.
    embedding_threshold : float
        Similarity to a topic centroid needed to join it, for the ``"sentences"`` extractor
        (the ``"embedding"`` extractor is TextTiling-like: :class:`memkern.ingest.extract.TextTilingExtractor`).
    coverage_threshold : float or None
        With the llm extractor, user statements whose similarity to every extracted summary is
        below this become extra topics (:func:`memkern.ingest.extract.complete_coverage`); None: off.
    decider_kwargs : dict or None
        Passed to :class:`~memkern.ingest.apply.LLMDecider` / :class:`~memkern.ingest.apply.EmbeddingDecider`.
    cite_fallback : float or None
        When the model's answer has no citation field and no ``[i]`` marker at all, credit the
        shown memories whose cosine similarity to the answer is ``>= cite_fallback`` (0.5;
        ``Response.citation_source == "similarity"``). ``None``: no citation, all rewards -1.
    save_every : int
        Save the reranker every this many updates (default 1: after each update). Saving writes
        the whole reranker state (~2.4 MB for RMM's fresh reranker at d = 384; a reranker with a
        replay ring, e.g. the stable preset's, ~10 MB), so larger values cut the amortised
        per-response cost; :meth:`RMM.close` always saves.
    explore : float
        Share of :meth:`memkern.RMM.respond` calls that show a sampled draw (Gumbel-top-M at the
        reranker's ``tau``) instead of the reranker's best memories; default ``0.0``: every call
        shows the best memories and the reranker learns from the citations of what it showed
        (see :mod:`memkern.loops.rmm.feedback`). ``True`` / ``False`` mean ``1.0`` / ``0.0`` (``1.0``
        is the paper's way: every call samples). The draws and the per-call coin come from the
        reranker's Philox stream (its ``seed`` and counter, saved with its state at every save: each
        update and :meth:`memkern.RMM.close`), so they advance with every exploring call, are
        reproducible from ``seed``, and a reopened RMM continues the stream. Exploring calls are marked ``Response.explored``.
        :meth:`memkern.RMM.retrieve` never explores.
    retrieval : {"auto", "topic", "turn+topic"}
        ``"auto"`` (default): ``"turn+topic"`` on a store with two-level memory
        (:class:`memkern.protocols.TurnStore`, e.g. :class:`memkern.MemoryStore`), else
        ``"topic"``. ``"topic"``: search topic records, show their raw turns. ``"turn+topic"``:
        two-level memory (see :mod:`memkern.loops.rmm`), the best measured retrieval
        (``bench/RESULTS.md``, retrieval section); needs a TurnStore.
    turn_stage : {"hybrid", "dense", "lexical"}
        Two-level memory, the first stage over the turn records: ``"hybrid"`` (default) fuses
        dense similarity and BM25 over the turn texts (weighted min-max fusion,
        ``lexical_weight``); ``"dense"``: similarity only; ``"lexical"``: BM25 only. All add the
        context terms below, in
        one store call (:meth:`memkern.MemoryStore.search`, *Two-level search*). Chosen on real
        conversations (LoCoMo development split; ``bench/RESULTS.md``, real-data retrieval).
    lexical_weight : float
        Weight of the BM25 list in the hybrid turn stage, in [0, 1] (default 0.5).
    neighbour_weight : float
        Weight of the best neighbouring turn's first-stage score (the previous / next turn of the
        same session): evidence often sits next to the turn the question matches (default 0.3).
    session_weight : float
        Weight of the best first-stage score among the session's retrieved turns (default 0.3).
    candidates : int
        Depth of each first-stage list (default 80).
    alpha : float
        Two-level memory: weight of the topic similarity in a turn's score (default 0.5), used
        when at least ``topic_min_turns`` turns are shown.
    topic_min_turns : int
        The topic term is added only when this many turns or more are shown: a turn budget
        ``retrieve(turns=N)`` with ``N >= topic_min_turns``, or :meth:`memkern.RMM.respond`
        (up to ``top_m * turns_per_memory`` turns). Measured on real conversations, the topic
        term helps multi-hop questions at 10-20 turns and costs precision at 5 (default 10).
    turns_per_memory : int
        Two-level memory: best retrieved turns shown under each memory.
    template : str
        The turn template (:mod:`memkern.text.template`): how a turn is embedded and shown, default
        ``"[{date}] {speaker}: {content}"``; missing fields are dropped.
    time_prior : {"soft", "hard", "off"}
        The time term (:mod:`memkern.loops.rmm.timeprior`): ``"soft"`` (default, the best measured on
        LoCoMo; ``bench/RESULTS.md``, time-aware retrieval) rescores the first stage's turns by
        the time the question names or asks for, ``"hard"`` keeps only turns in the named range,
        ``"off"`` neither.
    time_weight, time_intent_weight : float
        ``"soft"``: weights (>= 0, in units of the candidates' score spread) of the range prior
        (default 0.5) and of the bonus for turns mentioning a time under a "When ...?" question
        (default 0.3).
    supersede : bool
        Two-level memory: a new turn that contradicts an earlier turn of the same speaker ("I moved
        to Munich" after "I live in Berlin") invalidates the earlier turn's record, kept with its
        reason (:mod:`memkern.loops.rmm.supersede`). Default off (measured: ``bench/RESULTS.md``,
        conflicting facts).
    text_template : str or None
        Two-level memory: the template of each turn record's text, what lexical search matches
        (``None``, the default: ``template``).
    """

    top_k: int = 20
    top_m: int = 5
    batch_size: int = 4
    seed: int = 0
    answer_max_new_tokens: int = 64
    extract_max_new_tokens: int = 160
    decide_max_new_tokens: int = 64
    candidates_k: int = 5
    persist: bool = True
    embedding_threshold: float = 0.25
    coverage_threshold: float | None = 0.45
    decider_kwargs: dict | None = None
    cite_fallback: float | None = 0.5
    save_every: int = 1
    explore: float = 0.0
    retrieval: str = "auto"
    turn_stage: str = "hybrid"
    lexical_weight: float = 0.5
    neighbour_weight: float = 0.3
    session_weight: float = 0.3
    candidates: int = 80
    alpha: float = 0.5
    topic_min_turns: int = 10
    turns_per_memory: int = 3
    template: str = DEFAULT_TEMPLATE
    time_prior: str = "soft"
    time_weight: float = 0.5
    time_intent_weight: float = 0.3
    supersede: bool = False
    text_template: str | None = None

    def __post_init__(self) -> None:
        put = object.__setattr__  # frozen: checked values are stored normalised
        for name in ("top_k", "top_m", "batch_size", "candidates_k"):
            put(self, name, check_int(name, getattr(self, name), 1, expected="a positive int"))
        if self.top_m > self.top_k:
            raise bad_arg("top_m", f"<= top_k ({self.top_k})", self.top_m)
        check_choice("retrieval", self.retrieval, RETRIEVAL_MODES)
        check_choice("time_prior", self.time_prior, TIME_PRIORS)
        for name in ("time_weight", "time_intent_weight"):
            put(self, name, check_float(name, getattr(self, name), 0.0, finite=True))
        check_choice("turn_stage", self.turn_stage, TURN_STAGES)
        put(self, "alpha", check_float("alpha", self.alpha, -100.0, 100.0, finite=True))
        put(self, "lexical_weight", check_float("lexical_weight", self.lexical_weight, 0.0, 1.0, finite=True))
        for name in ("neighbour_weight", "session_weight"):
            put(self, name, check_float(name, getattr(self, name), -100.0, 100.0, finite=True))
        TurnTemplate(self.template)  # a bad pattern raises here, naming `template`
        if self.text_template is not None:
            try:
                TurnTemplate(self.text_template)
            except Exception as e:
                raise bad_arg("text_template", "None or a turn template (memkern.text.template)", self.text_template) from e
        for name in ("turns_per_memory", "save_every", "candidates", "topic_min_turns"):
            put(self, name, check_int(name, getattr(self, name), 1, expected="a positive int"))
        put(self, "seed", check_int("seed", self.seed, 0))
        for name in ("answer_max_new_tokens", "extract_max_new_tokens", "decide_max_new_tokens"):
            put(self, name, check_int(name, getattr(self, name), 1, expected="a positive int"))
        put(self, "persist", bool(self.persist))
        put(self, "explore", check_float("explore", float(self.explore) if isinstance(self.explore, bool) else self.explore,
                                         0.0, 1.0, expected="a share in [0, 1] (or a bool)"))
        put(self, "supersede", bool(self.supersede))
        put(self, "embedding_threshold", check_float("embedding_threshold", self.embedding_threshold, finite=True))
        for name in ("coverage_threshold", "cite_fallback"):
            put(self, name, check_float(name, getattr(self, name), finite=True, none_ok=True))
        put(self, "decider_kwargs", dict(self.decider_kwargs or {}))

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """Names of the settings (also accepted as :class:`memkern.RMM` keyword overrides)."""
        return tuple(f.name for f in dataclasses.fields(cls))

    def with_overrides(self, **overrides: Any) -> "RMMConfig":
        """A copy with ``overrides`` (field names) replaced; an unknown name raises
        :class:`memkern.MemkernTypeError` naming it."""
        unknown = sorted(set(overrides) - set(self.field_names()))
        if unknown:
            raise MemkernTypeError(f"unexpected keyword argument {unknown[0]!r}: expected an RMMConfig field "
                                   f"({', '.join(self.field_names())})")
        return dataclasses.replace(self, **overrides) if overrides else self
