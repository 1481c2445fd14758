"""Time expressions: reading dates and spans in text, and the time prior that rescores memories by
when they happened.

Modules: ``lexicon`` (units, words, the regular expressions), ``calendar`` (calendar arithmetic in a
zone, ``now`` and ``tz``), ``absolute`` (dates), ``relative`` (expressions relative to ``now``),
``parse`` (:func:`parse_time`: anchored expressions and the query), ``query`` (:class:`TimeSpan`,
:class:`TimeQuery`), ``prior`` (the time term of retrieval).
"""

from __future__ import annotations

from .calendar import resolve_now
from .lexicon import DAY, WEEK
from .parse import parse_time
from .prior import mentioned_time, rescore, time_prior_scores
from .query import (DEFAULT_INTENT_WEIGHT, DEFAULT_LAG, DEFAULT_TIME_WEIGHT, DEFAULT_WIDTH, TIME_ORDERS, TimeQuery,
                    TimeSpan)

__all__ = [
    "TimeSpan",
    "TimeQuery",
    "parse_time",
    "resolve_now",
    "time_prior_scores",
    "rescore",
    "mentioned_time",
    "DAY",
    "WEEK",
    "TIME_ORDERS",
    "DEFAULT_TIME_WEIGHT",
    "DEFAULT_INTENT_WEIGHT",
    "DEFAULT_WIDTH",
    "DEFAULT_LAG",
]
