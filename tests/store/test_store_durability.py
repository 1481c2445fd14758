"""Durability of MemoryStore: SIGKILL at random points, truncated and bit-flipped files.

The crash test runs a writer child process that prints an "intent" line before each operation
and an "ack" line after the call returned; the child is SIGKILLed at a random moment, and the
reopened store must hold every acknowledged operation exactly (the one in-flight operation may
or may not be there). Corruption cases run inside a subprocess so that a crash would show up as a
failed test instead of killing pytest.
"""
from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import pytest

from memkern import StoreCorruptedError
from memkern.store import MemoryStore
from store_faults_common import bench_crash  # noqa: E402

D = 24

WRITER = r"""
import sys, numpy as np
from memkern.store import MemoryStore
path, fsync, start, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
D = %d
def emb(j):
    return np.random.default_rng(j).standard_normal(D).astype(np.float32)
s = MemoryStore(path, dim=D, fsync=fsync, snapshot_every=9)
rng = np.random.default_rng(seed)
live = [int(x) for x in s.search("u", emb(0), k=10**6, ef=10, include_invalidated=True)[0][0] if x >= 0]
j = start
out = sys.stdout
while True:
    r = rng.random()
    if r < 0.55 or len(live) < 3:
        out.write(f"I add {j}\n"); out.flush()
        i = s.add("u", f"r{j}", emb(j), [{"role": "user", "content": f"c{j}"}], {"j": j})
        out.write(f"A add {i} {j}\n"); out.flush()
        live.append(i); j += 1
    elif r < 0.75:
        n = int(rng.integers(2, 6))
        out.write(f"I batch {j} {n}\n"); out.flush()
        ids = s.add_batch("u", [f"r{j + t}" for t in range(n)], np.stack([emb(j + t) for t in range(n)]),
                          metas=[{"j": j + t} for t in range(n)])
        out.write("A batch " + " ".join(f"{int(i)}:{j + t}" for t, i in enumerate(ids)) + "\n"); out.flush()
        live.extend(int(i) for i in ids); j += n
    elif r < 0.9:
        i = live[int(rng.integers(len(live)))]
        out.write(f"I merge {i} {j}\n"); out.flush()
        s.merge(i, f"m{j}", emb(j), [{"role": "user", "content": f"c{j}"}])
        out.write(f"A merge {i} {j}\n"); out.flush()
        j += 1
    else:
        i = live.pop(int(rng.integers(len(live))))
        out.write(f"I delete {i}\n"); out.flush()
        s.delete(i)
        out.write(f"A delete {i}\n"); out.flush()
""" % D


def emb(j: int) -> np.ndarray:
    return np.random.default_rng(j).standard_normal(D).astype(np.float32)


class Expected:
    """What the acknowledged operations say the store must hold."""

    def __init__(self) -> None:
        self.recs: dict[int, tuple[str, int, int]] = {}  # id -> (summary, embedding seed, n turns)
        self.deleted: set[int] = set()
        self.next_j = 1

    def ack(self, parts: list[str]) -> None:
        op = parts[0]
        if op == "add":
            i, j = int(parts[1]), int(parts[2])
            self.recs[i] = (f"r{j}", j, 1)
            self.next_j = max(self.next_j, j + 1)
        elif op == "batch":
            for p in parts[1:]:
                i, j = map(int, p.split(":"))
                self.recs[i] = (f"r{j}", j, 0)
                self.next_j = max(self.next_j, j + 1)
        elif op == "merge":
            i, j = int(parts[1]), int(parts[2])
            s, _, nt = self.recs[i]
            self.recs[i] = (f"m{j}", j, nt + 1)
            self.next_j = max(self.next_j, j + 1)
        elif op == "delete":
            i = int(parts[1])
            del self.recs[i]
            self.deleted.add(i)


def check_store(path: Path, exp: Expected, in_flight: list[str] | None) -> None:
    uncertain: set[int] = set()
    if in_flight:
        if in_flight[0] in ("merge", "delete"):
            uncertain.add(int(in_flight[1]))
        else:  # an add whose ids were never printed: its j values must not appear as acked
            exp.next_j = max(exp.next_j, int(in_flight[1]) + (int(in_flight[2]) if in_flight[0] == "batch" else 1))
    with MemoryStore(path) as s:
        ids, _ = s.search("u", emb(0), k=100000, ef=10, include_invalidated=True)
        present = {int(x) for x in ids[0] if x >= 0}
        for i, (summary, j, _) in exp.recs.items():
            if i in uncertain:
                continue
            assert i in present, f"acknowledged record {i} lost"
            r = s.get(i)
            assert r.summary == summary, (i, r.summary, summary)
            np.testing.assert_array_equal(r.embedding, emb(j))
        for i in exp.deleted:
            assert i not in present and i not in s
        assert s.count("u") == len(present)
        extra = present - set(exp.recs) - uncertain
        assert len(extra) <= 5, f"records nobody acknowledged or started: {sorted(extra)}"
        # Anything unacknowledged that came back must be the in-flight add, intact.
        for i in extra:
            r = s.get(i)
            j = int(r.summary[1:])
            np.testing.assert_array_equal(r.embedding, emb(j))
            exp.recs[i] = (r.summary, j, len(r.turns))
        for i in uncertain:
            if i in present:
                r = s.get(i)
                exp.recs[i] = (r.summary, int(r.summary[1:]), len(r.turns))
            else:
                exp.recs.pop(i, None)
                exp.deleted.add(i)


@pytest.mark.slow
@pytest.mark.parametrize("fsync", ["always", "never"])
def test_sigkill_at_random_points(tmp_path, fsync):
    path = tmp_path / "crash"
    exp = Expected()
    rng = np.random.default_rng(1 if fsync == "always" else 2)
    rounds = 12
    kills_mid_write = 0
    for rnd in range(rounds):
        ack_file = tmp_path / f"acks-{rnd}.txt"
        with open(ack_file, "w") as out:
            proc = subprocess.Popen(
                [sys.executable, "-c", WRITER, str(path), fsync, str(exp.next_j), str(rnd)],
                stdout=out, stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
            )
            time.sleep(float(rng.uniform(0.5, 2.0)))
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        err = proc.stderr.read()
        assert proc.returncode == -signal.SIGKILL, err
        buf = ack_file.read_text()
        lines = buf.split("\n")
        complete = lines[:-1]  # a partial last line was never flushed completely: ignore
        in_flight = None
        for ln in complete:
            parts = ln.split()
            if parts[0] == "A":
                exp.ack(parts[1:])
                in_flight = None
            elif parts[0] == "I":
                in_flight = parts[1:]
        if in_flight is not None:
            kills_mid_write += 1
        check_store(path, exp, in_flight)
    print(f"fsync={fsync}: {len(exp.recs)} records, {len(exp.deleted)} deleted, {kills_mid_write} kills mid-write")
    assert len(exp.recs) > 20
    assert kills_mid_write >= 1  # the kill landed inside an operation at least once


@pytest.mark.slow
def test_sigkill_campaign_with_injected_faults(tmp_path):
    """50 trials of bench/bench_crash.py (the 1,000-trial campaign's figures are in RESULTS.md):
    a forked writer doing random adds, batches, merges, updates, invalidations, deletes,
    snapshots and compactions, with short writes / failed writes, fsyncs and renames injected in
    ~40% of the trials, SIGKILLed at a random moment. Every acknowledged write is there, every
    raised one left nothing, and the store always opens."""
    bc = bench_crash()
    st = bc.run_campaign(50, tmp_path, seed=3, log=None)
    assert st.problems == []
    assert st.trials == 50 and st.acked > 100
    assert st.failed > 0 and st.faults_fired > 0  # injected faults did make calls raise
    assert st.killed_in_flight > 5  # kills landed inside calls


# ------------------------------------------------------------------------------- corrupted files


MAKE_STORE = r"""
import os, sys, numpy as np
from memkern.store import MemoryStore
D = %d
e = np.random.default_rng(0).standard_normal((40, D)).astype(np.float32)
s = MemoryStore(sys.argv[1], dim=D, snapshot_every=0)
s.add_batch("u", [f"t{i}" for i in range(30)], e[:30])
s.snapshot()  # 30 records in the snapshot
for i in range(30, 40):  # 10 more only in the log, one entry each
    s.add("u", f"t{i}", e[i])
os._exit(0)  # no close: the log keeps its 10 entries
""" % D


def _make_store(path: Path) -> None:
    subprocess.run([sys.executable, "-c", MAKE_STORE, str(path)], check=True)


CORRUPTION_RUNNER = r"""
import json, os, shutil, sys, numpy as np
from memkern import StoreCorruptedError
from memkern.store import MemoryStore
src, work, cases = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
D = %d
e = np.random.default_rng(0).standard_normal((40, D)).astype(np.float32)
out = []
for case in cases:
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(src, work)
    f = os.path.join(work, case["file"])
    data = bytearray(open(f, "rb").read())
    if case["kind"] == "truncate":
        data = data[: case["at"]]
    elif case["kind"] == "flip":
        data[case["at"]] ^= 1 << case["bit"]
    elif case["kind"] == "replace":
        data[case["at"]: case["at"] + len(bytes.fromhex(case["hex"]))] = bytes.fromhex(case["hex"])
    data += bytes(case.get("then_zeros", 0))
    open(f, "wb").write(bytes(data))
    try:
        s = MemoryStore(work)
        ids, _ = s.search("u", e[0], k=100, ef=100)
        got = sorted(int(i) for i in ids[0] if i >= 0)
        ok = all(s.get(i).summary == f"t{i}" and np.array_equal(s.get(i).embedding, e[i]) for i in got)
        s.close()
        out.append({"result": "opened", "ids": got, "intact": ok})
    except StoreCorruptedError as ex:
        out.append({"result": "corrupted", "msg": str(ex)})
    except Exception as ex:
        out.append({"result": "other", "msg": f"{type(ex).__name__}: {ex}"})
print(json.dumps(out))
""" % D


def _run_cases(src: Path, work: Path, cases: list[dict]) -> list[dict]:
    proc = subprocess.run([sys.executable, "-c", CORRUPTION_RUNNER, str(src), str(work), json.dumps(cases)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"the process crashed (rc {proc.returncode}): {proc.stderr[-2000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def corrupt_src(tmp_path_factory):
    src = tmp_path_factory.mktemp("corrupt") / "src"
    _make_store(src)
    return src


@pytest.mark.slow
def test_snapshot_files_truncated_or_flipped(corrupt_src, tmp_path):
    rng = np.random.default_rng(5)
    cases = []
    snap = next(p for p in corrupt_src.iterdir() if p.name.startswith("snap-"))
    pack = next(snap.glob("pack-*.bin")).name  # the namespace's blob: records and its flat index
    for f in ["CURRENT", f"{snap.name}/records.bin", f"{snap.name}/{pack}"]:
        size = (corrupt_src / f).stat().st_size
        for at in sorted(set([0, 1, 7, size // 3, size - 5, size - 1] + rng.integers(0, size, 4).tolist())):
            cases.append({"file": f, "kind": "truncate", "at": int(at)})
        for at in rng.integers(0, size, 12).tolist() + [0, size - 1]:
            cases.append({"file": f, "kind": "flip", "at": int(at), "bit": int(rng.integers(8))})
    results = _run_cases(corrupt_src, tmp_path / "w", cases)
    for c, r in zip(cases, results):
        assert r["result"] == "corrupted", (c, r)
        assert c["file"].split("/")[-1] in r["msg"] or "snapshot" in r["msg"], (c, r)


@pytest.mark.slow
def test_log_torn_tail_and_corruption(corrupt_src, tmp_path):
    wal = corrupt_src / "wal.log"
    data = wal.read_bytes()
    # entry boundaries: 44-byte header, then [len u32][crc u32][synced u64][crc u32][payload]
    offs, off = [], 44
    while off < len(data):
        offs.append(off)
        (n,) = struct.unpack_from("<I", data, off)
        assert zlib.crc32(data[off + 20: off + 20 + n]) == struct.unpack_from("<I", data, off + 4)[0]
        assert struct.unpack_from("<Q", data, off + 8)[0] == off  # fsync "always": all before it synced
        off += 20 + n
    assert off == len(data) and len(offs) == 10
    last = offs[-1]
    cases = [
        # torn tails: anything cut inside the last entry loses only that entry
        {"file": "wal.log", "kind": "truncate", "at": last + 3},
        {"file": "wal.log", "kind": "truncate", "at": last + 12},
        {"file": "wal.log", "kind": "truncate", "at": len(data) - 1},
        # a cut exactly at an entry boundary loses nothing acknowledged before it
        {"file": "wal.log", "kind": "truncate", "at": offs[5]},
        # zero bytes after the last entry (space allocated, never written) are a torn tail
        {"file": "wal.log", "kind": "replace", "at": len(data), "hex": "00" * 12},
        {"file": "wal.log", "kind": "replace", "at": len(data), "hex": "00" * 5000},
        # a zero-filled tail where the last entry's payload should be: its length runs past the end
        {"file": "wal.log", "kind": "truncate", "at": last + 20, "then_zeros": 7},
        # a bit flip in the LAST entry, complete by its length: nothing written after it proves
        # it was synced, and a torn write leaves such bytes (pages persisted out of order): cut
        {"file": "wal.log", "kind": "flip", "at": len(data) - 2, "bit": 3},
        # a bad entry followed by entries written after it was synced is corruption, never loss
        {"file": "wal.log", "kind": "flip", "at": offs[2] + 40, "bit": 0},
        {"file": "wal.log", "kind": "flip", "at": offs[2] + 1, "bit": 5},  # its length field
        {"file": "wal.log", "kind": "flip", "at": offs[2] + 17, "bit": 2},  # its header crc
        {"file": "wal.log", "kind": "flip", "at": offs[2] + 9, "bit": 2},  # its sync watermark
        # bad headers
        {"file": "wal.log", "kind": "truncate", "at": 20},
        {"file": "wal.log", "kind": "flip", "at": 2, "bit": 1},
        {"file": "wal.log", "kind": "flip", "at": 30, "bit": 1},
    ]
    results = _run_cases(corrupt_src, tmp_path / "w", cases)
    expect_ids = [list(range(39))] * 3 + [list(range(35))] + [list(range(40))] * 2 + [list(range(39))] * 2
    n_ok = len(expect_ids)
    for c, r, ids in zip(cases[:n_ok], results[:n_ok], expect_ids):
        assert r == {"result": "opened", "ids": ids, "intact": True}, (c, r)
    for c, r in zip(cases[n_ok:], results[n_ok:]):
        assert r["result"] == "corrupted", (c, r)
        assert "wal.log" in r["msg"], r
    assert "fails its checksum" in results[n_ok]["msg"] and "synced" in results[n_ok]["msg"], results[n_ok]


def test_format_version_checked(corrupt_src, tmp_path):
    data = (corrupt_src / "wal.log").read_bytes()
    hdr = bytearray(data[:44])
    struct.pack_into("<I", hdr, 8, 99)  # format version 99
    struct.pack_into("<I", hdr, 40, zlib.crc32(bytes(hdr[:40])))  # valid header checksum
    cur = bytearray((corrupt_src / "CURRENT").read_bytes())
    assert len(cur) == 32  # format 2: magic, format, generation, store id, crc
    struct.pack_into("<I", cur, 8, 99)
    struct.pack_into("<I", cur, 28, zlib.crc32(bytes(cur[:28])))
    cases = [
        {"file": "wal.log", "kind": "replace", "at": 0, "hex": bytes(hdr).hex()},
        {"file": "CURRENT", "kind": "replace", "at": 0, "hex": bytes(cur).hex()},
    ]
    results = _run_cases(corrupt_src, tmp_path / "w", cases)
    for r in results:
        assert r["result"] == "corrupted" and "format version" in r["msg"], r


def test_missing_snapshot_is_corruption(tmp_path):
    p = tmp_path / "m"
    with MemoryStore(p, dim=D) as s:
        s.add("u", "x", np.ones(D, np.float32))
    snap = next(q for q in p.iterdir() if q.name.startswith("snap-"))
    (snap / "records.bin").unlink()
    with pytest.raises(StoreCorruptedError, match="missing"):
        MemoryStore(p)


def test_crc_matches_zlib(tmp_path):
    """The native CRC-32 is the standard one (zlib's), so files can be checked by other tools."""
    p = tmp_path / "c"
    with MemoryStore(p, dim=D) as s:
        s.add("u", "x", np.ones(D, np.float32))
    cur = (p / "CURRENT").read_bytes()
    assert struct.unpack_from("<I", cur, 28)[0] == zlib.crc32(cur[:28])
    rec = next(p.glob("snap-*/records.bin")).read_bytes()
    assert struct.unpack_from("<I", rec, len(rec) - 4)[0] == zlib.crc32(rec[:-4])


def test_torn_tail_is_logged(corrupt_src, tmp_path, caplog):
    import logging
    import shutil

    work = tmp_path / "cut"
    shutil.copytree(corrupt_src, work)
    wal = work / "wal.log"
    data = wal.read_bytes()
    wal.write_bytes(data[:-7])
    with caplog.at_level(logging.INFO, logger="memkern"):
        s = MemoryStore(work)
    try:
        assert s._native.recovered_torn_tail and s._native.replayed_entries == 9
        assert s.count("u") == 39
        assert any("was torn" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)
    finally:
        s.close()
    with caplog.at_level(logging.INFO, logger="memkern"):
        caplog.clear()
        with MemoryStore(work) as s:
            assert not s._native.recovered_torn_tail and s.count("u") == 39
        assert not any("was torn" in r.getMessage() for r in caplog.records)


# ------------------------------------------------------------------------------- fuzzing with valid checksums

FUZZ_MAKE = r"""
import os, sys, numpy as np
from memkern.store import MemoryStore
D = %d
rng = np.random.default_rng(0)
e = lambda n: rng.standard_normal((n, D)).astype(np.float32)
conv = lambda n, t: [{"role": "user", "content": f"{t}{i}"} for i in range(n)]
# flat_limit=6: at the snapshot "u" has HNSW graphs and "v" a flat index, so both file kinds are fuzzed
s = MemoryStore(sys.argv[1], dim=D, snapshot_every=0, flat_limit=6)
s.add_batch("u", [f"t{i}" for i in range(10)], e(10), turns=[conv(2, i) for i in range(10)],
            turn_embeddings=[e(2) for _ in range(10)])
s.add_batch("v", [f"v{i}" for i in range(5)], e(5))
s.invalidate(3, "x")
s.snapshot()
s.add("u", "w", e(1)[0], conv(3, "w"), turn_embeddings=e(3))
s.merge(0, "m", e(1)[0], conv(1, "new"), turn_embeddings=e(1))
s.invalidate(6, "y")
s.delete(9)
s.add_batch("v", ["a", "b"], e(2))
os._exit(0)
""" % D

FUZZ_RUNNER = r"""
import json, os, shutil, struct, sys, zlib
import numpy as np
from memkern import StoreCorruptedError
from memkern.store import MemoryStore
src, work, target, n, seed = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
sys.path.insert(0, sys.argv[6])
import store_files as sf
rng = np.random.default_rng(seed)
D = %d
out = {"corrupted": 0, "opened": 0, "corrupted_on_use": 0, "other": []}
for it in range(n):
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(src, work)
    if target == "records":
        f = next(os.path.join(work, d, "records.bin") for d in os.listdir(work) if d.startswith("snap-"))
        data = bytearray(open(f, "rb").read())
        for _ in range(int(rng.integers(1, 4))):
            data[int(rng.integers(20, len(data) - 4))] = int(rng.integers(256))
        struct.pack_into("<I", data, len(data) - 4, zlib.crc32(bytes(data[:-4])))
        open(f, "wb").write(bytes(data))
    elif target == "graph":  # hostile graph bytes under a valid size + checksum in the snapshot
        snap = sf.snapshot_dir(work)
        names = sorted(n for n in os.listdir(snap) if n.endswith(".hnsw"))
        name = names[int(rng.integers(len(names)))]
        data = bytearray((snap / name).read_bytes())
        for _ in range(int(rng.integers(1, 6))):
            at = int(rng.integers(len(data))) if rng.random() < 0.5 else int(rng.integers(min(96, len(data))))
            data[at] = int(rng.integers(256))
        sf.set_graph(work, name, bytes(data))
    elif target == "blob":  # a namespace blob (records, tombstones, flat rows) under a valid checksum
        snap = sf.snapshot_dir(work)
        m = sf.read_manifest(snap)
        i = int(rng.integers(len(m.blobs)))
        data = bytearray(sf.blob_bytes(snap, m.blobs[i]))
        for _ in range(int(rng.integers(1, 4))):
            data[int(rng.integers(len(data)))] = int(rng.integers(256))
        if rng.random() < 0.2:
            data = data[: int(rng.integers(len(data)))]
        sf.replace_blob(snap, m, i, bytes(data))
    else:
        f = os.path.join(work, "wal.log")
        data = bytearray(open(f, "rb").read())
        ents = sf.log_entries(f)
        o, hs, ln = ents[int(rng.integers(len(ents)))]
        for _ in range(int(rng.integers(1, 4))):
            data[o + hs + int(rng.integers(ln))] = int(rng.integers(256))
        struct.pack_into("<I", data, o + 4, zlib.crc32(bytes(data[o + hs:o + hs + ln])))
        struct.pack_into("<I", data, o + hs - 4, zlib.crc32(bytes(data[o:o + hs - 4])))
        open(f, "wb").write(bytes(data))
    try:
        s = MemoryStore(work)
    except StoreCorruptedError:
        out["corrupted"] += 1
        continue
    except Exception as ex:
        out["other"].append(f"open: {type(ex).__name__}: {ex}")
        continue
    try:
        q = np.random.default_rng(1).standard_normal((2, s.dim)).astype(np.float32)
        for ns in s.namespaces():
            for level in ("topic", "turn", "turn+topic"):
                ids, sc = s.search(ns, q, k=50, level=level, include_invalidated=True)
                got = [int(i) for i in ids.ravel() if i >= 0]
                s.get_batch(got)
                s.embeddings(got)
            for i in s.ids(ns, include_invalidated=True):
                s.history(int(i))
        s.compact()
        s.close()
        out["opened"] += 1
    except StoreCorruptedError:  # damaged text found when it is read
        out["corrupted_on_use"] += 1
    except Exception as ex:
        out["other"].append(f"use: {type(ex).__name__}: {ex}")
print(json.dumps(out))
""" % D


@pytest.mark.slow
@pytest.mark.parametrize("target", ["records", "wal", "graph", "blob"])
def test_fuzz_with_valid_checksums(tmp_path, target):
    """Random byte changes whose checksums are recomputed (so only the parser's own bounds and
    consistency checks stand between the bytes and memory): the process never crashes, and
    opening either fails with StoreCorruptedError or gives a store that works."""
    src = tmp_path / "src"
    subprocess.run([sys.executable, "-c", FUZZ_MAKE, str(src)], check=True)
    proc = subprocess.run([sys.executable, "-c", FUZZ_RUNNER, str(src), str(tmp_path / "w"), target, "120", "7",
                           str(Path(__file__).resolve().parents[1] / "helpers")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"crashed (rc {proc.returncode}): {proc.stderr[-3000:]}"
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    print(target, out)
    assert not out["other"], out["other"][:5]
    assert out["corrupted"] > 0


# ------------------------------------------------------------------------------- page-level crash images

PAGE_WRITER = r"""
import os, sys, numpy as np
from memkern.store import MemoryStore
D = %d
s = MemoryStore(sys.argv[1], dim=D, fsync=sys.argv[2], snapshot_every=0, fsync_interval=3600.0)
for j in range(7):  # entries of ~3-9 KiB: most straddle 4 KiB pages
    s.add("u", f"r{j} " + "x" * (3000 + 1000 * j), np.random.default_rng(j).standard_normal(D).astype(np.float32))
os._exit(0)  # no close: a crash image of the log is made from the file as written
""" % D


@pytest.mark.slow
@pytest.mark.parametrize("fsync", ["always", "batch"])
def test_page_level_crash_images_of_the_log_tail(tmp_path, fsync):
    """What an OS crash or power loss can leave of the log: every byte synced before it, and each
    4 KiB page holding later bytes either persisted or not (zeroed, or a file system's stale
    blocks), in any subset (any persistence order). Under fsync="always" only the last entry was
    in flight; under "batch" (no sync since the open) every entry was. Every image opens (never
    refused), with the records of a prefix of the entries that keeps every synced one."""
    import shutil

    from store_files import log_entries

    src = tmp_path / "src"
    subprocess.run([sys.executable, "-c", PAGE_WRITER, str(src), fsync], check=True)
    wal = src / "wal.log"
    data = wal.read_bytes()
    ents = log_entries(wal)
    assert len(ents) == 7
    # synced before the crash: every entry but the last ("always"), or the header only ("batch")
    synced_end = ents[-1][0] if fsync == "always" else ents[0][0]
    assert all(struct.unpack_from("<Q", data, o + 8)[0] <= synced_end for o, _, _ in ents)
    first = synced_end // 4096
    pages = list(range(first, (len(data) + 4095) // 4096))
    rng = np.random.default_rng(0)
    masks = range(1 << len(pages)) if len(pages) <= 6 else rng.integers(0, 1 << len(pages), 64)
    seen = set()
    for mask in masks:
        for stale in (False, True):
            img = bytearray(data)
            for k, pg in enumerate(pages):
                if int(mask) >> k & 1:
                    continue  # this page reached the disk
                lo, hi = max(pg * 4096, synced_end), min(len(img), (pg + 1) * 4096)
                img[lo:hi] = rng.integers(0, 256, hi - lo, dtype=np.uint8).tobytes() if stale else bytes(hi - lo)
            w = tmp_path / "w"
            shutil.rmtree(w, ignore_errors=True)
            shutil.copytree(src, w)
            (w / "wal.log").write_bytes(bytes(img))
            with MemoryStore(w) as s:
                got = [s.get(int(i)).summary.split()[0] for i in s.ids("u")]
            n = len(got)
            assert got == [f"r{j}" for j in range(n)], (mask, stale, got)  # a prefix, in order
            assert n >= sum(1 for o, h, ln in ents if o + h + ln <= synced_end), (mask, stale, n)
            seen.add(n)
    assert len(seen) > 1  # images that keep more and fewer entries were both drawn
