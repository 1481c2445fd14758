"""memkern.integrations.filters: parsing, JSON-equality matching, the native / evaluated split, and
the filtered search (over-fetch until k matches) on a real MemoryStore."""
from __future__ import annotations

import numpy as np
import pytest

from memkern import MemkernTypeError, MemkernValueError, MemoryStore
from memkern.integrations import filters as F

META = {"user": "alice", "n": 3, "x": 1.5, "ok": True, "tags": ["a", "b"], "d": {"p": 1, "q": [1, 2]},
        "name": "Green Tea", "none": None}


@pytest.mark.parametrize("flt,want", [
    ({"user": "alice"}, True), ({"user": "bob"}, False),
    ({"n": 3.0}, True), ({"n": "3"}, False), ({"ok": 1}, False), ({"ok": True}, True), ({"n": True}, False),
    ({"n": {"$eq": 3}}, True), ({"n": {"$ne": 3}}, False), ({"missing": {"$ne": 3}}, True),
    ({"n": {"$gt": 2, "$lt": 4}}, True), ({"n": {"$gte": 3.5}}, False), ({"n": {"$lte": 3}}, True),
    ({"user": {"$gt": "aa"}}, True), ({"n": {"$gt": "a"}}, False),      # str vs number never compares
    ({"user": {"$in": ["bob", "alice"]}}, True), ({"n": {"$in": [True]}}, False),
    ({"user": {"$nin": ["alice"]}}, False), ({"missing": {"$nin": ["alice"]}}, True),
    ({"tags": {"$contains": "a"}}, True), ({"tags": {"$contains": "z"}}, False),
    ({"name": {"$contains": "Tea"}}, True), ({"name": {"$contains": "tea"}}, False),
    ({"missing": {"$exists": False}}, True), ({"none": {"$exists": True}}, True),
    ({"tags": ["a", "b"]}, True), ({"tags": ["b", "a"]}, False),
    ({"d": {"p": 1}}, True), ({"d": {"p": 2}}, False), ({"d": {"q": [1, 2]}}, True),
    ({"none": None}, True), ({"missing": None}, False),
    ({"user": "alice", "n": 4}, False),
    ({"$or": [{"user": "bob"}, {"n": 3}]}, True), ({"$and": [{"user": "alice"}, {"n": 4}]}, False),
    ({"$not": {"user": "bob"}}, True), ({"$not": {"user": "alice"}}, False),
    ({}, True), (None, True),
])
def test_matches(flt, want):
    assert F.matches(F.parse(flt), META) is want


def test_icontains():
    assert F.matches(F.cond("name", "icontains", "green tea"), META)
    assert not F.matches(F.cond("name", "icontains", "coffee"), META)


@pytest.mark.parametrize("flt,err,where", [
    ([("a", 1)], MemkernTypeError, "filter"),
    ({1: "a"}, MemkernTypeError, "filter"),
    ({"a": {"$regex": "x"}}, MemkernValueError, r"filter\['a'\]"),
    ({"a": {"$in": "xy"}}, MemkernTypeError, r"filter\['a'\]"),
    ({"a": {"$gt": [1]}}, MemkernTypeError, r"filter\['a'\]"),
    ({"a": {"$gt": True}}, MemkernTypeError, r"filter\['a'\]"),
    ({"a": float("nan")}, MemkernTypeError, r"filter\['a'\]"),
    ({"a": object()}, MemkernTypeError, r"filter\['a'\]"),
    ({"$xor": []}, MemkernValueError, "filter"),
    ({"$or": {"a": 1}}, MemkernTypeError, r"filter\['\$or'\]"),
    ({"": 1}, MemkernValueError, "filter"),
])
def test_parse_errors_name_the_argument(flt, err, where):
    with pytest.raises(err, match=where):
        F.parse(flt)


def test_split_pushes_only_what_the_store_evaluates():
    native, rest = F.split(F.parse({"user": "alice", "n": {"$in": [1, 2]}, "x": {"$gt": 1}, "d": {"p": 1},
                                    "z": None}))
    assert native == {"user": "alice", "n": {"$in": [1, 2]}}
    assert isinstance(rest, F.Node) and {c.key for c in rest.children} == {"x", "d", "z"}
    assert F.split(F.parse({"user": "alice"})) == ({"user": "alice"}, None)
    assert F.split(F.parse({"$or": [{"a": 1}, {"b": 2}]}))[0] is None
    assert F.split(None) == (None, None)
    # the store's limits on a native filter are kept: the excess is evaluated on the records
    native, rest = F.split(F.parse({"a": 1, "b": 2, "c": {"$in": [1, 2, 3]}}), max_keys=2, max_values=10)
    assert native == {"a": 1, "b": 2} and rest == F.Cond("c", "in", (1, 2, 3))
    native, rest = F.split(F.parse({"a": 1, "c": {"$in": [1, 2, 3]}}), max_keys=8, max_values=3)
    assert native == {"a": 1} and rest == F.Cond("c", "in", (1, 2, 3))


def _store(tmp_path, n=300, d=16, seed=0):
    rng = np.random.default_rng(seed)
    s = MemoryStore(tmp_path / "s", dim=d, metric="ip")
    emb = rng.standard_normal((n, d)).astype(np.float32)
    metas = [{"user": ["alice", "bob", "carol"][i % 3], "i": i, "even": i % 2 == 0} for i in range(n)]
    s.add_batch("ns", [f"m{i}" for i in range(n)], emb, metas=metas)
    return s, emb, metas


@pytest.mark.parametrize("native", [False, None])
def test_filtered_search_returns_the_best_k_matching(tmp_path, native):
    s, emb, metas = _store(tmp_path)
    q = np.random.default_rng(1).standard_normal(16).astype(np.float32)
    scores = emb @ q
    for flt, k in [({"user": "carol"}, 10), ({"i": {"$lt": 12}}, 5), ({"i": {"$gte": 290}}, 20),
                   ({"user": "alice", "even": True, "i": {"$gt": 100}}, 7), ({"user": "nobody"}, 3)]:
        tree = F.parse(flt)
        ok = [i for i in range(len(metas)) if F.matches(tree, metas[i])]
        want = sorted(ok, key=lambda i: -scores[i])[:k]
        ids, sc, recs = F.search(s, "ns", q, k, tree, native=native)
        assert [r.meta["i"] for r in recs] == want, flt
        assert np.allclose(sc, scores[want], atol=1e-4)
        assert list(ids) == [r.id for r in recs]
    s.close()


def test_filtered_search_fetches_more_only_when_needed(tmp_path):
    s, emb, metas = _store(tmp_path)
    calls = []
    orig = s.search

    def spy(ns, q, k, **kw):
        calls.append(k)
        return orig(ns, q, k, **kw)

    s.search = spy
    q = emb[0]
    F.search(s, "ns", q, 5, None, native=False)
    assert calls == [5]                                   # no filter: one search of k
    calls.clear()
    F.search(s, "ns", q, 5, F.parse({"i": {"$gte": 0}}), native=False)
    assert calls == [32]                                  # everything matches: one over-fetch
    calls.clear()
    F.search(s, "ns", q, 5, F.parse({"i": {"$gte": 295}}), native=False)
    assert calls[-1] == 300 and len(calls) >= 2            # rare matches: grows to the whole namespace
    s.close()


def test_native_filter_is_pushed_into_the_store_search(tmp_path):
    s, emb, metas = _store(tmp_path)
    if not F.supports_native(s):
        pytest.skip("MemoryStore.search has no filter= on this branch")
    calls = []
    orig = s.search

    def spy(ns, q, k, **kw):
        calls.append((k, kw))
        return orig(ns, q, k, **kw)

    s.search = spy
    ids, _, recs = F.search(s, "ns", emb[0], 6, F.parse({"user": "carol", "i": {"$in": [2, 5, 8, 11, 14, 299, 3]}}))
    assert calls == [(6, {"filter": {"user": "carol", "i": {"$in": [2, 5, 8, 11, 14, 299, 3]}}})]  # one call, no over-fetch
    assert sorted(r.meta["i"] for r in recs) == [2, 5, 8, 11, 14, 299]
    calls.clear()
    _, _, recs = F.search(s, "ns", emb[0], 5, F.parse({"user": "carol", "i": {"$gte": 290}}))
    assert calls[0][1] == {"filter": {"user": "carol"}} and sorted(r.meta["i"] for r in recs) == [290, 293, 296, 299]
    s.close()


def test_supports_native_reads_the_signature():
    class A:
        def search(self, namespace, queries, k=20, *, filter=None):
            ...

    class B:
        def search(self, namespace, queries, k=20):
            ...

    assert F.supports_native(A()) and not F.supports_native(B())


def _nested(kind: str, depth: int, leaf: dict) -> dict:
    """``{"$not": {"$not": ... leaf}}`` / ``{"$and": [{"$and": [... leaf]}]}``, built without recursion."""
    f = leaf
    for _ in range(depth):
        f = {kind: f} if kind in ("$not", "NOT") else {kind: [f]}
    return f


@pytest.mark.parametrize("kind", ["$not", "$and", "$or"])
def test_deeply_nested_filters_are_refused_not_a_recursion_error(tmp_path, kind):
    """3,000 levels of $not / $and / $or: a MemkernValueError naming the filter, in the shared grammar
    (LangGraph, LangChain), mem0's and LlamaIndex's; the bound itself still parses."""
    from fakes_rmm import HashEmbedder

    ok = _nested(kind, F.MAX_FILTER_DEPTH, {"user": "alice"})
    assert F.matches(F.parse(ok), META) is (kind != "$not" or F.MAX_FILTER_DEPTH % 2 == 0)
    deep = _nested(kind, 3000, {"user": "alice"})
    with pytest.raises(MemkernValueError, match=r"filter.*: expected a filter nested at most 32 levels deep"):
        F.parse(deep)
    with pytest.raises(MemkernValueError, match="nested at most 32"):
        F.parse(_nested(kind, F.MAX_FILTER_DEPTH + 1, {"user": "alice"}))

    from memkern.integrations import mem0 as M0
    with pytest.raises(MemkernValueError, match="nested at most 32"):
        M0.to_filter(_nested({"$not": "NOT", "$and": "AND", "$or": "OR"}[kind], 3000, {"user": "alice"}))

    from memkern.integrations.langgraph import MemkernStore
    emb = HashEmbedder(16)
    with MemkernStore(tmp_path / "lg", embedder=emb) as s:
        s.put(("u",), "k", {"text": "hello", "user": "alice"})
        with pytest.raises(MemkernValueError, match="nested at most 32"):
            s.search(("u",), query="hello", filter=deep)
        with pytest.raises(MemkernValueError, match="nested at most 32"):
            s.search(("u",), filter=deep)

    from memkern.integrations.langchain import MemkernVectorStore
    vs = MemkernVectorStore(tmp_path / "lc", embedding=emb)
    vs.add_texts(["hello"], metadatas=[{"user": "alice"}])
    with pytest.raises(MemkernValueError, match="nested at most 32"):
        vs.similarity_search("hello", k=1, filter=deep)
    vs.close()


def test_deeply_nested_llamaindex_filters_are_refused():
    pytest.importorskip("llama_index.core")
    from llama_index.core.vector_stores.types import MetadataFilter, MetadataFilters

    from memkern.integrations.llamaindex import to_filter

    f = MetadataFilters(filters=[MetadataFilter(key="user", value="alice")])
    for _ in range(200):
        f = MetadataFilters(filters=[f])
    with pytest.raises(MemkernValueError, match="nested at most 32"):
        to_filter(f)


def test_nested_and_reaches_the_store_filter():
    """An ``$and`` of equalities is flattened, so every condition is pushed into the store's own
    filter (one per key) and nothing is left to evaluate on the records."""
    native, rest = F.split(F.parse({"$and": [{"a": "x"}, {"$and": [{"b": "y"}]}], "c": 1}))
    assert native == {"a": "x", "b": "y", "c": 1} and rest is None
