"""Calendar arithmetic in one time zone, and reading the reference time ``now`` and the zone ``tz``.

Weeks start on Monday; seasons are meteorological (:func:`season_range`).
"""
from __future__ import annotations

import datetime as _dt
import re
from typing import Any

import numpy as np

from ...errors import MemkernTypeError, bad_arg
from .lexicon import MAX_T, SEASONS

__all__ = ["Calendar", "valid_day", "qualify", "season_range", "resolve_now", "check_time", "tzinfo_of"]


class Calendar:
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


def valid_day(y: int, m: int, d: int) -> bool:
    """Whether y-m-d is a date of the calendar (no February 30)."""
    try:
        _dt.date(y, m, d)
        return True
    except ValueError:
        return False

def qualify(lo: float, hi: float, q: str | None) -> tuple[float, float]:
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


def season_range(cal: Calendar, s: str, y: int) -> tuple[float, float]:
    """``[start, end)`` of season ``s`` of year ``y`` (three months; winter starts in December of ``y``)."""
    m = SEASONS[s.lower()]
    return cal.month(y, m, 3)
def resolve_now(now: Any, name: str = "now") -> float:
    """``now`` as unix seconds: unix seconds, a datetime (naive: UTC) / date, or a date string
    :func:`memkern.text.template.event_seconds` reads; ``None`` is the wall clock."""
    if now is None:
        import time

        return time.time()
    from ..template import event_seconds

    return float(event_seconds(now, name))


def check_time(t: Any, name: str) -> float:
    """``t`` as float unix seconds within the store's time bound, else an error naming ``name``."""
    if isinstance(t, bool) or not isinstance(t, (int, float, np.integer, np.floating)) or not abs(float(t)) <= MAX_T:
        raise bad_arg(name, f"unix seconds with |t| <= {MAX_T:g}", t)
    return float(t)


def tzinfo_of(tz: Any) -> _dt.tzinfo:
    """The zone ``tz`` names: a tzinfo, an offset ``"+02:00"`` / ``"UTC+2"``, an IANA name; ``None``: UTC."""
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
