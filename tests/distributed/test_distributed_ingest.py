"""memkern.distributed.ingest on Ray Data with the offline MiniLM: a rerun writes nothing twice."""
from __future__ import annotations

import json

import numpy as np
import pytest

from _ray_local import local_ray


@pytest.fixture(scope="module")
def ray():
    return local_ray()


def _sessions(n):
    topics = ["hiking in the alps", "learning the cello", "a new job at a bakery", "my cat Miso", "cooking ramen",
              "a trip to Lisbon"]
    out = []
    for i in range(n):
        t = topics[i % len(topics)]
        out.append({"session_id": f"u{i % 3}:s{i}", "date": f"2024-01-{i + 1:02d}", "turns": [
            {"role": "user", "content": f"I want to talk about {t}."},
            {"role": "assistant", "content": f"Sure, tell me more about {t}."},
            {"role": "user", "content": f"Lately {t} takes most of my weekends."},
        ]})
    return out


def _user(s):
    return s["session_id"].split(":")[0]


@pytest.mark.slow
def test_rerun_writes_nothing_twice(ray, tmp_path):
    from memkern.distributed import ShardedStore, ingest

    path = tmp_path / "sessions.jsonl"
    sess = _sessions(6)
    path.write_text("\n".join(json.dumps(s) for s in sess) + "\n")
    with ShardedStore(tmp_path / "store", dim=384, metric="cos", shards=2) as store:
        # a first run that stops part-way (here: the first 4 sessions)
        r1 = ingest(store, path, namespace=_user, batch_size=2, limit=4, progress=False, turn_level=True)
        assert r1.written == 4 and r1.skipped == 0 and r1.records >= 4
        counts1 = {ns: store.count(ns) for ns in store.namespaces()}
        # the rerun over the whole file writes only the 2 missing sessions
        r2 = ingest(store, path, namespace=_user, batch_size=2, progress=True, turn_level=True)
        assert r2.sessions == 6 and r2.skipped == 4 and r2.written == 2
        # and a third run writes nothing at all
        r3 = ingest(store, path, namespace=_user, batch_size=2, progress=False, turn_level=True)
        assert r3.written == 0 and r3.skipped == 6 and r3.records == 0
        total = sum(store.count(ns) for ns in store.namespaces())
        assert total == r1.records + r2.records
        # every session's topics exactly once, in its user's namespace, tagged with the session
        for ns in store.namespaces():
            recs = store.get_batch(store.ids(ns))
            seen = {}
            for r in recs:
                seen.setdefault(r.meta["ingest_session"], set()).add(r.id)
                assert r.meta["ingest_session"].startswith(ns + ":")
                assert len(r.turn_ids) == len(r.turns) >= 1  # turn_level: turn records
            assert sorted(seen) == sorted(s["session_id"] for s in sess if _user(s) == ns)
            assert counts1.get(ns, 0) <= store.count(ns)
        # the stored vectors are MiniLM's unit vectors of the summaries
        ns = store.namespaces()[0]
        ids = store.ids(ns)
        e = store.embeddings(ids)
        np.testing.assert_allclose(np.linalg.norm(e, axis=1), 1.0, atol=1e-5)
        assert e.shape[1] == 384 and float(np.abs(e[0] - e[-1]).max()) > 0


@pytest.mark.slow
def test_shard_refuses_a_session_it_holds(ray, tmp_path):
    """The write-time check: items for sessions a shard already holds are not written again, even
    when the caller did not filter them (two pipelines racing, a retried batch)."""
    from memkern.distributed import ShardedStore

    with ShardedStore(tmp_path, dim=4, shards=2) as store:
        item = dict(session_id="s1", namespace="bob", summaries=["x", "y"],
                    embeddings=np.eye(4, dtype=np.float32)[:2], turns=[[], []], metas=[{}, {}], turn_embeddings=None)
        first = store.write_sessions([item])
        assert sum(len(v) for v in first.values()) == 1 and store.count("bob") == 2
        again = store.write_sessions([item, dict(item)])
        assert sum(len(v) for v in again.values()) == 0 and store.count("bob") == 2
        assert store.ingested_sessions() == {("bob", "s1")}
        # the ledger is the store: a restarted shard still refuses it
        s = store.shard_of("bob")
        pid = ray.get(store.actors[s].ping.remote())
        ray.kill(store.actors[s], no_restart=False)
        import time

        deadline = time.monotonic() + 60
        while True:
            try:
                if ray.get(store.actors[s].ping.remote()) != pid:
                    break
            except ray.exceptions.RayActorError:
                pass
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert sum(len(v) for v in store.write_sessions([item]).values()) == 0 and store.count("bob") == 2
        # the same session id in another namespace is another session
        other = store.write_sessions([dict(item, namespace="carol")])
        assert sum(len(v) for v in other.values()) == 1


@pytest.mark.slow
def test_bad_arguments(ray, tmp_path):
    from memkern.distributed import ShardedStore, ingest
    from memkern.errors import MemkernTypeError, MemkernValueError

    with pytest.raises(MemkernTypeError, match="store"):
        ingest(object(), [])
    with ShardedStore(tmp_path, dim=4, shards=1) as store:
        with pytest.raises(MemkernValueError, match="extractor"):
            ingest(store, [], extractor="magic")
        with pytest.raises(MemkernValueError, match="batch_size"):
            ingest(store, [], batch_size=0)
        dup = [{"session_id": "a", "turns": [{"role": "user", "content": "x"}]}] * 2
        with pytest.raises(MemkernValueError, match="unique session ids"):
            ingest(store, dup, progress=False)


def test_sources_jsonl_and_locomo(tmp_path):
    """The pipeline's reader: JSONL (one session per line, validated) and the benchmark layouts
    through memkern.data's loaders (LoCoMo sessions keep their sample in the id)."""
    from samples import locomo_sample as _sample

    from memkern.data.schema import DatasetFormatError
    from memkern.distributed.ingest import load_sessions_any

    loco = tmp_path / "locomo.json"
    loco.write_text(json.dumps([_sample("conv-7")]))
    ss = load_sessions_any(loco)
    assert [s["session_id"] for s in ss] == ["conv-7:session_1", "conv-7:session_2"]
    assert all(t["content"] for s in ss for t in s["turns"])
    good = tmp_path / "a.jsonl"
    good.write_text(json.dumps({"session_id": "x", "turns": [{"role": "user", "content": "hi"}]}) + "\n\n"
                    + json.dumps([{"content": "bare list"}]) + "\n")
    got = load_sessions_any(good)
    assert [s["session_id"] for s in got] == ["x", "s2"] and got[1]["turns"][0]["role"] == "user"
    bad = tmp_path / "b.jsonl"
    bad.write_text(json.dumps({"session_id": "x", "turns": []}) + "\n{not json\n")
    with pytest.raises(DatasetFormatError, match="line 2"):
        load_sessions_any(bad)


_WRITER = r"""
import sys
import numpy as np
from memkern.distributed.sharded.actor import Shard

sh = Shard(sys.argv[1], 0, 4, "ip", {"fsync": "always", "snapshot_every": 7})
for i in range(int(sys.argv[2])):
    item = dict(session_id=f"s{i}", namespace=f"u{i % 3}", summaries=[f"s{i} a", f"s{i} b", f"s{i} c"],
                embeddings=np.eye(4, dtype=np.float32)[:3] + i, turns=[[], [], []], metas=[{}, {}, {}])
    sh.add_sessions("ingest_session", [item])
    print(i, flush=True)
"""


def _items(n):
    return [dict(session_id=f"s{i}", namespace=f"u{i % 3}", summaries=[f"s{i} a", f"s{i} b", f"s{i} c"],
                 embeddings=np.eye(4, dtype=np.float32)[:3] + i, turns=[[], [], []], metas=[{}, {}, {}])
            for i in range(n)]


def test_ledger_after_a_crash_loses_and_duplicates_nothing_and_reads_no_record(tmp_path):
    """A writer killed (SIGKILL) in the middle of writing sessions, then a restart: the shard's
    ledger holds exactly the sessions whose records are in the store (a session's records and its
    ledger entry are one atomic write), it is read from the store's meta index without reading a
    single record, and a rerun of every session writes each missing one once and nothing twice."""
    import os
    import signal
    import subprocess
    import sys

    from memkern.distributed.sharded.actor import Shard

    d = str(tmp_path / "shard")
    p = subprocess.Popen([sys.executable, "-c", _WRITER, d, "400"], stdout=subprocess.PIPE, text=True,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    for _ in range(12):  # let it write a dozen sessions (snapshots included), then kill it mid-stream
        p.stdout.readline()
    p.send_signal(signal.SIGKILL)
    p.wait()
    sh = Shard(d, 0, 4, "ip", {})
    try:
        def no_reads(*a, **k):
            raise AssertionError("the ledger read a record")

        sh.store.get_batch = no_reads
        sh.store.get = no_reads
        ledger = set(sh.ingested_sessions("ingest_session"))
        del sh.store.get_batch, sh.store.get
        # the ledger is exactly the sessions that are in the store, each with all 3 of its records
        held: dict = {}
        for ns in sh.store.namespaces():
            for r in sh.store.get_batch(sh.store.ids(ns)):
                held.setdefault((ns, r.meta["ingest_session"]), []).append(r.summary)
        assert ledger == set(held) and len(ledger) >= 12
        assert all(len(v) == 3 for v in held.values())
        # the rerun writes the missing sessions once, the held ones not again
        want = {(f"u{i % 3}", f"s{i}") for i in range(30)}
        written = sh.add_sessions("ingest_session", _items(30))
        assert {(ns, sid) for sid, ns, _ in written} == want - ledger
        assert sum(sh.store.count(ns) for ns in sh.store.namespaces()) == 3 * len(want | ledger)
        assert sh.add_sessions("ingest_session", _items(30)) == []
    finally:
        sh.close()
