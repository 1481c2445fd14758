"""memkern.ReinforceTrainer: the online REINFORCE loop apart from the module.

Exact one-step checks of the safety mechanisms (advantage normalisation, gradient-norm clipping,
non-finite steps), the sync-free step (dispatched-op and host-sync counts with a TorchDispatchMode),
reward inputs of any kind, presets as trainer configurations, and loading format-1 files.
"""
from __future__ import annotations

import logging
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import memkern
from memkern.score import reference as ref
from memkern.score.reranker import PRESETS, Reranker
from memkern.score.trainer import TRAINER_PRESETS, ReinforceTrainer, UpdateStats

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")
DATA = Path(__file__).resolve().parents[1] / "fixtures"


def _batch(B=3, K=7, d=10, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, d, generator=g)
    C = torch.randn(B, K, d, generator=g)
    mask = torch.ones(B, K, dtype=torch.bool)
    mask[-1, 2:] = False                     # the last row has only 2 valid candidates: one -1 slot
    return q.to(device), C.to(device), mask.to(device)


def _bare(d, M, device, **kw):
    """A reranker whose trainer does nothing but the mechanism under test (SGD, fixed baseline)."""
    cfg = dict(top_m=M, lr=0.1, optimizer="sgd", baseline=0.5, normalize_advantages=False, clip_grad_norm=None,
               weight_decay=0.0, replay_capacity=0, guard=False, max_norm=None, device=device)
    cfg.update(kw)
    rr = Reranker(d, **cfg)
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        rr.Wq.copy_(torch.randn(d, d, generator=g) * 0.1)
        rr.Wm.copy_(torch.randn(d, d, generator=g) * 0.1)
    return rr


def _reference_step(rr, q, C, mask, idx, adv):
    """Gradient of -(1/B) sum adv * logp at the current adapters (float64 autograd reference)."""
    _, dWq, dWm, _, _ = ref.reference_loss_and_grads(q.cpu(), rr.Wq.detach().cpu(), rr.Wm.detach().cpu(), C.cpu(),
                                                     idx.cpu(), adv.cpu(), tau=rr.tau, baseline=0.0, valid=mask.cpu())
    return dWq, dWm


def _fixed_step(rr, d, device, batch_seed, select_seed):
    """Select on a fixed batch; return ``(sel, R, W0, dWq, dWm)``: rewards with a -1 slot's entry
    ignored, the adapters before the update (float64) and the reference gradient at baseline 0.5."""
    q, C, mask = _batch(d=d, seed=batch_seed, device=device)
    sel = rr.select(q, C, mask=mask, seed=select_seed)
    R = torch.tensor([[1.0, -1.0, 1.0], [-1.0, 1.0, -1.0], [1.0, 1.0, 1.0]])
    W0 = (rr.Wq.detach().cpu().double().clone(), rr.Wm.detach().cpu().double().clone())
    slot = sel.indices.cpu() >= 0
    dWq, dWm = _reference_step(rr, q, C, mask, sel.indices, torch.where(slot, R.double() - 0.5, 0.0))
    return sel, R, W0, dWq, dWm


# ------------------------------------------------------------------------------------------------
# the safety mechanisms, one exact step each (issue 17: these mutants must be caught)
# ------------------------------------------------------------------------------------------------
def test_advantage_normalisation_uses_the_population_std_of_the_valid_slots(device):
    d, M = 10, 3
    rr = _bare(d, M, device, normalize_advantages=True)
    q, C, mask = _batch(d=d, device=device)
    sel = rr.select(q, C, mask=mask, seed=4)
    idx = sel.indices.cpu()
    assert int((idx < 0).sum()) == 1            # one -1 slot: it must not count in the mean or the variance
    R = torch.tensor([[1.0, -1.0, -1.0], [1.0, 1.0, -1.0], [-1.0, 1.0, float("nan")]])   # NaN on the -1 slot
    W0 = (rr.Wq.detach().cpu().double().clone(), rr.Wm.detach().cpu().double().clone())
    slot = idx >= 0
    a = torch.where(slot, R.double() - 0.5, torch.zeros((), dtype=torch.float64))
    assert int(slot.sum()) == 8 and bool(torch.isnan(R[~slot]).all())
    n = int(slot.sum())
    mu = a.sum() / n
    std = math.sqrt(float((((a - mu) * slot) ** 2).sum()) / n)        # divisor n (population), not n - 1
    adv = torch.where(slot, a / (std + 1e-6), torch.zeros_like(a))
    dWq, dWm = _reference_step(rr, q, C, mask, idx, adv)
    rr.update(sel, R)
    torch.testing.assert_close(rr.Wq.detach().cpu().double(), W0[0] - 0.1 * dWq, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(rr.Wm.detach().cpu().double(), W0[1] - 0.1 * dWm, rtol=1e-5, atol=1e-6)
    # the n - 1 variant moves the adapters measurably differently (what this test would catch)
    assert (math.sqrt(n / (n - 1)) - 1) * float(dWq.abs().max()) * 0.1 > 1e-4


def test_gradient_norm_clipping_is_applied(device):
    d, M, clip = 10, 3, 1e-3
    rr = _bare(d, M, device, lr=1.0, clip_grad_norm=clip)
    sel, R, W0, dWq, dWm = _fixed_step(rr, d, device, 1, 2)
    gnorm = math.sqrt(float((dWq ** 2).sum() + (dWm ** 2).sum()))
    assert gnorm > 100 * clip                    # clipping is active
    st = rr.update(sel, R)
    assert abs(st["grad_norm"] - gnorm) <= 1e-5 * gnorm          # reported before clipping
    step_q = rr.Wq.detach().cpu().double() - W0[0]
    step_m = rr.Wm.detach().cpu().double() - W0[1]
    moved = math.sqrt(float((step_q ** 2).sum() + (step_m ** 2).sum()))
    assert abs(moved - clip) <= 1e-3 * clip, (moved, clip)      # lr 1.0 * clipped norm
    torch.testing.assert_close(step_q, -dWq * (clip / gnorm), rtol=1e-3, atol=2e-8)   # same direction
    torch.testing.assert_close(step_m, -dWm * (clip / gnorm), rtol=1e-3, atol=2e-8)


def test_decay_and_max_norm_projection_are_exact(device):
    d, M = 10, 3
    rr = _bare(d, M, device, lr=0.5, weight_decay=0.2, max_norm=0.5)
    sel, R, W0, dWq, dWm = _fixed_step(rr, d, device, 3, 5)
    Wq1, Wm1 = (W0[0] - 0.5 * dWq) * 0.9, (W0[1] - 0.5 * dWm) * 0.9          # decay 1 - lr * wd
    n = math.sqrt(float((Wq1 ** 2).sum() + (Wm1 ** 2).sum()))
    assert n > 0.5
    st = rr.update(sel, R)
    torch.testing.assert_close(rr.Wq.detach().cpu().double(), Wq1 * (0.5 / n), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(rr.Wm.detach().cpu().double(), Wm1 * (0.5 / n), rtol=1e-5, atol=1e-6)
    assert abs(st["adapter_norm"] - 0.5) < 1e-5


def test_a_non_finite_step_moves_nothing_and_is_reported_at_the_next_check(device, caplog):
    d, M = 10, 3
    rr = _bare(d, M, device, weight_decay=0.1, max_norm=1.0, guard=True, guard_every=2)
    q, C, mask = _batch(d=d, device=device)
    W0 = rr.Wq.detach().clone()
    R = torch.ones(3, 3)
    R[0, 0] = float("nan")
    with caplog.at_level(logging.WARNING, logger="memkern"):
        st = rr.update(rr.select(q, C, mask=mask), R)
        assert torch.equal(rr.Wq.detach(), W0) and not math.isfinite(st["loss"])
        assert not any("non-finite" in r.getMessage() for r in caplog.records)   # no host read yet
        rr.update(rr.select(q, C, mask=mask), torch.ones(3, 3))               # the check step
    assert any("1 of the last 2 steps had a non-finite" in r.getMessage() for r in caplog.records)
    assert not torch.equal(rr.Wq.detach(), W0) and bool(torch.isfinite(rr.Wq).all())


# ------------------------------------------------------------------------------------------------
# sync-free, B-independent step
# ------------------------------------------------------------------------------------------------
class _Count(TorchDispatchMode):
    """Counts dispatched aten ops and host reads (scalar syncs and tolist/item)."""

    def __init__(self):
        super().__init__()
        self.ops: Counter = Counter()
        self.syncs = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        self.ops[name] += 1
        if name == "aten._local_scalar_dense.default":
            self.syncs += 1
        elif name in ("aten._to_copy.default", "aten.copy_.default"):
            src = args[0] if name == "aten._to_copy.default" else args[1]
            dst_dev = (kwargs or {}).get("device") if name == "aten._to_copy.default" else args[0].device
            if isinstance(src, torch.Tensor) and src.device.type != "cpu" and dst_dev is not None \
                    and torch.device(dst_dev).type == "cpu":
                self.syncs += 1                       # device -> host copy
        return func(*args, **(kwargs or {}))


def _steady_state(preset, B, d=16, K=20, steps=16, device="cpu", backend="auto"):
    g = torch.Generator().manual_seed(0)
    rr = Reranker.from_preset(preset, d, device=device, backend=backend)
    q = torch.randn(B, d, generator=g).to(device)
    C = torch.randn(B, K, d, generator=g).to(device)
    R = (torch.rand(B, 5, generator=g) > 0.5).float().mul(2).sub(1).to(device)
    for _ in range(25):                       # fill the replay ring, pass the first guard checks
        rr.update(rr.select(q, C), R)
    host_reads = []
    orig_tolist, orig_item = torch.Tensor.tolist, torch.Tensor.item

    def tolist(self):
        host_reads.append("tolist")
        return orig_tolist(self)

    def item(self):
        host_reads.append("item")
        return orig_item(self)

    torch.Tensor.tolist, torch.Tensor.item = tolist, item
    try:
        with _Count() as c:
            for _ in range(steps):
                rr.update(rr.select(q, C), R)   # stats are not read: nothing forces a sync
    finally:
        torch.Tensor.tolist, torch.Tensor.item = orig_tolist, orig_item
    return c, host_reads


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["paper", "stable"])
def test_dispatched_ops_per_step_are_few_and_do_not_depend_on_B(preset, device):
    # the torch path (backend="torch"; "auto" on CUDA or beyond 64 rows)
    c64, _ = _steady_state(preset, 64, device=device, backend="torch")
    c256, _ = _steady_state(preset, 256, device=device, backend="torch")
    n64, n256 = sum(c64.ops.values()), sum(c256.ops.values())
    assert n64 == n256, (n64, n256)                       # no per-row Python work
    assert n64 <= 150 * 16, n64 / 16                       # <= 150 aten ops per select+update
    if device.type == "cpu":                              # the fused CPU path (B <= 64): one native call each
        c16, _ = _steady_state(preset, 16, device=device)
        c64, _ = _steady_state(preset, 64, device=device)
        n16, n64 = sum(c16.ops.values()), sum(c64.ops.values())
        assert n16 == n64, (n16, n64)
        assert n16 <= 40 * 16, n16 / 16                    # <= 40 aten ops per select+update


@pytest.mark.parametrize("preset", ["paper", "stable"])
def test_at_most_two_host_syncs_in_sixteen_steady_state_steps(preset, device):
    c, reads = _steady_state(preset, 64, device=device)
    n = c.syncs + len(reads)
    assert n <= 2, (c.syncs, reads)
    if preset == "paper":
        assert n == 0                                      # no guard: nothing is ever read back
    else:
        assert reads == ["tolist"] * len(reads) and len(reads) >= 1   # only the guard's periodic check


def test_stats_are_lazy_and_read_as_floats(device):
    rr = Reranker(8, top_m=2, device=device)
    q, C = torch.randn(3, 8, device=device), torch.randn(3, 5, 8, device=device)
    st = rr.update(rr.select(q, C), torch.tensor([[True, False], [False, False], [True, True]], device=device))
    # a device step keeps its statistics as tensors until read; the fused CPU step returns host floats
    assert isinstance(st, UpdateStats) and isinstance(st.tensors["loss"], torch.Tensor if q.is_cuda else (torch.Tensor, float))
    d = dict(st)
    assert set(d) == {"loss", "reward_rate", "grad_norm", "adapter_norm", "n_rows", "n_replay", "baseline",
                      "rolled_back", "step"}
    assert all(isinstance(v, (int, float)) for v in d.values()) and d["reward_rate"] == 0.5 and d["step"] == 1


def test_replay_draws_are_uniform_distinct_and_equal_in_numpy_and_torch(device):
    # the replay draw: the rows of the `size` largest splitmix64 keys. The host (numpy) keys and the
    # device-counter (torch) keys of the capturable mode must be the same bits; the picks distinct and
    # uniform over the filled rows (never past them).
    from memkern.score.replay import _replay_keys

    for draws in (0, 1, 77, 2**40 + 3):
        a = _replay_keys(5, draws, 256, "cpu")
        b = _replay_keys(5, torch.tensor(draws, device=device), 256, device)
        assert torch.equal(a, b.cpu()) and int(a.min()) >= 0
    rr = Reranker(4, top_m=2, replay_capacity=64, device=device)
    tr = rr.trainer
    tr._rlen = 50                               # 50 of 64 rows filled
    counts = torch.zeros(64)
    n = 1500
    for _ in range(n):
        pick = tr._draw(10, device).cpu()
        assert len(set(pick.tolist())) == 10
        counts[pick] += 1
    assert counts[50:].sum() == 0
    expect = n * 10 / 50
    chi2 = float(((counts[:50] - expect) ** 2 / expect).sum())
    assert chi2 < 90, chi2                      # chi-square(49): 0.9999 quantile ~ 90
    assert tr._replay_draws == n


# ------------------------------------------------------------------------------------------------
# inputs, presets, persistence
# ------------------------------------------------------------------------------------------------
def test_update_accepts_rewards_as_list_numpy_or_tensor_on_any_device(device):
    q, C, mask = _batch(d=6, device=device)
    outs = []
    R = [[1.0, -1.0, 1.0], [-1.0, -1.0, 1.0], [1.0, 1.0, -1.0]]
    for rew in (R, np.asarray(R, dtype=np.float64), torch.tensor(R), torch.tensor(R).to(device),
                np.asarray(R) > 0):
        rr = _bare(6, 3, device)
        st = rr.update(rr.select(q, C, mask=mask, seed=1), rew)
        outs.append((rr.Wq.detach().cpu().clone(), st["loss"]))
    for W, loss in outs[1:]:
        assert torch.equal(W, outs[0][0]) and loss == outs[0][1]
    with pytest.raises(memkern.MemkernValueError, match=r"rewards: expected the selection's shape \(3, 3\)"):
        rr.update(rr.select(q, C, mask=mask), [[1.0, 2.0]])
    with pytest.raises(memkern.MemkernTypeError, match="rewards"):
        rr.update(rr.select(q, C, mask=mask), object())


def test_presets_are_trainer_configurations():
    assert set(PRESETS) == set(TRAINER_PRESETS) == {"paper", "stable", "rmm"}
    for name in ("paper", "stable", "rmm"):
        rr = Reranker.from_preset(name, 8)
        cfg = rr.trainer.config()
        for k, v in TRAINER_PRESETS[name].items():
            assert cfg[k] == v, (name, k)
            assert PRESETS[name][k] == v
        t = ReinforceTrainer.from_preset(name, rr)
        assert t.config() == cfg
    rr = Reranker(8)                       # the default is the stable configuration
    assert {k: rr.trainer.config()[k] for k in TRAINER_PRESETS["stable"]} == TRAINER_PRESETS["stable"]
    # a trainer can be swapped on a module: the paper trainer on a default reranker
    rr.trainer = ReinforceTrainer.from_preset("paper", rr)
    assert rr.lr == 1e-3 and rr.replay_capacity == 0 and not rr.guard
    with pytest.raises(memkern.MemkernValueError, match="guard_every"):
        Reranker(8, guard_every=0)


def test_files_saved_by_format_1_still_load_and_train(tmp_path):
    # tests/fixtures/reranker_format1.pt was written by the reranker of commit 9cf31ed (before the trainer
    # split): d=8, top_m=2, Adam 1e-2, running-mean baseline, replay 10 rows (size 3), guard window 3,
    # 5 updates of B=4 on SyntheticCitationTask(d=8, N=60, K=6)
    raw = torch.load(DATA / "reranker_format1.pt", weights_only=True)
    ex = raw["_extra_state"]
    assert ex["format_version"] == 1
    rr = Reranker.load(DATA / "reranker_format1.pt")
    assert (rr.steps, rr.replay_len, rr.optimizer_name, rr.baseline) == (5, 10, "adam", "running_mean")
    assert torch.equal(rr.Wq.detach(), raw["Wq"]) and torch.equal(rr.Wm.detach(), raw["Wm"])
    rows = rr.trainer.replay_rows()
    assert torch.equal(rows["q"], ex["replay"]["q"]) and torch.equal(rows["R"], ex["replay"]["R"])
    assert abs(float(rr.trainer._rb) - ex["running_baseline"]) < 1e-6
    win = [float(w) for w in rr.trainer._win]
    assert win[:2] == [sum(w[0] for w in ex["window"]), sum(w[1] for w in ex["window"])]
    assert rr.trainer._win_steps == len(ex["window"])
    assert rr.optimizer.state_dict()["state"][0]["exp_avg"].shape == (8, 8)     # Adam moments restored
    task = ref.SyntheticCitationTask(d=8, N=60, K=6)
    task.train(rr, 6, B=4)
    assert rr.steps == 11 and bool(torch.isfinite(rr.Wq).all())
    rr.save(tmp_path / "r.pt")
    assert torch.load(tmp_path / "r.pt", weights_only=True)["_extra_state"]["format_version"] == 2
    assert Reranker.load(tmp_path / "r.pt").steps == 11


def test_update_reuses_the_selection_forward_only_while_the_adapters_are_unchanged(device):
    # select() hands its q' and scores to update(); if the adapters (or inputs) changed in between, the
    # gradient must be taken at the current adapters, like memkern.ops.reinforce_grad
    d, M = 10, 3
    q, C, mask = _batch(d=d, device=device)
    R = torch.tensor([[1.0, -1.0, 1.0], [-1.0, 1.0, -1.0], [1.0, 1.0, 1.0]])
    for change in (False, True):
        rr = _bare(d, M, device)
        sel = rr.select(q, C, mask=mask, seed=3)
        assert "_forward" in sel.__dict__
        if change:
            with torch.no_grad():
                rr.Wm.mul_(-2.0)
        W0 = (rr.Wq.detach().cpu().double().clone(), rr.Wm.detach().cpu().double().clone())
        slot = sel.indices.cpu() >= 0
        dWq, dWm = _reference_step(rr, q, C, mask, sel.indices, torch.where(slot, R.double() - 0.5, 0.0))
        rr.update(sel, R)
        torch.testing.assert_close(rr.Wq.detach().cpu().double(), W0[0] - 0.1 * dWq, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(rr.Wm.detach().cpu().double(), W0[1] - 0.1 * dWm, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("logp", ["softmax", "plackett_luce"])
@pytest.mark.parametrize("form", ["ids", "dense"])
def test_replay_steps_that_reuse_the_selection_forward_equal_full_forward_steps(logp, form, device):
    # with replay, update() scores only the replayed rows and takes the new rows' q' and scores from
    # select(); a twin that drops that hand-over (full forward of all rows) must follow the same path,
    # also when the adapters change between select and update (then nothing may be reused)
    task = ref.SyntheticCitationTask(d=12, N=80, K=8, device=device)
    kw = dict(top_m=3, replay_capacity=16, logp=logp, guard_window=4, guard_every=2, device=device)
    a, b = Reranker(12, **kw), Reranker(12, **kw)
    gen = torch.Generator().manual_seed(5)
    table = task.table.to(device)
    for step in range(9):
        q, ids, gold = task.queries(4, gen)
        q, ids = q.to(device), ids.to(device)
        cands = (ids, table) if form == "ids" else table[ids]
        mask = None if form == "ids" else (torch.arange(8, device=device) < 7).expand(4, 8)
        R = task.rewards(torch.zeros(4, 3, dtype=torch.long), gold, gen)
        sa = a.select(q, cands, mask=mask)
        sb = b.select(q, cands, mask=mask)
        sb.__dict__.pop("_forward")                 # b: no hand-over
        if step == 5:
            for r in (a, b):
                with torch.no_grad():
                    r.Wm.mul_(0.5)
        a.update(sa, R)
        b.update(sb, R)
        assert a.trainer.replay_len == b.trainer.replay_len
        torch.testing.assert_close(a.Wq, b.Wq, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(a.Wm, b.Wm, rtol=1e-5, atol=1e-6)
    assert float(a.Wq.detach().abs().sum()) > 0


# ------------------------------------------------------------------------------------------------
# mechanisms one at a time where another one could hide them (mutants trainer-no-normalisation and
# trainer-decay-off in bench/mutants.py)
# ------------------------------------------------------------------------------------------------
def test_advantage_normalisation_scales_by_the_std_when_it_is_not_one(device):
    # With as many positive as negative slots (the test above) the rewards' std is exactly 1 and
    # normalisation is invisible; here 2 of 8 slots are positive.
    d, M = 10, 3
    rr = _bare(d, M, device, normalize_advantages=True)
    q, C, mask = _batch(d=d, device=device)
    sel = rr.select(q, C, mask=mask, seed=4)
    slot = sel.indices.cpu() >= 0
    R = torch.where(slot, torch.tensor([[1.0, -1.0, -1.0], [-1.0, -1.0, -1.0], [-1.0, 1.0, 0.0]]), 0.0)
    a = torch.where(slot, R.double() - 0.5, 0.0)
    n = int(slot.sum())
    std = math.sqrt(float((((a - a.sum() / n) * slot) ** 2).sum()) / n)
    assert abs(std - 1.0) > 0.1
    W0 = (rr.Wq.detach().cpu().double().clone(), rr.Wm.detach().cpu().double().clone())
    dWq, dWm = _reference_step(rr, q, C, mask, sel.indices.cpu(), torch.where(slot, a / (std + 1e-6), 0.0))
    rr.update(sel, R)
    for got, w0, dw in ((rr.Wq, W0[0], dWq), (rr.Wm, W0[1], dWm)):
        torch.testing.assert_close(got.detach().cpu().double(), w0 - 0.1 * dw, rtol=1e-5, atol=1e-6)


def test_weight_decay_alone_is_exact(device):
    # Without max-norm the decay is the only multiplier (with it, the projection's rescaling would
    # hide a missing decay).
    d, M = 10, 3
    rr = _bare(d, M, device, lr=0.5, weight_decay=0.2, max_norm=None)
    sel, R, W0, dWq, dWm = _fixed_step(rr, d, device, 3, 5)
    st = rr.update(sel, R)
    torch.testing.assert_close(rr.Wq.detach().cpu().double(), (W0[0] - 0.5 * dWq) * 0.9, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(rr.Wm.detach().cpu().double(), (W0[1] - 0.5 * dWm) * 0.9, rtol=1e-5, atol=1e-6)
    n = math.sqrt(float(((W0[0] - 0.5 * dWq) ** 2).sum() + ((W0[1] - 0.5 * dWm) ** 2).sum())) * 0.9
    assert abs(st["adapter_norm"] - n) < 1e-5 * max(n, 1.0)


# ------------------------------------------------------------------------------------------------
# a selection drawn with a prior: the gradient is that of the policy it was drawn from
# ------------------------------------------------------------------------------------------------
def _triton_ok() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:  # pragma: no cover
        return False
    import os

    return torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=[
    pytest.mark.interpret, pytest.mark.skipif(not _triton_ok(), reason="needs CUDA or TRITON_INTERPRET=1")])])
@pytest.mark.parametrize("logp", ["softmax", "plackett_luce"])
@pytest.mark.parametrize("form", ["dense", "table"])
@pytest.mark.parametrize("replay", [False, True])
def test_a_prior_enters_the_policy_gradient_also_for_replayed_rows(logp, form, replay, backend, device):
    # the policy is softmax((prior + q'.m' - q.m) / tau): its REINFORCE gradient needs the prior in the
    # probabilities (not only in the draw), for new rows and for rows replayed from the ring; both backends
    d, M, B, K = 10, 3, 3, 7
    rr = _bare(d, M, device, logp=logp, replay_capacity=4 if replay else 0, replay_size=B if replay else 0,
               backend=backend)
    rows = []
    for step in range(2 if replay else 1):
        g = torch.Generator().manual_seed(40 + step)
        q, C, mask = _batch(B=B, K=K, d=d, seed=20 + step, device=device)
        prior = (torch.randn(B, K, generator=g) * 3.0).to(device)
        if form == "table":
            table = C.reshape(B * K, d)
            ids = torch.arange(B * K, device=device).reshape(B, K).masked_fill(~mask, -1)
            sel = rr.select(q, (ids, table), seed=3 + step, prior=prior)
        else:
            sel = rr.select(q, C, mask=mask, seed=3 + step, prior=prior)
        R = torch.tensor([[1.0, -1.0, 1.0], [-1.0, 1.0, -1.0], [1.0, 1.0, 0.0]])
        rows.append((q, C, mask, prior, sel.indices, R))
        W0 = (rr.Wq.detach().cpu().double().clone(), rr.Wm.detach().cpu().double().clone())
        use = rows[-1:] if step == 0 else rows[::-1]        # step 1: its rows + the 3 replayed rows of step 0
        cat = [torch.cat([r[k].cpu() for r in use]) for k in range(6)]
        adv = torch.where(cat[4] >= 0, cat[5].double() - 0.5, torch.zeros((), dtype=torch.float64))
        _, dWq, dWm, _, _ = ref.reference_loss_and_grads(cat[0], rr.Wq.detach().cpu(), rr.Wm.detach().cpu(), cat[1],
                                                         cat[4], adv, tau=rr.tau, baseline=0.0, logp=logp,
                                                         valid=cat[2], prior=cat[3])
        st = rr.update(sel, R)
        assert st["n_replay"] == (B if step else 0)
        torch.testing.assert_close(rr.Wq.detach().cpu().double(), W0[0] - 0.1 * dWq, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(rr.Wm.detach().cpu().double(), W0[1] - 0.1 * dWm, rtol=1e-4, atol=1e-6)
    if replay:   # the ring keeps the rows' prior offsets through save / load
        rr2 = Reranker.from_state_dict(rr.state_dict())
        torch.testing.assert_close(rr2.trainer.replay_rows()["P"], rr.trainer.replay_rows()["P"].cpu())
