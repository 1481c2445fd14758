"""Random values at memkern's edge, from one ``random.Random``: *accepted* ones (within every bound
of :mod:`memkern.base.validate`, the extremes included) and *hostile* ones (just past a bound, or of a
kind no bound admits).

Used by the attack classes and by the bounds property tests (``tests/base/test_edge_bounds.py``); the
HTTP / MCP tests can draw from the same functions: :func:`accepted_memory` gives one memory's worth
of accepted fields (text, turns, meta, date, query, ids), :func:`hostile_value` a hostile value for
a named field, and :func:`assert_renders` checks that a record read back renders (JSON, ISO 8601
times) the way a server response does.
"""
from __future__ import annotations

import datetime as dt
import json
import math
import random
from typing import Any

from memkern.base import validate as V

# Characters that stress text handling: astral (4-byte UTF-8), combining, RTL, zero-width, control,
# NUL, the largest code point, the BOM, quotes and backslashes (JSON escapes), line separators.
_SPECIAL = ["\U0001F600", "\U00010348", "e\u0301", "\u05d0\u05d1", "\u200b", "\u202e", "\x00", "\x1f", "\x7f",
            "\U0010FFFF", "\ufeff", '"', "\\", "\u2028", "\n", "\t", "\r", "ß", "İ", "ﬃ", "中文", " "]
_WORDS = ["tea", "cats", "Lisbon", "nurse", "hiking", "Porto", "baker", "memory", "2023", "x"]


def accepted_text(rng: random.Random, max_chars: int = V.MAX_TEXT_CHARS, *, nonblank: bool = False,
                  long: float = 0.02) -> str:
    """A str memkern accepts as text of at most ``max_chars`` characters: words mixed with special
    characters; with probability ``long`` exactly ``max_chars`` characters long."""
    if rng.random() < long:
        base = "".join(rng.choice(_SPECIAL + _WORDS) for _ in range(8)) or "x"
        text = (base * (max_chars // len(base) + 1))[:max_chars]
    else:
        n = rng.choice([0, 1, 2, 5, 20, 80])
        text = " ".join(rng.choice(_WORDS) + (rng.choice(_SPECIAL) if rng.random() < 0.4 else "") for _ in range(n))
        text = text[:max_chars]
    if nonblank and not text.strip():
        text = rng.choice(_WORDS)[: max(1, max_chars)]
    return text


def accepted_name(rng: random.Random) -> str:
    """A role / speaker: 1..MAX_NAME_CHARS characters."""
    if rng.random() < 0.05:
        return ("Ω" * V.MAX_NAME_CHARS)
    return rng.choice(["user", "assistant", "system", "Caroline", "Melanie", "Dr. ☕", "a" * rng.randint(1, 40)])


def accepted_id(rng: random.Random) -> str:
    """A str id (session, turn, key, user): 1..MAX_ID_CHARS characters."""
    if rng.random() < 0.05:
        return "k" * V.MAX_ID_CHARS
    return rng.choice(["s1", "D1:3", "alice", "user-42", "🙂", "a/b", "x" * rng.randint(1, 60)])


def accepted_time(rng: random.Random) -> float:
    """Unix seconds in [MIN_TIME, MAX_TIME], the bounds themselves included."""
    r = rng.random()
    if r < 0.15:
        return rng.choice([V.MIN_TIME, V.MAX_TIME, 0.0, -0.0, V.MAX_TIME - 0.5, V.MIN_TIME + 1e-3])
    if r < 0.5:
        return rng.uniform(1.0e9, 1.9e9)  # this century
    return rng.uniform(V.MIN_TIME, V.MAX_TIME)


_MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December"]
_DAYS = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]


def accepted_date(rng: random.Random) -> Any:
    """A session date :func:`memkern.text.template.event_seconds` reads: unix seconds (int / float),
    ISO 8601 (with or without an offset), LoCoMo and LongMemEval strings, datetime / date objects
    (years written with 4 digits, as those formats have them)."""
    t = accepted_time(rng)
    d = dt.datetime.fromtimestamp(t, dt.timezone.utc)
    ymd = f"{d.year:04d}-{d.month:02d}-{d.day:02d}"
    kind = rng.randrange(8)
    if kind == 0:
        return t
    if kind == 1:
        return int(t)
    if kind == 2:
        return ymd
    if kind == 3:
        return d.replace(tzinfo=None).isoformat()
    if kind == 4:
        return d.isoformat()
    if kind == 5:
        h = d.hour % 12 or 12
        return f"{h}:{d.minute:02d} {'am' if d.hour < 12 else 'pm'} on {d.day} {_MONTHS[d.month - 1]}, {d.year:04d}"
    if kind == 6:
        return f"{d.year:04d}/{d.month:02d}/{d.day:02d} ({_DAYS[d.weekday()]}) {d.hour:02d}:{d.minute:02d}"
    return d if rng.random() < 0.5 else d.date()


def accepted_json(rng: random.Random, depth: int = 0, max_depth: int = V.MAX_JSON_DEPTH - 1) -> Any:
    """A JSON value within the stored-value bounds (keys, ints within int64, finite floats, UTF-8)."""
    r = rng.random()
    if depth < max_depth and r < 0.25:
        if rng.random() < 0.5:
            return [accepted_json(rng, depth + 1, max_depth) for _ in range(rng.randint(0, 3))]
        return {accepted_key(rng): accepted_json(rng, depth + 1, max_depth) for _ in range(rng.randint(0, 3))}
    return accepted_scalar(rng)


def accepted_key(rng: random.Random) -> str:
    if rng.random() < 0.05:
        return "κ" * V.MAX_KEY_CHARS
    return rng.choice(["a", "user_id", "date", "ключ", "🙂", "", "$x", "a.b", "k" * rng.randint(1, 30)])


def accepted_scalar(rng: random.Random) -> Any:
    return rng.choice([
        None, True, False, 0, -1, V.MAX_JSON_INT, -V.MAX_JSON_INT, 2 ** 53 + 1, rng.randint(-10 ** 6, 10 ** 6),
        0.5, -0.0, 1e308, -1e308, 5e-324, rng.uniform(-1e6, 1e6), accepted_text(rng, 200), "", "1", "true"])


def accepted_meta(rng: random.Random) -> dict:
    """A record's ``meta``: a dict of accepted JSON values; now and then the widest / deepest."""
    r = rng.random()
    if r < 0.03:
        return {f"k{i}": i for i in range(V.MAX_OBJECT_KEYS)}
    if r < 0.06:
        v: Any = "leaf"
        for _ in range(V.MAX_JSON_DEPTH - 1):
            v = [v]
        return {"deep": v}
    return {accepted_key(rng): accepted_json(rng, 1) for _ in range(rng.randint(0, 5))}


def accepted_turn(rng: random.Random) -> dict:
    """A dialogue turn: role, content, maybe speaker and extra JSON keys."""
    t = {"role": accepted_name(rng), "content": accepted_text(rng, 2000, long=0.0)}
    if rng.random() < 0.5:
        t["speaker"] = accepted_name(rng)
    if rng.random() < 0.3:
        t[rng.choice(["mood", "turn_id", "x"])] = accepted_json(rng, 1, 4)
    return t


def accepted_namespace(rng: random.Random) -> str:
    """A store namespace (not necessarily a file-safe name): 1..MAX_NAMESPACE_CHARS characters."""
    if rng.random() < 0.05:
        return "n" * V.MAX_NAMESPACE_CHARS
    return rng.choice(["alice", "u:bob/a:x", "ns with spaces", "ñ", "🙂", "a" * rng.randint(1, 50)])


def accepted_query(rng: random.Random) -> str:
    return accepted_text(rng, V.MAX_QUERY_CHARS, nonblank=True, long=0.02)


def accepted_memory(rng: random.Random) -> dict:
    """One memory's worth of accepted fields: ``text``, ``turns``, ``meta``, ``date`` (a date value),
    ``event_time`` (float seconds), ``query``, ``namespace``, ``id``, ``reason``."""
    return {"text": accepted_text(rng, nonblank=True), "turns": [accepted_turn(rng) for _ in range(rng.randint(0, 3))],
            "meta": accepted_meta(rng), "date": accepted_date(rng), "event_time": accepted_time(rng),
            "query": accepted_query(rng), "namespace": accepted_namespace(rng), "id": accepted_id(rng),
            "reason": accepted_text(rng, 300)}


# ----------------------------------------------------------------------------------- hostile


def huge_int(rng: random.Random) -> int:
    """An int past every bound: 20 to 6,000 digits, either sign (its repr may exceed Python's
    4,300-digit conversion limit)."""
    digits = rng.choice([20, 25, 41, 400, 4301, 5000, 6000])
    v = 10 ** (digits - 1) + rng.randrange(10 ** 6)
    return v if rng.random() < 0.7 else -v


def huge_int_literal(rng: random.Random) -> str:
    """A JSON int literal of 41 to 6,000 digits (for files)."""
    return ("-" if rng.random() < 0.3 else "") + "9" * rng.choice([41, 400, 4301, 5000, 6000])


def deep_json(depth: int, kind: str = "list") -> str:
    """JSON text nested ``depth`` levels (lists or objects), built without recursion."""
    if kind == "list":
        return "[" * depth + "]" * depth
    return '{"a":' * depth + "1" + "}" * depth


def deep_value(depth: int, kind: str = "list") -> Any:
    v: Any = 1
    for _ in range(depth):
        v = [v] if kind == "list" else {"a": v}
    return v


def surrogate(rng: random.Random) -> str:
    return chr(rng.randrange(0xD800, 0xE000))


def hostile_time(rng: random.Random) -> Any:
    """A time no route may accept (out of range, not finite, not a number)."""
    return rng.choice([
        V.MAX_TIME + 1, V.MIN_TIME - 1, 5e11, 1e12, -1e13, 1e300, math.inf, -math.inf, math.nan, huge_int(rng),
        253402300800, True, "5e11", [1.7e9], {"t": 1}, b"1700000000", object()])


def hostile_date_string(rng: random.Random) -> str:
    return rng.choice([
        "garbage date", "99999-01-01", "10000-01-01", "0000-12-31", "2023-13-01", "2023-02-30", "9999999999999",
        "-1e20", "1e400", "NaN", "inf", "", "   ", "9999-12-31T23:59:59-01:00", "0001-01-01T00:00:00+01:00",
        "2023-05-08" + surrogate(rng), "x" * 5000, "12:00 pm on 31 December, 99999", "2023/05/20 (Sat) 25:61"])


def hostile_text(rng: random.Random, max_chars: int = V.MAX_TEXT_CHARS) -> Any:
    """A text past a bound: a lone surrogate somewhere, too long, or not a str."""
    r = rng.random()
    if r < 0.5:
        base = accepted_text(rng, 100, nonblank=True)
        i = rng.randint(0, len(base))
        return base[:i] + surrogate(rng) + base[i:]
    if r < 0.7:
        return "a" * (max_chars + 1)
    return rng.choice([b"bytes", 7, 7.5, None, ["a"], {"a": 1}, True])


def hostile_json(rng: random.Random) -> Any:
    """A meta / turn value past a bound (depth, keys, key size, ints, NaN, types, UTF-8)."""
    return rng.choice([
        deep_value(V.MAX_JSON_DEPTH + 1), deep_value(rng.choice([100, 3000]), "dict"),
        {f"k{i}": i for i in range(V.MAX_OBJECT_KEYS + 1)}, {"k" * (V.MAX_KEY_CHARS + 1): 1},
        {"n": huge_int(rng)}, {"n": 2 ** 63}, {"f": math.nan}, {"f": math.inf}, {1: "int key"}, {"s": {1, 2}},
        {"b": b"bytes"}, {surrogate(rng): 1}, {"v": "a" + surrogate(rng)}, {"o": object()},
        {"t": ("tuple", math.nan)}, {"long": "x" * (V.MAX_TEXT_CHARS + 1)}])


def hostile_value(rng: random.Random, field: str) -> Any:
    """A hostile value for ``field``: ``"text"``, ``"query"``, ``"role"``, ``"meta"``, ``"date"``,
    ``"time"``, ``"id"``, ``"namespace"``, ``"k"``."""
    if field in ("text", "reason"):
        return hostile_text(rng)
    if field == "query":
        return hostile_text(rng, V.MAX_QUERY_CHARS)
    if field in ("role", "speaker"):
        return hostile_text(rng, V.MAX_NAME_CHARS)
    if field == "id":
        return hostile_text(rng, V.MAX_ID_CHARS)
    if field == "namespace":
        return rng.choice(["", hostile_text(rng, V.MAX_NAMESPACE_CHARS)])
    if field == "meta":
        return hostile_json(rng)
    if field == "date":
        return rng.choice([hostile_time(rng), hostile_date_string(rng)])
    if field == "time":
        return hostile_time(rng)
    if field == "k":
        return rng.choice([0, -1, huge_int(rng), 2 ** 63, True, 1.5, "3", None, math.nan])
    raise ValueError(f"unknown field {field!r}")


# ----------------------------------------------------------------------------------- reading back


def assert_renders(record: Any) -> dict:
    """A record read back (a :class:`memkern.store.Record` or a mapping with its fields) rendered
    as a server would: JSON text of its fields, every time as ISO 8601
    (:func:`memkern.base.validate.iso_time` must not give ``None`` for a time the API accepted).
    Returns the rendered dict; raises ``AssertionError`` naming the field otherwise."""
    get = (lambda k: record.get(k)) if isinstance(record, dict) else (lambda k: getattr(record, k, None))
    out: dict = {}
    for key in ("created_at", "updated_at", "event_time"):
        t = get(key)
        if t is None:
            continue
        iso = V.iso_time(t)
        assert iso is not None, f"{key}: {t!r} does not render as ISO 8601"
        back = dt.datetime.fromisoformat(iso).timestamp()
        assert abs(back - float(t)) <= 1e-4, f"{key}: {t!r} renders as {iso}"
        out[key] = iso
    for key in ("summary", "text", "memory", "turns", "meta", "metadata", "invalidated_reason", "namespace"):
        v = get(key)
        if v is not None:
            out[key] = v
    text = json.dumps(out, ensure_ascii=False, allow_nan=False)
    text.encode("utf-8")  # no lone surrogate anywhere
    return json.loads(text)
