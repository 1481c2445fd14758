"""One check of the JSON values adapters write into a record's ``meta`` (before anything is written):
the store's own check, :func:`memkern.store.check_json`."""
from __future__ import annotations

from typing import Any

from ..base.validate import check_json

__all__ = ["check_json_value"]


def check_json_value(value: Any, name: str) -> Any:
    """``value`` must be what a memkern record's ``meta`` holds: dicts with str keys, lists / tuples,
    UTF-8 str, finite floats, ints, bools, None, nested at most ``MAX_JSON_DEPTH`` deep (errors
    name the offending path, ``value['a'][0]``). Returns ``value``."""
    check_json(value, name)
    return value
