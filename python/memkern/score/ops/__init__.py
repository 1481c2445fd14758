"""The reranker's functional ops: scores, Gumbel top-m selection, the REINFORCE gradient and the fused
step, each on the best backend.
"""

from __future__ import annotations

from .autograd import (
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
