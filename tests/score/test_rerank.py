"""memkern.ops (torch backend) and memkern.kernels.rerank (Triton, under TRITON_INTERPRET=1 on CPU)
against the naive float64 references of memkern.score.reference (explicit m', autograd)."""
from __future__ import annotations

import logging
import math
import os

import pytest
import torch

from memkern.score import reference as ref
from memkern.score import ops
from memkern.score.ops import backend as ops_backend, philox as ops_philox
from memkern.errors import BackendUnavailableError, MemkernTypeError, MemkernValueError

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # interpreter: numpy on -inf

try:
    import triton  # noqa: F401

    _TRITON = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"
except Exception:  # pragma: no cover
    _TRITON = False

BACKENDS = ["torch", pytest.param("triton", marks=[
    pytest.mark.interpret, pytest.mark.skipif(not _TRITON, reason="triton needs CUDA or TRITON_INTERPRET=1")])]

def _inputs(B, K, d, N=None, dtype=torch.float32, seed=0, scale=0.3, mask_p=0.0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, d, generator=g)
    Wq = torch.randn(d, d, generator=g) * scale / math.sqrt(d)
    Wm = torch.randn(d, d, generator=g) * scale / math.sqrt(d)
    C = torch.randn(B, K, d, generator=g)
    mask = torch.rand(B, K, generator=g) >= mask_p
    out = dict(q=q, Wq=Wq, Wm=Wm, C=C, mask=mask)
    if N is not None:
        T = torch.randn(N, d, generator=g)
        ids = torch.randint(0, N, (B, K), generator=g)
        ids = torch.where(mask, ids, torch.full_like(ids, -1))
        out.update(T=T, ids=ids)
    return {k: (v.to(dtype) if v.is_floating_point() else v).to(device) for k, v in out.items()}


def _close(a, b, tol):
    a = a.double().cpu()
    b = b.double().cpu()
    fin = torch.isfinite(b)
    assert torch.equal(torch.isfinite(a), fin)
    err = (a[fin] - b[fin]).abs().max().item() if fin.any() else 0.0
    scale = max(1.0, b[fin].abs().max().item() if fin.any() else 1.0)
    assert err <= tol * scale, f"max abs err {err} > {tol} * {scale}"


# (B, K, M, d): K=1, M=K, d=1, d not a power of two, B=1, block boundaries (K 16/17/33, d 128/130)
SHAPES = [(1, 1, 1, 1), (2, 5, 5, 3), (3, 7, 4, 37), (1, 17, 3, 16), (2, 16, 16, 8), (2, 33, 5, 130),
          (2, 4, 2, 128)]


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("B,K,M,d", SHAPES)
@pytest.mark.parametrize("logp", ["softmax", "plackett_luce"])
def test_step_matches_float64_reference(backend, B, K, M, d, logp, device):
    x = _inputs(B, K, d, seed=B * 1000 + K * 10 + d, mask_p=0.2 if K > 3 else 0.0, device=device)
    R = torch.randn(B, M, generator=torch.Generator().manual_seed(1)).to(device)
    st = ops.rerank_step(x["q"], x["Wq"], x["Wm"], x["C"], R, M, tau=0.7, seed=11, offset=3, mask=x["mask"],
                         baseline=0.25, logp=logp, backend=backend)
    s64 = ref.reference_scores(x["q"].cpu(), x["Wq"].cpu(), x["Wm"].cpu(), x["C"].cpu(), x["mask"].cpu())
    _close(st.scores, s64, 1e-5)
    loss, dWq, dWm, _, lp64 = ref.reference_loss_and_grads(
        x["q"].cpu(), x["Wq"].cpu(), x["Wm"].cpu(), x["C"].cpu(), st.indices.cpu(), R.cpu(), tau=0.7,
        baseline=0.25, logp=logp, valid=x["mask"].cpu())
    _close(st.logp, lp64, 1e-5)
    _close(st.loss, loss, 1e-5)
    _close(st.dWq, dWq, 1e-5)
    _close(st.dWm, dWm, 1e-5)
    # padding never selected; rows with fewer valid than M fill with -1
    nvalid = x["mask"].sum(1)
    for b in range(B):
        sel = st.indices[b].tolist()
        taken = [i for i in sel if i >= 0]
        assert len(taken) == min(M, int(nvalid[b])) and len(set(taken)) == len(taken)
        assert all(bool(x["mask"][b, i]) for i in taken)
        assert sel[len(taken):] == [-1] * (M - len(taken))
    # the unfused ops agree with the fused step
    g = ops.reinforce_grad(x["q"], x["Wq"], x["Wm"], x["C"], st.indices, R, mask=x["mask"], tau=0.7,
                           baseline=0.25, logp=logp, backend=backend)
    _close(g.dWq, dWq, 1e-5)
    _close(g.dWm, dWm, 1e-5)
    draw = ops.gumbel_topm(st.scores, M, tau=0.7, seed=11, offset=3, logp=logp, backend=backend)
    assert torch.equal(draw.indices, st.indices)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_ids_table_gather_and_dtypes(backend, dtype, device):
    B, K, M, d, N = 3, 9, 4, 24, 13
    x = _inputs(B, K, d, N=N, dtype=dtype, seed=7, mask_p=0.3, device=device)
    R = torch.where(torch.rand(B, M, generator=torch.Generator().manual_seed(2)) > 0.5, 1.0, -1.0).to(device)
    st = ops.rerank_step(x["q"], x["Wq"], x["Wm"], x["T"], R, M, seed=5, ids=x["ids"], logp="plackett_luce",
                         backend=backend)
    Cd = x["T"][x["ids"].clamp_min(0)].cpu()
    valid = (x["ids"] >= 0).cpu()
    s64 = ref.reference_scores(x["q"].cpu(), x["Wq"].cpu(), x["Wm"].cpu(), Cd, valid)
    _close(st.scores, s64, 1e-5)  # fp32 accumulation of the same (rounded) inputs
    loss, dWq, dWm, _, lp64 = ref.reference_loss_and_grads(
        x["q"].cpu(), x["Wq"].cpu(), x["Wm"].cpu(), Cd, st.indices.cpu(), R.cpu(), logp="plackett_luce", valid=valid)
    _close(st.logp, lp64, 1e-5)
    _close(st.dWq, dWq, 1e-5)
    _close(st.dWm, dWm, 1e-5)
    assert st.scores.dtype == torch.float32 and st.dWq.dtype == torch.float32
    # dense candidates give the same result as ids
    st2 = ops.rerank_step(x["q"], x["Wq"], x["Wm"], x["T"][x["ids"].clamp_min(0)], R, M, seed=5,
                          mask=x["ids"] >= 0, logp="plackett_luce", backend=backend)
    assert torch.equal(st2.indices, st.indices)
    _close(st2.dWm, st.dWm, 1e-5)


@pytest.mark.skipif(not _TRITON, reason="triton needs CUDA or TRITON_INTERPRET=1")
@pytest.mark.interpret
def test_torch_philox_reproduces_triton_rand_bit_for_bit(device):
    from memkern.kernels import rerank as k

    for seed, off in [(0, 0), (123, 5), (2**31 + 17, 2**32 - 40), (2**40 + 7, 2**33)]:
        a = k.uniforms(seed, off, 300, device=device).cpu()
        b = ops.philox_uniform(seed, off + torch.arange(300))
        assert torch.equal(a, b), (seed, off)
    u = ops.philox_uniform(9, torch.arange(20000))
    assert 0.0 <= float(u.min()) and float(u.max()) < 1.0
    assert abs(float(u.mean()) - 0.5) < 0.01


def test_numpy_and_torch_philox_agree(monkeypatch, device):
    offs = torch.cat([torch.arange(500), torch.arange(2**32 - 300, 2**32 + 300), torch.tensor([2**40 + 3])])
    for seed in (0, 77, 2**31 + 5, 2**45 + 9):
        a = ops.philox_uniform(seed, offs)                  # numpy on the CPU
        monkeypatch.setattr(ops_philox, "_FORCE_TORCH_PHILOX", True)
        b = ops.philox_uniform(seed, offs.to(device))       # torch ops on `device`
        monkeypatch.setattr(ops_philox, "_FORCE_TORCH_PHILOX", False)
        assert b.device == offs.to(device).device
        assert torch.equal(a, b.cpu()) and a.dtype == torch.float32


def test_zero_adapters_give_retriever_scores_and_greedy_order(device):
    x = _inputs(4, 10, 16, seed=3, device=device)
    Z = torch.zeros(16, 16, device=device)
    s = ops.rerank_scores(x["q"], Z, Z, x["C"], backend="torch")
    torch.testing.assert_close(s, torch.einsum("bkd,bd->bk", x["C"], x["q"]), rtol=1e-6, atol=1e-6)
    d = ops.gumbel_topm(s, 10, greedy=True)
    assert torch.equal(d.indices, torch.argsort(s, dim=1, descending=True))


def _pl_chi2(counts: dict, probs: dict, n: int) -> float:
    return sum((counts.get(k, 0) - n * p) ** 2 / (n * p) for k, p in probs.items())


def _draw_counts(idx):
    out: dict = {}
    for row in idx.tolist():
        out[tuple(row)] = out.get(tuple(row), 0) + 1
    return out


@pytest.mark.parametrize("backend,n", [("torch", 20000), pytest.param("triton", 20000, marks=[
    pytest.mark.skipif(not torch.cuda.is_available(), reason="20000 draws: too slow for the interpreter; "
                       "test_triton_sampler_equals_torch_sampler covers the interpreted kernel")])])
@pytest.mark.slow
def test_sampling_frequencies_match_plackett_luce(backend, n, device):
    # one row per draw: counters offset + b*K + i make the rows independent draws
    scores = torch.tensor([0.9, 0.1, -0.4, 0.5, 0.0])
    tau, M = 0.5, 2
    probs = ref.plackett_luce_ordered_probs(scores, M, tau)   # 20 ordered pairs, df = 19
    crit = 43.8  # chi-square(19) 0.999 quantile
    S = scores.expand(n, -1).contiguous().to(device)
    draw = ops.gumbel_topm(S, M, tau=tau, seed=2024, logp="plackett_luce", backend=backend)
    assert _pl_chi2(_draw_counts(draw.indices), probs, n) < crit
    # the log-probs are the exact PL ones
    for row, lp in zip(draw.indices[:50].tolist(), draw.logp[:50]):
        assert abs(float(lp.sum()) - math.log(probs[tuple(row)])) < 1e-5
    # the same statistic rejects a biased sampler built from the same uniforms: exponential instead of
    # Gumbel noise (keys z - log u), and a Gumbel sampler at the wrong temperature
    u = ops.philox_uniform(2024, torch.arange(n * 5)).view(n, 5).clamp_min(1e-10)
    z = (scores / tau).expand(n, -1)
    for keys in (z - torch.log(u), scores.expand(n, -1) / (2 * tau) - torch.log(-torch.log(u))):
        biased = torch.topk(keys, M, dim=1).indices
        assert _pl_chi2(_draw_counts(biased), probs, n) > crit


@pytest.mark.slow
@pytest.mark.skipif(not _TRITON, reason="triton needs CUDA or TRITON_INTERPRET=1")
@pytest.mark.interpret
@pytest.mark.parametrize("logp", ["softmax", "plackett_luce"])
def test_triton_sampler_equals_torch_sampler(logp, device):
    # Same Philox uniforms (bit for bit) and the same selection rule: the kernel's draws are the torch
    # path's draws, whose frequencies the chi-square test above checks against exact PL probabilities.
    n = 96
    scores = torch.tensor([0.9, 0.1, -0.4, 0.5, 0.0]).expand(n, -1).contiguous()
    a = ops.gumbel_topm(scores.to(device), 3, tau=0.5, seed=99, offset=7, logp=logp, backend="triton")
    b = ops.gumbel_topm(scores, 3, tau=0.5, seed=99, offset=7, logp=logp, backend="torch")
    assert torch.equal(a.indices.cpu(), b.indices)
    torch.testing.assert_close(a.logp.cpu(), b.logp, rtol=1e-5, atol=1e-5)
    assert len(_draw_counts(b.indices)) > 10  # genuinely random draws


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_padding_never_selected_and_reproducible(backend, device):
    B, K, M = (64 if backend == "torch" else 12), 6, 3
    g = torch.Generator().manual_seed(4)
    scores = torch.randn(B, K, generator=g).to(device)
    mask = (torch.rand(B, K, generator=g) > 0.4).to(device)
    mask[0] = False                    # a row with nothing valid
    scores[1, 0] = 50.0                # a padded entry with a huge score
    mask[1, 0] = False
    a = ops.gumbel_topm(scores, M, seed=8, mask=mask, backend=backend)
    b = ops.gumbel_topm(scores, M, seed=8, mask=mask, backend=backend)
    c = ops.gumbel_topm(scores, M, seed=8, offset=B * K, mask=mask, backend=backend)
    assert torch.equal(a.indices, b.indices) and torch.equal(a.logp, b.logp)
    assert not torch.equal(a.indices, c.indices)
    assert a.indices[0].tolist() == [-1] * M and a.logp[0].abs().sum() == 0
    for row, mrow in zip(a.indices.tolist(), mask.tolist()):
        taken = [i for i in row if i >= 0]
        assert all(mrow[i] for i in taken) and len(taken) == min(M, sum(mrow))
    # -inf scores are padding too
    a2 = ops.gumbel_topm(scores.masked_fill(~mask, float("-inf")), M, seed=8, backend=backend)
    assert torch.equal(a2.indices, a.indices)
    # torch.Generator as the source of the seed
    ga = ops.gumbel_topm(scores, M, seed=torch.Generator().manual_seed(1), mask=mask, backend=backend)
    gb = ops.gumbel_topm(scores, M, seed=torch.Generator().manual_seed(1), mask=mask, backend=backend)
    assert torch.equal(ga.indices, gb.indices)


@pytest.mark.skipif(not _TRITON, reason="triton needs CUDA or TRITON_INTERPRET=1")
@pytest.mark.interpret
def test_backends_draw_the_same_items(device):
    x = _inputs(8, 12, 20, seed=5, mask_p=0.2, device=device)
    R = torch.ones(8, 4).to(device)
    a = ops.rerank_step(x["q"], x["Wq"], x["Wm"], x["C"], R, 4, seed=77, mask=x["mask"], backend="torch")
    b = ops.rerank_step(x["q"], x["Wq"], x["Wm"], x["C"], R, 4, seed=77, mask=x["mask"], backend="triton")
    assert torch.equal(a.indices.cpu(), b.indices.cpu())


def test_validation_errors_name_the_argument(device):
    x = _inputs(2, 4, 8, N=5, device=device)
    q, Wq, Wm, C = x["q"], x["Wq"], x["Wm"], x["C"]
    with pytest.raises(MemkernValueError, match="m: expected m <= K = 4"):
        ops.rerank_step(q, Wq, Wm, C, torch.ones(2, 5, device=device), 5)
    with pytest.raises(MemkernValueError, match="Wq"):
        ops.rerank_scores(q, Wq[:4], Wm, C)
    with pytest.raises(MemkernValueError, match="candidates"):
        ops.rerank_scores(q, Wq, Wm, C[:, :, :3])
    with pytest.raises(MemkernTypeError, match="ids"):
        ops.rerank_scores(q, Wq, Wm, x["T"], ids=x["ids"].int())
    with pytest.raises(MemkernTypeError, match="q"):
        ops.rerank_scores(q.long(), Wq, Wm, C)
    with pytest.raises(MemkernValueError, match="mask"):
        ops.rerank_scores(q, Wq, Wm, C, mask=torch.ones(2, 3, dtype=torch.bool, device=device))
    with pytest.raises(MemkernValueError, match="ids"):
        bad = x["ids"].clone()
        bad[0, 0] = 99
        ops.rerank_scores(q, Wq, Wm, x["T"], ids=bad, check=True)
    s = torch.randn(2, 4, device=device)
    s[1, 2] = float("nan")
    with pytest.raises(MemkernValueError, match=r"scores: .*NaN in rows \[1\]"):
        ops.gumbel_topm(s, 2, check=True)
    with pytest.raises(MemkernValueError, match="tau"):
        ops.gumbel_topm(torch.randn(2, 4, device=device), 2, tau=0.0)
    with pytest.raises(MemkernValueError, match="logp"):
        ops.gumbel_topm(torch.randn(2, 4, device=device), 2, logp="exact")
    with pytest.raises(MemkernValueError, match="seed"):
        ops.gumbel_topm(torch.randn(2, 4, device=device), 2, seed=-1)
    idx = ops.gumbel_topm(torch.randn(2, 4, device=device), 2).indices
    with pytest.raises(MemkernValueError, match=r"rewards: expected shape of the selection \(2, 2\)"):
        ops.reinforce_grad(q, Wq, Wm, C, idx, torch.ones(2, 3, device=device))
    with pytest.raises(MemkernValueError, match="backend"):
        ops.rerank_scores(q, Wq, Wm, C, backend="cuda")


def test_backend_choice_is_explicit_and_logged(monkeypatch, caplog, device):
    x = _inputs(1, 3, 4, device=device)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    if not torch.cuda.is_available():
        with pytest.raises(BackendUnavailableError, match="need CUDA"):
            ops.rerank_scores(x["q"].cpu(), x["Wq"].cpu(), x["Wm"].cpu(), x["C"].cpu(), backend="triton")
    ops_backend._LOGGED.clear()
    with caplog.at_level(logging.INFO, logger="memkern"):
        ops.rerank_scores(x["q"].cpu(), x["Wq"].cpu(), x["Wm"].cpu(), x["C"].cpu(), backend="auto")
        ops.rerank_scores(x["q"].cpu(), x["Wq"].cpu(), x["Wm"].cpu(), x["C"].cpu(), backend="auto")
    msgs = [r.getMessage() for r in caplog.records if "backend='auto' chose" in r.getMessage()]
    assert len(msgs) == 1 and "'torch'" in msgs[0] and "not on CUDA" in msgs[0]


def test_one_dimensional_query(device):
    x = _inputs(1, 6, 5, device=device)
    s = ops.rerank_scores(x["q"][0], x["Wq"], x["Wm"], x["C"][0], backend="torch")
    assert s.shape == (6,)
    st = ops.rerank_step(x["q"][0], x["Wq"], x["Wm"], x["C"][0], torch.ones(2, device=device), 2, backend="torch")
    assert st.indices.shape == (2,) and st.dWq.shape == (5, 5)


def test_device_mismatch_names_the_argument(device):
    x = _inputs(2, 4, 8, device=device)
    with pytest.raises(MemkernValueError, match="Wm: expected a tensor on q's device"):
        ops.rerank_scores(x["q"], x["Wq"], x["Wm"].to("meta"), x["C"])
    with pytest.raises(MemkernValueError, match="candidates: expected a tensor on q's device"):
        ops.rerank_scores(x["q"], x["Wq"], x["Wm"], x["C"].to("meta"))


@pytest.mark.skipif(torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") != "1",
                    reason="the dry run is the CPU/interpreter form of bench/gpu_check.py")
@pytest.mark.slow
@pytest.mark.interpret
def test_gpu_check_script_dry_run(capsys):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "bench" / "gpu_check.py"
    spec = importlib.util.spec_from_file_location("memkern_gpu_check", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "all checks passed" in out and out.count("| True |") == 2


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_offset_read_from_a_device_tensor_gives_the_int_offsets_draw(backend, device):
    # the capturable draw: the Philox counter base is a 0-dim int64 tensor read on the device
    g = torch.Generator().manual_seed(6)
    scores = torch.randn(5, 9, generator=g).to(device)
    for off in (0, 45, 2**33 + 5):
        a = ops.gumbel_topm(scores, 4, seed=3, offset=off, backend=backend)
        b = ops.gumbel_topm(scores, 4, seed=3, offset=torch.tensor(off, device=device), backend=backend)
        assert torch.equal(a.indices, b.indices) and torch.equal(a.logp, b.logp)
    c = ops.gumbel_topm(scores, 4, seed=3, offset=torch.tensor(45, device=device), backend=backend)
    assert not torch.equal(c.indices, ops.gumbel_topm(scores, 4, seed=3, offset=0, backend=backend).indices)
    with pytest.raises(MemkernValueError, match="offset: expected an int >= 0 or a 0-dim int64 tensor"):
        ops.gumbel_topm(scores, 4, offset=torch.tensor([1], device=device), backend=backend)
    with pytest.raises(MemkernValueError, match="offset: expected an int >= 0"):
        ops.gumbel_topm(scores, 4, offset=-1, backend=backend)
