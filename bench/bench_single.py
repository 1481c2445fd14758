"""Single-query latency of ``MemoryStore.search`` against raw hnswlib, and reopen + first query.

Both sides hold the same records (clustered 384-d unit vectors, inner product) built with the same
M, ef_construction, seed and ef, so they build the same graph: every query's ids and scores are
asserted equal (memkern's score is ``1 -`` hnswlib's ip distance), to float32 rounding: the two
SIMD kernels sum in different orders, so near-tied ids may swap.

* Single query: rounds of ``--queries`` queries; each query runs on both sides back to back, the
  side that goes first alternating query by query (each side's graph is as cold as the other's).
  Only the search call is timed: ``store.search(ns, q, k=10)`` against
  ``index.knn_query(q, k=10, num_threads=1)``. p50 / p99 per side and their ratios.
* Reopen: a fresh process per side and round opens the saved store / index and runs one query;
  the in-process open + first query time is compared (median over rounds).

Run pinned to one core: ``OMP_NUM_THREADS=1 taskset -c 1 python bench/bench_single.py [--n 10000]
[--queries 500] [--rounds 5] [--json out.json]``. The output states the CPU.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

from bench_peers import D, EF, EFC, K, M_, REOPEN_HEAD, REOPEN_TAIL, SEED, Hnswlib, Memkern, make_data  # noqa: E402
from harness import fmt_machine, machine_info  # noqa: E402


def build(n: int, tmp: Path):
    x, q = make_data(n, 4000)
    s_path = tmp / "mk"
    from memkern.store import MemoryStore
    import hnswlib

    s = MemoryStore(s_path, dim=D, metric="ip", fsync="never", M=M_, ef_construction=EFC, ef_search=EF, num_threads=1)
    ids = s.add_batch("bench", [f"record {i}" for i in range(n)], x)
    ix = hnswlib.Index(space="ip", dim=D)
    ix.init_index(max_elements=n, M=M_, ef_construction=EFC, random_seed=SEED)
    ix.set_ef(EF)
    ix.set_num_threads(1)
    ix.add_items(x, np.arange(n), num_threads=1)
    return s, ix, np.asarray(ids), q


TIE = 1e-5  # the two SIMD kernels sum in different orders: scores agree to float32 rounding


def _same(ia, sa, ib, sb) -> None:
    """One query's results are the same: scores equal to ``TIE`` rank by rank, and the same ids,
    up to the order of ids whose scores tie (within ``TIE``) and to ties at the last rank."""
    assert np.abs(sa - sb).max() <= TIE, (sa, sb)
    for i in np.flatnonzero(ia != ib):
        j = np.flatnonzero(ib == ia[i])
        tied = abs(sa[i] - sa[-1]) <= TIE if not len(j) else abs(sa[i] - sb[j[0]]) <= TIE
        assert tied, (ia, ib, sa, sb)


def single(s, ix, ids, q, n_queries: int, rounds: int, warmup: int = 50) -> dict:
    pos = np.full(int(ids.max()) + 1, -1, np.int64)
    pos[ids] = np.arange(len(ids))
    mk_t, hn_t = [], []
    rng = np.random.default_rng(7)
    order = rng.permutation(len(q))
    j = 0
    pc = time.perf_counter_ns
    for r in range(rounds + 1):
        for i in range(n_queries if r else warmup):
            v = q[order[j % len(q)]:order[j % len(q)] + 1]
            j += 1
            if i % 2:
                t0 = pc(); a = s.search("bench", v, k=K); t1 = pc()
                b = ix.knn_query(v, k=K, num_threads=1); t2 = pc()
                tm, th = t1 - t0, t2 - t1
            else:
                t0 = pc(); b = ix.knn_query(v, k=K, num_threads=1); t1 = pc()
                a = s.search("bench", v, k=K); t2 = pc()
                th, tm = t1 - t0, t2 - t1
            _same(pos[a[0][0]], a[1][0], b[0][0].astype(np.int64), np.float32(1) - b[1][0])
            if r:
                mk_t.append(tm)
                hn_t.append(th)
    mk, hn = np.array(mk_t) / 1e9, np.array(hn_t) / 1e9
    out = {}
    for name, xs in (("memkern", mk), ("hnswlib", hn)):
        out[name] = {"p50_s": float(np.percentile(xs, 50)), "p99_s": float(np.percentile(xs, 99)),
                     "mean_s": float(xs.mean())}
    # per-round p50 ratios: their spread shows the noise
    per = [float(np.median(mk[i:i + n_queries]) / np.median(hn[i:i + n_queries])) for i in range(0, len(mk), n_queries)]
    out["ratio_p50"] = out["memkern"]["p50_s"] / out["hnswlib"]["p50_s"]
    out["ratio_p99"] = out["memkern"]["p99_s"] / out["hnswlib"]["p99_s"]
    out["ratio_p50_per_round"] = per
    out["calls"] = len(mk)
    return out


def reopen(s, ix, q, tmp: Path, rounds: int) -> dict:
    import subprocess

    s.close()
    ix.save_index(str(tmp / "ix.hnsw"))
    qf = tmp / "q1.npy"
    np.save(qf, q[:1])
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    sides = {"memkern": (Memkern.REOPEN, tmp / "mk"), "hnswlib": (Hnswlib.REOPEN, tmp / "ix.hnsw")}
    rows: dict = {k: [] for k in sides}
    for r in range(rounds + 1):
        for name in (sides if r % 2 else reversed(list(sides))):
            code, path = sides[name]
            out = subprocess.run([sys.executable, "-c", REOPEN_HEAD + code + REOPEN_TAIL, str(path), str(qf)],
                                 capture_output=True, text=True, env=env)
            if out.returncode != 0:
                raise RuntimeError(f"reopen of {name} failed: {out.stderr[-2000:]}")
            if r:
                rows[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
    med = {k: {f: float(np.median([x[f] for x in v])) for f in v[0]} for k, v in rows.items()}
    med["ratio_open_first_query"] = med["memkern"]["open_first_query_s"] / med["hnswlib"]["open_first_query_s"]
    return med


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--queries", type=int, default=500, help="queries per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reopen-rounds", type=int, default=7)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--write-section", action="store_true",
                    help="write bench/sections/single-query.md (then `memkern bench --assemble`)")
    a = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="memkern-single-"))
    try:
        m = machine_info()
        print(f"machine: {fmt_machine(m)}; affinity {sorted(os.sched_getaffinity(0))}, "
              f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}")
        s, ix, ids, q = build(a.n, tmp)
        res = {"machine": m, "n": a.n, "dim": D, "M": M_, "ef_construction": EFC, "ef": EF, "k": K}
        res["single"] = sq = single(s, ix, ids, q, a.queries, a.rounds)
        print(f"single query, N={a.n} x {D}, ip, M={M_}, ef_construction={EFC}, ef={EF}, k={K}, "
              f"{sq['calls']} calls per side, ids and scores asserted equal")
        for name in ("memkern", "hnswlib"):
            print(f"  {name:8s} p50 {1e6 * sq[name]['p50_s']:7.1f} us   p99 {1e6 * sq[name]['p99_s']:7.1f} us")
        print(f"  memkern / hnswlib: p50 {sq['ratio_p50']:.3f}x  p99 {sq['ratio_p99']:.3f}x  "
              f"(per-round p50: {', '.join(f'{r:.3f}' for r in sq['ratio_p50_per_round'])})")
        res["reopen"] = ro = reopen(s, ix, q, tmp, a.reopen_rounds)
        print(f"reopen + first query (fresh process, median of {a.reopen_rounds}):")
        for name in ("memkern", "hnswlib"):
            print(f"  {name:8s} open {1e3 * ro[name]['open_s']:7.2f} ms   open + first query "
                  f"{1e3 * ro[name]['open_first_query_s']:7.2f} ms")
        print(f"  memkern / hnswlib: open + first query {ro['ratio_open_first_query']:.3f}x")
        if a.json:
            a.json.write_text(json.dumps(res, indent=1))
        if a.write_section:
            write_section(res, a, m)
        return res
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_section(res: dict, a, m: dict) -> None:
    """``bench/sections/single-query.md``: the single-query and reopen tables of this run."""
    import report

    sq, ro = res["single"], res["reopen"]
    us = lambda x: f"{1e6 * x:.1f}"  # noqa: E731
    ms = lambda x: f"{1e3 * x:.2f}"  # noqa: E731
    body = "\n".join([
        f"N = {res['n']:,} x {res['dim']}, inner product, M = {res['M']}, ef_construction = {res['ef_construction']}, "
        f"ef = {res['ef']}, k = {res['k']}; both sides build the same graph and every query's ids and scores are "
        f"asserted equal. Each query runs on both sides back to back, the first side alternating; "
        f"{sq['calls']:,} calls per side; one thread, pinned to one core.", "",
        "| measure | memkern | hnswlib | memkern / hnswlib |", "|---|---|---|---|",
        f"| single query p50 (us) | {us(sq['memkern']['p50_s'])} | {us(sq['hnswlib']['p50_s'])} | {sq['ratio_p50']:.3f} |",
        f"| single query p99 (us) | {us(sq['memkern']['p99_s'])} | {us(sq['hnswlib']['p99_s'])} | {sq['ratio_p99']:.3f} |",
        f"| open (ms, fresh process) | {ms(ro['memkern']['open_s'])} | {ms(ro['hnswlib']['open_s'])} | "
        f"{ro['memkern']['open_s'] / ro['hnswlib']['open_s']:.3f} |",
        f"| open + first query (ms, fresh process) | {ms(ro['memkern']['open_first_query_s'])} | "
        f"{ms(ro['hnswlib']['open_first_query_s'])} | {ro['ratio_open_first_query']:.3f} |", "",
        "Per-round p50 ratios: " + ", ".join(f"{r:.3f}" for r in sq["ratio_p50_per_round"]) + f"; reopen: median of "
        f"{a.reopen_rounds} fresh processes per side. memkern's open reads and checks the snapshot (CRC-32 of every "
        "file, the graph's links) and its records; hnswlib's loads the index file alone."])
    headline = [["single query p50", f"{us(sq['memkern']['p50_s'])} us", f"hnswlib {us(sq['hnswlib']['p50_s'])} us",
                 f"{sq['ratio_p50']:.3f}"],
                ["open + first query", f"{ms(ro['memkern']['open_first_query_s'])} ms",
                 f"hnswlib {ms(ro['hnswlib']['open_first_query_s'])} ms", f"{ro['ratio_open_first_query']:.2f}"]]
    cmd = (f"OMP_NUM_THREADS=1 taskset -c 1 python bench/bench_single.py --n {a.n} --queries {a.queries} "
           f"--rounds {a.rounds} --reopen-rounds {a.reopen_rounds} --write-section")
    p = report.write_section("single-query", "Single-query latency and reopen vs raw hnswlib", body, cmd, m,
                             headline=headline, area="Store: single query and reopen vs hnswlib")
    print(f"wrote {p}")


if __name__ == "__main__":
    main()
