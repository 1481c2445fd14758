"""Read-only views of a store beside its writer (``MemoryStore(path, read_only=True)``,
``refresh()``): in one process, across the writer's snapshots, and as two real processes under
load, where a reader must never see part of a write."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from memkern import MemoryStore
from memkern.errors import MemkernError, MemkernTypeError, MemkernValueError

DIM = 8


def vecs(n, seed):
    return np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)


def files(path):
    return {n: (os.stat(path / n).st_mtime_ns, os.stat(path / n).st_size) for n in sorted(os.listdir(path))}


def test_a_view_is_the_state_at_its_open_until_refresh(tmp_path):
    w = MemoryStore(tmp_path / "s", dim=DIM, metric="ip", snapshot_every=0)
    w.add_batch("a", ["x0", "x1"], vecs(2, 0))
    r = MemoryStore(tmp_path / "s", read_only=True)
    assert r.read_only and not w.read_only and r.count("a") == 2
    ids = w.add_batch("a", ["x2", "x3", "x4"], vecs(3, 1))
    w.merge(int(ids[0]), "x2 merged", vecs(1, 2)[0])
    assert r.count("a") == 2                       # a view does not move by itself
    assert r.refresh() == 2                        # one add_batch entry, one merge entry
    assert r.count("a") == 5 and r.get(int(ids[0])).summary == "x2 merged"
    np.testing.assert_array_equal(r.embeddings(ids), w.embeddings(ids))
    q = vecs(2, 3)
    for a, b in zip(r.search("a", q, k=5), w.search("a", q, k=5)):
        np.testing.assert_array_equal(a, b)
    assert r.refresh() == 0
    assert w.refresh() == 0                        # a writer is always current
    r.close()
    w.close()


def test_refresh_follows_the_log_across_snapshots_and_reopens_a_view_left_behind(tmp_path, caplog):
    w = MemoryStore(tmp_path / "s", dim=DIM, metric="ip", snapshot_every=0)
    w.add("a", "first", vecs(1, 0)[0])
    r = MemoryStore(tmp_path / "s", read_only=True)
    w.snapshot()                                   # the log r follows is retired (renamed over)
    w.add("a", "second", vecs(1, 1)[0])
    assert r.refresh() == 1 and r.count("a") == 2
    w.snapshot()
    w.snapshot()                                   # two generations on: the log r needs is gone
    w.add("a", "third", vecs(1, 2)[0])
    with caplog.at_level("INFO", logger="memkern"):
        r.refresh()
    assert "reopened" in caplog.text
    assert r.count("a") == 3
    w.close()                                      # close snapshots again
    w2 = MemoryStore(tmp_path / "s")
    w2.add("a", "fourth", vecs(1, 3)[0])
    r.refresh()
    assert sorted(x.summary for x in r.get_batch(r.ids("a"))) == ["first", "fourth", "second", "third"]
    w2.close()
    r.close()


def test_a_view_refuses_writes_and_changes_no_file(tmp_path):
    w = MemoryStore(tmp_path / "s", dim=DIM, metric="ip")
    (rid,) = w.add_batch("a", ["x"], vecs(1, 0))
    before = files(tmp_path / "s")
    r = MemoryStore(tmp_path / "s", read_only=True)
    for call in (lambda: r.add("a", "y", vecs(1, 1)[0]), lambda: r.delete(int(rid)), lambda: r.flush(),
                 lambda: r.compact(), lambda: r.snapshot(), lambda: r.update(int(rid), summary="z")):
        with pytest.raises(MemkernValueError, match="read_only"):
            call()
    r.refresh()
    r.close()
    assert files(tmp_path / "s") == before
    assert w.get(int(rid)).summary == "x"
    w.close()


def test_a_view_of_no_store_or_of_another_shape_is_refused(tmp_path):
    with pytest.raises(MemkernError, match="no store there"):
        MemoryStore(tmp_path / "none", read_only=True)
    assert not (tmp_path / "none").exists()        # nothing created
    with pytest.raises(MemkernTypeError, match="read_only: expected a bool"):
        MemoryStore(tmp_path / "s", dim=DIM, read_only="yes")
    MemoryStore(tmp_path / "s", dim=DIM, metric="ip").close()
    with pytest.raises(MemkernValueError, match="dim=16"):
        MemoryStore(tmp_path / "s", dim=16, read_only=True)


def test_a_torn_tail_is_an_append_in_progress_to_a_view(tmp_path):
    w = MemoryStore(tmp_path / "s", dim=DIM, metric="ip", snapshot_every=0)
    w.add("a", "first", vecs(1, 0)[0])
    w.add("a", "second", vecs(1, 1)[0])
    log = tmp_path / "s" / "wal.log"
    whole = log.read_bytes()
    with open(log, "r+b") as f:                    # the last entry half written
        f.truncate(len(whole) - 10)
    r = MemoryStore(tmp_path / "s", read_only=True)
    assert r.count("a") == 1 and not r.native.recovered_torn_tail
    assert r.refresh() == 0
    with open(log, "r+b") as f:                    # ... and then finished
        f.seek(0, 2)
        f.write(whole[-10:])
    assert r.refresh() == 1 and r.count("a") == 2
    assert log.read_bytes() == whole               # the view cut nothing
    r.close()
    w.close()


WRITER = textwrap.dedent("""
    import sys, time, numpy as np
    from memkern import MemoryStore
    path, seconds, batch, every = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    s = MemoryStore(path, dim=8, metric="ip", fsync="never", snapshot_every=every)
    rng = np.random.default_rng(0)
    print("ready", flush=True)
    t_end, b, first = time.time() + seconds, 0, None
    while time.time() < t_end:
        v = rng.standard_normal((batch, 8)).astype(np.float32)
        v[:, 0] = 0
        ids = s.add_batch("ns", [f"b{b}-{j} v0" for j in range(batch)], v, metas=[{"batch": b, "of": batch}] * batch)
        first = int(ids[0]) if first is None else first
        e = rng.standard_normal(8).astype(np.float32)
        e[0] = b + 1                               # a merge's summary and vector change in one entry
        s.merge(first, f"merged v{b + 1}", e)
        b += 1
    s.close()
    print("done", b, flush=True)
""")


def check_view(r) -> int:
    """Every add_batch whole (all ``of`` records of its batch) and every merge whole (the summary
    names the version the vector's first component carries)."""
    ids = r.ids("ns")
    by_batch: dict = {}
    recs = r.get_batch(ids)
    for rec in recs:
        by_batch.setdefault(rec.meta["batch"], []).append(rec)
    for b, rs in by_batch.items():
        assert len(rs) == rs[0].meta["of"], (b, len(rs))
    if len(ids):
        embs = r.embeddings(ids)
        for rec, e in zip(recs, embs):
            assert rec.summary.endswith(f"v{int(round(float(e[0])))}"), (rec.summary, e[0])
    return len(ids)


@pytest.mark.slow
def test_two_processes_a_reader_never_sees_part_of_a_write(tmp_path):
    path = tmp_path / "s"
    MemoryStore(path, dim=DIM, metric="ip").close()
    seconds = float(os.environ.get("MEMKERN_READER_SECONDS", "4"))
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(seconds), "8", "40"],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    r = MemoryStore(path, read_only=True)
    refreshes = opens = 0
    seen = []
    while proc.poll() is None:
        r.refresh()
        refreshes += 1
        seen.append(check_view(r))
        if refreshes % 10 == 0:                    # fresh opens race the writer's snapshots too
            with MemoryStore(path, read_only=True) as v:
                check_view(v)
                opens += 1
    out = proc.communicate()[0]
    assert proc.returncode == 0, out
    assert seen == sorted(seen)                    # the writer only adds: a view never goes back
    r.refresh()
    check_view(r)
    final = MemoryStore(path)
    assert r.ids("ns").tolist() == final.ids("ns").tolist()
    assert refreshes > 5 and opens > 0 and len(set(seen)) > 2
    final.close()
    r.close()
