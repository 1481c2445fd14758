"""Many tenants (issue 10 item 8, issue 12's VectorIndex): a namespace costs memory in proportion to
its records. Small namespaces are exact scans (FlatIndex), promoted to an HNSW graph past
``flat_limit`` records; graphs grow on demand and shrink to fit on load. Promotion and demotion must
keep results right through snapshots and log replay. Batch search uses ``num_threads``.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from memkern._store import Level
from memkern.errors import MemkernValueError
from memkern.store import MemoryStore

RSS_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from memkern.store import MemoryStore
    def rss():
        return int(open("/proc/self/statm").read().split()[1]) * 4096
    path, n_ns, per, dim = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n_ns, per, dim), dtype=np.float32)
    if sys.argv[5] == "build":
        s = MemoryStore(path, dim=dim, fsync="never", snapshot_every=0)
        s.add_batch("warm-up", ["w"], x[0, :1])
        r0 = rss()
        for i in range(n_ns):
            s.add_batch(f"user-{i}", [f"t{j}" for j in range(per)], x[i])
        r1 = rss()
        s.close()
    else:
        s0 = MemoryStore(path + "-warm", dim=dim, fsync="never")  # loads the module, allocator warm-up
        s0.add("w", "w", x[0, 0]); s0.close()
        r0 = rss()
        s = MemoryStore(path)
        r1 = rss()
        ids, _ = s.search(f"user-{n_ns - 1}", x[n_ns - 1, 0], k=1)
        assert ids[0, 0] >= 0
        s.close()
    print(json.dumps({"per_namespace": (r1 - r0) / n_ns}))
    """
)


def test_rss_per_namespace_stays_bounded(tmp_path):
    # Before: every namespace preallocated a 1,024-slot HNSW graph (~2.7 MB of RAM each, also
    # after reopening). Now 1,000 namespaces of 4 records (32-d, 512 vector bytes each) cost a
    # few kB each, both while writing and after reopening.
    n_ns, per, dim = 1000, 4, 32
    out = {}
    for phase in ("build", "open"):
        proc = subprocess.run([sys.executable, "-c", RSS_SCRIPT, str(tmp_path / "s"), str(n_ns), str(per), str(dim),
                               phase], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        out[phase] = json.loads(proc.stdout.strip().splitlines()[-1])["per_namespace"]
    assert out["build"] < 16_000, out
    assert out["open"] < 16_000, out


def test_hnsw_graphs_grow_on_demand(tmp_path):
    # flat_limit=0: every namespace is an HNSW graph, as before; graphs start small now.
    with MemoryStore(tmp_path / "s", dim=16, fsync="never", flat_limit=0) as s:
        rng = np.random.default_rng(0)
        for i in range(50):
            s.add_batch(f"u{i}", ["a", "b", "c"], rng.standard_normal((3, 16)).astype(np.float32))
        assert s._native.index_kind("u0", Level.topic) == "hnsw"
        per_ns = s.memory_bytes() / 50
    assert per_ns < 20_000, per_ns  # a 1,024-slot graph alone was ~290 kB at this size
    with MemoryStore(tmp_path / "s", flat_limit=0) as s:
        assert s.memory_bytes() / 50 < 20_000
        # A graph that grew (100 -> 150 slots for 101 vectors) ...
        s.add_batch("big", [f"b{i}" for i in range(100)], rng.standard_normal((100, 16)).astype(np.float32))
        s.add("big", "one more", rng.standard_normal(16).astype(np.float32))
        grown = s.memory_bytes()
    with MemoryStore(tmp_path / "s", flat_limit=0) as s:  # ... is shrunk to its 101 vectors on load
        assert s.memory_bytes() < grown - 40 * 200, (s.memory_bytes(), grown)  # 49 slots of ~260 B freed


def _exact(store: MemoryStore, ns: str, q: np.ndarray, k: int, metric: str, level: str = "topic",
           include_invalidated: bool = False) -> tuple[np.ndarray, np.ndarray]:
    ids = store.ids(ns, include_invalidated, level=level)
    x = store.embeddings(ids)
    if metric == "l2":
        sc = -((x - q[None, :]) ** 2).sum(1)
    else:
        qq = q / np.linalg.norm(q) if metric == "cos" else q
        sc = x @ qq
    order = np.lexsort((ids, -sc))[:k]
    return ids[order], sc[order]


def _check_exact(store, metric, namespaces, queries, k=8):
    for ns in namespaces:
        for q in queries:
            got, gsc = store.search(ns, q, k=k)
            want, wsc = _exact(store, ns, q, k, metric)
            n = len(want)
            assert got[0, :n].tolist() == want.tolist(), (ns, got, want)
            np.testing.assert_allclose(gsc[0, :n], wsc, rtol=1e-4, atol=1e-4)
            assert (got[0, n:] == -1).all()


WRITER = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    from memkern.store import MemoryStore
    path, metric = sys.argv[1], sys.argv[2]
    rng = np.random.default_rng(7)
    d = 16
    s = MemoryStore(path, dim=d, metric=metric, fsync="always", snapshot_every=0, flat_limit=16)
    s.add_batch("small", [f"s{i}" for i in range(10)], rng.standard_normal((10, d)).astype(np.float32))
    for i in range(17):  # the 17th add promotes "grow" to HNSW
        s.add("grow", f"g{i}", rng.standard_normal(d).astype(np.float32))
    s.add_batch("batch", [f"b{i}" for i in range(40)], rng.standard_normal((40, d)).astype(np.float32))
    for i in range(4):  # 4 topics (flat) with 6 turns each: the turn level (24) is promoted
        turns = [{"role": "user", "content": f"c{i}.{j}"} for j in range(6)]
        s.add("turns", f"t{i}", rng.standard_normal(d).astype(np.float32), turns,
              turn_embeddings=rng.standard_normal((6, d)).astype(np.float32))
    s.invalidate(int(s.ids("small")[3]), "stale")
    s.delete(int(s.ids("grow")[0]))
    s.update(int(s.ids("small")[0]), embedding=rng.standard_normal(d).astype(np.float32))
    if sys.argv[3] == "crash":
        os._exit(0)  # no close: the next open replays the whole log (promotions included)
    s.close()
    """
)

KINDS = {("small", "topic"): "flat", ("grow", "topic"): "hnsw", ("batch", "topic"): "hnsw",
         ("turns", "topic"): "flat", ("turns", "turn"): "hnsw"}


def _kinds(s: MemoryStore) -> dict:
    return {(ns, lv): s._native.index_kind(ns, getattr(Level, lv)) for ns, lv in KINDS}


@pytest.mark.parametrize("metric", ["ip", "l2", "cos"])
@pytest.mark.parametrize("how", ["crash", "close"])
def test_flat_hnsw_promotion_is_exact_across_reopen(tmp_path, metric, how):
    path = tmp_path / "s"
    proc = subprocess.run([sys.executable, "-c", WRITER, str(path), metric, how], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    q = np.random.default_rng(8).standard_normal((6, 16)).astype(np.float32)
    with MemoryStore(path, flat_limit=16) as s:
        assert s._native.replayed_entries == (0 if how == "close" else 26)
        assert _kinds(s) == KINDS
        assert s.count("small") == 9 and s.count("small", include_invalidated=True) == 10
        assert s.count("grow") == 16 and s.count("turns", level="turn") == 24
        # Flat namespaces are exact; these HNSW graphs are small enough (<= ef) to be exact too.
        _check_exact(s, metric, ["small", "grow", "batch", "turns"], q)
        ids, sc = s.search("turns", q, k=5, level="turn")
        want, _ = _exact(s, "turns", q[0], 5, metric, level="turn")
        assert ids[0].tolist() == want.tolist()
        before = {ns: s.search(ns, q, k=8) for ns in ("small", "grow", "batch", "turns")}
        tt = s.search("turns", q, k=5, level="turn+topic")
    with MemoryStore(path, flat_limit=16) as s:  # reopened (from the snapshot close wrote): same kinds, results
        assert _kinds(s) == KINDS
        for ns in ("small", "grow", "batch", "turns"):
            np.testing.assert_array_equal(s.search(ns, q, k=8)[0], before[ns][0])
            np.testing.assert_allclose(s.search(ns, q, k=8)[1], before[ns][1], rtol=1e-6)
        # compact() demotes graphs that hold <= flat_limit live vectors: "grow" (16 after a
        # delete) and "batch" (shrunk to 10).
        for rid in s.ids("batch")[:30]:
            s.delete(int(rid))
        s.compact()
        demoted = {**KINDS, ("grow", "topic"): "flat", ("batch", "topic"): "flat"}
        assert _kinds(s) == demoted
        _check_exact(s, metric, ["batch", "grow"], q)
        np.testing.assert_array_equal(s.search("grow", q, k=8)[0], before["grow"][0])
        after_batch = s.search("batch", q, k=8)
    with MemoryStore(path, flat_limit=16) as s:
        assert _kinds(s) == demoted
        for ns in ("small", "grow", "turns"):
            np.testing.assert_array_equal(s.search(ns, q, k=8)[0], before[ns][0])
        np.testing.assert_array_equal(s.search("batch", q, k=8)[0], after_batch[0])
        np.testing.assert_array_equal(s.search("turns", q, k=5, level="turn+topic")[0], tt[0])
    # Another flat_limit on reopen: loaded indexes keep their kind until the next add.
    with MemoryStore(path, flat_limit=4) as s:
        assert s._native.index_kind("small", Level.topic) == "flat"
        s.add("small", "new", np.ones(16, np.float32))
        assert s._native.index_kind("small", Level.topic) == "hnsw"
        _check_exact(s, metric, ["small"], q)


def test_flat_limit_is_validated(tmp_path):
    with pytest.raises(MemkernValueError, match="^flat_limit:"):
        MemoryStore(tmp_path / "s", dim=4, flat_limit=-1)


@pytest.mark.parametrize("flat_limit", [0, 1024])
def test_batch_search_with_threads_equals_single_thread(tmp_path, flat_limit):
    rng = np.random.default_rng(2)
    d = 24
    path = tmp_path / "s"
    # Big enough that the batch is split over the threads (>= 2**15 distance evaluations a call).
    n, per = 400, 2
    with MemoryStore(path, dim=d, fsync="never", flat_limit=flat_limit) as s:
        s.add_batch("u", [f"x{i}" for i in range(n)], rng.standard_normal((n, d)).astype(np.float32),
                    [[{"role": "user", "content": f"c{i}.{j}"} for j in range(per)] for i in range(n)],
                    turn_embeddings=[rng.standard_normal((per, d)).astype(np.float32) for _ in range(n)])
        s.invalidate(5, "x")
    q = rng.standard_normal((256, d)).astype(np.float32)
    results = {}
    for threads in (1, 4):
        with MemoryStore(path, num_threads=threads, flat_limit=flat_limit) as s:
            results[threads] = [
                s.search("u", q, k=10, ef=16),
                s.search("u", q, k=10, include_invalidated=True),
                s.search("u", q, k=7, level="turn"),
                s.search("u", q, k=7, level="turn+topic", candidates=12),
            ]
    for (i1, s1), (i4, s4) in zip(results[1], results[4]):
        np.testing.assert_array_equal(i1, i4)
        np.testing.assert_array_equal(s1, s4)
    assert (results[1][0][0] >= 0).all() and 5 not in results[1][0][0]


def _patch_v2_flat_file(store_dir, name, mutate) -> None:
    """Rewrites a format-2 snapshot's flat index file with mutate(bytes) and fixes both checksums
    (the file's, recorded in records.bin, and records.bin's own), as a crafted store would."""
    import struct
    import zlib

    snap = next(p for p in store_dir.iterdir() if p.name.startswith("snap-"))
    flat = snap / name
    data = mutate(bytearray(flat.read_bytes()))
    flat.write_bytes(bytes(data))
    rec = bytearray((snap / "records.bin").read_bytes())
    key = name.encode()
    at = rec.rfind(struct.pack("<Q", len(key)) + key) + 8 + len(key)
    struct.pack_into("<QI", rec, at, len(data), zlib.crc32(bytes(data)))
    struct.pack_into("<I", rec, len(rec) - 4, zlib.crc32(bytes(rec[:-4])))
    (snap / "records.bin").write_bytes(bytes(rec))


@pytest.mark.parametrize("fmt", ["pack", "v2"])
@pytest.mark.parametrize("case", ["duplicate label", "negative label", "count too large", "count too small",
                                  "truncated", "nan", "huge norm", "dim"])
def test_crafted_flat_file_is_a_clean_corruption_error(tmp_path, case, fmt):
    """Hostile flat index rows under valid checksums: in a format-3 namespace blob (pack file), and
    in a format-2 snapshot's own .flat file (still read)."""
    import shutil
    import struct

    from memkern.errors import StoreCorruptedError
    from store_files import patch_flat

    d = 8
    path = tmp_path / "s"
    if fmt == "pack":
        with MemoryStore(path, dim=d) as s:
            s.add_batch("u", ["a", "b", "c"], np.eye(3, d, dtype=np.float32))
        rows, n_at, hdr = 3, 0, 8  # u64 n, then labels, then rows x 8 float32
    else:
        shutil.copytree(Path(__file__).resolve().parents[1] / "fixtures" / "store_v2" / "store", path)
        rows, n_at, hdr = 2, 16, 24  # magic, u64 dim, u64 n, then labels, then rows
    lab = hdr + rows * 8
    if case == "dim" and fmt == "pack":
        pytest.skip("a blob's flat rows carry no dim of their own (the manifest's is used)")

    def mutate(b: bytearray) -> bytearray:
        if case == "duplicate label":
            struct.pack_into("<q", b, hdr + 8, struct.unpack_from("<q", b, hdr)[0])
        elif case == "negative label":
            struct.pack_into("<q", b, hdr, -5)
        elif case == "count too large":
            struct.pack_into("<Q", b, n_at, 2**61)
        elif case == "count too small":
            struct.pack_into("<Q", b, n_at, rows - 1)
        elif case == "truncated":
            del b[-3:]
        elif case == "nan":
            struct.pack_into("<f", b, lab + 4, float("nan"))
        elif case == "huge norm":
            struct.pack_into("<ff", b, lab, 3e38, 3e38)
        elif case == "dim":
            struct.pack_into("<Q", b, 8, 4)
        return b

    if fmt == "pack":
        patch_flat(path, 0, 0, mutate)
        want = "snapshot .*pack-1.bin, namespace 'u'"
    else:
        _patch_v2_flat_file(path, "g1_0.flat", mutate)
        want = "flat index file"
    with pytest.raises(StoreCorruptedError, match=want):
        MemoryStore(path)
