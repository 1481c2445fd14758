"""Full reranker step (score + Gumbel-top-M + log-prob + REINFORCE gradient): memkern vs naive eager torch.

The naive version is the paper's formulas written directly (``memkern._reference.naive_step``):
explicit ``m' = m + Wm m`` for every candidate (``K d^2`` per query) and autograd. memkern's torch
backend computes ``r = (I + Wm)^T (I + Wq) q`` once per query and the closed-form rank-1 gradients.
Both draw from the same Philox uniforms, so they select the same items; every benchmarked case
first asserts that the gradients agree.

Run (default: the target point B=64, K=20, M=5, d=768 plus two small ones)::

    OMP_NUM_THREADS=1 python -m pytest bench/bench_reranker.py -q
    MEMKERN_BENCH_FULL=1 OMP_NUM_THREADS=1 python -m pytest bench/bench_reranker.py -q   # full grid
    OMP_NUM_THREADS=1 python bench/bench_reranker.py [--full]                              # table only
    OMP_NUM_THREADS=1 python bench/bench_reranker.py --stability [paper|default] [--steps N]   # learning stability
    OMP_NUM_THREADS=1 python bench/bench_reranker.py --select-update [--rounds R]   # Reranker vs naive (issue 11)

``--select-update``: one online step as users run it, ``Reranker.select`` + ``Reranker.update``, for
the paper preset and the stable default (steady state: replay ring full), against the naive eager
step (``naive_select_update``: explicit ``m'``, autograd, then the SGD update), at B in {1, 64, 256},
d in {384, 768}, K=20, M=5. Interleaved rounds (naive, paper, stable, naive, ...) after warm-up;
the median over rounds of the per-step time. Before timing, each case checks that the paper preset
and the naive step select the same items and reach the same adapters, and that the stable preset's
first step equals ``naive_stable_step`` (the same settings written naively).

Grid (full): B in {1, 4, 64, 256}, K in {20, 50}, M in {5, 10}, d in {384, 768, 1024}.
CPU target: >= 5x over naive at B=64, K=20, M=5, d=768.
"""
from __future__ import annotations

import itertools
import math
import os
import statistics
import sys
import time

import pytest
import torch

from memkern import _reference as ref
from memkern import ops

torch.set_num_threads(1)

TARGET = (64, 20, 5, 768)
TARGET_SPEEDUP = 5.0
FULL = os.environ.get("MEMKERN_BENCH_FULL", "0") not in ("", "0")
GRID = (list(itertools.product([1, 4, 64, 256], [20, 50], [5, 10], [384, 768, 1024])) if FULL
        else [(1, 20, 5, 384), (4, 50, 10, 384), TARGET])
SEED = 1234


def make(B, K, M, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.nn.functional.normalize(torch.randn(B, d, generator=g), dim=-1)
    C = torch.nn.functional.normalize(torch.randn(B, K, d, generator=g), dim=-1)
    Wq = torch.randn(d, d, generator=g) * 0.02
    Wm = torch.randn(d, d, generator=g) * 0.02
    u = ops.philox_uniform(SEED, torch.arange(B * K)).view(B, K)
    return q, Wq, Wm, C, u


def rewards(idx):
    """Deterministic stand-in for citations: even candidate positions are 'cited'."""
    return torch.where(idx % 2 == 0, 1.0, -1.0)


def fast(q, Wq, Wm, C, M):
    st = ops.rerank_step(q, Wq, Wm, C, rewards, M, tau=0.5, seed=SEED, baseline=0.5, logp="softmax",
                         backend="torch")
    return st.indices, st.dWq, st.dWm


def naive(q, Wq, Wm, C, M, u):
    idx, _, _, _, dWq, dWm = ref.naive_step(q, Wq, Wm, C, rewards, m=M, tau=0.5, baseline=0.5, uniforms=u)
    return idx, dWq, dWm


def check(B, K, M, d):
    q, Wq, Wm, C, u = make(B, K, M, d)
    i1, a1, b1 = fast(q, Wq, Wm, C, M)
    i2, a2, b2 = naive(q, Wq, Wm, C, M, u)
    assert torch.equal(i1, i2), "fast and naive drew different items"
    for x, y in ((a1, a2), (b1, b2)):
        err = (x - y).abs().max().item()
        assert err <= 1e-4 * max(1.0, y.abs().max().item()), err


def timeit(fn, reps=None, budget_s=0.6):
    fn()
    t0 = time.perf_counter()
    fn()
    one = time.perf_counter() - t0
    reps = reps or max(3, min(50, int(budget_s / max(one, 1e-6))))
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def compare(B, K, M, d):
    """(fast_s, naive_s, speedup), measured interleaved in this process."""
    q, Wq, Wm, C, u = make(B, K, M, d)
    tf = timeit(lambda: fast(q, Wq, Wm, C, M))
    tn = timeit(lambda: naive(q, Wq, Wm, C, M, u))
    return tf, tn, tn / tf


@pytest.mark.parametrize("B,K,M,d", GRID, ids=[f"B{b}-K{k}-M{m}-d{d}" for b, k, m, d in GRID])
@pytest.mark.parametrize("impl", ["memkern_torch", "naive_eager"])
def test_step(benchmark, impl, B, K, M, d):
    check(B, K, M, d)
    q, Wq, Wm, C, u = make(B, K, M, d)
    benchmark.group = f"B={B} K={K} M={M} d={d}"
    if impl == "memkern_torch":
        benchmark(fast, q, Wq, Wm, C, M)
    else:
        benchmark(naive, q, Wq, Wm, C, M, u)


def test_target_speedup():
    check(*TARGET)
    tf, tn, sp = compare(*TARGET)
    print(f"\nB=64 K=20 M=5 d=768: memkern {tf * 1e3:.2f} ms, naive {tn * 1e3:.2f} ms, speedup {sp:.1f}x")
    assert sp >= TARGET_SPEEDUP, f"speedup {sp:.2f}x < {TARGET_SPEEDUP}x"


# ------------------------------------------------------------------------------------------------
# Reranker.select + Reranker.update (both presets) vs naive eager torch
# ------------------------------------------------------------------------------------------------
SU_GRID = [(B, d) for B in (1, 64, 256) for d in (384, 768)]
SU_K, SU_M = 20, 5


def su_data(B, d, K=SU_K, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.nn.functional.normalize(torch.randn(B, d, generator=g), dim=-1)
    C = torch.nn.functional.normalize(torch.randn(B, K, d, generator=g), dim=-1)
    return q, C


def naive_select_update(W, q, C, M, u, lr=1e-3, tau=0.5, baseline=0.5):
    """The paper's step written naively (explicit m', autograd) + the SGD update of ``W = [Wq, Wm]``."""
    idx, _, _, _, dWq, dWm = ref.naive_step(q, W[0], W[1], C, rewards, m=M, tau=tau, baseline=baseline, uniforms=u)
    W[0].sub_(lr * dWq)
    W[1].sub_(lr * dWm)
    return idx


def naive_stable_step(W, q, C, M, u, lr=5e-2, tau=0.5, clip=1.0, wd=1e-2, max_norm=20.0):
    """The stable default's first step (no replay yet) written naively: batch-mean baseline,
    population-std normalised advantages, clipped gradient norm, SGD, decay, max-norm projection."""
    Wq = W[0].clone().requires_grad_(True)
    Wm = W[1].clone().requires_grad_(True)
    qp = q + q @ Wq.T
    mp = C + C @ Wm.T
    z = torch.einsum("bkd,bd->bk", mp, qp) / tau
    idx = torch.topk(z.detach() - torch.log(-torch.log(u.clamp_min(1e-10))), M, dim=1).indices
    lp = torch.log_softmax(z, dim=1).gather(1, idx)
    R = rewards(idx)
    adv = R - R.mean()
    adv = adv / (adv.std(unbiased=False) + 1e-6)
    loss = -(adv * lp).sum() / q.shape[0]
    loss.backward()
    gn = math.sqrt(float(Wq.grad.square().sum() + Wm.grad.square().sum()))
    s = min(1.0, clip / (gn + 1e-12))
    with torch.no_grad():
        for w, g in ((W[0], Wq.grad), (W[1], Wm.grad)):
            w.sub_(lr * s * g).mul_(1.0 - lr * wd)
        n = math.sqrt(float(W[0].square().sum() + W[1].square().sum()))
        if n > max_norm:
            W[0].mul_(max_norm / n)
            W[1].mul_(max_norm / n)
    return idx


def memkern_select_update(rr, q, C):
    sel = rr.select(q, C)
    rr.update(sel, rewards(sel.indices))
    return sel.indices


def su_check(B, d):
    """Equal results: the presets' first select+update against the naive versions (from zero adapters)."""
    from memkern.reranker import Reranker

    q, C = su_data(B, d)
    u = ops.philox_uniform(0, torch.arange(B * SU_K)).view(B, SU_K)    # the reranker's first draw
    for preset, naive in (("paper", naive_select_update), ("stable", naive_stable_step)):
        rr = Reranker.from_preset(preset, d, backend="torch")
        W = [torch.zeros(d, d), torch.zeros(d, d)]
        i1 = memkern_select_update(rr, q, C)
        i2 = naive(W, q, C, SU_M, u)
        assert torch.equal(i1, i2), f"{preset}: memkern and naive drew different items"
        for a, b in ((rr.Wq.detach(), W[0]), (rr.Wm.detach(), W[1])):
            err = (a - b).abs().max().item()
            assert err <= 1e-4 * max(1e-6, b.abs().max().item()), (preset, err)


def su_compare(B, d, rounds=5, budget_s=0.25):
    """Median ms per select+update of naive / paper / stable, measured in interleaved rounds."""
    from memkern.reranker import Reranker

    q, C = su_data(B, d)
    u = ops.philox_uniform(0, torch.arange(B * SU_K)).view(B, SU_K)
    W = [torch.zeros(d, d), torch.zeros(d, d)]
    rrs = {p: Reranker.from_preset(p, d, backend="torch") for p in ("paper", "stable")}
    fns = {"naive": lambda: naive_select_update(W, q, C, SU_M, u),
           "paper": lambda: memkern_select_update(rrs["paper"], q, C),
           "stable": lambda: memkern_select_update(rrs["stable"], q, C)}
    warm = max(3, 256 // B + 2)                     # fills the stable preset's replay ring
    for f in fns.values():
        for _ in range(min(warm, 20) if f is fns["naive"] else warm):
            f()
    t0 = time.perf_counter()
    fns["naive"]()
    reps = max(1, min(20, int(budget_s / max(time.perf_counter() - t0, 1e-6))))
    per = {k: [] for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            t0 = time.perf_counter()
            for _ in range(reps):
                f()
            per[k].append((time.perf_counter() - t0) / reps)
    return {k: statistics.median(v) * 1e3 for k, v in per.items()}, reps


def select_update_table(rounds=5):
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, K={SU_K}, M={SU_M}, {rounds} rounds")
    print("| B | d | naive eager (ms) | paper preset (ms) | stable default (ms) | naive / paper | naive / stable |")
    print("|---|---|---|---|---|---|---|")
    for B, d in SU_GRID:
        su_check(B, d)
        ms, _ = su_compare(B, d, rounds=rounds)
        print(f"| {B} | {d} | {ms['naive']:.3f} | {ms['paper']:.3f} | {ms['stable']:.3f} | "
              f"{ms['naive'] / ms['paper']:.2f}x | {ms['naive'] / ms['stable']:.2f}x |", flush=True)


@pytest.mark.parametrize("B,d", SU_GRID, ids=[f"B{b}-d{d}" for b, d in SU_GRID])
@pytest.mark.parametrize("impl", ["naive", "paper", "stable"])
def test_select_update(benchmark, impl, B, d):
    from memkern.reranker import Reranker

    su_check(B, d)
    q, C = su_data(B, d)
    benchmark.group = f"select+update B={B} K={SU_K} M={SU_M} d={d}"
    if impl == "naive":
        u = ops.philox_uniform(0, torch.arange(B * SU_K)).view(B, SU_K)
        W = [torch.zeros(d, d), torch.zeros(d, d)]
        benchmark(naive_select_update, W, q, C, SU_M, u)
    else:
        rr = Reranker.from_preset(impl, d, backend="torch")
        for _ in range(256 // B + 2):
            memkern_select_update(rr, q, C)
        benchmark(memkern_select_update, rr, q, C)


STABILITY = [("paper", "sgd", 1e-3), ("paper", "sgd", 1e-2), ("paper", "sgd", 1e-1), ("paper", "adam", 1e-3),
             ("paper", "adam", 1e-2), ("default", "sgd", 5e-2), ("default", "sgd", 1e-4), ("default", "sgd", 1e-3),
             ("default", "sgd", 1e-2), ("default", "sgd", 1e-1), ("default", "adam", 1e-4),
             ("default", "adam", 1e-3), ("default", "adam", 1e-2)]


def stability(steps=10_000, B=4, checkpoints=(1000, 10_000), only=None):
    """Held-back Recall@5 on ``SyntheticCitationTask`` (noisy citations 0.9/0.1) along one online pass
    of ``steps`` updates, for the paper preset and the default (stable) setting at several optimizers
    and learning rates. Prints a markdown table."""
    from memkern.reranker import Reranker

    task = ref.SyntheticCitationTask()
    print(f"SyntheticCitationTask(d={task.d}, N={task.N}, K={task.K}), B={B}, {steps} updates, Recall@5 on 400 "
          "held-back queries")
    cps = [c for c in checkpoints if c <= steps]
    print("| setting | optimizer | lr | R@5 before | " + " | ".join(f"R@5 after {c}" for c in cps)
          + " | adapter norm | rollbacks | non-finite W |")
    print("|---|---|---|---|" + "---|" * len(cps) + "---|---|---|")
    for preset, opt, lr in STABILITY:
        if only and preset != only:
            continue
        rr = (Reranker.from_preset("paper", task.d, optimizer=opt, lr=lr) if preset == "paper"
              else Reranker(task.d, optimizer=opt, lr=lr))
        done, rec, r0 = 0, [], None
        for c in cps:
            # continue the same online pass: fresh query stream per chunk, seeded by the chunk start
            a, b, _ = task.train(rr, c - done, B=B, seed=1 + done)
            r0 = a if r0 is None else r0
            rec.append(b)
            done = c
        nan = not bool(torch.isfinite(rr.Wq).all() and torch.isfinite(rr.Wm).all())
        print(f"| {preset} | {opt} | {lr:g} | {r0:.3f} | " + " | ".join(f"{x:.3f}" for x in rec)
              + f" | {rr.adapter_norm():.3g} | {rr.rollbacks} | {nan} |", flush=True)


def main(argv):
    if "--stability" in argv:
        i = argv.index("--stability")
        only = argv[i + 1] if len(argv) > i + 1 and argv[i + 1] in ("paper", "default") else None
        steps = int(argv[argv.index("--steps") + 1]) if "--steps" in argv else 10_000
        stability(steps=steps, only=only, checkpoints=tuple(c for c in (1000, 10_000) if c < steps) + (steps,))
        return 0
    if "--select-update" in argv:
        rounds = int(argv[argv.index("--rounds") + 1]) if "--rounds" in argv else 5
        select_update_table(rounds=rounds)
        return 0
    grid = (list(itertools.product([1, 4, 64, 256], [20, 50], [5, 10], [384, 768, 1024]))
            if "--full" in argv else GRID)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}")
    print("| B | K | M | d | memkern torch (ms) | naive eager (ms) | speedup |")
    print("|---|---|---|---|---|---|---|")
    for B, K, M, d in grid:
        check(B, K, M, d)
        tf, tn, sp = compare(B, K, M, d)
        print(f"| {B} | {K} | {M} | {d} | {tf * 1e3:.3f} | {tn * 1e3:.3f} | {sp:.1f}x |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
