"""Absolute dates in a text: holidays ("Christmas 2022"), days ("2023-05-03", "May 3rd, 2023", "May 3"),
months ("early May 2023"), seasons ("the summer of 2022"), decades ("the 1990s") and years ("in 2022").
"""
from __future__ import annotations

from typing import Callable

from .calendar import Calendar, qualify, season_range, valid_day
from .lexicon import DATE_PATTERNS, DAY, HOLIDAY, HOLIDAYS, MONTHS

__all__ = ["scan_absolute"]


def scan_absolute(cal: Calendar, text: str, put: Callable[..., None]) -> None:
    """Read the holidays and dates of ``text`` (most specific pattern first).

    Each match is handed to ``put(match, lo, hi, kind)`` with its range ``[lo, hi)`` in unix
    seconds (``kind``: ``"absolute"``, or ``"relative"`` for a holiday without a year); ``put``
    keeps it unless it overlaps a match kept before.
    """
    for m in HOLIDAY.finditer(text):
        mo, d, n = HOLIDAYS[m.group("h").lower().replace("\u2019", "'")]
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
    for unit, rx in DATE_PATTERNS:
        for m in rx.finditer(text):
            g = m.groupdict()
            if unit == "day":
                mon = g["m"]
                mo = int(mon) if mon.isdigit() else MONTHS[mon.lower()[:3]]
                d = int(g["d"])
                y = int(g["y"]) if g.get("y") else None
                if y is None:
                    y = cal.dt.year
                    if not valid_day(y, mo, d) or cal.ts(y, mo, d) > cal.now:
                        y -= 1
                if not (1 <= mo <= 12 and valid_day(y, mo, d)):
                    continue
                put(m, *cal.day(y, mo, d), "absolute")
            elif unit == "month":
                mo = MONTHS[g["m"].lower()[:3]]
                lo, hi = qualify(*cal.month(int(g["y"]), mo), g.get("q"))
                put(m, lo, hi, "absolute")
            elif unit == "season":
                lo, hi = qualify(*season_range(cal, g["s"], int(g["y"])), g.get("q"))
                put(m, lo, hi, "absolute")
            elif unit == "decade":
                c, dd = g.get("c"), int(g.get("dd") or g.get("dd2"))
                century = int(c) * 100 if c else (1900 if dd >= 3 else 2000)
                y = century + 10 * dd
                put(m, *cal.year(y, 10), "absolute")
            else:
                lo, hi = qualify(*cal.year(int(g["y"])), g.get("q"))
                put(m, lo, hi, "absolute")
