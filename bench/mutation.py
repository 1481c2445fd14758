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

A campaign can be run in pieces: every outcome is cached in ``bench/results/mutation-cache.json``
(not kept in git) under a key made of the mutant's definition, the committed source tree
(``python/``, ``csrc/``, ``kernels/``, the build files) and the contents of the mutant's test files
plus the shared test helpers (``tests/`` files not named ``test_*``). ``--budget SECONDS`` stops
starting new mutants after that long (exit status 3, "incomplete"); rerunning the same command
skips every mutant whose key is cached and runs the rest, so ``--write-section`` can be repeated
until the whole catalogue is covered. A changed source file invalidates every mutant, a changed test
file only the mutants that run it. ``--no-cache`` reruns everything.

A test run that exceeds ``--timeout`` is its own outcome, *timeout*: it is neither killed nor
survived, it counts against the score and the report lists it.

Not part of CI (it takes tens of minutes on 2 cores); its score and date go in bench/RESULTS.md.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import glob
import hashlib
import json
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
    status: str          # "killed" | "survived" | "timeout" | "error" | "equivalent"
    seconds: float
    detail: str = ""
    cached: bool = False


CACHE = ROOT / "bench" / "results" / "mutation-cache.json"
# what the mutants and the tests are built from: a change here invalidates every cached outcome
SOURCE_PATHS = ("python", "csrc", "kernels", "CMakeLists.txt", "pyproject.toml")


def _source_key(require_clean: bool = True) -> str:
    """Git hash of the committed source tree (``SOURCE_PATHS`` at HEAD). Raise ``SystemExit``
    if any of those paths has uncommitted changes (unless ``require_clean`` is false: a run that
    only reads the cache): the cache would then mislabel its outcomes."""
    dirty = _git_clean(list(SOURCE_PATHS)) if require_clean else []
    if dirty:
        raise SystemExit(f"mutation: cache: these source files have uncommitted changes, commit them "
                         f"or run with --no-cache: {dirty}")
    out = subprocess.run(["git", "ls-tree", "HEAD", "--", *SOURCE_PATHS], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return hashlib.sha256(out.encode()).hexdigest()


def _tests_key(m: Mutant) -> str:
    """Hash of the files the mutant's tests run: its test files (``path::node`` ids count by their
    file) and everything else under ``tests/`` that is not a Python test file (the helpers,
    ``conftest.py``, the fixtures and the C++ tests)."""
    own = {t.split("::")[0] for t in m.tests}
    files = sorted(p for p in (ROOT / "tests").rglob("*")
                   if p.is_file() and "__pycache__" not in p.parts
                   and (not (p.name.startswith("test_") and p.suffix == ".py")
                        or p.relative_to(ROOT).as_posix() in own))
    missing = sorted(own - {p.relative_to(ROOT).as_posix() for p in files})
    h = hashlib.sha256()
    for p in files:
        h.update(p.relative_to(ROOT).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    for f in missing:
        h.update(b"missing:" + f.encode())
    return h.hexdigest()


def _mutant_key(m: Mutant, source_key: str) -> str:
    h = hashlib.sha256(repr(m).encode())
    h.update(source_key.encode())
    h.update(_tests_key(m).encode())
    return h.hexdigest()


def _load_cache() -> dict:
    try:
        data = json.loads(CACHE.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _save_cache(cache: dict) -> None:
    CACHE.parent.mkdir(parents=True, exist_ok=True)
    tmp = CACHE.with_suffix(".tmp")
    tmp.write_text(json.dumps(cache, indent=1, sort_keys=True))
    os.replace(tmp, CACHE)


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
    # The module's build folders (build/<wheel tag>); build/cpp-tests (tests/store/test_cpp_unit.py)
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


def _run_tests(m: Mutant, timeout: float, fork: bool = False) -> tuple[str, str]:
    """Run the mutant's tests; return ``(status, last line of pytest's output)`` with status
    "killed" (the tests failed), "survived" or "timeout". ``fork``: run pytest in a forked child
    of this process (see :func:`_preload`) instead of a new interpreter."""
    args = ["-x", "-q", "-p", "no:cacheprovider", "--no-header", *m.tests]
    if fork:
        return _run_tests_forked(args, timeout)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    cmd = [sys.executable, "-m", "pytest", *args]
    try:
        p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout", f"timeout: the tests ran past {timeout:.0f} s (neither killed nor survived)"
    tail = (p.stdout.strip().splitlines() or [""])[-1]
    return ("killed" if p.returncode != 0 else "survived"), tail


# Third-party modules the tests import, loaded once by --fork (never memkern, tests or bench: the
# mutated code must be imported fresh by every child). About 20 of a test run's 25-40 s on 2 shared
# cores go to importing these in a new interpreter.
_PRELOAD = ("numpy", "torch", "pytest", "pytest_benchmark.plugin", "anyio.pytest_plugin",
            "langsmith.pytest_plugin", "triton", "hnswlib")


def _preload() -> None:
    """Prepare this process to fork test runs: the environment of a plain run (the root
    ``conftest.py``'s settings, which it sets with ``setdefault`` too), then ``_PRELOAD``."""
    import importlib

    os.environ.update(OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    sys.dont_write_bytecode = True
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")   # before triton, as the root conftest does
    for name in _PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    assert not any(k == "memkern" or k.startswith("memkern.") for k in sys.modules), "memkern preloaded"


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, 9)
    except ProcessLookupError:
        pass
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def _run_tests_forked(args: list[str], timeout: float) -> tuple[str, str]:
    log = ROOT / "bench" / "results" / f"mutation-fork-{os.getpid()}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    pid = os.fork()
    if pid == 0:  # the child: a fresh process group (a timeout kills it whole), pytest as `python -m pytest`
        rc = 3
        try:
            os.setpgrp()
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            sys.stdout = open(1, "w", closefd=False)
            sys.stderr = open(2, "w", closefd=False)
            os.chdir(ROOT)
            bench = {str(ROOT / "bench"), str(Path(__file__).resolve().parent)}
            sys.path[:] = [str(ROOT)] + [p for p in sys.path if p not in bench]
            for k in [k for k in sys.modules if k in ("mutants", "report", "harness")]:
                del sys.modules[k]
            import pytest

            rc = int(pytest.main(args))
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(rc)
    deadline = time.monotonic() + timeout
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                _kill_group(pid)
                return "timeout", f"timeout: the tests ran past {timeout:.0f} s (neither killed nor survived)"
            time.sleep(0.2)
    except BaseException:
        _kill_group(pid)
        raise
    rc = os.waitstatus_to_exitcode(status)
    tail = (log.read_text(errors="replace").strip().splitlines() or [""])[-1]
    log.unlink()
    return ("killed" if rc != 0 else "survived"), tail


def run(mutants: list[Mutant], timeout: float, check_only: bool, use_cache: bool = False,
        budget: float = 0.0, cached_only: bool = False, fork: bool = False) -> list[Outcome]:
    """Apply and test each mutant; return one outcome per mutant that was run or found in the
    cache (with ``budget`` > 0, no mutant is started after ``budget`` seconds, once one has run:
    those are left out)."""
    files = sorted({m.file for m in mutants})
    dirty = _git_clean(files)
    if dirty and not check_only and not cached_only:
        raise SystemExit(f"mutation: these files have uncommitted changes, commit or stash them first: {dirty}")
    originals = {f: (ROOT / f).read_text() for f in files}
    outcomes: list[Outcome] = []
    native_touched = False
    target = None if check_only else _installed_module()
    source_key = _source_key(require_clean=not cached_only) if use_cache and not check_only else ""
    cache = _load_cache() if source_key else {}
    start = time.perf_counter()
    ran = 0
    so_mutated = False                    # the installed extension is a native mutant's build
    baselines: dict[tuple[str, ...], tuple[str, str]] = {}   # test list -> unmutated outcome
    try:
        for i, m in enumerate(mutants, 1):
            key = _mutant_key(m, source_key) if source_key else ""
            hit = cache.get(m.id)
            if key and hit and hit.get("key") == key:
                outcomes.append(Outcome(m, hit["status"], hit["seconds"], hit["detail"], cached=True))
                print(f"[{i}/{len(mutants)}] {m.id}: {hit['status']} (cached, {hit['commit']})", flush=True)
                continue
            if cached_only and not check_only:
                continue
            if budget and ran and time.perf_counter() - start > budget and not check_only:
                print(f"[{i}/{len(mutants)}] {m.id}: not run (--budget {budget:.0f} s spent)", flush=True)
                continue
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
            if so_mutated and not m.native:
                # the installed extension still holds the previous native mutant: rebuild the original
                _build_native(target)
                so_mutated = False
            ran += 1
            bname = "baseline: " + ", ".join(m.tests)          # cached like the mutants' outcomes
            bkey = hashlib.sha256((source_key + _tests_key(m) + bname).encode()).hexdigest() if source_key else ""
            bhit = cache.get(bname)
            base = baselines.get(m.tests)
            if base is None and bkey and bhit and bhit.get("key") == bkey:
                base = baselines[m.tests] = (bhit["status"], bhit["detail"])
            if base is None:
                bkey_tests = _tests_key(m)
                # the unmutated tests must pass, or a failure says nothing about the mutant
                if so_mutated:
                    _build_native(target)
                    so_mutated = False
                base = baselines[m.tests] = _run_tests(m, timeout, fork)
                print(f"mutation: baseline (no mutant) of {', '.join(m.tests)}: {base[0]} {base[1]}", flush=True)
                if bkey and base[0] == "survived" and _tests_key(m) == bkey_tests:
                    cache = _load_cache()
                    cache[bname] = {"key": bkey, "status": base[0], "detail": base[1]}
                    _save_cache(cache)
            if base[0] != "survived":
                detail = f"the unmutated tests do not pass ({base[0]}: {base[1]})"
                outcomes.append(Outcome(m, "error", time.perf_counter() - t0, detail))
                print(f"[{i}/{len(mutants)}] {m.id}: ERROR {detail}", flush=True)
                continue
            (ROOT / m.file).write_text(mutated)
            try:
                if m.native:
                    native_touched = so_mutated = True
                    _build_native(target)
                status, tail = _run_tests(m, timeout, fork)
            finally:
                (ROOT / m.file).write_text(originals[m.file])
            if status == "survived" and m.equivalent:
                status = "equivalent"
            secs = time.perf_counter() - t0
            outcomes.append(Outcome(m, status, secs, tail))
            print(f"[{i}/{len(mutants)}] {m.id}: {status} ({secs:.0f} s) {tail}", flush=True)
            if key:
                # a test file edited while the tests ran: the outcome belongs to no one version
                if _mutant_key(m, source_key) != key:
                    print(f"mutation: {m.id}: its test files changed during the run; not cached", flush=True)
                    continue
                cache = _load_cache()
                cache[m.id] = {"key": key, "status": status, "seconds": round(secs, 1),
                               "runner": "fork" if fork else "subprocess",
                               "detail": tail, "commit": _head(short=True),
                               "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
                _save_cache(cache)
    finally:
        for f, text in originals.items():
            (ROOT / f).write_text(text)
        if native_touched:
            print("mutation: rebuilding the original extension", flush=True)
            _build_native(target)
    return outcomes


def _head(short: bool = False) -> str:
    args = ["git", "rev-parse", *(["--short"] if short else []), "HEAD"]
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def report(outcomes: list[Outcome]) -> str:
    killed = sum(o.status == "killed" for o in outcomes)
    survived = sum(o.status == "survived" for o in outcomes)
    timeouts = sum(o.status == "timeout" for o in outcomes)
    equiv = sum(o.status == "equivalent" for o in outcomes)
    errors = [o for o in outcomes if o.status == "error"]
    not_run = sum(o.status == "not run" for o in outcomes)
    scored = len(outcomes) - len(errors) - equiv - not_run
    score = killed / scored if scored else float("nan")
    lines = [
        f"# Mutation check ({_dt.date.today().isoformat()}, {os.cpu_count()} cores)",
        "",
        f"Mutants: {len(outcomes)}; killed {killed}; survived {survived}; timed out {timeouts}; "
        f"equivalent (explained) {equiv}; not applicable {len(errors)}"
        + (f"; **not run {not_run}** (a partial campaign: the score covers the {len(outcomes) - not_run} run)"
           if not_run else "") + ".",
        f"**Score: {killed}/{scored} = {100 * score:.1f}% killed** (equivalent mutants excluded; "
        f"a timeout counts as not killed).",
        "",
        "| mutant | area | file | outcome | what it breaks | tests |",
        "|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        m = o.mutant
        lines.append(f"| `{m.id}` | {m.area} | `{m.file}` | {o.status} | {m.what} | "
                     f"{', '.join('`' + t.split('/')[-1] + '`' for t in m.tests)} |")
    surv = [o for o in outcomes if o.status in ("survived", "equivalent", "timeout", "error")]
    if surv:
        lines += ["", "Survivors, timeouts and errors:"]
        for o in surv:
            why = {"timeout": o.detail, "error": o.detail}.get(
                o.status, o.mutant.equivalent or "no test catches it yet.")
            lines.append(f"- `{o.mutant.id}`: {o.status}. {why}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="", help="comma-separated mutant ids")
    ap.add_argument("--area", default="", help="only mutants of this area")
    ap.add_argument("--check", action="store_true", help="only check that every mutant applies")
    ap.add_argument("--list", action="store_true", help="list the catalogue")
    ap.add_argument("--timeout", type=float, default=600.0,
                    help="seconds per mutant's test run; past it the outcome is 'timeout' (not killed)")
    ap.add_argument("--budget", type=float, default=0.0,
                    help="stop starting new mutants after this many seconds (0: no limit); the "
                         "outcomes so far are cached, rerun the command to continue")
    ap.add_argument("--cached-only", action="store_true",
                    help="run nothing: report the cached outcomes and list the other mutants as 'not run' "
                         "(with --write-section: a partial campaign, stated as such)")
    ap.add_argument("--fork", action="store_true",
                    help="import the test run's third-party modules (torch, pytest, ...) once and fork "
                         "each test run from this process (never memkern: the child imports it fresh)")
    ap.add_argument("--no-cache", action="store_true",
                    help="neither read nor write bench/results/mutation-cache.json")
    ap.add_argument("--note", default="",
                    help="with --write-section: a sentence added to the section's introduction (what was "
                         "done about survivors)")
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
    if a.budget < 0 or a.timeout <= 0:
        ap.error(f"--budget/--timeout: expected >= 0 / > 0 seconds, got {a.budget} / {a.timeout}")
    if a.write_section and (ids or a.area):
        ap.error("--write-section: only for a run of the whole catalogue (no --only / --area)")
    t0 = time.perf_counter()
    if a.cached_only and a.no_cache:
        ap.error("--cached-only: needs the cache (drop --no-cache)")
    import signal

    signal.signal(signal.SIGTERM, _interrupt)   # `kill` restores the mutated files too
    signal.signal(signal.SIGINT, _interrupt)    # (a background job starts with SIGINT ignored)
    if a.fork and not (a.check or a.cached_only):
        _preload()
    outcomes = run(mutants, a.timeout, a.check, use_cache=not a.no_cache, budget=a.budget,
                   cached_only=a.cached_only, fork=a.fork)
    if a.cached_only and not a.check:
        got = {o.mutant.id for o in outcomes}
        outcomes += [Outcome(m, "not run", 0.0, cached=True) for m in mutants if m.id not in got]
        outcomes.sort(key=lambda o: mutants.index(o.mutant))
    if a.check:
        bad = [o for o in outcomes if o.status == "error"]
        print(f"mutation --check: {len(outcomes) - len(bad)}/{len(outcomes)} mutants apply")
        return 1 if bad else 0
    text = report(outcomes)
    print(text)
    if len(outcomes) < len(mutants):  # --budget spent (--cached-only lists the rest as "not run")
        print(f"mutation: incomplete, {len(mutants) - len(outcomes)} of {len(mutants)} mutants not run "
              f"within --budget; rerun the same command to continue (cached outcomes are reused)")
        return 3
    if a.write_section:
        import report as _report

        ran = [o for o in outcomes if not o.cached]
        n_cached = sum(o.cached and o.status != "not run" for o in outcomes)
        cache_now = _load_cache()
        runners: dict[str, int] = {}
        for o in outcomes:
            if o.status in ("not run", "error"):
                continue
            r = cache_now.get(o.mutant.id, {}).get("runner", "subprocess") if o.cached else ("fork" if a.fork else "subprocess")
            runners[r] = runners.get(r, 0) + 1
        total = sum(o.seconds for o in outcomes)
        commits = sorted({c for c in (_load_cache().get(o.mutant.id, {}).get("commit") for o in outcomes if o.cached) if c})
        intro = (f"Each mutant is one deliberate bug in a critical module (`bench/mutants.py`), run against "
                 f"the tests named for it; a mutant is killed when those tests fail, a test run past "
                 f"`--timeout` is a timeout and counts as not killed. Outcomes are for "
                 f"commit {_head(short=True)}'s source tree: {len(ran)} mutants run by this command, "
                 f"{n_cached} taken from the cache (`bench/results/mutation-cache.json`, "
                 f"keyed by the mutant, the committed source tree and its test files"
                 + (f"; run on commits {', '.join(commits)}" if commits else "")
                 + f"). Each test list is first run unmutated and must pass (else its mutants are "
                 f"errors); outcomes cached before that check existed (the first piece of this "
                 f"campaign, in subprocess runs) had none. Runners: "
                 + ", ".join(f"{n} {r}" for r, n in sorted(runners.items()))
                 + f" (`--fork`: torch and pytest imported once, each test run forked; memkern is "
                 f"imported fresh by the child). Test time summed over the mutants: {total / 60:.0f} minutes "
                 f"on 2 shared cores." + (f" {a.note.strip()}" if a.note.strip() else ""))
        body = intro + "\n\n" + text.split("\n", 2)[2]   # the report without its own heading
        cmd = " ".join([".venv/bin/python bench/mutation.py", *(sys.argv[1:] if argv is None else argv)])
        p = _report.write_section("mutation", "Mutation check (`bench/mutation.py`)", body, cmd)
        print(f"mutation: wrote {p}; reassemble with `memkern bench --assemble`")
    if a.report:
        Path(a.report).parent.mkdir(parents=True, exist_ok=True)
        Path(a.report).write_text(text)
    return 0 if all(o.status in ("killed", "equivalent") for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
