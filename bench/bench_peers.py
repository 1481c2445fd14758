"""memkern's MemoryStore vs the stores users would pick instead: raw hnswlib, faiss IndexHNSWFlat,
chromadb PersistentClient. Like for like, interleaved, through ``bench/harness.py``.

Peers come from the optional extra ``pip install memkern[bench]``; a missing peer is skipped with
a message. Data: clustered 384-d unit vectors (:func:`memkern.data.vectors.clustered_vectors`),
inner-product metric everywhere, fresh query draws from the same clusters.

Table 1, same settings (M, ef_construction, ef and threads equal on every side):

* batched add of N records, interleaved chunk by chunk (each chunk is one harness round), memkern
  under each fsync mode ("always" = the default, "batch", "never");
* one-at-a-time add into fresh, empty stores (memkern per fsync mode; hnswlib and faiss keep
  nothing on disk until saved, chromadb writes to its own SQLite log: durability differs, stated);
* single-query latency p50/p99 (queries alternate side by side);
* batch search at 1 thread and at all cores (every side at the same thread count; memkern through its
  store's ``num_threads``);
* recall@10 vs exact search;
* reopen + first query in a fresh process (raw ``hnswlib.Index.load_index``, ``faiss.read_index``,
  a new ``PersistentClient``), plus RSS growth of that process (RAM per record) and bytes on disk.

Table 2, each with its own defaults (what a user gets without tuning): add throughput, batch search
time and recall@10.

Every comparison asserts that the sides computed the same thing: all sides hold N records and
reach recall@10 within 0.03 of each other (and memkern returns exactly hnswlib's ids at equal
settings, as they build the same graph with the same seed).

Run: ``OMP_NUM_THREADS=1 python bench/bench_peers.py [--quick] [--n N] [--json out.json]
[--write-section]`` (``--write-section`` refreshes ``bench/sections/peers.md``), or the
pytest-benchmark form ``python -m pytest bench/bench_peers.py -q -s`` (MEMKERN_BENCH_N, default 5,000).
``MEMKERN_BENCH_PEERS=hnswlib,faiss`` restricts the peers.
"""
from __future__ import annotations

import argparse
import atexit
import importlib
import json
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

from harness import Side, compare, latencies, machine_info, package_version, to_jsonable  # noqa: E402
from harness import peers_available as _peers_available, require_peers  # noqa: E402

D = 384
K = 10
M_, EFC, EF = 16, 200, 128
SEED = 100
FSYNC_MODES = ("always", "batch", "never")
ALL = os.cpu_count() or 1


# ============================================================================ data and metrics
def make_data(n: int, n_queries: int):
    from memkern.data.vectors import clustered_vectors

    c = max(20, n // 1000)
    return clustered_vectors(n, D, c, seed=0), clustered_vectors(n_queries, D, c, seed=0, sample_seed=1)


def exact_top(q: np.ndarray, x: np.ndarray, k: int = K) -> np.ndarray:
    out = np.empty((len(q), k), dtype=np.int64)
    for s in range(0, len(q), 256):
        sc = q[s:s + 256] @ x.T
        part = np.argpartition(-sc, k, axis=1)[:, :k]
        order = np.argsort(-np.take_along_axis(sc, part, 1), axis=1)
        out[s:s + 256] = np.take_along_axis(part, order, 1)
    return out


def recall(got: np.ndarray, exact: np.ndarray, k: int = K) -> float:
    return float(np.mean([len(set(got[i, :k].tolist()) & set(exact[i, :k].tolist())) / k for i in range(len(got))]))


def dir_bytes(p: Path) -> int:
    p = Path(p)
    return p.stat().st_size if p.is_file() else sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


# ============================================================================ peers
class Peer:
    """Uniform face of one store: build/add/search/save and a fresh-process reopen script.
    Search returns positions into the data (int64 ``[B, k]``)."""

    name = "?"
    durable = ""
    module: str | None = None   # import name of a third-party peer (None: always available)
    package: str | None = None  # distribution whose version is reported

    def __init__(self, M=M_, efc=EFC, ef=EF, threads=1, defaults=False):
        self.M, self.efc, self.ef, self.threads, self.defaults = M, efc, ef, threads, defaults

    def search_raw(self, q, k=K):
        """The store's own search call for ``q`` (what single-query latency times)."""
        return self.search(q, k)

    def positions(self, raw) -> np.ndarray:
        """``search_raw``'s result as positions into the data (int64 ``[B, k]``)."""
        return raw

    def available(self) -> str | None:  # None if usable, else the reason
        if self.module is not None:
            try:
                importlib.import_module(self.module)
            except ImportError:
                return f"{self.module} is not installed (pip install memkern[bench])"
        return None

    def version(self) -> str | None:
        return package_version(self.package) if self.package else None


class Memkern(Peer):
    def __init__(self, fsync="always", M=M_, efc=EFC, ef=EF, threads=1, defaults=False):
        self.fsync, self.M, self.efc, self.ef, self.threads, self.defaults = fsync, M, efc, ef, threads, defaults
        self.name = "memkern" if defaults else f"memkern[{fsync}]"
        self.durable = {"always": "fsync per call", "batch": "fsync every 1 s", "never": "fsync on close"}[fsync]

    def version(self):
        return package_version("memkern")

    def open(self, path, n_max):
        from memkern.store import MemoryStore

        kw = {} if self.defaults else dict(M=self.M, ef_construction=self.efc, ef_search=self.ef, num_threads=self.threads)
        self.path = Path(path)
        self.s = MemoryStore(self.path, dim=D, metric="ip", fsync=self.fsync, **kw)
        self.pos = np.full(4 * n_max + 16, -1, np.int64)
        self.n = 0
        return self

    def add_batch(self, x, start):
        ids = self.s.add_batch("bench", [f"record {start + i}" for i in range(len(x))], x)
        self.pos[ids] = np.arange(start, start + len(x))
        self.n += len(x)

    def add_one(self, v, i):
        rid = self.s.add("bench", f"record {i}", v)
        self.pos[rid] = i
        self.n += 1

    def set_threads(self, threads: int) -> None:
        """Reopen the store with ``num_threads=threads`` (the store's search threads are an open-time
        setting; the graph and so the results do not change)."""
        if threads == self.threads:
            return
        from memkern.store import MemoryStore

        self.s.close()
        self.s = MemoryStore(self.path, fsync=self.fsync, num_threads=threads,
                             **({} if self.defaults else {"ef_search": self.ef}))
        self.threads = threads

    def search(self, q, k=K, threads=1):
        return self.positions(self.s.search("bench", q, k=k))

    def search_raw(self, q, k=K):
        return self.s.search("bench", q, k=k)

    def positions(self, raw):
        ids = raw[0]
        return np.where(ids >= 0, self.pos[np.maximum(ids, 0)], -1)

    def count(self):
        return self.s.count("bench")

    def save(self):
        self.s.close()
        np.save(self.path.parent / (self.path.name + ".pos.npy"), self.pos)

    def close(self):
        if not self.s.closed:
            self.s.close()

    REOPEN = r"""
import numpy as np
from memkern.store import MemoryStore
mark()
s = MemoryStore(PATH)
opened()
ids, _ = s.search("bench", Q, k=10)
assert (ids >= 0).all()
"""


class Hnswlib(Peer):
    name = "hnswlib"
    durable = "in memory (save_index to persist)"

    module, package = "hnswlib", "hnswlib"

    def open(self, path, n_max):
        import hnswlib

        self.path = Path(str(path) + ".hnsw")
        self.ix = hnswlib.Index(space="ip", dim=D)
        if self.defaults:
            self.ix.init_index(max_elements=n_max)
        else:
            self.ix.init_index(max_elements=n_max, M=self.M, ef_construction=self.efc, random_seed=SEED)
            self.ix.set_ef(self.ef)
        self.ix.set_num_threads(self.threads)
        return self

    def add_batch(self, x, start):
        self.ix.add_items(x, np.arange(start, start + len(x)), num_threads=self.threads)

    def add_one(self, v, i):
        self.ix.add_items(v[None, :], np.array([i]), num_threads=1)

    def search(self, q, k=K, threads=1):
        return self.positions(self.search_raw(q, k, threads))

    def search_raw(self, q, k=K, threads=1):
        return self.ix.knn_query(q, k=k, num_threads=threads)

    def positions(self, raw):
        return raw[0].astype(np.int64)

    def count(self):
        return self.ix.get_current_count()

    def save(self):
        self.ix.save_index(str(self.path))

    def close(self):
        pass

    REOPEN = r"""
import numpy as np, hnswlib
mark()
ix = hnswlib.Index(space="ip", dim=Q.shape[1])
ix.load_index(PATH)
opened()
lab, _ = ix.knn_query(Q, k=10, num_threads=1)
"""


class Faiss(Peer):
    name = "faiss"
    durable = "in memory (write_index to persist)"

    module, package = "faiss", "faiss-cpu"

    def open(self, path, n_max):
        import faiss

        self.faiss = faiss
        self.path = Path(str(path) + ".faiss")
        # faiss has no default M: 32 is what its documentation and most examples use.
        self.ix = faiss.IndexHNSWFlat(D, 32 if self.defaults else self.M, faiss.METRIC_INNER_PRODUCT)
        if not self.defaults:
            self.ix.hnsw.efConstruction = self.efc
            self.ix.hnsw.efSearch = self.ef
        return self

    def _threads(self, n):
        self.faiss.omp_set_num_threads(n)

    def add_batch(self, x, start):
        self._threads(self.threads)
        self.ix.add(x)

    def add_one(self, v, i):
        self._threads(1)
        self.ix.add(v[None, :])

    def search(self, q, k=K, threads=1):
        return self.positions(self.search_raw(q, k, threads))

    def search_raw(self, q, k=K, threads=1):
        self._threads(threads)
        return self.ix.search(q, k)

    def positions(self, raw):
        return raw[1].astype(np.int64)

    def count(self):
        return self.ix.ntotal

    def save(self):
        self.faiss.write_index(self.ix, str(self.path))

    def close(self):
        self._threads(1)

    REOPEN = r"""
import numpy as np, faiss
faiss.omp_set_num_threads(1)
mark()
ix = faiss.read_index(PATH)
opened()
_, lab = ix.search(Q, 10)
"""


class Chroma(Peer):
    name = "chromadb"
    durable = "SQLite log per call (its own settings)"

    module, package = "chromadb", "chromadb"

    def open(self, path, n_max):
        import chromadb

        self.path = Path(str(path) + ".chroma")
        self.client = chromadb.PersistentClient(path=str(self.path))
        cfg = {"hnsw": {"space": "ip"}} if self.defaults else {
            "hnsw": {"space": "ip", "max_neighbors": self.M, "ef_construction": self.efc, "ef_search": self.ef}}
        self.col = self.client.create_collection("bench", configuration=cfg, embedding_function=None)
        return self

    def add_batch(self, x, start):
        for s in range(0, len(x), 5000):  # chromadb caps one add at its max batch size
            xs = x[s:s + 5000]
            self.col.add(ids=[str(start + s + i) for i in range(len(xs))], embeddings=xs,
                         documents=[f"record {start + s + i}" for i in range(len(xs))])

    def add_one(self, v, i):
        self.col.add(ids=[str(i)], embeddings=v[None, :], documents=[f"record {i}"])

    def search(self, q, k=K, threads=1):
        return self.positions(self.search_raw(q, k))

    def search_raw(self, q, k=K, threads=1):
        return self.col.query(query_embeddings=q, n_results=k, include=[])

    def positions(self, raw, k=K):
        return np.array([[int(i) for i in row] + [-1] * (k - len(row)) for row in raw["ids"]], np.int64)

    def count(self):
        return self.col.count()

    def save(self):
        pass  # persisted on every call

    def close(self):
        pass

    REOPEN = r"""
import numpy as np, chromadb
mark()
c = chromadb.PersistentClient(path=PATH)
col = c.get_collection("bench")
opened()
r = col.query(query_embeddings=Q, n_results=10, include=[])
"""


PEER_CLASSES = (Hnswlib, Faiss, Chroma)


def peers_available(log=print) -> list:
    """Peer classes that are installed, restricted to ``MEMKERN_BENCH_PEERS`` (comma list) when set."""
    return _peers_available(PEER_CLASSES, log)


# ============================================================================ measurements
def _agree(exact, tol=0.03):
    """A check: both sides' searches reach recall@10 within ``tol`` (and >= 0.8)."""
    def check(a, b):
        ra, rb = recall(a, exact), recall(b, exact)
        assert min(ra, rb) >= 0.8 and abs(ra - rb) <= tol, f"recall@10 {ra:.4f} vs {rb:.4f}"
    return check


def batched_add(sides: list, x, q, exact, chunk: int) -> dict:
    """Each side adds the N records chunk by chunk; one harness round = one chunk per side."""
    nxt = {s.name: 0 for s in sides}

    def adder(p):
        def fn():
            a = nxt[p.name]
            p.add_batch(x[a:a + chunk], a)
            nxt[p.name] = a + chunk
            return p
        return fn

    rounds = -(-len(x) // chunk) - 1  # the first chunk is the warm-up
    c = compare(*[Side(p.name, adder(p), threads=p.threads) for p in sides], check=None, rounds=rounds,
                warmup=1, label="batched add")
    for p in sides:
        assert p.count() == len(x), (p.name, p.count())
    res = {p.name: p.search(q) for p in sides}
    for p in sides[1:]:
        _agree(exact)(res[sides[0].name], res[p.name])
    return {"comparison": c, "per_s": {s.name: chunk / s.median for s in c.sides},
            "recall": {p.name: recall(res[p.name], exact) for p in sides}}


def one_at_a_time(classes, tmp: Path, x, per_round: int, rounds: int) -> dict:
    sides_p = [Memkern(f) for f in FSYNC_MODES] + [cls() for cls in classes]
    n = per_round * (rounds + 1)
    for p in sides_p:
        p.open(tmp / f"one-{p.name}", n)
    nxt = {p.name: 0 for p in sides_p}

    def adder(p):
        def fn():
            a = nxt[p.name]
            for i in range(a, a + per_round):
                p.add_one(x[i], i)
            nxt[p.name] = a + per_round
            return p.count()
        return fn

    c = compare(*[Side(p.name, adder(p), threads=1) for p in sides_p], check=lambda a, b: a == b, rounds=rounds,
                warmup=1, label="one-at-a-time add")
    out = {"comparison": c, "per_s": {s.name: per_round / s.median for s in c.sides},
           "durable": {p.name: p.durable for p in sides_p}, "records": n}
    for p in sides_p:
        p.close()
    return out


def single_query(sides: list, q, exact, n: int) -> dict:
    """Only each store's own search call is timed (``search_raw``); its ids are mapped to data
    positions in the check, outside the timing."""
    def call(p):
        return lambda side, j: (p, p.search_raw(q[j:j + 1]))

    def check(a, b):  # per query: the two top-10 lists share most items
        a, b = a[0].positions(a[1]), b[0].positions(b[1])
        assert len(set(a[0].tolist()) & set(b[0].tolist())) >= 5, (a, b)

    out = latencies(*[Side(p.name, None, threads=1) for p in sides], calls=[call(p) for p in sides],
                    n=min(n, len(q)), warmup=10, label="single query", check=check)
    return out


def batch_search(sides: list, q, exact, threads: int, rounds: int) -> dict:
    """Every side answers the whole batch in one call with ``threads`` threads (memkern: its store's
    ``num_threads``, which parallelises a search call once it is worth >= 2**15 distance evaluations)."""
    for p in sides:
        if isinstance(p, Memkern):
            p.set_threads(threads)
    def side_threads(p):  # what each side really runs with: memkern's store setting, chromadb has none
        return p.threads if isinstance(p, Memkern) else ("no setting" if isinstance(p, Chroma) else threads)

    c = compare(*[Side(p.name, (lambda p=p: p.search(q, threads=threads)), threads=side_threads(p))
                  for p in sides], check=_agree(exact), rounds=rounds, warmup=1,
                label=f"batch search, {len(q)} queries, {threads} thread(s)")
    for p in sides:
        if isinstance(p, Memkern):
            p.set_threads(1)
    return {"comparison": c, "qps": {s.name: len(q) / s.median for s in c.sides}, "threads": threads}


REOPEN_HEAD = r"""
import json, sys, time
import numpy as np
PATH = sys.argv[1]
Q = np.load(sys.argv[2])
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096
T = {}
def mark():
    T["r0"] = rss(); T["t0"] = time.perf_counter()
def opened():
    T["t1"] = time.perf_counter(); T["r1"] = rss()
"""
REOPEN_TAIL = r"""
t2 = time.perf_counter()
# RSS after the first query: chromadb loads its index lazily, on the first query
print(json.dumps({"open_s": T["t1"] - T["t0"], "open_first_query_s": t2 - T["t0"], "rss_bytes": rss() - T["r0"],
                  "rss_open_bytes": T["r1"] - T["r0"]}))
"""


def reopen(sides: list, tmp: Path, q, rounds: int) -> dict:
    qf = tmp / "q1.npy"
    np.save(qf, q[:1])
    # Imports from bytecode, as from an installed package (pip compiles it): PYTHONDONTWRITEBYTECODE
    # would make every process compile memkern's sources again; the warm-up round writes the cache.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPYCACHEPREFIX": str(tmp / "pycache")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    rows = {p.name: [] for p in sides}

    def runner(p):
        def fn():
            out = subprocess.run([sys.executable, "-c", REOPEN_HEAD + p.REOPEN + REOPEN_TAIL, str(p.path), str(qf)],
                                 capture_output=True, text=True, env=env)
            if out.returncode != 0:
                raise RuntimeError(f"reopen of {p.name} failed: {out.stderr[-2000:]}")
            r = json.loads(out.stdout.strip().splitlines()[-1])
            rows[p.name].append(r)
            return r
        return fn

    # The harness times the whole subprocess (interpreter start + imports included); the
    # in-process open + first query time is what the table reports (medians of the same rounds).
    c = compare(*[Side(p.name, runner(p), threads=1) for p in sides], check=None, rounds=rounds, warmup=1,
                label="reopen + first query (fresh process)")
    med = {n: {k: float(np.median([r[k] for r in rs[-rounds:]])) for k in rs[0]} for n, rs in rows.items()}
    return {"comparison": c, "in_process": med}


# ============================================================================ suite
def run(n: int = 5000, n_queries: int = 200, quick: bool = True, log=print, tmp: Path | None = None,
        defaults_n: int | None = None) -> dict:
    """The whole comparison; ``defaults_n`` (default ``min(n, 20000)``) sizes the defaults table."""
    import torch

    torch.set_num_threads(1)
    classes = require_peers(peers_available(log), "peers")
    own_tmp = tmp is None
    tmp = Path(tempfile.mkdtemp(prefix="memkern-peers-")) if own_tmp else Path(tmp)
    x, q = make_data(n, n_queries)
    exact = exact_top(q, x)
    chunks = min(20, max(3, n // 250))
    chunk = -(-n // chunks)  # the last chunk may be smaller; the median per chunk is robust to it
    rounds = 5 if quick else 9
    res: dict = {"machine": machine_info(), "n": n, "queries": n_queries, "dim": D, "M": M_,
                 "ef_construction": EFC, "ef": EF, "k": K, "all_threads": ALL,
                 "peers": {c.name: c().version() for c in classes}, "skipped": [c.name for c in PEER_CLASSES if c not in classes]}
    try:
        # ---- table 1: same settings
        sides = [Memkern(f).open(tmp / f"mk-{f}", n) for f in FSYNC_MODES] + [c().open(tmp / c.name, n) for c in classes]
        log(f"batched add of {n} records in chunks of {chunk} ...")
        res["batched_add"] = batched_add(sides, x, q, exact, chunk)
        base = [sides[0]] + sides[3:]  # memkern (fsync always; search does not depend on it) + peers
        for p in sides[1:3]:
            p.close()
        # memkern and hnswlib build the same graph at equal settings with the same seed
        if any(p.name == "hnswlib" for p in base):
            h = next(p for p in base if p.name == "hnswlib")
            res["same_ids_as_hnswlib"] = float(np.mean(base[0].search(q) == h.search(q)))
        log("single-query latency ...")
        res["single_query"] = single_query(base, q, exact, n_queries)
        log("batch search ...")
        res["batch_search_1"] = batch_search(base, q, exact, 1, rounds)
        if ALL > 1:
            res["batch_search_all"] = batch_search(base, q, exact, ALL, rounds)
        res["recall"] = {p.name: recall(p.search(q), exact) for p in base}
        log("one-at-a-time add ...")
        res["one_at_a_time"] = one_at_a_time(classes, tmp, x, per_round=max(1, min(20 if quick else 50, n // (rounds + 1))),
                                             rounds=rounds)
        log("reopen in fresh processes ...")
        for p in base:
            p.save()
        res["disk_bytes_per_record"] = {p.name: dir_bytes(p.path) / n for p in base}
        res["reopen"] = reopen(base, tmp, q, rounds=rounds)
        # ---- table 2: each with its defaults
        dn = min(n, defaults_n or 20000)
        log(f"defaults ({dn} records) ...")
        xd = x[:dn]
        exact_d = exact_top(q, xd)
        dsides = [Memkern(defaults=True).open(tmp / "def-mk", dn)] + [c(defaults=True).open(tmp / f"def-{c.name}", dn)
                                                                      for c in classes]
        d_add = batched_add_nocheck(dsides, xd, -(-dn // min(20, max(3, dn // 250))))
        d_search = compare(*[Side(p.name, (lambda p=p: p.search(q, threads=p.threads)), threads=p.threads)
                             for p in dsides], check=None, rounds=rounds,
                           warmup=1, label="batch search at defaults (recall differs by design: reported)")
        res["defaults"] = {"n": dn, "add": d_add, "search": {"comparison": d_search},
                           "recall": {p.name: recall(p.search(q, threads=p.threads), exact_d) for p in dsides},
                           "settings": {"memkern": "M=16, ef_construction=200, ef_search=128, fsync=always",
                                        "hnswlib": "M=16, ef_construction=200, ef=10, all cores",
                                        "faiss": "M=32 (no default; the usual choice), efConstruction=40, efSearch=16, all cores",
                                        "chromadb": "max_neighbors=16, ef_construction=100, ef_search=100"}}
        for p in dsides:
            p.close()
        for p in base:
            p.close()
    finally:
        if own_tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    return res


def batched_add_nocheck(sides, x, chunk):
    """Defaults table: add throughput only (recall is reported, not asserted equal)."""
    nxt = {s.name: 0 for s in sides}

    def adder(p):
        def fn():
            a = nxt[p.name]
            p.add_batch(x[a:a + chunk], a)
            nxt[p.name] = a + chunk
        return fn

    for p in sides:
        if hasattr(p, "ix") and p.name == "hnswlib":
            p.threads = ALL  # hnswlib's default: every core
        if p.name == "faiss":
            p.threads = ALL
    c = compare(*[Side(p.name, adder(p), threads=getattr(p, "threads", 1)) for p in sides], check=None,
                rounds=-(-len(x) // chunk) - 1, warmup=1, label="batched add at defaults")
    for p in sides:
        assert p.count() == len(x), (p.name, p.count())
    return {"comparison": c, "per_s": {s.name: chunk / s.median for s in c.sides}}


# ============================================================================ tables
def _verdict(ratio: float, lower_is_better: bool = True) -> str:
    """ratio = memkern / peer (times)."""
    if not np.isfinite(ratio):
        return ""
    if 0.95 <= ratio <= 1.05:
        return "on par"
    return ("**memkern behind**" if ratio > 1.05 else "memkern ahead") if lower_is_better else \
        ("**memkern behind**" if ratio < 0.95 else "memkern ahead")


def _num(r: float) -> str:
    return f"{r:.2f}" if r >= 0.1 else f"{r:.3f}"


def _paired(c, a: str, b: str) -> float:
    ta, tb = c.side(a).times, c.side(b).times
    return float(np.median([x / y for x, y in zip(ta, tb)]))


def format_tables(res: dict) -> str:
    n = res["n"]
    L = []
    peers = [p for p in ("hnswlib", "faiss", "chromadb") if p in res["peers"]]
    L.append(f"N = {n:,} records x {res['dim']}-d, {res['queries']} queries, k = {res['k']}, inner product; "
             f"same settings: M = {res['M']}, ef_construction = {res['ef_construction']}, ef = {res['ef']}. "
             f"Peers: " + ", ".join(f"{k} {v}" for k, v in res["peers"].items())
             + (f"; skipped: {', '.join(res['skipped'])}" if res["skipped"] else "") + ".")
    L.append("")
    L.append("Ratios are memkern time / peer time, the median of paired interleaved rounds (< 1: memkern "
             "faster). CPU/wall per side shows starvation (< 1 on a 1-thread side: it waited for a core).")
    L.append("")
    L.append("| measure | memkern | " + " | ".join(peers) + " | memkern / peer (time) |")
    L.append("|---|---|" + "---|" * len(peers) + "---|")

    behind: list[str] = []

    def row(label, mk_val, peer_vals, ratios):
        L.append(f"| {label} | {mk_val} | " + " | ".join(peer_vals) + " | "
                 + "; ".join(f"{p}: {_num(r)} ({_verdict(r)})" for p, r in ratios) + " |")
        behind.extend(f"{label.split(' (')[0]} vs {p} ({_num(r)}x)" for p, r in ratios if np.isfinite(r) and r > 1.05)

    ba = res["batched_add"]
    c = ba["comparison"]
    for f in FSYNC_MODES:
        name = f"memkern[{f}]"
        row(f"batched add, fsync={f} (records/s; CPU/wall {c.side(name).cpu_per_wall:.2f})",
            f"{ba['per_s'][name]:,.0f}",
            [f"{ba['per_s'][p]:,.0f}" if f == "always" else "" for p in peers],
            [(p, _paired(c, name, p)) for p in peers])
    oa = res["one_at_a_time"]
    c = oa["comparison"]
    for f in FSYNC_MODES:
        name = f"memkern[{f}]"
        row(f"one-at-a-time add into a fresh store, fsync={f} (records/s)", f"{oa['per_s'][name]:,.0f}",
            [f"{oa['per_s'][p]:,.0f}" if f == "always" else "" for p in peers],
            [(p, _paired(c, name, p)) for p in peers])
    sq = res["single_query"]
    mk = "memkern[always]"
    row("single query p50 (ms)", f"{1e3 * sq[mk]['p50_s']:.3f}", [f"{1e3 * sq[p]['p50_s']:.3f}" for p in peers],
        [(p, sq[mk]["p50_s"] / sq[p]["p50_s"]) for p in peers])
    row("single query p99 (ms)", f"{1e3 * sq[mk]['p99_s']:.3f}", [f"{1e3 * sq[p]['p99_s']:.3f}" for p in peers],
        [(p, sq[mk]["p99_s"] / sq[p]["p99_s"]) for p in peers])
    for key, label in (("batch_search_1", "batch search, 1 thread (queries/s)"),
                       ("batch_search_all", f"batch search, {res['all_threads']} threads on every side "
                                            "(queries/s)")):
        if key not in res:
            continue
        bs = res[key]
        c = bs["comparison"]
        row(label, f"{bs['qps'][mk]:,.0f}", [f"{bs['qps'][p]:,.0f}" for p in peers], [(p, _paired(c, mk, p)) for p in peers])
        L.append(f"| ... CPU/wall of that batch search | {c.side(mk).cpu_per_wall:.2f} | "
                 + " | ".join(f"{c.side(p).cpu_per_wall:.2f}" for p in peers) + " | |")
        L.append(f"| ... threads of that batch search | {c.side(mk).threads} | "
                 + " | ".join(f"{c.side(p).threads}" for p in peers) + " | |")
    rc = res["recall"]
    L.append(f"| recall@10 vs exact | {rc[mk]:.4f} | " + " | ".join(f"{rc[p]:.4f}" for p in peers) + " | "
             + (f"same ids as hnswlib: {res['same_ids_as_hnswlib']:.4f}" if "same_ids_as_hnswlib" in res else "") + " |")
    ro = res["reopen"]["in_process"]
    row("reopen + first query, fresh process (ms, after imports)", f"{1e3 * ro[mk]['open_first_query_s']:.1f}",
        [f"{1e3 * ro[p]['open_first_query_s']:.1f}" for p in peers],
        [(p, ro[mk]["open_first_query_s"] / ro[p]["open_first_query_s"]) for p in peers])
    c = res["reopen"]["comparison"]
    row("whole reopen process (interpreter + imports from bytecode + open + query, ms)", f"{1e3 * c.side(mk).median:.0f}",
        [f"{1e3 * c.side(p).median:.0f}" for p in peers], [(p, _paired(c, mk, p)) for p in peers])
    db = res["disk_bytes_per_record"]
    row("bytes per record on disk", f"{db[mk]:,.0f}", [f"{db[p]:,.0f}" for p in peers], [(p, db[mk] / db[p]) for p in peers])
    ram = {k: v["rss_bytes"] / n for k, v in ro.items()}
    row("bytes per record in RAM (RSS growth over open + first query)", f"{ram[mk]:,.0f}", [f"{ram[p]:,.0f}" for p in peers],
        [(p, ram[mk] / ram[p]) for p in peers])
    L.append("")
    L.append("Threads per side: every side runs one thread (hnswlib `num_threads=1`, faiss `omp_set_num_threads(1)`, "
             "memkern `num_threads=1`, torch/OMP/MKL pinned to 1) except the row 'batch search, "
             f"{res['all_threads']} threads', where memkern (its store reopened with `num_threads="
             f"{res['all_threads']}`), hnswlib (`num_threads={res['all_threads']}`) and faiss "
             f"(`omp_set_num_threads({res['all_threads']})`) all get {res['all_threads']} at the same ef; chromadb 1.x "
             "exposes no thread setting in its collection configuration (its CPU/wall shows what it used).")
    L.append("")
    L.append("**Where memkern is behind** (same settings, ratio > 1.05): "
             + ("; ".join(behind) if behind else "nowhere in this run") + ".")
    L.append("")
    L.append("Durability of the one-at-a-time adds: " + "; ".join(f"{k}: {v}" for k, v in oa["durable"].items())
             + f". Each side adds {oa['records']} records to an empty store.")
    # defaults
    d = res["defaults"]
    L.append("")
    L.append(f"Each with its own defaults (what a user gets without tuning; recall differs by design), "
             f"{d['n']:,} records:")
    L.append("")
    L.append("| store | settings | batched add (records/s) | batch search (queries/s, 1 call) | recall@10 |")
    L.append("|---|---|---|---|---|")
    for s in d["add"]["comparison"].sides:
        sc = d["search"]["comparison"].side(s.name)
        L.append(f"| {s.name} | {d['settings'][s.name]} | {d['add']['per_s'][s.name]:,.0f} | "
                 f"{res['queries'] / sc.median:,.0f} | {d['recall'][s.name]:.4f} |")
    return "\n".join(L)


# ============================================================================ pytest-benchmark
# Groups: "peers: batched add", "peers: batch search", "peers: single query" (one row per store at
# the same settings), plus the interleaved suite printing the tables (the ratios to trust).
def _bench_n():
    return int(os.environ.get("MEMKERN_BENCH_N", "5000"))


def _sides_for_pytest():
    return [Memkern("always")] + [c() for c in peers_available(log=lambda m: None)]


_PEER_IDS = ["memkern", "hnswlib", "faiss", "chromadb"]


def _pick(name):
    import pytest

    for p in _sides_for_pytest():
        if p.name.split("[")[0] == name:
            return p
    pytest.skip(f"{name} is not installed (pip install memkern[bench])")


def _world():
    if not hasattr(_world, "w"):
        n = _bench_n()
        x, q = make_data(n, 100)
        tmp = Path(tempfile.mkdtemp(prefix="memkern-peers-"))
        atexit.register(shutil.rmtree, tmp, True)
        _world.w = {"x": x, "q": q, "exact": exact_top(q, x), "tmp": tmp, "built": {}}
    return _world.w


def _built(name):
    w = _world()
    if name not in w["built"]:
        p = _pick(name).open(w["tmp"] / f"pt-{name}", len(w["x"]))
        p.add_batch(w["x"], 0)
        w["built"][name] = p
    return w["built"][name]


def _pytest_params():
    import pytest

    return pytest.mark.parametrize("name", _PEER_IDS)


@_pytest_params()
def test_batched_add(benchmark, name, tmp_path):
    benchmark.group = "peers: batched add (same M, ef_construction, 1 thread)"
    x = _world()["x"][:2000]
    made = []

    def build():
        p = _pick(name).open(tmp_path / f"add-{len(made)}", len(x))
        p.add_batch(x, 0)
        made.append(p)
        return p

    p = benchmark.pedantic(build, rounds=3, iterations=1)
    assert p.count() == len(x)
    for m in made:
        m.close()


@_pytest_params()
def test_batch_search(benchmark, name):
    benchmark.group = "peers: batch search (100 queries, same ef, 1 thread)"
    w = _world()
    p = _built(name)
    got = benchmark(p.search, w["q"])
    assert recall(got, w["exact"]) >= 0.9


@_pytest_params()
def test_single_query(benchmark, name):
    benchmark.group = "peers: single query (same ef, 1 thread)"
    w = _world()
    p = _built(name)
    got = benchmark(p.search, w["q"][:1])
    assert len(set(got[0].tolist()) & set(w["exact"][0].tolist())) >= 8


def test_interleaved_tables():
    """The whole interleaved comparison (the figures to trust) at MEMKERN_BENCH_N records."""
    res = run(n=_bench_n(), n_queries=100, quick=True)
    print("\n" + format_tables(res))
    if "same_ids_as_hnswlib" in res:
        assert res["same_ids_as_hnswlib"] >= 0.99
    assert min(res["recall"].values()) >= 0.9


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="5,000 records, fewer rounds")
    ap.add_argument("--n", type=int, default=None, help="records (default 5,000 quick, 100,000 otherwise)")
    ap.add_argument("--queries", type=int, default=None)
    ap.add_argument("--json", default=None, help="raw numbers (default bench/results/peers.json)")
    ap.add_argument("--write-section", action="store_true",
                    help="write bench/sections/peers.md (then `memkern bench --assemble`)")
    a = ap.parse_args(argv)
    n = a.n or (5000 if a.quick else 100_000)
    nq = a.queries or (200 if a.quick else 1000)
    res = run(n=n, n_queries=nq, quick=a.quick)
    md = format_tables(res)
    print(md)
    js = Path(a.json) if a.json else Path(__file__).resolve().parent / "results" / "peers.json"
    js.parent.mkdir(parents=True, exist_ok=True)
    js.write_text(json.dumps(to_jsonable(res), indent=1, default=str))
    if a.write_section:
        import report

        cmd = ("OMP_NUM_THREADS=1 python bench/bench_peers.py" + (" --quick" if a.quick else "")
               + f" --n {n} --queries {nq} --write-section")
        p = report.write_section("peers", "Store vs peers, one namespace (`bench/bench_peers.py`)", md, cmd,
                                 res["machine"], raw_json="bench/results/peers.json")
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
