"""One check of the JSON values adapters write into a record's ``meta`` (before anything is written)."""
from __future__ import annotations

import math
from typing import Any

from ..errors import MemkernTypeError, bad_arg
from ..store import MAX_JSON_DEPTH

__all__ = ["check_json_value"]


def _utf8(s: str, path: str) -> None:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise bad_arg(path, "a str encodable as UTF-8 (no lone surrogates)", f"{s[e.start:e.end]!r}") from None


def check_json_value(value: Any, name: str) -> Any:
    """``value`` must be what a memkern record's ``meta`` holds: dicts with str keys, lists / tuples,
    UTF-8 str, finite floats, ints, bools, None, nested at most ``MAX_JSON_DEPTH`` deep. Walks
    iteratively; errors name the offending path (``value['a'][0]``)."""
    stack = [(value, name, 0)]
    while stack:
        v, path, depth = stack.pop()
        if isinstance(v, str):
            _utf8(v, path)
        elif v is None or isinstance(v, (bool, int)):
            pass
        elif isinstance(v, float):
            if not math.isfinite(v):
                raise bad_arg(path, "a finite number (JSON has no NaN/inf)", v, MemkernTypeError)
        elif isinstance(v, (dict, list, tuple)):
            if depth >= MAX_JSON_DEPTH:
                raise bad_arg(name, f"JSON nested at most {MAX_JSON_DEPTH} levels deep", f"deeper nesting at {path}")
            if isinstance(v, dict):
                for k, item in v.items():
                    if not isinstance(k, str):
                        raise bad_arg(path, "str keys (JSON objects have only str keys)",
                                      f"key {k!r} of type {type(k).__name__}", MemkernTypeError)
                    _utf8(k, f"{path} key")
                    stack.append((item, f"{path}[{k!r}]", depth + 1))
            else:
                stack.extend((item, f"{path}[{i}]", depth + 1) for i, item in enumerate(v))
        else:
            raise bad_arg(path, "JSON-compatible values (dict, list, str, int, float, bool, None)",
                          type(v).__name__, MemkernTypeError)
    return value
