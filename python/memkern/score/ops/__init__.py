"""The reranker's functional ops: scores, Gumbel top-m selection, the REINFORCE gradient and the fused
step, each on the best backend.

Modules: ``functional`` (the ops and their math), ``autograd`` (:class:`RerankScores`), ``backend``
(choice and dispatch), ``torch_path`` (the plain-torch backend), ``philox`` (the counter-based
uniforms), ``checks`` (argument checks) and ``results`` (the named results).
"""

from __future__ import annotations

from .autograd import RerankScores
from .backend import resolve_backend
from .functional import gumbel_topm, reinforce_grad, rerank_scores, rerank_step
from .philox import philox_uniform
from .results import GumbelTopM, ReinforceGrad, RerankForward, RerankStep

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
