"""The reranker's functional ops (``memkern.ops``): see :mod:`memkern.score.ops`."""

from __future__ import annotations

from .score.ops.autograd import (
    RerankScores,
    RerankForward,
    GumbelTopM,
    ReinforceGrad,
    RerankStep,
    rerank_scores,
    gumbel_topm,
    reinforce_grad,
    rerank_step,
    philox_uniform,
    resolve_backend,
)

__all__ = [
    "RerankScores",
    "RerankForward",
    "GumbelTopM",
    "ReinforceGrad",
    "RerankStep",
    "rerank_scores",
    "gumbel_topm",
    "reinforce_grad",
    "rerank_step",
    "philox_uniform",
    "resolve_backend",
]
