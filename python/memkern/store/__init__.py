"""Data is stored: the checks of every store call (``checks``, ``prepare``), the native engine's
front end (``engine``, ``native``), records, the in-memory store, the async front end, the memory
bank, export / import (``transfer``) and the BM25 reference.
"""

from __future__ import annotations

from .checks import (
    PAD_SCORE,
    DEFAULT_EF_SEARCH,
    MAX_K,
    MAX_EF,
    MAX_CANDIDATES,
    MAX_RESULTS,
    MAX_NORM,
    MAX_ALPHA,
    MAX_FILTER_KEYS,
    MAX_FILTER_VALUES,
    MAX_FILTER_STR,
    MAX_QUERY_TEXT,
    DEFAULT_RECENCY_WEIGHT,
)
from .engine import MemoryStore, default_store_path
from .prepare import check_search_filters
from .record import Record, turns_with_topics
from .memory import InMemoryStore

__all__ = [
    "MemoryStore",
    "Record",
    "PAD_SCORE",
    "default_store_path",
    "check_search_filters",
    "DEFAULT_EF_SEARCH",
    "MAX_K",
    "MAX_EF",
    "MAX_CANDIDATES",
    "MAX_RESULTS",
    "MAX_NORM",
    "MAX_ALPHA",
    "MAX_FILTER_KEYS",
    "MAX_FILTER_VALUES",
    "MAX_FILTER_STR",
    "MAX_QUERY_TEXT",
    "DEFAULT_RECENCY_WEIGHT",
    "turns_with_topics",
    "InMemoryStore",
]
