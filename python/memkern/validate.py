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
"""
from __future__ import annotations

import math
from typing import Any, Collection

import numpy as np

from .errors import MemkernError, MemkernTypeError, MemkernValueError, bad_arg

__all__ = ["check_int", "check_float", "check_choice", "check_str", "is_int", "is_real"]


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
    raise bad_arg(name, expected, int(value) if type_error else value, error)


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
        v = float(value)
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
    raise bad_arg(name, expected, value)


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
