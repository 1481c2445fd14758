"""Triton kernels of the reranker: residual-adapter scoring, Gumbel top-M sampling, REINFORCE gradient.

Math (per query b; column vectors)::

    q' = q + Wq q,   r = q' + Wm^T q',   s_i = m_i . r      (m' = m + Wm m is never materialised)
    z_i = s_i / tau, key_i = z_i - log(-log u_i),  u_i = tl.rand(seed, offset + b*K + i) (Philox)
    draw = the M largest keys in decreasing order (Plackett-Luce without replacement)
    g_i = dL/ds_i = -(1/(B tau)) sum_j A_j (1[i = sigma_j] - p^(j)_i),   u = sum_i g_i m_i
    dWm = Q'^T U,  dWq = V^T Q,  V = U + U Wm^T

Kernels
-------
(the ``d x d`` adapter products Q' = Q + Q Wq^T, R = Q' + Q' Wm and the rank-B gradient products
dWm = Q'^T U, V = U + U Wm^T, dWq = V^T Q are cuBLAS GEMMs through ``torch.addmm``/``torch.mm``:
a hand-written Triton matmul measured ~15x slower than cuBLAS at d = 768 on an H200)
``_score_sample_kernel``  one program per query: scores from R and the candidates (dense
                          ``[B, K, d]`` or ids gathered from a table ``[N, d]``), then Gumbel-top-M
                          with per-slot log-probabilities (softmax or Plackett-Luce). Can also
                          start from given scores (``FROM_SCORES``) or stop after scoring (M = 0).
``_reinforce_kernel``     one program per query: g = dL/ds from scores, selection and advantages,
                          per-row loss, and u = sum_i g_i m_i.
``_combine_kernel``       one program per query: u = sum_i g_i m_i for a given g (the backward of
                          the scores w.r.t. the reading vector r, used by ``memkern.ops.RerankScores``).
``_rand_kernel``          the raw uniforms, for tests (the torch backend reproduces them).

Inputs may be fp32, fp16 or bf16; every load is converted to fp32 before arithmetic (the Triton
interpreter computes bf16 arithmetic wrongly) and accumulation is fp32. The plain-torch backend and
the validation live in ``memkern.ops``; the naive float64 references in ``memkern.score.reference``.
"""
from __future__ import annotations

from memkern.errors import require

require("triton", "torch", "triton", feature="memkern.kernels")  # names the extra when a package is missing
import torch
import triton
import triton.language as tl

_U_MIN = 1e-10  # same clamp as memkern.ops


def _autotune(configs, key):
    """``triton.autotune`` over ``configs`` on CUDA; the interpreter (which cannot run several configs)
    keeps the first one."""
    import os

    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return lambda fn: fn
    return triton.autotune(configs=configs, key=key)


_ROW_CONFIGS = [triton.Config({}, num_warps=w) for w in (1, 2, 4, 8)]


@_autotune(_ROW_CONFIGS, key=["K", "D", "M"])
@triton.jit
def _score_sample_kernel(R, C, IDS, MASK, S_IN, SCORES, IDX, LOGP, OFF,
                         K, D, seed, offset, tau,
                         s_rb, s_cb, s_ck, s_idb, s_mb, s_sb,
                         M: tl.constexpr, HAS_IDS: tl.constexpr, HAS_MASK: tl.constexpr, OFF_PTR: tl.constexpr,
                         FROM_SCORES: tl.constexpr, GREEDY: tl.constexpr, PL: tl.constexpr,
                         BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    ks = tl.arange(0, BLOCK_K)
    kin = ks < K
    valid = kin
    if HAS_MASK:
        mk = tl.load(MASK + b * s_mb + ks, mask=kin, other=0)
        valid = valid & (mk != 0)
    if FROM_SCORES:
        s = tl.load(S_IN + b * s_sb + ks, mask=kin, other=float("-inf")).to(tl.float32)
        valid = valid & (s > float("-inf"))
    else:
        if HAS_IDS:
            ids = tl.load(IDS + b * s_idb + ks, mask=kin, other=-1)
            valid = valid & (ids >= 0)
            rows = C + tl.where(ids >= 0, ids, 0).to(tl.int64) * s_ck      # gather from the table
        else:
            rows = C + b * s_cb + ks.to(tl.int64) * s_ck
        s = tl.zeros((BLOCK_K,), dtype=tl.float32)
        for d0 in range(0, D, BLOCK_D):
            ds = d0 + tl.arange(0, BLOCK_D)
            dm = ds < D
            r = tl.load(R + b * s_rb + ds, mask=dm, other=0.0).to(tl.float32)
            c = tl.load(rows[:, None] + ds[None, :], mask=valid[:, None] & dm[None, :], other=0.0).to(tl.float32)
            s += tl.sum(c * r[None, :], axis=1)
        s = tl.where(valid, s, float("-inf"))
        tl.store(SCORES + b * K + ks, s, mask=kin)
    if M > 0:
        z = tl.where(valid, s / tau, float("-inf"))
        if GREEDY:
            key = z
        else:
            if OFF_PTR:          # the counter base lives in device memory (CUDA-graph replays)
                base = tl.load(OFF).to(tl.int64)
            else:
                base = offset
            offs = base + b * K + ks.to(tl.int64)
            u = tl.maximum(tl.rand(seed, offs), 1e-10)
            key = z - tl.log(-tl.log(u))
        key = tl.where(valid, key, float("-inf"))
        zmax = tl.max(z, axis=0)
        lse_all = zmax + tl.log(tl.sum(tl.where(valid, tl.exp(z - zmax), 0.0), axis=0))
        removed = ks < 0
        for j in tl.static_range(M):
            kbest = tl.max(key, axis=0)
            sel = tl.argmax(key, axis=0)
            ok = kbest > float("-inf")
            hit = ks == sel
            z_sel = tl.sum(tl.where(hit & valid, z, 0.0), axis=0)
            if PL:
                keep = valid & (~removed)
                zr = tl.where(keep, z, float("-inf"))
                mx = tl.max(zr, axis=0)
                lse = mx + tl.log(tl.sum(tl.where(keep, tl.exp(zr - mx), 0.0), axis=0))
            else:
                lse = lse_all
            lp = tl.where(ok, z_sel - lse, 0.0)
            tl.store(IDX + b * M + j, tl.where(ok, sel.to(tl.int64), -1))
            tl.store(LOGP + b * M + j, lp)
            key = tl.where(hit, float("-inf"), key)
            removed = removed | hit   # if not ok nothing valid remains, so this is harmless


@_autotune(_ROW_CONFIGS, key=["K", "D", "M"])
@triton.jit
def _reinforce_kernel(S, IDX, ADV, C, IDS, G, U, LOSS,
                      K, D, tau, inv_b,
                      s_sb, s_cb, s_ck, s_idb, s_ub,
                      M: tl.constexpr, HAS_IDS: tl.constexpr, PL: tl.constexpr,
                      BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    ks = tl.arange(0, BLOCK_K)
    kin = ks < K
    s = tl.load(S + b * s_sb + ks, mask=kin, other=float("-inf")).to(tl.float32)
    valid = kin & (s > float("-inf"))
    z = tl.where(valid, s / tau, float("-inf"))
    zmax = tl.max(z, axis=0)
    lse_all = zmax + tl.log(tl.sum(tl.where(valid, tl.exp(z - zmax), 0.0), axis=0))
    p_all = tl.where(valid, tl.exp(z - lse_all), 0.0)
    g = tl.zeros((BLOCK_K,), dtype=tl.float32)
    loss = 0.0
    removed = ks < 0
    for j in tl.static_range(M):
        i = tl.load(IDX + b * M + j)
        ok = i >= 0
        a = tl.where(ok, tl.load(ADV + b * M + j).to(tl.float32), 0.0)
        hit = ks == tl.where(ok, i, -1)       # -1 never matches
        if PL:
            keep = valid & (~removed)
            zr = tl.where(keep, z, float("-inf"))
            mx = tl.max(zr, axis=0)
            lse = mx + tl.log(tl.sum(tl.where(keep, tl.exp(zr - mx), 0.0), axis=0))
            p = tl.where(keep, tl.exp(zr - lse), 0.0)
        else:
            lse = lse_all
            p = p_all
        p = tl.where(ok, p, 0.0)
        # d logp_j / d s_i = (1[i = sigma_j] - p^(j)_i) / tau
        g += a * (hit.to(tl.float32) - p)
        z_i = tl.sum(tl.where(hit & valid, z, 0.0), axis=0)
        loss += tl.where(ok, -a * (z_i - lse), 0.0)
        removed = removed | hit
    g = g * (-inv_b / tau)
    tl.store(G + b * K + ks, g, mask=kin)
    tl.store(LOSS + b, loss * inv_b)
    # u = sum_i g_i m_i  (dL/dr)
    if HAS_IDS:
        ids = tl.load(IDS + b * s_idb + ks, mask=kin, other=-1)
        rows = C + tl.where(ids >= 0, ids, 0).to(tl.int64) * s_ck
    else:
        rows = C + b * s_cb + ks.to(tl.int64) * s_ck
    for d0 in range(0, D, BLOCK_D):
        ds = d0 + tl.arange(0, BLOCK_D)
        dm = ds < D
        c = tl.load(rows[:, None] + ds[None, :], mask=valid[:, None] & dm[None, :], other=0.0).to(tl.float32)
        u = tl.sum(c * g[:, None], axis=0)
        tl.store(U + b * s_ub + ds, u, mask=dm)


@_autotune(_ROW_CONFIGS, key=["K", "D"])
@triton.jit
def _combine_kernel(G, C, IDS, U, K, D, s_gb, s_cb, s_ck, s_idb, s_ub,
                    HAS_IDS: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr):
    # u_b = sum_i g_bi m_bi (padding rows, id -1, contribute nothing)
    b = tl.program_id(0).to(tl.int64)
    ks = tl.arange(0, BLOCK_K)
    kin = ks < K
    g = tl.load(G + b * s_gb + ks, mask=kin, other=0.0).to(tl.float32)
    valid = kin
    if HAS_IDS:
        ids = tl.load(IDS + b * s_idb + ks, mask=kin, other=-1)
        valid = valid & (ids >= 0)
        rows = C + tl.where(ids >= 0, ids, 0).to(tl.int64) * s_ck
    else:
        rows = C + b * s_cb + ks.to(tl.int64) * s_ck
    g = tl.where(valid, g, 0.0)
    for d0 in range(0, D, BLOCK_D):
        ds = d0 + tl.arange(0, BLOCK_D)
        dm = ds < D
        c = tl.load(rows[:, None] + ds[None, :], mask=valid[:, None] & dm[None, :], other=0.0).to(tl.float32)
        tl.store(U + b * s_ub + ds, tl.sum(c * g[:, None], axis=0), mask=dm)


@triton.jit
def _rand_kernel(OUT, n, seed, offset, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    u = tl.rand(seed, offset + i)
    tl.store(OUT + i, u, mask=i < n)


# ----------------------------------------------------------------------------------------------
# launchers (inputs already validated by memkern.ops)
# ----------------------------------------------------------------------------------------------
def _pow2(n: int, lo: int = 1) -> int:
    return max(lo, triton.next_power_of_2(max(int(n), 1)))


def _contig_rows(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def adapt(q2: torch.Tensor, Wq: torch.Tensor, Wm: torch.Tensor):
    """``(q fp32 [B, d], q' = q + q Wq^T, r = q' + q' Wm)`` (cuBLAS GEMMs with the residual fused)."""
    q = q2.float()
    qp = torch.addmm(q, q, Wq.float().t())    # Q' = Q + Q Wq^T
    r = torch.addmm(qp, qp, Wm.float())       # R  = Q' + Q' Wm   (r = q' + Wm^T q')
    return q, qp, r


def _block_d(D: int) -> int:
    return min(_pow2(D), 128)


def _cand_args(dense, ids, table):
    if dense is not None:
        c = _contig_rows(dense)
        return c, c.stride(0), c.stride(1), None, 0
    t = _contig_rows(table)
    idc = ids.contiguous()
    return t, 0, t.stride(0), idc, idc.stride(0)


def scores(r: torch.Tensor, dense, ids, table, valid) -> torch.Tensor:
    """Scores ``[B, K]`` fp32 (``-inf`` where ``valid`` is False)."""
    return score_sample(r, dense, ids, table, valid, 0, 1.0, 0, 0, True, "softmax")[0]


def score_sample(r, dense, ids, table, valid, m, tau, seed, offset, greedy, logp):
    """Fused scoring + Gumbel-top-``m``; returns ``(scores [B,K], idx [B,m], logp [B,m])``."""
    B = r.shape[0]
    D = r.shape[1]
    c, s_cb, s_ck, idc, s_idb = _cand_args(dense, ids, table)
    K = (dense.shape[1] if dense is not None else ids.shape[1])
    dev = r.device
    sc = torch.empty(B, K, dtype=torch.float32, device=dev)
    idx = torch.empty(B, max(m, 1), dtype=torch.int64, device=dev)
    lp = torch.empty(B, max(m, 1), dtype=torch.float32, device=dev)
    mk = valid.to(torch.int8).contiguous() if valid is not None else None
    rr = r.contiguous()
    off_t = offset if isinstance(offset, torch.Tensor) else None
    _score_sample_kernel[(B,)](
        rr, c, idc if idc is not None else rr, mk if mk is not None else rr, rr, sc, idx, lp,
        off_t if off_t is not None else idx,
        K, D, int(seed), 0 if off_t is not None else int(offset), float(tau),
        rr.stride(0), s_cb, s_ck, s_idb, mk.stride(0) if mk is not None else 0, 0,
        M=int(m), HAS_IDS=idc is not None, HAS_MASK=mk is not None, OFF_PTR=off_t is not None, FROM_SCORES=False,
        GREEDY=bool(greedy), PL=(logp == "plackett_luce"), BLOCK_K=_pow2(K), BLOCK_D=_block_d(D))
    return sc, idx[:, :m], lp[:, :m]


def sample(scores_: torch.Tensor, m: int, tau: float, seed: int, offset: int, greedy: bool, logp: str):
    """Gumbel-top-``m`` from given scores ``[B, K]`` (``-inf`` = padding): ``(idx, logp)``."""
    s = scores_.float().contiguous()
    B, K = s.shape
    idx = torch.empty(B, m, dtype=torch.int64, device=s.device)
    lp = torch.empty(B, m, dtype=torch.float32, device=s.device)
    off_t = offset if isinstance(offset, torch.Tensor) else None   # 0-dim int64 on the device, or an int
    _score_sample_kernel[(B,)](
        s, s, s, s, s, s, idx, lp, off_t if off_t is not None else idx,
        K, 1, int(seed), 0 if off_t is not None else int(offset), float(tau),
        0, 0, 0, 0, 0, s.stride(0),
        M=int(m), HAS_IDS=False, HAS_MASK=False, OFF_PTR=off_t is not None, FROM_SCORES=True,
        GREEDY=bool(greedy), PL=(logp == "plackett_luce"), BLOCK_K=_pow2(K), BLOCK_D=1)
    return idx, lp


def reinforce_u(scores_, indices, adv, dense, ids, table, tau, logp, B):
    """``(g [B,K], loss scalar, U [B,d])`` of the REINFORCE loss (see module docstring)."""
    s = scores_.float().contiguous()
    Bq, K = s.shape
    M = indices.shape[1]
    c, s_cb, s_ck, idc, s_idb = _cand_args(dense, ids, table)
    D = c.shape[-1]
    dev = s.device
    g = torch.empty(Bq, K, dtype=torch.float32, device=dev)
    U = torch.empty(Bq, D, dtype=torch.float32, device=dev)
    loss_rows = torch.empty(Bq, dtype=torch.float32, device=dev)
    ix = indices.contiguous()
    a = adv.float().contiguous()
    _reinforce_kernel[(Bq,)](
        s, ix, a, c, idc if idc is not None else ix, g, U, loss_rows,
        K, D, float(tau), 1.0 / B,
        s.stride(0), s_cb, s_ck, s_idb, U.stride(0),
        M=M, HAS_IDS=idc is not None, PL=(logp == "plackett_luce"),
        BLOCK_K=_pow2(K), BLOCK_D=_block_d(D))
    return g, loss_rows.sum(), U


def adapter_grads(q, qp, Wm, U):
    """``dWq = V^T Q`` with ``V = U + U Wm^T``, ``dWm = Q'^T U`` (fp32 ``[d, d]``, cuBLAS)."""
    dWm = torch.mm(qp.t(), U)
    V = torch.addmm(U, U, Wm.float().t())
    dWq = torch.mm(V.t(), q)
    return dWq, dWm


def combine(g, dense, ids, table):
    """``U [B, d]`` fp32 with ``u_b = sum_i g_bi m_bi`` (``g [B, K]``; padding ids contribute 0)."""
    gg = g.float().contiguous()
    B, K = gg.shape
    c, s_cb, s_ck, idc, s_idb = _cand_args(dense, ids, table)
    D = c.shape[-1]
    U = torch.empty(B, D, dtype=torch.float32, device=gg.device)
    _combine_kernel[(B,)](gg, c, idc if idc is not None else gg, U, K, D, gg.stride(0), s_cb, s_ck, s_idb,
                          U.stride(0), HAS_IDS=idc is not None, BLOCK_K=_pow2(K), BLOCK_D=_block_d(D))
    return U


def uniforms(seed: int, offset: int, n: int, device="cpu") -> torch.Tensor:
    """``tl.rand(seed, offset + arange(n))`` as a float32 tensor (for tests)."""
    out = torch.empty(n, dtype=torch.float32, device=device)
    BLOCK = 128
    _rand_kernel[(triton.cdiv(n, BLOCK),)](out, n, int(seed), int(offset), BLOCK=BLOCK)
    return out
