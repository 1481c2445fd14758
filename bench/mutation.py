"""Mutation check: apply a fixed catalogue of deliberate bugs, one at a time, and see the tests fail.

Each mutant (``bench/mutants.py``) replaces one exact snippet of a critical module (the sign,
scale or masking of gradients and sampling, the trainer's safety mechanisms, log and snapshot
durability, namespace isolation, update semantics, reward mapping, MemReread budgets, loader field
mapping) and names the tests that should catch it. A mutant is *killed* when those tests fail,
*survives* when they pass, and is an *error* when it no longer applies (its snippet is gone or not
unique: the catalogue must be updated with the code).

Native (``csrc/``) mutants rebuild the extension incrementally (``cmake --build`` in the
scikit-build build folder, then the module is copied over the installed one); the original is
rebuilt and restored after the last native mutant, also on Ctrl-C.

Run from a clean checkout that ``scripts/setup.sh`` set up (the files it mutates must have no
uncommitted changes; every file is restored afterwards)::

    .venv/bin/python bench/mutation.py                  # all mutants, report to stdout
    .venv/bin/python bench/mutation.py --check          # only check that every mutant applies
    .venv/bin/python bench/mutation.py --only wal-no-sync,rr-clip-unused
    .venv/bin/python bench/mutation.py --write-section     # refresh bench/sections/mutation.md

Not part of CI (it takes tens of minutes on 2 cores); its score and date go in bench/RESULTS.md.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import glob
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from mutants import CATALOGUE, Mutant  # noqa: E402


@dataclass
class Outcome:
    mutant: Mutant
    status: str          # "killed" | "survived" | "error" | "equivalent"
    seconds: float
    detail: str = ""


def _apply(m: Mutant, text: str) -> str:
    """Return ``text`` with the mutant applied; raise ``ValueError`` unless the snippet occurs
    exactly ``m.count`` times (1 by default)."""
    n = text.count(m.find)
    if n != m.count:
        raise ValueError(f"snippet occurs {n} times in {m.file}, expected {m.count}: {m.find!r}")
    return text.replace(m.find, m.replace)


def _git_clean(paths: list[str]) -> list[str]:
    out = subprocess.run(["git", "status", "--porcelain", "--", *paths], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return [line[3:] for line in out.splitlines() if line.strip()]


def _installed_module() -> Path:
    out = subprocess.run([sys.executable, "-c", "import memkern._store as s; print(s.__file__)"],
                         cwd="/", capture_output=True, text=True, check=True).stdout.strip()
    return Path(out)


def _build_native(target: Path) -> None:
    """Rebuild the extension in the scikit-build build folder and copy it over ``target``."""
    # The module's build folders (build/<wheel tag>); build/cpp-tests (tests/test_cpp_unit.py)
    # configures the C++ unit tests only and has no _store target.
    dirs = [d for d in glob.glob(str(ROOT / "build" / "*"))
            if os.path.exists(os.path.join(d, "CMakeCache.txt")) and glob.glob(os.path.join(d, "_store*.so"))]
    if not dirs:
        raise RuntimeError("no configured build folder under build/: run scripts/setup.sh first")
    bdir = max(dirs, key=os.path.getmtime)
    subprocess.run(["cmake", "--build", bdir, "--target", "_store"], check=True, capture_output=True)
    built = glob.glob(os.path.join(bdir, "_store*.so"))
    if not built:
        raise RuntimeError(f"no _store*.so in {bdir} after the build")
    tmp = target.with_suffix(".tmp")
    shutil.copy2(built[0], tmp)
    os.replace(tmp, target)


def _run_tests(m: Mutant, timeout: float) -> tuple[bool, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "--no-header", *m.tests]
    try:
        p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return True, "timeout (counted as killed: the tests did not pass)"
    tail = (p.stdout.strip().splitlines() or [""])[-1]
    return p.returncode != 0, tail


def run(mutants: list[Mutant], timeout: float, check_only: bool) -> list[Outcome]:
    files = sorted({m.file for m in mutants})
    dirty = _git_clean(files)
    if dirty and not check_only:
        raise SystemExit(f"mutation: these files have uncommitted changes, commit or stash them first: {dirty}")
    originals = {f: (ROOT / f).read_text() for f in files}
    outcomes: list[Outcome] = []
    native_touched = False
    target = None if check_only else _installed_module()
    try:
        for i, m in enumerate(mutants, 1):
            t0 = time.perf_counter()
            try:
                mutated = _apply(m, originals[m.file])
            except ValueError as exc:
                outcomes.append(Outcome(m, "error", 0.0, str(exc)))
                print(f"[{i}/{len(mutants)}] {m.id}: ERROR {exc}", flush=True)
                continue
            if check_only:
                outcomes.append(Outcome(m, "applies", 0.0))
                continue
            (ROOT / m.file).write_text(mutated)
            try:
                if m.native:
                    native_touched = True
                    _build_native(target)
                killed, tail = _run_tests(m, timeout)
            finally:
                (ROOT / m.file).write_text(originals[m.file])
            status = "killed" if killed else ("equivalent" if m.equivalent else "survived")
            outcomes.append(Outcome(m, status, time.perf_counter() - t0, tail))
            print(f"[{i}/{len(mutants)}] {m.id}: {status} ({time.perf_counter() - t0:.0f} s) {tail}", flush=True)
    finally:
        for f, text in originals.items():
            (ROOT / f).write_text(text)
        if native_touched:
            print("mutation: rebuilding the original extension", flush=True)
            _build_native(target)
    return outcomes


def report(outcomes: list[Outcome]) -> str:
    killed = sum(o.status == "killed" for o in outcomes)
    equiv = sum(o.status == "equivalent" for o in outcomes)
    errors = [o for o in outcomes if o.status == "error"]
    scored = len(outcomes) - len(errors) - equiv
    score = killed / scored if scored else float("nan")
    lines = [
        f"# Mutation check ({_dt.date.today().isoformat()}, {os.cpu_count()} cores)",
        "",
        f"Mutants: {len(outcomes)}; killed {killed}; "
        f"survived {scored - killed}; equivalent (explained) {equiv}; not applicable {len(errors)}.",
        f"**Score: {killed}/{scored} = {100 * score:.1f}% killed** (equivalent mutants excluded).",
        "",
        "| mutant | area | file | outcome | what it breaks | tests |",
        "|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        m = o.mutant
        lines.append(f"| `{m.id}` | {m.area} | `{m.file}` | {o.status} | {m.what} | "
                     f"{', '.join('`' + t.split('/')[-1] + '`' for t in m.tests)} |")
    surv = [o for o in outcomes if o.status in ("survived", "equivalent")]
    if surv:
        lines += ["", "Survivors:"]
        for o in surv:
            lines.append(f"- `{o.mutant.id}`: {o.status}. {o.mutant.equivalent or 'no test catches it yet.'}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="", help="comma-separated mutant ids")
    ap.add_argument("--area", default="", help="only mutants of this area")
    ap.add_argument("--check", action="store_true", help="only check that every mutant applies")
    ap.add_argument("--list", action="store_true", help="list the catalogue")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per mutant's test run")
    ap.add_argument("--report", default="", help="write the markdown report here too")
    ap.add_argument("--write-section", action="store_true",
                    help="write the report as bench/sections/mutation.md (then: memkern bench --assemble)")
    a = ap.parse_args(argv)
    ids = [s for s in a.only.split(",") if s]
    unknown = sorted(set(ids) - {m.id for m in CATALOGUE})
    if unknown:
        ap.error(f"--only: unknown mutant ids {unknown}")
    mutants = [m for m in CATALOGUE if (not ids or m.id in ids) and (not a.area or m.area == a.area)]
    if a.list:
        for m in mutants:
            print(f"{m.id:28s} {m.area:12s} {m.file}: {m.what}")
        return 0
    outcomes = run(mutants, a.timeout, a.check)
    if a.check:
        bad = [o for o in outcomes if o.status == "error"]
        print(f"mutation --check: {len(outcomes) - len(bad)}/{len(outcomes)} mutants apply")
        return 1 if bad else 0
    text = report(outcomes)
    print(text)
    if a.write_section:
        if ids or a.area:
            ap.error("--write-section: only for a run of the whole catalogue (no --only / --area)")
        import report as _report

        body = text.split("\n", 2)[2]          # the report without its own heading
        p = _report.write_section("mutation", "Mutation check (`bench/mutation.py`, issue 17)", body,
                                  ".venv/bin/python bench/mutation.py --write-section")
        print(f"mutation: wrote {p}; reassemble with `memkern bench --assemble`")
    if a.report:
        Path(a.report).parent.mkdir(parents=True, exist_ok=True)
        Path(a.report).write_text(text)
    return 0 if all(o.status in ("killed", "equivalent") for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
