"""Functional reranker ops: residual-adapter scoring, Gumbel top-M sampling, REINFORCE gradients.

Math (per query; column vectors; ``Wq``, ``Wm`` are ``[d, d]``)::

    q'  = q + Wq q                           adapted query                       [d]
    r   = q' + Wm^T q'  = (I + Wm)^T q'       "reading vector"                    [d]
    s_i = m_i . r                             score of candidate i                [K]

This equals the paper's ``s_i = q' . m_i'`` with ``m_i' = m_i + Wm m_i``, but ``m'`` is never
materialised: the cost is ``O(d^2 + K d)`` per query instead of ``O(K d^2)``.

Sampling (``gumbel_topm``): with ``z_i = s_i / tau`` and ``g_i = -log(-log u_i)``, ``u_i`` from a
counter-based Philox generator keyed by ``(seed, offset + b*K + i)``, the ``M`` largest keys
``z_i + g_i`` (in decreasing order) are an exact draw of ``M`` items without replacement from the
Plackett-Luce distribution with weights ``softmax(z)``. Padding (``mask`` False or id ``-1``) has
key ``-inf`` and is never drawn. A row with fewer than ``M`` valid candidates selects all its
valid ones and fills the remaining slots with index ``-1`` (log-prob 0, reward ignored).

Log-probabilities of the draw ``sigma`` (``logp=``):

* ``"softmax"`` (the paper's): ``logp_j = z_{sigma_j} - logsumexp_{i valid} z_i``
* ``"plackett_luce"`` (exact): ``logp_j = z_{sigma_j} - logsumexp_{i valid, not in sigma_<j} z_i``;
  ``sum_j logp_j`` is the exact log-probability of the ordered draw.

REINFORCE (``reinforce_grad``)::

    A_bj = R_bj - baseline                   (0 on -1 slots)
    loss = -(1/B) sum_b sum_j A_bj logp_bj

Closed-form gradient (derivation, per query b, dropping b):

    g_i  = dL/ds_i = -(1/(B tau)) sum_j A_j (1[i = sigma_j] - p^(j)_i)
           with p^(j) = softmax(z) (softmax variant) or softmax of z over the items still
           remaining at stage j (Plackett-Luce variant)
    u    = dL/dr = sum_i g_i m_i = M^T g                                           [d]
    r_k  = q'_k + sum_j Wm[j,k] q'_j      =>  dL/dWm[j,k] = q'_j u_k, i.e. dWm = q' u^T
    dL/dq' = (I + Wm) u =: v ;  q'_j = q_j + sum_k Wq[j,k] q_k  =>  dWq = v q^T
    batch: dWm = Q'^T U, dWq = V^T Q with V = U + U Wm^T (rows u_b, v_b); the 1/B is in g.

Backends: ``"torch"`` (any device; batched matmuls, no Python loop over the batch),
``"triton"`` (CUDA tensors; or CPU tensors when ``TRITON_INTERPRET=1`` is set, for tests), and
``"auto"`` (Triton for CUDA tensors when Triton imports, torch otherwise; the choice is logged once
on ``logging.getLogger("memkern")``). Both backends draw the *same* uniforms for the same
``(seed, offset)`` (the torch path implements Triton's Philox4x32-10 bit for bit), so they select
the same items except where two keys differ only by float rounding.

``rerank_scores`` is also a composable autograd op (:class:`RerankScores`, closed-form backward;
fused on the Triton path): gradients reach ``q``, ``Wq``, ``Wm`` and the candidates whenever one of
them requires grad.

Naive float64 references (explicit ``m'``, autograd) used by the tests live in
``memkern.score.reference``; the Triton kernels are in ``memkern.kernels.rerank``.
"""
from __future__ import annotations

from ...errors import require

require("reranker", "torch", feature="memkern.ops")  # names the extra when a package is missing
import torch

from ...errors import MemkernTypeError, bad_arg
from . import torch_path
from .autograd import RerankScores
from .backend import forward_pass, reinforce_core, resolve_backend, triton_kernels
from .checks import (advantages, check_indices, check_logp, check_m, check_offset, check_tau, is_float,
                     prepare_inputs, seed_int)
from .results import GumbelTopM, ReinforceGrad, RerankForward, RerankStep

__all__ = ["rerank_scores", "gumbel_topm", "reinforce_grad", "rerank_step"]


def rerank_scores(q, Wq, Wm, candidates, ids=None, mask=None, *, backend="auto", check=False,
                  return_intermediates=False):
    """Scores of candidates under the residual adapters, ``s_i = m_i . ((I + Wm)^T (I + Wq) q)``.

    Differentiable in ``q``, ``Wq``, ``Wm`` and ``candidates`` (dense, or the table): when grad
    mode is on and one of them requires grad, the scores come from :class:`RerankScores` (closed-form
    backward, fused on the Triton path), so any loss and optimizer can train the adapters.

    Parameters
    ----------
    q : ``[B, d]`` or ``[d]`` float tensor (fp32/fp16/bf16/fp64; computed in fp32)
    Wq, Wm : ``[d, d]`` float tensors (adapters; zero = the retriever's own scores ``m_i . q``)
    candidates : ``[B, K, d]`` dense candidate embeddings, or, when ``ids`` is given, the
        embedding table ``[N, d]`` (e.g. ``MemoryStore.embeddings``) gathered inside the kernel
    ids : optional int64 ``[B, K]`` row numbers into the table, ``-1`` = padding
    mask : optional bool ``[B, K]``, False = padding
    backend : ``"auto" | "triton" | "torch"``
    check : also check for NaN/inf inputs and out-of-range ids (host sync)

    Returns
    -------
    scores : float32 ``[B, K]`` (``[K]`` for a 1-D ``q``; float64 for a float64 ``q`` on the torch
    backend); padding is ``-inf``.
    With ``return_intermediates=True``: :class:`RerankForward` ``(qp, r, scores)``.
    """
    q2, squeezed, dense, ids, table, valid = prepare_inputs(q, Wq, Wm, candidates, ids, mask, check)
    be = resolve_backend(backend, q2.device)
    if (not return_intermediates and torch.is_grad_enabled()
            and any(t.requires_grad for t in (q2, Wq, Wm, candidates))):
        s = RerankScores.apply(q2, Wq, Wm, dense if dense is not None else table, ids, valid, be)
        return s[0] if squeezed else s
    dt = torch.float64 if (be == "torch" and q2.dtype == torch.float64) else torch.float32
    _, qp, r, _, s = forward_pass(be, q2, Wq, Wm, dense, ids, table, valid, dt)
    if return_intermediates:
        return RerankForward(qp, r, s)
    return s[0] if squeezed else s


def gumbel_topm(scores, m, tau=0.5, seed=0, offset=0, mask=None, logp="softmax", *, greedy=False,
                backend="auto", check=False):
    """Draw ``m`` of ``K`` items without replacement from Plackett-Luce(``softmax(scores / tau)``).

    Gumbel-top-M: keys ``z_i + g_i`` with ``z = scores / tau``, ``g_i = -log(-log u_i)``, ``u_i`` =
    Philox uniform at counter ``offset + b*K + i`` under ``seed`` (clamped to ``>= 1e-10``); the
    ``m`` largest keys in decreasing order are the draw. ``greedy=True`` drops the noise (top-m
    by score). Same ``(seed, offset)`` gives the same draw; use a new ``offset`` (e.g. advance
    by ``B*K``) for a fresh draw under one seed.

    Parameters
    ----------
    scores : float ``[B, K]`` or ``[K]``; ``-inf`` entries are padding
    m : int, ``1 <= m <= K``
    tau : float > 0, temperature
    seed : int in ``[0, 2**63)`` or ``torch.Generator`` (an int seed is drawn from it)
    offset : int >= 0, Philox counter base; or a 0-dim int64 tensor on the scores' device holding
        it, read on the device (no host read: the draw can be captured in a CUDA graph and replayed
        with a new counter value)
    mask : optional bool ``[B, K]``, False = padding (never selected)
    logp : ``"softmax"`` (paper, per-item ``log softmax(z)_i``) or ``"plackett_luce"`` (exact
        per-stage terms; their sum is the log-probability of the ordered draw)
    check : raise on NaN scores (host sync); without it NaN scores give unspecified selections

    Returns
    -------
    :class:`GumbelTopM` ``(indices [B, m] int64, logp [B, m] float32)``. Rows with fewer than
    ``m`` valid items return all valid ones, then ``-1`` with ``logp`` 0.
    """
    if not isinstance(scores, torch.Tensor) or not is_float(scores):
        raise bad_arg("scores", "a float torch.Tensor [B, K]", getattr(scores, "dtype", type(scores).__name__),
                      MemkernTypeError)
    squeezed = scores.dim() == 1
    s = scores.unsqueeze(0) if squeezed else scores
    if s.dim() != 2:
        raise bad_arg("scores", "shape [B, K] or [K]", tuple(scores.shape))
    B, K = s.shape
    check_m(m, K)
    check_tau(tau)
    check_logp(logp)
    seed = seed_int(seed)
    check_offset(offset, s.device)
    s = s.float()
    if mask is not None:
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            raise bad_arg("mask", "a bool tensor [B, K]", getattr(mask, "dtype", type(mask).__name__), MemkernTypeError)
        mk = mask.unsqueeze(0) if (squeezed and mask.dim() == 1) else mask
        if tuple(mk.shape) != (B, K):
            raise bad_arg("mask", f"shape [B, K] = [{B}, {K}]", tuple(mask.shape))
        s = s.masked_fill(~mk, float("-inf"))
    if check and bool(torch.isnan(s).any()):
        rows = torch.isnan(s).any(1).nonzero().flatten().tolist()
        raise bad_arg("scores", "no NaN entries (check=True)", f"NaN in rows {rows[:10]}")
    be = resolve_backend(backend, s.device)
    if be == "torch":
        idx, lp = torch_path.sample(s, m, float(tau), seed, offset, greedy, logp)
    else:
        idx, lp = triton_kernels().sample(s, m, float(tau), seed, offset, greedy, logp)
    if squeezed:
        idx, lp = idx[0], lp[0]
    return GumbelTopM(idx, lp)


def reinforce_grad(q, Wq, Wm, candidates, indices, rewards, ids=None, mask=None, *, tau=0.5, baseline=0.5,
                   logp="softmax", backend="auto", check=False):
    """REINFORCE loss and closed-form gradients of ``Wq`` and ``Wm`` for a given selection.

    ``loss = -(1/B) sum_b sum_j (R_bj - baseline) logp_bj`` with ``logp`` recomputed from the
    scores at the *current* adapters (so a stored selection can be replayed). Gradients are
    rank-1 per query (see the module docstring): ``dWm = sum_b q'_b u_b^T``,
    ``dWq = sum_b ((I + Wm) u_b) q_b^T`` with ``u_b = sum_i g_bi m_bi`` and ``g = dloss/ds``, which
    already carries the batch mean's ``1/B``.

    Parameters
    ----------
    q, Wq, Wm, candidates, ids, mask : as in :func:`rerank_scores`
    indices : int64 ``[B, M]`` selection (``-1`` slots are ignored)
    rewards : float ``[B, M]`` (e.g. +1 cited, -1 not cited)
    baseline : float or tensor broadcastable to ``[B, M]``
    logp : ``"softmax"`` or ``"plackett_luce"``

    Returns
    -------
    :class:`ReinforceGrad` ``(loss, dWq [d, d], dWm [d, d], scores [B, K], g [B, K])``, float32.
    """
    q2, squeezed, dense, ids, table, valid = prepare_inputs(q, Wq, Wm, candidates, ids, mask, check)
    B = q2.shape[0]
    K = dense.shape[1] if dense is not None else ids.shape[1]
    if squeezed and isinstance(indices, torch.Tensor) and indices.dim() == 1:
        indices = indices.unsqueeze(0)
        if isinstance(rewards, torch.Tensor) and rewards.dim() == 1:
            rewards = rewards.unsqueeze(0)
    check_indices(indices, B, K)
    check_tau(tau)
    check_logp(logp)
    adv = advantages(rewards, indices, baseline)
    if check and bool((indices >= K).any()):
        raise bad_arg("indices", f"values in [-1, {K})", "out-of-range entries")
    be = resolve_backend(backend, q2.device)
    q, qp, r, C, scores = forward_pass(be, q2, Wq, Wm, dense, ids, table, valid)
    loss, dWq, dWm, g = reinforce_core(be, q, qp, Wm, C, dense, ids, table, scores, indices, adv, float(tau), logp, B)
    return ReinforceGrad(loss, dWq, dWm, scores, g)


def rerank_step(q, Wq, Wm, candidates, rewards, m, tau=0.5, seed=0, offset=0, ids=None, mask=None, *,
                baseline=0.5, logp="softmax", greedy=False, backend="auto", check=False):
    """Fused score + Gumbel-top-M sample + log-prob + REINFORCE gradient.

    ``rewards`` is either a float tensor ``[B, m]`` (rewards of the slots of the draw that
    ``(seed, offset)`` produces) or a callable ``rewards(indices [B, m]) -> [B, m]`` called between
    sampling and the gradient. The forward intermediates (``q'``, ``r``, scores) are computed once.

    Returns
    -------
    :class:`RerankStep` ``(indices [B, m], scores [B, K], logp [B, m], loss, dWq [d, d], dWm [d, d])``.
    """
    q2, squeezed, dense, ids, table, valid = prepare_inputs(q, Wq, Wm, candidates, ids, mask, check)
    B = q2.shape[0]
    K = dense.shape[1] if dense is not None else ids.shape[1]
    check_m(m, K)
    check_tau(tau)
    check_logp(logp)
    seed = seed_int(seed)
    be = resolve_backend(backend, q2.device)
    if be == "torch":
        q, qp, r, C, scores = forward_pass(be, q2, Wq, Wm, dense, ids, table, valid)
        idx, lp = torch_path.sample(scores, m, float(tau), seed, offset, greedy, logp)
    else:  # one fused kernel: scores + Gumbel-top-M + log-probs
        k = triton_kernels()
        C = None
        q, qp, r = k.adapt(q2, Wq, Wm)
        scores, idx, lp = k.score_sample(r, dense, ids, table, valid, m, float(tau), seed, offset, greedy, logp)
    R = rewards(idx) if callable(rewards) else rewards
    if squeezed and isinstance(R, torch.Tensor) and R.dim() == 1:
        R = R.unsqueeze(0)
    adv = advantages(R, idx, baseline)
    loss, dWq, dWm, _ = reinforce_core(be, q, qp, Wm, C, dense, ids, table, scores, idx, adv, float(tau), logp, B)
    if squeezed:
        return RerankStep(idx[0], scores[0], lp[0], loss, dWq, dWm)
    return RerankStep(idx, scores, lp, loss, dWq, dWm)
