"""Argument checks: the one place where memkern tests a scalar argument's type and range.

Each check returns the value (as a plain ``int`` / ``float``) or raises the error of
:func:`memkern.errors.bad_arg`, ``"<name>: expected <expected>, got <got>"``, derived from
:class:`memkern.MemkernError`. The ``expected`` text defaults to a description of the bounds and
can be given where an older message must stay word for word.

Conventions shared by all checks:

- ``bool`` (and ``numpy.bool_``) is never an int or a float, although Python says it is;
- ``numpy`` integers count as ints and ``numpy`` floats as floats (returned as Python numbers);
- NaN fails every float check (no bound comparison holds for it);
- a value of the wrong type raises :class:`memkern.MemkernValueError` with the value itself as
  ``got`` unless ``type_error=True``, which raises :class:`memkern.MemkernTypeError` with the
  type's name (the store's convention);
- ``none_ok=True`` lets ``None`` through (returned as ``None``).

Bounds at the API edge
----------------------
One set of bounds for every way in (the Python store and RMM API, the HTTP and MCP servers,
``memkern import``, ``memkern ingest``, the framework adapters), chosen so that every accepted
value can be read back through every read route:

==========================  =========================================================
dates (event, range, now)   :data:`MIN_TIME` .. :data:`MAX_TIME` unix seconds: years 1-9999 UTC,
                            the range ISO 8601 renders (:func:`iso_time` never fails on it)
texts                       :data:`MAX_TEXT_CHARS` (summary, turn content, reason, str values
                            in meta); queries :data:`MAX_QUERY_CHARS`
names                       :data:`MAX_NAME_CHARS` (a turn's ``role`` / ``speaker``),
                            :data:`MAX_ID_CHARS` (str ids: session, turn, key, user / agent /
                            run ids), :data:`MAX_NAMESPACE_CHARS`
JSON values (meta, turns)   :data:`MAX_JSON_DEPTH` deep, :data:`MAX_OBJECT_KEYS` keys of at most
                            :data:`MAX_KEY_CHARS` per object, ints within int64, finite floats,
                            :data:`MAX_JSON_BYTES` serialized
JSON documents (files)      :data:`MAX_DOCUMENT_DEPTH` deep, ints of at most
                            :data:`MAX_INT_DIGITS` digits, no NaN / Infinity
text everywhere             valid UTF-8 (no lone surrogates)
==========================  =========================================================

:func:`check_time`, :func:`check_text`, :func:`check_utf8`, :func:`check_json`,
:func:`json_text`, :func:`check_turn` and :func:`parse_json` apply them; :func:`iso_time` renders
a time.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
from typing import Any, Collection, Mapping

import numpy as np

from ..errors import MemkernError, MemkernTypeError, MemkernValueError, bad_arg

__all__ = ["check_int", "check_float", "check_choice", "check_str", "is_int", "is_real",
           "check_time", "check_text", "check_utf8", "check_namespace_str", "check_id", "check_json", "json_text", "check_turn", "parse_json",
           "iso_time", "short", "MIN_TIME", "MAX_TIME", "TIME_RANGE_TEXT", "MAX_TEXT_CHARS", "MAX_QUERY_CHARS",
           "MAX_NAME_CHARS", "MAX_ID_CHARS", "MAX_NAMESPACE_CHARS", "MAX_JSON_DEPTH", "MAX_OBJECT_KEYS",
           "MAX_KEY_CHARS", "MAX_JSON_BYTES", "MAX_JSON_INT", "MAX_DOCUMENT_DEPTH", "MAX_INT_DIGITS",
           "MAX_FILTER_DEPTH"]

#: Earliest time (unix seconds) memkern accepts: 0001-01-01T00:00:00Z.
MIN_TIME = -62135596800.0
#: Latest time (unix seconds) memkern accepts: 9999-12-31T23:59:59Z. Every ``t`` in
#: ``[MIN_TIME, MAX_TIME]`` renders as ISO 8601 (:func:`iso_time`). The native store checks the
#: same two numbers (``kMinTime`` / ``kMaxTime``).
MAX_TIME = 253402300799.0
#: The time bound as error messages show it.
TIME_RANGE_TEXT = "unix seconds in [-62135596800, 253402300799] (years 1-9999 UTC)"
#: Largest text (characters): a summary, a turn's content, an invalidation reason, a str in meta.
MAX_TEXT_CHARS = 1 << 20
#: Largest query text (characters).
MAX_QUERY_CHARS = 1 << 16
#: Largest ``role`` / ``speaker`` of a turn (characters).
MAX_NAME_CHARS = 256
#: Largest str id (characters): session and turn ids, adapter keys, user / agent / run ids.
MAX_ID_CHARS = 512
#: Largest namespace name (characters) a store takes (file-backed names are stricter:
#: :data:`memkern.base.paths.NAMESPACE_PATTERN`).
MAX_NAMESPACE_CHARS = 1024
#: Deepest nesting of a stored JSON value (``meta``, turn dicts; a dict or list inside another
#: counts one level).
MAX_JSON_DEPTH = 32
#: Most keys of one JSON object in a stored value, and longest key (characters).
MAX_OBJECT_KEYS = 1024
MAX_KEY_CHARS = 256
#: Largest stored JSON value, serialized (UTF-8 bytes).
MAX_JSON_BYTES = 1 << 24
#: Largest |int| in a stored JSON value (int64).
MAX_JSON_INT = (1 << 63) - 1
#: Deepest nesting of a JSON document memkern reads (an import line, a session file).
MAX_DOCUMENT_DEPTH = 64
#: Most digits of an int literal in a JSON document memkern reads.
MAX_INT_DIGITS = 40
#: Deepest nesting of an adapter filter (``$and`` / ``$or`` / ``$not``, mem0 ``AND`` / ``OR``,
#: LlamaIndex ``MetadataFilters``).
MAX_FILTER_DEPTH = 32


def is_int(value: Any) -> bool:
    """Whether ``value`` is an int for memkern: ``int`` or a numpy integer, not a bool."""
    if type(value) is int:  # fast path (argument checks run on every call of the hot ops)
        return True
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def is_real(value: Any) -> bool:
    """Whether ``value`` is a real number for memkern: int, float or numpy number, not a bool."""
    if type(value) is float or type(value) is int:  # fast path
        return True
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def _int_expected(low: int | None, high: int | None) -> str:
    if low is not None and high is not None:
        return f"an int in {low}..{high}"
    if low is not None:
        return f"an int >= {low}"
    if high is not None:
        return f"an int <= {high}"
    return "an int"


def check_int(name: str, value: Any, low: int | None = None, high: int | None = None, *,
              expected: str | None = None, none_ok: bool = False, type_error: bool = False,
              error: type[MemkernError] = MemkernValueError) -> Any:
    """``value`` as an ``int`` if it is an int (:func:`is_int`) in ``low..high`` (inclusive;
    ``None``: unbounded), else an error naming ``name``.

    Parameters
    ----------
    name : str
        The argument's name, as the caller spells it.
    value : Any
    low, high : int or None
        Inclusive bounds.
    expected : str, optional
        The message's "expected" text (default: ``"an int >= low"``, ``"an int in low..high"``,
        ...; with ``none_ok`` the default gains ``" or None"``).
    none_ok : bool
        Accept ``None`` (returned as ``None``).
    type_error : bool
        A non-int raises :class:`~memkern.MemkernTypeError` with its type name (default: a
        :class:`~memkern.MemkernValueError` with the value).
    error : type
        The class of the value error (a :class:`~memkern.MemkernValueError` subclass, e.g. a
        loader's :class:`~memkern.data.schema.DatasetFormatError`).

    Returns
    -------
    int or None
    """
    if value is None and none_ok:
        return None
    if is_int(value):
        v = int(value)
        if (low is None or v >= low) and (high is None or v <= high):
            return v  # the common case: no message is built
    if expected is None:
        expected = _int_expected(low, high) + (" or None" if none_ok else "")
    if not is_int(value):
        if type_error:
            raise bad_arg(name, expected, type(value).__name__, MemkernTypeError)
        raise bad_arg(name, expected, value, error)
    raise bad_arg(name, expected, short(int(value)) if type_error else short(value), error)


def check_float(name: str, value: Any, low: float | None = None, high: float | None = None, *,
                low_open: bool = False, high_open: bool = False, finite: bool = False,
                expected: str | None = None, none_ok: bool = False, type_error: bool = False) -> Any:
    """``value`` as a ``float`` if it is a real number (:func:`is_real`, not NaN) within the
    bounds, else an error naming ``name``.

    Parameters
    ----------
    name : str
    value : Any
    low, high : float or None
        Bounds, inclusive unless ``low_open`` / ``high_open``; ``None``: unbounded.
    finite : bool
        Also reject ``inf`` and ``-inf``.
    expected : str, optional
        The message's "expected" text (default: ``"a float"``, ``"a finite float"``, with the
        bounds, e.g. ``"a float in (0, 1]"`` or ``"a float >= 0"``).
    none_ok, type_error : bool
        As in :func:`check_int`.

    Returns
    -------
    float or None
    """
    if value is None and none_ok:
        return None
    real = is_real(value)
    if real:
        try:
            v = float(value)
        except OverflowError:  # an int past float range: +-inf for the bound checks
            v = math.inf if value > 0 else -math.inf
        ok = not math.isnan(v) and (not finite or math.isfinite(v))
        if ok and low is not None:
            ok = v > low if low_open else v >= low
        if ok and high is not None:
            ok = v < high if high_open else v <= high
        if ok:
            return v  # the common case: no message is built
    if expected is None:
        expected = "a finite float" if finite else "a float"
        if low is not None and high is not None:
            expected += f" in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        elif low is not None:
            expected += f" {'>' if low_open else '>='} {low:g}"
        elif high is not None:
            expected += f" {'<' if high_open else '<='} {high:g}"
        if none_ok:
            expected += " or None"
    if not real and type_error:
        raise bad_arg(name, expected, type(value).__name__, MemkernTypeError)
    raise bad_arg(name, expected, short(value))


def check_choice(name: str, value: Any, choices: Collection[Any], *, expected: str | None = None) -> Any:
    """``value`` if it is one of ``choices`` (compared with ``==``), else a
    :class:`~memkern.MemkernValueError` naming ``name`` (default expected text:
    ``"'a', 'b' or 'c'"``)."""
    try:
        ok = any(value is c or (isinstance(value, type(c)) and bool(value == c)) for c in choices)
    except Exception:  # e.g. an array compared with a str
        ok = False
    if not ok:
        if expected is None:
            reprs = [repr(c) for c in choices]
            expected = reprs[0] if len(reprs) == 1 else ", ".join(reprs[:-1]) + " or " + reprs[-1]
        raise bad_arg(name, expected, value)
    return value


def check_str(name: str, value: Any, *, nonempty: bool = False, expected: str | None = None,
              type_error: bool = False) -> str:
    """``value`` if it is a ``str`` (non-blank with ``nonempty``), else an error naming ``name``
    (:class:`~memkern.MemkernValueError`, or :class:`~memkern.MemkernTypeError` with the type's
    name for a non-str when ``type_error``)."""
    if expected is None:
        expected = "a non-empty str" if nonempty else "a str"
    if not isinstance(value, str):
        if type_error:
            raise bad_arg(name, expected, type(value).__name__, MemkernTypeError)
        raise bad_arg(name, expected, value)
    if nonempty and not value.strip():
        raise bad_arg(name, expected, value, MemkernValueError)
    return value


# ----------------------------------------------------------------------------------- the edge bounds


def check_utf8(s: str, name: str) -> str:
    """``s`` if it encodes as UTF-8 (no lone surrogates), else a
    :class:`~memkern.MemkernValueError` naming ``name`` and the index."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise bad_arg(name, "a str encodable as UTF-8 (no lone surrogates)",
                      f"{s[e.start:e.end]!r} at index {e.start}") from None
    return s


def check_text(name: str, value: Any, *, max_chars: int = MAX_TEXT_CHARS, nonempty: bool = False,
               none_ok: bool = False, type_error: bool = True) -> Any:
    """``value`` if it is a ``str`` of at most ``max_chars`` characters, valid UTF-8 (non-blank with
    ``nonempty``), else an error naming ``name`` (a non-str: :class:`~memkern.MemkernTypeError`
    with its type name, or a :class:`~memkern.MemkernValueError` without ``type_error``)."""
    if value is None and none_ok:
        return None
    if not isinstance(value, str):
        exp = "a non-empty str" if nonempty else "a str"
        raise bad_arg(name, exp, type(value).__name__, MemkernTypeError if type_error else MemkernValueError)
    if len(value) > max_chars:
        raise bad_arg(name, f"a str of at most {max_chars} characters", f"{len(value)} characters")
    if nonempty and not value.strip():
        raise bad_arg(name, "a non-empty str", value)
    return check_utf8(value, name)


def check_namespace_str(value: Any, name: str = "namespace") -> str:
    """A store namespace: a non-empty str (:class:`~memkern.MemkernTypeError` for a non-str) of at
    most :data:`MAX_NAMESPACE_CHARS` characters, valid UTF-8. (Names that become file names follow
    the stricter :func:`memkern.base.paths.check_namespace`.)"""
    if not isinstance(value, str):
        raise bad_arg(name, "a non-empty str", type(value).__name__, MemkernTypeError)
    if not value:
        raise bad_arg(name, "a non-empty str", value)
    return check_text(name, value, max_chars=MAX_NAMESPACE_CHARS)


def check_id(name: str, value: Any) -> str:
    """A caller's id (a session id, a turn id) as a str: a non-empty str of at most
    :data:`MAX_ID_CHARS` characters (valid UTF-8), or an int (not bool) of at most 40 digits,
    converted; else an error naming ``name``."""
    if is_int(value):
        v = int(value)
        if abs(v) < 10 ** MAX_INT_DIGITS:
            return str(v)
        raise bad_arg(name, f"a str id or an int of at most {MAX_INT_DIGITS} digits", short(v))
    if not isinstance(value, str):
        raise bad_arg(name, "a str or int id", type(value).__name__, MemkernTypeError)
    return check_text(name, value, max_chars=MAX_ID_CHARS, nonempty=True)


def check_time(name: str, value: Any, *, none_ok: bool = False, type_error: bool = True,
               error: type[MemkernError] = MemkernValueError) -> Any:
    """``value`` (unix seconds: int, float or numpy number, not bool) as a ``float`` in
    ``[MIN_TIME, MAX_TIME]`` (years 1-9999 UTC), else an error naming ``name``. An int of any size
    is compared before it is converted (no ``OverflowError``); NaN and inf fail.

    Returns
    -------
    float or None
    """
    if value is None and none_ok:
        return None
    if type(value) is float or (is_real(value) and not isinstance(value, int)):
        v = float(value)
        if MIN_TIME <= v <= MAX_TIME:  # also False for NaN
            return v
    elif is_int(value):
        iv = int(value)
        if MIN_TIME <= iv <= MAX_TIME:  # int vs float compares exactly, any size
            return float(iv)
        raise bad_arg(name, TIME_RANGE_TEXT + (" or None" if none_ok else ""), short(iv), error)
    else:
        exp = TIME_RANGE_TEXT + (" or None" if none_ok else "")
        raise bad_arg(name, exp, type(value).__name__ if type_error else value,
                      MemkernTypeError if type_error else error)
    raise bad_arg(name, TIME_RANGE_TEXT + (" or None" if none_ok else ""), value, error)


def iso_time(t: Any) -> str | None:
    """``t`` (unix seconds) as ISO 8601 in UTC, e.g. ``"2023-05-08T13:56:00+00:00"``; ``None`` for
    ``None``, NaN, or a time outside ``[MIN_TIME, MAX_TIME]`` (only a store written before these
    bounds can hold one). Never raises for a number."""
    if t is None:
        return None
    try:
        v = float(t)
    except (TypeError, ValueError, OverflowError):
        return None
    if not MIN_TIME <= v <= MAX_TIME:
        return None
    return _dt.datetime.fromtimestamp(v, tz=_dt.timezone.utc).isoformat()


def short(v: Any) -> Any:
    """A value as an error message shows it: an int past 30 digits by its size (``repr`` of an
    int past 4,300 digits raises in Python)."""
    if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > 100:
        return f"an int of about {int(v.bit_length() * 0.30103) + 1} digits"
    return v


def check_json(value: Any, name: str) -> None:
    """What a record's ``meta`` / turn dicts may hold: dicts with str keys (at most
    :data:`MAX_OBJECT_KEYS` keys of at most :data:`MAX_KEY_CHARS` characters), lists / tuples,
    UTF-8 str of at most :data:`MAX_TEXT_CHARS` characters, ints within int64, finite floats,
    bools and None, nested at most :data:`MAX_JSON_DEPTH` deep. Walks ``value`` iteratively (no
    recursion) and raises an error naming the offending path (e.g. ``meta['a'][0]``) instead of
    letting ``json.dumps`` rename keys (``{1: x}`` -> ``{"1": x}``) or hit ``RecursionError``."""
    stack = [(value, name, 0)]
    while stack:
        v, path, depth = stack.pop()
        if isinstance(v, str):
            if len(v) > MAX_TEXT_CHARS:
                raise bad_arg(path, f"a str of at most {MAX_TEXT_CHARS} characters", f"{len(v)} characters")
            check_utf8(v, path)
        elif v is None or isinstance(v, bool):
            pass
        elif isinstance(v, int):
            if not -MAX_JSON_INT <= v <= MAX_JSON_INT:
                raise bad_arg(path, "an int within int64 (|v| <= 2**63-1)", short(v))
        elif isinstance(v, float):
            if not math.isfinite(v):
                raise bad_arg(path, "a finite number (JSON has no NaN/inf)", v, MemkernTypeError)
        elif isinstance(v, (dict, list, tuple)):
            if depth >= MAX_JSON_DEPTH:
                raise bad_arg(name, f"JSON nested at most {MAX_JSON_DEPTH} levels deep",
                              f"deeper nesting at {path}")
            if isinstance(v, dict):
                if len(v) > MAX_OBJECT_KEYS:
                    raise bad_arg(path, f"an object of at most {MAX_OBJECT_KEYS} keys", f"{len(v)} keys")
                for key, item in v.items():
                    if not isinstance(key, str):
                        raise bad_arg(path, "str keys (JSON objects have only str keys)",
                                      f"key {key!r} of type {type(key).__name__}", MemkernTypeError)
                    if len(key) > MAX_KEY_CHARS:
                        raise bad_arg(f"{path} key", f"a key of at most {MAX_KEY_CHARS} characters",
                                      f"{len(key)} characters")
                    check_utf8(key, f"{path} key")
                    stack.append((item, f"{path}[{key!r}]", depth + 1))
            else:
                for i, item in enumerate(v):
                    stack.append((item, f"{path}[{i}]", depth + 1))
        else:
            raise bad_arg(path, "JSON-compatible values (dict, list, str, int, float, bool, None)",
                          type(v).__name__, MemkernTypeError)


def json_text(value: Any, name: str) -> str:
    """``value`` checked (:func:`check_json`) and serialized compactly (UTF-8 kept), at most
    :data:`MAX_JSON_BYTES` bytes."""
    if value is None or (type(value) in (list, dict) and not value):  # the common empty cases
        return "null" if value is None else ("[]" if type(value) is list else "{}")
    check_json(value, name)
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as e:
        raise bad_arg(name, "JSON-compatible values (str keys, no NaN)", f"{e}", MemkernTypeError) from None
    if len(text) > MAX_JSON_BYTES // 4 and len(text.encode("utf-8")) > MAX_JSON_BYTES:
        raise bad_arg(name, f"at most {MAX_JSON_BYTES} bytes as JSON", f"{len(text.encode('utf-8'))} bytes")
    return text


def check_turn(turn: Any, name: str) -> dict:
    """One dialogue turn: a dict with str ``role`` (1..:data:`MAX_NAME_CHARS` characters) and str
    ``content`` (at most :data:`MAX_TEXT_CHARS`), an optional str ``speaker`` (at most
    :data:`MAX_NAME_CHARS`), every value JSON as :func:`check_json` takes it. Returns ``turn``."""
    if not isinstance(turn, Mapping):
        raise bad_arg(name, "a dict with 'role' and 'content'", type(turn).__name__, MemkernTypeError)
    for key in ("role", "content"):
        if key not in turn:
            raise bad_arg(name, f"a dict with a '{key}' key", sorted(map(str, turn))[:8])
        if not isinstance(turn[key], str):
            raise bad_arg(f"{name}['{key}']", "a str", type(turn[key]).__name__, MemkernTypeError)
    check_text(f"{name}['role']", turn["role"], max_chars=MAX_NAME_CHARS)
    check_text(f"{name}['content']", turn["content"])
    if turn.get("speaker") is not None:
        check_text(f"{name}['speaker']", turn["speaker"], max_chars=MAX_NAME_CHARS)
    check_json(turn if isinstance(turn, dict) else dict(turn), name)
    return turn


def _reject_constant(token: str) -> Any:
    raise _Constant(token)


class _Constant(ValueError):
    pass


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _Digits(len(text.lstrip("-")))
    return int(text)


class _Digits(ValueError):
    pass


def parse_json(text: str, where: str, what: str = "valid JSON",
               error: type[MemkernError] = MemkernValueError, *, raw_syntax_errors: bool = False) -> Any:
    """``json.loads(text)`` within the document bounds, else an ``error`` naming ``where``
    (``"<where>: expected <what>..., got ..."``): nested at most :data:`MAX_DOCUMENT_DEPTH` deep
    (never a ``RecursionError``), int literals of at most :data:`MAX_INT_DIGITS` digits (Python's
    own limit raises a bare ``ValueError``), no ``NaN`` / ``Infinity`` (not JSON). Invalid JSON
    gives ``error`` with the parser's message, line and column (or, with ``raw_syntax_errors``, the
    parser's own ``json.JSONDecodeError``, for a caller that tries another layout next)."""
    try:
        data = json.loads(text, parse_int=_bounded_int, parse_constant=_reject_constant)
    except RecursionError:
        raise error(f"{where}: expected {what} nested at most {MAX_DOCUMENT_DEPTH} levels deep, got deeper "
                    "nesting") from None
    except _Digits as e:
        raise error(f"{where}: expected {what} with ints of at most {MAX_INT_DIGITS} digits, got an int of "
                    f"{e.args[0]} digits") from None
    except _Constant as e:
        raise error(f"{where}: expected {what} (finite JSON numbers), got {e.args[0]}") from None
    except json.JSONDecodeError as e:
        if raw_syntax_errors:
            raise
        raise error(f"{where}: expected {what}, got invalid JSON ({e.msg} at line {e.lineno} column "
                    f"{e.colno})") from None
    except ValueError as e:  # any other refusal of the parser
        raise error(f"{where}: expected {what}, got invalid JSON ({' '.join(str(e).split())[:200]})") from None
    _check_document_depth(data, where, what, error)
    return data


def _check_document_depth(data: Any, where: str, what: str, error: type[MemkernError]) -> None:
    stack = [(data, 1)]
    while stack:
        obj, d = stack.pop()
        if isinstance(obj, dict):
            children = obj.values()
        elif isinstance(obj, list):
            children = obj
        else:
            continue
        if d > MAX_DOCUMENT_DEPTH:
            raise error(f"{where}: expected {what} nested at most {MAX_DOCUMENT_DEPTH} levels deep, got deeper "
                        "nesting")
        stack.extend((c, d + 1) for c in children if isinstance(c, (dict, list)))
