"""memkern.Reranker: selection, closed-form updates, persistence, learning, stable-learning guards."""
from __future__ import annotations

import dataclasses

import logging
import math
import os

import pytest
import torch

import memkern
from memkern.score import reference as ref
from memkern.errors import MemkernTypeError, MemkernValueError
from memkern.score.reranker import PRESETS, Reranker, Selection

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")
F = torch.nn.functional

try:
    import triton  # noqa: F401

    _TRITON = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"
except Exception:  # pragma: no cover
    _TRITON = False


# a synthetic retrieval task: queries are a hidden linear distortion of their gold memory plus noise,
# the retriever ranks the table by cosine; citations are noisy (0.9 for the gold memory, 0.1 otherwise)
Task = ref.SyntheticCitationTask


def _train(task, rr, steps, B=4, seed=1, n_eval=400):
    return task.train(rr, steps, B=B, seed=seed, n_eval=n_eval)


def _finite(rr):
    return bool(torch.isfinite(rr.Wq).all() and torch.isfinite(rr.Wm).all())


# ------------------------------------------------------------------------------------------------
# selection
# ------------------------------------------------------------------------------------------------
def test_lazy_export():
    assert memkern.Reranker is Reranker and memkern.Selection is Selection


def test_zero_adapters_reproduce_the_retriever_order_exactly(device):
    g = torch.Generator().manual_seed(0)
    B, K, d, N = 6, 12, 24, 50
    q = torch.randn(B, d, generator=g).to(device)
    table = torch.randn(N, d, generator=g).to(device)
    retr = torch.topk(q @ table.T, K, dim=1)                  # the retriever's own top-K, in order
    rr = Reranker(d, top_m=K, device=device)
    sel = rr.select(q, (retr.indices, table), greedy=True)
    assert torch.equal(sel.selected_ids, retr.indices)
    sel = rr.select(q, (retr.indices, table), greedy=True, m=5)
    assert torch.equal(sel.selected_ids, retr.indices[:, :5])
    dense = table[retr.indices]
    sel = rr.select(q, dense, greedy=True, m=5)
    assert torch.equal(sel.indices, torch.arange(5, device=device).expand(B, 5))
    torch.testing.assert_close(sel.scores, retr.values, rtol=1e-6, atol=1e-6)


def test_prior_makes_a_fresh_reranker_keep_the_first_stage_order(device):
    # the candidates' embeddings rank them one way, the prior (a first-stage score) another: a zero
    # reranker must return the prior's order exactly, its scores equal to the prior
    g = torch.Generator().manual_seed(3)
    B, K, d = 4, 9, 16
    q = torch.randn(B, d, generator=g).to(device)
    cands = torch.randn(B, K, d, generator=g).to(device)
    prior = torch.randn(B, K, generator=g).to(device)
    rr = Reranker(d, top_m=K, device=device)
    sel = rr.select(q, cands, greedy=True, prior=prior)
    assert torch.equal(sel.indices, torch.argsort(prior, dim=1, descending=True))
    assert torch.equal(sel.scores, prior.float())
    assert torch.equal(sel.prior, prior.float())
    # without a prior: the embeddings' order (unchanged behaviour)
    plain = rr.select(q, cands, greedy=True)
    assert torch.equal(plain.indices, torch.argsort((cands @ q.unsqueeze(-1)).squeeze(-1), dim=1, descending=True))
    assert plain.prior is None


def test_prior_adds_the_adapters_residual(device):
    # trained adapters: score = prior + (q'.m' - q.m), checked in float64 on the table form with padding
    g = torch.Generator().manual_seed(4)
    B, K, d, N = 3, 7, 12, 30
    q = torch.randn(B, d, generator=g)
    table = torch.randn(N, d, generator=g)
    ids = torch.randint(0, N, (B, K), generator=g)
    ids[1, 5:] = -1
    prior = torch.randn(B, K, generator=g)
    rr = Reranker(d, top_m=3)
    with torch.no_grad():
        rr.Wq.copy_(0.1 * torch.randn(d, d, generator=g))
        rr.Wm.copy_(0.1 * torch.randn(d, d, generator=g))
    rr = rr.to(device)
    sel = rr.select(q.to(device), (ids.to(device), table.to(device)), greedy=True, prior=prior.to(device))
    qd, Wq, Wm, T = q.double(), rr.Wq.detach().cpu().double(), rr.Wm.detach().cpu().double(), table.double()
    r = (qd + qd @ Wq.T) @ (torch.eye(d, dtype=torch.float64) + Wm)
    M = T[ids.clamp_min(0)]
    want = prior.double() + torch.einsum("bkd,bd->bk", M, r) - torch.einsum("bkd,bd->bk", M, qd)
    want[ids < 0] = -math.inf
    got = sel.scores.cpu().double()
    assert torch.equal(torch.isinf(got), ids < 0)
    torch.testing.assert_close(got[ids >= 0], want[ids >= 0], rtol=1e-4, atol=1e-4)
    assert torch.equal(sel.indices.cpu(), torch.topk(want, 3, dim=1).indices)
    # the draw (not greedy) samples from the residual scores: a huge prior gap decides it
    big = torch.zeros(B, K)
    big[:, 2] = 1e4
    s2 = rr.select(q.to(device), (ids.to(device), table.to(device)), prior=big.to(device), m=1, seed=5)
    assert s2.indices[:, 0].tolist() == [2] * B
    # update() still runs from a selection made with a prior (the gradient is the adapters' own)
    st = rr.update(s2, torch.ones(B, 1))
    assert math.isfinite(float(st["loss"]))


def test_prior_bad_input_raises():
    rr = Reranker(8, top_m=2)
    q, c = torch.randn(2, 8), torch.randn(2, 4, 8)
    with pytest.raises(MemkernValueError, match="prior"):
        rr.select(q, c, prior=torch.zeros(2, 3))
    with pytest.raises(MemkernValueError, match="prior"):
        rr.select(q, c, prior=[[0.0, float("nan"), 0.0, 0.0], [0.0] * 4])
    with pytest.raises(MemkernTypeError, match="prior"):
        rr.select(q, c, prior=torch.zeros(2, 4, dtype=torch.bool))
    with pytest.raises(MemkernTypeError, match="prior"):
        rr.select(q, c, prior="high")
    # a 1-D query takes a [K] prior
    sel = rr.select(q[0], c[0], greedy=True, prior=torch.tensor([0.0, 3.0, 1.0, 2.0]))
    assert sel.indices.tolist() == [1, 3]


def test_select_shapes_padding_and_seeds(device):
    g = torch.Generator().manual_seed(1)
    d, K, N = 8, 6, 20
    table = torch.randn(N, d, generator=g).to(device)
    ids = torch.tensor([[3, 1, -1, 0, 2, -1], [5, -1, -1, -1, -1, 7]], device=device)
    q = torch.randn(2, d, generator=g).to(device)
    rr = Reranker(d, top_m=3, seed=5, device=device)
    s1 = rr.select(q, (ids, table))
    s2 = rr.select(q, (ids, table))          # the internal counter advanced: a fresh draw
    assert (s1.offset, s2.offset) == (0, 12)
    assert s1.indices.shape == (2, 3) and s1.scores.shape == (2, 6) and s1.logp.shape == (2, 3)
    assert s1.indices[1, 2].item() == -1 and s1.selected_ids[1, 2].item() == -1   # only 2 valid
    for sel in (s1, s2):
        for row, idrow in zip(sel.indices.tolist(), ids.tolist()):
            assert all(idrow[i] >= 0 for i in row if i >= 0)
    again = rr.select(q, (ids, table), seed=s1.seed, offset=s1.offset)
    assert torch.equal(again.indices, s1.indices)
    one = rr.select(q[0], (ids[0], table))   # 1-D query
    assert one.indices.shape == (3,) and one.squeezed
    with pytest.raises(MemkernValueError, match="m: expected m <= K = 6"):
        rr.select(q, (ids, table), m=7)
    with pytest.raises(MemkernValueError, match="candidates"):
        rr.select(q, (ids, table, 1))


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=[
    pytest.mark.interpret, pytest.mark.skipif(not _TRITON, reason="needs CUDA or TRITON_INTERPRET=1")])])
@pytest.mark.parametrize("logp", ["softmax", "plackett_luce"])
def test_paper_update_is_one_sgd_step_on_the_reference_gradient(backend, logp, device):
    g = torch.Generator().manual_seed(2)
    B, K, M, d = 3, 7, 3, 10
    rr = Reranker.from_preset("paper", d, top_m=M, logp=logp, backend=backend, device=device)
    with torch.no_grad():
        rr.Wq.copy_(torch.randn(d, d, generator=g) * 0.1)
        rr.Wm.copy_(torch.randn(d, d, generator=g) * 0.1)
    Wq0, Wm0 = rr.Wq.detach().cpu().clone(), rr.Wm.detach().cpu().clone()
    q = torch.randn(B, d, generator=g)
    C = torch.randn(B, K, d, generator=g)
    mask = torch.ones(B, K, dtype=torch.bool)
    mask[2, 4:] = False
    sel = rr.select(q.to(device), C.to(device), mask=mask.to(device), seed=3)
    R = torch.tensor([[1.0, -1.0, -1.0], [-1.0, -1.0, 1.0], [1.0, 1.0, -1.0]])
    st = rr.update(sel, R)          # CPU rewards for a selection on `device`
    loss, dWq, dWm, _, lp = ref.reference_loss_and_grads(q, Wq0, Wm0, C, sel.indices.cpu(), R, tau=0.5,
                                                         baseline=0.5, logp=logp, valid=mask)
    torch.testing.assert_close(sel.logp.cpu().double(), lp, rtol=1e-5, atol=1e-5)
    assert abs(st["loss"] - float(loss)) < 1e-5
    torch.testing.assert_close(rr.Wq.detach().cpu().double(), Wq0.double() - 1e-3 * dWq, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(rr.Wm.detach().cpu().double(), Wm0.double() - 1e-3 * dWm, rtol=1e-6, atol=1e-7)
    assert st["baseline"] == 0.5 and st["n_replay"] == 0 and st["step"] == 1
    assert abs(st["reward_rate"] - 4 / 9) < 1e-9


def test_any_torch_optimizer_gets_the_closed_form_gradient(device):
    g = torch.Generator().manual_seed(4)
    d, K = 6, 5
    q, C = torch.randn(2, d, generator=g), torch.randn(2, K, d, generator=g)
    R = torch.tensor([[1.0, -1.0], [-1.0, 1.0]])
    for spec in (torch.optim.Adam, lambda p: torch.optim.Adam(p, lr=1e-3), "adam"):
        rr = Reranker.from_preset("paper", d, top_m=2, optimizer=spec, device=device)
        sel = rr.select(q.to(device), C.to(device), seed=1)
        rr.update(sel, R.to(device))
        # a first Adam step moves every entry with a nonzero gradient by ~lr
        _, dWq, _, _, _ = ref.reference_loss_and_grads(q, torch.zeros(d, d), torch.zeros(d, d), C,
                                                       sel.indices.cpu(), R)
        moved = rr.Wq.detach().cpu().abs()
        nz = dWq.abs() > 1e-6
        torch.testing.assert_close(moved[nz], torch.full_like(moved[nz], 1e-3), rtol=1e-2, atol=1e-6)
        assert torch.equal(torch.sign(rr.Wq.detach().cpu()[nz]).double(), -torch.sign(dWq[nz]))
    with pytest.raises(MemkernTypeError, match="optimizer"):
        Reranker(d, optimizer=3)


def test_update_validates_rewards_and_accepts_bools(device):
    rr = Reranker(4, top_m=2, device=device)
    q, C = torch.randn(3, 4, device=device), torch.randn(3, 5, 4, device=device)
    sel = rr.select(q, C)
    with pytest.raises(MemkernValueError, match=r"rewards: expected the selection's shape \(3, 2\)"):
        rr.update(sel, torch.ones(3, 3, device=device))
    with pytest.raises(MemkernTypeError, match="selection"):
        rr.update("x", torch.ones(3, 2, device=device))
    st = rr.update(sel, torch.tensor([[True, False], [False, False], [True, True]], device=device))
    assert abs(st["reward_rate"] - 0.5) < 1e-9
    with pytest.raises(MemkernValueError, match="dim"):
        Reranker(0)
    with pytest.raises(MemkernValueError, match="baseline"):
        Reranker(4, baseline="median")


def test_state_dict_round_trip_continues_identically(tmp_path, device):
    task = Task(d=16, N=100, K=10, device=device)
    rr = Reranker(16, optimizer="adam", lr=1e-3, replay_capacity=12, guard_window=3, device=device)
    _train(task, rr, 7)
    path = tmp_path / "ns" / "reranker.pt"
    rr.save(path)
    rr2 = Reranker.load(path, map_location=device, device=device)
    assert rr2.Wq.device == rr.Wq.device
    assert rr2.optimizer_name == "adam" and rr2.replay_len == rr.replay_len == 12 and rr2.steps == 7
    torch.testing.assert_close(rr2.Wq, rr.Wq, rtol=0, atol=0)
    for a in (rr, rr2):   # the same future: draws, replay picks, optimizer moments, guard windows
        _train(task, a, 5, seed=8)
    torch.testing.assert_close(rr2.Wq, rr.Wq, rtol=0, atol=0)
    torch.testing.assert_close(rr2.Wm, rr.Wm, rtol=0, atol=0)
    fresh = Reranker(16, optimizer="adam", lr=1e-3, replay_capacity=12, device=device)
    fresh.load_state_dict(rr.state_dict())
    assert fresh.steps == rr.steps and fresh.replay_len == 12
    with pytest.raises(MemkernValueError, match="dim"):
        Reranker(8).load_state_dict(rr.state_dict())


# ------------------------------------------------------------------------------------------------
# learning
# ------------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("kw", [{}, {"logp": "plackett_luce", "baseline": "running_mean"}], ids=["default", "pl"])
def test_learns_a_hidden_preferred_direction(kw, device):
    # reward +1 iff the selected memory lies along a hidden query-dependent direction P q
    d, K, B = 16, 20, 4
    g = torch.Generator().manual_seed(5)
    P = (torch.randn(d, d, generator=g) / math.sqrt(d)).to(device)
    rr = Reranker(d, **kw, device=device)
    rates = []
    for _ in range(400):
        q = F.normalize(torch.randn(B, d, generator=g), dim=-1).to(device)
        C = F.normalize(torch.randn(B, K, d, generator=g).to(device) + 0.5 * q[:, None], dim=-1)
        sel = rr.select(q, C)
        m = C.gather(1, sel.indices.unsqueeze(-1).expand(-1, -1, d))
        R = torch.where(torch.einsum("bmd,bd->bm", m, q @ P.T) > 0.2, 1.0, -1.0)
        rates.append(rr.update(sel, R)["reward_rate"])
    first, last = sum(rates[:100]) / 100, sum(rates[-100:]) / 100
    assert last > first + 0.08, (first, last)


@pytest.mark.slow
def test_default_learns_from_noisy_citations_in_one_pass(device):
    task = Task(device=device)
    r0, r1, _ = _train(task, Reranker(task.d, device=device), 600)
    assert r1 > r0 + 0.10, (r0, r1)


# ------------------------------------------------------------------------------------------------
# stable learning (issue 7)
# ------------------------------------------------------------------------------------------------
def test_presets():
    p = Reranker.from_preset("paper", 8)
    assert (p.lr, p.baseline, p.optimizer_name, p.clip_grad_norm, p.replay_capacity, p.guard,
            p.normalize_advantages, p.weight_decay, p.logp) == (1e-3, 0.5, "sgd", None, 0, False, False, 0.0,
                                                                "softmax")
    s = Reranker(8)
    for k, v in PRESETS["stable"].items():
        got = s.optimizer_name if k == "optimizer" else getattr(s, k)
        assert got == v, k
    with pytest.raises(MemkernValueError, match="name"):
        Reranker.from_preset("fast", 8)


def test_baseline_modes(device):
    q, C = torch.randn(2, 4, device=device), torch.randn(2, 5, 4, device=device)
    R = torch.tensor([[1.0, -1.0], [-1.0, -1.0]], device=device)
    for mode, want in ((0.5, 0.5), ("batch_mean", -0.5)):
        rr = Reranker(4, top_m=2, baseline=mode, replay_capacity=0, device=device)
        assert rr.update(rr.select(q, C), R)["baseline"] == want
    rr = Reranker(4, top_m=2, baseline="running_mean", replay_capacity=0, baseline_momentum=0.5, device=device)
    assert rr.update(rr.select(q, C), R)["baseline"] == -0.5           # first batch: its own mean
    assert rr.update(rr.select(q, C), torch.ones(2, 2, device=device))["baseline"] == -0.5   # then the running mean
    assert rr.update(rr.select(q, C), torch.ones(2, 2, device=device))["baseline"] == 0.25   # 0.5 * -0.5 + 0.5 * 1


def test_replay_buffer_is_bounded_revisited_and_persisted(tmp_path, device):
    task = Task(d=8, N=60, K=6, device=device)
    rr = Reranker(8, top_m=2, replay_capacity=10, replay_size=3, device=device)
    _, _, stats = _train(task, rr, 6, B=4)
    assert rr.replay_len == 10
    assert [s["n_replay"] for s in stats] == [0, 3, 3, 3, 3, 3]
    assert [s["n_rows"] for s in stats] == [4, 7, 7, 7, 7, 7]
    rows = rr.trainer.replay_rows()            # FIFO order, oldest first
    assert rows["q"].shape == (10, 8) and rows["C"].shape == (10, 6, 8) and rows["idx"].shape == (10, 2)
    rr.save(tmp_path / "r.pt")
    rr2 = Reranker.load(tmp_path / "r.pt", map_location=device, device=device)
    assert rr2.replay_len == 10
    rows2 = rr2.trainer.replay_rows()
    for k in rows:
        assert torch.equal(rows[k], rows2[k]), k
    # replay_size=None replays as many rows as the new batch; capacity 0 disables it
    rr3 = Reranker(8, top_m=2, replay_capacity=50, device=device)
    _, _, stats = _train(task, rr3, 3, B=5)
    assert [s["n_replay"] for s in stats] == [0, 5, 5] and rr3.replay_len == 15
    rr4 = Reranker(8, top_m=2, replay_capacity=0, device=device)
    _train(task, rr4, 3)
    assert rr4.replay_len == 0 and "replay" not in (rr4.state_dict()["_extra_state"]["replay"] or {})


def test_guard_rolls_back_an_exploding_adapter(caplog, device):
    task = Task(d=8, N=60, K=6, device=device)
    rr = Reranker(8, top_m=2, lr=100.0, clip_grad_norm=None, normalize_advantages=False, weight_decay=0.0,
                  max_norm=None, guard_max_norm=5.0, device=device)
    with caplog.at_level(logging.WARNING, logger="memkern"):
        _, _, stats = _train(task, rr, 10)
    assert rr.rollbacks >= 1 and any(s["rolled_back"] for s in stats)
    assert rr.adapter_norm() <= 5.0 and _finite(rr)
    assert any("collapse guard rolled back" in r.getMessage() for r in caplog.records)


def test_guard_reads_the_norm_the_fused_step_computed(monkeypatch):
    """On the fused CPU path a step that projects the adapters returns their norm; the guard's
    check takes that value (the norm of the adapters as they are, not a second read of them) and
    still rolls back a norm above guard_max_norm."""
    task = Task(d=8, N=60, K=6, device="cpu")
    rr = Reranker(8, top_m=2, lr=100.0, clip_grad_norm=None, normalize_advantages=False, weight_decay=0.0,
                  max_norm=50.0, guard_max_norm=5.0, device="cpu")
    tr = rr.trainer
    given = []
    check = tr._check

    def recording_check(norm=None):
        given.append((norm, float(tr._norm())))
        return check(norm)

    monkeypatch.setattr(tr, "_check", recording_check)
    _, _, stats = _train(task, rr, 30)        # a check every guard_every = 10 steps
    assert len(given) == 3
    for norm, actual in given:
        assert type(norm) is float and abs(norm - actual) <= 1e-5 * max(1.0, actual), given
    assert rr.rollbacks >= 1 and any(s["rolled_back"] for s in stats)
    assert rr.adapter_norm() <= 5.0 and _finite(rr)


def test_update_after_the_selection_changed_uses_its_new_inputs():
    """update() reuses select()'s forward and checked inputs only while the selection holds the same
    tensors, unchanged: candidates swapped after select() (or edited in place) are what it trains on."""
    g = torch.Generator().manual_seed(3)
    B, K, d = 3, 7, 16
    q = torch.randn(B, d, generator=g)
    C1, C2 = torch.randn(B, K, d, generator=g), torch.randn(B, K, d, generator=g)
    R = torch.tensor([[1.0, -1.0]] * B)
    outs = []
    for backend in ("auto", "torch"):
        for edit in ("swap", "in place"):
            rr = Reranker(d, top_m=2, backend=backend, replay_capacity=0)
            sel = rr.select(q, C1.clone())
            if edit == "swap":
                sel.candidates = C2.clone()
            else:
                sel.candidates.copy_(C2)
            rr.update(sel, R)
            outs.append((backend, edit, rr.Wq.detach().clone(), rr.Wm.detach().clone()))
    ref = Reranker(d, top_m=2, backend="torch", replay_capacity=0)
    sel = ref.select(q, C1)
    ref.update(dataclasses.replace(sel, candidates=C2), R)
    for backend, edit, Wq, Wm in outs:
        assert torch.allclose(Wq, ref.Wq.detach(), atol=1e-6) and torch.allclose(Wm, ref.Wm.detach(), atol=1e-6), (
            backend, edit)


@pytest.mark.slow
def test_guard_rolls_back_when_the_reward_rate_falls(device):
    task = Task(p_miss=0.0, device=device)   # with 0.1 false citations the rate can only fall ~35%
    rr = Reranker(task.d, guard_window=25, device=device)
    r0, r1, _ = _train(task, rr, 300)
    assert rr.rollbacks == 0 and r1 > r0 + 0.05
    good_Wm = rr._good_state["Wm"].clone()
    with torch.no_grad():                  # corrupt the adapters (norm within bounds): the ranking degrades
        rr.Wm.mul_(-3.0)
        rr.Wq.mul_(-1.0)
    _, r2, _ = _train(task, rr, 60, seed=3)
    assert rr.rollbacks >= 1
    assert r2 > r0 and r2 >= r1 - 0.08, (r0, r1, r2)
    assert not torch.equal(good_Wm, -3.0 * good_Wm)


# collapse regression: the settings that destroyed the ranking in issue 7 must not do so under the
# default guards; the control run shows the unguarded paper setting does collapse on the same task
COLLAPSE = [("adam", 1e-3, 1500), ("sgd", 1e-2, 1500), ("sgd", 1e-1, 1500)]


@pytest.mark.slow
@pytest.mark.parametrize("opt,lr,steps", COLLAPSE, ids=[f"{o}-{lr}" for o, lr, _ in COLLAPSE])
def test_no_collapse_under_default_guards(opt, lr, steps, device):
    task = Task(device=device)
    rr = Reranker(task.d, optimizer=opt, lr=lr, device=device)
    r0, r1, stats = _train(task, rr, steps)
    assert _finite(rr) and all(math.isfinite(s["loss"]) for s in stats)
    assert r1 >= r0 - 0.02, (r0, r1)
    assert rr.adapter_norm() <= rr.max_norm + 1e-4
    assert rr.rollbacks <= 2, rr.rollbacks   # the guard is a last resort, not the regulator


@pytest.mark.slow
def test_unguarded_paper_setting_collapses_on_the_same_task(device):
    task = Task(device=device)
    rr = Reranker.from_preset("paper", task.d, lr=1e-1, device=device)
    r0, r1, _ = _train(task, rr, 800)
    assert (not _finite(rr)) or r1 < r0 - 0.1, (r0, r1)


@pytest.mark.slow
@pytest.mark.skipif(not _TRITON, reason="needs CUDA or TRITON_INTERPRET=1")
@pytest.mark.interpret
def test_triton_and_torch_rerankers_follow_the_same_trajectory(device):
    task = Task(d=8, N=40, K=5, device=device)
    a = Reranker(8, top_m=2, backend="torch", replay_capacity=4, device=device)
    b = Reranker(8, top_m=2, backend="triton", replay_capacity=4, device=device)
    _, ra, sa = _train(task, a, 3, B=2, n_eval=8)
    _, rb, sb = _train(task, b, 3, B=2, n_eval=8)
    assert [s["n_replay"] for s in sb] == [0, 2, 2] and ra == rb
    for x, y in zip(sa, sb):
        assert abs(x["loss"] - y["loss"]) < 1e-4 and x["reward_rate"] == y["reward_rate"]
    torch.testing.assert_close(a.Wq, b.Wq, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(a.Wm, b.Wm, rtol=1e-4, atol=1e-6)


# ------------------------------------------------------------------------------------------------
# capturable mode (CUDA-graph capture of select + update)
# ------------------------------------------------------------------------------------------------
def _online(rr, task, steps, B, form, gen_seed=3, spoil_at=None):
    """``steps`` select+update rounds; returns the selections. ``spoil_at``: after that round, put
    wrong values into the host copies of the counters (the capturable path must not read them)."""
    gen = torch.Generator().manual_seed(gen_seed)
    dev = task.device
    table = task.table.to(dev)
    out = []
    for t in range(steps):
        q, ids, gold = task.queries(B, gen)
        q, ids = q.to(dev), ids.to(dev)
        sel = rr.select(q, (ids, table)) if form == "ids" else rr.select(q, table[ids])
        out.append(sel.indices.cpu())
        rr.update(sel, task.rewards(ids.cpu().gather(1, sel.indices.cpu()), gold, gen))
        if t == spoil_at:
            rr._offset += 777
            rr.trainer._rpos = (rr.trainer._rpos + 5) % max(rr.trainer.replay_capacity, 1)
            rr.trainer._replay_draws += 3
    return out


@pytest.mark.parametrize("preset", ["paper", "stable", "running_mean"])
@pytest.mark.parametrize("form", ["ids", "dense"])
def test_capturable_path_reads_its_state_on_the_device_and_equals_the_eager_path(preset, form, device):
    # Reranker(capture=True) reads the draw counter, the ring position and the replay-draw counter from
    # device tensors. Run without graphs, it must give the eager path's selections and adapters bit for
    # bit over many steps (ring filling and wrapping, guard checks), even with its host copies spoiled.
    task = Task(d=12, N=80, K=8, device=device)
    kw = dict(top_m=3, device=device)
    if preset != "paper":
        kw.update(replay_capacity=16, guard_window=4, guard_every=3)
    if preset == "running_mean":
        preset, kw["baseline"] = "stable", "running_mean"
    # the eager torch path (capture mode never takes the fused CPU path, which equals it to float rounding)
    eager = Reranker.from_preset(preset, 12, backend="torch", **kw)
    capt = Reranker.from_preset(preset, 12, capture=True, **kw)
    capt._graphs = None                    # the capturable path itself (the graphs are tested on CUDA)
    sa = _online(eager, task, 40, 5, form)
    sb = _online(capt, task, 40, 5, form, spoil_at=10)
    assert all(torch.equal(x, y) for x, y in zip(sa, sb))
    assert len({tuple(x.flatten().tolist()) for x in sa}) > 30          # genuinely random draws
    assert torch.equal(eager.Wq, capt.Wq) and torch.equal(eager.Wm, capt.Wm)
    assert float(eager.Wq.detach().abs().sum()) > 0
    assert int(capt._offset_t) == eager._offset == 40 * 5 * 8
    if preset == "stable":
        assert int(capt.trainer._rpos_t) == eager.trainer._rpos and int(capt.trainer._draws_t) == 39
        assert torch.equal(capt.trainer._ring["q"], eager.trainer._ring["q"])


def test_capture_mode_round_trips_and_switches_off(tmp_path, device):
    task = Task(d=8, N=40, K=6, device=device)
    a = Reranker(8, top_m=2, replay_capacity=8, capture=True, device=device)
    a._graphs = None
    _online(a, task, 5, 3, "ids")
    a.save(tmp_path / "r.pt")
    b = Reranker.load(tmp_path / "r.pt", map_location=device, device=device, capture=True)
    b._graphs = None
    assert int(b._offset_t if b._offset_t is not None else b._offset_tensor()) == a._offset
    assert int(b.trainer._rpos_t) == a.trainer._rpos and int(b.trainer._draws_t) == a.trainer._replay_draws
    sa, sb = _online(a, task, 4, 3, "ids", gen_seed=9), _online(b, task, 4, 3, "ids", gen_seed=9)
    assert all(torch.equal(x, y) for x, y in zip(sa, sb)) and torch.equal(a.Wm, b.Wm)
    b.set_capture(False)
    assert b.trainer._rpos_t is None and b._offset_t is None and not b.capture
    # eager (the torch path: the fused CPU path equals it to float rounding only), from the same file
    c = Reranker.load(tmp_path / "r.pt", map_location=device, device=device, backend="torch")
    _online(c, task, 4, 3, "ids", gen_seed=9)
    assert torch.equal(c.Wm, a.Wm)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need CUDA")
@pytest.mark.parametrize("preset", ["paper", "stable"])
def test_cuda_graph_replays_follow_the_eager_trajectory(preset, caplog):
    dev = torch.device("cuda")
    task = Task(d=16, N=120, K=10, device=dev)
    kw = dict(top_m=3, device=dev)
    if preset == "stable":
        kw.update(replay_capacity=8, guard_window=4, guard_every=3)
    eager = Reranker.from_preset(preset, 16, **kw)
    capt = Reranker.from_preset(preset, 16, capture=True, **kw)
    sa = _online(eager, task, 30, 4, "ids")
    sb = _online(capt, task, 30, 4, "ids")
    g = capt._graphs
    assert g is not None and g.sel_g is not None and g.upd_g is not None          # both were captured
    assert all(torch.equal(x, y) for x, y in zip(sa, sb))
    torch.testing.assert_close(capt.Wq, eager.Wq, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(capt.Wm, eager.Wm, rtol=1e-5, atol=1e-6)
    assert capt._offset == eager._offset == int(capt._offset_t) and capt.steps == eager.steps == 30
    assert capt.trainer._rpos == eager.trainer._rpos and capt.trainer._replay_draws == eager.trainer._replay_draws
    # other shapes run eagerly (logged), then get their own capture
    with caplog.at_level(logging.INFO, logger="memkern"):
        _online(eager, task, 4, 2, "ids", gen_seed=5)
        _online(capt, task, 4, 2, "ids", gen_seed=5)
    assert any("warming up and capturing again" in r.getMessage() for r in caplog.records)
    torch.testing.assert_close(capt.Wm, eager.Wm, rtol=1e-5, atol=1e-6)


class _FakeGraph:
    """Stands in for torch.cuda.CUDAGraph on the CPU: the recorded function's tensor work runs at
    each replay (outputs copied into the static ones) but its host effects (the reranker's host
    counters) are undone, as a real replay runs no Python. The capture itself runs the work once,
    so the first replay after it does nothing."""

    def replay(self):
        if self.fresh:
            self.fresh = False
            return
        rr = self.rr
        tr = rr.trainer
        host = (rr._offset, tr._rpos, tr._rlen, tr._replay_draws)
        new = self.fn()
        rr._offset, tr._rpos, tr._rlen, tr._replay_draws = host
        if isinstance(new, Selection):
            for k in ("indices", "scores", "logp"):
                getattr(self.out, k).copy_(getattr(new, k))
            self.out.__dict__["_forward"][1].copy_(new.__dict__["_forward"][1])
        else:
            for k, v in self.out.tensors.items():
                if isinstance(v, torch.Tensor):
                    v.copy_(new.tensors[k])


def _emulated_runner(rr, monkeypatch):
    from memkern.score import graphs

    class Stream:
        device = None

        def wait_stream(self, other):
            pass

    monkeypatch.setattr(torch.cuda, "CUDAGraph", _FakeGraph)
    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: Stream())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: __import__("contextlib").nullcontext())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)

    class Emulated(graphs.GraphRunner):
        def _record(self, graph, fn):
            out = fn()
            graph.fn, graph.out, graph.fresh, graph.rr = fn, out, True, self.rr
            return out

    rr._graphs = Emulated(rr)
    return rr._graphs


@pytest.mark.parametrize("preset", ["paper", "stable"])
def test_graph_runner_bookkeeping_follows_the_eager_path(preset, monkeypatch, caplog):
    # memkern.graphs' logic (warm-up, capture, replay, host counters, stats, fallbacks) on the CPU with
    # an emulated graph (_FakeGraph); the CUDA test above runs the real capture
    task = Task(d=12, N=80, K=8)
    kw = dict(top_m=3)
    if preset == "stable":
        kw.update(replay_capacity=8, guard_window=4, guard_every=3)
    eager = Reranker.from_preset(preset, 12, backend="torch", **kw)     # the eager torch path, bit for bit
    capt = Reranker.from_preset(preset, 12, capture=True, **kw)
    runner = _emulated_runner(capt, monkeypatch)
    sa = _online(eager, task, 30, 4, "ids")
    sb = _online(capt, task, 30, 4, "ids")
    assert runner.sel_g is not None and runner.upd_g is not None          # both were captured
    assert all(torch.equal(x, y) for x, y in zip(sa, sb))
    assert torch.equal(capt.Wq, eager.Wq) and torch.equal(capt.Wm, eager.Wm)
    assert capt._offset == eager._offset == int(capt._offset_t) and capt.steps == eager.steps == 30
    tr, te = capt.trainer, eager.trainer
    assert (tr._rpos, tr._rlen, tr._replay_draws) == (te._rpos, te._rlen, te._replay_draws)
    if preset == "stable":
        assert int(tr._rpos_t) == te._rpos and int(tr._draws_t) == te._replay_draws
        assert torch.equal(tr._ring["R"], te._ring["R"])
    # stats of replayed steps are the step's own (not overwritten by the next replay)
    gen = torch.Generator().manual_seed(11)
    q, ids, gold = task.queries(4, gen)
    sel = capt.select(q, (ids, task.table))
    st1 = capt.update(sel, torch.ones(4, 3))
    loss1 = float(st1["loss"]) if preset == "paper" else st1.tensors["loss"].clone()
    capt.update(capt.select(q, (ids, task.table)), -torch.ones(4, 3))
    assert (float(st1["loss"]) == loss1) if preset == "paper" else torch.equal(st1.tensors["loss"], loss1)
    # an update of an older selection, and other shapes, run eagerly (logged)
    runner._logged.clear()
    with caplog.at_level(logging.INFO, logger="memkern"):
        old = capt.select(q, (ids, task.table))
        capt.select(q, (ids, task.table))
        capt.update(old, torch.ones(4, 3))
        capt.select(q[:2], (ids[:2], task.table))
    msgs = " ".join(r.getMessage() for r in caplog.records)
    assert "not the last replayed select's" in msgs and "warming up and capturing again" in msgs
