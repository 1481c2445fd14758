"""Metadata filters, time ranges, event_time and the recency prior in MemoryStore.search (issue 13
item 6): applied inside the index search, never by over-fetching. The tests taking ``make_store``
also run on InMemoryStore (tests/conftest.py)."""
from __future__ import annotations

import shutil
import time

import numpy as np
import pytest

from memkern import MemkernError, MemkernTypeError, MemkernValueError
from memkern import _store
from memkern.store import MemoryStore

from store_faults_common import D, _no_fault, emb, native  # noqa: E402,F401  (_no_fault: autouse)


def _ids(a) -> list[int]:
    return [int(i) for i in np.asarray(a).ravel() if i >= 0]


def _exact(s: MemoryStore, q: np.ndarray, allowed: list[int], k: int) -> list[int]:
    e = s.embeddings(np.asarray(allowed, dtype=np.int64))  # unit vectors for metric "cos"
    sc = e @ q
    order = sorted(range(len(allowed)), key=lambda i: (-sc[i], allowed[i]))[:k]
    return [allowed[i] for i in order]


METAS = [
    {"user": "alice", "n": 1, "flag": True, "tag": "a"},
    {"user": "bob", "n": 1.0, "flag": False, "tag": "b"},
    {"user": "alice", "n": 2, "flag": 1, "tag": "c"},
    {"user": "carol", "n": "1", "tag": "a", "nested": {"user": "alice"}},
    {"user": "alice\u00e9\"\\", "n": -0.0, "tag": None},
    {},
]


def test_each_operator_and_json_equality(make_store):
    with make_store(D) as s:
        ids = s.add_batch("u", [f"r{i}" for i in range(len(METAS))], np.stack([emb(i) for i in range(len(METAS))]),
                          metas=METAS)
        q = emb(100)

        def f(flt):
            got, _ = s.search("u", q, k=10, filter=flt)
            return sorted(_ids(got))

        assert f({"user": "alice"}) == [ids[0], ids[2]]
        assert f({"user": {"$eq": "alice"}}) == [ids[0], ids[2]]
        assert f({"user": {"$in": ["bob", "carol"]}}) == [ids[1], ids[3]]
        assert f({"user": {"$in": []}}) == []
        assert f({"n": 1}) == [ids[0], ids[1]]              # 1 == 1.0, "1" is a string
        assert f({"n": 1.0}) == [ids[0], ids[1]]
        assert f({"n": "1"}) == [ids[3]]
        assert f({"n": 0}) == [ids[4]]                      # -0.0 == 0
        assert f({"flag": True}) == [ids[0]]                # True != 1
        assert f({"flag": 1}) == [ids[2]]
        assert f({"flag": False}) == [ids[1]]
        assert f({"user": "alice", "tag": "c"}) == [ids[2]]  # AND
        assert f({"user": "alice", "tag": "b"}) == []
        assert f({"user": "alice\u00e9\"\\"}) == [ids[4]]   # escapes / non-ASCII in stored JSON
        assert f({"tag": {"$in": ["a", "b"]}}) == [ids[0], ids[1], ids[3]]
        assert f({"missing": 1}) == []
        assert f({"nested": "x"}) == []                     # nested values are not filterable
        assert f({"n": np.int64(2)}) == [ids[2]]            # numpy scalars
        # the meta change of an update is seen at once
        s.update(ids[5], meta={"user": "alice"})
        assert f({"user": "alice"}) == [ids[0], ids[2], ids[5]]
        s.update(ids[0], meta={"user": "zed"})
        assert f({"user": "alice"}) == [ids[2], ids[5]]


def test_bad_filters_raise_naming_filter(make_store):
    with make_store(D) as s:
        s.add("u", "x", emb(0), meta={"a": 1})
        for flt in (["a"], {"a": {"$gt": 1}}, {"a": {"$eq": 1, "$in": [1]}}, {"a": [1, 2]}, {"a": None},
                    {"a": {"$in": "ab"}}, {"a": {"$in": [[1]]}}, {"a": float("nan")}, {"a": 10 ** 400},
                    {5: 1}, {"": 1}, {f"k{i}": 1 for i in range(65)}, {"a": {"$in": list(range(5000))}},
                    {"a": "x" * 5000}, {"a": "\ud800"}, {"a": {"x": 1}}):
            with pytest.raises((MemkernValueError, MemkernTypeError), match="filter"):
                s.search("u", emb(1), k=2, filter=flt)
        for tr in ((1,), (None, None, None), (5, 1), ("a", None), (float("nan"), None), 3):
            with pytest.raises((MemkernValueError, MemkernTypeError), match="time_range"):
                s.search("u", emb(1), k=2, time_range=tr)
        with pytest.raises(MemkernValueError, match="time_field"):
            s.search("u", emb(1), k=2, time_range=(0, None), time_field="birth")


def test_turn_records_see_their_topic_meta(make_store):
    with make_store(D) as s:
        for i, user in enumerate(["alice", "bob"]):
            s.add("u", f"topic {user}", emb(i), [{"role": "user", "content": f"hello from {user}"}],
                  meta={"user": user}, turn_embeddings=emb(10 + i)[None, :])
        got, _ = s.search("u", emb(50), k=5, level="turn", filter={"user": "bob"})
        recs = s.get_batch(_ids(got))
        assert [r.summary for r in recs] == ["hello from bob"]
        got, _ = s.search("u", emb(50), k=5, level="turn", filter={"turn_position": 0})  # the turn's own meta
        assert len(_ids(got)) == 2


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """20,000 records in one HNSW namespace; meta 'bucket' = i % 100 (1% each), 'half' = i % 2;
    event_time = i (so a 200-second window is 1%)."""
    p = tmp_path_factory.mktemp("big") / "s"
    n = 20000
    rng = np.random.default_rng(0)
    e = rng.standard_normal((n, D)).astype(np.float32)
    s = MemoryStore(p, dim=D, metric="cos", M=8, ef_construction=40, snapshot_every=0, fsync="never")
    s.add_batch("u", [f"r{i}" for i in range(n)], e, metas=[{"bucket": i % 100, "half": i % 2} for i in range(n)],
                event_times=[float(i) for i in range(n)])
    assert s._native.index_kind("u", _store.Level.topic) == "hnsw"
    yield s
    s.close()


@pytest.mark.slow
def test_one_percent_filter_returns_k_exact_results(big):
    s = big
    k = 20
    qs = np.random.default_rng(1).standard_normal((8, D)).astype(np.float32)
    got, sc = s.search("u", qs, k=k, ef=32, filter={"bucket": 7})
    allowed = list(range(7, 20000, 100))
    for b in range(len(qs)):
        ids = _ids(got[b])
        assert len(ids) == k and all(i % 100 == 7 for i in ids)
        assert ids == _exact(s, qs[b], allowed, k)  # few matches: an exact scan of them
    # over-fetching (search 20 unfiltered, keep bucket 7) would return almost nothing
    plain, _ = s.search("u", qs, k=k, ef=32)
    assert sum(i % 100 == 7 for i in _ids(plain)) < k


def test_one_percent_time_window_returns_k_exact_results(big):
    """A 1% time window: its records are enumerated from the time index and scanned exactly."""
    s = big
    k = 10
    qs = np.random.default_rng(2).standard_normal((8, D)).astype(np.float32)
    got, _ = s.search("u", qs, k=k, ef=64, time_range=(5000, 5200))
    for b in range(len(qs)):
        assert _ids(got[b]) == _exact(s, qs[b], list(range(5000, 5200)), k)


def test_filter_inside_the_graph_search(big):
    """A 25% filter (meta AND time) goes through hnswlib's filter functor: k results, all allowed,
    near-exact."""
    s = big
    k = 10
    qs = np.random.default_rng(2).standard_normal((8, D)).astype(np.float32)
    got, _ = s.search("u", qs, k=k, ef=64, filter={"half": 1}, time_range=(None, 10000))
    hits = 0
    for b in range(len(qs)):
        ids = _ids(got[b])
        assert len(ids) == k and all(i % 2 == 1 and i < 10000 for i in ids)
        hits += len(set(ids) & set(_exact(s, qs[b], list(range(1, 10000, 2)), k)))
    assert hits >= 0.9 * k * len(qs)


def test_time_range_and_time_fields(make_store):
    with make_store(D) as s:
        a = s.add("u", "a", emb(0), event_time=1000.0)
        b = s.add("u", "b", emb(1), event_time=2000.0)
        c = s.add("u", "c", emb(2))  # no event time: falls back to created_at (now)
        now = time.time()
        assert s.get(a).event_time == 1000.0 and s.get(c).event_time is None

        def tr(lo, hi, field="event"):
            got, _ = s.search("u", emb(9), k=5, time_range=(lo, hi), time_field=field)
            return sorted(_ids(got))

        assert tr(1000, 2000) == [a]            # inclusive start, exclusive end
        assert tr(1000, 2000.5) == [a, b]
        assert tr(None, 1500) == [a]
        assert tr(now - 3600, None) == [c]
        assert tr(now - 3600, None, "created") == [a, b, c]
        assert tr(None, 1e9, "created") == []
        s.update(a, summary="a2")
        assert tr(s.get(a).updated_at, None, "updated") == [a]
        assert s.get(a).event_time == 1000.0    # update keeps event_time
        s.merge(a, "a3", emb(3), event_time=3000.0)
        assert s.get(a).event_time == 3000.0 and tr(2500, 3500) == [a]
        s.invalidate(b, "stale")
        got, _ = s.search("u", emb(9), k=5, time_range=(s.get(b).updated_at, None), time_field="updated",
                          include_invalidated=True)
        assert _ids(got) == [b]
        with pytest.raises(MemkernValueError, match="event_time"):
            s.add("u", "x", emb(4), event_time=float("nan"))
        with pytest.raises(MemkernValueError, match="event_times"):
            s.add_batch("u", ["x"], emb(4)[None, :], event_times=[1.0, 2.0])


def test_event_time_persists_and_old_snapshots_open(tmp_path):
    p = tmp_path / "s"
    with MemoryStore(p, dim=D, snapshot_every=0) as s:
        a = s.add("u", "a", emb(0), [{"role": "user", "content": "t"}], event_time=1234.5,
                  turn_embeddings=emb(1)[None, :])
        b = s.add_batch("u", ["b", "c"], np.stack([emb(2), emb(3)]), event_times=[None, 99.0])
        s.update(int(b[0]), event_time=77.0)
        shutil.copytree(p, tmp_path / "crash")
    for path in (tmp_path / "crash", p):  # log replay, then snapshot
        with MemoryStore(path) as s:
            ta = s.get(a)
            assert ta.event_time == 1234.5 and s.get(ta.turn_ids[0]).event_time == 1234.5
            assert s.get(int(b[0])).event_time == 77.0 and s.get(int(b[1])).event_time == 99.0
    # a store whose snapshot has no event times (records.bin format 1) still opens: event_time None
    import struct
    import zlib
    from pathlib import Path
    old = tmp_path / "old"
    shutil.copytree(Path(__file__).resolve().parents[1] / "fixtures" / "store_v2" / "store", old)
    snap = next(old.glob("snap-*"))
    rec = bytearray((snap / "records.bin").read_bytes())
    assert struct.unpack_from("<I", rec, 8)[0] == 2
    body = rec[20:-4]
    # the event-time section ends the body: u64 count, then (i64 id, f64 time) per record with one
    n_ev = next(n for n in range(1, 64) if struct.unpack_from("<Q", body, len(body) - 8 - 16 * n)[0] == n)
    assert n_ev == 11  # "big" 0-8 but the deleted 2, "small"'s topic 9 and its turns 10, 11
    body = body[:len(body) - 8 - 16 * n_ev]
    new = bytearray(rec[:8]) + struct.pack("<IQ", 1, len(body)) + body
    new += struct.pack("<I", zlib.crc32(bytes(new)))
    (snap / "records.bin").write_bytes(bytes(new))
    with MemoryStore(old) as s:
        assert s.get(0).event_time is None and s.get(0).summary == "big 0 updated"
        assert s.get(10).event_time is None and s.count("small") == 3


def test_recency_prior(make_store):
    with make_store(D, "cos") as s:
        v = emb(0)
        old = s.add("u", "dog", v, event_time=0.0)
        new = s.add("u", "dog", v, event_time=1000.0)
        got, sc = s.search("u", v, k=2)
        assert got[0].tolist() == [old, new]  # tie: id ascending
        got, sc = s.search("u", v, k=2, recency=100.0, recency_weight=0.5, now=1000.0)
        assert got[0].tolist() == [new, old]
        np.testing.assert_allclose(sc[0], [1.0 + 0.5, 1.0 + 0.5 * 2 ** -10], rtol=1e-5)
        got, sc = s.search("u", v, k=2, mode="lexical", texts=["dog"], recency=1000.0, now=2000.0)
        assert got[0].tolist() == [new, old]
        base, bsc = s.search("u", v, k=2, mode="lexical", texts=["dog"])
        np.testing.assert_allclose(sc[0], [bsc[0][0] + 0.1 * 0.5, bsc[0][0] + 0.1 * 0.25], rtol=1e-5)
        # the prior reranks among candidates only: the top-k can come from beyond k
        got, _ = s.search("u", v, k=1, recency=100.0, recency_weight=0.5, now=1000.0)
        assert got[0].tolist() == [new]


@pytest.mark.parametrize("spec", ["write:1", "fsync:1"])
def test_failed_writes_leave_filters_and_event_times_unchanged(tmp_path, spec):
    p = tmp_path / "s"
    with MemoryStore(p, dim=D, snapshot_every=0) as s:
        a = s.add("u", "a", emb(0), meta={"user": "alice"}, event_time=10.0)
    s = MemoryStore(p, snapshot_every=0)

    def view():
        got, _ = s.search("u", emb(5), k=5, filter={"user": "alice"}, time_range=(0, 20))
        return _ids(got), s.get(a).event_time

    before = view()
    for op in (lambda: s.update(a, meta={"user": "bob"}), lambda: s.merge(a, "b", emb(1), event_time=50.0),
               lambda: s.add("u", "c", emb(2), meta={"user": "alice"}, event_time=15.0)):
        native()._test_set_fault(spec)
        with pytest.raises(MemkernError):
            op()
        native()._test_set_fault("")
        assert view() == before
    s.close()
    with MemoryStore(p) as s2:
        got, _ = s2.search("u", emb(5), k=5, filter={"user": "alice"}, time_range=(0, 20))
        assert (_ids(got), s2.get(a).event_time) == before



def test_time_range_bounds_when_a_meta_clause_drives_the_search(big):
    """With a meta clause more selective than the time range, the candidates come from the meta
    index and the time range is checked on each (``FilterSpec::time_ok``): its start is inclusive
    and its end exclusive there too. The queries are the records sitting exactly on the bounds
    (bucket 0 holds ids 0, 100, ..., and event_time = id), so a wrong comparison moves the top hit."""
    s = big
    on_end, on_start = s.embeddings(np.array([10000, 5000], dtype=np.int64))
    got, _ = s.search("u", on_end[None, :], k=5, ef=64, filter={"bucket": 0}, time_range=(None, 10000))
    ids = _ids(got[0])
    assert len(ids) == 5 and all(i % 100 == 0 and i < 10000 for i in ids)
    got, _ = s.search("u", on_start[None, :], k=5, ef=64, filter={"bucket": 0}, time_range=(5000, None))
    ids = _ids(got[0])
    assert ids[0] == 5000 and all(i % 100 == 0 and i >= 5000 for i in ids)
