"""InMemoryStore (the engine with persistence off) vs MemoryStore on disk, AsyncMemoryStore vs
sequential calls, export / import throughput.

Compared, interleaved through ``bench/harness.py`` with results checked equal:

* **add_batch**: ``n`` records (``d = 384``, unit vectors) into a fresh store: the
  :class:`~memkern.InMemoryStore` (the native engine, no log) vs :class:`~memkern.MemoryStore`
  with ``fsync="never"`` and ``fsync="always"`` (exact index: ``flat_limit`` above ``n``).
  Checked: the same ids. The difference is the cost of the log (encode is shared; append, fsync).
* **add** one record per call (``--single`` calls): the same three sides, where the per-call log
  append and fsync show.
* **search** (``B`` queries in one call, and ``B`` calls of one query, ``k = 10``): InMemoryStore's
  exact scan vs MemoryStore's exact scan (checked: the same ids) and vs its HNSW graph (recall@10
  against the exact ids stated).
* ``--twin-rev REV``: also the pure-Python ``InMemoryStore`` of git revision ``REV`` (the store
  before it became the engine; loaded from ``git show REV:python/memkern/store/memory.py``) on the same
  add_batch and search, checked: the same ids (search: up to near-ties, its scores being float64).
* **async**: ``B`` single-query searches through :class:`~memkern.AsyncMemoryStore`
  (``asyncio.gather``, 2 pool threads) vs the same searches one after the other on the sync store.
  Checked: the same results.
* **export / import** of the store (records/s), checked: the imported store equals the source.

Run: ``OMP_NUM_THREADS=1 python bench/bench_inmemory.py [--n 5000] [--queries 200] [--single 300]
[--twin-rev REV] [--write-section]`` (threads pinned to one, except the async pool's two).
"""
from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

from harness import Side, compare, machine_info  # noqa: E402

D, K = 384, 10
ROOT = Path(__file__).resolve().parent.parent


def data(n: int, queries: int):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, D), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    q = rng.standard_normal((queries, D), dtype=np.float32)
    return x, q / np.linalg.norm(q, axis=1, keepdims=True)


def load_twin(rev: str):
    """The pure-Python ``InMemoryStore`` class of git revision ``rev`` (a module of the package)."""
    src = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:python/memkern/store/memory.py"], check=True,
                         capture_output=True, text=True).stdout
    spec = importlib.util.spec_from_loader("memkern._twin_inmemory", loader=None)
    mod = importlib.util.module_from_spec(spec)
    mod.__package__ = "memkern"
    sys.modules[spec.name] = mod
    exec(compile(src, f"{rev}:python/memkern/store/memory.py", "exec"), mod.__dict__)  # noqa: S102
    return mod.InMemoryStore


def main(argv=None) -> dict:
    from memkern import AsyncMemoryStore, InMemoryStore, MemoryStore
    from memkern.store.transfer import export_store, import_store

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--single", type=int, default=300, help="one-record add calls timed per side")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--twin-rev", default=None, help="git revision whose pure-Python InMemoryStore is compared")
    ap.add_argument("--write-section", action="store_true")
    a = ap.parse_args(argv)
    x, q = data(a.n, a.queries)
    names = [f"s{i}" for i in range(a.n)]
    tmp = Path(tempfile.mkdtemp(prefix="bench-inmem-"))
    rows = []
    Twin = load_twin(a.twin_rev) if a.twin_rev else None
    same_ids = lambda r0, r1: np.testing.assert_array_equal(r0, r1)  # noqa: E731
    MEM = "InMemoryStore (engine, no log)"

    def disk(name: str, fsync: str, flat: bool = True):
        p = tmp / name
        shutil.rmtree(p, ignore_errors=True)
        return MemoryStore(p, dim=D, fsync=fsync, snapshot_every=0, flat_limit=a.n + a.single + 1 if flat else 1024)

    held = {}

    def writer(key, make, write):
        """A Side's (setup, fn): setup closes the last store and opens a fresh one (untimed), fn
        writes into it (timed; a disk store's close, which snapshots, is outside the timing)."""
        def setup():
            s = held.pop(key, None)
            if s is not None:
                s.close()
            held[key] = make()

        return setup, lambda: write(held[key])

    makers = {MEM: lambda: InMemoryStore(D, "ip"),
              'MemoryStore fsync="never"': lambda: disk("never", "never"),
              'MemoryStore fsync="always"': lambda: disk("always", "always")}
    if Twin is not None:
        makers[f"Python InMemoryStore ({a.twin_rev})"] = lambda: Twin(D, "ip")
    batch = lambda s: s.add_batch("u", names, x)  # noqa: E731
    single = lambda s: np.array([s.add("u", "x", x[i]) for i in range(a.single)])  # noqa: E731
    for what, write, label in (("add_batch", batch, f"add_batch n={a.n}"),
                               ("add", single, f"{a.single} single add calls")):
        for name in list(makers)[1:]:
            s0, f0 = writer(MEM, makers[MEM], write)
            s1, f1 = writer(name, makers[name], write)
            c = compare(Side(MEM, f0, threads=1, setup=s0), Side(name, f1, threads=1, setup=s1), check=same_ids,
                        rounds=a.rounds, label=label)
            rows.append((what, c))
            print(c.summary("ms"))
    held.pop(MEM).close()
    for name in list(held):
        if not name.startswith("MemoryStore"):
            held.pop(name).close()
    flat = disk("flat", "never")
    flat.add_batch("u", names, x)
    hnsw = disk("hnsw", "never", flat=False)
    hnsw.add_batch("u", names, x)
    held["flat"], held["hnsw"] = flat, hnsw

    mem = InMemoryStore(D, "ip")
    mem.add_batch("u", names, x)
    searches = [Side("MemoryStore (exact)", lambda: flat.search("u", q, k=K)[0], threads=1)]
    if Twin is not None:
        twin = Twin(D, "ip")
        twin.add_batch("u", names, x)
        searches.insert(0, Side(f"Python InMemoryStore ({a.twin_rev})", lambda: twin.search("u", q, k=K)[0], threads=1))
    ref = q.astype(np.float64) @ x.astype(np.float64).T

    def same_up_to_ties(r0, r1):
        # float64 (the Python store) vs float32 (the engine) scores: ids equal but where two
        # records' exact scores lie within float32 rounding of each other
        d = np.abs(np.take_along_axis(ref, r0, 1) - np.take_along_axis(ref, r1, 1))
        assert d.max() <= 1e-6 and np.mean(r0 == r1) >= 0.99, (d.max(), np.mean(r0 == r1))

    for other in searches:
        c = compare(Side(MEM, lambda: mem.search("u", q, k=K)[0], threads=1), other,
                    check=same_ids if other.name.startswith("MemoryStore") else same_up_to_ties,
                    rounds=a.rounds, label=f"search B={a.queries} k={K}")
        rows.append(("search", c))
        print(c.summary("ms"))
    for other in searches:  # one query per call, as an agent reads
        c = compare(Side(MEM, lambda: np.concatenate([mem.search("u", q[i], k=K)[0] for i in range(len(q))]),
                         threads=1),
                    Side(other.name, lambda s=(twin if other.name.startswith("Python") else flat):
                         np.concatenate([s.search("u", q[i], k=K)[0] for i in range(len(q))]), threads=1),
                    check=same_ids if other.name.startswith("MemoryStore") else same_up_to_ties,
                    rounds=a.rounds, label=f"{a.queries} single-query searches k={K}")
        rows.append(("search", c))
        print(c.summary("ms"))
    exact = mem.search("u", q, k=K)[0]
    got = hnsw.search("u", q, k=K)[0]
    recall = float(np.mean([len(set(exact[b]) & set(got[b])) / K for b in range(len(q))]))
    c = compare(Side(MEM, lambda: mem.search("u", q, k=K)[0], threads=1),
                Side("MemoryStore (HNSW)", lambda: hnsw.search("u", q, k=K)[0], threads=1),
                check=None, rounds=a.rounds, label=f"search B={a.queries} k={K}",
                extra={"recall@10 of HNSW vs the exact ids": recall})
    rows.append(("search", c))
    print(c.summary("ms"), f"recall@10 {recall:.3f}")

    async def gathered():
        async with AsyncMemoryStore(flat, max_workers=2) as s:
            res = await asyncio.gather(*(s.search("u", q[i], k=K) for i in range(len(q))))
        return np.concatenate([r[0] for r in res])

    def sequential():
        return np.concatenate([flat.search("u", q[i], k=K)[0] for i in range(len(q))])

    c = compare(Side("AsyncMemoryStore gather (2 threads)", lambda: asyncio.run(gathered()), threads=2),
                Side("sync, one by one", sequential, threads=1), check=same_ids, rounds=a.rounds,
                label=f"{a.queries} single-query searches (exact, n={a.n})")
    rows.append(("async", c))
    print(c.summary("ms"))

    t0 = time.perf_counter()
    export_store(flat, tmp / "x.jsonl")
    t_exp = time.perf_counter() - t0
    size = (tmp / "x.jsonl").stat().st_size
    t0 = time.perf_counter()
    import_store(tmp / "imported", tmp / "x.jsonl")
    t_imp = time.perf_counter() - t0
    with MemoryStore(tmp / "imported") as s2:
        np.testing.assert_array_equal(s2.embeddings(np.arange(a.n)), flat.embeddings(np.arange(a.n)))
        assert s2.search("u", q, k=K, ef=512)[0].shape == (len(q), K)
    print(f"export {a.n / t_exp:,.0f} records/s ({size / a.n:.0f} bytes/record), import {a.n / t_imp:,.0f} records/s")
    for st in held.values():
        st.close()
    shutil.rmtree(tmp, ignore_errors=True)
    out = {"rows": rows, "export_rps": a.n / t_exp, "import_rps": a.n / t_imp, "bytes_per_record": size / a.n,
           "n": a.n, "queries": a.queries}
    if a.write_section:
        import report

        lines = ["| what | side 0 | side 1 | side 0 / side 1 (median, IQR) | check |", "|---|---|---|---|---|"]
        for kind, c in rows:
            s0, s1 = c.sides
            lo, hi = np.quantile(c.ratios, [0.25, 0.75])
            note = "same ids" if c.checked else ", ".join(f"{k} {v:.3f}" for k, v in c.extra.items())
            lines.append(f"| {c.label} | {s0.name} {s0.median * 1e3:.1f} ms | {s1.name} {s1.median * 1e3:.1f} ms | "
                         f"{c.ratio:.2f} ({lo:.2f}-{hi:.2f}) | {note} |")
        lines.append("")
        lines.append(f"Export {out['export_rps']:,.0f} records/s ({out['bytes_per_record']:.0f} bytes per record "
                     f"with its float32 vector in base64), import {out['import_rps']:,.0f} records/s (checked: "
                     "the imported vectors equal the source's).")
        report.write_section("inmemory", "InMemoryStore (persistence off) vs MemoryStore, AsyncMemoryStore, export / import", "\n".join(lines),
                             f"OMP_NUM_THREADS=1 python bench/bench_inmemory.py --n {a.n} --queries {a.queries} "
                             f"--single {a.single}" + (f" --twin-rev {a.twin_rev}" if a.twin_rev else "")
                             + " --write-section", machine_info())
    return out


if __name__ == "__main__":
    main()
