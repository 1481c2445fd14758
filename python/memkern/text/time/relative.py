"""Expressions relative to ``now``: "earlier this week", "in the past 3 days", "two weeks ago", "in 2
months", "yesterday", "last month", "last summer", "on Friday", "in June".
"""
from __future__ import annotations

from typing import Callable

from .calendar import Calendar, qualify, season_range
from .lexicon import (AGO, DAY, DAY_WORDS, EARLIER, IN_N, MAX_T, MONTH_ALONE, MONTH_BARE, MONTHS, NEXT_N, PAST_N,
                      REL_UNIT, SEASON_ALONE, SEASONS, UNIT_SECONDS, WEEKDAY, WEEKDAYS, count_value, is_vague_count)

__all__ = ["scan_relative"]


def scan_relative(cal: Calendar, text: str, put: Callable[..., None]) -> None:
    """Read the expressions of ``text`` relative to ``cal.now``.

    Each match is handed to ``put(match, lo, hi, "relative", group=0)`` with its range ``[lo, hi)``
    in unix seconds (``group``: the part of the match that is kept); ``put`` keeps it unless it
    overlaps a match kept before.
    """
    for m in EARLIER.finditer(text):
        unit = m.group("unit").lower()
        y, mo, _ = cal.today()
        lo, hi = {"week": (cal.week_start(0), cal.week_start(1)), "month": cal.month(y, mo), "year": cal.year(y)}[unit]
        put(m, lo, cal.now, "relative") if m.group("w").lower() == "earlier" else put(m, cal.now, hi, "relative")
    for m in PAST_N.finditer(text):
        n = count_value(m.group("num")) if m.group("num") else 1
        n = max(n, 5) if is_vague_count(m.group("num")) else n
        put(m, cal.now - n * UNIT_SECONDS[m.group("unit").lower()], cal.now, "relative")
    for m in NEXT_N.finditer(text):
        n = count_value(m.group("num")) if m.group("num") else 1
        put(m, cal.now, cal.now + n * UNIT_SECONDS[m.group("unit").lower()], "relative")
    for m in AGO.finditer(text):
        raw, unit = m.group("num"), m.group("unit").lower()
        u = UNIT_SECONDS[unit]
        if is_vague_count(raw):
            n = count_value(raw)
            lo, hi = cal.now - (n + 2) * u, cal.now - max(n - 1.5, 0.5) * u
        elif unit in ("day", "night"):
            lo, hi = cal.shift_days(-count_value(raw))
        else:
            c = cal.now - count_value(raw) * u
            lo, hi = c - u / 2, c + u / 2
        put(m, lo, hi, "relative")
    for m in IN_N.finditer(text):
        u = UNIT_SECONDS[m.group("unit").lower()]
        c = cal.now + count_value(m.group("num")) * u
        put(m, c - u / 2, c + u / 2, "relative")
    for m in DAY_WORDS.finditer(text):
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
            put(m, -MAX_T, cal.now - 365 * DAY, "relative")
    for m in REL_UNIT.finditer(text):
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
    for m in SEASON_ALONE.finditer(text):
        rel = (m.group("rel") or "").lower()
        s = m.group("s").lower()
        sm = SEASONS[s]
        y = cal.dt.year
        # the latest such season begun by now (winter is named by its December)
        while cal.ts(y, sm) > cal.now:
            y -= 1
        if rel in ("last", "past", "previous") and cal.ts(y, sm + 3) > cal.now:
            y -= 1
        elif rel in ("next", "coming"):
            y += 1
        lo, hi = qualify(*season_range(cal, s, y), m.group("q"))
        put(m, lo, hi, "relative")
    for m in WEEKDAY.finditer(text):
        rel, wd = m.group("rel").lower(), WEEKDAYS[m.group("wd").lower()]
        cur = cal.dt.weekday()
        if rel in ("next", "coming"):
            delta = (wd - cur) % 7 or 7
        elif rel == "this":
            delta = wd - cur
        else:  # last / on / past: the latest such day before today
            delta = -((cur - wd) % 7 or 7)
        put(m, *cal.shift_days(delta), "relative")
    for rx in (MONTH_ALONE, MONTH_BARE):
        for m in rx.finditer(text):
            rel = (m.groupdict().get("rel") or "").lower()
            mo = MONTHS[m.group("m").lower()[:3]]  # (bare "may" / "march" are verbs: not in MONTH_BARE)
            y = cal.latest_month(mo, rel)
            lo, hi = cal.month(y, mo)
            if rel in ("early", "late", "mid", "early in", "late in", "the end of", "end of", "the beginning of",
                       "beginning of"):
                lo, hi = qualify(lo, hi, rel.replace(" in", ""))
            put(m, lo, hi, "relative", "m" if rel in ("in", "during", "of", "since", "by", "until", "till", "before",
                                                       "after", "from", "between") else 0)
