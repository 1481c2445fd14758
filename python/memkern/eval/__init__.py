"""Evaluation harness: retrieval metrics and memory experiments (``memkern eval memory``).

One module per experiment, each with its typed result and table: :mod:`.granularity`,
:mod:`.turn_in_topic`, :mod:`.reflection`, :mod:`.collapse`, :mod:`.rmm_loop`, :mod:`.retrieval`.
Shared: :mod:`.report` (results, tables, JSON, aggregation over seeds), :mod:`.data` (datasets),
:mod:`.units` (embedding cache, units), :mod:`.online` (reranker candidates, online training),
:mod:`.metrics`, :mod:`.tasks` (every experiment as (seed, configuration, conversations) tasks, run
here or on Ray, merged in one order).
"""
from .metrics import mean_std, ndcg_at_k, recall_at_budget, recall_at_k  # noqa: F401
