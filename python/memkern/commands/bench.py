"""``memkern bench``: run the benchmark suite and write ``bench/REPORT.md`` plus PNG charts.

The suite lives in the repository's ``bench/`` folder (``bench/report.py`` drives it), so this
command needs a source checkout (an editable install finds it; otherwise pass ``--bench-dir``).
Peers come from ``pip install memkern[bench]`` (a missing one is skipped with a message).
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

PARTS = ("peers", "embedder", "rmm", "memreread")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true",
                        help="small sizes (10,000 records, small eval data; ~3-5 min on 2 shared cores)")
    parser.add_argument("--parts", default=",".join(PARTS),
                        help=f"comma-separated parts to run (default all: {','.join(PARTS)})")
    parser.add_argument("--n", type=int, default=None, help="records for the store comparison "
                        "(default 10,000 with --quick, else 100,000)")
    parser.add_argument("--queries", type=int, default=None, help="queries for the store comparison")
    parser.add_argument("--out", default=None, help="report path (default <bench-dir>/REPORT.md)")
    parser.add_argument("--bench-dir", default=None, help="the repository's bench/ folder (found "
                        "automatically for a source checkout)")
    parser.add_argument("--threads", type=int, default=1, help="OMP/MKL/torch threads of the process (default 1)")


def find_bench_dir(explicit: str | None) -> Path | None:
    if explicit:
        p = Path(explicit).expanduser()
        return p if (p / "report.py").is_file() else None
    here = Path(__file__).resolve()
    for base in (here.parents[3], Path.cwd()):  # <repo>/python/memkern/commands/bench.py; or the cwd
        if (base / "bench" / "report.py").is_file():
            return base / "bench"
    return None


def run(args: argparse.Namespace) -> int:
    parts = [p for p in str(args.parts).split(",") if p]
    bad = [p for p in parts if p not in PARTS]
    if bad or not parts:
        print(f"memkern bench: --parts: expected names from {','.join(PARTS)}, got {args.parts!r}")
        return 2
    for name in ("n", "queries", "threads"):
        v = getattr(args, name)
        if v is not None and v < 1:
            print(f"memkern bench: --{name}: expected an int >= 1, got {v}")
            return 2
    bench = find_bench_dir(args.bench_dir)
    if bench is None:
        print("memkern bench: the benchmark suite (bench/report.py) was not found: run from a source "
              "checkout of memkern or pass --bench-dir <repo>/bench"
              + (f" (not in {args.bench_dir})" if args.bench_dir else ""))
        return 2
    for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[k] = str(args.threads)
    import torch

    torch.set_num_threads(args.threads)
    sys.path.insert(0, str(bench))
    spec = importlib.util.spec_from_file_location("memkern_bench_report", bench / "report.py")
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    out = Path(args.out) if args.out else bench / "REPORT.md"
    cmd = "memkern bench" + " ".join(
        [""] + (["--quick"] if args.quick else []) + ([f"--parts {args.parts}"] if args.parts != ",".join(PARTS) else [])
        + ([f"--n {args.n}"] if args.n else []) + ([f"--queries {args.queries}"] if args.queries else [])
        + ([f"--threads {args.threads}"] if args.threads != 1 else []))
    path, raw = report.run_suite(quick=args.quick, parts=parts, out=out, n=args.n, queries=args.queries, command=cmd)
    print(f"memkern bench: wrote {path} (charts beside it, raw numbers in {raw['json']})")
    if raw["failures"]:
        print(f"memkern bench: parts not measured: {', '.join(raw['failures'])} (see the report)")
        return 1
    return 0
