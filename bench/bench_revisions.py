"""The Python layer of two revisions, side by side: store calls and reranker steps, interleaved.

For refactors that move Python code but not the engine: both revisions run on the one native
module this checkout built (so only the Python layer differs), each in its own process, the
processes alternating round by round, one thread, pinned to one core. Both sides must compute the
same thing: the store's result ids and the reranker's learned weights are compared.

Usage::

    OMP_NUM_THREADS=1 python bench/bench_revisions.py OLD_REV [NEW_REV] [--rounds 5] [--core 1]

``NEW_REV`` defaults to ``HEAD``. Each revision is checked out with ``git worktree add`` into a
temporary folder (removed afterwards). A revision whose ``csrc/`` differs from this checkout's is
refused unless the difference is in comments only (``--allow-native-diff`` to run anyway).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_PRELUDE = r'''
import sys, time, json
sys.meta_path = [f for f in sys.meta_path if not any(w in (type(f).__module__ + repr(f)).lower()
                                                     for w in ("editable", "skbc"))]
sys.path.insert(0, sys.argv[1])
'''

STORE = _PRELUDE + r'''
import numpy as np, memkern
rng = np.random.default_rng(0)
d, n = 384, 10000
X = rng.standard_normal((n, d)).astype(np.float32); X /= np.linalg.norm(X, axis=1, keepdims=True)
Q = X[:200] + 0.05 * rng.standard_normal((200, d)).astype(np.float32)
texts = [f"memory number {i} about topic {i % 97}" for i in range(n)]
s = memkern.InMemoryStore(dim=d, metric="ip", flat_limit=1024)
t = time.perf_counter(); s.add_batch("u", texts, X); out = {"store add_batch 10k (s)": time.perf_counter() - t}
def per_call(fn, reps):
    ts = []
    for i in range(reps):
        t = time.perf_counter(); fn(i); ts.append(time.perf_counter() - t)
    ts.sort(); return ts[len(ts) // 2] * 1e6
out["store search 1 query (us)"] = per_call(lambda i: s.search("u", Q[i % 200], k=10), 2000)
out["store search 200 queries (us)"] = per_call(lambda i: s.search("u", Q, k=10), 30)
out["store hybrid 1 query (us)"] = per_call(
    lambda i: s.search("u", Q[i % 200], k=10, mode="hybrid", texts=[f"topic {i % 97}"]), 1000)
out["store filtered 1 query (us)"] = per_call(lambda i: s.search("u", Q[i % 200], k=10, filter={"x": 1}), 1000)
m = memkern.InMemoryStore(dim=d)
out["store add 1 (us)"] = per_call(
    lambda i: m.add("v", texts[i % n], X[i % n], [{"role": "user", "content": "c"}], {"k": i}), 2000)
check = {"ids": int(np.sum(s.search("u", Q, k=10)[0])),
         "hybrid": int(np.sum(s.search("u", Q, k=10, mode="hybrid", texts=["topic 3"] * 200)[0]))}
print(json.dumps({"times": out, "check": check}))
'''

RERANK = _PRELUDE + r'''
import torch
torch.set_num_threads(1)
from memkern.score.reranker import Reranker
out, check = {}, {}
for B, d in ((1, 384), (64, 768)):
    g = torch.Generator().manual_seed(0)
    q = torch.nn.functional.normalize(torch.randn(B, d, generator=g), dim=-1)
    C = torch.nn.functional.normalize(torch.randn(B, 20, d, generator=g), dim=-1)
    for preset in ("paper", "stable"):
        rr = Reranker.from_preset(preset, d, backend="torch")
        def step():
            sel = rr.select(q, C)
            rr.update(sel, (sel.indices % 2 == 0).float())
        for _ in range(30):
            step()
        ts = []
        for _ in range(200 if B == 1 else 40):
            t = time.perf_counter(); step(); ts.append(time.perf_counter() - t)
        ts.sort()
        out[f"reranker select+update B={B} d={d} {preset} (ms)"] = ts[len(ts) // 2] * 1e3
        check[f"{B}-{d}-{preset}"] = float(rr.Wq.detach().double().sum() + rr.Wm.detach().double().sum())
print(json.dumps({"times": out, "check": check}))
'''


def _native_file() -> Path:
    out = subprocess.run([sys.executable, "-c", "import memkern._store as s; print(s.__file__)"],
                         capture_output=True, text=True, check=True, cwd=tempfile.gettempdir())
    return Path(out.stdout.strip())


def _code_lines(text: str) -> list[str]:
    return [ln.split("//")[0].rstrip() for ln in text.splitlines() if ln.split("//")[0].strip()]


def _native_differs(rev: str) -> list[str]:
    """Files of ``csrc/`` whose code (comments aside) differs between ``rev`` and the working tree."""
    names = subprocess.run(["git", "diff", "--name-only", rev, "--", "csrc", "CMakeLists.txt"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    out = []
    for f in names:
        old = subprocess.run(["git", "show", f"{rev}:{f}"], cwd=ROOT, capture_output=True, text=True).stdout
        new = (ROOT / f).read_text() if (ROOT / f).exists() else ""
        if _code_lines(old) != _code_lines(new):
            out.append(f)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("old")
    ap.add_argument("new", nargs="?", default="HEAD")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--core", type=int, default=None, help="pin the children to this CPU core")
    ap.add_argument("--allow-native-diff", action="store_true")
    a = ap.parse_args(argv)
    for rev in (a.old, a.new):
        diff = _native_differs(rev)
        if diff and not a.allow_native_diff:
            raise SystemExit(f"bench_revisions: {rev} has other native code ({', '.join(diff)}); "
                             "this benchmark compares the Python layer on one native module")
    so = _native_file()
    tmp = Path(tempfile.mkdtemp(prefix="memkern-revs-"))
    trees = {}
    try:
        for side, rev in (("old", a.old), ("new", a.new)):
            wt = tmp / side
            subprocess.run(["git", "worktree", "add", "--detach", "-q", str(wt), rev], cwd=ROOT, check=True)
            (wt / "python" / "memkern" / so.name).symlink_to(so)
            trees[side] = str(wt / "python")
        env = {"OMP_NUM_THREADS": "1", "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "TRITON_INTERPRET": "1"}
        pin = ["taskset", "-c", str(a.core)] if a.core is not None and shutil.which("taskset") else []
        res = {"old": [], "new": []}
        for r in range(a.rounds):
            order = ("old", "new") if r % 2 == 0 else ("new", "old")
            for side in order:
                times, checks = {}, {}
                for code in (STORE, RERANK):
                    o = subprocess.run([*pin, sys.executable, "-c", code, trees[side]], capture_output=True,
                                       text=True, cwd=tempfile.gettempdir(), env=env)
                    if o.returncode:
                        raise SystemExit(f"bench_revisions: {side} failed:\n{o.stderr[-3000:]}")
                    got = json.loads(o.stdout)
                    times.update(got["times"]); checks.update(got["check"])
                res[side].append((times, checks))
        ref = res["old"][0][1]
        for side in res:
            for _, c in res[side]:
                assert c == ref, f"bench_revisions: {side} computed something else: {c} vs {ref}"
        print(f"{a.old} vs {a.new}: medians of {a.rounds} interleaved rounds, one thread"
              f"{f', core {a.core}' if pin else ''}; results identical on both sides")
        print("| measure | old | new | new / old |\n|---|---|---|---|")
        for k in res["old"][0][0]:
            o_ = statistics.median(t[k] for t, _ in res["old"])
            n_ = statistics.median(t[k] for t, _ in res["new"])
            print(f"| {k} | {o_:.3f} | {n_:.3f} | {n_ / o_:.3f} |")
    finally:
        for side in ("old", "new"):
            if (tmp / side).exists():
                subprocess.run(["git", "worktree", "remove", "--force", str(tmp / side)], cwd=ROOT)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
