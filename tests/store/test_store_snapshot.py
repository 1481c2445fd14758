"""Snapshots off the write path (csrc/include/memkern/snapshot.h): the snapshot holds the state
at its rotation whatever is written while it is being copied (copy-on-write), calls go on while it
is written, only changed namespaces are written (the rest hard-linked), packs do not pile up, a
kill at any step loses nothing acknowledged, the log chain is checked, and the previous format
(records.bin 2, one file per index, log format 2) opens and upgrades."""
from __future__ import annotations

import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from memkern import StoreCorruptedError
from memkern.store import MemoryStore
from memkern.store.transfer import export_records, import_records

from store_faults_common import D, _no_fault, emb, native  # noqa: F401  (_no_fault: autouse)
from store_files import chain, log_entries, read_manifest, snapshot_dir

DATA = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture(autouse=True)
def _no_gate():
    native()._test_snapshot_gate("")
    yield
    native()._test_release_snapshot_gate()
    native()._test_snapshot_gate("")


def state(s: MemoryStore) -> dict:
    out = {}
    for ns in s.namespaces():
        for level in ("topic", "turn"):
            for i in s.ids(ns, include_invalidated=True, level=level):
                r = s.get(int(i))
                out[int(i)] = (ns, level, r.summary, r.status, r.version, r.embedding.tobytes(),
                               json.dumps(r.turns, sort_keys=True), json.dumps(r.meta, sort_keys=True),
                               r.event_time, [h.summary for h in s.history(int(i))])
    return out


def _populate(s: MemoryStore, n_ns: int = 10) -> dict[str, list[int]]:
    ids = {}
    for k in range(n_ns):
        ids[f"ns{k}"] = [int(i) for i in s.add_batch(
            f"ns{k}", [f"t{k}.{i}" for i in range(3)], np.stack([emb(100 * k + i) for i in range(3)]),
            turns=[[{"role": "user", "content": f"c{k}.{i}"}] for i in range(3)],
            turn_embeddings=[emb(5000 + 100 * k + i)[None, :] for i in range(3)],
            metas=[{"k": k} for _ in range(3)], event_times=[float(k)] * 3)]
    return ids


def _held(point: str, run) -> threading.Thread:
    """Starts `run` (which writes a snapshot) in a thread and waits until it is held at `point`."""
    native()._test_snapshot_gate(point)
    t = threading.Thread(target=run)
    t.start()
    assert native()._test_wait_snapshot_gate(30.0), f"the snapshot never reached {point}"
    return t


@pytest.mark.parametrize("point", ["rotated", "copied", "written"])
def test_writes_while_a_snapshot_is_written_are_neither_lost_nor_doubled(tmp_path, point):
    """Every kind of write lands while the snapshot is held at a step: to namespaces it has still to
    copy (copy-on-write), to unchanged ones, to a new one. The snapshot is the state at its rotation,
    the log the rest: a reopen (after a crash, or after close) shows exactly the live state."""
    p = tmp_path / "s"
    s = MemoryStore(p, dim=D, snapshot_every=0, fsync="never", id_range=(0, 10_000))
    ids = _populate(s)
    s.snapshot()
    for k in range(6):  # ns0..ns5 changed since: the next snapshot copies them; ns6..ns9 keep their blobs
        s.update(ids[f"ns{k}"][0], meta={"k": k, "changed": True})
    other = MemoryStore(tmp_path / "other", dim=D, snapshot_every=0, id_range=(20_000, 30_000))
    moved = export_records(other, [other.add("x", "imported", emb(9000))])
    moved[0]["namespace"] = "ns0"
    t = _held(point, s.snapshot)
    try:
        _write_while_held(s, ids, moved)
        live = state(s)
    finally:
        native()._test_release_snapshot_gate()
        t.join(60)
    assert not t.is_alive()
    assert s._native.generation == 2
    shutil.copytree(p, tmp_path / "crash", ignore=shutil.ignore_patterns("LOCK"))
    with MemoryStore(tmp_path / "crash") as c:
        assert state(c) == live
        assert c._native.replayed_entries == 9  # the writes made after the rotation
    s.close()
    with MemoryStore(p) as s2:
        assert state(s2) == live and s2._native.replayed_entries == 0
    other.close()


def _write_while_held(s, ids, moved):
    # reads, and writes of every kind
    got, _ = s.search("ns1", emb(101), k=3)
    assert int(got[0][0]) == ids["ns1"][1]
    s.add("ns1", "added while held", emb(1))
    s.merge(ids["ns2"][0], "merged while held", emb(2), [{"role": "user", "content": "m"}],
            turn_embeddings=emb(3)[None, :])
    s.update(ids["ns3"][1], summary="updated while held", embedding=emb(4), event_time=77.0)
    s.invalidate(ids["ns4"][2], "stale")
    s.delete(ids["ns5"][0])
    s.add("ns7", "added to an unchanged namespace", emb(5))
    s.delete(ids["ns8"][1])
    s.add_batch("brand-new", ["n0", "n1"], np.stack([emb(6), emb(7)]))
    import_records(s, "ns0", moved)


def test_the_automatic_snapshot_does_not_hold_up_the_write_that_triggers_it(tmp_path):
    p = tmp_path / "s"
    s = MemoryStore(p, dim=D, metric="cos", snapshot_every=5, fsync="always")
    native()._test_snapshot_gate("rotated")
    for i in range(5):
        s.add("u", f"a{i}", emb(i))  # the 5th triggers the snapshot (the background thread writes it)
    assert native()._test_wait_snapshot_gate(30.0)
    # the snapshot is held: writes and reads go on
    done = []

    def more():
        for i in range(5, 30):
            s.add("u", f"a{i}", emb(i))
        done.append(s.search("u", emb(7), k=3)[0][0][0])

    w = threading.Thread(target=more)
    w.start()
    w.join(30)
    try:
        assert done and int(done[0]) == 7, "a write or a read waited for the held snapshot"
        assert [Path(f).name for f in s._native.log_files] == ["wal.log", "wal-1.log"]
    finally:
        native()._test_release_snapshot_gate()
    s._native.wait_snapshot()
    assert s._native.generation >= 1 and s.last_snapshot_error is None
    live = state(s)
    s.close()
    with MemoryStore(p) as s2:
        assert state(s2) == live and s2.count("u") == 30


CRASH_WRITER = r"""
import os, sys, numpy as np
from memkern import _store
from memkern.store import MemoryStore
D = %d
emb = lambda j: np.random.default_rng(j).standard_normal(D).astype(np.float32)
s = MemoryStore(sys.argv[1], dim=D, snapshot_every=int(sys.argv[2]), fsync="always")
held = False
j = int(sys.argv[3])
while True:
    ns = f"n{j %% 4}"
    print(f"I {j}", flush=True)
    i = s.add(ns, f"r{j}", emb(j), meta={"j": j})
    if j %% 5 == 0:
        s.merge(i, f"m{j}", emb(j + 100000))
    print(f"A {i} {j}", flush=True)
    if not held and _store._test_wait_snapshot_gate(0.0):
        held = True
        print("G", flush=True)
    j += 1
""" % D


@pytest.mark.slow
@pytest.mark.parametrize("point", ["rotated", "copied", "written", "switched"])
def test_a_kill_while_the_background_snapshot_is_held_at_any_step_loses_nothing(tmp_path, point):
    """MEMKERN_SNAPSHOT_GATE holds the background snapshot at a step for good; the writer goes on
    (fsync "always") and is SIGKILLed. Every acknowledged write reopens, exactly; so does a
    second round on the same store."""
    p = tmp_path / "s"
    acked: dict[int, tuple[str, int]] = {}
    j0 = 0
    for rnd in range(2):
        env = {**os.environ, "MEMKERN_SNAPSHOT_GATE": point, "OMP_NUM_THREADS": "1"}
        proc = subprocess.Popen([sys.executable, "-c", CRASH_WRITER, str(p), "20", str(j0)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env)
        lines, after = [], None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ln = proc.stdout.readline()
            if not ln:
                break
            lines.append(ln.split())
            if ln.startswith("G"):
                after = len(lines)
            if after is not None and len(lines) > after + 40:  # 20 more acknowledged writes after it held
                break
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert after is not None, f"the snapshot never reached {point}: {proc.stderr.read()[-2000:]}"
        # the writer went on while the lines above were read: its acknowledgements still in the pipe count
        # too (a line cut by the kill is not one)
        lines += [ln.split() for ln in proc.stdout.read().split("\n")[:-1]]
        for parts in lines:
            if parts and parts[0] == "A" and len(parts) == 3:
                i, j = int(parts[1]), int(parts[2])
                acked[i] = (f"m{j}" if j % 5 == 0 else f"r{j}", j)
                j0 = max(j0, j + 1)
            elif parts and parts[0] == "I":
                j0 = max(j0, int(parts[1]) + 1)
        names = sorted(q.name for q in p.iterdir())
        if point == "written":
            assert "CURRENT.tmp" in names  # killed before the switch
        with MemoryStore(p) as s:
            for i, (summary, j) in acked.items():
                r = s.get(i)
                assert r.summary == summary and r.meta == {"j": j}, (i, r.summary, summary)
            n = s.count("n0") + s.count("n1") + s.count("n2") + s.count("n3")
            assert len(acked) <= n <= len(acked) + rnd + 1  # + each round's in-flight add, if it landed


def test_a_snapshot_writes_only_what_changed(tmp_path):
    """After one write to one of many namespaces, the snapshot (here: the one close writes) puts one
    blob in a new pack and hard-links the rest; graph files of unchanged namespaces are linked."""
    p = tmp_path / "s"
    with MemoryStore(p, dim=D, snapshot_every=0, flat_limit=4) as s:
        _populate(s, 30)  # each namespace: 3 topics (flat) and 3 turns (flat)
        s.add_batch("big", [f"b{i}" for i in range(8)], np.stack([emb(7000 + i) for i in range(8)]))  # HNSW
    snap1 = snapshot_dir(p)
    m1 = read_manifest(snap1)
    assert [pk for pk, _ in m1.packs] == [1] and len(m1.blobs) == 31
    ino = {f.name: f.stat().st_ino for f in snap1.iterdir()}
    assert "g30_0.hnsw" in ino
    with MemoryStore(p, snapshot_every=0) as s:
        s.add("ns3", "one more", emb(1))
    snap2 = snapshot_dir(p)
    assert snap2 != snap1 and not snap1.exists()
    m2 = read_manifest(snap2)
    assert [pk for pk, _ in m2.packs] == [1, 2]
    assert [b.pack for b in m2.blobs] == [1] * 3 + [2] + [1] * 27
    assert (snap2 / "pack-1.bin").stat().st_ino == ino["pack-1.bin"]  # the same file, linked
    assert (snap2 / "g30_0.hnsw").stat().st_ino == ino["g30_0.hnsw"]
    assert (snap2 / "pack-2.bin").stat().st_size < 2000  # one namespace's blob
    with MemoryStore(p) as s:
        assert s.count("ns3") == 4 and s.count("big") == 8 and s._native.replayed_entries == 0


@pytest.mark.slow
def test_packs_do_not_pile_up(tmp_path):
    """Snapshot after snapshot of a few changed namespaces: a pack less than half live is rewritten,
    so the packs hold at most twice the live blobs."""
    p = tmp_path / "s"
    s = MemoryStore(p, dim=D, snapshot_every=0, fsync="never")
    ids = _populate(s, 20)
    s.snapshot()
    rng = np.random.default_rng(0)
    for r in range(30):
        for k in rng.choice(20, 3, replace=False):
            s.update(ids[f"ns{k}"][int(rng.integers(3))], summary=f"round {r}")
        s.snapshot()
        m = read_manifest(snapshot_dir(p))
        live = sum(b.length for b in m.blobs)
        total = sum(size - 16 for _, size in m.packs)
        assert total <= 2 * live, (r, m.packs, live)
    assert len(m.packs) < 12
    live = state(s)
    s.close()
    with MemoryStore(p) as s2:
        assert state(s2) == live


def test_the_log_chain_is_checked(tmp_path):
    """Two failed snapshots leave a chain of three logs; a reopen replays them in order. A chain with
    a gap, and a torn earlier log followed by a log with entries, are refused."""
    p = tmp_path / "s"
    s = MemoryStore(p, dim=D, snapshot_every=0)
    ids = [s.add("u", "a", emb(0))]
    for k in range(2):
        native()._test_set_fault("rename:3")  # the rename of CURRENT: after the rotation, before the switch
        with pytest.raises(Exception, match="CURRENT"):
            s.snapshot()
        native()._test_set_fault("")
        ids.append(s.add("u", f"b{k}", emb(1 + k)))
    files = [Path(f).name for f in s._native.log_files]
    assert files == ["wal.log", "wal-1.log", "wal-2.log"]
    live = state(s)
    base = tmp_path / "base"
    shutil.copytree(p, base, ignore=shutil.ignore_patterns("LOCK"))
    s.close()
    with MemoryStore(p) as s2:  # close's snapshot retired the chain
        assert state(s2) == live and [Path(f).name for f in s2._native.log_files] == ["wal.log"]
    w = tmp_path / "w"
    shutil.copytree(base, w)
    with MemoryStore(w) as s3:
        assert state(s3) == live and s3._native.replayed_entries == 3
    shutil.rmtree(w)
    shutil.copytree(base, w)
    (w / "wal-1.log").unlink()
    with pytest.raises(StoreCorruptedError, match="gap"):
        MemoryStore(w)
    shutil.rmtree(w)
    shutil.copytree(base, w)
    data = (w / "wal-1.log").read_bytes()
    (w / "wal-1.log").write_bytes(data[:-5])  # its (only) entry torn, yet wal-2.log holds one
    with pytest.raises(StoreCorruptedError, match="wal-1.log is damaged"):
        MemoryStore(w)


def test_store_of_the_previous_format_reads_and_rewrites(tmp_path):
    """tests/fixtures/store_v2: records.bin format 2 (one index file per namespace level: an HNSW graph,
    flat files), a log of format 2 with two entries after the snapshot. It opens with every record,
    version, vector, status and event time; its next snapshot is format 3; writes go on."""
    p = tmp_path / "s"
    shutil.copytree(DATA / "store_v2" / "store", p)
    exp = json.loads((DATA / "store_v2" / "expected.json").read_text())

    def check(s, added=0):
        for k, e in exp["records"].items():
            r = s.get(int(k))
            assert (r.namespace, r.level, r.summary, r.status, r.meta, r.event_time, r.version) == \
                (e["ns"], e["level"], e["summary"], e["status"], e["meta"], e["event_time"], e["version"]), k
            np.testing.assert_array_equal(r.embedding, np.asarray(e["embedding"], np.float32))
            assert [h.summary for h in s.history(int(k))] == e["history"]
        for k in exp["deleted"]:
            assert k not in s
        assert s._native.next_id == exp["next_id"] + added

    with MemoryStore(p) as s:
        assert s._native.replayed_entries == 2 and s._native.index_kind("big", native().Level.topic) == "hnsw"
        check(s)
        assert struct.unpack_from("<I", (p / "wal.log").read_bytes(), 8)[0] == 2  # appended in its own framing
        new = s.add("small", "after the upgrade", emb(3))
    assert struct.unpack_from("<I", (snapshot_dir(p) / "records.bin").read_bytes(), 8)[0] == 3
    with MemoryStore(p) as s:
        check(s, 1)
        assert s.get(new).summary == "after the upgrade" and s._native.replayed_entries == 0
        s.compact()
        check(s, 1)


def test_close_after_one_write_to_many_namespaces_writes_one_namespace(tmp_path):
    """2,000 namespaces: close() after one write copies one namespace into a small new pack and
    links the rest (the old layout rewrote every index file, one fsync each). Times are printed,
    not asserted (shared machines); bench_namespaces.py --snapshot-stall measures them."""
    p = tmp_path / "s"
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, D)).astype(np.float32)
    with MemoryStore(p, dim=D, snapshot_every=0, fsync="never") as s:
        for k in range(2000):
            s.add_batch(f"user-{k}", [f"r{i}" for i in range(5)], x)
        t0 = time.perf_counter()
        s.snapshot()
        full = time.perf_counter() - t0
        st_full = s._native.last_snapshot_stats
    s = MemoryStore(p, snapshot_every=0)
    s.add("user-7", "one more", x[0])
    t0 = time.perf_counter()
    s.close()
    one = time.perf_counter() - t0
    st = s._native.last_snapshot_stats
    print(f"full snapshot {full:.3f} s ({st_full['bytes']} bytes), close after one write {one:.3f} s ({st['bytes']} bytes)")
    assert st_full["copied"] == 2000 and st["copied"] == 1 and st["linked"] == 1
    assert st["bytes"] < 2000 < st_full["bytes"] / 100
    assert sorted(f.name for f in snapshot_dir(p).iterdir()) == ["pack-1.bin", "pack-2.bin", "records.bin"]


def test_snapshot_wait_false_hands_it_to_the_background_thread(tmp_path):
    from memkern import MemkernTypeError
    from memkern.store.memory import InMemoryStore

    p = tmp_path / "s"
    s = MemoryStore(p, dim=D, snapshot_every=0)
    s.add("u", "a", emb(0))
    native()._test_snapshot_gate("copied")
    s.snapshot(wait=False)  # returns while the snapshot is held
    try:
        assert native()._test_wait_snapshot_gate(30.0)
        s.add("u", "b", emb(1))
    finally:
        native()._test_release_snapshot_gate()
    s._native.wait_snapshot()
    assert s._native.generation == 1 and s.last_snapshot_error is None
    with pytest.raises(MemkernTypeError, match="wait"):
        s.snapshot(wait="no")
    s.close()
    with MemoryStore(p) as s2:
        assert [s2.get(int(i)).summary for i in s2.ids("u")] == ["a", "b"]
    m = InMemoryStore(D)
    m.add("u", "a", emb(0))
    m.snapshot(wait=False)  # nothing to write, same signature
