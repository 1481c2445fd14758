"""Fault injection in the store's write paths (issue 10 items 1-3 and 10, issue 17 items 3-4).

The native store sends every write(), fsync()/fdatasync() and rename() through memkern::io
(``csrc/include/memkern/io.h``), which a test can arm to fail the Nth call of a kind
(``memkern._store._test_set_fault``) and which counts the calls (``_test_io_counters``).

The contract checked here, for every kind of store write and every reachable failure point: the
call either returns and its effect survives a reopen, or it raises and nothing of it is visible,
in the live store or after reopening; the store always reopens with every acknowledged write.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from memkern import MemkernError, StoreCorruptedError
from memkern.store import MemoryStore

from store_faults_common import D, _no_fault, emb, native  # noqa: E402,F401  (_no_fault: autouse)
from store_files import entry_count, set_graph  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "fixtures"


def log_entries(path: Path) -> int:
    """Walks the log chain: every entry intact and back to back up to the end of each file (no
    garbage left by a failed write). Returns the number of entries."""
    return entry_count(path)


def state(s: MemoryStore) -> dict:
    """Everything a reader can see: per record its namespace, level, summary, status, version,
    embedding and turns."""
    out = {}
    for ns in s.namespaces():
        for level in ("topic", "turn"):
            for i in s.ids(ns, include_invalidated=True, level=level):
                r = s.get(int(i))
                out[int(i)] = (ns, level, r.summary, r.status, r.version, r.embedding.tobytes(),
                               json.dumps(r.turns, sort_keys=True), json.dumps(r.meta, sort_keys=True))
    return out


# ----------------------------------------------------------------------------- the write matrix


def _make_base(path: Path) -> None:
    with MemoryStore(path, dim=D, snapshot_every=0) as s:
        s.add_batch("u", [f"t{i}" for i in range(6)], np.stack([emb(i) for i in range(6)]),
                    turns=[[{"role": "user", "content": f"c{i}"}] for i in range(6)],
                    turn_embeddings=[emb(100 + i)[None, :] for i in range(6)])
        s.add_batch("v", ["v0", "v1"], np.stack([emb(50), emb(51)]))
        s.delete(5)  # compact has a deleted vector to drop


OPS = {
    "add": lambda s: s.add("u", "new", emb(200), [{"role": "user", "content": "n"}], {"k": 1}),
    "add_turns": lambda s: s.add("u", "newt", emb(201), [{"role": "user", "content": "n"}],
                                 turn_embeddings=emb(202)[None, :]),
    "add_batch": lambda s: s.add_batch("w", ["b0", "b1", "b2"], np.stack([emb(210 + i) for i in range(3)])),
    "merge": lambda s: s.merge(0, "merged", emb(220), [{"role": "user", "content": "m"}],
                               turn_embeddings=emb(221)[None, :]),
    "update": lambda s: s.update(1, summary="updated", embedding=emb(230)),
    "invalidate": lambda s: s.invalidate(2, "stale"),
    "delete": lambda s: s.delete(3),
    "flush": lambda s: s.flush(),
    "snapshot": lambda s: s.snapshot(),
    "compact": lambda s: s.compact(),
    "close": lambda s: s.close(),
}
KINDS = ["write", "short", "fsync", "rename"]


def _one_run(base: Path, work: Path, op: str, spec: str, fsync: str) -> tuple[str, bool]:
    """Runs `op` with the fault `spec` armed; returns (outcome, whether the fault fired)."""
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(base, work)
    s = MemoryStore(work, fsync=fsync, snapshot_every=3)
    s.add("u", "pre0", emb(300))  # two logged ops: the op under test triggers the automatic snapshot
    s.add("u", "pre1", emb(301))
    before = state(s)
    counters = native()._test_io_counters
    faults0 = counters()["faults"]
    native()._test_set_fault(spec)
    try:
        try:
            OPS[op](s)
            raised = None
        except MemkernError as e:
            raised = e
        if not s.closed:
            s._native.wait_snapshot()  # the automatic snapshot the op triggered, under the same fault
    finally:
        native()._test_set_fault("")
    fired = counters()["faults"] > faults0
    ctx = f"{op} under {spec} (fsync={fsync}): raised {raised!r}"
    live_closed = s.closed
    if not live_closed:
        live = state(s)
        if raised is not None:
            assert live == before, f"{ctx}: the raised write is visible in the live store"
        # A crash right now: a copy of the files opens with exactly what the live store shows.
        crash = work.parent / "crash"
        shutil.rmtree(crash, ignore_errors=True)
        shutil.copytree(work, crash)
        with MemoryStore(crash) as sc:
            assert state(sc) == live, f"{ctx}: a crash now would not reopen what was acknowledged"
        # The store keeps working after a failure (unless it said it must be reopened).
        if not s._native.poisoned:
            i = s.add("u", "after", emb(400))
            live = state(s)
            assert i in live
        else:
            with pytest.raises(MemkernError, match="reopened"):
                s.add("u", "refused", emb(401))
        try:
            s.close()
        except MemkernError:  # a close whose final fsync failed still releases the store
            pass
    else:
        live = before if raised is not None else None
    with MemoryStore(work) as s2:  # reopens, with every acknowledged write
        after = state(s2)
    if live is not None:
        assert after == live, f"{ctx}: reopened state differs from the acknowledged one"
    else:  # a successful close: nothing changes
        assert after == before, ctx
    if raised is not None:
        assert {k: v for k, v in after.items() if v[2] != "after"} == before, f"{ctx}: a raised write came back"
    return ("raised" if raised is not None else "ok"), fired


@pytest.mark.slow
@pytest.mark.parametrize("fsync", ["always"])
def test_every_write_under_every_fault(tmp_path, fsync):
    """For every write kind and every write/short write/fsync/rename it performs, failing that call
    either leaves the write durable and returned, or raised with nothing applied anywhere."""
    base = tmp_path / "base"
    _make_base(base)
    runs = {}
    for op in OPS:
        for kind in KINDS:
            n = 1
            while True:
                outcome, fired = _one_run(base, tmp_path / "w", op, f"{kind}:{n}", fsync)
                if not fired:
                    break
                runs[(op, kind, n)] = outcome
                n += 1
                assert n < 40, "runaway fault loop"
    # Every op reached at least one failure point, and both outcomes occur.
    assert {op for op, _, _ in runs} == set(OPS)
    assert "raised" in runs.values() and "ok" in runs.values()
    # Data writes with a failed log write or sync raise (nothing half-done)...
    for op in ("add", "add_batch", "merge", "update", "invalidate", "delete"):
        assert runs[(op, "write", 1)] == "raised" and runs[(op, "fsync", 1)] == "raised", op
        assert runs[(op, "short", 1)] == "raised", op
    # ...but a failed automatic snapshot after a logged write does not fail the write (its first
    # rename: the next log file; its first write: that file's header; later ones: the pack).
    assert runs[("add", "rename", 1)] == "ok" and runs[("add", "write", 2)] == "ok"
    assert all(runs[("add", k, n)] == "ok" for k in KINDS for n in range(2, 6) if ("add", k, n) in runs)
    print(f"{len(runs)} fault runs: {sum(v == 'raised' for v in runs.values())} raised, "
          f"{sum(v == 'ok' for v in runs.values())} returned")


def test_sticky_disk_full_then_space_returns(tmp_path):
    """A disk that stays full: every append raises and leaves nothing; once space returns, writes
    land at a clean boundary and everything acknowledged reopens."""
    p = tmp_path / "s"
    s = MemoryStore(p, dim=D, snapshot_every=0)
    ok = [s.add("u", f"a{j}", emb(j)) for j in range(3)]
    native()._test_set_fault("short:1+")
    for j in range(3, 8):
        with pytest.raises(MemkernError, match="No space left"):
            s.add("u", f"a{j}", emb(j))
        assert log_entries(p) == 3
    native()._test_set_fault("")
    ok += [s.add("u", f"b{j}", emb(j)) for j in range(3)]
    assert log_entries(p) == 6
    shutil.copytree(p, tmp_path / "crash")  # as if the process died now
    s.close()
    for q in (p, tmp_path / "crash"):
        with MemoryStore(q) as s2:
            assert s2.ids("u").tolist() == ok


def test_poisoned_log_refuses_writes_until_it_can_cut(tmp_path):
    """A short write whose cut-back also fails (no fsync succeeds) poisons the log: later appends
    raise (and add nothing) until the cut succeeds; then writes resume cleanly."""
    p = tmp_path / "s"
    s = MemoryStore(p, dim=D, snapshot_every=0, fsync="never")
    a = s.add("u", "a", emb(0))
    native()._test_set_fault("short:1,fsync:1+")
    with pytest.raises(MemkernError, match="could not be removed"):
        s.add("u", "b", emb(1))
    with pytest.raises(MemkernError, match="refusing writes"):
        s.add("u", "c", emb(2))
    native()._test_set_fault("")
    d = s.add("u", "d", emb(3))
    s.flush()
    assert log_entries(p) == 2
    shutil.copytree(p, tmp_path / "crash")
    s.close()
    for q in (p, tmp_path / "crash"):
        with MemoryStore(q) as s2:
            assert [s2.get(int(i)).summary for i in s2.ids("u")] == ["a", "d"] and s2.ids("u").tolist() == [a, d]


def test_failed_fsync_takes_the_write_back(tmp_path):
    """fsync="always": a write whose fdatasync fails raises, and is gone from the log too."""
    p = tmp_path / "s"
    s = MemoryStore(p, dim=D, snapshot_every=0)
    s.add("u", "a", emb(0))
    size = (p / "wal.log").stat().st_size
    native()._test_set_fault("fsync:1")
    with pytest.raises(MemkernError, match="fdatasync"):
        s.add("u", "b", emb(1))
    assert s.count("u") == 1
    assert (p / "wal.log").stat().st_size == size and log_entries(p) == 1
    shutil.copytree(p, tmp_path / "crash")
    s.close()
    with MemoryStore(tmp_path / "crash") as s2:
        assert s2.count("u") == 1 and s2._native.replayed_entries == 1


def test_automatic_snapshot_failure_is_reported_not_raised(tmp_path, caplog):
    """Issue 10 item 3: the snapshot inside add() fails; add() returns the id (the record is durable
    in the log), a warning is logged, last_snapshot_error says why, and the snapshot is retried."""
    p = tmp_path / "s"
    s = MemoryStore(p, dim=D, snapshot_every=2)
    s.add("u", "a", emb(0))
    native()._test_set_fault("rename:1+")
    with caplog.at_level(logging.WARNING, logger="memkern"):
        i = s.add("u", "b", emb(1))  # triggers the (background) snapshot, whose renames fail
        s._native.wait_snapshot()  # reports the failure, like the next write would
    assert s.get(i).summary == "b"
    assert s.last_snapshot_error and "rename" in s.last_snapshot_error
    assert any("automatic snapshot failed" in r.getMessage() for r in caplog.records)
    gen = s._native.generation
    native()._test_set_fault("")
    s.add("u", "c", emb(2))  # one op later: no retry yet (retried snapshot_every ops later)
    s._native.wait_snapshot()
    assert s._native.generation == gen
    s.add("u", "d", emb(3))
    s._native.wait_snapshot()
    assert s._native.generation == gen + 1 and s.last_snapshot_error is None
    del s
    with MemoryStore(p) as s2:
        assert [s2.get(int(k)).summary for k in s2.ids("u")] == ["a", "b", "c", "d"]


def test_close_with_failing_snapshot_keeps_the_log(tmp_path):
    p = tmp_path / "s"
    s = MemoryStore(p, dim=D, snapshot_every=0)
    ids = [s.add("u", f"r{j}", emb(j)) for j in range(4)]
    native()._test_set_fault("write:1+")
    s.close()  # the snapshot fails, the log (already synced) holds everything
    native()._test_set_fault("")
    assert s.closed and "write" in (s.last_snapshot_error or "")
    with MemoryStore(p) as s2:
        assert s2.ids("u").tolist() == ids and s2._native.replayed_entries == 4


@pytest.mark.parametrize("n, switched", [(3, False), (4, True)])
def test_snapshot_rename_failures_keep_every_write(tmp_path, n, switched):
    """The renames of a snapshot: the next log file, records.bin, CURRENT (the switch), then the new
    log to wal.log. A failed CURRENT rename leaves the old generation and a chain of two logs; a
    failed log rename after the switch leaves the new log under its own name. Either way writes go
    on (nothing is poisoned) and every write reopens."""
    p = tmp_path / "s"
    s = MemoryStore(p, dim=D, snapshot_every=0)
    a = s.add("u", "a", emb(0))
    gen = s._native.generation
    native()._test_set_fault(f"rename:{n}")
    if switched:
        s.snapshot()  # the switch happened: the snapshot succeeded
        assert s._native.generation == gen + 1
    else:
        with pytest.raises(MemkernError, match="CURRENT"):
            s.snapshot()
        assert s._native.generation == gen
    native()._test_set_fault("")
    assert not s._native.poisoned
    assert [Path(f).name for f in s._native.log_files] == (["wal-1.log"] if switched else ["wal.log", "wal-1.log"])
    b = s.add("u", "b", emb(1))
    shutil.copytree(p, tmp_path / "crash")
    s.close()
    for q in (tmp_path / "crash", p):
        with MemoryStore(q) as s2:
            assert [s2.get(int(k)).summary for k in s2.ids("u")] == ["a", "b"] and s2.ids("u").tolist() == [a, b]
            s2.add("u", "c", emb(2))
        with MemoryStore(q) as s3:
            assert [s3.get(int(k)).summary for k in s3.ids("u")] == ["a", "b", "c"]
            assert [Path(f).name for f in s3._native.log_files] == ["wal.log"]


# ----------------------------------------------------------------------------- sync counter


def test_each_acknowledged_write_is_synced(tmp_path):
    """Issue 17 item 3: under fsync="always" every acknowledged write performed >= 1 fsync or
    fdatasync before returning; under "never" a write performs none (the counter is real)."""
    c = native()._test_io_counters
    s = MemoryStore(tmp_path / "a", dim=D, snapshot_every=0)
    writes = [
        lambda: s.add("u", "x", emb(0), [{"role": "user", "content": "x"}], turn_embeddings=emb(9)[None, :]),
        lambda: s.add_batch("u", ["y", "z"], np.stack([emb(1), emb(2)])),
        lambda: s.merge(0, "m", emb(3), [{"role": "user", "content": "m"}], turn_embeddings=emb(4)[None, :]),
        lambda: s.update(2, summary="u"),
        lambda: s.invalidate(2, "r"),
        lambda: s.delete(3),
    ]
    for w in writes:
        before = c()["syncs"]
        w()
        assert c()["syncs"] - before >= 1
    s.close()
    s = MemoryStore(tmp_path / "b", dim=D, snapshot_every=0, fsync="never")
    before = c()["syncs"]
    s.add("u", "x", emb(0))
    s.add_batch("u", ["y"], emb(1)[None, :])
    assert c()["syncs"] == before
    s.flush()
    assert c()["syncs"] == before + 1
    s.close()


# ----------------------------------------------------------------------------- torn tail, identity

LOGGED = r"""
import os, sys, numpy as np
from memkern.store import MemoryStore
s = MemoryStore(sys.argv[1], dim=%d, snapshot_every=0)
for j in range(int(sys.argv[2]), int(sys.argv[3])):
    s.add("u", f"r{j}", np.random.default_rng(j).standard_normal(%d).astype(np.float32))
os._exit(0)  # no close: the writes stay in the log
""" % (D, D)


def _logged(path: Path, a: int, b: int) -> None:
    subprocess.run([sys.executable, "-c", LOGGED, str(path), str(a), str(b)], check=True)


@pytest.mark.slow
def test_torn_tail_then_append_then_reopen(tmp_path):
    """Issue 17 item 4: a torn tail is cut off when the store opens, so the next appends land at a
    clean boundary and a second reopen sees every acknowledged write."""
    p = tmp_path / "s"
    _logged(p, 0, 5)
    wal = p / "wal.log"
    data = wal.read_bytes()
    wal.write_bytes(data[:-9])  # the 5th entry is torn
    _logged(p, 5, 8)  # opens (cuts the torn entry), appends r5..r7, exits without closing
    with MemoryStore(p) as s:
        assert [s.get(int(i)).summary for i in s.ids("u")] == ["r0", "r1", "r2", "r3", "r5", "r6", "r7"]
        assert s._native.replayed_entries == 7


def test_zero_tail_then_append(tmp_path):
    p = tmp_path / "s"
    _logged(p, 0, 3)
    with open(p / "wal.log", "ab") as f:
        f.write(bytes(12))
    _logged(p, 3, 5)
    with MemoryStore(p) as s:
        assert s.count("u") == 5


def test_foreign_log_is_refused(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for p in (a, b):
        with MemoryStore(p, dim=D) as s:
            s.add("u", "x", emb(0))
    _logged(a, 1, 3)
    shutil.copy(a / "wal.log", b / "wal.log")
    with pytest.raises(StoreCorruptedError, match="another store"):
        MemoryStore(b)


def test_deleted_log_is_refused(tmp_path):
    p = tmp_path / "s"
    with MemoryStore(p, dim=D) as s:
        s.add("u", "x", emb(0))
    _logged(p, 1, 4)  # three records only in the log
    (p / "wal.log").unlink()
    with pytest.raises(StoreCorruptedError, match="wal.log is missing"):
        MemoryStore(p)


def test_deleted_log_without_snapshot_is_refused(tmp_path):
    """No snapshot yet (the store was never closed): the log is all there is. Deleting it must not
    let a new, empty store be created over the old one."""
    p = tmp_path / "s"
    _logged(p, 0, 3)
    assert not (p / "CURRENT").exists()
    (p / "wal.log").unlink()
    with pytest.raises(StoreCorruptedError, match="wal.log and CURRENT are missing"):
        MemoryStore(p, dim=D)


def test_stale_log_is_refused(tmp_path):
    p = tmp_path / "s"
    with MemoryStore(p, dim=D, snapshot_every=0) as s:
        s.add("u", "x", emb(0))
        s.snapshot()
        old = (p / "wal.log").read_bytes()
        for j in range(3):
            s.add("u", f"y{j}", emb(j))
            s.snapshot()
    _logged(p, 10, 12)
    (p / "wal.log").write_bytes(old)  # a log two generations old replaces the current one
    with pytest.raises(StoreCorruptedError, match="older than"):
        MemoryStore(p)


def test_store_of_the_previous_format_opens_and_upgrades(tmp_path):
    """A store written before store ids (CURRENT format 1, 24 bytes; log format 1 with a zero id;
    records.bin format 2 with one index file per namespace level) opens, replays its log, and gets
    an id and the format-3 snapshot at its next snapshot."""
    p = tmp_path / "s"
    shutil.copytree(DATA / "store_v2" / "store", p)
    cur = (p / "CURRENT").read_bytes()
    magic, _, gen, _ = struct.unpack_from("<8sIQQ", cur)
    old = bytearray(struct.pack("<8sIQ", magic, 1, gen))
    old += struct.pack("<I", zlib.crc32(bytes(old)))
    (p / "CURRENT").write_bytes(bytes(old))
    wal = bytearray((p / "wal.log").read_bytes())
    assert struct.unpack_from("<I", wal, 8)[0] == 2  # entries framed as in formats 1-2
    struct.pack_into("<I", wal, 8, 1)  # format 1
    struct.pack_into("<Q", wal, 32, 0)  # reserved zero where the id is now
    struct.pack_into("<I", wal, 40, zlib.crc32(bytes(wal[:40])))
    (p / "wal.log").write_bytes(bytes(wal))
    with MemoryStore(p) as s:
        assert s._native.store_id == 0 and s.count("small") == 3 and s._native.replayed_entries == 2
    with MemoryStore(p) as s:  # close wrote a snapshot: now the store has an id
        sid = s._native.store_id
        assert sid != 0 and s.count("small") == 3 and s._native.replayed_entries == 0
    assert struct.unpack_from("<Q", (p / "CURRENT").read_bytes(), 20)[0] == sid


# ----------------------------------------------------------------------------- graph files

GRAPH_RUNNER = r"""
import json, sys
from memkern import StoreCorruptedError
from memkern.store import MemoryStore
out = []
for d in sys.argv[1:]:
    try:
        s = MemoryStore(d)
        import numpy as np
        s.search("u", np.ones(s.dim, np.float32), k=5)
        s.close()
        out.append("opened")
    except StoreCorruptedError as e:
        out.append("corrupted: " + str(e))
    except Exception as e:
        out.append(f"other: {type(e).__name__}: {e}")
print(json.dumps(out))
"""

HDR = struct.Struct("<QQQQQQiIQQQdQ")  # hnswlib 0.8 graph file header (96 bytes)


def _set_graph(store: Path, name: str, data: bytes) -> None:
    set_graph(store, name, data)


def test_crafted_graph_files_give_a_clean_error(tmp_path):
    """Issue 10 item 1: a graph file with a valid checksum over hostile contents is refused with
    StoreCorruptedError before hnswlib reads it; the process never crashes."""
    src = tmp_path / "src"
    dim = 16
    with MemoryStore(src, dim=dim, M=4, snapshot_every=0, flat_limit=0) as s:
        s.add_batch("u", [f"t{i}" for i in range(300)], np.random.default_rng(0).standard_normal((300, dim)).astype(np.float32))
    snap = next(q for q in src.iterdir() if q.name.startswith("snap-"))
    assert sorted(f.name for f in snap.iterdir()) == ["g0_0.hnsw", "pack-1.bin", "records.bin"]
    g = (snap / "g0_0.hnsw").read_bytes()
    h = list(HDR.unpack_from(g))
    cur, size_data, maxM = h[2], h[3], h[8]
    links = maxM * 4 + 4
    body = HDR.size
    upper = body + cur * size_data  # the per-element upper-level link lists start here
    # find an element with level >= 1 and its link block
    off, lvl_of, first_upper = upper, [], None
    for i in range(cur):
        (sz,) = struct.unpack_from("<I", g, off)
        lvl_of.append(sz // links)
        if sz and first_upper is None and struct.unpack_from("<I", g, off + 4)[0] & 0xFFFF:
            first_upper = (i, off + 4)  # an element on level >= 1 with >= 1 link there
        off += 4 + sz
    assert off == len(g) and first_upper is not None

    def patched(at: int, fmt: str, value) -> bytes:
        b = bytearray(g)
        struct.pack_into(fmt, b, at, value)
        return bytes(b)

    rng = np.random.default_rng(1)
    el = body + 5 * size_data  # element 5's level-0 block
    level0_only = next(i for i in range(cur) if lvl_of[i] == 0)
    cases = {
        "garbage": rng.integers(0, 256, len(g), dtype=np.uint8).tobytes(),
        "garbage_keep_header": g[:body] + rng.integers(0, 256, len(g) - body, dtype=np.uint8).tobytes(),
        "huge_count": patched(16, "<Q", 2**40),
        "count_plus_one": patched(16, "<Q", cur + 1),
        "huge_capacity": patched(8, "<Q", 2**62),  # ignored by the loader: opens fine
        "neighbour_out_of_range": patched(el + 4, "<I", 10**6),
        "neighbour_just_out": patched(el + 4, "<I", cur),
        "level0_count_too_big": patched(el, "<H", 60000),
        "upper_neighbour_out_of_range": patched(first_upper[1] + 4, "<I", 10**6),
        "upper_neighbour_without_that_level": patched(first_upper[1] + 4, "<I", level0_only),
        "upper_count_too_big": patched(first_upper[1], "<I", maxM + 1),
        "entry_point_out_of_range": patched(52, "<I", cur + 7),
        "top_level_huge": patched(48, "<i", 10**6),
        "top_level_negative": patched(48, "<i", -1),
        "M_mismatch": patched(72, "<Q", 5),
        "mult_nan": patched(80, "<d", float("nan")),
        "mult_huge": patched(80, "<d", 1e300),
        "size_per_element": patched(24, "<Q", size_data + 4),
        "label_offset": patched(32, "<Q", 2**60),
        "nan_vector": patched(el + 4 + 4 * 2 * maxM, "<f", float("nan")),
        "duplicate_label": patched(el + size_data - 8, "<Q", struct.unpack_from("<Q", g, body + 4 * size_data - 8)[0]),
        "link_list_size": patched(upper, "<I", 3),
        "truncated": g[: len(g) // 2],
        "extended": g + b"\0" * 64,
        "tiny": g[:10],
        "empty": b"",
    }
    dirs = []
    for name, data in cases.items():
        d = tmp_path / name
        shutil.copytree(src, d)
        _set_graph(d, "g0_0.hnsw", data)
        dirs.append(str(d))
    proc = subprocess.run([sys.executable, "-c", GRAPH_RUNNER, *dirs], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"crashed (rc {proc.returncode}): {proc.stderr[-2000:]}"
    results = dict(zip(cases, json.loads(proc.stdout.strip().splitlines()[-1])))
    assert results.pop("huge_capacity") == "opened"
    for name, r in results.items():
        assert r.startswith("corrupted: graph file"), (name, r)


GRAPH_WRITER = r"""
import json, resource, sys
import numpy as np
from memkern import MemkernError
from memkern.store import MemoryStore
limit, n = int(sys.argv[2]), int(sys.argv[3])
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))  # Python ignores SIGXFSZ: writes get EFBIG
s = MemoryStore(sys.argv[1], dim=384, snapshot_every=100, fsync="never", flat_limit=0)
e = np.random.default_rng(0).standard_normal((n, 384)).astype(np.float32)
acked, failed, snap_errors = [], [], set()
def add(j):
    try:
        acked.append([int(s.add("u", f"r{j}", e[j])), j])
    except MemkernError as ex:
        failed.append(j)
    s._native.wait_snapshot()
    if s.last_snapshot_error:
        snap_errors.add(s.last_snapshot_error.split(":")[0])
for j in range(n - 20):
    add(j)
chain = len(s._native.log_files)
# Each snapshot attempt starts a new log file, so no log reached the limit: now it is the active one's size.
import os
size = os.path.getsize(s._native.log_files[-1])
resource.setrlimit(resource.RLIMIT_FSIZE, (size + 4000, size + 4000))
for j in range(n - 20, n):
    add(j)
try:
    s.close()
    closed = "ok"
except MemkernError as ex:
    closed = str(ex)
print(json.dumps({"acked": acked, "failed": failed, "snap_errors": sorted(snap_errors), "closed": closed, "chain": chain}))
"""


@pytest.mark.slow
def test_file_size_limit_never_commits_a_cut_graph(tmp_path):
    """Issue 10 item 1's reproduction: ``ulimit -f`` 1 MiB, 384-d records, snapshot_every=100. The
    graph file cannot be written whole, so no snapshot may commit it; the log then fills up too.
    Every returned write reopens (no crash), every raised one is absent."""
    p = tmp_path / "s"
    n = 1400
    proc = subprocess.run([sys.executable, "-c", GRAPH_WRITER, str(p), str(1 << 20), str(n)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["snap_errors"], "the file size limit never stopped a snapshot"
    assert out["chain"] > 2, "failed snapshots left no log chain"
    assert out["failed"], "the log never hit the file size limit"
    assert len(out["acked"]) > 600
    e = np.random.default_rng(0).standard_normal((n, 384)).astype(np.float32)
    check = subprocess.run([sys.executable, "-c", r"""
import json, sys, numpy as np
from memkern.store import MemoryStore
with MemoryStore(sys.argv[1]) as s:
    print(json.dumps([[int(i), s.get(int(i)).summary] for i in s.ids("u")]))
""", str(p)], capture_output=True, text=True, timeout=300)
    assert check.returncode == 0, f"reopen crashed (rc {check.returncode}): {check.stderr[-2000:]}"
    got = {i: summ for i, summ in json.loads(check.stdout.strip().splitlines()[-1])}
    assert got == {i: f"r{j}" for i, j in out["acked"]}
    assert not {f"r{j}" for j in out["failed"]} & set(got.values())
    with MemoryStore(p) as s:
        np.testing.assert_array_equal(s.embeddings([i for i, _ in out["acked"][-5:]]), e[[j for _, j in out["acked"][-5:]]])


def test_small_tmpfs_disk_full_then_space_returns(tmp_path):
    """A real full disk (a 2 MiB tmpfs; needs mount permission, else skipped): appends fail with
    ENOSPC and leave nothing; after space is freed, writes land and everything acknowledged
    reopens."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    try:
        p = mnt / "s"
        s = MemoryStore(p, dim=256, snapshot_every=0, fsync="always")
        filler = mnt / "filler"
        st = os.statvfs(mnt)
        filler.write_bytes(b"x" * (st.f_bavail * st.f_frsize - (150 << 10)))  # leave ~150 KB free
        e = np.random.default_rng(0).standard_normal((400, 256)).astype(np.float32)
        acked, failed = [], []
        for j in range(400):
            try:
                acked.append((s.add("u", f"r{j}", e[j]), j))
            except MemkernError as ex:
                assert "No space left" in str(ex), ex
                failed.append(j)
                if len(failed) >= 5:
                    break
        assert failed and acked
        filler.unlink()  # space returns
        for j in range(300, 310):
            acked.append((s.add("u", f"r{j}", e[j]), j))
        del s
        with MemoryStore(p) as s2:
            got = {int(i): s2.get(int(i)).summary for i in s2.ids("u")}
        assert got == {i: f"r{j}" for i, j in acked}
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)
