"""The plain-torch backend of the reranker ops (any device; batched matmuls, no Python loop over
the batch): adapters, candidate gather, scores, Gumbel-top-M sampling with its log-probabilities and
the closed-form REINFORCE gradients (the math is in :mod:`memkern.score.ops.functional`)."""
from __future__ import annotations

from ...errors import require

require("reranker", "torch", feature="memkern.ops")  # names the extra when a package is missing
import torch

from .philox import philox_uniform

__all__ = ["adapt", "gather_candidates", "candidate_scores", "stage_lse", "draw_logp", "sample", "score_grad",
           "adapter_grads"]

_U_MIN = 1e-10  # uniforms are clamped to [_U_MIN, 1) before the Gumbel transform (both backends)


def adapt(q2, Wq, Wm, dt=torch.float32):
    """``(q, q' [B, d], r [B, d])`` in ``dt`` from the queries ``q2 [B, d]`` and the adapters."""
    # q' = q + Wq q ; r = q' + Wm^T q'   (row form: Q' = Q + Q Wq^T, R = Q' + Q' Wm)
    q = q2.to(dt)
    qp = torch.addmm(q, q, Wq.to(dt).t())
    r = torch.addmm(qp, qp, Wm.to(dt))
    return q, qp, r


def gather_candidates(dense, ids, table, dt=torch.float32):
    """Candidates ``[B, K, d]`` in ``dt``: the dense ones, or the table rows of ``ids``."""
    if dense is not None:
        return dense.to(dt)
    return table[ids.clamp_min(0)].to(dt)  # padding rows gather row 0; g is 0 there


def candidate_scores(r, C, valid):
    """Scores ``[B, K]`` = ``r . m_i``, ``-inf`` where ``valid`` is False."""
    s = torch.bmm(r.unsqueeze(1), C.transpose(1, 2)).squeeze(1)   # [B,1,d] @ [B,d,K]: the fast layout
    if valid is not None:
        s = s.masked_fill(~valid, float("-inf"))
    return s


def stage_lse(z, idx):
    """log-sum-exp of z over the items remaining at each stage: [B, M]."""
    B, K = z.shape
    M = idx.shape[1]
    onehot = torch.zeros(B, M, K, dtype=torch.bool, device=z.device)
    onehot.scatter_(2, idx.clamp_min(0).unsqueeze(-1), (idx >= 0).unsqueeze(-1))
    removed = torch.cumsum(onehot.to(torch.int32), dim=1) - onehot.to(torch.int32)  # sigma_<j
    zz = z.unsqueeze(1).expand(B, M, K).masked_fill(removed > 0, float("-inf"))
    return torch.logsumexp(zz, dim=2), zz, onehot


def draw_logp(z, idx, logp):
    """Log-probabilities ``[B, M]`` of the draw ``idx`` under ``logp`` (0 on ``-1`` slots)."""
    zsel = z.gather(1, idx.clamp_min(0))
    if logp == "softmax":
        lse = torch.logsumexp(z, dim=1, keepdim=True)
    else:
        lse = stage_lse(z, idx)[0]
    return (zsel - lse).masked_fill(idx < 0, 0.0)


def sample(scores, m, tau, seed, offset, greedy, logp):
    """Gumbel-top-M draw (or top-M by score when ``greedy``): ``(indices [B, m], logp [B, m])``."""
    B, K = scores.shape
    z = scores / tau
    if greedy:
        keys = z
    else:
        offs = offset + torch.arange(B * K, device=scores.device, dtype=torch.int64).view(B, K)
        u = philox_uniform(seed, offs).clamp_min(_U_MIN)
        keys = z + (-torch.log(-torch.log(u)))
    top = torch.topk(keys, m, dim=1)
    idx = top.indices.masked_fill(~(top.values > float("-inf")), -1)   # padding (and NaN keys) -> -1
    return idx, draw_logp(z, idx, logp)


def score_grad(scores, idx, adv, tau, logp, B):
    """g = dL/ds [B, K] and loss, from scores (fp32, -inf padding), selection and advantages."""
    # adv is already 0 on -1 slots (callers mask it)
    z = scores / tau
    sel = idx.clamp_min(0)
    if logp == "softmax":
        p = torch.softmax(z, dim=1)                                   # [B, K]
        onehot = torch.zeros_like(z).scatter_add_(1, sel, adv)        # sum_j A_j 1[i=sigma_j]
        gpos = onehot - p * adv.sum(1, keepdim=True)
        lse = torch.logsumexp(z, dim=1, keepdim=True)
    else:
        lse, zz, onehot = stage_lse(z, idx)                        # [B,M], [B,M,K], [B,M,K]
        P = torch.nan_to_num(torch.exp(zz - lse.unsqueeze(-1)), nan=0.0)   # stage probabilities
        gpos = torch.einsum("bm,bmk->bk", adv, onehot.float() - P)
    lp = (z.gather(1, sel) - lse).masked_fill(idx < 0, 0.0)
    g = torch.nan_to_num(gpos * (-1.0 / (B * tau)), nan=0.0)  # NaN: rows with no valid candidate
    loss = (adv * lp).sum() * (-1.0 / B)
    return g, loss


def adapter_grads(q, qp, Wm, C, g):
    """``(dWq, dWm)`` from the score gradient ``g [B, K]`` and the candidates ``C [B, K, d]``."""
    # u = M^T g ; dWm = Q'^T U ; V = U + U Wm^T ; dWq = V^T Q
    U = torch.bmm(g.unsqueeze(1), C).squeeze(1)
    dWm = torch.mm(qp.t(), U)
    V = torch.addmm(U, U, Wm.to(U.dtype).t())
    dWq = torch.mm(V.t(), q)
    return dWq, dWm
