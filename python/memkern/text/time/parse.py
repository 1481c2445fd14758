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
import re
from typing import Any, Sequence

import numpy as np

from ...errors import MemkernTypeError, bad_arg
from .absolute import scan_absolute
from .calendar import Calendar, resolve_now, tzinfo_of
from .lexicon import (ANCHOR_END, ANCHOR_STOP, BARE_DIR, BETWEEN, DAY, GAP, INTENT, MAX_T, ORDER_EARLIEST,
                      ORDER_LATEST, SHIFT, UNIT_SECONDS, WEEKDAYS, count_value)
from .query import TimeQuery, TimeSpan, build_query
from .relative import scan_relative

__all__ = ["parse_time"]


def _date_at(spans: Sequence[TimeSpan], text: str, pos: int) -> TimeSpan | None:
    """The span that starts at ``text[pos:]`` (after spaces and a "the" / "on" / "of" / "in")."""
    gap = GAP.match(text, pos).end()
    for sp in spans:
        if pos <= sp.pos[0] <= gap:
            return sp
    return None


def _scan(cal: Calendar, text: str) -> list[TimeSpan]:
    """Every date / relative expression of ``text`` (no anchors), in text order, non-overlapping."""
    taken = np.zeros(len(text) + 1, dtype=bool)
    out: list[TimeSpan] = []

    def put(m: re.Match, lo: float, hi: float, kind: str, group: int | str = 0) -> None:
        a, b = m.span(group)
        if taken[a:b].any() or not (hi > lo):
            return
        taken[a:b] = True
        out.append(TimeSpan(float(lo), float(hi), text[a:b], kind, (a, b)))

    scan_absolute(cal, text, put)
    scan_relative(cal, text, put)
    out.sort(key=lambda s: s.pos[0])
    return out


def _anchor_phrase(text: str, pos: int, spans: Sequence[TimeSpan]) -> tuple[str, int] | None:
    """The event phrase starting at ``text[pos:]`` ("my birthday", "the charity race"), up to
    punctuation, a clause word or a time expression; ``None`` for pronouns and the like."""
    stop = min([sp.pos[0] for sp in spans if sp.pos[0] >= pos] + [len(text)])
    rest = text[pos:stop]
    m = ANCHOR_END.search(rest)
    raw = rest[: m.start()] if m else rest
    phrase = raw.strip()
    words = phrase.split()
    if not words or len(words) > 8 or ANCHOR_STOP.match(words[-1]) or (len(words) == 1 and ANCHOR_STOP.match(words[0])):
        return None
    return phrase, pos + len(raw)


def _shift_range(unit: str | None, n: int, wd: int | None, direction: int) -> tuple[float, float]:
    """Offsets from an anchor time ``t`` (``[t + lo, t + hi)``) for "<n units> before / after"."""
    if wd is not None:  # "the Friday before X": within the week before / after
        return (-7 * DAY, 0.0) if direction < 0 else (DAY, 8 * DAY)
    u = UNIT_SECONDS[unit or "day"]
    if unit in ("week", "weekend", "month", "year"):
        if n == 1:  # "the week before X": the unit-long stretch next to the anchor
            return (-u, 0.0) if direction < 0 else (DAY, u + DAY)
        c = n * u
        return (-c - u / 2, -c + u / 2) if direction < 0 else (c - u / 2, c + u / 2)
    c = n * DAY
    return (-c, -c + DAY) if direction < 0 else (c, c + DAY)


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
    cal = Calendar(t_now, tzinfo_of(tz))
    text = text.replace("\u2019", "'")
    intent = bool(INTENT.search(text))
    spans = _scan(cal, text)
    anchor = offset = None
    used: list[tuple[int, int]] = []  # character ranges read by an anchored expression
    final: list[TimeSpan] = []

    def inside(i: int) -> bool:
        return any(a <= i < b for a, b in used)

    # "<n units> before / after X", "the week before X": X a date (shifted), else an event anchor.
    for m in SHIFT.finditer(text):
        if inside(m.start()) or any(sp.pos[0] <= m.start() and sp.pos[1] > m.start("dir") for sp in spans):
            continue  # part of an expression read already ("the day before yesterday")
        unit = (m.group("unit") or m.group("unit1") or "").lower() or None
        wd = m.group("wd1")
        n = count_value(m.group("num")) if m.group("num") else 1
        direction = -1 if m.group("dir").lower() in ("before", "prior to", "preceding", "earlier than") else 1
        lo, hi = _shift_range(unit, n, None if wd is None else WEEKDAYS[wd.lower()], direction)
        if m.group("unit1") and text[m.start():m.start() + 5].lower() == "last ":
            lo, hi = (-8 * DAY, 0.0) if direction < 0 else (DAY, 9 * DAY)  # "last weekend before X"
        d = _date_at(spans, text, m.end())
        if d is not None:
            t0 = d.start if direction < 0 else d.end - DAY
            if wd is not None:  # "the Friday before X": that one day
                wd0 = _dt.datetime.fromtimestamp(t0, cal.tz).weekday()
                k = -((wd0 - WEEKDAYS[wd.lower()]) % 7 or 7) if direction < 0 else ((WEEKDAYS[wd.lower()] - wd0) % 7 or 7)
                lo, hi = k * DAY, (k + 1) * DAY
            used.append((m.start(), d.pos[1]))
            final.append(TimeSpan(t0 + lo, t0 + hi, text[m.start():d.pos[1]], "anchored", (m.start(), d.pos[1])))
            continue
        ph = _anchor_phrase(text, m.end(), spans)
        if ph is not None and anchor is None:
            anchor, offset = ph[0], (lo, hi)
            used.append((m.start(), ph[1]))
    # "between X and Y"
    for m in BETWEEN.finditer(text):
        d1 = _date_at(spans, text, m.end())
        m2 = re.compile(r"\s*(?:and|to|-)\s+", re.I).match(text, d1.pos[1]) if d1 is not None else None
        d2 = _date_at(spans, text, m2.end()) if m2 else None
        if d2 is None or inside(m.start()):
            continue
        used.append((m.start(), d2.pos[1]))
        final.append(TimeSpan(d1.start, max(d1.end, d2.end), text[m.start():d2.pos[1]], "anchored",
                              (m.start(), d2.pos[1])))
    # "since / after / before / until / by X": an open range from a date; an event: an anchor.
    for m in BARE_DIR.finditer(text):
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
                lo, hi = d.end, MAX_T
            elif w == "by":
                lo, hi = -MAX_T, d.end
            else:
                lo, hi = -MAX_T, d.start
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
        if ORDER_EARLIEST.search(rest):
            order = "earliest"
        elif ORDER_LATEST.search(rest):
            order = "latest"
    return build_query(t_now, final, order, anchor, offset, intent)
