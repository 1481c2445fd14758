"""InMemoryStore vs MemoryStore, AsyncMemoryStore vs sequential calls, export / import throughput.

Compared, interleaved through ``bench/harness.py`` with results checked equal:

* **add_batch**: ``n`` records (``d = 384``, unit vectors) into a fresh store: the pure-Python
  :class:`~memkern.InMemoryStore` vs the native :class:`~memkern.MemoryStore` (``fsync="never"``,
  exact index: ``flat_limit`` above ``n``; and the default, an HNSW graph past 1,024 records).
  Checked: the same ids.
* **search** (``B`` queries, ``k = 10``): InMemoryStore's exact scan vs MemoryStore's exact scan
  (checked: the same ids) and vs its HNSW graph (recall@10 against the exact ids stated).
* **async**: ``B`` single-query searches through :class:`~memkern.AsyncMemoryStore`
  (``asyncio.gather``, 2 pool threads) vs the same searches one after the other on the sync store.
  Checked: the same results.
* **export / import** of the store (records/s), checked: the imported store equals the source.

Run: ``OMP_NUM_THREADS=1 python bench/bench_inmemory.py [--n 5000] [--queries 200]
[--write-section]`` (threads pinned to one, except the async pool's two).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

from harness import Side, compare, machine_info  # noqa: E402

D, K = 384, 10


def data(n: int, queries: int):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, D), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    q = rng.standard_normal((queries, D), dtype=np.float32)
    return x, q / np.linalg.norm(q, axis=1, keepdims=True)


def main(argv=None) -> dict:
    from memkern import AsyncMemoryStore, InMemoryStore, MemoryStore
    from memkern.store.transfer.install import export_store, import_store

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--write-section", action="store_true")
    a = ap.parse_args(argv)
    x, q = data(a.n, a.queries)
    names = [f"s{i}" for i in range(a.n)]
    tmp = Path(tempfile.mkdtemp(prefix="bench-inmem-"))
    rows = []

    def fresh(flat: bool):
        p = tmp / ("flat" if flat else "hnsw")
        shutil.rmtree(p, ignore_errors=True)
        return MemoryStore(p, dim=D, fsync="never", snapshot_every=0, flat_limit=a.n + 1 if flat else 1024)

    held = {}

    def add_native(flat):
        def run():
            s = held.pop(flat, None)
            if s is not None:
                s.close()
            s = held[flat] = fresh(flat)
            return s.add_batch("u", names, x)
        return run

    def add_mem():
        return InMemoryStore(D, "ip").add_batch("u", names, x)

    same_ids = lambda r0, r1: np.testing.assert_array_equal(r0, r1)  # noqa: E731
    for flat in (True, False):
        c = compare(Side("InMemoryStore", add_mem, threads=1), Side(f"MemoryStore ({'exact' if flat else 'HNSW'})",
                                                                     add_native(flat), threads=1),
                    check=same_ids, rounds=a.rounds, label=f"add_batch n={a.n}")
        rows.append(("add_batch", c))
        print(c.summary("ms"))
    mem = InMemoryStore(D, "ip")
    mem.add_batch("u", names, x)
    flat, hnsw = held[True], held[False]
    c = compare(Side("InMemoryStore", lambda: mem.search("u", q, k=K)[0], threads=1),
                Side("MemoryStore (exact)", lambda: flat.search("u", q, k=K)[0], threads=1),
                check=same_ids, rounds=a.rounds, label=f"search B={a.queries} k={K}")
    rows.append(("search", c))
    print(c.summary("ms"))
    exact = mem.search("u", q, k=K)[0]
    got = hnsw.search("u", q, k=K)[0]
    recall = float(np.mean([len(set(exact[b]) & set(got[b])) / K for b in range(len(q))]))
    c = compare(Side("InMemoryStore", lambda: mem.search("u", q, k=K)[0], threads=1),
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
    for s in held.values():
        s.close()
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
        report.write_section("inmemory", "InMemoryStore, AsyncMemoryStore, export / import", "\n".join(lines),
                             f"OMP_NUM_THREADS=1 python bench/bench_inmemory.py --n {a.n} --queries {a.queries} "
                             "--write-section", machine_info())
    return out


if __name__ == "__main__":
    main()
