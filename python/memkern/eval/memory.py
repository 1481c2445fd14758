"""Deprecated alias of the memory experiments (kept for one release).

The experiments now live one per module: :mod:`memkern.eval.granularity`,
:mod:`memkern.eval.turn_in_topic`, :mod:`memkern.eval.reflection`, :mod:`memkern.eval.collapse`,
:mod:`memkern.eval.rmm_loop` and :mod:`memkern.eval.retrieval`, with shared helpers in
:mod:`memkern.eval.units` (embedding cache, units), :mod:`memkern.eval.data` (datasets),
:mod:`memkern.eval.online` (reranker candidates and online training) and
:mod:`memkern.eval.report` (results, tables, JSON, aggregation). Every name this module used to
define still resolves here, with a :class:`DeprecationWarning` naming its new home.
"""
from __future__ import annotations

import importlib
import warnings
from typing import Any

# old name -> (module, new name)
_MOVED: dict[str, tuple[str, str]] = {
    "CachedEmbedder": ("units", "CachedEmbedder"),
    "Units": ("units", "Units"),
    "build_units": ("units", "build_units"),
    "default_cache_dir": ("units", "default_cache_dir"),
    "GRANULARITIES": ("units", "GRANULARITIES"),
    "BUDGETS": ("units", "BUDGETS"),
    "_make_extractor": ("units", "make_extractor"),
    "load_dataset": ("data", "load_dataset"),
    "_dataset_info": ("data", "dataset_info"),
    "_questions": ("data", "questions_with_evidence"),
    "_mean": ("data", "mean"),
    "_by_type": ("data", "by_type"),
    "run_granularity": ("granularity", "run_granularity"),
    "run_turn_in_topic": ("turn_in_topic", "run_turn_in_topic"),
    "run_reflection": ("reflection", "run_reflection"),
    "run_collapse": ("collapse", "run_collapse"),
    "run_rmm": ("rmm_loop", "run_rmm"),
    "Candidates": ("online", "Candidates"),
    "build_candidates": ("online", "build_candidates"),
    "train_online": ("online", "train_online"),
    "_simulate_citations": ("online", "simulate_citations"),
    "_split": ("online", "split_rows"),
    "_recall_of": ("online", "recall_of"),
    "_make_reranker": ("online", "make_reranker"),
    "_eval_reranker": ("online", "eval_reranker"),
    "write_result": ("report", "write_result"),
    "format_table": ("report", "format_table"),
    "aggregate": ("report", "aggregate"),
    "format_aggregate": ("report", "format_aggregate"),
    "_env": ("report", "environment"),
}

__all__ = ["CachedEmbedder", "build_units", "run_granularity", "run_turn_in_topic", "run_reflection",
           "run_collapse", "run_rmm", "load_dataset", "write_result", "format_table", "aggregate",
           "format_aggregate", "GRANULARITIES"]


def __getattr__(name: str) -> Any:
    moved = _MOVED.get(name)
    if moved is None:
        raise AttributeError(f"module 'memkern.eval.memory' has no attribute {name!r}")
    mod, new = moved
    warnings.warn(f"memkern.eval.memory.{name} is deprecated; use memkern.eval.{mod}.{new}",
                  DeprecationWarning, stacklevel=2)
    return getattr(importlib.import_module(f"memkern.eval.{mod}"), new)


def __dir__() -> list[str]:
    return sorted(_MOVED)
