"""The time term of retrieval: the soft prior of candidates for a parsed question
(:func:`time_prior_scores`), adding it to first-stage scores (:func:`rescore`), and the time a
statement mentions (:func:`mentioned_time`).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...errors import bad_arg
from .lexicon import MAX_T
from .parse import parse_time
from .query import DEFAULT_INTENT_WEIGHT, DEFAULT_LAG, DEFAULT_TIME_WEIGHT, DEFAULT_WIDTH, TimeQuery

__all__ = ["time_prior_scores", "rescore", "mentioned_time"]


def time_prior_scores(tq: TimeQuery, event_times: Any, mentions: Any = None, *,
                      weight: float = DEFAULT_TIME_WEIGHT, intent_weight: float = DEFAULT_INTENT_WEIGHT,
                      width: float = DEFAULT_WIDTH, lag: float = DEFAULT_LAG) -> np.ndarray | None:
    """The time term of each candidate for query ``tq``, in units of the candidates' score spread.

    - a question with a range: ``weight * max(p(event), p(mention))``: ``p(event) =
      tq.prior(event_times, width, lag)``, the session date's prior, and ``p(mention) =
      2 ** (-d / width)`` with ``d`` the distance between the range a turn mentions ("last night",
      said on May 4: May 3) and the question's range;
    - a question asking for a time ("When did ...?") without a range: ``intent_weight`` for each
      candidate that mentions a time;
    - otherwise ``None`` (no term: order cues measured no gain, see ``bench/RESULTS.md``).

    Add it as ``scores + term * (scores.max() - scores.min())`` (:func:`rescore`), so the weights
    do not depend on the first stage's score scale.

    Parameters
    ----------
    tq : TimeQuery
        The question, parsed (an anchor resolved first with :meth:`TimeQuery.resolve`).
    event_times : float64 [n]
        The candidates' event times (unix seconds; NaN: none).
    mentions : float64 [n, 2], optional
        The ``[start, end)`` each candidate mentions (NaN rows: none), e.g. turn dicts'
        ``mentioned_time`` (:func:`mentioned_time`).
    weight, intent_weight : float
        Weights (>= 0) of the range prior and of the intent term.
    width, lag : float
        As in :meth:`TimeQuery.prior` (seconds).

    Returns
    -------
    float32 [n] or None
    """
    for name, v in (("weight", weight), ("intent_weight", intent_weight)):
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not (0 <= v < math.inf):
            raise bad_arg(name, "a finite float >= 0", v)
    t = np.asarray(event_times, dtype=np.float64).reshape(-1)
    m = None
    if mentions is not None:
        m = np.asarray(mentions, dtype=np.float64)
        if m.shape != (len(t), 2):
            raise bad_arg("mentions", f"float64 [{len(t)}, 2] (NaN rows: none)", tuple(m.shape))
    if tq.has_range:
        p = tq.prior(t, width=width, lag=lag).astype(np.float64)
        if m is not None:
            lo = -MAX_T if tq.start is None else tq.start
            hi = MAX_T if tq.end is None else tq.end
            with np.errstate(invalid="ignore"):
                d = np.maximum(np.maximum(lo - m[:, 1], m[:, 0] - hi), 0.0)
                pm = np.where(np.isnan(d), 0.0, np.exp2(-np.nan_to_num(d) / float(width)))
            p = np.maximum(p, pm)
        return (float(weight) * p).astype(np.float32)
    if tq.intent and m is not None:
        return (float(intent_weight) * (~np.isnan(m[:, 0]))).astype(np.float32)
    return None


def rescore(scores: Any, term: Any) -> np.ndarray:
    """``scores + term * (max(scores) - min(scores))`` (float32 ``[n]``; the spread of the finite
    scores; ``term`` ``None``: the scores unchanged)."""
    s = np.asarray(scores, dtype=np.float32).reshape(-1)
    if term is None or s.size == 0:
        return s
    fin = s[np.isfinite(s)]
    spread = float(fin.max() - fin.min()) if fin.size else 0.0
    return (s + np.asarray(term, np.float32).reshape(-1) * np.float32(spread)).astype(np.float32)


def mentioned_time(text: str, date: Any, *, tz: Any = None) -> list[float] | None:
    """``[start, end]`` (unix seconds) of the time a statement mentions, read relative to its
    ``date`` ("I went there yesterday" said on 2023-05-08: 2023-05-07), or ``None`` when it
    mentions none (open sides are clipped to the store's time bound)."""
    tq = parse_time(text, date, tz=tz)
    if not tq.has_range:
        return None
    return [-MAX_T if tq.start is None else tq.start, MAX_T if tq.end is None else tq.end]
