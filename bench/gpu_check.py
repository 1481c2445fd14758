"""On a CUDA machine: check the Triton reranker kernels against the float64 reference and time them.

For each case the script

1. runs the fused Triton step (``memkern.ops.rerank_step(..., backend="triton")``: scores +
   Gumbel-top-M + log-probs + closed-form REINFORCE gradients) and checks scores, log-probs and
   gradients against the naive float64 autograd reference (``memkern.score.reference``) on the same
   selection, and that the selection equals the torch backend's (same Philox uniforms);
2. times with ``triton.testing.do_bench``: the Triton step, the torch backend on the GPU (eager,
   same algebra), the naive eager step (explicit ``m'``, autograd), and the memory-bandwidth floor
   = bytes that must be read/written once (q, Wq, Wm, candidates or the gathered table rows, the two
   ``d x d`` gradients) / measured device copy bandwidth;
3. prints one markdown table;
4. then, at B=64, K=20, M=5, d=768 (tiny in ``--dry-run``): checks ``memkern.rerank_scores``'s
   Triton backward (the autograd op) against the float64 reference and times one online step as
   users run it, ``Reranker.select`` + ``Reranker.update``, for the paper preset and the stable
   default (both backends), against the naive eager select+update and ``torch.compile`` of it
   (CUDA only), and prints a second table.

Usage::

    python bench/gpu_check.py            # needs CUDA; exits 0 with a message otherwise
    python bench/gpu_check.py --quick    # fewer cases
    TRITON_INTERPRET=1 python bench/gpu_check.py --dry-run   # tiny CPU run of the script's code paths
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch


def _bench(fn, cuda: bool) -> float:
    """Median milliseconds of ``fn``."""
    if cuda:
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=25, rep=100))
    fn()
    ts = []
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return sorted(ts)[1] * 1e3


def copy_bandwidth(dev, cuda: bool) -> float:
    """Bytes/s of a large device-to-device copy (read + write counted)."""
    n = (256 << 20) // 4 if cuda else (4 << 20) // 4
    a = torch.empty(n, dtype=torch.float32, device=dev)
    b = torch.empty_like(a)
    ms = _bench(lambda: b.copy_(a), cuda)
    return 2 * a.numel() * 4 / (ms * 1e-3)


def make(B, K, d, N, dtype, dev, gather, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.nn.functional.normalize(torch.randn(B, d, generator=g), dim=-1)
    Wq = torch.randn(d, d, generator=g) * 0.02
    Wm = torch.randn(d, d, generator=g) * 0.02
    if gather:
        table = torch.nn.functional.normalize(torch.randn(N, d, generator=g), dim=-1)
        ids = torch.randint(0, N, (B, K), generator=g)
        ids[:, -1] = -1  # one padding slot per row
        cands = table
    else:
        cands = torch.nn.functional.normalize(torch.randn(B, K, d, generator=g), dim=-1)
        ids = None
    cv = lambda t: t.to(dev, dtype)  # noqa: E731
    return cv(q), cv(Wq), cv(Wm), cv(cands), (ids.to(dev) if ids is not None else None)


def check_case(B, K, M, d, dtype, gather, dev, cuda, bw, logp="plackett_luce"):
    from memkern.score import reference as ref
    from memkern.score import ops

    N = 4 * B * K
    q, Wq, Wm, cands, ids = make(B, K, d, N, dtype, dev, gather)
    R = torch.where(torch.rand(B, M, generator=torch.Generator().manual_seed(1)) > 0.5, 1.0, -1.0).to(dev)
    kw = dict(tau=0.5, seed=7, ids=ids, baseline=0.5, logp=logp)
    st = ops.rerank_step(q, Wq, Wm, cands, R, M, backend="triton", **kw)
    st_t = ops.rerank_step(q, Wq, Wm, cands, R, M, backend="torch", **kw)
    same_draw = bool(torch.equal(st.indices, st_t.indices))
    # float64 reference on (at most) 64 rows, on the CPU
    nb = min(B, 64)
    if gather:
        Cd = cands[ids[:nb].clamp_min(0)].cpu()
        valid = (ids[:nb] >= 0).cpu()
    else:
        Cd, valid = cands[:nb].cpu(), None
    # the first nb rows draw the same uniforms as in the full batch (counter = b*K + i)
    sub = ops.rerank_step(q[:nb], Wq, Wm, cands if gather else cands[:nb], R[:nb], M, backend="triton",
                          **{**kw, "ids": ids[:nb] if gather else None})
    loss, dWq, dWm, s64, lp64 = ref.reference_loss_and_grads(q[:nb].cpu(), Wq.cpu(), Wm.cpu(), Cd,
                                                             sub.indices.cpu(), R[:nb].cpu(), logp=logp, valid=valid)

    def rel(a, b):
        a, b = a.double().cpu(), b.double()
        fin = torch.isfinite(b)
        return float((a[fin] - b[fin]).abs().max() / max(1.0, float(b[fin].abs().max())))

    err = max(rel(sub.scores, s64), rel(sub.logp, lp64), rel(sub.dWq, dWq), rel(sub.dWm, dWm))
    t_tri = _bench(lambda: ops.rerank_step(q, Wq, Wm, cands, R, M, backend="triton", **kw), cuda)
    t_tor = _bench(lambda: ops.rerank_step(q, Wq, Wm, cands, R, M, backend="torch", **kw), cuda)
    Cn = cands[ids.clamp_min(0)] if gather else cands
    valid_n = (ids >= 0) if gather else None
    u = ops.philox_uniform(7, torch.arange(B * K, device=dev)).view(B, K)
    t_nai = _bench(lambda: ref.naive_step(q, Wq, Wm, Cn, R, m=M, uniforms=u, valid=valid_n), cuda)
    es = q.element_size()
    nbytes = (B * d + 2 * d * d + B * K * d) * es + (B * K * 8 if gather else 0) + 2 * d * d * 4 + B * M * 12
    floor_ms = nbytes / bw * 1e3
    return dict(B=B, K=K, M=M, d=d, dtype=str(dtype).replace("torch.", ""), cand="ids" if gather else "dense",
                err=err, same=same_draw, tri=t_tri, tor=t_tor, nai=t_nai, floor=floor_ms)


def check_select_update(B, K, M, d, dev, cuda):
    """Second table: the autograd op's Triton backward vs the float64 reference, and select+update timings."""
    from memkern.score import reference as ref
    from memkern.score import ops
    from memkern.score.reranker import Reranker

    g = torch.Generator().manual_seed(3)
    q = torch.nn.functional.normalize(torch.randn(B, d, generator=g), dim=-1)
    C = torch.nn.functional.normalize(torch.randn(B, K, d, generator=g), dim=-1)
    Wq, Wm = torch.randn(d, d, generator=g) * 0.02, torch.randn(d, d, generator=g) * 0.02
    w = torch.randn(B, K, generator=g)
    leaves = [t.to(dev).clone().requires_grad_(True) for t in (q, Wq, Wm, C)]
    s = ops.rerank_scores(*leaves, backend="triton")
    (w.to(dev) * s).sum().backward()
    ref_leaves = [t.double().clone().requires_grad_(True) for t in (q, Wq, Wm, C)]
    s64 = ref.reference_scores(*ref_leaves)
    (w.double() * s64).sum().backward()
    err = max(float((a.grad.double().cpu() - b.grad).abs().max() / max(1.0, float(b.grad.abs().max())))
              for a, b in zip(leaves, ref_leaves))
    qd, Cd = q.to(dev), C.to(dev)

    def rew(idx):
        return torch.where(idx % 2 == 0, 1.0, -1.0)

    u = ops.philox_uniform(0, torch.arange(B * K, device=dev)).view(B, K)
    W = [torch.zeros(d, d, device=dev), torch.zeros(d, d, device=dev)]

    def naive():
        idx, _, _, _, dWq, dWm = ref.naive_step(qd, W[0], W[1], Cd, rew, m=M, uniforms=u)
        W[0].sub_(1e-3 * dWq)
        W[1].sub_(1e-3 * dWm)

    rows = [("naive eager select+update", _bench(naive, cuda))]
    if cuda:
        comp = torch.compile(naive)
        comp()
        rows.append(("torch.compile(naive)", _bench(comp, cuda)))
    for preset in ("paper", "stable"):
        for backend in ("triton", "torch"):
            rr = Reranker.from_preset(preset, d, backend=backend, device=dev)

            def step(rr=rr):
                sel = rr.select(qd, Cd)
                rr.update(sel, rew(sel.indices))

            for _ in range(256 // B + 2 if cuda else 1):      # fill the replay ring (dry run: just start)
                step()
            rows.append((f"Reranker {preset} ({backend}) select+update", _bench(step, cuda)))
    # capture mode (CUDA-graph replays on CUDA; the capturable path run eagerly in the dry run),
    # checked against the eager reranker over the same steps
    same = True
    for preset in ("paper", "stable"):
        pair = [Reranker.from_preset(preset, d, backend="triton", device=dev, capture=c) for c in (False, True)]

        def step(rr):
            sel = rr.select(qd, Cd)
            rr.update(sel, rew(sel.indices))
            return sel.indices

        for _ in range(256 // B + 6 if cuda else 2):          # fill the ring, warm up, capture, replay
            ia, ib = step(pair[0]), step(pair[1])
            same = same and bool(torch.equal(ia, ib))
        same = same and all(torch.allclose(a, b, rtol=1e-4, atol=1e-6)
                            for a, b in ((pair[0].Wq, pair[1].Wq), (pair[0].Wm, pair[1].Wm)))
        rows.append((f"Reranker {preset} (triton, capture=True) select+update", _bench(lambda: step(pair[1]), cuda)))
    print(f"\nselect+update, B={B} K={K} M={M} d={d}; rerank_scores Triton backward max rel err {err:.1e}; "
          f"capture mode equals eager: {same}")
    print("| step | ms | naive / this |")
    print("|---|---|---|")
    for name, ms in rows:
        print(f"| {name} | {ms:.4f} | {rows[0][1] / ms:.2f}x |")
    return err < 1e-3 and same


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer cases")
    ap.add_argument("--dry-run", action="store_true", help="tiny CPU run under TRITON_INTERPRET=1 (tests the script)")
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    if not cuda and not args.dry_run:
        print("gpu_check: no CUDA device here; nothing to check (use --dry-run with TRITON_INTERPRET=1 to "
              "exercise the script on CPU)")
        return 0
    if args.dry_run and not cuda and os.environ.get("TRITON_INTERPRET") != "1":
        print("gpu_check --dry-run on CPU needs TRITON_INTERPRET=1 set before start", file=sys.stderr)
        return 2
    dev = torch.device("cuda" if cuda else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = False
    bw = copy_bandwidth(dev, cuda)
    if args.dry_run:
        cases = [(4, 6, 2, 16, torch.float32, False), (4, 6, 2, 16, torch.bfloat16, True)]
    elif args.quick:
        cases = [(64, 20, 5, 768, torch.float32, False), (64, 20, 5, 768, torch.bfloat16, True)]
    else:
        cases = [(B, K, M, d, dt, gather)
                 for (B, K, M) in [(1, 20, 5), (64, 20, 5), (256, 50, 10)]
                 for d in (384, 768, 1024)
                 for dt in (torch.float32, torch.bfloat16)
                 for gather in (False, True)]
    name = torch.cuda.get_device_name(dev) if cuda else "CPU (TRITON_INTERPRET=1, dry run)"
    print(f"device: {name}; copy bandwidth {bw / 1e9:.1f} GB/s; torch {torch.__version__}")
    print("| B | K | M | d | dtype | cand | max rel err | same draw | triton ms | torch ms | naive ms | "
          "floor ms | triton/floor |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    ok = True
    for B, K, M, d, dt, gather in cases:
        r = check_case(B, K, M, d, dt, gather, dev, cuda, bw)
        good = r["err"] < 1e-3 and r["same"]
        ok &= good
        print(f"| {r['B']} | {r['K']} | {r['M']} | {r['d']} | {r['dtype']} | {r['cand']} | {r['err']:.1e}"
              f"{'' if good else ' FAIL'} | {r['same']} | {r['tri']:.4f} | {r['tor']:.4f} | {r['nai']:.4f} | "
              f"{r['floor']:.4f} | {r['tri'] / r['floor']:.1f}x |", flush=True)
    B, K, M, d = (4, 6, 2, 16) if args.dry_run else (64, 20, 5, 768)
    good = check_select_update(B, K, M, d, dev, cuda)
    ok &= good
    print("all checks passed" if ok else "SOME CHECKS FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
