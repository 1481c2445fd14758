"""The search options of ``memkern serve`` and ``memkern mcp``, checked by the store's own checks.

A search request takes what :meth:`memkern.MemoryStore.search` takes, with its defaults: ``mode``
(``"dense"``, ``"lexical"`` or ``"hybrid"``), ``fusion``, ``lexical_weight``, ``filter`` (the
request may call it ``filters``, as mem0 does), ``time_range``, ``time_field``, ``recency``,
``recency_weight`` and ``now``. Every value is checked by :func:`memkern.store.check_search_filters`
and :func:`memkern.store.prepare.prepare_search` (on a zero query: nothing is searched) before the
query is embedded, so a bad one is refused with the store's own message, naming the request's field.
"""
from __future__ import annotations

import json
from typing import Any

import numpy as np

from ..errors import MemkernError, MemkernTypeError, MemkernValueError, bad_arg
from ..protocols import accepts_keyword, missing_search_keywords
from ..store import check_search_filters
from ..store.prepare import prepare_search
from ..store.reference import DEFAULT_FUSION, DEFAULT_LEXICAL_WEIGHT
from ..text.template import time_range_seconds
from ..base.validate import check_json

__all__ = ["DEFAULT_FUSION", "DEFAULT_LEXICAL_WEIGHT", "MODE_KEYWORDS", "filter_kw", "mode_kw", "check_json_size"]

#: The ranking options of a search request, besides the filters and time options.
MODE_KEYWORDS = ("mode", "fusion", "lexical_weight")


def check_json_size(value: Any, arg: str, limit: int) -> None:
    """``value`` a JSON value every entry point takes (:func:`memkern.base.validate.check_json`) and at
    most ``limit`` bytes as compact JSON."""
    check_json(value, arg)
    n = len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
    if n > limit:
        raise bad_arg(arg, f"at most {limit} bytes of JSON", f"{n} bytes")


def _renamed(e: MemkernError, old: str, new: str) -> MemkernError:
    """``e`` with its leading argument name ``old`` (the store's) written ``new`` (the request's)."""
    text = str(e)
    return type(e)(new + text[len(old):]) if text.startswith(old) and old != new else e


def filter_kw(store: Any, max_bytes: int, filters: Any = None, filter: Any = None, time_range: Any = None,
              time_field: Any = "event", recency: Any = None, recency_weight: Any = None, now: Any = None) -> dict:
    """The checked ``store.search`` filter and time keywords of a request (``{}`` when none is set).

    ``filters`` / ``filter`` (one of them): metadata equality / ``$eq`` / ``$in`` (a JSON object of
    at most ``max_bytes``); ``time_range``: ``[start, end]``, each unix seconds, a date string
    (:func:`memkern.text.template.event_seconds`) or null (open); the rest as in
    :meth:`memkern.MemoryStore.search` (``recency_weight=None``: the store's default). A store
    whose ``search`` lacks one raises :class:`MemkernValueError` naming it.
    """
    name = "filters"
    if filter is not None:
        if filters is not None:
            raise bad_arg("filter", "one of filter / filters (the same option), not both", "both")
        filters, name = filter, "filter"
    if filters is not None:
        if not isinstance(filters, dict):
            raise bad_arg(name, "a JSON object", type(filters).__name__, MemkernTypeError)
        check_json_size(filters, name, max_bytes)
    if not isinstance(time_field, str):
        raise bad_arg("time_field", '"event", "created" or "updated"', type(time_field).__name__, MemkernTypeError)
    if time_range is not None and not isinstance(time_range, (list, tuple)):
        raise bad_arg("time_range", "a [start, end] pair of dates or unix seconds (either may be null)",
                      type(time_range).__name__, MemkernTypeError)
    extra = {} if recency_weight is None else {"recency_weight": recency_weight}
    try:
        kw = check_search_filters(filters or None, time_range_seconds(time_range), time_field, recency,
                                  now=now, **extra)
    except MemkernError as e:
        raise _renamed(e, "filter", name) from None
    missing = missing_search_keywords(store, kw)
    if missing:
        miss = name if missing[0] == "filter" else missing[0]
        raise MemkernValueError(f"{miss}: expected none, got {miss}, which this store's search does not take")
    return kw


def mode_kw(store: Any, query: str, limit: int, kw: dict, mode: Any = "dense", fusion: Any = DEFAULT_FUSION,
            lexical_weight: Any = DEFAULT_LEXICAL_WEIGHT) -> dict:
    """The checked ranking keywords of a search (``mode``, ``fusion``, ``lexical_weight`` and, for a
    lexical or hybrid search, ``texts=[query]``), checked together with the filter / time keywords
    ``kw`` (:func:`filter_kw`) by the store's own :func:`~memkern.store.prepare.prepare_search`.

    A store whose ``search`` lacks them is searched densely; asking it for anything else raises
    :class:`MemkernValueError` naming the option.
    """
    for name, v in (("mode", mode), ("fusion", fusion)):
        if not isinstance(v, str):  # the store's checks look the value up in a dict
            raise bad_arg(name, "a str", type(v).__name__, MemkernTypeError)
    opts = {"mode": mode, "fusion": fusion, "lexical_weight": lexical_weight}
    search = getattr(store, "search", None)
    if not all(accepts_keyword(search, k) for k in (*MODE_KEYWORDS, "texts")):
        defaults = {"mode": "dense", "fusion": DEFAULT_FUSION, "lexical_weight": DEFAULT_LEXICAL_WEIGHT}
        for k, v in opts.items():
            if type(v) is not type(defaults[k]) or v != defaults[k]:
                raise MemkernValueError(f"{k}: expected the default ({defaults[k]!r}), got {v!r}, which this "
                                        "store's search does not take")
        return {}
    texts = None if mode == "dense" else [query]
    q = None if mode == "lexical" else np.zeros((1, int(store.dim)), dtype=np.float32)
    try:
        prepare_search(int(store.dim), 1, "search", q, k=limit, texts=texts, **opts, **kw)
    except MemkernError as e:
        raise _renamed(e, "texts[0]", "query") from None
    return dict(opts, **({} if texts is None else {"texts": texts}))
