"""Read-only views of a store beside its writer (``MemoryStore(path, read_only=True)``,
``refresh()``): in one process, across the writer's snapshots, and as two real processes under
load, where a reader must never see part of a write."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from memkern import MemoryStore
from memkern.errors import MemkernError, MemkernTypeError, MemkernValueError
from memkern.store.native import native_module

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
    from memkern import InMemoryStore

    mem = InMemoryStore(DIM)
    assert not mem.read_only and mem.refresh() == 0
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


def test_a_view_opened_while_the_next_log_is_empty_follows_the_log_still_written(tmp_path):
    """A snapshot creates its next log before it switches appends to it: a view opened in between
    sees that log empty and must go on following the one the writer still appends to (else the
    writes made before the switch are never seen). Held at that step with the snapshot gate."""
    nat = native_module()
    w = MemoryStore(tmp_path / "s", dim=DIM, metric="ip", snapshot_every=0)
    w.add_batch("a", ["x0", "x1"], vecs(2, 0))
    nat._test_snapshot_gate("created")
    try:
        t = threading.Thread(target=w.snapshot)
        t.start()
        assert nat._test_wait_snapshot_gate(30.0), "the snapshot never reached its created step"
        assert len([n for n in os.listdir(tmp_path / "s") if n.startswith("wal")]) == 2
        r = MemoryStore(tmp_path / "s", read_only=True)
        assert r.count("a") == 2
        w.add_batch("a", ["y0", "y1"], vecs(2, 1))          # still to the old log
        nat._test_release_snapshot_gate()
        t.join(30)
        w.add("a", "z", vecs(1, 2)[0])                       # to the new one
        r.refresh()
        assert sorted(x.summary for x in r.get_batch(r.ids("a"))) == ["x0", "x1", "y0", "y1", "z"]
        r.close()
    finally:
        nat._test_release_snapshot_gate()
        nat._test_snapshot_gate("")
    w.close()


BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_readers.py"


@pytest.mark.slow
def test_two_processes_a_reader_never_sees_part_of_a_write(tmp_path):
    """The short version of ``bench/bench_readers.py``: one writer, two reader processes (each
    refreshing and checking every batch and merge whole, and opening fresh views that race the
    writer's snapshots) for a few seconds."""
    out = tmp_path / "readers.json"
    seconds = os.environ.get("MEMKERN_READER_SECONDS", "4")
    r = subprocess.run([sys.executable, str(BENCH), "--seconds", seconds, "--readers", "2", "--snapshot-every", "40",
                        "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    got = json.loads(out.read_text())
    assert got["errors"] == 0 and got["torn_reads"] == 0 and got["final_views_equal_store"], got
    assert got["refreshes"] > 10 and got["fresh_opens"] > 0 and got["writer_batches"] > 20, got
