"""Random metadata filters, time ranges and invalidations on MemoryStore and InMemoryStore against
a numpy reference: every level (topic, turn; turn+topic applies them inside its turn stage on both),
every mode (dense, lexical, hybrid).

The sizes are chosen so that the native search takes each of its filter paths: the exact scan of a
selective clause's matches, and the bitmap / hash-set functor of an unselective one. The cases the
bitmap path once got wrong are the ones drawn most: a clause matching many records while another
clause, the time range or invalidation excludes them all (the answer is all ``-1`` padding)."""
from __future__ import annotations

import numpy as np
import pytest

from memkern.store.memory import InMemoryStore
from memkern.store import PAD_SCORE, MemoryStore

D = 8
N_TOPICS = 600
WORDS = [f"w{i}" for i in range(12)]
MODES = ("dense", "lexical", "hybrid")


def _data(seed: int):
    rng = np.random.default_rng(seed)
    group = rng.integers(0, 3, N_TOPICS)
    metas = [{"a": bool(g == 0), "b": bool(g == 1), "g": int(g), "tag": f"t{int(rng.integers(0, 4))}",
              "big": bool(rng.random() < 0.9)} for g in group]
    texts = [" ".join(rng.choice(WORDS, 3)) for _ in range(N_TOPICS)]
    emb = rng.standard_normal((N_TOPICS, D)).astype(np.float32)
    turns = [[{"role": "user", "content": " ".join(rng.choice(WORDS, 2))} for _ in range(2)] for _ in range(N_TOPICS)]
    temb = [rng.standard_normal((2, D)).astype(np.float32) for _ in range(N_TOPICS)]
    times = [float(i) for i in range(N_TOPICS)]  # event time i: a window [lo, hi) holds hi - lo topics
    return rng, metas, texts, emb, turns, temb, times


def _build(stores, seed):
    rng, metas, texts, emb, turns, temb, times = _data(seed)
    ids = [s.add_batch("u", texts, emb, turns=turns, metas=metas, turn_embeddings=temb, event_times=times)
           for s in stores]
    for a in ids[1:]:
        assert np.array_equal(a, ids[0])
    topic_ids = ids[0]
    # A window whose topics are all invalidated (it holds more than the native's scan limit), and
    # a scattering of others.
    lo = int(rng.integers(0, N_TOPICS // 4))
    window = (float(lo), float(lo + 320))
    dead = set(range(lo, lo + 320)) | set(rng.choice(N_TOPICS, 40, replace=False).tolist())
    for i in sorted(dead):
        for s in stores:
            s.invalidate(int(topic_ids[i]), "stale")
    return rng, window


def _reference(s, level: str, include_invalidated: bool):
    """Every record of the level: id -> (meta as seen by a filter, event time, active), and their
    vectors (the store's own, for metric ip)."""
    ids = s.ids("u", include_invalidated=True, level=level)
    recs = s.get_batch(ids)
    by_id = {int(r.id): r for r in recs}
    topics = {int(r.id): r for r in s.get_batch(s.ids("u", include_invalidated=True, level="topic"))}
    info = {}
    for r in recs:
        meta = dict(r.meta or {})
        if level == "turn":
            for k, v in (topics[int(r.topic_id)].meta or {}).items():
                meta.setdefault(k, v)
        t = r.event_time if r.event_time is not None else r.created_at
        info[int(r.id)] = (meta, t, r.status == "active")
    return np.asarray(ids, np.int64), s.embeddings(np.asarray(ids, np.int64)), info, by_id


def _allowed(info, flt, tr, include_invalidated):
    out = []
    for rid, (meta, t, active) in info.items():
        if not include_invalidated and not active:
            continue
        if tr is not None and not (tr[0] <= t < tr[1]):
            continue
        ok = True
        for k, v in (flt or {}).items():
            vals = v["$in"] if isinstance(v, dict) else [v]
            if k not in meta or not any(type(meta[k]) is type(x) and meta[k] == x for x in vals):
                ok = False
                break
        if ok:
            out.append(rid)
    return sorted(out)


def _random_query(rng, window):
    pool = [
        {"a": True, "b": True},                   # each half-ish, disjoint: empty
        {"a": True, "g": 1},                      # disjoint
        {"big": True, "g": 2},                    # unselective, non-empty
        {"big": True},
        {"tag": {"$in": ["t0", "t1"]}, "a": True},
        {"tag": "t3"},
        {"g": {"$in": [0, 2]}, "b": True},        # disjoint
        None,
    ]
    flt = pool[int(rng.integers(0, len(pool)))]
    r = rng.random()
    if r < 0.35:
        tr = window                               # every topic in it invalidated
    elif r < 0.6:
        lo = float(rng.integers(0, N_TOPICS))
        tr = (lo, lo + float(rng.integers(0, 400)))
    else:
        tr = None
    if flt is None and tr is None:
        flt = {"a": True, "b": True}
    return flt, tr


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_filters_and_time_ranges_agree_with_a_numpy_reference(tmp_path, seed):
    exact = MemoryStore(tmp_path / "exact", dim=D, metric="ip", fsync="never", snapshot_every=0, M=4,
                        ef_search=8, flat_limit=1 << 16)
    graph = MemoryStore(tmp_path / "graph", dim=D, metric="ip", fsync="never", snapshot_every=0, M=4,
                        ef_search=8, flat_limit=0)
    memory = InMemoryStore(D, "ip", ef_search=8)
    stores = (exact, graph, memory)
    try:
        rng, window = _build(stores, seed)
        refs = {(lvl, inc): _reference(exact, lvl, inc) for lvl in ("topic", "turn") for inc in (False, True)}
        empty_seen = 0
        for trial in range(60):
            flt, tr = _random_query(rng, window)
            level = ("topic", "turn")[trial % 2]
            mode = MODES[(trial // 2) % 3]
            inc = bool(rng.random() < 0.2)
            k = int(rng.choice([1, 5, 10]))
            q = rng.standard_normal((2, D)).astype(np.float32)
            texts = [" ".join(rng.choice(WORDS, 2)) for _ in range(2)]
            kw = dict(k=k, level=level, mode=mode, filter=flt, time_range=tr, include_invalidated=inc)
            if mode != "dense":
                kw["texts"] = texts
            got = {s: s.search("u", q, **kw) for s in stores}
            ids_all, vecs, info, by_id = refs[(level, inc)]
            allowed = _allowed(info, flt, tr, inc)
            empty_seen += not allowed
            where = f"seed {seed} trial {trial}: {kw}"
            for s, (ids, sc) in got.items():
                assert ids.shape == (2, k) and sc.shape == (2, k), where
                for b in range(2):
                    row = [int(i) for i in ids[b] if i >= 0]
                    assert set(row) <= set(allowed), (where, s, row)
                    assert all(i == -1 for i in ids[b][len(row):]), where      # padding only at the end
                    assert np.all(sc[b][len(row):] == PAD_SCORE), where
                    if mode == "lexical":
                        terms = set(texts[b].split())
                        hits = [i for i in allowed if terms & set(by_id[i].summary.split())]
                        assert len(row) == min(k, len(hits)), (where, s)
                    else:
                        assert len(row) == min(k, len(allowed)), (where, s, len(row), len(allowed))
            # Dense: the exact stores return exactly the numpy top k (scores, ties by id).
            if mode == "dense" and allowed:
                pos = np.searchsorted(ids_all, allowed)
                ref = vecs[pos] @ q.T                                     # [n_allowed, 2]
                for b in range(2):
                    want = np.sort(ref[:, b])[::-1][:k]
                    for s in (exact, memory):
                        np.testing.assert_allclose(got[s][1][b][:len(want)], want, rtol=1e-5, atol=1e-5,
                                                   err_msg=where)
            # The exact disk store and the in-memory one agree id for id wherever scores differ.
            a, b_ = got[exact], got[memory]
            np.testing.assert_allclose(a[1], b_[1], rtol=1e-5, atol=1e-5, err_msg=where)
            for b in range(2):
                assert sorted(a[0][b].tolist()) == sorted(b_[0][b].tolist()) or \
                    np.allclose(np.sort(a[1][b]), np.sort(b_[1][b]), atol=1e-5), where
        assert empty_seen >= 10  # the empty-intersection cases were drawn
        # turn+topic applies filters and time ranges inside its turn stage, alike on both stores:
        # every returned turn passes them, and an empty intersection gives all padding.
        info, by_id = refs[("turn", False)][2], refs[("turn", False)][3]
        for kw in ({"filter": {"a": True, "b": True}}, {"time_range": window}, {"filter": {"a": True}},
                   {"time_range": (0.0, 50.0)}):
            allowed = set(_allowed(info, kw.get("filter"), kw.get("time_range"), False))
            q = rng.standard_normal((2, D)).astype(np.float32)
            for mode in MODES:
                extra = {} if mode == "dense" else {"texts": ["w1 w2", "w3"]}
                res = {}
                for s in (exact, memory):
                    ids, sc = s.search("u", q, k=5, level="turn+topic", mode=mode, **kw, **extra)
                    for b in range(2):
                        row = [int(i) for i in ids[b] if i >= 0]
                        assert set(row) <= allowed, (kw, mode, s, row)
                        if not allowed:
                            assert row == [] and np.all(sc[b] == PAD_SCORE), (kw, mode, s)
                    res[s] = (ids, sc)
                np.testing.assert_allclose(res[exact][1], res[memory][1], rtol=1e-4, atol=1e-4,
                                           err_msg=f"{kw} {mode}")
    finally:
        for s in stores:
            s.close()


@pytest.mark.slow
def test_issue_reproducer_many_matches_empty_intersection(tmp_path):
    """10,000 records, two clauses that each match half and never together; a time range over
    a period whose records were all invalidated: padding, every mode, both kinds of index."""
    n = 10_000
    rng = np.random.default_rng(5)
    vecs = rng.standard_normal((n, D)).astype(np.float32)
    for flat_limit in (1 << 16, 1024):
        with MemoryStore(tmp_path / f"s{flat_limit}", dim=D, fsync="never", snapshot_every=0,
                         flat_limit=flat_limit) as st:
            ids = st.add_batch("ns", [f"w{i % 7} x" for i in range(n)], vecs,
                               metas=[{"a": i < n // 2, "b": i >= n // 2} for i in range(n)],
                               event_times=[float(i) for i in range(n)])
            for i in range(2000, 8000):
                st.invalidate(int(ids[i]))
            for mode in MODES:
                kw = {"texts": ["w1 x"]} if mode != "dense" else {}
                for extra in ({"filter": {"a": True, "b": True}}, {"time_range": (2000.0, 8000.0)},
                              {"filter": {"a": True}, "time_range": (2500.0, 5000.0)}):
                    got, sc = st.search("ns", vecs[0], k=5, mode=mode, **extra, **kw)
                    assert got.tolist() == [[-1] * 5] and np.all(sc == PAD_SCORE), (flat_limit, mode, extra)
                got, _ = st.search("ns", vecs[0], k=5, mode=mode, time_range=(2000.0, 8000.0),
                                   include_invalidated=True, **kw)
                assert all(2000 <= int(i) - int(ids[0]) < 8000 for i in got[0] if i >= 0) and (got[0] >= 0).any()
