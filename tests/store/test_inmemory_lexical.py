"""InMemoryStore's lexical / hybrid search, metadata filters, time ranges and recency prior
(API-SPEC, issue 13 items 5-6) against the float64 references of :mod:`memkern.store.reference`, and
against MemoryStore's native search_ex."""
from __future__ import annotations

import numpy as np
import pytest

from memkern.store import reference as lx
from memkern.errors import MemkernValueError
from memkern.store.memory import InMemoryStore
from memkern.store import PAD_SCORE, MemoryStore


D = 8
TEXTS = ["Caroline adopted a beagle named Pepper", "Melanie paints sunsets at the lake",
         "Caroline moved to Lisbon in May", "the beagle Pepper loves the lake", "Jon opened a dance studio",
         "Melanie and Caroline went hiking", "nothing to see here", "Pepper Pepper Pepper"]
META = [{"user": "alice", "tag": "pet"}, {"user": "bob", "tag": "art"}, {"user": "alice", "tag": "move"},
        {"user": "alice", "tag": "pet", "n": 1}, {"user": "carol"}, {"user": "bob", "n": 1.0},
        {"user": True}, {"user": "alice", "nested": {"a": 1}}]


@pytest.fixture
def filled():
    rng = np.random.default_rng(0)
    s = InMemoryStore(D, "cos")
    e = rng.standard_normal((len(TEXTS), D)).astype(np.float32)
    ids = s.add_batch("u", TEXTS, e, metas=META)
    s.invalidate(int(ids[7]), "spam")
    return s, ids, e


def reference_bm25(s, ids, query, inc=False):
    """memkern.store.reference.bm25_scores over every record of the level (invalidated included: N, df and
    avgdl count them), then the allowed hits, best first (ties: id)."""
    docs = [s.get(int(i)).summary for i in ids]
    sc = lx.bm25_scores(query, docs)
    keep = [(float(x), int(i)) for x, i in zip(sc, ids) if x > 0 and (inc or s.get(int(i)).status == "active")]
    return sorted(keep, key=lambda t: (-t[0], t[1]))


def test_lexical_equals_reference(filled):
    s, ids, _ = filled
    for query in ("Pepper the beagle", "Caroline", "lake sunsets Melanie", "zebra"):
        for inc in (False, True):
            got, sc = s.search("u", None, k=5, mode="lexical", texts=[query], include_invalidated=inc)
            ref = reference_bm25(s, ids, query, inc)[:5]
            assert got[0, :len(ref)].tolist() == [i for _, i in ref]
            np.testing.assert_allclose(sc[0, :len(ref)], [x for x, _ in ref], rtol=1e-6)
            assert (got[0, len(ref):] == -1).all() and (sc[0, len(ref):] == PAD_SCORE).all()


def reference_coverage(s, ids, query):
    """memkern.store.reference.coverage_scores over every record of the level (invalidated included: N and
    df count them), then the active hits, best first (ties: id)."""
    docs = [s.get(int(i)).summary for i in ids]
    sc = lx.coverage_scores(query, docs)
    keep = [(float(x), int(i)) for x, i in zip(sc, ids) if x > 0 and s.get(int(i)).status == "active"]
    return sorted(keep, key=lambda t: (-t[0], t[1]))


@pytest.mark.parametrize("fusion", ["rrf", "weighted", "coverage"])
@pytest.mark.parametrize("w", [0.0, 0.3, 1.0])
def test_hybrid_equals_reference_fusion(filled, fusion, w):
    s, ids, e = filled
    q = e[3] + 0.1
    texts = ["Pepper at the lake"]
    k, c = 4, 6
    dense, dsc = s.search("u", q, k=c)
    lex = reference_bm25(s, ids, texts[0])[:c]
    if fusion == "rrf":
        ref_ids, ref_sc = lx.rrf([dense[0], [i for _, i in lex]], [1 - w, w])
    elif fusion == "coverage":
        cov = reference_coverage(s, ids, texts[0])[:c]
        ref_ids, ref_sc = lx.coverage_fusion((dense[0], dsc[0].astype(np.float64)),
                                             ([i for _, i in cov], [x for x, _ in cov]), w)
    else:
        ref_ids, ref_sc = lx.weighted_fusion([(dense[0], dsc[0].astype(np.float64)),
                                              ([i for _, i in lex], [x for x, _ in lex])], [1 - w, w])
    got, sc = s.search("u", q, k=k, mode="hybrid", texts=texts, fusion=fusion, lexical_weight=w, candidates=c)
    n = min(k, len(ref_ids))
    np.testing.assert_allclose(sc[0, :n], ref_sc[:n], rtol=1e-5, atol=1e-6)
    # ids equal where the fused scores are not tied
    for j in range(n):
        tied = np.isclose(ref_sc, ref_sc[j], rtol=1e-6, atol=1e-9).sum() > 1
        if not tied:
            assert got[0, j] == ref_ids[j]


def test_filters(filled):
    s, ids, e = filled
    q = e[0]
    cases = [({"user": "alice"}, [0, 2, 3]), ({"user": {"$eq": "bob"}}, [1, 5]),
             ({"tag": {"$in": ["pet", "art"]}}, [0, 1, 3]), ({"user": "alice", "tag": "pet"}, [0, 3]),
             ({"n": 1}, [3, 5]), ({"n": True}, []), ({"user": True}, [6]), ({"user": 1}, []),
             ({"nested": {"$eq": "x"}}, []), ({"missing": "x"}, [])]
    for flt, want in cases:
        got, _ = s.search("u", q, k=8, filter=flt)
        assert sorted(got[0][got[0] >= 0].tolist()) == sorted(int(ids[i]) for i in want), flt
        got, _ = s.search("u", None, k=8, mode="lexical", texts=["Caroline Pepper Melanie lake"], filter=flt)
        assert set(got[0][got[0] >= 0].tolist()) <= {int(ids[i]) for i in want}, flt
    with pytest.raises(MemkernValueError, match="filter"):
        s.search("u", q, k=3, filter={"user": {"$gt": 1}})


def test_turn_records_see_their_topics_meta():
    s = InMemoryStore(D)
    rng = np.random.default_rng(1)
    conv = [{"role": "user", "content": "hello Pepper"}, {"role": "user", "content": "bye"}]
    a = s.add("u", "a", rng.standard_normal(D).astype(np.float32), conv, {"user": "alice"},
              turn_embeddings=rng.standard_normal((2, D)).astype(np.float32))
    s.add("u", "b", rng.standard_normal(D).astype(np.float32), conv, {"user": "bob"},
          turn_embeddings=rng.standard_normal((2, D)).astype(np.float32))
    got, _ = s.search("u", rng.standard_normal(D).astype(np.float32), k=10, level="turn", filter={"user": "alice"})
    assert sorted(got[0][got[0] >= 0].tolist()) == sorted(s.get(a).turn_ids)
    got, _ = s.search("u", None, k=10, level="turn", mode="lexical", texts=["pepper"], filter={"turn_position": 0})
    assert len(got[0][got[0] >= 0]) == 2  # the turn's own meta


def test_time_range_and_recency(filled):
    s, ids, e = filled
    t = np.array([s.get(int(i)).created_at for i in ids])
    lo, hi = float(t.min()), float(t.max()) + 1
    got, _ = s.search("u", e[0], k=8, time_range=(lo, hi), time_field="created")
    assert len(got[0][got[0] >= 0]) == 7
    got, _ = s.search("u", e[0], k=8, time_range=(hi, None), time_field="updated")
    assert (got == -1).all()
    # recency: score + w * 2**(-age / half_life), on the first-stage candidates
    now = hi + 100.0
    base, bsc = s.search("u", e[0], k=7)
    got, sc = s.search("u", e[0], k=7, recency=50.0, recency_weight=2.0, now=now, time_field="created")
    want = sorted(((float(bsc[0, j]) + 2.0 * 2 ** (-(now - s.get(int(i)).created_at) / 50.0), int(i))
                   for j, i in enumerate(base[0])), key=lambda x: (-x[0], x[1]))
    np.testing.assert_allclose(sc[0], [x for x, _ in want], rtol=1e-5)


def test_native_and_in_memory_agree(tmp_path):
    """The same records, the same hybrid / lexical / filtered searches on both stores."""
    rng = np.random.default_rng(3)
    e = rng.standard_normal((len(TEXTS), D)).astype(np.float32)
    mem = InMemoryStore(D, "ip")
    with MemoryStore(tmp_path / "n", dim=D, metric="ip") as nat:
        for st in (nat, mem):
            ids = st.add_batch("u", TEXTS, e, metas=META)
            st.invalidate(int(ids[7]), "spam")
        t3 = ["Caroline Pepper", "beagle lake", "Melanie hiking Lisbon"]
        for kw in (dict(mode="lexical", texts=t3), dict(mode="hybrid", texts=t3),
                   dict(mode="hybrid", texts=t3, fusion="rrf"),
                   dict(mode="hybrid", texts=t3, fusion="weighted", lexical_weight=0.7),
                   dict(filter={"user": "alice"}), dict(filter={"tag": {"$in": ["pet", "art"]}}, mode="hybrid",
                                                          texts=t3),
                   dict(mode="lexical", texts=t3, include_invalidated=True, filter={"user": {"$in": ["bob", True]}})):
            a = nat.search("u", e[:3], k=5, **kw) if kw.get("mode") != "lexical" else nat.search("u", None, k=5, **kw)
            b = mem.search("u", e[:3], k=5, **kw) if kw.get("mode") != "lexical" else mem.search("u", None, k=5, **kw)
            np.testing.assert_array_equal(a[0], b[0])
            np.testing.assert_allclose(a[1], b[1], rtol=1e-5, atol=1e-6)
