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

import numpy as np

from ..errors import MemkernTypeError, bad_arg

__all__ = ["RMMConfig", "RETRIEVAL_MODES"]

#: The values of :attr:`RMMConfig.retrieval`.
RETRIEVAL_MODES = ("topic", "turn+topic")


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
        Seeds reranker sampling (``seed + response index``) and generation.
    answer_max_new_tokens, extract_max_new_tokens, decide_max_new_tokens : int
        Generation budgets (keep small for CPU models).
    candidates_k : int
        Existing memories compared with each new topic.
    persist : bool
        Save the reranker (and the pending reward buffer) under the store's directory.
    embedding_threshold : float
        Topic-boundary similarity of the embedding extractor.
    coverage_threshold : float or None
        With the llm extractor, user statements whose similarity to every extracted summary is
        below this become extra topics (:func:`memkern.extract.complete_coverage`); None: off.
    decider_kwargs : dict or None
        Passed to :class:`~memkern.update.LLMDecider` / :class:`~memkern.update.EmbeddingDecider`.
    cite_fallback : float or None
        When the model's answer has no citation field and no ``[i]`` marker at all, credit the
        shown memories whose cosine similarity to the answer is ``>= cite_fallback`` (0.5;
        ``Response.citation_source == "similarity"``). ``None``: no citation, all rewards -1.
    save_every : int
        Save the reranker every this many updates (default 1: after each update). Saving writes
        the whole reranker state, replay buffer included (~10 MB at the default capacity), so
        larger values cut the amortised per-response cost; :meth:`RMM.close` always saves.
    explore : bool
        ``True`` (the paper's way): the reranker *samples* the top-M (Gumbel-top-M at its ``tau``),
        which explores but may show weaker memories; ``False``: the reranker's top-M by score
        (no noise; rewards still train it).
    retrieval : {"topic", "turn+topic"}
        ``"topic"`` (default): search topic records, show their raw turns. ``"turn+topic"``:
        two-level memory (see :mod:`memkern.rmm`); needs a :class:`memkern.protocols.TurnStore`.
    alpha : float
        ``retrieval="turn+topic"``: weight of the topic similarity in a turn's score.
    turns_per_memory : int
        ``retrieval="turn+topic"``: best retrieved turns shown under each memory.
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
    explore: bool = True
    retrieval: str = "topic"
    alpha: float = 1.0
    turns_per_memory: int = 3

    def __post_init__(self) -> None:
        for name in ("top_k", "top_m", "batch_size", "candidates_k"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise bad_arg(name, "a positive int", v)
        if self.top_m > self.top_k:
            raise bad_arg("top_m", f"<= top_k ({self.top_k})", self.top_m)
        if self.retrieval not in RETRIEVAL_MODES:
            raise bad_arg("retrieval", "'topic' or 'turn+topic'", self.retrieval)
        a = self.alpha
        if isinstance(a, bool) or not isinstance(a, (int, float, np.floating)) or not np.isfinite(a):
            raise bad_arg("alpha", "a finite float", a)
        for name in ("turns_per_memory", "save_every"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise bad_arg(name, "a positive int", v)
        # Normalised types, as the constructor always stored them.
        put = object.__setattr__
        put(self, "alpha", float(a))
        put(self, "seed", int(self.seed))
        for name in ("answer_max_new_tokens", "extract_max_new_tokens", "decide_max_new_tokens"):
            put(self, name, int(getattr(self, name)))
        put(self, "persist", bool(self.persist))
        put(self, "explore", bool(self.explore))
        put(self, "embedding_threshold", float(self.embedding_threshold))
        for name in ("coverage_threshold", "cite_fallback"):
            v = getattr(self, name)
            put(self, name, None if v is None else float(v))
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
