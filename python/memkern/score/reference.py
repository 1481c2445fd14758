"""Naive float64 references of the reranker math, written the slow, obvious way.

These functions exist for tests and benchmarks only. They follow the paper's formulas literally:
they materialise the adapted memories ``m' = m + Wm m`` (``K * d^2`` work per query) and get
gradients from autograd. The fast paths (``memkern.ops`` torch backend and the Triton kernels in
``memkern.kernels.rerank``) must agree with them.

Math (per query, column vectors)::

    q'  = q + Wq q                      [d]
    m_i' = m_i + Wm m_i                 [d]   (materialised here, never in the fast paths)
    s_i = q' . m_i'                     [K]
    z_i = s_i / tau
    softmax variant:      logp_j = z_{sigma_j} - logsumexp_{i valid} z_i
    Plackett-Luce variant: logp_j = z_{sigma_j} - logsumexp_{i valid, i not in sigma_<j} z_i
    loss = -(1/B) sum_b sum_j (R_bj - baseline) logp_bj
"""
from __future__ import annotations

import itertools
import math

from ..errors import require

require("reranker", "torch", feature="memkern.score.reference")  # names the extra when a package is missing
import torch


def reference_scores(q: torch.Tensor, Wq: torch.Tensor, Wm: torch.Tensor, cands: torch.Tensor,
                     valid: torch.Tensor | None = None, prior: torch.Tensor | None = None) -> torch.Tensor:
    """Scores ``s [B, K]`` (float64) with explicit ``m'``; invalid entries are ``-inf``.

    q [B, d], Wq [d, d], Wm [d, d], cands [B, K, d], valid [B, K] bool (None = all valid);
    prior [B, K] (None = none): the scores are then ``prior + (q' . m' - q . m)``.
    """
    q = q.double()
    Wq = Wq.double()
    Wm = Wm.double()
    c = cands.double()
    qp = q + q @ Wq.T                       # q' = q + Wq q (row form)
    mp = c + c @ Wm.T                       # m' = m + Wm m, [B, K, d]
    s = torch.einsum("bkd,bd->bk", mp, qp)
    if prior is not None:
        s = prior.double() + s - torch.einsum("bkd,bd->bk", c, q)
    if valid is not None:
        s = s.masked_fill(~valid, float("-inf"))
    return s


def reference_logp(scores: torch.Tensor, indices: torch.Tensor, tau: float, logp: str) -> torch.Tensor:
    """Per-slot log-probabilities ``[B, M]`` of the selection ``indices`` (``-1`` slots give 0).

    Written with python loops for obviousness; differentiable w.r.t. ``scores``.
    """
    B, M = indices.shape
    z = scores / tau
    rows = []
    for b in range(B):
        removed: list[int] = []
        vals = []
        for j in range(M):
            i = int(indices[b, j])
            if i < 0:
                vals.append(z.new_zeros(()))
                continue
            if logp == "softmax":
                lse = torch.logsumexp(z[b], 0)
            elif logp == "plackett_luce":
                keep = torch.ones_like(z[b], dtype=torch.bool)
                if removed:
                    keep[torch.tensor(removed)] = False
                lse = torch.logsumexp(z[b][keep], 0)
            else:
                raise ValueError(logp)
            vals.append(z[b, i] - lse)
            removed.append(i)
        rows.append(torch.stack(vals))
    return torch.stack(rows)


def reference_loss_and_grads(q, Wq, Wm, cands, indices, rewards, *, tau=0.5, baseline=0.5,
                             logp="softmax", valid=None, prior=None):
    """REINFORCE loss and its gradients by autograd, float64.

    Returns ``(loss, dWq, dWm, scores, logp)``; ``loss = -(1/B) sum_bj (R_bj - b) logp_bj`` with
    slots whose index is ``-1`` contributing nothing; ``prior``: as in :func:`reference_scores`.
    """
    Wq64 = Wq.detach().double().clone().requires_grad_(True)
    Wm64 = Wm.detach().double().clone().requires_grad_(True)
    s = reference_scores(q, Wq64, Wm64, cands, valid, prior)
    lp = reference_logp(s, indices, tau, logp)
    adv = (rewards.double() - torch.as_tensor(baseline, dtype=torch.float64))
    adv = torch.where(indices >= 0, adv, torch.zeros_like(adv))
    loss = -(adv * lp).sum() / q.shape[0]
    dWq, dWm = torch.autograd.grad(loss, (Wq64, Wm64))
    return loss.detach(), dWq, dWm, s.detach(), lp.detach()


def plackett_luce_ordered_probs(scores: torch.Tensor, m: int, tau: float) -> dict[tuple[int, ...], float]:
    """Exact probability of every ordered selection of ``m`` of the finite entries of ``scores [K]``.

    Enumerates ``K! / (K-m)!`` sequences: only for small ``K``.
    """
    z = (scores.double() / tau).tolist()
    items = [i for i, v in enumerate(z) if math.isfinite(v)]
    out: dict[tuple[int, ...], float] = {}
    for seq in itertools.permutations(items, m):
        p = 1.0
        rest = list(items)
        for i in seq:
            mx = max(z[r] for r in rest)
            den = sum(math.exp(z[r] - mx) for r in rest)
            p *= math.exp(z[i] - mx) / den
            rest.remove(i)
        out[seq] = p
    return out


def naive_step(q, Wq, Wm, cands, rewards, *, m, tau=0.5, baseline=0.5, uniforms=None, valid=None):
    """The paper's full step written naively in eager torch (the benchmark's baseline).

    Explicit ``m'``, Gumbel-top-M from ``uniforms [B, K]`` (torch.rand if None), per-item softmax
    log-probabilities, autograd for the gradients. Works in the dtype of the inputs.
    """
    Wq = Wq.detach().clone().requires_grad_(True)
    Wm = Wm.detach().clone().requires_grad_(True)
    qp = q + q @ Wq.T
    mp = cands + cands @ Wm.T
    s = torch.einsum("bkd,bd->bk", mp, qp)
    if valid is not None:
        s = s.masked_fill(~valid, float("-inf"))
    z = s / tau
    u = torch.rand_like(z) if uniforms is None else uniforms
    g = -torch.log(-torch.log(u.clamp_min(1e-10)))
    idx = torch.topk(z.detach() + g, m, dim=1).indices
    lp = torch.log_softmax(z, dim=1).gather(1, idx)
    r = rewards(idx) if callable(rewards) else rewards
    loss = -((r - baseline) * lp).sum() / q.shape[0]
    loss.backward()
    return idx, s.detach(), lp.detach(), loss.detach(), Wq.grad, Wm.grad


class SyntheticCitationTask:
    """A small retrieval task with noisy citations, for reranker tests and stability benchmarks.

    ``N`` unit memories in ``table [N, d]``; a query about gold memory ``g`` is
    ``normalize(A m_g + noise * z / sqrt(d))`` with a hidden distortion ``A = I + distort * G / sqrt(d)``,
    so the retriever (cosine top-``K`` over the table) is imperfect and a linear adapter can correct it.
    A selected memory is cited with probability ``p_hit`` if it is the gold one, ``p_miss`` otherwise
    (reward +1 cited, -1 not). Recall@m: the gold memory is among the greedy top-``m`` of the reranker.
    """

    def __init__(self, d=32, N=400, K=20, seed=0, distort=2.0, noise=1.0, p_hit=0.9, p_miss=0.1, device=None):
        g = torch.Generator().manual_seed(seed)
        self.device = torch.device(device or "cpu")   # where queries/table are handed to the reranker
        self.p_hit, self.p_miss = p_hit, p_miss
        self.d, self.N, self.K = d, N, K
        self.table = torch.nn.functional.normalize(torch.randn(N, d, generator=g), dim=-1)
        self.A = torch.eye(d) + distort * torch.randn(d, d, generator=g) / math.sqrt(d)
        self.noise = noise

    def queries(self, n, gen):
        """``(q [n, d], ids [n, K] retriever top-K, gold [n])``."""
        gold = torch.randint(0, self.N, (n,), generator=gen)
        z = torch.randn(n, self.d, generator=gen) / math.sqrt(self.d)
        q = torch.nn.functional.normalize(self.table[gold] @ self.A.T + self.noise * z, dim=-1)
        ids = torch.topk(q @ self.table.T, self.K, dim=1).indices
        return q, ids, gold

    @staticmethod
    def rewards(sel_ids, gold, gen, p_hit=0.9, p_miss=0.1):
        p = torch.where(sel_ids == gold[:, None], p_hit, p_miss)
        return torch.where(torch.rand(p.shape, generator=gen) < p, 1.0, -1.0)

    def recall(self, rr, q, ids, gold, m=5):
        dev = self.device
        sel = rr.select(q.to(dev), (ids.to(dev), self.table.to(dev)), greedy=True, m=m)
        return float((sel.selected_ids.cpu() == gold[:, None]).any(1).float().mean())

    def train(self, rr, steps, B=4, seed=1, n_eval=400, eval_seed=999):
        """One online pass of ``steps`` batches; returns ``(recall_before, recall_after, stats)``
        on ``n_eval`` held-back queries."""
        gen = torch.Generator().manual_seed(seed)
        qe, ide, goe = self.queries(n_eval, torch.Generator().manual_seed(eval_seed))
        r0 = self.recall(rr, qe, ide, goe)
        stats = []
        dev = self.device
        table = self.table.to(dev)
        for _ in range(steps):
            q, ids, gold = self.queries(B, gen)
            sel = rr.select(q.to(dev), (ids.to(dev), table))
            # rewards are computed on the CPU and handed over as they are (update accepts any device)
            stats.append(rr.update(sel, self.rewards(sel.selected_ids.cpu(), gold, gen, self.p_hit, self.p_miss)))
        return r0, self.recall(rr, qe, ide, goe), stats
