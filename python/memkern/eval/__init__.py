"""Evaluation harness: retrieval metrics and memory experiments (``memkern eval memory``)."""
from __future__ import annotations

from .metrics import mean_std, ndcg_at_k, recall_at_budget, recall_at_k  # noqa: F401
