"""Ray scale-out: ingest throughput and sharded search throughput with 1, 2 and 4 local workers,
and the per-shard figures a 10-million-user plan is computed from.

Ingest: ``memkern.distributed.ingest`` of generated sessions (``memkern.data.generate_history``)
with the embedding extractor and the offline MiniLM, ``concurrency`` = workers extraction actors
(one embedder each) into a ShardedStore of ``workers`` shards; sessions/s and the scaling factor
against 1 worker. Every run ingests the same sessions into a fresh store and the record counts
must agree (correctness check).

Search: a ShardedStore of ``workers`` shards holding ``--users`` namespaces x ``--per`` records
(384-d, cos); throughput of ``search_many`` (batches of 64 single-query requests over random
namespaces, every shard in parallel) and the latency of single ``search`` calls (p50 / p99). The
results must equal those of one MemoryStore holding the same records (checked on a sample).

Per shard: resident bytes per record (``memory_bytes``), disk bytes per record (shard folder after
a snapshot), snapshot seconds per million records, reopen (log replay / snapshot load) seconds
per million records and the ingest ledger read a restarted shard does (from the store's meta
index, ``meta_values``; beside it, in the same run, the scan of every record it replaced), which
the capacity plan extrapolates. On 2 shared cores, 4 workers oversubscribe the machine: the factor shows the
contention, not the design's ceiling.

    OMP_NUM_THREADS=1 python bench/bench_ray.py --quick
    OMP_NUM_THREADS=1 python bench/bench_ray.py --write-section
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

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

D = 384


def _sessions(n_users: int, n_sessions: int) -> list[dict]:
    from memkern.data import generate_history

    ds = generate_history(n_users, n_sessions, seed=0)
    out = []
    for c in ds.conversations:
        for s in c.sessions:
            out.append({"session_id": f"{c.conversation_id}:{s.session_id}", "date": None,
                        "turns": [{"role": t.role, "content": t.content} for t in s.turns]})
    return out


def bench_ingest(workers: list[int], sessions: list[dict], batch: int) -> list[dict]:
    from memkern.distributed import ShardedStore, ingest

    rows = []
    for w in workers:
        d = tempfile.mkdtemp(prefix="bench-ray-ingest-")
        try:
            with ShardedStore(d, dim=D, metric="cos", shards=w) as st:
                t0 = time.perf_counter()
                rep = ingest(st, sessions, namespace=lambda s: s["session_id"].split(":")[0], batch_size=batch,
                             concurrency=w, progress=False)
                dt = time.perf_counter() - t0
                n = sum(st.count(ns) for ns in st.namespaces())
            rows.append(dict(workers=w, sessions=rep.written, records=n, seconds=dt, sessions_per_s=rep.written / dt,
                             startup_s=rep.first_batch_s, steady_sessions_per_s=rep.steady_sessions_per_s))
            print(f"ingest workers={w}: {rep.written} sessions, {n} records in {dt:.1f} s "
                  f"({rep.written / dt:.2f} sessions/s; first batch after {rep.first_batch_s:.1f} s, then "
                  f"{rep.steady_sessions_per_s:.2f} sessions/s)", flush=True)
        finally:
            shutil.rmtree(d, ignore_errors=True)
    if len({r["records"] for r in rows}) != 1:
        raise AssertionError(f"ingest: record counts differ between worker counts: {rows}")
    return rows


def _fill(store, users: int, per: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for u in range(users):
        v = rng.standard_normal((per, D)).astype(np.float32)
        store.add_batch(f"user-{u}", [f"m{u}-{i}" for i in range(per)], v)


def bench_search(workers: list[int], users: int, per: int, queries: int) -> list[dict]:
    from memkern import MemoryStore
    from memkern.distributed import ShardedStore

    rng = np.random.default_rng(1)
    qs = rng.standard_normal((queries, D)).astype(np.float32)
    who = rng.integers(0, users, queries)
    ref_dir = tempfile.mkdtemp(prefix="bench-ray-ref-")
    rows = []
    try:
        ref = MemoryStore(ref_dir, dim=D, metric="cos", fsync="never")
        _fill(ref, users, per)
        ref_ans = {i: [ref.get(int(x)).summary for x in ref.search(f"user-{who[i]}", qs[i], k=10)[0][0]]
                   for i in range(0, queries, max(1, queries // 50))}
        ref.close()
        for w in workers:
            d = tempfile.mkdtemp(prefix="bench-ray-search-")
            try:
                st = ShardedStore(d, dim=D, metric="cos", shards=w, fsync="never")
                _fill(st, users, per)
                for i, want in ref_ans.items():   # correctness: same answers as one store
                    got = [r.summary for r in st.get_batch(st.search(f"user-{who[i]}", qs[i], k=10)[0][0])]
                    if got != want:
                        raise AssertionError(f"search: shards={w} query {i}: {got[:3]} != {want[:3]}")
                reqs = [(f"user-{who[i]}", qs[i]) for i in range(queries)]
                st.search_many(reqs[:64], k=10)  # warm-up
                t0 = time.perf_counter()
                for a in range(0, queries, 64):
                    st.search_many(reqs[a:a + 64], k=10)
                dt = time.perf_counter() - t0
                lat = []
                for i in range(min(queries, 400)):
                    t1 = time.perf_counter()
                    st.search(reqs[i][0], reqs[i][1], k=10)
                    lat.append(time.perf_counter() - t1)
                lat.sort()
                stats = st.shard_stats()
                rows.append(dict(workers=w, qps=queries / dt, p50_ms=1e3 * lat[len(lat) // 2],
                                 p99_ms=1e3 * lat[min(len(lat) - 1, int(0.99 * len(lat)))],
                                 namespaces_per_shard=[s["namespaces"] for s in stats]))
                print(f"search shards={w}: {queries / dt:.0f} queries/s (search_many), single search p50 "
                      f"{rows[-1]['p50_ms']:.2f} ms p99 {rows[-1]['p99_ms']:.2f} ms, namespaces/shard "
                      f"{rows[-1]['namespaces_per_shard']}", flush=True)
                st.close()
            finally:
                shutil.rmtree(d, ignore_errors=True)
    finally:
        shutil.rmtree(ref_dir, ignore_errors=True)
    return rows


def per_shard_figures(users: int, per: int) -> dict:
    """One shard's costs per record, measured on one MemoryStore (what each actor owns)."""
    from memkern import MemoryStore

    d = tempfile.mkdtemp(prefix="bench-ray-shard-")
    try:
        st = MemoryStore(d, dim=D, metric="cos", fsync="never", snapshot_every=0)
        rng = np.random.default_rng(2)
        for u in range(users):
            st.add_batch(f"user-{u}", [f"user {u} memory {i}: a short summary of a topic" for i in range(per)],
                         rng.standard_normal((per, D)).astype(np.float32),
                         metas=[{"ingest_session": f"user-{u}:s{i // 10}"} for i in range(per)])
        n = users * per
        mem = st.memory_bytes()
        t0 = time.perf_counter()
        st.snapshot()
        snap_s = time.perf_counter() - t0
        disk = sum(p.stat().st_size for p in Path(d).rglob("*") if p.is_file())
        st.close()
        t0 = time.perf_counter()
        st = MemoryStore(d)
        open_s = time.perf_counter() - t0
        from memkern.distributed.ingest import LEDGER_KEY

        t0 = time.perf_counter()      # what a restarted shard actor does to read the ingest ledger
        nat = st._n()
        index = {(ns, v) for ns in st.namespaces() for v in nat.meta_values(ns, LEDGER_KEY, 0)}
        index_s = time.perf_counter() - t0
        t0 = time.perf_counter()      # what it did before: read every record's meta
        scan = set()
        for ns in st.namespaces():
            scan.update((ns, r.meta[LEDGER_KEY]) for r in st.get_batch(st.ids(ns)))
        ledger_s = time.perf_counter() - t0
        assert index == scan and len(index) == users * ((per + 9) // 10)
        q = rng.standard_normal((1, D)).astype(np.float32)
        lat = []
        for i in range(1000):
            t1 = time.perf_counter()
            st.search(f"user-{i % users}", q, k=10)
            lat.append(time.perf_counter() - t1)
        lat.sort()
        st.close()
        return dict(records=n, bytes_per_record_ram=mem / n, bytes_per_record_disk=disk / n,
                    snapshot_s_per_million=snap_s / n * 1e6, reopen_s_per_million=open_s / n * 1e6,
                    ledger_scan_s_per_million=ledger_s / n * 1e6, ledger_index_s_per_million=index_s / n * 1e6,
                    native_search_p50_us=1e6 * lat[500],
                    native_search_p99_us=1e6 * lat[990])
    finally:
        shutil.rmtree(d, ignore_errors=True)


def plan(fig: dict, search: list[dict], users: float = 10e6, per: int = 200, ram_per_shard_gb: float = 64.0) -> dict:
    """Capacity plan for ``users`` x ``per`` memories from the measured per-shard figures."""
    records = users * per
    ram = records * fig["bytes_per_record_ram"]
    disk = records * fig["bytes_per_record_disk"]
    shards = int(np.ceil(ram / (ram_per_shard_gb * 0.7 * 2**30)))   # 70% of a host's RAM for the store
    per_shard = records / shards
    one = [r for r in search if r["workers"] == 1][0]
    return dict(records=records, ram_tb=ram / 2**40, disk_tb=disk / 2**40, shards=shards,
                records_per_shard=per_shard, namespaces_per_shard=users / shards,
                snapshot_min_per_shard=fig["snapshot_s_per_million"] * per_shard / 1e6 / 60,
                reopen_min_per_shard=fig["reopen_s_per_million"] * per_shard / 1e6 / 60,
                ledger_scan_min_per_shard=fig["ledger_scan_s_per_million"] * per_shard / 1e6 / 60,
                ledger_index_s_per_shard=fig.get("ledger_index_s_per_million", float("nan")) * per_shard / 1e6,
                p99_ms=one["p99_ms"], native_p99_us=fig["native_search_p99_us"])


def format_md(res: dict) -> str:
    ing, se, fig, pl = res["ingest"], res["search"], res["per_shard"], res["plan"]
    b1 = ing[0]["sessions_per_s"]
    s1 = se[0]["qps"]
    L = [f"Ingest: {ing[0]['sessions']} generated sessions ({ing[0]['records']} topic records), embedding "
         "extractor + offline MiniLM, one extraction actor per worker, a shard per worker.", "",
         "| workers | seconds | sessions/s | scaling vs 1 | first batch after | sessions/s after it | scaling vs 1 |",
         "|---|---|---|---|---|---|---|"]
    st1 = ing[0]["steady_sessions_per_s"] or float("nan")
    L += [f"| {r['workers']} | {r['seconds']:.1f} | {r['sessions_per_s']:.2f} | {r['sessions_per_s'] / b1:.2f}x | "
          f"{r['startup_s']:.1f} s | {r['steady_sessions_per_s']:.2f} | {r['steady_sessions_per_s'] / st1:.2f}x |"
          for r in ing]
    L += ["", f"Search: {res['users']} namespaces x {res['per']} records (384-d, cos), {res['queries']} queries; "
          "`search_many` in batches of 64 requests (every shard in parallel); single `search` latency through Ray. "
          "Answers equal one MemoryStore's (checked).", "",
          "| shards | queries/s | scaling vs 1 | single search p50 | p99 | namespaces per shard |",
          "|---|---|---|---|---|---|"]
    L += [f"| {r['workers']} | {r['qps']:.0f} | {r['qps'] / s1:.2f}x | {r['p50_ms']:.2f} ms | {r['p99_ms']:.2f} ms | "
          f"{r['namespaces_per_shard']} |" for r in se]
    L += ["", "On 2 shared cores, 2 and 4 workers mostly show contention: ingest is CPU-bound MiniLM (each "
          "worker loads its own copy, which is the 'first batch' time), so its factor is bounded by the cores "
          "(near-linear needs a core, or a GPU, per worker); sharded search is bounded by the per-call Ray overhead "
          "(~ms) against a ~10-100 us native search, so the caller, not the shards, is the limit here.", "",
          f"Per shard (one MemoryStore of {fig['records']:,} records, {res['per']} per namespace, 384-d): "
          f"{fig['bytes_per_record_ram']:.0f} B RAM and {fig['bytes_per_record_disk']:.0f} B disk per record; "
          f"snapshot {fig['snapshot_s_per_million']:.1f} s, reopen {fig['reopen_s_per_million']:.1f} s and ingest "
          f"ledger read {fig.get('ledger_index_s_per_million', float('nan')):.2f} s per million records (from the "
          f"store's meta index; the scan of every record it replaced: {fig['ledger_scan_s_per_million']:.1f} s); "
          "native search p50 "
          f"{fig['native_search_p50_us']:.0f} us, p99 {fig['native_search_p99_us']:.0f} us.", "",
          "### On paper: 10 million users x 200 memories", "",
          f"- {pl['records']:.2g} records: {pl['ram_tb']:.1f} TiB RAM and {pl['disk_tb']:.1f} TiB disk (x1, before "
          "replication), from the per-record figures above.",
          f"- Shards: {pl['shards']} at 64 GiB hosts with 70% for the store, i.e. {pl['records_per_shard']:.3g} "
          f"records and {pl['namespaces_per_shard']:,.0f} namespaces per shard.",
          f"- p99: a request touches one shard and one namespace of 200 records (an exact scan, "
          f"{pl['native_p99_us']:.0f} us native p99), so p99 is the Ray call ({pl['p99_ms']:.1f} ms measured here) "
          "plus queueing: it does not grow with the number of users as long as each shard's load stays below "
          "its single-threaded actor's rate.",
          f"- What breaks first: the per-shard maintenance times, not search. A shard of "
          f"{pl['records_per_shard']:.3g} records takes ~{pl['snapshot_min_per_shard']:.0f} min per full snapshot "
          f"(every snapshot rewrites the whole store) and ~{pl['reopen_min_per_shard']:.0f} min to reopen (which "
          "also rebuilds the meta index), and the actor is single-threaded: it serves nothing meanwhile. The ingest "
          f"ledger then costs ~{pl.get('ledger_index_s_per_shard', float('nan')):.0f} s on the first ingest call "
          "after a restart (distinct session ids from the meta index; the scan of every record it replaced would "
          f"take ~{pl['ledger_scan_min_per_shard']:.0f} min). "
          f"Measured at {fig['records']:,} records per shard and extrapolated linearly. Next: the single-threaded actor per shard (one core per shard for search and "
          "writes) and the driver-side fan-out. Remedies: more, smaller shards per host (several actors per host), "
          "and incremental snapshots."]
    return "\n".join(L)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--ingest-users", type=int, default=2)
    ap.add_argument("--ingest-sessions", type=int, default=12, help="sessions per generated user")
    ap.add_argument("--users", type=int, default=400, help="search: namespaces")
    ap.add_argument("--per", type=int, default=200, help="search: records per namespace")
    ap.add_argument("--queries", type=int, default=2000)
    ap.add_argument("--shard-users", type=int, default=500, help="per-shard figures: namespaces of --per records")
    ap.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--write-section", action="store_true")
    ap.add_argument("--from-json", default=None, metavar="PATH",
                    help="re-render the tables of an earlier run's raw JSON (measures nothing)")
    a = ap.parse_args(argv)
    if a.from_json:
        res = json.loads(Path(a.from_json).read_text())
        md = format_md(res)
        print(md)
        if a.write_section:
            import report

            p = report.write_section("ray", "Scale-out on Ray (`bench/bench_ray.py`)", md, res["command"],
                                     res["machine"], raw_json="bench/results/ray.json")
            print(f"wrote {p}")
        return 0
    if a.quick:
        a.ingest_users, a.ingest_sessions, a.users, a.per, a.queries, a.shard_users = 1, 4, 40, 50, 256, 40
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from memkern.distributed import ensure_ray

    ensure_ray(num_cpus=max(a.workers), runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})
    import harness

    sessions = _sessions(a.ingest_users, a.ingest_sessions)
    cmd = "OMP_NUM_THREADS=1 python bench/bench_ray.py " + " ".join(argv if argv is not None else sys.argv[1:])
    res = dict(users=a.users, per=a.per, queries=a.queries, machine=harness.machine_info(), command=cmd.strip())
    res["ingest"] = bench_ingest(a.workers, sessions, batch=4)
    res["search"] = bench_search(a.workers, a.users, a.per, a.queries)
    res["per_shard"] = per_shard_figures(a.shard_users, a.per)
    res["plan"] = plan(res["per_shard"], res["search"])
    md = format_md(res)
    print(md)
    js = Path(a.json) if a.json else Path(__file__).resolve().parent / "results" / "ray.json"
    js.parent.mkdir(parents=True, exist_ok=True)
    js.write_text(json.dumps(res, indent=1, default=str))
    if a.write_section:
        import report

        p = report.write_section("ray", "Scale-out on Ray (`bench/bench_ray.py`)", md, res["command"], res["machine"],
                                 raw_json="bench/results/ray.json")
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
