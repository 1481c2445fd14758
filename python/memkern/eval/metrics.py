"""Retrieval metrics over *evidence turns*, for units of any size.

A retrieved unit (a turn, a session, a topic, a chunk) is a set of turn ids; it "recalls" the
evidence turns it contains. All functions take the ranked units of one question and the set of
evidence turn ids of that question, and return a float in [0, 1].

- :func:`recall_at_k`: fraction of evidence turns contained in the top ``k`` units.
- :func:`ndcg_at_k`: gain of the unit at rank ``i`` (1-based) = number of evidence turns it
  contains that no higher-ranked unit contained, discounted by ``1 / log2(i + 1)``. The ideal
  DCG puts the units with the most evidence turns first, with their gains capped so that the
  total never exceeds the number of evidence turns. For a partition (turns, sessions, topics,
  chunks) this is the exact optimum; for overlapping units (a mix of turns and sessions) it is an
  upper bound of the achievable DCG, so NDCG stays in [0, 1].
- :func:`recall_at_budget`: units are taken in rank order until ``budget`` distinct turns are
  covered; the unit that would overshoot contributes only its first remaining turns (in the
  unit's own turn order), so every method sees exactly ``budget`` turns (fewer only if the ranked
  list runs out). This is the fair comparison between unit sizes.
"""
from __future__ import annotations

import math
from typing import Iterable, Sequence

from ..errors import bad_arg

__all__ = ["recall_at_k", "ndcg_at_k", "recall_at_budget", "mean_std", "bootstrap_ci"]

Unit = Sequence[str]


def _check(k: int, name: str = "k") -> int:
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise bad_arg(name, "an int >= 1", k)
    return k


def recall_at_k(ranked_units: Sequence[Unit], evidence: Iterable[str], k: int) -> float:
    """Fraction of ``evidence`` turn ids contained in the first ``k`` units (``nan`` if no evidence)."""
    _check(k)
    ev = set(evidence)
    if not ev:
        return math.nan
    got: set[str] = set()
    for u in ranked_units[:k]:
        got.update(t for t in u if t in ev)
    return len(got) / len(ev)


def ndcg_at_k(ranked_units: Sequence[Unit], evidence: Iterable[str], k: int,
              all_units: Sequence[Unit] | None = None) -> float:
    """NDCG@k with novelty gains (see module docstring); ``nan`` if no evidence.

    ``all_units``: every unit the retriever could have returned (for the ideal ranking);
    defaults to ``ranked_units`` (correct when the ranking is over the whole corpus).
    """
    _check(k)
    ev = set(evidence)
    if not ev:
        return math.nan
    seen: set[str] = set()
    dcg = 0.0
    for i, u in enumerate(ranked_units[:k]):
        new = {t for t in u if t in ev} - seen
        seen |= new
        dcg += len(new) / math.log2(i + 2)
    pool = ranked_units if all_units is None else all_units
    counts = sorted((sum(1 for t in set(u) if t in ev) for u in pool), reverse=True)
    left = len(ev)
    idcg = 0.0
    for i, c in enumerate(counts[:k]):
        g = min(c, left)
        if g <= 0:
            break
        idcg += g / math.log2(i + 2)
        left -= g
    return dcg / idcg if idcg > 0 else 0.0


def recall_at_budget(ranked_units: Sequence[Unit], evidence: Iterable[str], budget: int) -> float:
    """Recall of evidence turns within the first ``budget`` distinct turns of the ranked units."""
    _check(budget, "budget")
    ev = set(evidence)
    if not ev:
        return math.nan
    taken: set[str] = set()
    for u in ranked_units:
        for t in u:
            if len(taken) >= budget:
                break
            taken.add(t)
        if len(taken) >= budget:
            break
    return len(taken & ev) / len(ev)


def mean_std(xs: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value) ignoring NaNs; (nan, nan) if empty."""
    v = [float(x) for x in xs if not math.isnan(float(x))]
    if not v:
        return math.nan, math.nan
    m = sum(v) / len(v)
    if len(v) < 2:
        return m, 0.0
    return m, math.sqrt(sum((x - m) ** 2 for x in v) / (len(v) - 1))


def bootstrap_ci(values: Sequence[float], reps: int = 2000, seed: int = 0, level: float = 0.95
                 ) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of per-question ``values`` (NaN entries dropped).

    ``reps`` resamples of the questions with replacement, drawn from ``numpy.random.default_rng(seed)``
    (the same ``seed`` and length draw the same resamples, so intervals of different rows, and of
    their per-question differences, come from the same resampled question sets). Returns
    ``(lo, hi)``, the ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles; ``(nan, nan)`` for no value.
    """
    import numpy as np

    _check(reps, "reps")
    if not 0.0 < float(level) < 1.0:
        raise bad_arg("level", "a float in (0, 1)", level)
    v = np.asarray([float(x) for x in values], dtype=np.float64)
    v = v[~np.isnan(v)]
    if v.size == 0:
        return math.nan, math.nan
    idx = np.random.default_rng(seed).integers(0, v.size, size=(reps, v.size))
    means = v[idx].mean(axis=1)
    lo, hi = np.quantile(means, [(1.0 - level) / 2.0, (1.0 + level) / 2.0])
    return float(lo), float(hi)
