"""The two-level search with a first stage and context terms (``search(level="turn+topic",
mode=..., neighbour_weight=, group_weight=, group_key=, filter=...)``, ``TurnSearchSpec`` in
csrc/include/memkern/store.h) against a float64 numpy reference, on both stores: random data of
odd sizes, exact ties, filters, time ranges, invalidated topics, empty namespaces; and turn texts."""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pytest

from memkern.errors import MemkernKeyError, MemkernTypeError, MemkernValueError
from memkern.store.reference import tokenize

D = 13
NS = "u"
WORDS = ["apple", "banana", "cherry", "damson", "elder", "fig", "grape", "hazel", "iris", "juniper", "kiwi"]
K1, B = 1.2, 0.75


@dataclass
class Turn:
    id: int
    vec: np.ndarray  # float64 [D], as stored (unit for metric cos)
    text: str
    parent: int
    session: str
    time: float
    active: bool = True


@dataclass
class Topic:
    id: int
    vec: np.ndarray
    session: str
    children: list = field(default_factory=list)
    active: bool = True


def build(store, seed: int = 0, sessions: int = 5, dup: bool = True):
    """Random sessions of 1-3 topics of 1-5 turns each (odd sizes), with session ids in the topics'
    meta and event times per session; when ``dup``, one turn repeats another exactly (vector and
    text: an exact tie). Returns the reference model ``(turns {id: Turn}, topics {id: Topic})``."""
    rng = np.random.default_rng(seed)
    dup_done = False
    last = None
    for s in range(sessions):
        sid = f"s{s}"
        for _ in range(int(rng.integers(1, 4))):
            n = int(rng.integers(1, 6))
            texts = [" ".join(rng.choice(WORDS, int(rng.integers(2, 6)))) + (" Ann" if j % 2 == 0 else " Bo")
                     for j in range(n)]
            te = rng.normal(size=(n, D)).astype(np.float32)
            if dup and not dup_done and last is not None:
                te[0], texts[0] = last[0], last[1]  # an exact tie with a turn of an earlier topic
                dup_done = True
            last = (te[-1].copy(), texts[-1])
            turns = [{"role": "user", "content": f"raw {t}"} for t in texts]
            store.add(NS, f"topic of {sid}", rng.normal(size=D).astype(np.float32), turns, {"session_id": sid},
                      turn_embeddings=te, turn_texts=texts, event_time=1000.0 * (s + 1))
    return model_of(store)


def model_of(store):
    turns, topics = {}, {}
    for tid in store.ids(NS, include_invalidated=True):
        r = store.get(int(tid))
        topics[r.id] = Topic(r.id, store.embeddings([r.id])[0].astype(np.float64), r.meta["session_id"],
                             list(r.turn_ids), r.status == "active")
    for tid in store.ids(NS, include_invalidated=True, level="turn"):
        r = store.get(int(tid))
        tp = topics[r.topic_id]
        turns[r.id] = Turn(r.id, store.embeddings([r.id])[0].astype(np.float64), r.summary, r.topic_id, tp.session,
                           r.event_time, r.status == "active")
    return turns, topics


def bm25_all(turns, qtext):
    """BM25 (k1 1.2, b 0.75) of every turn document (the index holds active and invalidated ones)."""
    docs = {i: tokenize(t.text) for i, t in turns.items()}
    N = len(docs)
    avgdl = sum(len(d) for d in docs.values()) / N
    df = Counter(w for d in docs.values() for w in set(d))
    out = {i: 0.0 for i in docs}
    for w in dict.fromkeys(tokenize(qtext)):
        if df[w] == 0:
            continue
        idf = math.log(1.0 + (N - df[w] + 0.5) / (df[w] + 0.5))
        for i, d in docs.items():
            tf = d.count(w)
            if tf:
                out[i] += idf * tf * (K1 + 1.0) / (tf + K1 * (1.0 - B + B * len(d) / avgdl))
    return out


def coverage_all(turns, qtext):
    """idf-weighted share of the query's distinct terms each turn document holds (BM25's idf)."""
    docs = {i: set(tokenize(t.text)) for i, t in turns.items()}
    N = len(docs)
    df = Counter(w for d in docs.values() for w in d)
    terms = list(dict.fromkeys(tokenize(qtext)))
    idf = {w: math.log(1.0 + (N - df[w] + 0.5) / (df[w] + 0.5)) for w in terms}
    total = sum(idf.values())
    return {i: (sum(idf[w] for w in terms if w in d) / total if total > 0 else 0.0) for i, d in docs.items()}


def top(scores: dict, n: int):
    return sorted(scores.items(), key=lambda e: (-e[1], e[0]))[:n]


def reference(turns, topics, q, qtext, k, mode="hybrid", fusion="weighted", w=0.5, C=50, alpha=0.0, nw=0.0, gw=0.0,
              group_key=None, sessions=None, t_range=None):
    """The TurnSearchSpec score in float64 (see the module doc); returns [(id, score)] best first.
    The first-stage lists are ``max(C, k)`` deep."""
    qn = np.asarray(q, np.float64) / np.linalg.norm(q)
    C = max(C, k)

    def allow(t):
        return t.active and (sessions is None or t.session in sessions) and \
            (t_range is None or t_range[0] <= t.time < t_range[1])

    ok = {i: t for i, t in turns.items() if allow(t)}
    sim = {i: float(t.vec @ qn) for i, t in turns.items()}
    dl = top({i: sim[i] for i in ok}, C) if mode != "lexical" else []
    ll = []
    if mode != "dense":
        bm = coverage_all(turns, qtext) if (mode == "hybrid" and fusion == "coverage") else bm25_all(turns, qtext)
        ll = top({i: s for i, s in bm.items() if i in ok and s > 0}, C)
    if mode == "dense":
        base = dict(dl)
    elif mode == "lexical":
        base = dict(ll)
    else:
        base = {}
        for L, wt in ((dl, 1.0 - w), (ll, w)):
            if not L:
                continue
            if fusion == "rrf":
                for r, (i, _) in enumerate(L):
                    base[i] = base.get(i, 0.0) + wt / (60.0 + r + 1)
            elif fusion == "coverage" and L is ll:
                best = max(s for _, s in L)
                for i, s in L:
                    base[i] = base.get(i, 0.0) + wt * (s / best)
            else:
                lo, hi = min(s for _, s in L), max(s for _, s in L)
                for i, s in L:
                    base[i] = base.get(i, 0.0) + wt * (1.0 if hi == lo else (s - lo) / (hi - lo))
    tsim = {p: float(tp.vec @ qn) for p, tp in topics.items()}
    if mode == "dense" and alpha != 0.0:
        for p, _ in top({p: s for p, s in tsim.items() if topics[p].active}, C):
            for c in topics[p].children:
                if c in ok and c not in base:
                    base[c] = sim[c]

    def group(i):
        return turns[i].session if group_key else turns[i].parent

    members = {}
    for i in sorted(ok):
        members.setdefault(group(i), []).append(i)
    nb, gbest = {}, {}
    for t in sorted(base):
        g = group(t)
        if gw:
            gbest[g] = max(gbest.get(g, 0.0), base[t])
        if nw:
            m = members[g]
            j = m.index(t)
            nb.setdefault(t, 0.0)
            for u in m[max(0, j - 1):j] + m[j + 1:j + 2]:
                nb[t] = max(nb[t], base.get(u, 0.0))
                nb[u] = max(nb.get(u, 0.0), base[t])
    out = {}
    for t in set(base) | set(nb):
        own = base[t] if t in base else (sim[t] if mode == "dense" else 0.0)
        out[t] = own + alpha * tsim[turns[t].parent] + nw * nb.get(t, 0.0) + gw * gbest.get(group(t), 0.0)
    return top(out, k)


def check(got_ids, got_sc, want, k, tol=2e-5):
    """Ids and scores of one query row against the reference (ties within ``tol`` may swap)."""
    n = len(want)
    assert (got_ids[n:] == -1).all() and len(got_ids) == k
    ref = dict(want)
    for j, (i, s) in enumerate(want):
        assert got_sc[j] == pytest.approx(s, abs=tol), (j, i, got_ids[j])
        gi = int(got_ids[j])
        assert gi in ref and ref[gi] == pytest.approx(float(got_sc[j]), abs=tol)
        if gi != i:  # only a near-tie may swap
            assert abs(ref[gi] - s) <= tol, (j, gi, i)
    assert {int(i) for i in got_ids[:n]} == {i for i, _ in want} or \
        abs(want[-1][1] - sorted(ref.values())[0]) <= tol


CONFIGS = [
    dict(mode="hybrid", fusion="weighted", w=0.5, C=50),
    dict(mode="hybrid", fusion="weighted", w=0.5, C=7, nw=0.3, gw=0.3, alpha=0.5, group_key="session_id"),
    dict(mode="hybrid", fusion="rrf", w=0.4, C=9, nw=0.5, gw=0.0),  # grouped by topic
    dict(mode="hybrid", fusion="coverage", w=0.35, C=8, nw=0.2, gw=0.2, group_key="session_id"),
    dict(mode="lexical", C=6, nw=0.3, gw=0.2, group_key="session_id"),
    dict(mode="dense", C=5, alpha=1.0, nw=0.3, gw=0.1, group_key="session_id"),
    dict(mode="dense", C=4, alpha=0.0, nw=-0.2, gw=-0.3),  # negative weights: still floored context
]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("cfg", range(len(CONFIGS)))
@pytest.mark.parametrize("k", [3, 12, 100])
def test_turn_search_matches_the_float64_reference(make_store, seed, cfg, k):
    # k = 3: lists deeper than k; 12: neighbours outside the lists among the results; 100: padding
    c = dict(CONFIGS[cfg])
    s = make_store(D, "cos")
    turns, topics = build(s, seed)
    rng = np.random.default_rng(100 + seed)
    q = rng.normal(size=(3, D)).astype(np.float32)
    texts = ["apple fig Ann", "cherry cherry grape", "kiwi Bo unknownword"]
    ids, sc = s.search(NS, q, k=k, level="turn+topic", mode=c["mode"], texts=texts, fusion=c.get("fusion", "weighted"),
                       lexical_weight=c.get("w", 0.5), candidates=c["C"], alpha=c.get("alpha", 0.0),
                       neighbour_weight=c.get("nw", 0.0), group_weight=c.get("gw", 0.0), group_key=c.get("group_key"))
    assert ids.shape == (3, k) and sc.dtype == np.float32
    for b in range(3):
        want = reference(turns, topics, q[b], texts[b], k, mode=c["mode"], fusion=c.get("fusion", "weighted"),
                         w=c.get("w", 0.5), C=c["C"], alpha=c.get("alpha", 0.0), nw=c.get("nw", 0.0),
                         gw=c.get("gw", 0.0), group_key=c.get("group_key"))
        check(ids[b], sc[b], want, k)


def test_filters_time_ranges_and_invalidated_topics_act_inside(make_store):
    s = make_store(D, "cos")
    turns, topics = build(s, 3, sessions=6)
    # a topic of a session with more topics: its turns are the neighbours of active ones
    per = Counter(t.session for t in topics.values())
    gone = next(p for p, t in topics.items() if per[t.session] >= 2)
    s.invalidate(gone, "test")
    turns, topics = model_of(s)
    assert not topics[gone].active and all(not turns[c].active for c in topics[gone].children)
    q = np.random.default_rng(7).normal(size=(2, D)).astype(np.float32)
    texts = ["apple Ann banana", "grape hazel"]
    kw = dict(level="turn+topic", mode="hybrid", texts=texts, fusion="weighted", lexical_weight=0.5, candidates=8,
              alpha=0.5, neighbour_weight=0.3, group_weight=0.3, group_key="session_id")
    for flt, tr, sess, rng_ in ((None, None, None, None),  # the invalidated topic's turns only
                                (dict(session_id={"$in": ["s1", "s2", "s4"]}), None, {"s1", "s2", "s4"}, None),
                                (None, (2000.0, 5000.0), None, (2000.0, 5000.0)),
                                (dict(session_id="s3"), (0.0, 4000.5), {"s3"}, (0.0, 4000.5))):
        ids, sc = s.search(NS, q, k=80, filter=flt, time_range=tr, **kw)  # every candidate: no exclusion hides
        for b in range(2):
            want = reference(turns, topics, q[b], texts[b], 80, C=8, alpha=0.5, nw=0.3, gw=0.3,
                             group_key="session_id", sessions=sess, t_range=rng_)
            check(ids[b], sc[b], want, 80)
            got = {int(i) for i in ids[b] if i >= 0}
            assert all(turns[i].active for i in got) and not got & set(topics[gone].children)
            if sess is not None:
                assert {turns[i].session for i in got} <= sess
    # include_invalidated brings the invalidated topic's turns back as candidates
    ids, _ = s.search(NS, q, k=60, include_invalidated=True, **kw)
    assert set(topics[gone].children) & {int(i) for i in ids.ravel()}


def test_exact_ties_go_to_the_lower_id(make_store):
    s = make_store(D, "cos")
    v = np.ones(D, np.float32)
    turns = [{"role": "user", "content": f"c{j}"} for j in range(4)]
    s.add(NS, "t", v, turns, {"session_id": "a"}, turn_embeddings=np.tile(v, (4, 1)), turn_texts=["same words"] * 4)
    for kw in (dict(mode="hybrid"), dict(mode="hybrid", neighbour_weight=0.3, group_weight=0.3, group_key="session_id"),
               dict(mode="lexical"), dict(mode="dense", alpha=0.5)):
        ids, sc = s.search(NS, v[None], k=4, level="turn+topic", texts=["same"], **kw)
        assert ids[0].tolist() == sorted(ids[0].tolist()) and len(set(sc[0].tolist())) == 1, kw


def test_empty_namespaces_and_levels_pad(make_store):
    s = make_store(D, "cos")
    q = np.ones((2, D), np.float32)
    kw = dict(level="turn+topic", mode="hybrid", texts=["a", "b"], neighbour_weight=0.3, group_weight=0.3,
              group_key="session_id")
    ids, sc = s.search("nobody", q, k=3, **kw)
    assert (ids == -1).all() and (sc == np.finfo(np.float32).min).all()
    s.add(NS, "topic without turns", np.ones(D, np.float32))
    ids, _ = s.search(NS, q, k=3, **kw)
    assert (ids == -1).all()
    s.add(NS, "t", np.ones(D, np.float32), [{"role": "user", "content": "x"}], turn_embeddings=np.ones((1, D), np.float32))
    ids, _ = s.search(NS, q, k=3, **kw)
    assert ids[:, 0].tolist() == [2, 2] and (ids[:, 1:] == -1).all()
    ids, _ = s.search(NS, q, k=3, filter={"session_id": "zz"}, **kw)
    assert (ids == -1).all()


def test_hybrid_without_context_is_the_turn_level_hybrid_search(make_store):
    # no alpha, no context: the fused turn scores of search(level="turn", mode="hybrid", same depth)
    s = make_store(D, "cos")
    build(s, 5)
    q = np.random.default_rng(1).normal(size=(2, D)).astype(np.float32)
    kw = dict(mode="hybrid", texts=["fig Ann", "elder iris"], fusion="weighted", lexical_weight=0.35, candidates=9, k=9)
    a = s.search(NS, q, level="turn+topic", alpha=0.0, **kw)
    b = s.search(NS, q, level="turn", **kw)
    assert np.array_equal(a[0], b[0]) and np.allclose(a[1], b[1], atol=1e-6)


def test_turn_texts_are_what_lexical_search_matches(make_store):
    s = make_store(D, "cos")
    turns = [{"role": "user", "content": "I adopted a dog"}, {"role": "user", "content": "It is brown"}]
    rid = s.add(NS, "pets", np.ones(D, np.float32), turns, turn_embeddings=np.ones((2, D), np.float32),
                turn_texts=["[2023-05-08] Caroline: I adopted a dog", "[2023-05-08] Melanie: It is brown"])
    r = s.get(rid)
    recs = s.get_batch(list(r.turn_ids))
    assert [x.turn for x in recs] == turns  # the turn dicts stay the caller's
    assert recs[1].summary == "[2023-05-08] Melanie: It is brown"
    ids, _ = s.search(NS, None, k=2, level="turn", mode="lexical", texts=["Melanie"])
    assert ids[0].tolist() == [recs[1].id, -1]
    # merge / update take them too (one per new turn); default: the turn's content
    s.merge(rid, "pets", np.ones(D, np.float32), [{"role": "user", "content": "We walk daily"}],
            turn_embeddings=np.ones((1, D), np.float32), turn_texts=["Caroline: We walk daily"])
    s.merge(rid, "pets", np.ones(D, np.float32), [{"role": "user", "content": "plain words"}],
            turn_embeddings=np.ones((1, D), np.float32))
    texts = [x.summary for x in s.get_batch(list(s.get(rid).turn_ids))]
    assert texts[2:] == ["Caroline: We walk daily", "plain words"]
    s.update(rid, turns=turns, turn_embeddings=np.ones((2, D), np.float32), turn_texts=["A: one", "B: two"])
    assert [x.summary for x in s.get_batch(list(s.get(rid).turn_ids))] == ["A: one", "B: two"]
    ids = s.add_batch(NS, ["x", "y"], np.ones((2, D), np.float32), [turns, turns],
                      turn_embeddings=[np.ones((2, D), np.float32)] * 2, turn_texts=[["p", "q"], None])
    assert [x.summary for x in s.get_batch(list(s.get(int(ids[1])).turn_ids))] == [t["content"] for t in turns]
    assert [x.summary for x in s.get_batch(list(s.get(int(ids[0])).turn_ids))] == ["p", "q"]


def test_bad_turn_texts_and_context_arguments(make_store):
    s = make_store(D, "cos")
    t = [{"role": "user", "content": "a"}]
    e = np.ones((1, D), np.float32)
    for tt, err in (([], MemkernValueError), (["a", "b"], MemkernValueError), ("a", MemkernTypeError),
                    ([5], MemkernTypeError), (["\ud800"], MemkernValueError)):
        with pytest.raises(err, match="turn_texts"):
            s.add(NS, "x", np.ones(D, np.float32), t, turn_embeddings=e, turn_texts=tt)
    with pytest.raises(MemkernValueError, match="turn_texts"):  # texts of turn records need turn records
        s.add(NS, "x", np.ones(D, np.float32), t, turn_texts=["a"])
    assert s.count(NS) == 0  # nothing written
    with pytest.raises(MemkernValueError, match="turn_texts"):
        s.add_batch(NS, ["x"], np.ones((1, D), np.float32), [t], turn_embeddings=[e], turn_texts=[["a"], ["b"]])
    with pytest.raises(MemkernKeyError, match="ids"):
        s.topic_ids([12345])


def test_topic_ids(make_store):
    s = make_store(D, "cos")
    turns, topics = build(s, 2)
    ids = np.array(sorted(turns) + sorted(topics), np.int64)
    got = s.topic_ids(ids)
    assert got.dtype == np.int64 and got.tolist() == [turns[i].parent for i in sorted(turns)] + [-1] * len(topics)


def test_graph_index_gives_the_exact_results_with_a_wide_beam(tmp_path):
    # the same data on a graph (HNSW, flat_limit below the counts) searched with a beam wider than
    # the namespace: the exact flat store's results
    from memkern import _store
    from memkern.store import MemoryStore

    flat = MemoryStore(tmp_path / "flat", dim=D, metric="cos")
    graph = MemoryStore(tmp_path / "graph", dim=D, metric="cos", flat_limit=8, ef_search=512)
    turns, _ = build(flat, 6, sessions=8)
    build(graph, 6, sessions=8)
    turn = _store.Level.turn
    assert graph._n().index_kind(NS, turn) == "hnsw" and flat._n().index_kind(NS, turn) == "flat"
    q = np.random.default_rng(3).normal(size=(4, D)).astype(np.float32)
    texts = ["apple Ann", "fig fig Bo", "kiwi", "grape hazel iris"]
    for kw in (dict(mode="hybrid", neighbour_weight=0.3, group_weight=0.3, group_key="session_id", alpha=0.5),
               dict(mode="dense", alpha=1.0, neighbour_weight=0.2), dict(mode="hybrid", filter={"session_id": "s3"})):
        a = flat.search(NS, q, k=12, level="turn+topic", texts=texts, candidates=10, **kw)
        b = graph.search(NS, q, k=12, level="turn+topic", texts=texts, candidates=10, **kw)
        assert np.array_equal(a[0], b[0]) and np.allclose(a[1], b[1], atol=1e-6), kw
    flat.close(), graph.close()
