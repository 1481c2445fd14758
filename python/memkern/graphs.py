"""CUDA graphs of the reranker step (``memkern.graphs``): see :mod:`memkern.score.graphs`."""

from __future__ import annotations

from .score.graphs import (
    GraphRunner,
    WARMUP,
)

__all__ = [
    "GraphRunner",
    "WARMUP",
]
