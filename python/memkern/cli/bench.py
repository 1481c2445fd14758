"""``memkern bench``: run the benchmark suite, write ``bench/REPORT.md`` plus PNG charts, and
regenerate ``bench/RESULTS.md`` (fragments in ``bench/sections/`` + the report).

``memkern bench --assemble`` runs nothing: it only regenerates RESULTS.md (``--check``: exit 1 if
the file on disk differs, i.e. it was edited by hand or a fragment changed without reassembling).

The suite is the repository's ``bench/`` folder (``bench/report.py`` drives it). A source checkout
(or an editable install) runs it in place and writes ``bench/REPORT.md`` and ``bench/RESULTS.md``. An
installed wheel carries the suite's scripts as ``memkern/bench/`` and writes the report and charts to
``./memkern-bench/`` (``--out`` to change); ``--assemble`` needs the checkout's ``bench/sections/``.
Peers come from ``pip install memkern[bench]`` (a missing one is skipped with a message).
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

PARTS = ("peers", "namespaces", "embedder", "rmm", "memreread")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true",
                        help="small sizes (10,000 records, small eval data; ~3-5 min on 2 shared cores)")
    parser.add_argument("--parts", default=",".join(PARTS),
                        help=f"comma-separated parts to run (default all: {','.join(PARTS)})")
    parser.add_argument("--n", type=int, default=None, help="records for the store comparison "
                        "(default 10,000 with --quick, else 100,000)")
    parser.add_argument("--queries", type=int, default=None, help="queries for the store comparison")
    parser.add_argument("--namespaces", type=int, default=None, help="namespaces of 20 records for the many-small-"
                        "namespaces comparison (default 300 with --quick, else 2,000)")
    parser.add_argument("--out", default=None, help="report path (default <bench-dir>/REPORT.md "
                        "in a checkout, ./memkern-bench/REPORT.md from an installed package)")
    parser.add_argument("--bench-dir", default=None, help="the repository's bench/ folder (found "
                        "automatically for a source checkout)")
    parser.add_argument("--threads", type=int, default=1, help="OMP/MKL/torch threads of the process (default 1)")
    parser.add_argument("--assemble", action="store_true", help="run nothing: regenerate RESULTS.md from "
                        "bench/sections/*.md and the report (--out, default bench/REPORT.md)")
    parser.add_argument("--results", default=None, help="RESULTS.md path to write (default beside the report)")
    parser.add_argument("--check", action="store_true", help="with --assemble: write nothing, exit 1 when the "
                        "RESULTS.md on disk differs from the assembled one")


def find_bench_dir(explicit: str | None) -> Path | None:
    """The suite's folder: ``explicit``; else a source checkout's ``bench/`` (this file's or the cwd's);
    else the copy an installed wheel carries (``memkern/bench/``, see :func:`is_installed_suite`)."""
    if explicit:
        p = Path(explicit).expanduser()
        return p if (p / "report.py").is_file() else None
    here = Path(__file__).resolve()
    for base in (here.parents[3], Path.cwd()):  # <repo>/python/memkern/cli/bench.py; or the cwd
        if (base / "bench" / "report.py").is_file():
            return base / "bench"
    installed = here.parents[1] / "bench"  # <site-packages>/memkern/bench
    return installed if (installed / "report.py").is_file() else None


def is_installed_suite(bench: Path) -> bool:
    """True for the wheel's copy of the suite: scripts only, no ``sections/`` to assemble RESULTS.md
    from, inside the installed package (not a place to write reports)."""
    return not any((bench / "sections").glob("*.md"))


def run(args: argparse.Namespace) -> int:
    parts = [p for p in str(args.parts).split(",") if p]
    bad = [p for p in parts if p not in PARTS]
    if bad or not parts:
        print(f"memkern bench: --parts: expected names from {','.join(PARTS)}, got {args.parts!r}")
        return 2
    for name in ("n", "queries", "namespaces", "threads"):
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
    if args.check and not args.assemble:
        print("memkern bench: --check: expected together with --assemble")
        return 2
    installed = is_installed_suite(bench)
    if args.assemble:
        if installed:
            print(f"memkern bench: --assemble: expected a source checkout's bench/ with sections/, got the "
                  f"installed suite {bench} (pass --bench-dir <repo>/bench)")
            return 2
        return _assemble(args, bench)
    from ..errors import require

    # the suite is a pytest-benchmark suite that pins torch's threads and times torch paths
    require("bench", "torch", "pytest", "pytest_benchmark", feature="memkern bench")
    for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[k] = str(args.threads)
    import torch

    torch.set_num_threads(args.threads)
    sys.path.insert(0, str(bench))
    report = _load_report(bench)
    out = Path(args.out) if args.out else (Path.cwd() / "memkern-bench" if installed else bench) / "REPORT.md"
    cmd = "memkern bench" + " ".join(
        [""] + (["--quick"] if args.quick else []) + ([f"--parts {args.parts}"] if args.parts != ",".join(PARTS) else [])
        + ([f"--n {args.n}"] if args.n else []) + ([f"--queries {args.queries}"] if args.queries else [])
        + ([f"--namespaces {args.namespaces}"] if args.namespaces else [])
        + ([f"--threads {args.threads}"] if args.threads != 1 else []))
    path, raw = report.run_suite(quick=args.quick, parts=parts, out=out, n=args.n, queries=args.queries, command=cmd,
                                 namespaces=args.namespaces,
                                 results=False if installed else Path(args.results) if args.results else None)
    also = "" if installed else f" and {raw['results']}"
    print(f"memkern bench: wrote {path} (charts beside it, raw numbers in {raw['json']}){also}")
    if raw["failures"]:
        print(f"memkern bench: parts not measured: {', '.join(raw['failures'])} (see the report)")
        return 1
    return 0


def _load_report(bench: Path):
    if str(bench) not in sys.path:
        sys.path.insert(0, str(bench))
    spec = importlib.util.spec_from_file_location("memkern_bench_report", bench / "report.py")
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    return report


def _assemble(args: argparse.Namespace, bench: Path) -> int:
    report = _load_report(bench)
    rep = Path(args.out) if args.out else bench / "REPORT.md"
    target = Path(args.results) if args.results else rep.parent / "RESULTS.md"
    try:
        text = report.assemble_results(bench, rep)
    except report.SectionError as e:
        print(f"memkern bench: {e}")
        return 2
    if args.check:
        if not target.is_file() or target.read_text(encoding="utf-8") != text:
            print(f"memkern bench: {target} differs from what --assemble generates (edited by hand, or a fragment "
                  f"changed without reassembling): run `memkern bench --assemble`")
            return 1
        print(f"memkern bench: {target} is up to date")
        return 0
    from ..base.atomic import atomic_write

    atomic_write(target, text, mode=0o644)  # a file of the repository, readable as such
    print(f"memkern bench: wrote {target} from {bench / 'sections'} and {rep}")
    return 0
