"""What a time expression reads as: :class:`TimeSpan` (one expression found) and :class:`TimeQuery`
(a question's range, order cue, event anchor and time intent, with its soft prior).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ...errors import bad_arg
from .calendar import check_time
from .lexicon import DAY, MAX_T

__all__ = ["TimeSpan", "TimeQuery", "build_query", "TIME_ORDERS", "DEFAULT_TIME_WEIGHT", "DEFAULT_INTENT_WEIGHT",
           "DEFAULT_WIDTH", "DEFAULT_LAG"]

#: The values of :attr:`TimeQuery.order`.
TIME_ORDERS = ("latest", "earliest")
#: Defaults of the soft time prior (:func:`time_prior_scores`), measured on the LoCoMo
#: development conversations (``bench/bench_time.py``).
DEFAULT_TIME_WEIGHT = 0.5
DEFAULT_INTENT_WEIGHT = 0.3
DEFAULT_WIDTH = 7 * DAY
DEFAULT_LAG = 7 * DAY


@dataclass(frozen=True)
class TimeSpan:
    """One time expression found in the text.

    Attributes
    ----------
    start, end : float
        Unix seconds, ``start <= t < end`` (``-inf`` / ``inf`` for an open side).
    text : str
        The matched text.
    kind : str
        ``"absolute"``, ``"relative"`` (to ``now``) or ``"anchored"`` (to a date in the text).
    pos : (int, int)
        Character offsets of the match in the text.
    """

    start: float
    end: float
    text: str
    kind: str
    pos: tuple[int, int] = (0, 0)


@dataclass(frozen=True)
class TimeQuery:
    """What :func:`parse_time` read in a question.

    Attributes
    ----------
    now : float
        The reference time (unix seconds).
    spans : tuple of TimeSpan
        Every time expression, in text order.
    start, end : float or None
        The range the question points at: the union of the spans (``None``: no span, or that
        side open).
    order : {"latest", "earliest"} or None
        An order cue ("recently", "the first time").
    anchor : str or None
        An event the time is relative to ("my birthday" in "the week after my birthday"), when
        it is not a date.
    anchor_offset : (float, float) or None
        Seconds from the anchor's event time: the range is ``[t + lo, t + hi)``.
    intent : bool
        The question asks for a time ("When did ...?", "How long ago ...?", "What year ...?").
    """

    now: float
    spans: tuple[TimeSpan, ...] = ()
    order: str | None = None
    anchor: str | None = None
    anchor_offset: tuple[float, float] | None = None
    intent: bool = False
    start: float | None = field(default=None)
    end: float | None = field(default=None)

    @property
    def found(self) -> bool:
        """Whether a range, an anchor or an order cue was read."""
        return bool(self.spans) or self.anchor is not None or self.order is not None

    @property
    def has_range(self) -> bool:
        """Whether the question names a time range (``start`` or ``end`` set)."""
        return self.start is not None or self.end is not None

    def resolve(self, anchor_time: float) -> "TimeQuery":
        """This query with its anchor placed at ``anchor_time`` (unix seconds): the anchor's
        range ``[anchor_time + lo, anchor_time + hi)`` becomes a span (``kind="anchored"``)."""
        if self.anchor_offset is None:
            return self
        t = check_time(anchor_time, "anchor_time")
        lo, hi = self.anchor_offset
        sp = TimeSpan(t + lo, t + hi, self.anchor or "", "anchored")
        return build_query(self.now, self.spans + (sp,), self.order, None, None, self.intent)

    def window(self, lag: float = 0.0) -> tuple[float | None, float | None] | None:
        """``(start, end + lag)``: the range widened by ``lag`` seconds after its end (the time a
        conversation takes to mention an event after it happened); ``None`` without a range."""
        if not self.has_range:
            return None
        return self.start, None if self.end is None else min(self.end + float(lag), MAX_T)

    def prior(self, times: Any, width: float = DEFAULT_WIDTH, lag: float = DEFAULT_LAG) -> np.ndarray:
        """Soft prior of records with event times ``times`` for this range.

        ``2 ** (-d / width)`` with ``d`` the distance (seconds) from a time to the window
        ``[start, end + lag)`` (0 inside it). Without a range: ones (NaN times: zeros).

        Parameters
        ----------
        times : float64 [n]
            Unix seconds (NaN: no time known; scored 0).
        width : float
            Half-distance: the prior halves every ``width`` seconds outside the window (> 0).
        lag : float
            Seconds added after the range's end (>= 0).

        Returns
        -------
        float32 [n] in [0, 1]
        """
        t = np.asarray(times, dtype=np.float64).reshape(-1)
        if not (float(width) > 0 and math.isfinite(float(width))):
            raise bad_arg("width", "seconds > 0", width)
        if not (float(lag) >= 0 and math.isfinite(float(lag))):
            raise bad_arg("lag", "seconds >= 0", lag)
        if not self.has_range:
            return np.where(np.isnan(t), 0.0, 1.0).astype(np.float32)
        lo = -np.inf if self.start is None else self.start
        hi = np.inf if self.end is None else self.end + float(lag)
        with np.errstate(invalid="ignore"):
            d = np.maximum(np.maximum(lo - t, t - hi), 0.0)
        out = np.exp2(-d / float(width))
        return np.where(np.isnan(t), 0.0, out).astype(np.float32)

    def search_kwargs(self, lag: float = 0.0) -> dict:
        """The hard-range :meth:`memkern.MemoryStore.search` keywords of this query:
        ``{"time_range": window(lag), "time_field": "event"}``, or ``{}`` without a range."""
        win = self.window(lag)
        return {} if win is None else {"time_range": win, "time_field": "event"}


def build_query(now: float, spans: Sequence[TimeSpan], order: str | None, anchor: str | None,
           offset: tuple[float, float] | None, intent: bool) -> TimeQuery:
    """The :class:`TimeQuery` of ``spans``: its range is their union, an end at the store's time bound
    (``MAX_T``) or beyond read as open (``None``)."""
    spans = tuple(spans)
    start = end = None
    if spans:
        lo = min(s.start for s in spans)
        hi = max(s.end for s in spans)
        start = None if lo <= -MAX_T else max(lo, -MAX_T)
        end = None if hi >= MAX_T else min(hi, MAX_T)
    return TimeQuery(now, spans, order, anchor, offset, intent, start, end)
