"""Time expressions in a question, without a model: an event-time range and a soft prior.

:func:`parse_time` reads the time a question points at ("last week", "yesterday", "in May 2023",
"in 2022", "the week before August 3, 2023", "two days after my birthday", "recently", "the first
time"...) relative to a reference time ``now`` and returns a :class:`TimeQuery`: the range of
event times ``[start, end)`` in unix seconds, a soft prior on a record's ``event_time`` around
that range (:meth:`TimeQuery.prior`), an order cue (``"latest"`` / ``"earliest"``), an event
anchor ("my birthday") with its offset, and whether the question asks *for* a time ("When
did ...?").

Calendar arithmetic runs in ``tz`` (default UTC, the zone :func:`memkern.text.template.event_seconds`
reads naive dates in): "yesterday" is the calendar day before ``now``'s day there. Weeks start on
Monday; a weekend is Saturday 00:00 to Monday 00:00; seasons are meteorological (northern
hemisphere: spring = March-May, summer = June-August, autumn = September-November, winter =
December-February, named by the year of its December). A month or weekday without a year is
its latest occurrence that has begun by ``now`` ("in June" asked in October 2023: June 2023;
"next June": June 2024).

What is read (case-insensitive; English):

==================  ===========================================================================
absolute            ``2023-05-03``, ``3 May 2023``, ``May 3rd, 2023``, ``May 3``, ``May 2023``,
                    ``April.2023``, ``in 2022``, ``the summer of 2022``, ``the 1990s``, ``early /
                    mid / late`` + month / year, ``Christmas 2022``, ``New Year's Eve``
relative            ``today``, ``tonight``, ``this morning``, ``yesterday``, ``last night``, ``the
                    day before yesterday``, ``tomorrow``; ``last / this / next / past / coming``
                    + ``week / weekend / month / year / summer / Friday / June``; ``N days / weeks
                    / months / years ago`` (``a few``, ``a couple of``, ``several``, words or
                    digits); ``in the past N days``, ``over the last month``; ``earlier / later
                    this week / month / year``; ``on Friday``
anchored            ``N units before / after <date>``, ``the week / weekend / day before / after
                    <date>``, ``since / after / before / until <date>``, ``between <date> and
                    <date>``; with an event instead of a date (``two days before the race``,
                    ``after my birthday``): :attr:`TimeQuery.anchor` and
                    :attr:`TimeQuery.anchor_offset` (resolve with :meth:`TimeQuery.resolve`)
order               ``recently``, ``lately``, ``latest``, ``most recent``, ``last time``,
                    ``currently``, ``these days``, ``nowadays``: ``"latest"``; ``the first
                    time``, ``first ever``, ``earliest``, ``originally``, ``initially``, ``at
                    first``: ``"earliest"``
==================  ===========================================================================

Parsing is a fixed set of compiled regular expressions run once over the text (about 0.1 ms per
question on one core); :func:`parse_time` never raises on text it cannot read: it returns a
:class:`TimeQuery` whose ``found`` is ``False``.
"""
from __future__ import annotations

import datetime as _dt
import math
import re
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ...errors import MemkernTypeError, bad_arg

__all__ = ["TimeSpan", "TimeQuery", "parse_time", "resolve_now", "time_prior_scores", "rescore", "mentioned_time",
           "DAY", "WEEK", "TIME_ORDERS", "DEFAULT_TIME_WEIGHT", "DEFAULT_INTENT_WEIGHT", "DEFAULT_WIDTH", "DEFAULT_LAG"]

DAY = 86400.0
WEEK = 7 * DAY
#: The values of :attr:`TimeQuery.order`.
TIME_ORDERS = ("latest", "earliest")
_MAX_T = 1e12  # the store's MAX_TIME (|unix seconds|)
#: Defaults of the soft time prior (:func:`time_prior_scores`), measured on the LoCoMo
#: development conversations (``bench/bench_time.py``).
DEFAULT_TIME_WEIGHT = 0.5
DEFAULT_INTENT_WEIGHT = 0.3
DEFAULT_WIDTH = 7 * DAY
DEFAULT_LAG = 7 * DAY

_MONTHS = {m: i + 1 for i, m in enumerate(
    ("january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
     "november", "december"))}
_MONTHS |= {m[:3]: i for m, i in list(_MONTHS.items())} | {"sept": 9}
_WEEKDAYS = {d: i for i, d in enumerate(("monday", "tuesday", "wednesday", "thursday", "friday", "saturday",
                                         "sunday"))}
_WEEKDAYS |= {d[:3]: i for d, i in list(_WEEKDAYS.items())}
_NUM_WORDS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
              "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "fifteen": 15, "twenty": 20,
              "thirty": 30, "a couple of": 2, "a couple": 2, "couple of": 2, "a few": 3, "few": 3, "several": 4,
              "a pair of": 2}
_SEASONS = {"spring": 3, "summer": 6, "fall": 9, "autumn": 9, "winter": 12}

_MON = r"(?P<{n}>jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|sept?(?:ember)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)"
_WD = r"(?P<wd>monday|tuesday|wednesday|thursday|friday|saturday|sunday)"
_NUM = r"(?P<num>\d{1,3}|a couple of|a couple|couple of|a pair of|a few|few|several|an?|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|fifteen|twenty|thirty)"
_UNIT = r"(?P<unit>day|night|week|weekend|month|year|decade)s?"
_ORD = r"(?:st|nd|rd|th)?"
_YEAR = r"(?P<{n}>(?:1[89]|2[01])\d\d)"


def _rx(p: str) -> re.Pattern:
    return re.compile(p, re.I)


# Dates (most specific first). Named groups: y/m/d; each pattern yields one calendar unit.
_DATE_PATTERNS: list[tuple[str, re.Pattern]] = [
    ("day", _rx(r"\b" + _YEAR.format(n="y") + r"(?P<sep>[-/])(?P<m>\d{1,2})(?P=sep)(?P<d>\d{1,2})\b")),
    ("day", _rx(r"\b(?:the\s+)?(?P<d>\d{1,2})" + _ORD + r"\s+(?:of\s+)?" + _MON.format(n="m") + r"\b\.?,?\s*"
                + _YEAR.format(n="y") + r"\b")),
    ("day", _rx(r"\b" + _MON.format(n="m") + r"\.?\s+(?:the\s+)?(?P<d>\d{1,2})" + _ORD + r"\b,?\s*"
                + _YEAR.format(n="y") + r"\b")),
    ("day", _rx(r"\b(?:the\s+)?(?P<d>\d{1,2})" + _ORD + r"\s+(?:of\s+)?" + _MON.format(n="m") + r"\b(?!\.?,?\s*\d)")),
    ("day", _rx(r"\b" + _MON.format(n="m") + r"\.?\s+(?:the\s+)?(?P<d>\d{1,2})" + _ORD + r"\b(?![,.]?\s*\d|:)")),
    ("month", _rx(r"(?:\b(?P<q>early|mid|late|end of|the end of|beginning of|the beginning of|the start of|start of)"
                  r"[\s-]+(?:in\s+)?)?\b" + _MON.format(n="m") + r"\b[.,]?\s*(?:of\s+)?" + _YEAR.format(n="y") + r"\b")),
    ("season", _rx(r"(?:\b(?P<q>early|mid|late)[\s-]+)?(?:\bthe\s+)?\b(?P<s>spring|summer|fall|autumn|winter)\s+(?:of\s+)?"
                   + _YEAR.format(n="y") + r"\b")),
    ("decade", _rx(r"\b(?:the\s+)?(?P<c>19|20)(?P<dd>\d)0'?s\b|\bthe\s+'?(?P<dd2>\d)0'?s\b")),
    ("year", _rx(r"(?:\b(?P<q>early|mid|late|end of|the end of|beginning of|the beginning of|the start of|start of)"
                 r"[\s-]+(?:in\s+)?)?(?<![\d$.,-])\b" + _YEAR.format(n="y") + r"\b(?!\s*(?:people|dollars|euros|pounds|miles|km|kilometers|meters|feet|steps|"
                 r"words|pages|calories|times|units|items|pieces|members|followers|hours|minutes)\b)(?!-\d)")),
]
_HOLIDAY = _rx(r"\b(?P<rel>last|this|next)?\s*(?P<h>christmas eve|christmas|new year'?s eve|new year'?s day|new year'?s|"
               r"valentine'?s day|halloween|independence day|the fourth of july|july 4th)(?:\s+(?:of\s+)?"
               + _YEAR.format(n="y") + r")?\b")
_HOLIDAYS = {"christmas eve": (12, 24, 1), "christmas": (12, 24, 3), "new year's eve": (12, 31, 1),
             "new years eve": (12, 31, 1), "new year's day": (1, 1, 1), "new years day": (1, 1, 1),
             "new year's": (12, 31, 2), "new years": (12, 31, 2), "valentine's day": (2, 14, 1),
             "valentines day": (2, 14, 1), "halloween": (10, 31, 1), "independence day": (7, 4, 1),
             "the fourth of july": (7, 4, 1), "july 4th": (7, 4, 1)}
# A month / season / weekday without a year (the latest occurrence begun by now, or next / last).
_MONTH_ALONE = _rx(r"\b(?P<rel>in|during|of|since|by|until|till|before|after|from|between|early|late|mid|this|last|next|"
                   r"past|coming|previous|early in|late in|the end of|end of|the beginning of|beginning of)[\s-]+"
                   + _MON.format(n="m") + r"\b(?!\s*\d)")
_MONTH_BARE = _rx(r"\b(?P<m>january|february|april|june|july|august|september|october|november|december)\b(?!\s*\d)")
_SEASON_ALONE = _rx(r"\b(?:(?P<rel>last|this|next|past|coming|previous)\s+|(?:in|during|over|of)\s+(?:the\s+)?)"
                    r"(?:(?P<q>early|mid|late)[\s-]+)?(?P<s>spring|summer|fall|autumn|winter)\b(?!\s+(?:of\s+)?\d)")
_WEEKDAY = _rx(r"\b(?P<rel>last|this|next|past|previous|coming|on)\s+" + _WD + r"\b")
_REL_UNIT = _rx(r"\b(?P<rel>last|this|next|past|previous|coming|current)\s+(?P<unit>week|weekend|month|year|decade)\b")
_AGO = _rx(r"\b" + _NUM + r"\s+" + _UNIT + r"\s+(?:ago|back|earlier)\b")
_PAST_N = _rx(r"\b(?:in|over|during|within|for)\s+the\s+(?:past|last|previous)\s+(?:" + _NUM + r"\s+)?" + _UNIT + r"\b")
_NEXT_N = _rx(r"\b(?:in|over|during|within)\s+the\s+(?:next|coming)\s+(?:" + _NUM + r"\s+)?" + _UNIT + r"\b")
_IN_N = _rx(r"\bin\s+" + _NUM + r"\s+" + _UNIT + r"\b(?!\s+(?:ago|before|after|earlier|later))")
_EARLIER = _rx(r"\b(?P<w>earlier|later)\s+(?:this|in the)\s+(?P<unit>week|month|year)\b")
_DAY_WORDS = _rx(r"\b(?P<w>the day before yesterday|the day after tomorrow|yesterday morning|yesterday afternoon|"
                 r"yesterday evening|yesterday|last night|last evening|the other day|today|tonight|this morning|"
                 r"this afternoon|this evening|tomorrow|a while ago|a while back|some time ago|"
                 r"a long time ago|(?<!how )long ago|years ago)\b")
_ORDER_LATEST = _rx(r"\b(recently|lately|most recent(?:ly)?|latest|last time|the last time|currently|current|"
                    r"these days|nowadays|right now|now|anymore|any more|newest)\b")
_ORDER_EARLIEST = _rx(r"\b(the first time|for the first time|first time|first ever|earliest|originally|initially|"
                      r"at first|in the beginning|at the beginning|first met|oldest|used to)\b")
_INTENT = _rx(r"^\W*(?:when\b|what (?:year|month|day|date|time|week|season)\b|which (?:year|month|day|date|week)\b|"
              r"how long ago\b|since when\b|on what (?:day|date)\b|in what (?:year|month)\b|at what age\b|"
              r"how many (?:days|weeks|months|years) (?:ago|passed|after|before|between|since)|"
              r"how long (?:has|have|had|did|was|were|is|are|after|before|between)\b)")
# Anchors: "<duration> before / after X", "the week before X", "before / after / since / until X".
_SHIFT = _rx(r"\b(?:(?P<num>\d{1,3}|a couple of|a couple|couple of|a few|few|several|an?|one|two|three|four|five|six|"
             r"seven|eight|nine|ten|eleven|twelve|fifteen|twenty|thirty)\s+(?P<unit>day|night|week|weekend|month|year)s?|"
             r"(?:the\s+|last\s+|that\s+)?(?P<unit1>day|night|week|weekend|month|year)|"
             r"(?:the\s+|last\s+|that\s+)(?P<wd1>monday|tuesday|wednesday|thursday|friday|saturday|sunday))\s+"
             r"(?P<dir>before|after|prior to|following|preceding|later than|earlier than)\s+")
_BARE_DIR = _rx(r"\b(?P<dir>since|after|before|until|till|prior to|following|during|by)\s+")
_BETWEEN = _rx(r"\bbetween\s+")
_ANCHOR_END = re.compile(r"[?!.;,]|\s(?:and|but|when|while|where|because|so|then|with|at|in|on|to|for)\s", re.I)
_ANCHOR_STOP = _rx(r"^(?:that|then|this|it|which|what|he|she|they|we|you|i|him|her|them|us|me|school|work|"
                   r"dinner|lunch|breakfast|bed|all|everything|anything|something)$")


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
        t = _check_time(anchor_time, "anchor_time")
        lo, hi = self.anchor_offset
        sp = TimeSpan(t + lo, t + hi, self.anchor or "", "anchored")
        return _build(self.now, self.spans + (sp,), self.order, None, None, self.intent)

    def window(self, lag: float = 0.0) -> tuple[float | None, float | None] | None:
        """``(start, end + lag)``: the range widened by ``lag`` seconds after its end (the time a
        conversation takes to mention an event after it happened); ``None`` without a range."""
        if not self.has_range:
            return None
        return self.start, None if self.end is None else min(self.end + float(lag), _MAX_T)

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
            lo = -_MAX_T if tq.start is None else tq.start
            hi = _MAX_T if tq.end is None else tq.end
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
    return [-_MAX_T if tq.start is None else tq.start, _MAX_T if tq.end is None else tq.end]


# --------------------------------------------------------------------------------------------- calendar


class _Cal:
    """Calendar arithmetic in one time zone (aware datetimes)."""

    def __init__(self, now: float, tz: _dt.tzinfo):
        self.tz = tz
        self.now = now
        self.dt = _dt.datetime.fromtimestamp(now, tz)

    def ts(self, y: int, m: int = 1, d: int = 1) -> float:
        """Unix seconds of local midnight starting day y-m-d (day overflow rolls over)."""
        y, m = y + (m - 1) // 12, (m - 1) % 12 + 1
        base = _dt.datetime(y, m, 1, tzinfo=self.tz) + _dt.timedelta(days=d - 1)
        return base.timestamp()

    def day(self, y: int, m: int, d: int) -> tuple[float, float]:
        return self.ts(y, m, d), self.ts(y, m, d + 1)

    def month(self, y: int, m: int, n: int = 1) -> tuple[float, float]:
        return self.ts(y, m), self.ts(y, m + n)

    def year(self, y: int, n: int = 1) -> tuple[float, float]:
        return self.ts(y), self.ts(y + n)

    def today(self) -> tuple[int, int, int]:
        return self.dt.year, self.dt.month, self.dt.day

    def shift_days(self, n: int) -> tuple[float, float]:
        y, m, d = self.today()
        return self.day(y, m, d + n)

    def week_start(self, weeks: int = 0) -> float:
        y, m, d = self.today()
        return self.ts(y, m, d - self.dt.weekday() + 7 * weeks)

    def latest_month(self, m: int, rel: str | None) -> int:
        """Year of month ``m``: its latest occurrence begun by now; ``next``: the first after now."""
        y = self.dt.year
        if rel in ("next", "coming"):
            return y if m > self.dt.month else y + 1
        if rel in ("last", "past", "previous"):
            return y if m < self.dt.month else y - 1
        return y if m <= self.dt.month else y - 1


def _valid_day(y: int, m: int, d: int) -> bool:
    try:
        _dt.date(y, m, d)
        return True
    except ValueError:
        return False


def _num(s: str | None) -> int:
    if s is None:
        return 1
    s = " ".join(s.lower().split())
    return int(s) if s.isdigit() else _NUM_WORDS.get(s, 1)


def _fuzzy(s: str | None) -> bool:
    return s is not None and " ".join(s.lower().split()) in ("a few", "few", "several", "a couple of", "a couple",
                                                            "couple of")


_UNIT_S = {"day": DAY, "night": DAY, "week": WEEK, "weekend": WEEK, "month": 30.44 * DAY, "year": 365.25 * DAY,
           "decade": 3652.5 * DAY}


def _qualify(lo: float, hi: float, q: str | None) -> tuple[float, float]:
    """``early`` / ``mid`` / ``late`` (``beginning of`` / ``end of``): a third of the range."""
    if not q:
        return lo, hi
    q = q.lower().replace("the ", "").strip()
    third = (hi - lo) / 3
    if q in ("early", "beginning of", "start of"):
        return lo, lo + third
    if q == "mid":
        return lo + third, hi - third
    if q in ("late", "end of"):
        return hi - third, hi
    return lo, hi


def _season(cal: _Cal, s: str, y: int) -> tuple[float, float]:
    m = _SEASONS[s.lower()]
    return cal.month(y, m, 3)


# --------------------------------------------------------------------------------------------- parsing


def resolve_now(now: Any, name: str = "now") -> float:
    """``now`` as unix seconds: unix seconds, a datetime (naive: UTC) / date, or a date string
    :func:`memkern.text.template.event_seconds` reads; ``None`` is the wall clock."""
    if now is None:
        import time

        return time.time()
    from ..template import event_seconds

    return float(event_seconds(now, name))


def _check_time(t: Any, name: str) -> float:
    if isinstance(t, bool) or not isinstance(t, (int, float, np.integer, np.floating)) or not abs(float(t)) <= _MAX_T:
        raise bad_arg(name, f"unix seconds with |t| <= {_MAX_T:g}", t)
    return float(t)


def _tzinfo(tz: Any) -> _dt.tzinfo:
    if tz is None:
        return _dt.timezone.utc
    if isinstance(tz, _dt.tzinfo):
        return tz
    if isinstance(tz, str):
        m = re.fullmatch(r"\s*(?:UTC|GMT)?\s*([+-])(\d{1,2}):?(\d{2})?\s*", tz, re.I)
        if m:
            sign = 1 if m.group(1) == "+" else -1
            h, mi = int(m.group(2)), int(m.group(3) or 0)
            if h <= 23 and mi <= 59:
                return _dt.timezone(sign * _dt.timedelta(hours=h, minutes=mi))
        elif tz.strip().upper() in ("UTC", "GMT", "Z"):
            return _dt.timezone.utc
        else:
            try:
                from zoneinfo import ZoneInfo

                return ZoneInfo(tz.strip())
            except Exception:  # unknown zone name / no tz database
                pass
        raise bad_arg("tz", "a datetime.tzinfo, an offset such as '+02:00' or a zone name", tz)
    raise bad_arg("tz", "a datetime.tzinfo, an offset such as '+02:00', a zone name or None", type(tz).__name__,
                  MemkernTypeError)


_GAP = re.compile(r"\s*(?:(?:the|on|of|in)\s+)?", re.I)


def _date_at(spans: Sequence[TimeSpan], text: str, pos: int) -> TimeSpan | None:
    """The span that starts at ``text[pos:]`` (after spaces and a "the" / "on" / "of" / "in")."""
    gap = _GAP.match(text, pos).end()
    for sp in spans:
        if pos <= sp.pos[0] <= gap:
            return sp
    return None


def _scan(cal: _Cal, text: str) -> list[TimeSpan]:
    """Every date / relative expression of ``text`` (no anchors), in text order, non-overlapping."""
    taken = np.zeros(len(text) + 1, dtype=bool)
    out: list[TimeSpan] = []

    def put(m: re.Match, lo: float, hi: float, kind: str, group: int | str = 0) -> None:
        a, b = m.span(group)
        if taken[a:b].any() or not (hi > lo):
            return
        taken[a:b] = True
        out.append(TimeSpan(float(lo), float(hi), text[a:b], kind, (a, b)))

    for m in _HOLIDAY.finditer(text):
        mo, d, n = _HOLIDAYS[m.group("h").lower().replace("\u2019", "'")]
        if m.group("y"):
            y = int(m.group("y"))
        else:
            y = cal.dt.year if cal.ts(cal.dt.year, mo, d) <= cal.now else cal.dt.year - 1
            if (m.group("rel") or "").lower() == "next":
                y = cal.dt.year if cal.ts(cal.dt.year, mo, d) > cal.now else cal.dt.year + 1
            elif (m.group("rel") or "").lower() == "last" and cal.ts(y, mo, d + n) > cal.now:
                y -= 1
        lo = cal.ts(y, mo, d)
        put(m, lo, lo + n * DAY, "absolute" if m.group("y") else "relative")
    for unit, rx in _DATE_PATTERNS:
        for m in rx.finditer(text):
            g = m.groupdict()
            if unit == "day":
                mon = g["m"]
                mo = int(mon) if mon.isdigit() else _MONTHS[mon.lower()[:3]]
                d = int(g["d"])
                y = int(g["y"]) if g.get("y") else None
                if y is None:
                    y = cal.dt.year
                    if not _valid_day(y, mo, d) or cal.ts(y, mo, d) > cal.now:
                        y -= 1
                if not (1 <= mo <= 12 and _valid_day(y, mo, d)):
                    continue
                put(m, *cal.day(y, mo, d), "absolute")
            elif unit == "month":
                mo = _MONTHS[g["m"].lower()[:3]]
                lo, hi = _qualify(*cal.month(int(g["y"]), mo), g.get("q"))
                put(m, lo, hi, "absolute")
            elif unit == "season":
                lo, hi = _qualify(*_season(cal, g["s"], int(g["y"])), g.get("q"))
                put(m, lo, hi, "absolute")
            elif unit == "decade":
                c, dd = g.get("c"), int(g.get("dd") or g.get("dd2"))
                century = int(c) * 100 if c else (1900 if dd >= 3 else 2000)
                y = century + 10 * dd
                put(m, *cal.year(y, 10), "absolute")
            else:
                lo, hi = _qualify(*cal.year(int(g["y"])), g.get("q"))
                put(m, lo, hi, "absolute")
    for m in _EARLIER.finditer(text):
        unit = m.group("unit").lower()
        y, mo, _ = cal.today()
        lo, hi = {"week": (cal.week_start(0), cal.week_start(1)), "month": cal.month(y, mo), "year": cal.year(y)}[unit]
        put(m, lo, cal.now, "relative") if m.group("w").lower() == "earlier" else put(m, cal.now, hi, "relative")
    for m in _PAST_N.finditer(text):
        n = _num(m.group("num")) if m.group("num") else 1
        n = max(n, 5) if _fuzzy(m.group("num")) else n
        put(m, cal.now - n * _UNIT_S[m.group("unit").lower()], cal.now, "relative")
    for m in _NEXT_N.finditer(text):
        n = _num(m.group("num")) if m.group("num") else 1
        put(m, cal.now, cal.now + n * _UNIT_S[m.group("unit").lower()], "relative")
    for m in _AGO.finditer(text):
        raw, unit = m.group("num"), m.group("unit").lower()
        u = _UNIT_S[unit]
        if _fuzzy(raw):
            n = _num(raw)
            lo, hi = cal.now - (n + 2) * u, cal.now - max(n - 1.5, 0.5) * u
        elif unit in ("day", "night"):
            lo, hi = cal.shift_days(-_num(raw))
        else:
            c = cal.now - _num(raw) * u
            lo, hi = c - u / 2, c + u / 2
        put(m, lo, hi, "relative")
    for m in _IN_N.finditer(text):
        u = _UNIT_S[m.group("unit").lower()]
        c = cal.now + _num(m.group("num")) * u
        put(m, c - u / 2, c + u / 2, "relative")
    for m in _DAY_WORDS.finditer(text):
        w = m.group("w").lower()
        if w in ("today", "tonight", "this morning", "this afternoon", "this evening"):
            put(m, *cal.shift_days(0), "relative")
        elif w.startswith("yesterday") or w in ("last night", "last evening"):
            put(m, *cal.shift_days(-1), "relative")
        elif w == "the day before yesterday":
            put(m, *cal.shift_days(-2), "relative")
        elif w == "tomorrow":
            put(m, *cal.shift_days(1), "relative")
        elif w == "the day after tomorrow":
            put(m, *cal.shift_days(2), "relative")
        elif w == "the other day":
            lo, _ = cal.shift_days(-7)
            put(m, lo, cal.shift_days(0)[0], "relative")
        elif w in ("a while ago", "a while back", "some time ago"):
            put(m, cal.now - 365 * DAY, cal.now - 14 * DAY, "relative")
        else:  # long ago, years ago
            put(m, -_MAX_T, cal.now - 365 * DAY, "relative")
    for m in _REL_UNIT.finditer(text):
        rel, unit = m.group("rel").lower(), m.group("unit").lower()
        k = {"last": -1, "past": -1, "previous": -1, "this": 0, "current": 0, "next": 1, "coming": 1}[rel]
        y, mo, _ = cal.today()
        if unit == "week":
            lo, hi = cal.week_start(k), cal.week_start(k + 1)
        elif unit == "weekend":  # Saturday 00:00 to Monday 00:00 of the week k weeks from this one
            ws = cal.week_start(k)
            lo, hi = ws + 5 * DAY, ws + 7 * DAY
        elif unit == "month":
            lo, hi = cal.month(y, mo + k)
        elif unit == "year":
            lo, hi = cal.year(y + k)
        else:
            d0 = y - y % 10 + 10 * k
            lo, hi = cal.year(d0, 10)
        put(m, lo, hi, "relative")
    for m in _SEASON_ALONE.finditer(text):
        rel = (m.group("rel") or "").lower()
        s = m.group("s").lower()
        sm = _SEASONS[s]
        y = cal.dt.year
        # the latest such season begun by now (winter is named by its December)
        while cal.ts(y, sm) > cal.now:
            y -= 1
        if rel in ("last", "past", "previous") and cal.ts(y, sm + 3) > cal.now:
            y -= 1
        elif rel in ("next", "coming"):
            y += 1
        lo, hi = _qualify(*_season(cal, s, y), m.group("q"))
        put(m, lo, hi, "relative")
    for m in _WEEKDAY.finditer(text):
        rel, wd = m.group("rel").lower(), _WEEKDAYS[m.group("wd").lower()]
        cur = cal.dt.weekday()
        if rel in ("next", "coming"):
            delta = (wd - cur) % 7 or 7
        elif rel == "this":
            delta = wd - cur
        else:  # last / on / past: the latest such day before today
            delta = -((cur - wd) % 7 or 7)
        put(m, *cal.shift_days(delta), "relative")
    for rx in (_MONTH_ALONE, _MONTH_BARE):
        for m in rx.finditer(text):
            rel = (m.groupdict().get("rel") or "").lower()
            mo = _MONTHS[m.group("m").lower()[:3]]  # (bare "may" / "march" are verbs: not in _MONTH_BARE)
            y = cal.latest_month(mo, rel)
            lo, hi = cal.month(y, mo)
            if rel in ("early", "late", "mid", "early in", "late in", "the end of", "end of", "the beginning of",
                       "beginning of"):
                lo, hi = _qualify(lo, hi, rel.replace(" in", ""))
            put(m, lo, hi, "relative", "m" if rel in ("in", "during", "of", "since", "by", "until", "till", "before",
                                                       "after", "from", "between") else 0)
    out.sort(key=lambda s: s.pos[0])
    return out


def _anchor_phrase(text: str, pos: int, spans: Sequence[TimeSpan]) -> tuple[str, int] | None:
    """The event phrase starting at ``text[pos:]`` ("my birthday", "the charity race"), up to
    punctuation, a clause word or a time expression; ``None`` for pronouns and the like."""
    stop = min([sp.pos[0] for sp in spans if sp.pos[0] >= pos] + [len(text)])
    rest = text[pos:stop]
    m = _ANCHOR_END.search(rest)
    raw = rest[: m.start()] if m else rest
    phrase = raw.strip()
    words = phrase.split()
    if not words or len(words) > 8 or _ANCHOR_STOP.match(words[-1]) or (len(words) == 1 and _ANCHOR_STOP.match(words[0])):
        return None
    return phrase, pos + len(raw)


def _shift_range(unit: str | None, n: int, wd: int | None, direction: int) -> tuple[float, float]:
    """Offsets from an anchor time ``t`` (``[t + lo, t + hi)``) for "<n units> before / after"."""
    if wd is not None:  # "the Friday before X": within the week before / after
        return (-7 * DAY, 0.0) if direction < 0 else (DAY, 8 * DAY)
    u = _UNIT_S[unit or "day"]
    if unit in ("week", "weekend", "month", "year"):
        if n == 1:  # "the week before X": the unit-long stretch next to the anchor
            return (-u, 0.0) if direction < 0 else (DAY, u + DAY)
        c = n * u
        return (-c - u / 2, -c + u / 2) if direction < 0 else (c - u / 2, c + u / 2)
    c = n * DAY
    return (-c, -c + DAY) if direction < 0 else (c, c + DAY)


def _build(now: float, spans: Sequence[TimeSpan], order: str | None, anchor: str | None,
           offset: tuple[float, float] | None, intent: bool) -> TimeQuery:
    spans = tuple(spans)
    start = end = None
    if spans:
        lo = min(s.start for s in spans)
        hi = max(s.end for s in spans)
        start = None if lo <= -_MAX_T else max(lo, -_MAX_T)
        end = None if hi >= _MAX_T else min(hi, _MAX_T)
    return TimeQuery(now, spans, order, anchor, offset, intent, start, end)


def parse_time(text: str, now: Any = None, *, tz: Any = None) -> TimeQuery:
    """Read the time expressions of ``text`` relative to ``now`` (see the module doc).

    Parameters
    ----------
    text : str
        A question or statement (English).
    now : float, datetime, date or str, optional
        The reference time: unix seconds, a datetime (naive: UTC) / date, or a date string
        :func:`memkern.text.template.event_seconds` reads (ISO, LoCoMo ``"1:56 pm on 8 May, 2023"``,
        ...). ``None``: the wall clock. For a conversation: the date of the session asked from,
        else its latest session date.
    tz : datetime.tzinfo or str, optional
        The zone calendar days are counted in: a tzinfo, an offset ``"+02:00"`` / ``"-0500"`` /
        ``"UTC+2"``, or an IANA name (``"Europe/Berlin"``, where the zone database exists);
        default UTC.

    Returns
    -------
    TimeQuery
        ``found`` is False when nothing was read.

    Raises
    ------
    MemkernTypeError
        ``text`` is not a str; ``tz`` of another type.
    MemkernValueError
        ``now`` unreadable or out of range; ``tz`` an unknown zone or offset.
    """
    if not isinstance(text, str):
        raise bad_arg("text", "a str", type(text).__name__, MemkernTypeError)
    t_now = resolve_now(now)
    cal = _Cal(t_now, _tzinfo(tz))
    text = text.replace("\u2019", "'")
    intent = bool(_INTENT.search(text))
    spans = _scan(cal, text)
    anchor = offset = None
    used: list[tuple[int, int]] = []  # character ranges read by an anchored expression
    final: list[TimeSpan] = []

    def inside(i: int) -> bool:
        return any(a <= i < b for a, b in used)

    # "<n units> before / after X", "the week before X": X a date (shifted), else an event anchor.
    for m in _SHIFT.finditer(text):
        if inside(m.start()) or any(sp.pos[0] <= m.start() and sp.pos[1] > m.start("dir") for sp in spans):
            continue  # part of an expression read already ("the day before yesterday")
        unit = (m.group("unit") or m.group("unit1") or "").lower() or None
        wd = m.group("wd1")
        n = _num(m.group("num")) if m.group("num") else 1
        direction = -1 if m.group("dir").lower() in ("before", "prior to", "preceding", "earlier than") else 1
        lo, hi = _shift_range(unit, n, None if wd is None else _WEEKDAYS[wd.lower()], direction)
        if m.group("unit1") and text[m.start():m.start() + 5].lower() == "last ":
            lo, hi = (-8 * DAY, 0.0) if direction < 0 else (DAY, 9 * DAY)  # "last weekend before X"
        d = _date_at(spans, text, m.end())
        if d is not None:
            t0 = d.start if direction < 0 else d.end - DAY
            if wd is not None:  # "the Friday before X": that one day
                wd0 = _dt.datetime.fromtimestamp(t0, cal.tz).weekday()
                k = -((wd0 - _WEEKDAYS[wd.lower()]) % 7 or 7) if direction < 0 else ((_WEEKDAYS[wd.lower()] - wd0) % 7 or 7)
                lo, hi = k * DAY, (k + 1) * DAY
            used.append((m.start(), d.pos[1]))
            final.append(TimeSpan(t0 + lo, t0 + hi, text[m.start():d.pos[1]], "anchored", (m.start(), d.pos[1])))
            continue
        ph = _anchor_phrase(text, m.end(), spans)
        if ph is not None and anchor is None:
            anchor, offset = ph[0], (lo, hi)
            used.append((m.start(), ph[1]))
    # "between X and Y"
    for m in _BETWEEN.finditer(text):
        d1 = _date_at(spans, text, m.end())
        m2 = re.compile(r"\s*(?:and|to|-)\s+", re.I).match(text, d1.pos[1]) if d1 is not None else None
        d2 = _date_at(spans, text, m2.end()) if m2 else None
        if d2 is None or inside(m.start()):
            continue
        used.append((m.start(), d2.pos[1]))
        final.append(TimeSpan(d1.start, max(d1.end, d2.end), text[m.start():d2.pos[1]], "anchored",
                              (m.start(), d2.pos[1])))
    # "since / after / before / until / by X": an open range from a date; an event: an anchor.
    for m in _BARE_DIR.finditer(text):
        if inside(m.start()) or any(sp.pos[0] <= m.start() < sp.pos[1] for sp in spans):
            continue  # part of an expression read already ("during the summer", "before May 2023")
        w = m.group("dir").lower()
        d = _date_at(spans, text, m.end())
        if d is not None:
            if w == "during":
                continue
            if w == "since":
                lo, hi = d.start, max(t_now, d.end)
            elif w in ("after", "following"):
                lo, hi = d.end, _MAX_T
            elif w == "by":
                lo, hi = -_MAX_T, d.end
            else:
                lo, hi = -_MAX_T, d.start
            used.append((m.start(), d.pos[1]))
            final.append(TimeSpan(lo, hi, text[m.start():d.pos[1]], "anchored", (m.start(), d.pos[1])))
            continue
        if anchor is not None or w == "by":
            continue
        ph = _anchor_phrase(text, m.end(), spans)
        if ph is None:
            continue
        anchor = ph[0]
        offset = {"since": (0.0, 366 * DAY), "after": (0.0, 31 * DAY), "following": (0.0, 31 * DAY),
                  "before": (-31 * DAY, DAY), "until": (-366 * DAY, DAY), "till": (-366 * DAY, DAY),
                  "prior to": (-31 * DAY, DAY), "during": (-3 * DAY, 4 * DAY)}[w]
        used.append((m.start(), ph[1]))
    final += [sp for sp in spans if not inside(sp.pos[0])]
    final.sort(key=lambda s: s.pos[0])
    order = None
    if not final:
        rest = text
        for a, b in used:
            rest = rest[:a] + " " * (b - a) + rest[b:]
        if _ORDER_EARLIEST.search(rest):
            order = "earliest"
        elif _ORDER_LATEST.search(rest):
            order = "latest"
    return _build(t_now, final, order, anchor, offset, intent)
