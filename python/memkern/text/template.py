"""What gets embedded for a turn: one documented, configurable template.

A turn is embedded (and shown in answer prompts) as ``"[{date}] {speaker}: {content}"`` by
default, e.g. ``"[2023-05-08] Caroline: I'm moving to Lisbon!"``. On conversations the speaker's
name and the session date are where questions point ("What did Caroline adopt?", "When did
Melanie run the race?"), and a content-only embedding loses them.

The same :class:`TurnTemplate` is used everywhere text is embedded for retrieval:

- :mod:`memkern.ingest.extract`: the ``embedding`` (TextTiling-like) and ``window`` extractors embed
  rendered turns and make a topic's text with :meth:`TurnTemplate.render_block`;
- :class:`memkern.RMM`: turn records (two-level memory) are embedded from rendered turns, and
  :meth:`memkern.RMM.end_session` takes the session's ``date``;
- :mod:`memkern.ingest.prompts`: answer prompts show each turn's date and speaker;
- ``memkern eval memory`` (``--template``) and :mod:`memkern.eval.units`.

Fields
------
``{content}`` (required), ``{speaker}``, ``{date}``, ``{role}``. A field whose value is missing
(``None`` or blank) is dropped together with the punctuation that hugs it: the non-blank
characters right before the field and the characters right after it up to and including the
next run of spaces. So with the default template a turn without a date renders as
``"Caroline: ..."``, one without a speaker as ``"[2023-05-08] ..."``, and one with neither as its
bare content.

Dates
-----
``date_format`` (default ``"%Y-%m-%d"``) rewrites dates it recognises (:func:`parse_date`:
LoCoMo's ``"1:56 pm on 8 May, 2023"``, LongMemEval's ``"2023/05/20 (Sat) 02:21"``, ISO dates
and times, unix seconds) with :meth:`datetime.datetime.strftime`; an unrecognised date string is
used as given. ``date_format=None`` keeps every date as given.

Queries
-------
Queries are embedded as queries (``Embedder.encode(texts, kind="query")``), which prepends the
embedder's ``query_prefix``. The default all-MiniLM-L6-v2 has no query prefix (it is a symmetric
model, ``query_prefix=""``); models such as E5 use ``query_prefix="query: "`` and
``passage_prefix="passage: "``. Queries are never rendered through the turn template.
"""
from __future__ import annotations

import datetime as _dt
import math
import re
import string
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ..errors import MemkernTypeError, bad_arg
from ..base.validate import MAX_NAME_CHARS, MAX_TIME, MIN_TIME, TIME_RANGE_TEXT, check_text, check_time

__all__ = ["DEFAULT_TEMPLATE", "TEMPLATE_FIELDS", "TurnTemplate", "parse_date", "event_seconds", "time_range_seconds", "turn_date",
           "default_template", "PLAIN"]

DEFAULT_TEMPLATE = "[{date}] {speaker}: {content}"
TEMPLATE_FIELDS = ("content", "speaker", "date", "role")

_DATE_FORMATS = ("%I:%M %p on %d %B, %Y", "%I:%M %p on %d %b, %Y", "%Y/%m/%d (%a) %H:%M", "%Y/%m/%d %H:%M",
                 "%Y/%m/%d", "%Y-%m-%d", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M",
                 "%d %B, %Y", "%d %B %Y", "%B %d, %Y")
_NUMBER = re.compile(r"^\d+(\.\d+)?$")


def parse_date(value: Any) -> _dt.datetime | None:
    """A datetime from a date value in one of the formats memkern's data uses, else ``None``.

    Accepts a :class:`datetime.datetime` / :class:`datetime.date`, unix seconds (int/float or a
    numeric string, UTC), or a string in LoCoMo, LongMemEval or ISO form (see the module doc).
    """
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, _dt.datetime):
        return value
    if isinstance(value, _dt.date):
        return _dt.datetime(value.year, value.month, value.day)
    if isinstance(value, (int, float)):
        try:
            return _dt.datetime.fromtimestamp(float(value), _dt.timezone.utc).replace(tzinfo=None)
        except (OverflowError, OSError, ValueError):
            return None
    if not isinstance(value, str):
        return None
    text = " ".join(value.split())
    if _NUMBER.match(text):
        return parse_date(float(text))
    for fmt in _DATE_FORMATS:
        try:
            return _dt.datetime.strptime(text, fmt)
        except ValueError:
            continue
    try:
        return _dt.datetime.fromisoformat(text).replace(tzinfo=None)
    except ValueError:
        return None


def event_seconds(value: Any, name: str = "date") -> float | None:
    """A session date as unix seconds (the store's ``event_time``), or ``None`` for ``None``.

    Accepted: unix seconds (int / float, not bool, in ``[MIN_TIME, MAX_TIME]`` of
    :mod:`memkern.base.validate`: years 1-9999 UTC), a
    :class:`datetime.datetime` (aware: converted; naive: read as UTC) or :class:`datetime.date`
    (midnight UTC), or a string :func:`parse_date` reads: a numeric string (unix seconds),
    LoCoMo's ``"1:56 pm on 8 May, 2023"``, LongMemEval's ``"2023/05/20 (Sat) 02:21"``,
    ``"2023-05-08"``, ``"8 May 2023"``, ``"May 8, 2023"``, and ISO 8601 dates and times (an ISO
    offset such as ``"+02:00"`` is honoured; a time without one is UTC).

    Raises
    ------
    MemkernValueError
        ``value`` is a string no format reads, or a number out of range (the message names
        ``name``).
    MemkernTypeError
        ``value`` is of another type (bool, list, ...).
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, str, _dt.date)):
        raise bad_arg(name, "unix seconds, a datetime / date or a date string", type(value).__name__,
                      MemkernTypeError)
    if isinstance(value, (int, float)):
        return check_time(name, value)
    dt = None
    if isinstance(value, str):
        check_text(name, value, max_chars=MAX_NAME_CHARS)
        text = " ".join(value.split())
        try:  # keep an ISO offset (parse_date drops it)
            iso = _dt.datetime.fromisoformat(text)
            if iso.tzinfo is not None:
                dt = iso
        except ValueError:
            pass
    if dt is None:
        dt = parse_date(value)
    if dt is None:
        raise bad_arg(name, "a date string in a known format (unix seconds, ISO 8601 '2023-05-08', LoCoMo "
                      "'1:56 pm on 8 May, 2023', LongMemEval '2023/05/20 (Sat) 02:21', '8 May 2023', "
                      "'May 8, 2023')", value)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=_dt.timezone.utc)
    try:
        t = dt.timestamp()
    except (OverflowError, ValueError, OSError):  # e.g. year 9999 with a negative UTC offset
        t = math.nan
    if not MIN_TIME <= t <= MAX_TIME:  # also NaN
        raise bad_arg(name, f"a date in years 1-9999 UTC ({TIME_RANGE_TEXT})", value)
    return t


def time_range_seconds(value: Any, name: str = "time_range") -> tuple[float | None, float | None] | None:
    """A ``(start, end)`` time range with dates (:func:`event_seconds`: unix seconds, datetimes or
    date strings; ``None`` for an open end) as unix seconds, for ``search(time_range=...)``;
    ``None`` stays ``None``. Raises naming ``name`` / ``name[0]`` / ``name[1]``."""
    if value is None:
        return None
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence) or len(value) != 2:
        raise bad_arg(name, "a (start, end) pair of dates or unix seconds (either may be None)", value)
    lo, hi = (event_seconds(v, f"{name}[{i}]") for i, v in enumerate(value))
    if lo is not None and hi is not None and lo > hi:
        raise bad_arg(name, "start <= end", tuple(value))
    return lo, hi


def turn_date(turn: Mapping[str, Any], default: Any = None) -> Any:
    """A turn's own date: its ``date`` key, else ``timestamp``, else ``default``."""
    for k in ("date", "timestamp"):
        v = turn.get(k)
        if v is not None and not (isinstance(v, str) and not v.strip()):
            return v
    return default


@dataclass(frozen=True)
class TurnTemplate:
    """How a turn becomes text (for embedding and for prompts).

    Parameters
    ----------
    template : str
        A :meth:`str.format` pattern over ``{content}`` (required), ``{speaker}``, ``{date}``,
        ``{role}``; default :data:`DEFAULT_TEMPLATE`. Missing fields degrade gracefully (module doc).
    date_format : str or None
        ``strftime`` pattern for recognised dates (default ``"%Y-%m-%d"``); ``None`` keeps dates as given.

    Raises
    ------
    MemkernValueError
        ``template`` without ``{content}``, with an unknown field, a format spec or a conversion.
    """

    template: str = DEFAULT_TEMPLATE
    date_format: str | None = "%Y-%m-%d"
    _pieces: tuple = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.template, str):
            raise bad_arg("template", "a str such as " + repr(DEFAULT_TEMPLATE), type(self.template).__name__,
                          MemkernTypeError)
        if self.date_format is not None and not isinstance(self.date_format, str):
            raise bad_arg("date_format", "a strftime pattern or None", self.date_format, MemkernTypeError)
        try:
            parsed = list(string.Formatter().parse(self.template))
        except ValueError as e:
            raise bad_arg("template", f"a str.format pattern ({e})", self.template) from None
        seq: list[tuple[str, str]] = []  # ("lit", text) / ("field", name)
        for lit, name, spec, conv in parsed:
            if lit:
                seq.append(("lit", lit))
            if name is None:
                continue
            if name not in TEMPLATE_FIELDS or spec or conv:
                raise bad_arg("template", f"plain fields from {TEMPLATE_FIELDS}", self.template)
            seq.append(("field", name))
        if ("field", "content") not in seq:
            raise bad_arg("template", "a pattern containing {content}", self.template)
        # Each field takes the non-blank characters right before it and, after it, everything up to
        # and including the next run of blanks: "[" + date + "] ", speaker + ": ".
        pieces: list[tuple[str | None, str, str]] = []  # (field or None, prefix/literal, suffix)
        pending = ""
        i = 0
        while i < len(seq):
            kind, val = seq[i]
            if kind == "lit":
                nxt = seq[i + 1] if i + 1 < len(seq) else None
                if nxt is not None and nxt[0] == "field":
                    m = re.search(r"\S*$", val)
                    head, pre = val[: m.start()], val[m.start():]
                    if head:
                        pieces.append((None, pending + head, ""))
                    elif pending:
                        pieces.append((None, pending, ""))
                    pending = pre
                else:
                    pieces.append((None, pending + val, ""))
                    pending = ""
                i += 1
                continue
            suffix = ""
            if i + 1 < len(seq) and seq[i + 1][0] == "lit":
                lit = seq[i + 1][1]
                m = re.match(r"\S*\s*", lit)
                suffix, rest = lit[: m.end()], lit[m.end():]
                seq[i + 1] = ("lit", rest)
            pieces.append((val, pending, suffix))
            pending = ""
            i += 1
        if pending:
            pieces.append((None, pending, ""))
        object.__setattr__(self, "_pieces", tuple(p for p in pieces if p[0] is not None or p[1]))

    # ------------------------------------------------------------------ rendering
    def format_date(self, value: Any) -> str | None:
        """``value`` as shown in text (``date_format`` for recognised dates); ``None`` when missing."""
        if value is None or (isinstance(value, str) and not value.strip()):
            return None
        if self.date_format is not None:
            d = parse_date(value)
            if d is not None:
                return d.strftime(self.date_format)
        return " ".join(str(value).split())

    def render(self, content: str, speaker: str | None = None, date: Any = None, role: str | None = None) -> str:
        """One turn's text, e.g. ``"[2023-05-08] Caroline: I'm moving!"`` (missing fields dropped)."""
        values = {"content": " ".join(str(content).split()), "speaker": _clean(speaker),
                  "date": self.format_date(date), "role": _clean(role)}
        out = []
        for name, pre, suf in self._pieces:
            if name is None:
                out.append(pre)
            elif values[name]:
                out.append(pre + values[name] + suf)
        return "".join(out).strip()

    def render_turn(self, turn: Mapping[str, Any], date: Any = None) -> str:
        """A turn dict (``content``; optional ``speaker``, ``role``, ``date`` / ``timestamp``) as
        text; ``date`` is the session's date, used when the turn has none of its own."""
        return self.render(turn.get("content", ""), turn.get("speaker"), turn_date(turn, date), turn.get("role"))

    def render_turns(self, turns: Sequence[Mapping[str, Any]], date: Any = None) -> list[str]:
        """:meth:`render_turn` of each turn."""
        return [self.render_turn(t, date) for t in turns]

    def render_block(self, turns: Sequence[Mapping[str, Any]], date: Any = None) -> str:
        """Several turns of one session as one text: one line per turn, the date shown once
        (on the first line; later lines show it only when it changes)."""
        lines, last = [], None
        for t in turns:
            d = self.format_date(turn_date(t, date))
            shown = d if d != last else None
            last = d if d is not None else last
            lines.append(self.render(t.get("content", ""), t.get("speaker"), shown, t.get("role")))
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"template": self.template, "date_format": self.date_format}


def _clean(v: Any) -> str | None:
    if v is None:
        return None
    s = " ".join(str(v).split())
    return s or None


PLAIN = TurnTemplate("{content}")
"""Content only (what the evaluation embedded before issue 13)."""


def default_template(template: TurnTemplate | str | None = None) -> TurnTemplate:
    """``template`` as a :class:`TurnTemplate` (a str is a pattern; ``None``: the default)."""
    if template is None:
        return TurnTemplate()
    if isinstance(template, TurnTemplate):
        return template
    if isinstance(template, str):
        return TurnTemplate(template)
    raise bad_arg("template", "a memkern.text.template.TurnTemplate, a pattern str or None", type(template).__name__,
                  MemkernTypeError)
