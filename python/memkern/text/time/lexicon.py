"""The words and patterns time expressions are read with: units in seconds, month / weekday / season /
number words, and the compiled regular expressions (case-insensitive) that :func:`memkern.text.time.parse_time`
runs over a text.

Named groups: ``y`` / ``m`` / ``d`` (year, month, day), ``q`` (early / mid / late), ``rel`` (last /
this / next ...), ``num`` and ``unit`` (a count of days, weeks ...), ``dir`` (before / after ...).
"""
from __future__ import annotations

import re

__all__ = ["DAY", "WEEK", "MAX_T", "UNIT_SECONDS", "MONTHS", "WEEKDAYS", "SEASONS", "count_value", "is_vague_count",
           "DATE_PATTERNS", "HOLIDAY", "HOLIDAYS", "MONTH_ALONE", "MONTH_BARE", "SEASON_ALONE", "WEEKDAY",
           "REL_UNIT", "AGO", "PAST_N", "NEXT_N", "IN_N", "EARLIER", "DAY_WORDS", "ORDER_LATEST", "ORDER_EARLIEST",
           "INTENT", "SHIFT", "BARE_DIR", "BETWEEN", "ANCHOR_END", "ANCHOR_STOP", "GAP"]

DAY = 86400.0
WEEK = 7 * DAY
MAX_T = 1e12  # the store's MAX_TIME (|unix seconds|)

MONTHS = {m: i + 1 for i, m in enumerate(
    ("january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
     "november", "december"))}
MONTHS |= {m[:3]: i for m, i in list(MONTHS.items())} | {"sept": 9}
WEEKDAYS = {d: i for i, d in enumerate(("monday", "tuesday", "wednesday", "thursday", "friday", "saturday",
                                        "sunday"))}
WEEKDAYS |= {d[:3]: i for d, i in list(WEEKDAYS.items())}
_NUM_WORDS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
              "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "fifteen": 15, "twenty": 20,
              "thirty": 30, "a couple of": 2, "a couple": 2, "couple of": 2, "a few": 3, "few": 3, "several": 4,
              "a pair of": 2}
SEASONS = {"spring": 3, "summer": 6, "fall": 9, "autumn": 9, "winter": 12}

_MON = r"(?P<{n}>jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|sept?(?:ember)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)"
_WD = r"(?P<wd>monday|tuesday|wednesday|thursday|friday|saturday|sunday)"
_NUM = r"(?P<num>\d{1,3}|a couple of|a couple|couple of|a pair of|a few|few|several|an?|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|fifteen|twenty|thirty)"
_UNIT = r"(?P<unit>day|night|week|weekend|month|year|decade)s?"
_ORD = r"(?:st|nd|rd|th)?"
_YEAR = r"(?P<{n}>(?:1[89]|2[01])\d\d)"


def _rx(p: str) -> re.Pattern:
    return re.compile(p, re.I)


# Dates (most specific first). Named groups: y/m/d; each pattern yields one calendar unit.
DATE_PATTERNS: list[tuple[str, re.Pattern]] = [
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
HOLIDAY = _rx(r"\b(?P<rel>last|this|next)?\s*(?P<h>christmas eve|christmas|new year'?s eve|new year'?s day|new year'?s|"
              r"valentine'?s day|halloween|independence day|the fourth of july|july 4th)(?:\s+(?:of\s+)?"
              + _YEAR.format(n="y") + r")?\b")
HOLIDAYS = {"christmas eve": (12, 24, 1), "christmas": (12, 24, 3), "new year's eve": (12, 31, 1),
            "new years eve": (12, 31, 1), "new year's day": (1, 1, 1), "new years day": (1, 1, 1),
            "new year's": (12, 31, 2), "new years": (12, 31, 2), "valentine's day": (2, 14, 1),
            "valentines day": (2, 14, 1), "halloween": (10, 31, 1), "independence day": (7, 4, 1),
            "the fourth of july": (7, 4, 1), "july 4th": (7, 4, 1)}
# A month / season / weekday without a year (the latest occurrence begun by now, or next / last).
MONTH_ALONE = _rx(r"\b(?P<rel>in|during|of|since|by|until|till|before|after|from|between|early|late|mid|this|last|next|"
                  r"past|coming|previous|early in|late in|the end of|end of|the beginning of|beginning of)[\s-]+"
                  + _MON.format(n="m") + r"\b(?!\s*\d)")
MONTH_BARE = _rx(r"\b(?P<m>january|february|april|june|july|august|september|october|november|december)\b(?!\s*\d)")
SEASON_ALONE = _rx(r"\b(?:(?P<rel>last|this|next|past|coming|previous)\s+|(?:in|during|over|of)\s+(?:the\s+)?)"
                   r"(?:(?P<q>early|mid|late)[\s-]+)?(?P<s>spring|summer|fall|autumn|winter)\b(?!\s+(?:of\s+)?\d)")
WEEKDAY = _rx(r"\b(?P<rel>last|this|next|past|previous|coming|on)\s+" + _WD + r"\b")
REL_UNIT = _rx(r"\b(?P<rel>last|this|next|past|previous|coming|current)\s+(?P<unit>week|weekend|month|year|decade)\b")
AGO = _rx(r"\b" + _NUM + r"\s+" + _UNIT + r"\s+(?:ago|back|earlier)\b")
PAST_N = _rx(r"\b(?:in|over|during|within|for)\s+the\s+(?:past|last|previous)\s+(?:" + _NUM + r"\s+)?" + _UNIT + r"\b")
NEXT_N = _rx(r"\b(?:in|over|during|within)\s+the\s+(?:next|coming)\s+(?:" + _NUM + r"\s+)?" + _UNIT + r"\b")
IN_N = _rx(r"\bin\s+" + _NUM + r"\s+" + _UNIT + r"\b(?!\s+(?:ago|before|after|earlier|later))")
EARLIER = _rx(r"\b(?P<w>earlier|later)\s+(?:this|in the)\s+(?P<unit>week|month|year)\b")
DAY_WORDS = _rx(r"\b(?P<w>the day before yesterday|the day after tomorrow|yesterday morning|yesterday afternoon|"
                r"yesterday evening|yesterday|last night|last evening|the other day|today|tonight|this morning|"
                r"this afternoon|this evening|tomorrow|a while ago|a while back|some time ago|"
                r"a long time ago|(?<!how )long ago|years ago)\b")
ORDER_LATEST = _rx(r"\b(recently|lately|most recent(?:ly)?|latest|last time|the last time|currently|current|"
                   r"these days|nowadays|right now|now|anymore|any more|newest)\b")
ORDER_EARLIEST = _rx(r"\b(the first time|for the first time|first time|first ever|earliest|originally|initially|"
                     r"at first|in the beginning|at the beginning|first met|oldest|used to)\b")
INTENT = _rx(r"^\W*(?:when\b|what (?:year|month|day|date|time|week|season)\b|which (?:year|month|day|date|week)\b|"
             r"how long ago\b|since when\b|on what (?:day|date)\b|in what (?:year|month)\b|at what age\b|"
             r"how many (?:days|weeks|months|years) (?:ago|passed|after|before|between|since)|"
             r"how long (?:has|have|had|did|was|were|is|are|after|before|between)\b)")
# Anchors: "<duration> before / after X", "the week before X", "before / after / since / until X".
SHIFT = _rx(r"\b(?:(?P<num>\d{1,3}|a couple of|a couple|couple of|a few|few|several|an?|one|two|three|four|five|six|"
            r"seven|eight|nine|ten|eleven|twelve|fifteen|twenty|thirty)\s+(?P<unit>day|night|week|weekend|month|year)s?|"
            r"(?:the\s+|last\s+|that\s+)?(?P<unit1>day|night|week|weekend|month|year)|"
            r"(?:the\s+|last\s+|that\s+)(?P<wd1>monday|tuesday|wednesday|thursday|friday|saturday|sunday))\s+"
            r"(?P<dir>before|after|prior to|following|preceding|later than|earlier than)\s+")
BARE_DIR = _rx(r"\b(?P<dir>since|after|before|until|till|prior to|following|during|by)\s+")
BETWEEN = _rx(r"\bbetween\s+")
ANCHOR_END = re.compile(r"[?!.;,]|\s(?:and|but|when|while|where|because|so|then|with|at|in|on|to|for)\s", re.I)
ANCHOR_STOP = _rx(r"^(?:that|then|this|it|which|what|he|she|they|we|you|i|him|her|them|us|me|school|work|"
                  r"dinner|lunch|breakfast|bed|all|everything|anything|something)$")

UNIT_SECONDS = {"day": DAY, "night": DAY, "week": WEEK, "weekend": WEEK, "month": 30.44 * DAY, "year": 365.25 * DAY,
                "decade": 3652.5 * DAY}

GAP = re.compile(r"\s*(?:(?:the|on|of|in)\s+)?", re.I)


def count_value(s: str | None) -> int:
    """The number a count word or numeral means ("3", "two", "a couple of": 2; ``None``: 1)."""
    if s is None:
        return 1
    s = " ".join(s.lower().split())
    return int(s) if s.isdigit() else _NUM_WORDS.get(s, 1)


def is_vague_count(s: str | None) -> bool:
    """Whether a count word is vague ("a few", "several", "a couple of")."""
    return s is not None and " ".join(s.lower().split()) in ("a few", "few", "several", "a couple of", "a couple",
                                                            "couple of")
