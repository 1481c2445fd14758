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


def bad_arg(name: str, expected: str, got: object, cls: type[MemkernError] = MemkernValueError) -> MemkernError:
    """Build an error naming argument ``name``, what was ``expected`` and what was ``got``."""
    return cls(f"{name}: expected {expected}, got {got!r}")


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
