"""The filter grammar of ``MemkernStore.search``: LangGraph's operators with the semantics of its
``InMemoryStore``, memkern's extra ones, and what of a filter the store's own search can apply."""
from __future__ import annotations

from typing import Any

from ...errors import MemkernTypeError, bad_arg
from .. import filters as F
from ..values import check_json_value
from .namespaces import RESERVED

# ------------------------------------------------------------------------------- the filter grammar
_LG_OPS = ("$eq", "$ne", "$gt", "$gte", "$lt", "$lte")
_EXT_OPS = {"$in": "in", "$nin": "nin", "$contains": "contains", "$exists": "exists"}
_ORDER = {"$gt": float.__gt__, "$gte": float.__ge__, "$lt": float.__lt__, "$lte": float.__le__}


def _is_ops(d: dict) -> bool:
    return any(isinstance(k, str) and k.startswith("$") for k in d)


def _check_operand(want: Any, where: str) -> None:
    """Refuse, before anything runs, what InMemoryStore would raise on: an unknown operator at any
    depth, an order operand ``float()`` does not take."""
    if isinstance(want, dict):
        if _is_ops(want):
            for o, w in want.items():
                if o not in _LG_OPS:
                    raise bad_arg(where, f"an operator in {list(_LG_OPS)}", o)
                if o in _ORDER:
                    try:
                        if isinstance(w, bool):
                            raise TypeError
                        float(w)
                    except (TypeError, ValueError, OverflowError):
                        raise bad_arg(f"{where}[{o!r}]", "a number or numeric str", w, MemkernTypeError) from None
                else:
                    _check_operand(w, f"{where}[{o!r}]")
        else:
            for k, w in want.items():
                _check_operand(w, f"{where}[{k!r}]")
    elif isinstance(want, (list, tuple)):
        for i, w in enumerate(want):
            _check_operand(w, f"{where}[{i}]")


def _lg_op(have: Any, op: str, want: Any) -> bool:
    if op == "$eq":
        return have == want
    if op == "$ne":
        return have != want
    try:
        a, b = float(have), float(want)
    except (TypeError, ValueError, OverflowError):
        return False
    return _ORDER[op](a, b)


def _lg_match(have: Any, want: Any) -> bool:
    """``have`` (a value, ``None`` when missing) against a LangGraph filter value ``want``."""
    if isinstance(want, dict):
        if _is_ops(want):
            return all(_lg_op(have, o, w) for o, w in want.items())
        return isinstance(have, dict) and all(_lg_match(have.get(k), w) for k, w in want.items())
    if isinstance(want, (list, tuple)):
        return (isinstance(have, (list, tuple)) and len(have) == len(want)
                and all(_lg_match(h, w) for h, w in zip(have, want)))
    return have == want


def _key_pred(key: str, want: Any) -> F.Pred:
    return F.Pred(lambda meta: _lg_match(meta.get(key), want), f"{key}: {want!r}")


def parse_filter(filter: Any, name: str = "filter") -> Any:
    """A LangGraph ``search`` filter (module doc) -> the tree :func:`memkern.integrations.filters.search`
    evaluates (the combinators of :func:`memkern.integrations.filters.parse`, LangGraph's conditions
    per key); bad filters raise naming ``name`` and the key."""
    return F.parse(filter, name, leaf=_leaf, key_kind="a value key")


def _leaf(key: str, v: Any, name: str) -> Any:
    where = f"{name}[{key!r}]"
    if key in RESERVED:
        raise bad_arg(name, "a value key (not one of the adapter's reserved keys)", key)
    check_json_value(v, where)
    if isinstance(v, dict) and _is_ops(v):
        parts: list[Any] = []
        for o, operand in v.items():
            if o in _EXT_OPS:
                parts.append(F.cond(key, _EXT_OPS[o], operand, name))
            elif o not in _LG_OPS:
                raise bad_arg(where, f"an operator in {list(_LG_OPS) + list(_EXT_OPS)}", o)
            elif o == "$eq" and isinstance(operand, str) and key:
                parts.append(F.Cond(key, "eq", operand))            # str == str: the store's own filter
            else:
                _check_operand({o: operand}, where)
                parts.append(_key_pred(key, {o: operand}))
        return F.node("and", parts)
    if isinstance(v, str) and key:
        return F.Cond(key, "eq", v)
    _check_operand(v, where)
    return _key_pred(key, v)
