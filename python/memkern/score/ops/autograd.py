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

import logging
import os
from typing import NamedTuple

from ...errors import require

require("reranker", "torch", feature="memkern.ops")  # names the extra when a package is missing
import torch

from ...errors import BackendUnavailableError, MemkernTypeError, bad_arg
from ...base.validate import check_choice, check_float, check_int, is_int

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

log = logging.getLogger("memkern")

LOGP_MODES = ("softmax", "plackett_luce")
_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
_U_MIN = 1e-10  # uniforms are clamped to [_U_MIN, 1) before the Gumbel transform (both backends)


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


# ----------------------------------------------------------------------------------------------
# backend choice
# ----------------------------------------------------------------------------------------------
_TRITON_STATUS: tuple[bool, str] | None = None
_LOGGED: set[tuple[str, str]] = set()


def _triton_status() -> tuple[bool, str]:
    global _TRITON_STATUS
    if _TRITON_STATUS is None:
        try:
            import triton  # noqa: F401

            _TRITON_STATUS = (True, f"triton {triton.__version__} importable")
        except Exception as exc:  # pragma: no cover - depends on the environment
            _TRITON_STATUS = (False, f"triton is not importable ({type(exc).__name__}: {exc})")
    return _TRITON_STATUS


def _interpret() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def resolve_backend(backend: str, device: torch.device) -> str:
    """Return ``"triton"`` or ``"torch"`` for tensors on ``device``.

    ``"triton"`` raises :class:`BackendUnavailableError` (saying why) when Triton cannot run
    there: Triton missing, or a non-CUDA device without ``TRITON_INTERPRET=1``. ``"auto"`` picks
    Triton only for CUDA tensors with Triton importable and logs its choice once per device type.
    """
    check_choice("backend", backend, ("auto", "triton", "torch"))
    if backend == "torch":
        return "torch"
    if backend == "auto" and device.type != "cuda":   # decided without importing triton
        key = ("torch", device.type)
        if key not in _LOGGED:
            _LOGGED.add(key)
            log.info("memkern.ops: backend='auto' chose 'torch' for %s tensors (tensors are not on CUDA)",
                     device.type)
        return "torch"
    ok, why = _triton_status()
    if backend == "triton":
        if not ok:
            raise BackendUnavailableError(f"backend='triton' refused: {why}")
        if device.type != "cuda" and not _interpret():
            raise BackendUnavailableError(
                f"backend='triton' refused: tensors are on {device.type!r}, Triton kernels need CUDA "
                "tensors (or TRITON_INTERPRET=1 set before import to run them, slowly, on CPU); "
                "use backend='torch' or 'auto'")
        return "triton"
    choice = "triton" if ok else "torch"
    key = (choice, device.type)
    if key not in _LOGGED:
        _LOGGED.add(key)
        reason = why
        log.info("memkern.ops: backend='auto' chose %r for %s tensors (%s)", choice, device.type, reason)
    return choice


def _kernels():
    from memkern.kernels import rerank as k  # imports triton; only on the triton path

    return k


# ----------------------------------------------------------------------------------------------
# Philox4x32-10, bit-identical to triton.language.rand (counter = offset, key = seed)
# ----------------------------------------------------------------------------------------------
_M32 = 0xFFFFFFFF
_PHILOX_KEY_A = 0x9E3779B9
_PHILOX_KEY_B = 0xBB67AE85
_PHILOX_ROUND_A = 0xD2511F53
_PHILOX_ROUND_B = 0xCD9E8D57


def _mulhilo32_wrap(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # the int64 product wraps modulo 2^64 (two's complement), which keeps all 64 bits of a*b
    p = a * b
    return torch.bitwise_right_shift(p, 32) & _M32, p & _M32


def _mulhilo32_split(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # 32x32 -> 64-bit product without overflowing int64: split b into 16-bit halves.
    b_lo = b & 0xFFFF
    b_hi = torch.bitwise_right_shift(b, 16)
    p_lo = a * b_lo                      # < 2^48
    p_hi = a * b_hi                      # < 2^48
    hi = torch.bitwise_right_shift(p_hi + torch.bitwise_right_shift(p_lo, 16), 16)
    lo = ((p_hi & 0xFFFF) * 65536 + p_lo) & _M32
    return hi, lo


def _wrap_ok() -> bool:
    # torch's int64 multiply wraps on every platform we know of; check it (scalar and vector kernels)
    b = torch.arange(2**32 - 4099, 2**32, 7, dtype=torch.int64)
    return all(torch.equal(x, y) for x, y in zip(_mulhilo32_wrap(_PHILOX_ROUND_A, b),
                                                 _mulhilo32_split(_PHILOX_ROUND_A, b)))


_mulhilo32 = _mulhilo32_wrap if _wrap_ok() else _mulhilo32_split


def philox_uniform(seed: int, offsets: torch.Tensor) -> torch.Tensor:
    """Uniforms in ``[0, 1)`` (float32) for integer ``offsets`` under ``seed``, like ``tl.rand``.

    Counter-based: the value at an offset depends only on ``(seed, offset)``. Implements
    Philox4x32 with 10 rounds (counter ``(offset_lo, offset_hi, 0, 0)``, key
    ``(seed_lo, seed_hi)``) and Triton's int-to-float conversion, so it reproduces
    ``triton.language.rand(seed, offsets)`` bit for bit.

    Parameters
    ----------
    seed : int, ``0 <= seed < 2**63``
    offsets : int64 tensor of any shape, values ``>= 0``
    """
    if offsets.device.type == "cpu" and not _FORCE_TORCH_PHILOX:
        return torch.from_numpy(_philox_uniform_numpy(seed, offsets.to(torch.int64).numpy()))
    off = offsets.to(torch.int64)
    c0 = off & _M32
    c1 = torch.bitwise_right_shift(off, 32) & _M32  # (the >> operator is ~10x slower on CPU)
    c2 = torch.zeros_like(c0)
    c3 = torch.zeros_like(c0)
    k0 = seed & _M32
    k1 = (seed >> 32) & _M32
    for _ in range(10):
        hi_b, lo_b = _mulhilo32(_PHILOX_ROUND_B, c2)
        hi_a, lo_a = _mulhilo32(_PHILOX_ROUND_A, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0 = (k0 + _PHILOX_KEY_A) & _M32
        k1 = (k1 + _PHILOX_KEY_B) & _M32
    x = torch.where(c0 >= 2**31, c0 - 2**32, c0)       # bitcast to int32
    x = torch.where(x < 0, -x - 1, x)                  # ~x for negatives
    # a Python scalar (multiplied in float32), not a tensor built from host memory: capturable in a CUDA graph
    return x.to(torch.float32) * 4.6566127342e-10


_FORCE_TORCH_PHILOX = False  # tests flip it to compare the two implementations


def _philox_uniform_numpy(seed: int, off):
    """The same Philox4x32-10 in numpy uint64 (defined wrap-around, ~5x fewer microseconds per op
    than torch on small CPU arrays)."""
    import numpy as np

    m32 = np.uint64(_M32)
    s32 = np.uint64(32)
    off = off.astype(np.uint64)
    c0 = off & m32
    c1 = off >> s32
    c2 = np.zeros_like(c0)
    c3 = np.zeros_like(c0)
    k0 = seed & _M32
    k1 = (seed >> 32) & _M32
    A = np.uint64(_PHILOX_ROUND_A)
    Bc = np.uint64(_PHILOX_ROUND_B)
    for _ in range(10):
        pb = Bc * c2
        pa = A * c0
        c0, c1, c2, c3 = (pb >> s32) ^ c1 ^ np.uint64(k0), pb & m32, (pa >> s32) ^ c3 ^ np.uint64(k1), pa & m32
        k0 = (k0 + _PHILOX_KEY_A) & _M32
        k1 = (k1 + _PHILOX_KEY_B) & _M32
    x = c0.astype(np.uint32).view(np.int32)          # bitcast to int32
    x = np.where(x < 0, ~x, x)
    return x.astype(np.float32) * np.float32(4.6566127342e-10)


def _seed_int(seed: int | torch.Generator | None, name: str = "seed") -> int:
    if seed is None:
        return 0
    if isinstance(seed, torch.Generator):
        return int(torch.randint(0, 2**62, (1,), generator=seed, device=seed.device).item())
    if not is_int(seed):
        raise bad_arg(name, "an int in [0, 2**63) or a torch.Generator", seed, MemkernTypeError)
    return check_int(name, seed, 0, 2**63 - 1, expected="an int in [0, 2**63)")


# ----------------------------------------------------------------------------------------------
# validation (shape/dtype/device only: no host syncs unless check=True)
# ----------------------------------------------------------------------------------------------
def _is_float(t: torch.Tensor) -> bool:
    return t.dtype in _FLOAT_DTYPES


def _prepare(q, Wq, Wm, candidates, ids, mask, check):
    """Validate and normalise. Returns ``(q2 [B,d], squeezed, dense_or_None, ids_or_None,
    table_or_None, valid_or_None)``."""
    for name, t in (("q", q), ("Wq", Wq), ("Wm", Wm), ("candidates", candidates)):
        if not isinstance(t, torch.Tensor):
            raise bad_arg(name, "a torch.Tensor", type(t).__name__, MemkernTypeError)
        if not _is_float(t):
            raise bad_arg(name, "a float32/float16/bfloat16/float64 tensor", t.dtype, MemkernTypeError)
    squeezed = q.dim() == 1
    q2 = q.unsqueeze(0) if squeezed else q
    if q2.dim() != 2:
        raise bad_arg("q", "shape [d] or [B, d]", tuple(q.shape))
    B, d = q2.shape
    for name, W in (("Wq", Wq), ("Wm", Wm)):
        if tuple(W.shape) != (d, d):
            raise bad_arg(name, f"shape [d, d] = [{d}, {d}] (d from q)", tuple(W.shape))
    dev = q2.device
    for name, t in (("Wq", Wq), ("Wm", Wm), ("candidates", candidates)):
        if t.device != dev:
            raise bad_arg(name, f"a tensor on q's device {dev}", t.device)
    dense = table = None
    if ids is None:
        if candidates.dim() == 2 and squeezed:
            candidates = candidates.unsqueeze(0)
        if candidates.dim() != 3 or candidates.shape[0] != B or candidates.shape[2] != d:
            raise bad_arg("candidates", f"shape [B, K, d] = [{B}, K, {d}] (or a table [N, d] with ids)",
                          tuple(candidates.shape))
        dense = candidates
        K = candidates.shape[1]
    else:
        if not isinstance(ids, torch.Tensor):
            raise bad_arg("ids", "an int64 torch.Tensor", type(ids).__name__, MemkernTypeError)
        if ids.dtype != torch.int64:
            raise bad_arg("ids", "dtype torch.int64", ids.dtype, MemkernTypeError)
        if ids.dim() == 1 and squeezed:
            ids = ids.unsqueeze(0)
        if ids.dim() != 2 or ids.shape[0] != B:
            raise bad_arg("ids", f"shape [B, K] with B = {B}", tuple(ids.shape))
        if ids.device != dev:
            raise bad_arg("ids", f"a tensor on q's device {dev}", ids.device)
        if candidates.dim() != 2 or candidates.shape[1] != d:
            raise bad_arg("candidates", f"an embedding table [N, {d}] when ids are given", tuple(candidates.shape))
        table = candidates
        K = ids.shape[1]
    if K < 1:
        raise bad_arg("candidates", "at least one candidate (K >= 1)", K)
    valid = None
    if mask is not None:
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            raise bad_arg("mask", "a bool torch.Tensor [B, K]", getattr(mask, "dtype", type(mask).__name__),
                          MemkernTypeError)
        if mask.dim() == 1 and squeezed:
            mask = mask.unsqueeze(0)
        if tuple(mask.shape) != (B, K):
            raise bad_arg("mask", f"shape [B, K] = [{B}, {K}]", tuple(mask.shape))
        if mask.device != dev:
            raise bad_arg("mask", f"a tensor on q's device {dev}", mask.device)
        valid = mask
    if ids is not None:
        valid = (ids >= 0) if valid is None else (valid & (ids >= 0))
    if check:
        for name, t in (("q", q2), ("Wq", Wq), ("Wm", Wm), ("candidates", candidates)):
            if not bool(torch.isfinite(t).all()):
                raise bad_arg(name, "finite values (check=True)", "NaN or inf entries")
        if ids is not None and ids.numel():
            lo, hi = int(ids.min()), int(ids.max())
            if lo < -1 or hi >= table.shape[0]:
                raise bad_arg("ids", f"values in [-1, {table.shape[0]}) (table rows)", (lo, hi))
    return q2, squeezed, dense, ids, table, valid


def _check_m(m, K):
    if not is_int(m):
        raise bad_arg("m", "an int", m, MemkernTypeError)
    check_int("m", m, 1, expected="m >= 1")
    if m > K:
        raise bad_arg("m", f"m <= K = {K} (number of candidates)", m)


def _check_tau(tau):
    check_float("tau", tau, 0, low_open=True, expected="a positive float")


def _check_logp(logp):
    if logp not in LOGP_MODES:
        raise bad_arg("logp", "'softmax' or 'plackett_luce'", logp)


# ----------------------------------------------------------------------------------------------
# torch backend
# ----------------------------------------------------------------------------------------------
def _t_adapt(q2, Wq, Wm, dt=torch.float32):
    # q' = q + Wq q ; r = q' + Wm^T q'   (row form: Q' = Q + Q Wq^T, R = Q' + Q' Wm)
    q = q2.to(dt)
    qp = torch.addmm(q, q, Wq.to(dt).t())
    r = torch.addmm(qp, qp, Wm.to(dt))
    return q, qp, r


def _t_cands(dense, ids, table, dt=torch.float32):
    if dense is not None:
        return dense.to(dt)
    return table[ids.clamp_min(0)].to(dt)  # padding rows gather row 0; g is 0 there


def _t_scores(r, C, valid):
    s = torch.bmm(r.unsqueeze(1), C.transpose(1, 2)).squeeze(1)   # [B,1,d] @ [B,d,K]: the fast layout
    if valid is not None:
        s = s.masked_fill(~valid, float("-inf"))
    return s


def _t_stage_lse(z, idx):
    """log-sum-exp of z over the items remaining at each stage: [B, M]."""
    B, K = z.shape
    M = idx.shape[1]
    onehot = torch.zeros(B, M, K, dtype=torch.bool, device=z.device)
    onehot.scatter_(2, idx.clamp_min(0).unsqueeze(-1), (idx >= 0).unsqueeze(-1))
    removed = torch.cumsum(onehot.to(torch.int32), dim=1) - onehot.to(torch.int32)  # sigma_<j
    zz = z.unsqueeze(1).expand(B, M, K).masked_fill(removed > 0, float("-inf"))
    return torch.logsumexp(zz, dim=2), zz, onehot


def _t_logp(z, idx, logp):
    zsel = z.gather(1, idx.clamp_min(0))
    if logp == "softmax":
        lse = torch.logsumexp(z, dim=1, keepdim=True)
    else:
        lse = _t_stage_lse(z, idx)[0]
    return (zsel - lse).masked_fill(idx < 0, 0.0)


def _t_sample(scores, m, tau, seed, offset, greedy, logp):
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
    return idx, _t_logp(z, idx, logp)


def _t_g(scores, idx, adv, tau, logp, B):
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
        lse, zz, onehot = _t_stage_lse(z, idx)                        # [B,M], [B,M,K], [B,M,K]
        P = torch.nan_to_num(torch.exp(zz - lse.unsqueeze(-1)), nan=0.0)   # stage probabilities
        gpos = torch.einsum("bm,bmk->bk", adv, onehot.float() - P)
    lp = (z.gather(1, sel) - lse).masked_fill(idx < 0, 0.0)
    g = torch.nan_to_num(gpos * (-1.0 / (B * tau)), nan=0.0)  # NaN: rows with no valid candidate
    loss = (adv * lp).sum() * (-1.0 / B)
    return g, loss


def _t_grads(q, qp, Wm, C, g):
    # u = M^T g ; dWm = Q'^T U ; V = U + U Wm^T ; dWq = V^T Q
    U = torch.bmm(g.unsqueeze(1), C).squeeze(1)
    dWm = torch.mm(qp.t(), U)
    V = torch.addmm(U, U, Wm.to(U.dtype).t())
    dWq = torch.mm(V.t(), q)
    return dWq, dWm


# ----------------------------------------------------------------------------------------------
# public ops
# ----------------------------------------------------------------------------------------------
def _forward(backend, q2, Wq, Wm, dense, ids, table, valid, dt=torch.float32):
    if backend == "torch":
        q, qp, r = _t_adapt(q2, Wq, Wm, dt)
        C = _t_cands(dense, ids, table, dt)
        return q, qp, r, C, _t_scores(r, C, valid)
    k = _kernels()
    q, qp, r = k.adapt(q2, Wq, Wm)
    scores = k.scores(r, dense, ids, table, valid)
    return q, qp, r, None, scores


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
        q, qp, r, _, s = _forward(backend, q2, Wq, Wm, dense, ids, table, valid, dt)
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
            U = torch.bmm(g.unsqueeze(1), _t_cands(dense, ids, table, dt)).squeeze(1)
        else:
            U = _kernels().combine(g, dense, ids, table)
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
    q2, squeezed, dense, ids, table, valid = _prepare(q, Wq, Wm, candidates, ids, mask, check)
    be = resolve_backend(backend, q2.device)
    if (not return_intermediates and torch.is_grad_enabled()
            and any(t.requires_grad for t in (q2, Wq, Wm, candidates))):
        s = RerankScores.apply(q2, Wq, Wm, dense if dense is not None else table, ids, valid, be)
        return s[0] if squeezed else s
    dt = torch.float64 if (be == "torch" and q2.dtype == torch.float64) else torch.float32
    _, qp, r, _, s = _forward(be, q2, Wq, Wm, dense, ids, table, valid, dt)
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
    if not isinstance(scores, torch.Tensor) or not _is_float(scores):
        raise bad_arg("scores", "a float torch.Tensor [B, K]", getattr(scores, "dtype", type(scores).__name__),
                      MemkernTypeError)
    squeezed = scores.dim() == 1
    s = scores.unsqueeze(0) if squeezed else scores
    if s.dim() != 2:
        raise bad_arg("scores", "shape [B, K] or [K]", tuple(scores.shape))
    B, K = s.shape
    _check_m(m, K)
    _check_tau(tau)
    _check_logp(logp)
    seed = _seed_int(seed)
    _check_offset(offset, s.device)
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
        idx, lp = _t_sample(s, m, float(tau), seed, offset, greedy, logp)
    else:
        idx, lp = _kernels().sample(s, m, float(tau), seed, offset, greedy, logp)
    if squeezed:
        idx, lp = idx[0], lp[0]
    return GumbelTopM(idx, lp)


def _check_offset(offset, device):
    if isinstance(offset, torch.Tensor):
        if offset.dtype != torch.int64 or offset.dim() != 0 or offset.device != device:
            raise bad_arg("offset", f"an int >= 0 or a 0-dim int64 tensor on {device}",
                          f"{offset.dtype} tensor of shape {tuple(offset.shape)} on {offset.device}")
        return
    check_int("offset", offset, 0)


def _advantages(rewards, indices, baseline, name="rewards"):
    if not isinstance(rewards, torch.Tensor):
        raise bad_arg(name, "a torch.Tensor [B, M]", type(rewards).__name__, MemkernTypeError)
    if tuple(rewards.shape) != tuple(indices.shape):
        raise bad_arg(name, f"shape of the selection {tuple(indices.shape)}", tuple(rewards.shape))
    if rewards.device != indices.device:
        raise bad_arg(name, f"a tensor on the selection's device {indices.device}", rewards.device)
    adv = rewards.float() - (baseline.float() if isinstance(baseline, torch.Tensor) else float(baseline))
    return torch.where(indices >= 0, adv, torch.zeros_like(adv))


def _check_indices(indices, B, K):
    if not isinstance(indices, torch.Tensor) or indices.dtype != torch.int64:
        raise bad_arg("indices", "an int64 tensor [B, M]", getattr(indices, "dtype", type(indices).__name__),
                      MemkernTypeError)
    if indices.dim() != 2 or indices.shape[0] != B or not 1 <= indices.shape[1] <= K:
        raise bad_arg("indices", f"shape [B, M] with B = {B}, 1 <= M <= K = {K}", tuple(indices.shape))


def _grad_core(be, q, qp, Wm, C, dense, ids, table, scores, indices, adv, tau, logp, B):
    if be == "torch":
        g, loss = _t_g(scores, indices, adv, tau, logp, B)
        dWq, dWm = _t_grads(q, qp, Wm, C, g)
        return loss, dWq, dWm, g
    k = _kernels()
    g, loss, U = k.reinforce_u(scores, indices, adv, dense, ids, table, tau, logp, B)
    dWq, dWm = k.adapter_grads(q, qp, Wm, U)
    return loss, dWq, dWm, g


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
    q2, squeezed, dense, ids, table, valid = _prepare(q, Wq, Wm, candidates, ids, mask, check)
    B = q2.shape[0]
    K = dense.shape[1] if dense is not None else ids.shape[1]
    if squeezed and isinstance(indices, torch.Tensor) and indices.dim() == 1:
        indices = indices.unsqueeze(0)
        if isinstance(rewards, torch.Tensor) and rewards.dim() == 1:
            rewards = rewards.unsqueeze(0)
    _check_indices(indices, B, K)
    _check_tau(tau)
    _check_logp(logp)
    adv = _advantages(rewards, indices, baseline)
    if check and bool((indices >= K).any()):
        raise bad_arg("indices", f"values in [-1, {K})", "out-of-range entries")
    be = resolve_backend(backend, q2.device)
    q, qp, r, C, scores = _forward(be, q2, Wq, Wm, dense, ids, table, valid)
    loss, dWq, dWm, g = _grad_core(be, q, qp, Wm, C, dense, ids, table, scores, indices, adv, float(tau), logp, B)
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
    q2, squeezed, dense, ids, table, valid = _prepare(q, Wq, Wm, candidates, ids, mask, check)
    B = q2.shape[0]
    K = dense.shape[1] if dense is not None else ids.shape[1]
    _check_m(m, K)
    _check_tau(tau)
    _check_logp(logp)
    seed = _seed_int(seed)
    be = resolve_backend(backend, q2.device)
    if be == "torch":
        q, qp, r, C, scores = _forward(be, q2, Wq, Wm, dense, ids, table, valid)
        idx, lp = _t_sample(scores, m, float(tau), seed, offset, greedy, logp)
    else:  # one fused kernel: scores + Gumbel-top-M + log-probs
        k = _kernels()
        C = None
        q, qp, r = k.adapt(q2, Wq, Wm)
        scores, idx, lp = k.score_sample(r, dense, ids, table, valid, m, float(tau), seed, offset, greedy, logp)
    R = rewards(idx) if callable(rewards) else rewards
    if squeezed and isinstance(R, torch.Tensor) and R.dim() == 1:
        R = R.unsqueeze(0)
    adv = _advantages(R, idx, baseline)
    loss, dWq, dWm, _ = _grad_core(be, q, qp, Wm, C, dense, ids, table, scores, idx, adv, float(tau), logp, B)
    if squeezed:
        return RerankStep(idx[0], scores[0], lp[0], loss, dWq, dWm)
    return RerankStep(idx, scores, lp, loss, dWq, dWm)
