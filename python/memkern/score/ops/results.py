"""The named results of the reranker ops: :class:`GumbelTopM`, :class:`ReinforceGrad`,
:class:`RerankStep` and :class:`RerankForward` (tuples of tensors)."""
from __future__ import annotations

from typing import NamedTuple

from ...errors import require

require("reranker", "torch", feature="memkern.ops")  # names the extra when a package is missing
import torch

__all__ = ["GumbelTopM", "ReinforceGrad", "RerankStep", "RerankForward"]


class GumbelTopM(NamedTuple):
    """Result of :func:`gumbel_topm`: ``indices [B, M]`` int64 (``-1`` = no item), ``logp [B, M]`` float32."""

    indices: torch.Tensor
    logp: torch.Tensor


class ReinforceGrad(NamedTuple):
    """Result of :func:`reinforce_grad`.

    ``loss`` scalar float32, ``dWq``/``dWm`` ``[d, d]`` float32, ``scores [B, K]`` float32 (at the
    current adapters), ``g [B, K]`` float32 (``dloss/dscores``).
    """

    loss: torch.Tensor
    dWq: torch.Tensor
    dWm: torch.Tensor
    scores: torch.Tensor
    g: torch.Tensor


class RerankStep(NamedTuple):
    """Result of :func:`rerank_step`: the selection and the gradient of the REINFORCE loss."""

    indices: torch.Tensor
    scores: torch.Tensor
    logp: torch.Tensor
    loss: torch.Tensor
    dWq: torch.Tensor
    dWm: torch.Tensor


class RerankForward(NamedTuple):
    """Intermediates of the forward pass: ``qp = q' [B, d]``, ``r [B, d]``, ``scores [B, K]`` (fp32)."""

    qp: torch.Tensor
    r: torch.Tensor
    scores: torch.Tensor
