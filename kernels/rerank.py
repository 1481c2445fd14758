"""Triton kernels of the reranker: residual-adapter scoring, Gumbel top-M sampling, REINFORCE gradient.

Math (per query b; column vectors)::

    q' = q + Wq q,   r = q' + Wm^T q',   s_i = m_i . r      (m' = m + Wm m is never materialised)
    z_i = s_i / tau, key_i = z_i - log(-log u_i),  u_i = tl.rand(seed, offset + b*K + i) (Philox)
    draw = the M largest keys in decreasing order (Plackett-Luce without replacement)
    g_i = dL/ds_i = -(1/(B tau)) sum_j A_j (1[i = sigma_j] - p^(j)_i),   u = sum_i g_i m_i
    dWm = Q'^T U,  dWq = V^T Q,  V = U + U Wm^T

Kernels
-------
``_mm_kernel``            OUT = A @ B (+ ADD), arbitrary strides, fp32 accumulation. Used for
                          Q' = Q + Q Wq^T, R = Q' + Q' Wm, dWm = Q'^T U, V = U + U Wm^T, dWq = V^T Q.
``_score_sample_kernel``  one program per query: scores from R and the candidates (dense
                          ``[B, K, d]`` or ids gathered from a table ``[N, d]``), then Gumbel-top-M
                          with per-slot log-probabilities (softmax or Plackett-Luce). Can also
                          start from given scores (``FROM_SCORES``) or stop after scoring (M = 0).
``_reinforce_kernel``     one program per query: g = dL/ds from scores, selection and advantages,
                          per-row loss, and u = sum_i g_i m_i.
``_rand_kernel``          the raw uniforms, for tests (the torch backend reproduces them).

Inputs may be fp32, fp16 or bf16; every load is converted to fp32 before arithmetic (the Triton
interpreter computes bf16 arithmetic wrongly) and accumulation is fp32. The plain-torch backend and
the validation live in ``memkern.ops``; the naive float64 references in ``memkern._reference``.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

_U_MIN = 1e-10  # same clamp as memkern.ops


@triton.jit
def _mm_kernel(A, Bm, ADD, OUT, M, N, KD,
               s_am, s_ak, s_bk, s_bn, s_addm, s_addn, s_om, s_on,
               HAS_ADD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mm = rm < M
    mn = rn < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, KD, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        mk = rk < KD
        a = tl.load(A + rm[:, None] * s_am + rk[None, :] * s_ak, mask=mm[:, None] & mk[None, :], other=0.0)
        b = tl.load(Bm + rk[:, None] * s_bk + rn[None, :] * s_bn, mask=mk[:, None] & mn[None, :], other=0.0)
        acc += tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    if HAS_ADD:
        add = tl.load(ADD + rm[:, None] * s_addm + rn[None, :] * s_addn, mask=mm[:, None] & mn[None, :], other=0.0)
        acc += add.to(tl.float32)
    tl.store(OUT + rm[:, None] * s_om + rn[None, :] * s_on, acc, mask=mm[:, None] & mn[None, :])


@triton.jit
def _score_sample_kernel(R, C, IDS, MASK, S_IN, SCORES, IDX, LOGP,
                         K, D, seed, offset, tau,
                         s_rb, s_cb, s_ck, s_idb, s_mb, s_sb,
                         M: tl.constexpr, HAS_IDS: tl.constexpr, HAS_MASK: tl.constexpr,
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
            offs = offset + b * K + ks.to(tl.int64)
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


def mm(a: torch.Tensor, b: torch.Tensor, add: torch.Tensor | None = None) -> torch.Tensor:
    """``a @ b (+ add)`` in fp32 for 2-D ``a [M, Kd]``, ``b [Kd, N]`` of any strides/float dtypes."""
    Mr, Kd = a.shape
    N = b.shape[1]
    out = torch.empty(Mr, N, dtype=torch.float32, device=a.device)
    BM = 16 if Mr <= 16 else (32 if Mr <= 32 else 64)
    BN = 64 if N >= 64 else _pow2(N, 16)
    BK = 32 if Kd >= 32 else _pow2(Kd, 16)
    grid = (triton.cdiv(Mr, BM), triton.cdiv(N, BN))
    addt = add if add is not None else out
    _mm_kernel[grid](a, b, addt, out, Mr, N, Kd,
                     a.stride(0), a.stride(1), b.stride(0), b.stride(1), addt.stride(0), addt.stride(1),
                     out.stride(0), out.stride(1),
                     HAS_ADD=add is not None, BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK)
    return out


def adapt(q2: torch.Tensor, Wq: torch.Tensor, Wm: torch.Tensor):
    """``(q fp32 [B, d], q' = q + q Wq^T, r = q' + q' Wm)``."""
    q = q2.float()
    qp = mm(q, Wq.t(), add=q)       # Q' = Q + Q Wq^T
    r = mm(qp, Wm, add=qp)          # R  = Q' + Q' Wm   (r = q' + Wm^T q')
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
    _score_sample_kernel[(B,)](
        rr, c, idc if idc is not None else rr, mk if mk is not None else rr, rr, sc, idx, lp,
        K, D, int(seed), int(offset), float(tau),
        rr.stride(0), s_cb, s_ck, s_idb, mk.stride(0) if mk is not None else 0, 0,
        M=int(m), HAS_IDS=idc is not None, HAS_MASK=mk is not None, FROM_SCORES=False,
        GREEDY=bool(greedy), PL=(logp == "plackett_luce"), BLOCK_K=_pow2(K), BLOCK_D=_block_d(D))
    return sc, idx[:, :m], lp[:, :m]


def sample(scores_: torch.Tensor, m: int, tau: float, seed: int, offset: int, greedy: bool, logp: str):
    """Gumbel-top-``m`` from given scores ``[B, K]`` (``-inf`` = padding): ``(idx, logp)``."""
    s = scores_.float().contiguous()
    B, K = s.shape
    idx = torch.empty(B, m, dtype=torch.int64, device=s.device)
    lp = torch.empty(B, m, dtype=torch.float32, device=s.device)
    _score_sample_kernel[(B,)](
        s, s, s, s, s, s, idx, lp,
        K, 1, int(seed), int(offset), float(tau),
        0, 0, 0, 0, 0, s.stride(0),
        M=int(m), HAS_IDS=False, HAS_MASK=False, FROM_SCORES=True,
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
    """``dWq = V^T Q`` with ``V = U + U Wm^T``, ``dWm = Q'^T U`` (fp32 ``[d, d]``)."""
    dWm = mm(qp.t(), U)
    V = mm(U, Wm.t(), add=U)
    dWq = mm(V.t(), q)
    return dWq, dWm


def uniforms(seed: int, offset: int, n: int, device="cpu") -> torch.Tensor:
    """``tl.rand(seed, offset + arange(n))`` as a float32 tensor (for tests)."""
    out = torch.empty(n, dtype=torch.float32, device=device)
    BLOCK = 128
    _rand_kernel[(triton.cdiv(n, BLOCK),)](out, n, int(seed), int(offset), BLOCK=BLOCK)
    return out
