"""The reranker's fused CPU path (memkern.score.ops.native, csrc/score/rerank.cpp).

``Reranker.select`` / ``update`` with ``backend="auto"`` on CPU float32 batches of up to 64 rows run
one C++ call each. Checked against the float64 references of memkern.score.reference on fresh random
inputs at odd sizes and SIMD block boundaries (padding, masks, ids + table, priors, greedy draws,
fewer valid candidates than slots, both log-prob modes), against the torch path over many steps of
every trainer mechanism, and for the fallbacks and their logs.
"""
from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
import torch

from memkern.errors import MemkernValueError
from memkern.score import reference as ref
from memkern.score.ops import native
from memkern.score.ops.philox import philox_uniform
from memkern.score.reranker import Reranker

pytestmark = pytest.mark.skipif(not native.available(), reason="memkern._store built without the rerank kernels")


def _inputs(B, K, d, seed, form="dense", mask=False, prior=False, N=40):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, d, generator=g)
    out = {"q": q, "mask": None, "prior": None}
    if form == "ids":
        table = torch.randn(N, d, generator=g)
        ids = torch.stack([torch.randperm(N, generator=g)[:K] for _ in range(B)])   # distinct: no score ties
        ids[0, K // 2:] = -1                                   # padding ids
        out.update(cands=(ids, table), C=table[ids.clamp_min(0)], valid=ids >= 0)
    else:
        C = torch.randn(B, K, d, generator=g)
        out.update(cands=C, C=C, valid=torch.ones(B, K, dtype=torch.bool))
    if mask:
        mk = torch.rand(B, K, generator=g) > 0.3
        mk[-1, 2:] = False                                     # the last row: 2 candidates at most
        out["mask"] = mk
        out["valid"] = out["valid"] & mk
    if prior:
        out["prior"] = torch.randn(B, K, generator=g)
    return out


def _adapters(rr, d, seed, scale=0.1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        rr.Wq.copy_(torch.randn(d, d, generator=g) * scale)
        rr.Wm.copy_(torch.randn(d, d, generator=g) * scale)


CASES = [  # B, K, d, m, logp, form, mask, prior, greedy
    (1, 20, 384, 5, "softmax", "dense", False, False, False),
    (3, 7, 15, 3, "softmax", "dense", True, False, False),
    (5, 9, 17, 4, "plackett_luce", "ids", True, True, False),
    (2, 6, 33, 6, "softmax", "ids", False, False, True),
    (7, 11, 65, 2, "plackett_luce", "dense", False, True, True),
    (64, 20, 63, 5, "softmax", "dense", True, True, False),
    (4, 5, 1, 3, "softmax", "dense", False, False, False),
]


@pytest.mark.parametrize("B,K,d,m,logp,form,mask,prior,greedy", CASES)
def test_select_matches_the_float64_reference_and_the_torch_draw(B, K, d, m, logp, form, mask, prior, greedy):
    x = _inputs(B, K, d, seed=B * 31 + d, form=form, mask=mask, prior=prior)
    rn = Reranker(d, top_m=5, logp=logp, seed=7)
    rt = Reranker(d, top_m=5, logp=logp, seed=7, backend="torch")
    _adapters(rn, d, d)
    _adapters(rt, d, d)
    a = rn.select(x["q"], x["cands"], mask=x["mask"], prior=x["prior"], greedy=greedy, m=m)
    b = rt.select(x["q"], x["cands"], mask=x["mask"], prior=x["prior"], greedy=greedy, m=m)
    assert torch.equal(a.indices, b.indices)                    # the same Philox uniforms, the same draw
    assert rn._offset == rt._offset
    s64 = ref.reference_scores(x["q"], rn.Wq.detach(), rn.Wm.detach(), x["C"], x["valid"], x["prior"])
    fin = torch.isfinite(s64)
    assert torch.equal(torch.isfinite(a.scores), fin)
    scale = s64[fin].abs().max().item()
    assert (a.scores.double()[fin] - s64[fin]).abs().max().item() <= 2e-5 * max(1.0, scale)
    lp64 = ref.reference_logp(s64, a.indices, rn.tau, logp)
    assert (a.logp.double() - lp64).abs().max().item() <= 2e-5 * max(1.0, scale / rn.tau)
    n_valid = x["valid"].sum(1)
    for row in range(B):                                        # -1 exactly where a row runs out of candidates
        assert int((a.indices[row] >= 0).sum()) == min(m, int(n_valid[row]))
        assert all(bool(x["valid"][row, i]) for i in a.indices[row].tolist() if i >= 0)


def test_select_of_a_1d_query_and_a_fresh_reranker_is_the_retriever_order():
    x = _inputs(1, 9, 24, seed=3)
    rr = Reranker(24)
    sel = rr.select(x["q"][0], x["C"][0], greedy=True)
    assert sel.indices.shape == (5,) and sel.scores.shape == (9,)
    assert torch.equal(sel.indices, torch.topk(x["C"][0] @ x["q"][0], 5).indices)


def _bare(d, **kw):
    cfg = dict(top_m=4, lr=0.1, optimizer="sgd", baseline=0.5, normalize_advantages=False, clip_grad_norm=None,
               weight_decay=0.0, replay_capacity=0, guard=False, max_norm=None)
    cfg.update(kw)
    return Reranker(d, **cfg)


@pytest.mark.parametrize("B,K,d,logp,form,mask,prior", [
    (1, 20, 384, "softmax", "dense", False, False),
    (3, 7, 17, "plackett_luce", "ids", True, False),
    (6, 9, 33, "softmax", "dense", True, True),
    (64, 20, 65, "plackett_luce", "ids", False, True),        # above the Gram path's row limit
])
def test_one_sgd_step_moves_the_adapters_by_the_float64_reference_gradient(B, K, d, logp, form, mask, prior):
    x = _inputs(B, K, d, seed=d + B, form=form, mask=mask, prior=prior)
    rr = _bare(d, logp=logp)
    _adapters(rr, d, 5)
    W0 = (rr.Wq.detach().double().clone(), rr.Wm.detach().double().clone())
    sel = rr.select(x["q"], x["cands"], mask=x["mask"], prior=x["prior"])
    g = torch.Generator().manual_seed(1)
    R = torch.where(torch.rand(sel.indices.shape, generator=g) > 0.5, 1.0, -1.0)
    st = rr.update(sel, R)
    adv = torch.where(sel.indices >= 0, R - 0.5, torch.zeros(()))
    loss, dWq, dWm, _, _ = ref.reference_loss_and_grads(x["q"], W0[0], W0[1], x["C"], sel.indices, adv + 0.5,
                                                        tau=rr.tau, baseline=0.5, logp=logp, valid=x["valid"],
                                                        prior=x["prior"])
    for W, W_0, G in ((rr.Wq, W0[0], dWq), (rr.Wm, W0[1], dWm)):
        err = ((W_0 - W.detach().double()) / 0.1 - G).abs().max().item()
        assert err <= 1e-4 * max(1.0, G.abs().max().item()), err
    assert abs(float(st["loss"]) - float(loss)) <= 1e-4 * max(1.0, abs(float(loss)))
    gn = float(torch.sqrt(dWq.square().sum() + dWm.square().sum()))
    assert abs(st["grad_norm"] - gn) <= 1e-4 * max(1.0, gn)


def _online(rr, steps, B, d, K=8, form="dense", prior=False, seed=0, nan_at=None):
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(30, d, generator=g)
    out = []
    for t in range(steps):
        q = torch.randn(B, d, generator=g)
        if form == "ids":
            ids = torch.stack([torch.randperm(30, generator=g)[:K] for _ in range(B)])
            ids[0, -2:] = -1
            cands = (ids, table)
        else:
            cands = torch.randn(B, K, d, generator=g)
        pr = torch.randn(B, K, generator=g) if prior else None
        sel = rr.select(q, cands, prior=pr)
        R = torch.where(torch.rand(sel.indices.shape, generator=g) > 0.6, 1.0, -1.0)
        if t == nan_at:
            R[0, 0] = float("nan") if int(sel.indices[0, 0]) >= 0 else R[0, 0]
        st = rr.update(sel, R)
        out.append((sel.indices.clone(), dict(st)))
    return out


@pytest.mark.parametrize("kw,form,prior,B", [
    (dict(), "dense", False, 1),                                        # the stable default
    (dict(), "ids", True, 5),
    (dict(logp="plackett_luce", replay_capacity=16, guard_window=4, guard_every=3), "dense", False, 3),
    (dict(baseline="running_mean", replay_size=2), "ids", False, 4),
    (dict(optimizer="adam", lr=1e-2), "dense", False, 3),                # the native gradient, torch's optimizer
    (dict(clip_grad_norm=None, weight_decay=0.0, max_norm=0.05), "dense", False, 2),   # the projection binds
    (dict(replay_capacity=0, baseline=0.5, normalize_advantages=False, clip_grad_norm=None, weight_decay=0.0,
          max_norm=None, guard=False, lr=1e-3), "ids", True, 3),         # the paper's settings
])
def test_online_steps_equal_the_torch_path(kw, form, prior, B):
    d = 21
    a = Reranker(d, top_m=3, **kw)
    b = Reranker(d, top_m=3, backend="torch", **kw)
    sa = _online(a, 40, B, d, form=form, prior=prior)
    sb = _online(b, 40, B, d, form=form, prior=prior)
    assert all(torch.equal(x[0], y[0]) for x, y in zip(sa, sb))          # the same draws and replay rows
    for Wa, Wb in ((a.Wq.detach(), b.Wq.detach()), (a.Wm.detach(), b.Wm.detach())):
        assert torch.allclose(Wa, Wb, rtol=1e-4, atol=1e-6 * max(1.0, float(Wb.abs().max())))
    for (_, x), (_, y) in zip(sa[-5:], sb[-5:]):
        assert x["n_rows"] == y["n_rows"] and x["n_replay"] == y["n_replay"] and x["reward_rate"] == y["reward_rate"]
        for k in ("loss", "grad_norm", "adapter_norm", "baseline"):
            assert x[k] == pytest.approx(y[k], rel=1e-3, abs=1e-5), k
    ta, tb = a.trainer, b.trainer
    assert (ta._rpos, ta._rlen, ta._replay_draws, ta.steps) == (tb._rpos, tb._rlen, tb._replay_draws, tb.steps)
    if ta._ring is not None:
        for k in ta._ring:
            assert torch.allclose(ta._ring[k].float(), tb._ring[k].float(), atol=1e-5), k


def test_a_non_finite_reward_moves_nothing_and_is_counted(caplog):
    d = 12
    rr = Reranker(d, top_m=3, guard_every=5)
    _online(rr, 3, 2, d)
    W = (rr.Wq.detach().clone(), rr.Wm.detach().clone())
    g = torch.Generator().manual_seed(3)
    sel = rr.select(torch.randn(2, d, generator=g), torch.randn(2, 6, d, generator=g))
    R = torch.ones(sel.indices.shape)
    R[0, 0] = float("inf")
    st = rr.update(sel, R)
    assert torch.equal(rr.Wq, W[0]) and torch.equal(rr.Wm, W[1])
    assert st["grad_norm"] == 0.0 and float(rr.trainer._win[2]) == 1.0


def test_the_fused_path_is_chosen_explicitly_logged_and_falls_back(caplog, monkeypatch):
    monkeypatch.setattr(native, "_LOGGED", set())
    d = 8
    calls = []
    real = native.module()

    class Spy:
        def __getattr__(self, name):
            calls.append(name)
            return getattr(real, name)

    monkeypatch.setattr(native, "module", lambda: Spy())
    with caplog.at_level(logging.INFO, logger="memkern"):
        rr = Reranker(d, top_m=2)
        q, C = torch.randn(3, d), torch.randn(3, 5, d)
        rr.update(rr.select(q, C), torch.ones(3, 2))
        assert calls == ["rerank_select", "rerank_step"]
        calls.clear()
        big = Reranker(d, top_m=2)                         # B > 64: the torch path
        qb, Cb = torch.randn(65, d), torch.randn(65, 5, d)
        big.update(big.select(qb, Cb), torch.ones(65, 2))
        Reranker(d, top_m=2).select(q.double(), C.double())                        # float64
        Reranker(d, top_m=2).select(q.requires_grad_(True), C)                      # requires grad
        Reranker(d, top_m=2, backend="torch").select(q, C)                          # explicit torch
        Reranker(d, top_m=2, capture=True).select(q, C)                             # capture mode
        assert calls == []
        rr.update(rr.select(q.detach(), C), torch.ones(3, 2))                       # logged once only
    msgs = [r.getMessage() for r in caplog.records]
    assert sum("chose 'native'" in m and ".select" in m for m in msgs) == 1
    assert sum("chose 'native'" in m and ".update" in m for m in msgs) == 1
    for why in ("B > 64", "torch.float64 tensors", "inputs that require grad", "capture mode"):
        assert any("runs the torch path" in m and why in m for m in msgs), why


def test_native_backend_refused_without_the_kernels(monkeypatch):
    from memkern.errors import BackendUnavailableError

    monkeypatch.setattr(native, "_STATUS", (None, "an older build"))
    rr = Reranker(4, top_m=1, backend="native")
    with pytest.raises(BackendUnavailableError, match="native"):
        rr.select(torch.randn(1, 4), torch.randn(1, 3, 4))
    Reranker(4, top_m=1).select(torch.randn(1, 4), torch.randn(1, 3, 4))   # auto: the torch path


def test_bad_ids_name_the_argument():
    rr = Reranker(4, top_m=1)
    with pytest.raises(MemkernValueError, match=r"ids: expected values in \[-1, 3\)"):
        rr.select(torch.randn(1, 4), (torch.tensor([[0, 5]]), torch.randn(3, 4)))


def test_philox_uniforms_equal_the_python_ones():
    g = torch.Generator().manual_seed(0)
    seeds = [0, 1, 1234, 2**32 + 5, 2**63 - 1]
    offs = torch.cat([torch.arange(40), torch.randint(0, 2**62, (40,), generator=g), torch.tensor([2**32 - 1, 2**32])])
    mod = native.module()
    for s in seeds:
        ref_u = philox_uniform(s, offs).tolist()
        assert [mod.rerank_philox(s, int(o)) for o in offs.tolist()] == ref_u


@pytest.mark.parametrize("simd", ["scalar", "avx2"])
def test_every_instruction_set_computes_the_same(simd):
    code = (
        "import torch\n"
        "from memkern.score.ops import native\n"
        "from memkern.score.reranker import Reranker\n"
        "print(native.module().rerank_kernel())\n"
        "for d, B in ((37, 5), (64, 3), (130, 40)):\n"
        "    g = torch.Generator().manual_seed(d)\n"
        "    a, b = Reranker(d, top_m=4), Reranker(d, top_m=4, backend='torch')\n"
        "    for _ in range(6):\n"
        "        q, C = torch.randn(B, d, generator=g), torch.randn(B, 9, d, generator=g)\n"
        "        R = torch.where(torch.rand(B, 4, generator=g) > 0.5, 1.0, -1.0)\n"
        "        sa, sb = a.select(q, C), b.select(q, C)\n"
        "        assert torch.equal(sa.indices, sb.indices)\n"
        "        a.update(sa, R); b.update(sb, R)\n"
        "    assert torch.allclose(a.Wq, b.Wq, rtol=1e-4, atol=1e-7) and torch.allclose(a.Wm, b.Wm, rtol=1e-4, atol=1e-7)\n"
        "print('ok')\n")
    env = dict(os.environ, MEMKERN_SIMD=simd, OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    kernel, ok = out.stdout.split()
    assert ok == "ok" and kernel in (("scalar",) if simd == "scalar" else ("avx2+fma", "scalar"))
