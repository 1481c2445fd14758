"""LangGraph namespaces in memkern: a tuple of labels is one memkern namespace
``lg.<label>.<label>...``; the meta keys the adapter keeps on each record."""
from __future__ import annotations

from typing import Any, Sequence

from langgraph.store.base import InvalidNamespaceError, MatchCondition

from ...errors import MemkernTypeError, MemkernValueError, bad_arg
from .._common import check_text

#: memkern namespaces of LangGraph items start with this label.
PREFIX = "lg"
SEP = "."
KEY = "__lg_key__"
INDEXED = "__lg_indexed__"
TTL = "__lg_ttl__"            # minutes
EXPIRES = "__lg_expires__"    # unix seconds (durable; >= the exact expiry)
UPDATED = "__lg_updated__"    # the last value write, kept across a TTL refresh rewrite
RESERVED = (KEY, INDEXED, TTL, EXPIRES, UPDATED)


class MemkernNamespaceError(MemkernValueError, InvalidNamespaceError):
    """A namespace tuple that cannot be stored (LangGraph's ``InvalidNamespaceError`` too)."""


def check_labels(namespace: Any, name: str, *, wildcards: bool = False, allow_empty: bool = True) -> tuple:
    if isinstance(namespace, list):
        namespace = tuple(namespace)
    if not isinstance(namespace, tuple):
        raise bad_arg(name, "a tuple of str labels", type(namespace).__name__, MemkernTypeError)
    if not namespace and not allow_empty:
        raise MemkernNamespaceError(f"{name}: expected a non-empty tuple of labels, got ()")
    for i, label in enumerate(namespace):
        if not isinstance(label, str):
            raise MemkernNamespaceError(f"{name}[{i}]: expected a str label, got {type(label).__name__}")
        if not label:
            raise MemkernNamespaceError(f"{name}[{i}]: expected a non-empty label, got ''")
        if SEP in label or "\x00" in label:
            raise MemkernNamespaceError(f"{name}[{i}]: expected a label without '.' or NUL, got {label!r}")
        if label == "*" and not wildcards:
            pass  # a literal '*' label is fine in a stored namespace
        check_text(label, f"{name}[{i}]")
    return namespace


def encode_namespace(namespace: Sequence[str], name: str = "namespace") -> str:
    """``("users", "alice")`` -> ``"lg.users.alice"`` (labels validated; errors name ``name``)."""
    labels = check_labels(namespace, name, allow_empty=False)
    return SEP.join((PREFIX, *labels))


def decode_namespace(ns: str) -> tuple[str, ...] | None:
    """Inverse of :func:`encode_namespace`; ``None`` for a memkern namespace that is not one of
    this adapter's (another prefix, an empty label)."""
    parts = ns.split(SEP)
    if len(parts) < 2 or parts[0] != PREFIX or any(not p for p in parts[1:]):
        return None
    return tuple(parts[1:])


def ns_matches(cond: MatchCondition, ns: tuple) -> bool:
    path = tuple(cond.path)
    if len(ns) < len(path):
        return False
    pairs = zip(ns, path) if cond.match_type == "prefix" else zip(reversed(ns), reversed(path))
    return all(p == "*" or p == n for n, p in pairs)


