"""Many small namespaces: one memkern store vs the layouts users build with the peers.

A multi-tenant memory keeps many small namespaces (one per user). Compared here, like for like,
interleaved through ``bench/harness.py``:

* **memkern**: one :class:`~memkern.store.MemoryStore`, one namespace per tenant (each namespace up
  to ``flat_limit`` records is an exact scan), under ``fsync="always"`` (the default) and ``"never"``;
* **hnswlib**: one ``hnswlib.Index`` per namespace (``M=16, ef_construction=200, ef=128``), each
  saved to its own file;
* **faiss**: one ``IndexHNSWFlat`` per namespace (same M, efConstruction, efSearch), each written
  to its own file;
* **chromadb**: one collection for every tenant with the namespace as metadata and a ``where``
  filter on every query (chromadb's own multi-tenant advice; thousands of collections cost a
  SQLite schema row and an index each). Same HNSW settings.

Measured: add throughput (each namespace added as one batch call, namespaces interleaved side by
side), per-namespace single-query p50/p99 (random namespaces, k=10), recall@10 vs an exact scan of
the namespace (asserted: every side >= 0.95, memkern exactly 1.0), bytes per record on disk and
in RAM (RSS growth of a fresh process that opens everything and answers one query) and that open
time (plus first query). Threads: one on every side.

Run: ``OMP_NUM_THREADS=1 python bench/bench_namespaces.py [--namespaces 1000] [--per 20]
[--queries 500] [--json out.json] [--write-section]``. ``MEMKERN_BENCH_PEERS=hnswlib,faiss``
restricts the peers; a missing peer is skipped with a message. Also a part of ``memkern bench``
(``--parts namespaces``).

``--snapshot-stall`` measures instead what a snapshot costs the calls around it, at
``--namespaces`` (10,000 for the issue's figure) x ``--per`` records under ``fsync="always"``: after
a bulk load (every namespace changed since the last snapshot: a full one), one reader thread
(single queries on random namespaces) and one writer thread (``add`` to random namespaces) run for
``--window`` seconds, then ``snapshot(wait=False)`` hands the snapshot to the background thread
(the path of the automatic snapshot: the write that reaches ``snapshot_every`` does the same) while
the threads go on, then ``--window`` seconds more: their p50 / p99 / worst latencies in each window,
the handing-off call's own time, how long the snapshot took and what it wrote; then, with every
namespace clean, ``close()`` after one write, a reopen, and ``close()`` after one more write.
``--write-section`` writes ``bench/sections/namespaces-snapshot.md``.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

import bench_peers as _P  # noqa: E402
from harness import Side, compare, latencies, machine_info, package_version, to_jsonable  # noqa: E402
from harness import peers_available as _peers_available, require_peers  # noqa: E402

D = 384
K = 10
M_, EFC, EF = 16, 200, 128
SEED = 100


def make_data(n_ns: int, per: int, seed: int = 0) -> np.ndarray:
    """``[n_ns * per, D]`` float32 random unit vectors; namespace ``i`` holds rows ``i*per:(i+1)*per``."""
    x = np.random.default_rng(seed).standard_normal((n_ns * per, D), dtype=np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def exact_in_ns(x: np.ndarray, per: int, ns: np.ndarray, q: np.ndarray, k: int = K) -> np.ndarray:
    """Exact top-k global positions of each query within its namespace (``-1`` past ``per``)."""
    rows = x.reshape(-1, per, D)[ns]                     # [Q, per, D]
    sc = np.einsum("qd,qpd->qp", q, rows)                # [Q, per]
    order = np.argsort(-sc, axis=1, kind="stable")[:, :k]
    out = np.full((len(q), k), -1, np.int64)
    out[:, :order.shape[1]] = ns[:, None] * per + order
    return out


def recall(got: np.ndarray, exact: np.ndarray) -> float:
    return float(np.mean([len(set(g[g >= 0].tolist()) & set(e[e >= 0].tolist())) / max(1, (e >= 0).sum())
                          for g, e in zip(got, exact)]))


def dir_bytes(p: Path) -> int:
    p = Path(p)
    return p.stat().st_size if p.is_file() else sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def ns_name(i: int) -> str:
    return f"user-{i:06d}"


# ============================================================================ sides
class Memkern:
    def __init__(self, fsync="always"):
        self.fsync = fsync
        self.name = f"memkern[{fsync}]"
        self.layout = "one store, one namespace per tenant (exact scan up to flat_limit=1024)"

    def version(self):
        return package_version("memkern")

    def open(self, path: Path, n_ns: int, per: int):
        from memkern.store import MemoryStore

        self.path = Path(path)
        self.s = MemoryStore(self.path, dim=D, metric="ip", fsync=self.fsync, M=M_, ef_construction=EFC,
                             ef_search=EF, num_threads=1)
        self.pos = np.full(2 * n_ns * per + 16, -1, np.int64)
        self.per = per
        return self

    def add_ns(self, i: int, x: np.ndarray):
        ids = self.s.add_batch(ns_name(i), [f"r{i}.{j}" for j in range(len(x))], x)
        self.pos[ids] = np.arange(i * self.per, i * self.per + len(x))

    def search(self, i: int, q: np.ndarray) -> np.ndarray:
        ids, _ = self.s.search(ns_name(i), q, k=K)
        return np.where(ids >= 0, self.pos[np.maximum(ids, 0)], -1)

    def count(self) -> int:
        return sum(self.s.count(n) for n in self.s.namespaces())

    def save(self):
        self.s.close()
        np.save(self.path.parent / (self.path.name + ".pos.npy"), self.pos)

    def close(self):
        if not self.s.closed:
            self.s.close()

    REOPEN = r"""
from memkern.store import MemoryStore
mark()
s = MemoryStore(PATH)
opened()
ids, _ = s.search("user-%06d" % NS, Q, k=10)
assert (ids >= 0).any()
"""


class Hnswlib(_P.Peer):
    name = "hnswlib"
    layout = "one hnswlib.Index per namespace, one file each"

    module, package = "hnswlib", "hnswlib"   # available() and version() from bench_peers.Peer

    def open(self, path: Path, n_ns: int, per: int):
        import hnswlib

        self.hnswlib, self.path, self.per, self.ix = hnswlib, Path(str(path) + ".hnsw"), per, {}
        self.path.mkdir(parents=True, exist_ok=True)
        return self

    def add_ns(self, i: int, x: np.ndarray):
        ix = self.hnswlib.Index(space="ip", dim=D)
        ix.init_index(max_elements=len(x), M=M_, ef_construction=EFC, random_seed=SEED)
        ix.set_ef(EF)
        ix.set_num_threads(1)
        ix.add_items(x, np.arange(i * self.per, i * self.per + len(x)), num_threads=1)
        self.ix[i] = ix

    def search(self, i: int, q: np.ndarray) -> np.ndarray:
        ix = self.ix[i]
        k = min(K, ix.get_current_count())
        lab = ix.knn_query(q, k=k, num_threads=1)[0].astype(np.int64)
        return np.pad(lab, ((0, 0), (0, K - k)), constant_values=-1)

    def count(self) -> int:
        return sum(ix.get_current_count() for ix in self.ix.values())

    def save(self):
        for i, ix in self.ix.items():
            ix.save_index(str(self.path / f"{i}.bin"))

    def close(self):
        self.ix = {}

    REOPEN = r"""
import os, hnswlib
mark()
IX = {}
for f in os.listdir(PATH):
    ix = hnswlib.Index(space="ip", dim=Q.shape[1])
    ix.load_index(os.path.join(PATH, f))
    ix.set_ef(128)
    IX[int(f.split(".")[0])] = ix
opened()
lab, _ = IX[NS].knn_query(Q, k=10, num_threads=1)
"""


class Faiss(_P.Peer):
    name = "faiss"
    layout = "one faiss.IndexHNSWFlat per namespace, one file each"

    module, package = "faiss", "faiss-cpu"   # available() and version() from bench_peers.Peer

    def open(self, path: Path, n_ns: int, per: int):
        import faiss

        faiss.omp_set_num_threads(1)
        self.faiss, self.path, self.per, self.ix = faiss, Path(str(path) + ".faiss"), per, {}
        self.path.mkdir(parents=True, exist_ok=True)
        return self

    def add_ns(self, i: int, x: np.ndarray):
        ix = self.faiss.IndexHNSWFlat(D, M_, self.faiss.METRIC_INNER_PRODUCT)
        ix.hnsw.efConstruction = EFC
        ix.hnsw.efSearch = EF
        ix.add(x)
        self.ix[i] = ix

    def search(self, i: int, q: np.ndarray) -> np.ndarray:
        lab = self.ix[i].search(q, K)[1].astype(np.int64)
        return np.where(lab >= 0, lab + i * self.per, -1)

    def count(self) -> int:
        return sum(ix.ntotal for ix in self.ix.values())

    def save(self):
        for i, ix in self.ix.items():
            self.faiss.write_index(ix, str(self.path / f"{i}.faiss"))

    def close(self):
        self.ix = {}

    REOPEN = r"""
import os, faiss
faiss.omp_set_num_threads(1)
mark()
IX = {}
for f in os.listdir(PATH):
    ix = faiss.read_index(os.path.join(PATH, f))
    ix.hnsw.efSearch = 128
    IX[int(f.split(".")[0])] = ix
opened()
_, lab = IX[NS].search(Q, 10)
"""


class Chroma(_P.Peer):
    name = "chromadb"
    layout = "one PersistentClient collection for all tenants, namespace as metadata + `where` filter"

    module, package = "chromadb", "chromadb"   # available() and version() from bench_peers.Peer

    def open(self, path: Path, n_ns: int, per: int):
        import chromadb

        self.path, self.per = Path(str(path) + ".chroma"), per
        self.client = chromadb.PersistentClient(path=str(self.path))
        cfg = {"hnsw": {"space": "ip", "max_neighbors": M_, "ef_construction": EFC, "ef_search": EF}}
        self.col = self.client.create_collection("tenants", configuration=cfg, embedding_function=None)
        return self

    def add_ns(self, i: int, x: np.ndarray):
        a = i * self.per
        self.col.add(ids=[str(a + j) for j in range(len(x))], embeddings=x,
                     documents=[f"r{i}.{j}" for j in range(len(x))], metadatas=[{"ns": i}] * len(x))

    def search(self, i: int, q: np.ndarray) -> np.ndarray:
        r = self.col.query(query_embeddings=q, n_results=K, where={"ns": i}, include=[])
        return np.array([[int(t) for t in row] + [-1] * (K - len(row)) for row in r["ids"]], np.int64)

    def count(self) -> int:
        return self.col.count()

    def save(self):
        pass  # persisted on every call

    def close(self):
        pass

    REOPEN = r"""
import chromadb
mark()
c = chromadb.PersistentClient(path=PATH)
col = c.get_collection("tenants")
opened()
r = col.query(query_embeddings=Q, n_results=10, where={"ns": NS}, include=[])
"""


PEER_CLASSES = (Hnswlib, Faiss, Chroma)


def peers_available(log=print) -> list:
    """Peer classes that are installed, restricted to ``MEMKERN_BENCH_PEERS`` (comma list) when set."""
    return _peers_available(PEER_CLASSES, log)


# ============================================================================ measurements
REOPEN_HEAD = _P.REOPEN_HEAD + "NS = int(sys.argv[3])\n"   # the peers' reopen script + the namespace queried
REOPEN_TAIL = _P.REOPEN_TAIL


def run(n_ns: int = 1000, per: int = 20, n_queries: int = 500, rounds: int = 5, log=print,
        tmp: Path | None = None) -> dict:
    """The whole comparison; returns the raw numbers (:func:`format_tables` makes the tables)."""
    if n_ns < rounds + 1 or per < 1 or n_queries < 1:
        raise ValueError(f"n_ns, per, n_queries: expected n_ns >= rounds + 1 = {rounds + 1}, per >= 1, "
                         f"n_queries >= 1, got {n_ns}, {per}, {n_queries}")
    import torch

    torch.set_num_threads(1)
    classes = require_peers(peers_available(log), "namespaces")
    own_tmp = tmp is None
    tmp = Path(tempfile.mkdtemp(prefix="memkern-ns-")) if own_tmp else Path(tmp)
    x = make_data(n_ns, per)
    rng = np.random.default_rng(1)
    qns = rng.integers(0, n_ns, n_queries)
    q = make_data(n_queries, 1, seed=2)
    exact = exact_in_ns(x, per, qns, q)
    n = n_ns * per
    res: dict = {"machine": machine_info(), "namespaces": n_ns, "per": per, "records": n, "queries": n_queries,
                 "dim": D, "k": K, "M": M_, "ef_construction": EFC, "ef": EF,
                 "peers": {c.name: c().version() for c in classes},
                 "skipped": [c.name for c in PEER_CLASSES if c not in classes]}
    try:
        sides = [Memkern("always").open(tmp / "mk-always", n_ns, per), Memkern("never").open(tmp / "mk-never", n_ns, per)]
        sides += [c().open(tmp / c.name, n_ns, per) for c in classes]
        res["layouts"] = {p.name: p.layout for p in sides}
        # ---- add: one harness round = the next block of namespaces on every side (first block: warm-up)
        block = -(-n_ns // (rounds + 1))
        nxt = {p.name: 0 for p in sides}

        def adder(p):
            def fn():
                a = nxt[p.name]
                for i in range(a, min(a + block, n_ns)):
                    p.add_ns(i, x[i * per:(i + 1) * per])
                nxt[p.name] = min(a + block, n_ns)
                return nxt[p.name]
            return fn

        log(f"add: {n_ns} namespaces x {per} records, blocks of {block} namespaces ...")
        c = compare(*[Side(p.name, adder(p), threads=1) for p in sides], check=lambda a, b: a == b,
                    rounds=-(-n_ns // block) - 1, warmup=1, label="add, one batch call per namespace")
        for p in sides:
            assert p.count() == n, (p.name, p.count(), n)
        res["add"] = {"comparison": c, "block_records": block * per,
                      "per_s": {s.name: block * per / s.median for s in c.sides}}
        # ---- recall vs exact (asserted)
        got = {p.name: np.concatenate([p.search(int(i), q[j:j + 1]) for j, i in enumerate(qns)]) for p in sides}
        res["recall"] = {k: recall(v, exact) for k, v in got.items()}
        for p in sides:
            lim = 1.0 if p.name.startswith("memkern") else 0.95
            r = res["recall"][p.name]
            assert r >= lim - 1e-12, f"{p.name}: recall@10 vs an exact scan of the namespace {r:.4f} < {lim}"
        res["same_as_exact"] = {k: float(np.mean(v == exact)) for k, v in got.items()}
        # ---- per-namespace single-query latency
        base = [sides[0]] + sides[2:]
        sides[1].close()
        log("per-namespace single queries ...")

        def call(p):
            return lambda side, j: p.search(int(qns[j]), q[j:j + 1])

        def check(a, b):  # both sides return (almost) the same top-10 (all of it when a namespace holds < 10)
            sa, sb = set(a[0][a[0] >= 0].tolist()), set(b[0][b[0] >= 0].tolist())
            assert len(sa & sb) >= min(8, len(sa), len(sb)) and len(sa) == len(sb), (a, b)

        res["query"] = latencies(*[Side(p.name, None, threads=1) for p in base], calls=[call(p) for p in base],
                                 n=n_queries, warmup=10, label="single query on a random namespace", check=check)
        # ---- disk, reopen in a fresh process, RAM
        log("reopen in fresh processes ...")
        for p in base:
            p.save()
        res["disk_bytes_per_record"] = {p.name: dir_bytes(p.path) / n for p in base}
        qf = tmp / "q1.npy"
        np.save(qf, q[:1])
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        rows = {p.name: [] for p in base}

        def runner(p):
            def fn():
                out = subprocess.run([sys.executable, "-c", REOPEN_HEAD + p.REOPEN + REOPEN_TAIL, str(p.path), str(qf),
                                      str(int(qns[0]))], capture_output=True, text=True, env=env)
                if out.returncode != 0:
                    raise RuntimeError(f"reopen of {p.name} failed: {out.stderr[-2000:]}")
                r = json.loads(out.stdout.strip().splitlines()[-1])
                rows[p.name].append(r)
                return r
            return fn

        ro_rounds = 3
        c = compare(*[Side(p.name, runner(p), threads=1) for p in base], check=None, rounds=ro_rounds, warmup=1,
                    label="open + first query in a fresh process (each side's own answer is checked in-process)")
        res["reopen"] = {"comparison": c, "in_process": {
            k: {m: float(np.median([r[m] for r in rs[-ro_rounds:]])) for m in rs[0]} for k, rs in rows.items()}}
        for p in base:
            p.close()
    finally:
        if own_tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    return res


# ============================================================================ tables
def _verdict(ratio: float) -> str:
    """ratio = memkern / peer, lower is better."""
    if not np.isfinite(ratio):
        return ""
    if 0.95 <= ratio <= 1.05:
        return "on par"
    return "**memkern behind**" if ratio > 1.05 else "memkern ahead"


def _paired(c, a: str, b: str) -> float:
    return float(np.median([x / y for x, y in zip(c.side(a).times, c.side(b).times)]))


def format_tables(res: dict) -> str:
    mk = "memkern[always]"
    peers = [p for p in ("hnswlib", "faiss", "chromadb") if p in res["peers"]]
    L = [f"{res['namespaces']:,} namespaces x {res['per']} records = {res['records']:,} records x {res['dim']}-d "
         f"(random unit vectors), {res['queries']} single queries (k = {res['k']}) on random namespaces; "
         f"HNSW settings on every side that builds a graph: M = {res['M']}, ef_construction = "
         f"{res['ef_construction']}, ef = {res['ef']}. Threads: one on every side (hnswlib `num_threads=1`, "
         f"faiss `omp_set_num_threads(1)`, memkern `num_threads=1`; chromadb has no thread setting). Peers: "
         + ", ".join(f"{k} {v}" for k, v in res["peers"].items())
         + (f"; skipped: {', '.join(res['skipped'])}" if res["skipped"] else "") + ".", "",
         "Layouts: " + "; ".join(f"{k}: {v}" for k, v in res["layouts"].items()) + ". Durability: memkern[always] "
         "fsyncs every add call, memkern[never] on close; hnswlib and faiss keep nothing on disk until saved; "
         "chromadb logs every add to its SQLite.", "",
         "Ratios are memkern[always] time (or bytes) / peer, the median of paired interleaved rounds for "
         "throughput (< 1: memkern faster or smaller).", "",
         "| measure | memkern[always] | " + " | ".join(peers) + " | memkern / peer |",
         "|---|---|" + "---|" * len(peers) + "---|"]

    behind: list[str] = []

    def row(label, mk_val, peer_vals, ratios):
        L.append(f"| {label} | {mk_val} | " + " | ".join(peer_vals) + " | "
                 + "; ".join(f"{p}: {r:.2f} ({_verdict(r)})" for p, r in ratios) + " |")
        behind.extend(f"{label.split(' (')[0]} vs {p} ({r:.2f}x)" for p, r in ratios if np.isfinite(r) and r > 1.05)

    a = res["add"]
    c = a["comparison"]
    row(f"add, one batch call per namespace (records/s; CPU/wall {c.side(mk).cpu_per_wall:.2f})",
        f"{a['per_s'][mk]:,.0f}", [f"{a['per_s'][p]:,.0f}" for p in peers], [(p, _paired(c, mk, p)) for p in peers])
    mn = "memkern[never]"
    if mn in a["per_s"]:
        row("... memkern with fsync=never (records/s)", f"{a['per_s'][mn]:,.0f}", ["" for _ in peers],
            [(p, _paired(c, mn, p)) for p in peers])
    qq = res["query"]
    for key, lab in (("p50_s", "p50"), ("p99_s", "p99")):
        row(f"per-namespace single query {lab} (us)", f"{1e6 * qq[mk][key]:,.1f}",
            [f"{1e6 * qq[p][key]:,.1f}" for p in peers], [(p, qq[mk][key] / qq[p][key]) for p in peers])
    rc, se = res["recall"], res["same_as_exact"]
    L.append(f"| recall@10 vs an exact scan of the namespace (same ids and order) | {rc[mk]:.4f} ({se[mk]:.4f}) | "
             + " | ".join(f"{rc[p]:.4f} ({se[p]:.4f})" for p in peers) + " | asserted: memkern 1.0, peers >= 0.95 |")
    db = res["disk_bytes_per_record"]
    row("bytes per record on disk", f"{db[mk]:,.0f}", [f"{db[p]:,.0f}" for p in peers], [(p, db[mk] / db[p]) for p in peers])
    ro = res["reopen"]["in_process"]
    n = res["records"]
    ram = {k: v["rss_bytes"] / n for k, v in ro.items()}
    row("bytes per record in RAM (RSS growth over open + first query, fresh process)", f"{ram[mk]:,.0f}",
        [f"{ram[p]:,.0f}" for p in peers], [(p, ram[mk] / ram[p]) for p in peers])
    row("open + first query, fresh process (ms, after imports)", f"{1e3 * ro[mk]['open_first_query_s']:,.1f}",
        [f"{1e3 * ro[p]['open_first_query_s']:,.1f}" for p in peers],
        [(p, ro[mk]["open_first_query_s"] / ro[p]["open_first_query_s"]) for p in peers])
    L += ["", f"The raw vectors alone are {4 * res['dim']:,} bytes per record. Open times are medians of "
          f"{len(res['reopen']['comparison'].side(mk).times)} fresh processes per side, interleaved.", "",
          "**Where memkern is behind** (ratio > 1.05): " + ("; ".join(behind) if behind else "nowhere in this run") + "."]
    return "\n".join(L)


# ============================================================================ snapshot stall
def run_snapshot_stall(n_ns: int = 10_000, per: int = 20, window_s: float = 3.0, log=print,
                       tmp: Path | None = None) -> dict:
    """Latency of concurrent calls before, during and after a background snapshot of every
    namespace, and close() times (see the module docstring). Returns the raw numbers."""
    import threading
    import time

    from memkern.store import MemoryStore

    own_tmp = tmp is None
    tmp = Path(tempfile.mkdtemp(prefix="memkern-snapstall-")) if own_tmp else Path(tmp)
    path = tmp / "s"
    rng = np.random.default_rng(0)
    x = make_data(n_ns, per)
    res: dict = {"machine": machine_info(), "namespaces": n_ns, "per": per, "dim": D, "fsync": "always",
                 "window_s": window_s, "version": package_version("memkern")}
    try:
        s = MemoryStore(path, dim=D, metric="ip", fsync="always", snapshot_every=0, num_threads=1)
        log(f"bulk load: {n_ns} namespaces x {per} records (fsync=always) ...")
        t0 = time.perf_counter()
        for i in range(n_ns):
            s.add_batch(ns_name(i), [f"r{i}.{j}" for j in range(per)], x[i * per:(i + 1) * per])
        res["load_s"] = time.perf_counter() - t0
        lat = {"read": [], "write": []}   # (start time, seconds)
        stop = threading.Event()
        q = make_data(256, 1, seed=3)
        w_vec = make_data(256, 1, seed=4)

        def reader():
            r = np.random.default_rng(1)
            k = 0
            while not stop.is_set():
                a = time.perf_counter()
                s.search(ns_name(int(r.integers(n_ns))), q[k % 256], k=10)
                lat["read"].append((a, time.perf_counter() - a))
                k += 1

        def writer():
            r = np.random.default_rng(2)
            k = 0
            while not stop.is_set():
                a = time.perf_counter()
                s.add(ns_name(int(r.integers(n_ns))), f"w{k}", w_vec[k % 256])
                lat["write"].append((a, time.perf_counter() - a))
                k += 1
                time.sleep(0.002)  # a writer that is not saturating the disk by itself

        threads = [threading.Thread(target=reader), threading.Thread(target=writer)]
        for t in threads:
            t.start()
        time.sleep(window_s)
        t_trig = time.perf_counter()
        s.snapshot(wait=False)  # the background thread snapshots all n_ns namespaces from here
        t_ret = time.perf_counter()
        s._native.wait_snapshot()
        t_done = time.perf_counter()
        time.sleep(window_s)
        stop.set()
        for t in threads:
            t.join()
        t_end = time.perf_counter()
        assert s._native.generation == 1 and not s.last_snapshot_error, s.last_snapshot_error
        assert t_done - t_trig > 0.01, "the snapshot did not run in the window"
        res["trigger_call_s"] = t_ret - t_trig
        res["background_snapshot_s"] = t_done - t_trig
        res["snapshot_stats"] = dict(s._native.last_snapshot_stats)
        windows = {"before": (t_trig - window_s, t_trig), "during": (t_trig, t_done), "after": (t_done, t_end)}
        res["windows"] = {}
        for wname, (lo, hi) in windows.items():
            row = {}
            for kind, xs in lat.items():
                d = np.array([dt for a, dt in xs if lo <= a < hi] or [np.nan])
                row[kind] = {"calls": int(np.isfinite(d).sum()), "max_ms": 1e3 * float(np.nanmax(d)),
                             "p99_ms": 1e3 * float(np.nanpercentile(d, 99)), "p50_ms": 1e3 * float(np.nanmedian(d))}
            res["windows"][wname] = row
        snap = next(path.glob("snap-*"))
        res["snapshot_files"] = sorted(f.name for f in snap.iterdir())
        res["snapshot_bytes"] = dir_bytes(snap)
        # close() after one write (incremental: one namespace), reopen, and again
        s.snapshot()  # the writer thread changed many namespaces: start from a clean store
        s.add(ns_name(5), "one more", w_vec[0])
        a = time.perf_counter()
        s.close()
        res["close_after_one_write_s"] = time.perf_counter() - a
        a = time.perf_counter()
        s = MemoryStore(path)
        res["open_s"] = time.perf_counter() - a
        s.add(ns_name(7), "one more", w_vec[1])
        a = time.perf_counter()
        s.close()
        res["close_after_reopen_and_one_write_s"] = time.perf_counter() - a
        res["files_after"] = sorted(f.name for f in next(path.glob("snap-*")).iterdir())
    finally:
        if own_tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    return res


def format_snapshot_stall(res: dict) -> str:
    w = res["windows"]
    st = res["snapshot_stats"]
    L = [f"{res['namespaces']:,} namespaces x {res['per']} records x {res['dim']}-d, `fsync=\"always\"`, one store. "
         f"A reader thread (single queries, k = 10, random namespaces) and a writer thread (`add` to random "
         f"namespaces, 2 ms apart) run for {res['window_s']:.0f} s after a bulk load, then `snapshot(wait=False)` "
         f"hands the snapshot of all {res['namespaces']:,} namespaces (all changed since the last one: a full "
         "snapshot) to the background thread, as the write that reaches `snapshot_every` does, while the threads "
         f"go on, then {res['window_s']:.0f} s more. Latencies are per call, from the calling thread (GIL, "
         "scheduling and disk contention included).", "",
         "| window | reads | read p50 / p99 / max (ms) | writes | write p50 / p99 / max (ms) |", "|---|---|---|---|---|"]
    for name in ("before", "during", "after"):
        r, wr = w[name]["read"], w[name]["write"]
        L.append(f"| {name} the snapshot | {r['calls']:,} | {r['p50_ms']:.2f} / {r['p99_ms']:.2f} / {r['max_ms']:.1f} | "
                 f"{wr['calls']:,} | {wr['p50_ms']:.2f} / {wr['p99_ms']:.2f} / {wr['max_ms']:.1f} |")
    L += ["", f"- The call that handed the snapshot over returned in {1e3 * res['trigger_call_s']:.1f} ms; the "
          f"background snapshot took {res['background_snapshot_s']:.2f} s and wrote {len(res['snapshot_files'])} "
          f"files ({', '.join(res['snapshot_files'])}; {res['snapshot_bytes'] / 1e6:.0f} MB).",
          f"- Locks the snapshot held (measured inside it): the writer lock {1e3 * st['rotation_hold_s']:.2f} ms to "
          f"rotate the log and {1e3 * st['switch_hold_s']:.2f} ms to switch generations; the reader lock at most "
          f"{1e3 * st['max_batch_hold_s']:.2f} ms per batch of namespace copies ({st['batches']:,} batches, "
          f"{st['copied']:,} namespaces; {st['copied_by_writers']:,} of them copied first by a write that reached "
          "them before the snapshot did). So a read waits at most the writer-lock holds for the snapshot, a write at "
          "most one batch; the rest of the latency above is the machine's (scheduling, the GIL, the disk).",
          f"- `close()` after one more write: {1e3 * res['close_after_one_write_s']:.0f} ms; reopen "
          f"{res['open_s']:.2f} s; `close()` after a write in the reopened store: "
          f"{1e3 * res['close_after_reopen_and_one_write_s']:.0f} ms (each writes one namespace's blob, the "
          "manifest, and hard links).",
          f"- Bulk load of {res['namespaces']:,} namespaces (one `add_batch` each, fsync each): {res['load_s']:.1f} s."]
    return "\n".join(L)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--namespaces", type=int, default=1000)
    ap.add_argument("--per", type=int, default=20)
    ap.add_argument("--queries", type=int, default=500)
    ap.add_argument("--snapshot-stall", action="store_true",
                    help="measure the calls around a background snapshot and close() instead (see the docstring)")
    ap.add_argument("--window", type=float, default=3.0, help="--snapshot-stall: seconds before and after")
    ap.add_argument("--json", default=None, help="raw numbers (default bench/results/namespaces.json)")
    ap.add_argument("--write-section", action="store_true",
                    help="write bench/sections/namespaces.md (then `memkern bench --assemble`)")
    a = ap.parse_args(argv)
    if a.snapshot_stall:
        res = run_snapshot_stall(a.namespaces, a.per, a.window)
        md = format_snapshot_stall(res)
        print(md)
        js = Path(a.json) if a.json else Path(__file__).resolve().parent / "results" / "namespaces-snapshot.json"
        js.parent.mkdir(parents=True, exist_ok=True)
        js.write_text(json.dumps(to_jsonable(res), indent=1, default=str))
        if a.write_section:
            import report

            cmd = (f"OMP_NUM_THREADS=1 python bench/bench_namespaces.py --snapshot-stall --namespaces {a.namespaces} "
                   f"--per {a.per} --window {a.window:g} --write-section")
            p = report.write_section("namespaces-snapshot", "Snapshots off the write path at many namespaces "
                                     "(`bench/bench_namespaces.py --snapshot-stall`)", md, cmd, res["machine"],
                                     raw_json="bench/results/namespaces-snapshot.json")
            print(f"wrote {p}")
        return 0
    if a.per < K:
        ap.error(f"--per: expected at least {K} records per namespace (the peers answer top-{K}), got {a.per}")
    res = run(a.namespaces, a.per, a.queries)
    md = format_tables(res)
    print(md)
    js = Path(a.json) if a.json else Path(__file__).resolve().parent / "results" / "namespaces.json"
    js.parent.mkdir(parents=True, exist_ok=True)
    js.write_text(json.dumps(to_jsonable(res), indent=1, default=str))
    if a.write_section:
        import report

        cmd = (f"OMP_NUM_THREADS=1 python bench/bench_namespaces.py --namespaces {a.namespaces} --per {a.per} "
               f"--queries {a.queries} --write-section")
        p = report.write_section("namespaces", "Many small namespaces vs peers (`bench/bench_namespaces.py`)", md,
                                 cmd, res["machine"], raw_json="bench/results/namespaces.json")
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
