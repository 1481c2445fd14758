"""memkern.rerank_scores / memkern.ops.RerankScores: the composable autograd op.

The torch path is checked with torch.autograd.gradcheck in float64 (q, Wq, Wm, dense candidates or
the table behind ids, with padding) and against the float64 autograd reference of
memkern.score.reference (explicit m'); the Triton path (CUDA, or the interpreter on CPU, fp32) against
the same reference, gradients included, at odd sizes and block boundaries.
"""
from __future__ import annotations

import math
import os

import pytest
import torch

import memkern
from memkern.score import reference as ref
from memkern.score import ops
from memkern.score.reranker import Reranker

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

try:
    import triton  # noqa: F401

    _TRITON = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"
except Exception:  # pragma: no cover
    _TRITON = False


def _inputs(B, K, d, N=None, seed=0, dtype=torch.float64, mask_p=0.25, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    x = dict(q=torch.randn(B, d, generator=g), Wq=torch.randn(d, d, generator=g) * 0.3 / math.sqrt(d),
             Wm=torch.randn(d, d, generator=g) * 0.3 / math.sqrt(d), C=torch.randn(B, K, d, generator=g))
    mask = torch.rand(B, K, generator=g) >= mask_p
    mask[:, 0] = True                                      # at least one valid candidate per row
    if N is not None:
        x["T"] = torch.randn(N, d, generator=g)
        ids = torch.randint(0, N, (B, K), generator=g)
        x["ids"] = torch.where(mask, ids, torch.full_like(ids, -1)).to(device)
    out = {k: v.to(device, dtype) if v.is_floating_point() else v for k, v in x.items()}
    out["mask"] = mask.to(device)
    return out


# (B, K, d): single everything, odd sizes, K across 16/17/33, d not a power of two
GC_SHAPES = [(1, 1, 1), (2, 5, 3), (3, 7, 9), (2, 17, 6), (1, 33, 4)]


@pytest.mark.parametrize("B,K,d", GC_SHAPES)
def test_gradcheck_dense_float64(B, K, d):
    x = _inputs(B, K, d, seed=B * 100 + K + d)
    leaves = [x[k].clone().requires_grad_(True) for k in ("q", "Wq", "Wm", "C")]
    mask = x["mask"]

    def f(q, Wq, Wm, C):   # padding scores are -inf constants: zero them so finite differences exist
        return memkern.rerank_scores(q, Wq, Wm, C, mask=mask).masked_fill(~mask, 0.0)

    assert f(*leaves).dtype == torch.float64
    assert torch.autograd.gradcheck(f, leaves, eps=1e-6, atol=1e-7, rtol=1e-6)


@pytest.mark.parametrize("B,K,d,N", [(2, 5, 3, 4), (3, 6, 5, 7)])
def test_gradcheck_ids_table_float64(B, K, d, N):
    x = _inputs(B, K, d, N=N, seed=7)
    leaves = [x[k].clone().requires_grad_(True) for k in ("q", "Wq", "Wm", "T")]
    ids, valid = x["ids"], x["ids"] >= 0

    def f(q, Wq, Wm, T):   # repeated ids accumulate into the same table row
        return memkern.rerank_scores(q, Wq, Wm, T, ids=ids).masked_fill(~valid, 0.0)

    assert torch.autograd.gradcheck(f, leaves, eps=1e-6, atol=1e-7, rtol=1e-6)


def _ref_grads(x, w, dense, ids=None, T=None):
    """float64 reference: loss = sum(w * s) over valid entries, gradients by autograd (explicit m')."""
    leaves = {k: x[k].detach().cpu().double().clone().requires_grad_(True) for k in ("q", "Wq", "Wm")}
    if dense:
        leaves["C"] = x["C"].detach().cpu().double().clone().requires_grad_(True)
        C, valid = leaves["C"], x["mask"].cpu()
    else:
        leaves["T"] = x["T"].detach().cpu().double().clone().requires_grad_(True)
        idc = x["ids"].cpu()
        C, valid = leaves["T"][idc.clamp_min(0)], idc >= 0
    s = ref.reference_scores(leaves["q"], leaves["Wq"], leaves["Wm"], C, valid)
    loss = (w.cpu().double() * s.masked_fill(~valid, 0.0)).sum()
    loss.backward()
    return s.detach(), {k: v.grad for k, v in leaves.items()}


def _scores_with_grad(x, dense, backend):
    """Scores of ``x`` (dense candidates + mask, or table + ids) with every input a fresh leaf."""
    keys = ("q", "Wq", "Wm", "C" if dense else "T")
    leaves = {k: x[k].clone().requires_grad_(True) for k in keys}
    if dense:
        s = ops.rerank_scores(leaves["q"], leaves["Wq"], leaves["Wm"], leaves["C"], mask=x["mask"], backend=backend)
        return keys, leaves, s, x["mask"]
    s = ops.rerank_scores(leaves["q"], leaves["Wq"], leaves["Wm"], leaves["T"], ids=x["ids"], backend=backend)
    return keys, leaves, s, x["ids"] >= 0


# block boundaries of the Triton kernels: K 16/17/33 (BLOCK_K = next power of two), d 128/130
# (BLOCK_D = 128), B = 1
TRITON_SHAPES = [(1, 3, 5), (2, 16, 8), (2, 17, 16), (3, 33, 7), (1, 4, 128), (2, 5, 130)]


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=[
    pytest.mark.interpret, pytest.mark.skipif(not _TRITON, reason="triton needs CUDA or TRITON_INTERPRET=1")])])
@pytest.mark.parametrize("B,K,d", TRITON_SHAPES)
@pytest.mark.parametrize("dense", [True, False], ids=["dense", "ids"])
def test_backward_matches_float64_reference(backend, B, K, d, dense, device):
    x = _inputs(B, K, d, N=2 * K, seed=B + K + d, dtype=torch.float32, device=device)
    w = torch.randn(B, K, generator=torch.Generator().manual_seed(3)).to(device)
    keys, leaves, s, valid = _scores_with_grad(x, dense, backend)
    assert s.dtype == torch.float32 and s.grad_fn is not None
    assert torch.equal(torch.isinf(s), ~valid)
    (w * s.masked_fill(~valid, 0.0)).sum().backward()
    s64, g64 = _ref_grads(x, w, dense)
    fin = valid.cpu()
    torch.testing.assert_close(s.detach().cpu().double()[fin], s64[fin], rtol=1e-5, atol=1e-5)
    for k in keys:
        got = leaves[k].grad.cpu().double()
        want = g64[k]
        scale = max(1.0, want.abs().max().item())
        assert (got - want).abs().max().item() <= 1e-5 * scale, k


def test_no_grad_path_and_grad_path_agree_and_1d_query(device):
    x = _inputs(1, 6, 5, dtype=torch.float32, device=device)
    s0 = ops.rerank_scores(x["q"][0], x["Wq"], x["Wm"], x["C"][0])              # no grad: plain forward
    q = x["q"][0].clone().requires_grad_(True)
    s1 = ops.rerank_scores(q, x["Wq"], x["Wm"], x["C"][0])                      # autograd op
    assert s0.shape == s1.shape == (6,) and s1.grad_fn is not None and s0.grad_fn is None
    torch.testing.assert_close(s0, s1.detach(), rtol=0, atol=0)
    s1.sum().backward()
    # d/dq sum_i m_i . (I + Wm)^T (I + Wq) q = (I + Wq)^T (I + Wm) sum_i m_i
    I = torch.eye(5, device=device)
    want = (I + x["Wq"]).T @ (I + x["Wm"]) @ x["C"][0].sum(0)
    torch.testing.assert_close(q.grad, want, rtol=1e-5, atol=1e-5)


def test_top_level_export_and_reranker_is_an_ordinary_module(device):
    assert memkern.rerank_scores is ops.rerank_scores
    assert memkern.ReinforceTrainer.__name__ == "ReinforceTrainer"
    rr = Reranker(8, top_m=2, device=device)
    assert [n for n, _ in rr.named_parameters()] == ["Wq", "Wm"]
    g = torch.Generator().manual_seed(0)
    q, C = torch.randn(4, 8, generator=g).to(device), torch.randn(4, 6, 8, generator=g).to(device)
    s = rr(q, C)
    assert s.shape == (4, 6) and s.grad_fn is not None
    torch.testing.assert_close(s.detach(), rr.scores(q, C))
    # a supervised warm start with an ordinary loss and optimizer: push candidate 3 to the top
    target = torch.full((4,), 3, device=device)
    opt = torch.optim.Adam(rr.parameters(), lr=0.05)
    losses = []
    for _ in range(30):
        loss = torch.nn.functional.cross_entropy(rr(q, C), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.5 * losses[0]
    assert bool((rr.select(q, C, greedy=True, m=1).indices[:, 0] == 3).all())


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=[
    pytest.mark.interpret, pytest.mark.skipif(not _TRITON, reason="triton needs CUDA or TRITON_INTERPRET=1")])])
@pytest.mark.parametrize("dense", [True, False], ids=["dense", "ids"])
def test_padding_gets_no_gradient_whatever_the_upstream_gradient(backend, dense, device):
    """The op's contract: padded candidates (mask False, id -1) have zero gradient, even when the
    upstream gradient there is not zero (here: s.backward(ones), so -inf scores get gradient 1).
    Without the masking in backward, a -1 id would add gradient into table row 0 and a masked
    dense candidate would get one, and q / Wq / Wm would move with them."""
    B, K, d = 3, 6, 5
    x = _inputs(B, K, d, N=2 * K, seed=17, dtype=torch.float32, mask_p=0.4, device=device)
    keys, leaves, s, valid = _scores_with_grad(x, dense, backend)
    assert bool((~valid).any())
    s.backward(torch.ones_like(s))
    _, g64 = _ref_grads(x, torch.ones(B, K), dense)      # reference: loss over the valid entries only
    for k in keys:
        got = leaves[k].grad.cpu().double()
        want = g64[k]
        assert (got - want).abs().max().item() <= 1e-5 * max(1.0, want.abs().max().item()), k
