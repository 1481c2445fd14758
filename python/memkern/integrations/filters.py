"""Metadata filters shared by the framework adapters: one parsed form, one matcher, one search.

Every adapter translates its framework's filter syntax (LangGraph ``{"k": v, "n": {"$gt": 3}}``,
LlamaIndex ``MetadataFilters``, mem0 ``{"user_id": ..., "AND": [...]}``, LangChain dicts) into a
small tree of :class:`Cond` / :class:`Node`, then calls :func:`search`. Semantics are those of the
store's own ``search(filter=...)`` (API spec): conditions on the record's top-level ``meta`` keys,
JSON equality (``1 == 1.0``, ``True != 1``, ``"1" != 1``), a missing key matches no positive
condition.

Operators: ``eq`` (a dict value matches when every one of its keys matches, recursively; a list
matches element-wise), ``ne``, ``in``, ``nin``, ``gt``, ``gte``, ``lt``, ``lte`` (numbers with
numbers, strings with strings; anything else does not match), ``contains`` (the meta value is a
list holding the operand, or a str containing it), ``icontains`` (a str containing the operand,
ignoring case), ``exists``. Nodes combine them with ``and`` /
``or`` / ``not``. An adapter whose framework defines other semantics for some of its operators
(LangGraph's ``InMemoryStore``: Python equality, ``float()`` comparisons) puts them in the tree as
:class:`Pred` leaves: a function of the record's ``meta``, always evaluated on the records.

Where it runs: the part of a filter the store evaluates natively (top-level ``and`` of ``eq`` /
``in`` conditions on str / int / float / bool values) is *pushed* into ``store.search(...,
filter=...)``, i.e. inside the index search, when the store's ``search`` takes ``filter``. The rest
(or everything, on a store without native filters) is evaluated on the records the search returns:
the search is repeated with 4x more candidates until ``k`` records match or the whole namespace
was searched, so the result is the best ``k`` matching records (as exact as the index itself).
"""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import MemkernTypeError, MemkernValueError, bad_arg
from ..base.validate import MAX_FILTER_DEPTH
from .values import check_json_value

__all__ = ["Cond", "Node", "Pred", "parse", "matches", "split", "search", "supports_native", "supports_mode", "OPS",
           "check_depth", "MAX_FILTER_DEPTH"]

OPS = ("eq", "ne", "in", "nin", "gt", "gte", "lt", "lte", "contains", "icontains", "exists")
_SCALARS = (str, int, float, bool)


@dataclass(frozen=True)
class Cond:
    """One condition ``meta[key] <op> value``."""

    key: str
    op: str
    value: Any


@dataclass(frozen=True)
class Node:
    """``kind`` in ``"and"``, ``"or"``, ``"not"`` (``not`` has exactly one child)."""

    kind: str
    children: tuple


@dataclass(frozen=True)
class Pred:
    """A condition ``fn(meta) -> bool`` with an adapter's own semantics (never pushed into the
    store's search); ``text`` says what it tests, for messages."""

    fn: Callable[[dict], bool]
    text: str = ""


Tree = "Cond | Node | Pred | None"


# ------------------------------------------------------------------------------- validation
def check_depth(depth: int, name: str) -> None:
    """Refuse a filter nested deeper than :data:`memkern.base.validate.MAX_FILTER_DEPTH` (``$and`` /
    ``$or`` / ``$not`` levels, in every adapter's syntax) before it is walked any further: a
    :class:`~memkern.MemkernValueError` naming ``name``, never a ``RecursionError``."""
    if depth > MAX_FILTER_DEPTH:
        raise bad_arg(name, f"a filter nested at most {MAX_FILTER_DEPTH} levels deep ($and / $or / $not)",
                      "deeper nesting")


def cond(key: Any, op: str, value: Any, name: str = "filter") -> Cond:
    """A validated :class:`Cond` (errors name ``name`` and the key)."""
    if not isinstance(key, str) or not key:
        raise bad_arg(name, "non-empty str keys", key, MemkernTypeError if not isinstance(key, str) else MemkernValueError)
    where = f"{name}[{key!r}]"
    if op not in OPS:
        raise bad_arg(where, f"an operator in {OPS}", op)
    if op in ("in", "nin"):
        if isinstance(value, (str, bytes, dict)) or not isinstance(value, (list, tuple)):
            raise bad_arg(where, f"a list of values for {op!r}", type(value).__name__, MemkernTypeError)
        value = tuple(value)
    elif op in ("gt", "gte", "lt", "lte"):
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise bad_arg(where, f"a number or str for {op!r}", value, MemkernTypeError)
    elif op == "exists":
        if not isinstance(value, bool):
            raise bad_arg(where, "True or False for 'exists'", value, MemkernTypeError)
    check_json_value(value, where)
    return Cond(key, op, value)


def node(kind: str, children: Sequence[Any]) -> Node | Cond | None:
    """``and`` / ``or`` / ``not`` of already parsed children (``None`` children dropped)."""
    kids = tuple(c for c in children if c is not None)
    if kind == "not":
        if len(kids) != 1:
            raise bad_arg("filter", "exactly one condition under 'not'", len(kids))
        return Node("not", kids)
    if kind == "and":  # flattened: split() finds every top-level condition
        kids = tuple(g for c in kids for g in (c.children if isinstance(c, Node) and c.kind == "and" else (c,)))
    if not kids:
        return None
    if len(kids) == 1:
        return kids[0]
    return Node(kind, kids)


_DOLLAR = {"$eq": "eq", "$ne": "ne", "$in": "in", "$nin": "nin", "$gt": "gt", "$gte": "gte",
           "$lt": "lt", "$lte": "lte", "$contains": "contains", "$exists": "exists"}


def parse(filter: Any, name: str = "filter", _depth: int = 0, *, leaf: Any = None,
          key_kind: str = "a metadata key") -> Cond | Node | None:
    """Parse the dict grammar shared by memkern, LangGraph and LangChain.

    ``{"k": v}`` (equality; a dict ``v`` without ``$`` keys matches a sub-dict), ``{"k": {"$eq" |
    "$ne" | "$in" | "$nin" | "$gt" | "$gte" | "$lt" | "$lte" | "$contains" | "$exists": v, ...}}``
    (several operators = and), ``{"$and": [f, ...]}``, ``{"$or": [f, ...]}``, ``{"$not": f}``;
    several keys = and; nested at most :data:`MAX_FILTER_DEPTH` levels. ``None`` or ``{}`` is no
    filter.

    ``leaf(key, value, name)``, when given, parses each key's condition instead (an adapter's own
    semantics under the same ``$and`` / ``$or`` / ``$not`` combinators); ``key_kind`` names the keys
    in errors.
    """
    check_depth(_depth, name)
    if filter is None:
        return None
    if not isinstance(filter, dict):
        raise bad_arg(name, "a dict or None", type(filter).__name__, MemkernTypeError)
    parts: list[Any] = []
    for key, v in filter.items():
        if not isinstance(key, str):
            raise bad_arg(name, "str keys", f"key {key!r}", MemkernTypeError)
        if key in ("$and", "$or"):
            if isinstance(v, (str, dict)) or not isinstance(v, (list, tuple)):
                raise bad_arg(f"{name}[{key!r}]", "a list of filters", type(v).__name__, MemkernTypeError)
            parts.append(node(key[1:], [parse(f, f"{name}[{key!r}][{i}]", _depth + 1, leaf=leaf, key_kind=key_kind)
                                        for i, f in enumerate(v)]))
        elif key == "$not":
            parts.append(node("not", [parse(v, f"{name}['$not']", _depth + 1, leaf=leaf, key_kind=key_kind)]))
        elif key.startswith("$"):
            raise bad_arg(name, f"'$and', '$or', '$not' or {key_kind}", key)
        else:
            parts.append((leaf or _leaf)(key, v, name))
    return node("and", parts)


def _leaf(key: str, v: Any, name: str) -> Cond | Node | None:
    """memkern's condition on one key: equality, or ``{"$op": operand, ...}`` (and-ed)."""
    if isinstance(v, dict) and any(isinstance(o, str) and o.startswith("$") for o in v):
        ops = []
        for o, operand in v.items():
            if o not in _DOLLAR:
                raise bad_arg(f"{name}[{key!r}]", f"an operator in {sorted(_DOLLAR)}", o)
            ops.append(cond(key, _DOLLAR[o], operand, name))
        return node("and", ops)
    return cond(key, "eq", v, name)


# ------------------------------------------------------------------------------- matching
def _num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def json_eq(a: Any, b: Any) -> bool:
    """JSON equality: numbers by value, bools only equal bools, lists element-wise, dicts by keys."""
    if _num(a) and _num(b):                       # (_num excludes bools)
        return a == b
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(json_eq(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_eq(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b          # str, bool, None: same type only (True != 1)


def _sub_match(have: Any, want: Any) -> bool:
    """Equality where a dict ``want`` matches any dict holding (recursively) its keys."""
    if isinstance(want, dict):
        return isinstance(have, dict) and all(k in have and _sub_match(have[k], w) for k, w in want.items())
    if isinstance(want, (list, tuple)):
        return (isinstance(have, (list, tuple)) and len(have) == len(want)
                and all(_sub_match(h, w) for h, w in zip(have, want)))
    return json_eq(have, want)


def _order(have: Any, op: str, want: Any) -> bool:
    if not ((_num(have) and _num(want)) or (isinstance(have, str) and isinstance(want, str))):
        return False
    if op == "gt":
        return have > want
    if op == "gte":
        return have >= want
    if op == "lt":
        return have < want
    return have <= want


_MISSING = object()


def _match_cond(c: Cond, meta: dict) -> bool:
    have = meta.get(c.key, _MISSING)
    if c.op == "exists":
        return (have is not _MISSING) == c.value
    if have is _MISSING:
        return c.op in ("ne", "nin")
    if c.op == "eq":
        return _sub_match(have, c.value)
    if c.op == "ne":
        return not _sub_match(have, c.value)
    if c.op == "in":
        return any(json_eq(have, v) for v in c.value)
    if c.op == "nin":
        return not any(json_eq(have, v) for v in c.value)
    if c.op == "icontains":
        return isinstance(have, str) and isinstance(c.value, str) and c.value.casefold() in have.casefold()
    if c.op == "contains":
        if isinstance(have, (list, tuple)):
            return any(json_eq(h, c.value) for h in have)
        return isinstance(have, str) and isinstance(c.value, str) and c.value in have
    return _order(have, c.op, c.value)


def matches(tree: Cond | Node | None, meta: dict) -> bool:
    """Whether a record's ``meta`` satisfies the parsed filter (``None`` matches everything)."""
    if tree is None:
        return True
    if isinstance(tree, Cond):
        return _match_cond(tree, meta)
    if isinstance(tree, Pred):
        return bool(tree.fn(meta))
    if tree.kind == "and":
        return all(matches(c, meta) for c in tree.children)
    if tree.kind == "or":
        return any(matches(c, meta) for c in tree.children)
    return not matches(tree.children[0], meta)


# ------------------------------------------------------------------------------- push-down
def _native_value(v: Any) -> bool:
    return isinstance(v, _SCALARS) and not (isinstance(v, float) and not math.isfinite(v))


def _limits() -> tuple[int, int]:
    """The store's limits on a native filter (keys, values in all), where it declares them."""
    from ..store import engine as _st

    return int(getattr(_st, "MAX_FILTER_KEYS", 1 << 30)), int(getattr(_st, "MAX_FILTER_VALUES", 1 << 30))


def split(tree: Cond | Node | None, max_keys: int | None = None,
          max_values: int | None = None) -> tuple[dict | None, Cond | Node | None]:
    """``(native, rest)``: the store-native filter dict (``eq`` / ``in`` of scalars, and-ed at the
    top, one condition per key, within the store's key / value limits) and the remaining tree to
    evaluate on the records."""
    if tree is None:
        return None, None
    if max_keys is None or max_values is None:
        lk, lv = _limits()
        max_keys = lk if max_keys is None else max_keys
        max_values = lv if max_values is None else max_values
    conds = list(tree.children) if isinstance(tree, Node) and tree.kind == "and" else [tree]
    native: dict = {}
    n_values = 0
    rest = []
    for c in conds:
        size = len(c.value) if isinstance(c, Cond) and c.op == "in" else 1
        if isinstance(c, Cond) and c.key not in native and len(native) < max_keys and n_values + size <= max_values and (
                (c.op == "eq" and _native_value(c.value))
                or (c.op == "in" and c.value and all(_native_value(v) for v in c.value))):
            native[c.key] = c.value if c.op == "eq" else {"$in": list(c.value)}
            n_values += size
        else:
            rest.append(c)
    return (native or None), node("and", rest)


_NATIVE_CACHE: dict[type, bool] = {}


def supports_native(store: Any) -> bool:
    """Whether ``store.search`` takes ``filter=`` (the API-spec metadata filter)."""
    t = type(store)
    hit = _NATIVE_CACHE.get(t)
    if hit is None:
        try:
            hit = "filter" in inspect.signature(store.search).parameters
        except (TypeError, ValueError):
            hit = False
        _NATIVE_CACHE[t] = hit
    return hit


def supports_mode(store: Any) -> bool:
    """Whether ``store.search`` takes ``mode=`` (lexical / hybrid search, API spec)."""
    try:
        return "mode" in inspect.signature(store.search).parameters
    except (TypeError, ValueError):
        return False


def search(store: Any, namespace: str, query: np.ndarray | None, k: int, tree: Cond | Node | None = None,
           *, native: bool | None = None, **kw: Any) -> tuple[np.ndarray, np.ndarray, list]:
    """The best ``k`` records of ``namespace`` for one query that satisfy ``tree``.

    Parameters
    ----------
    store : a memkern store (``search``, ``get_batch``, ``count``)
    namespace : str
    query : float32 ``[d]`` (``None`` with ``mode="lexical", texts=[...]`` in ``kw``)
    k : int >= 1
    tree : parsed filter (:func:`parse`) or None
    native : force (True / False) or detect (None) the store's ``search(filter=...)``
    **kw : passed to ``store.search`` (e.g. ``include_invalidated``)

    Returns
    -------
    ids : int64 ``[n]``, scores : float32 ``[n]``, records : list of ``n`` records; ``n <= k``,
    best first.
    """
    use_native = supports_native(store) if native is None else native
    push, rest = split(tree) if use_native else (None, tree)
    if push is not None:
        kw = dict(kw, filter=push)
    if rest is None:
        ids, scores = store.search(namespace, query, k, **kw)
        ids, scores = np.asarray(ids)[0], np.asarray(scores)[0]
        keep = ids >= 0
        ids, scores = ids[keep], scores[keep]
        return ids, scores, store.get_batch(ids) if len(ids) else []
    total = int(store.count(namespace, bool(kw.get("include_invalidated", False))))
    if total == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.float32), []
    kk = min(max(4 * k, 32), total)
    while True:
        ids, scores = store.search(namespace, query, kk, **kw)
        ids, scores = np.asarray(ids)[0], np.asarray(scores)[0]
        valid = ids >= 0
        ids, scores = ids[valid], scores[valid]
        recs = store.get_batch(ids) if len(ids) else []
        keep = [i for i, r in enumerate(recs) if matches(rest, r.meta)]
        if len(keep) >= k or kk >= total or len(ids) < kk:   # enough, or nothing more to find
            keep = keep[:k]
            return ids[keep], scores[keep], [recs[i] for i in keep]
        kk = min(kk * 4, total)
