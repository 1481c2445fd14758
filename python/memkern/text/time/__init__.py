"""Time expressions: reading dates and spans in text, and the time prior that rescores memories by
when they happened.
"""

from __future__ import annotations

from .parse import (
    TimeSpan,
    TimeQuery,
    parse_time,
    resolve_now,
    time_prior_scores,
    rescore,
    mentioned_time,
    DAY,
    WEEK,
    TIME_ORDERS,
    DEFAULT_TIME_WEIGHT,
    DEFAULT_INTENT_WEIGHT,
    DEFAULT_WIDTH,
    DEFAULT_LAG,
)

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
