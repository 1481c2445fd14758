"""Exception hierarchy: every memkern error derives from :class:`MemkernError`.

Subclasses also derive from the built-in Python users expect (``ValueError``, ``TypeError``,
``KeyError``), so ``except ValueError`` keeps working. Messages name the argument, what was
expected and what came.
"""
from __future__ import annotations


class MemkernError(Exception):
    """Base class of all memkern errors."""


class MemkernValueError(MemkernError, ValueError):
    """An argument has the right type but a bad value (shape, range, NaN, ...)."""


class MemkernTypeError(MemkernError, TypeError):
    """An argument has the wrong type or dtype."""


class MemkernKeyError(MemkernError, KeyError):
    """An id, namespace or name is unknown."""


class StoreCorruptedError(MemkernError):
    """A store file is corrupted, truncated or of an unknown format version."""


class BackendUnavailableError(MemkernError, RuntimeError):
    """An explicitly requested backend (e.g. ``"triton"``) cannot run here; the message says why."""


def _repr_limits():
    import reprlib

    r = reprlib.Repr()
    r.maxlevel, r.maxstring, r.maxother, r.maxlong = 8, 1000, 1000, 120
    r.maxlist = r.maxtuple = r.maxdict = r.maxset = r.maxfrozenset = r.maxdeque = r.maxarray = 64
    return r


_REPR = _repr_limits()


def shown(got: object) -> str:
    """``repr(got)`` as an error message shows it: bounded in depth (a value nested thousands deep
    never recurses) and length, an int past 100 bits by its size (``repr`` of an int past 4,300
    digits raises in Python); never raises."""
    try:
        if isinstance(got, int) and not isinstance(got, bool) and got.bit_length() > 400:
            return repr(f"an int of about {int(got.bit_length() * 0.30103) + 1} digits")
        return _REPR.repr(got)
    except Exception:  # noqa: BLE001 - a repr that fails must not hide the error being reported
        return f"<{type(got).__name__}>"


def bad_arg(name: str, expected: str, got: object, cls: type[MemkernError] = MemkernValueError) -> MemkernError:
    """Build an error naming argument ``name``, what was ``expected`` and what was ``got``
    (:func:`shown`: bounded, never raises)."""
    return cls(f"{name}: expected {expected}, got {shown(got)}")


# Moved: the argument checks live in memkern.validate; the old names warn once, for one release.
_MOVED = {"check_int": "memkern.validate.check_int"}
_warned: set[str] = set()


def __getattr__(name: str):
    new = _MOVED.get(name)
    if new is None:
        raise AttributeError(f"module 'memkern.errors' has no attribute {name!r}")
    if name not in _warned:
        _warned.add(name)
        import warnings

        warnings.warn(f"memkern.errors.{name} is deprecated; use {new}", DeprecationWarning, stacklevel=2)
    from . import validate

    return getattr(validate, name)
