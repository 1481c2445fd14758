"""The compiled engine (``memkern._store``, built from ``csrc/``): the one module of the package that
imports it, loaded on first use so that ``import memkern`` stays cheap."""
from __future__ import annotations

from typing import Any

__all__ = ["native_module", "native_level"]


def native_module() -> Any:
    """The native module ``memkern._store`` (its classes and limits are typed in ``_store.pyi``)."""
    from .. import _store

    return _store


_LEVELS: dict = {}


def native_level(name: str) -> Any:
    """The native ``Level`` of a level name already checked to be in
    :data:`memkern.store.checks.LEVELS` (``"topic"`` or ``"turn"``)."""
    level = _LEVELS.get(name)
    if level is None:
        level = _LEVELS[name] = getattr(native_module().Level, name)
    return level
