"""Data is stored: the native store's front end (``MemoryStore``), records, the in-memory store, the
async front end, the memory bank, export / import and the BM25 reference.
"""

from __future__ import annotations

from .engine import (
    MemoryStore,
    Record,
    PAD_SCORE,
    default_store_path,
    check_search_filters,
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
    turns_with_topics,
)
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
