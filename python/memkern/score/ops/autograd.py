"""The composable autograd op of the reranker scores (:class:`RerankScores`, closed-form backward;
fused on the Triton path)."""
from __future__ import annotations

from ...errors import require

require("reranker", "torch", feature="memkern.ops")  # names the extra when a package is missing
import torch

from . import torch_path
from .backend import forward_pass, triton_kernels

__all__ = ["RerankScores"]


class RerankScores(torch.autograd.Function):
    """Differentiable scores ``s_bi = m_bi . ((I + Wm)^T (I + Wq) q_b)`` (composable autograd op).

    ``RerankScores.apply(q [B, d], Wq [d, d], Wm [d, d], candidates, ids, valid, backend)`` with
    ``candidates`` dense ``[B, K, d]`` (``ids`` None) or a table ``[N, d]`` addressed by int64
    ``ids [B, K]`` (``-1`` = padding), ``valid`` an optional bool ``[B, K]`` (False = padding, score
    ``-inf``, zero gradient) and ``backend`` ``"torch"`` or ``"triton"`` (already resolved: use
    :func:`rerank_scores`, which validates, resolves and logs the choice). Forward: the torch path
    (batched GEMMs; float64 inputs are computed in float64, everything else in float32) or the fused
    Triton scoring kernel after two cuBLAS GEMMs. Backward (closed form; row vectors, ``G = dL/dS``
    with padding zeroed)::

        u_b = sum_i g_bi m_bi            (dL/dr_b; Triton: one program per query)
        dWm = Q'^T U                     (r = q' + q' Wm)
        V   = U + U Wm^T                 (dL/dq')
        dWq = V^T Q,  dQ = V + V Wq      (q' = q + q Wq^T)
        dm_bi = g_bi r_b                 (dense candidates; a table gets these rows index-added)

    First-order only (``once_differentiable``).
    """

    @staticmethod
    def forward(ctx, q2, Wq, Wm, candidates, ids, valid, backend):
        dt = torch.float64 if (backend == "torch" and q2.dtype == torch.float64) else torch.float32
        dense, table = (candidates, None) if ids is None else (None, candidates)
        q, qp, r, _, s = forward_pass(backend, q2, Wq, Wm, dense, ids, table, valid, dt)
        ctx.backend = backend
        ctx.dtypes = (q2.dtype, Wq.dtype, Wm.dtype, candidates.dtype)
        ctx.save_for_backward(q, qp, r, Wq, Wm, candidates, ids, valid)
        return s

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, gs):
        q, qp, r, Wq, Wm, cands, ids, valid = ctx.saved_tensors
        dt = r.dtype
        g = gs.to(dt)
        if valid is not None:
            g = g.masked_fill(~valid, 0.0)
        dense, table = (cands, None) if ids is None else (None, cands)
        if ctx.backend == "torch":
            U = torch.bmm(g.unsqueeze(1), torch_path.gather_candidates(dense, ids, table, dt)).squeeze(1)
        else:
            U = triton_kernels().combine(g, dense, ids, table)
        need = ctx.needs_input_grad
        dq = dWq = dWm = dC = None
        if need[2]:
            dWm = torch.mm(qp.t(), U).to(ctx.dtypes[2])
        if need[0] or need[1]:
            V = torch.addmm(U, U, Wm.to(dt).t())
            if need[1]:
                dWq = torch.mm(V.t(), q).to(ctx.dtypes[1])
            if need[0]:
                dq = torch.addmm(V, V, Wq.to(dt)).to(ctx.dtypes[0])
        if need[3]:
            rows = g.unsqueeze(-1) * r.unsqueeze(1)                     # [B, K, d]
            if ids is None:
                dC = rows.to(ctx.dtypes[3])
            else:
                dC = torch.zeros(table.shape, dtype=dt, device=table.device)
                dC.index_add_(0, ids.clamp_min(0).reshape(-1), rows.reshape(-1, rows.shape[-1]))
                dC = dC.to(ctx.dtypes[3])
        return dq, dWq, dWm, dC, None, None, None
