"""memkern.integrations.langgraph.MemkernStore against LangGraph's BaseStore contract.

langgraph / langgraph-checkpoint ship no store conformance suite in their wheels (the registry's
langgraph-checkpoint-conformance 0.0.2 covers checkpointers only), so these are the same cases
LangGraph's own store tests check (namespaces, list_namespaces with prefix / suffix /
wildcards / max_depth / pagination, filters with every operator, vector search order / filters /
pagination / re-embedding on update / index=False, batch and abatch under asyncio.gather), written
here against the real langgraph package, plus persistence, atomic bad input, and LangMem's memory
tools running on the store.
"""
from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

pytest.importorskip("langgraph")

from langgraph.store.base import GetOp, InvalidNamespaceError, PutOp, SearchOp  # noqa: E402

from fakes_embed import HashEmbedder  # noqa: E402
from memkern import MemkernError, MemkernTypeError, MemkernValueError, MemoryStore  # noqa: E402
from memkern.integrations.langgraph import (  # noqa: E402
    MemkernNamespaceError,
    MemkernStore,
    decode_namespace,
    encode_namespace,
)


@pytest.fixture
def lg(tmp_path):
    s = MemkernStore(tmp_path / "store", embedder=HashEmbedder())
    yield s
    s.close()


# ------------------------------------------------------------------------------- namespaces
def test_namespace_encoding_is_reversible_and_validated():
    for ns in [("a",), ("users", "alice"), ("x", "*", "y-z", "ünï", "langgraph")]:
        enc = encode_namespace(ns)
        assert enc == "lg." + ".".join(ns)
        assert decode_namespace(enc) == ns
    # foreign memkern namespaces are not this adapter's
    for foreign in ["default", "user-1", "lg", "lg.", "lg..a", "lgx.a", "mem0.a"]:
        assert decode_namespace(foreign) is None
    for bad, where in [(("a.b",), "namespace[0]"), (("a", ""), "namespace[1]"), (("a\x00",), "namespace[0]"),
                       ((), "namespace"), (("a", 1), "namespace[1]")]:
        with pytest.raises(MemkernNamespaceError, match=where.replace("[", r"\[").replace("]", r"\]")) as ei:
            encode_namespace(bad)
        assert isinstance(ei.value, MemkernValueError) and isinstance(ei.value, InvalidNamespaceError)
    with pytest.raises(MemkernTypeError, match="namespace"):
        encode_namespace("users.alice")


def test_distinct_namespaces_never_collide(lg):
    lg.put(("a", "b"), "k", {"v": 1})
    lg.put(("a",), "k", {"v": 2})
    with pytest.raises(InvalidNamespaceError):
        lg.put(("a.b",), "k", {"v": 3})
    assert lg.get(("a", "b"), "k").value == {"v": 1}
    assert lg.get(("a",), "k").value == {"v": 2}
    assert sorted(lg.list_namespaces()) == [("a",), ("a", "b")]


def test_invalid_namespaces_raise_and_langgraph_root_only_through_batch(lg):
    doc = {"foo": "bar"}
    for ns in [(), ("the", "thing.about"), ("some", "fun", ""), ("langgraph", "foo")]:
        with pytest.raises(InvalidNamespaceError):
            lg.put(ns, "foo", doc)
        with pytest.raises(InvalidNamespaceError):
            asyncio.run(lg.aput(ns, "foo", doc))
    lg.put(("foo", "langgraph", "foo"), "bar", doc)
    assert lg.get(("foo", "langgraph", "foo"), "bar").value == doc
    assert lg.search(("foo", "langgraph", "foo"))[0].value == doc
    lg.delete(("foo", "langgraph", "foo"), "bar")
    assert lg.get(("foo", "langgraph", "foo"), "bar") is None
    lg.batch([PutOp(("langgraph", "foo"), "bar", doc)])          # past the public API, like InMemoryStore
    assert lg.get(("langgraph", "foo"), "bar").value == doc
    # a batch op with a dotted label is refused too (validate_op_namespace's rule)
    with pytest.raises(InvalidNamespaceError):
        lg.batch([PutOp(("foo.bar",), "k", doc)])
    assert lg.list_namespaces(prefix=("foo",)) == []


# ------------------------------------------------------------------------------- put / get / delete
def test_put_get_update_delete_and_timestamps(lg):
    ns = ("users", "alice")
    assert lg.get(ns, "missing") is None
    lg.put(ns, "k1", {"text": "likes tea", "n": 1})
    it = lg.get(ns, "k1")
    assert (it.namespace, it.key, it.value) == (ns, "k1", {"text": "likes tea", "n": 1})
    assert it.created_at.tzinfo is not None and it.created_at == it.updated_at
    lg.put(ns, "k1", {"text": "likes coffee", "n": 2})
    it2 = lg.get(ns, "k1")
    assert it2.value == {"text": "likes coffee", "n": 2}
    assert it2.created_at == it.created_at and it2.updated_at >= it.updated_at
    rid = lg._keys[(encode_namespace(ns), "k1")]
    assert [r.version for r in lg.store.history(rid)] == [1, 2]           # memkern keeps the versions
    lg.delete(ns, "k1")
    assert lg.get(ns, "k1") is None
    lg.delete(ns, "k1")                                                     # deleting a missing key is a no-op
    assert lg.search(ns) == []


def test_batch_reads_see_the_state_before_the_batch_and_last_put_wins(lg):
    ns = ("t",)
    res = lg.batch([PutOp(ns, "k", {"v": 1}), GetOp(ns, "k"), PutOp(ns, "k", {"v": 2}), SearchOp(ns)])
    assert res == [None, None, None, []]
    assert lg.get(ns, "k").value == {"v": 2}
    assert lg.store.count(encode_namespace(ns)) == 1


def test_items_survive_reopen(tmp_path):
    emb = HashEmbedder()
    with MemkernStore(tmp_path / "s", embedder=emb) as s:
        s.put(("docs",), "a", {"text": "red apple"})
        s.put(("docs",), "b", {"text": "blue car"})
        s.delete(("docs",), "b")
    with MemkernStore(tmp_path / "s", embedder=emb) as s:
        assert s.get(("docs",), "a").value == {"text": "red apple"}
        assert s.get(("docs",), "b") is None
        assert [r.key for r in s.search(("docs",), query="apple")] == ["a"]
        s.put(("docs",), "a", {"text": "green apple"})                      # update after reopen: same record
        assert s.store.count("lg.docs") == 1


def test_shares_a_store_with_other_users_and_ignores_their_namespaces(tmp_path):
    emb = HashEmbedder()
    with MemoryStore(tmp_path / "s", dim=emb.dim) as ms:
        ms.add("default", "an RMM memory", emb.encode(["an RMM memory"])[0], meta={"x": 1})
        s = MemkernStore(ms, embedder=emb)
        s.put(("default",), "k", {"text": "langgraph item"})
        assert s.list_namespaces() == [("default",)]
        assert [i.key for i in s.search(())] == ["k"]
        assert [i.key for i in s.search((), query="memory")] == ["k"]
        s.close()
        assert not ms.closed                                               # not ours to close
        assert ms.count("default") == 1


# ------------------------------------------------------------------------------- list_namespaces
def _fill(lg, namespaces):
    for i, ns in enumerate(namespaces):
        lg.put(ns, f"id_{i}", {"data": f"value_{i:02d}"})


def test_list_namespaces_prefix_suffix_depth_pagination(lg):
    nss = [("a", "b", "c"), ("a", "b", "d", "e"), ("a", "b", "d", "i"), ("a", "b", "f"), ("a", "c", "f"),
           ("b", "a", "f"), ("users", "123"), ("users", "456", "settings"), ("admin", "users", "789")]
    _fill(lg, nss)
    assert sorted(lg.list_namespaces(prefix=("a", "b"))) == [("a", "b", "c"), ("a", "b", "d", "e"),
                                                              ("a", "b", "d", "i"), ("a", "b", "f")]
    assert sorted(lg.list_namespaces(suffix=("f",))) == [("a", "b", "f"), ("a", "c", "f"), ("b", "a", "f")]
    assert sorted(lg.list_namespaces(prefix=("a",), suffix=("f",))) == [("a", "b", "f"), ("a", "c", "f")]
    assert sorted(lg.list_namespaces(prefix=("a", "b"), max_depth=3)) == [("a", "b", "c"), ("a", "b", "d"),
                                                                           ("a", "b", "f")]
    assert lg.list_namespaces(prefix=("a", "b"), limit=2) == [("a", "b", "c"), ("a", "b", "d", "e")]
    assert lg.list_namespaces(prefix=("a", "b"), offset=2) == [("a", "b", "d", "i"), ("a", "b", "f")]
    assert sorted(lg.list_namespaces(prefix=("a", "*", "f"))) == [("a", "b", "f"), ("a", "c", "f")]
    assert sorted(lg.list_namespaces(suffix=("*", "f"))) == [("a", "b", "f"), ("a", "c", "f"), ("b", "a", "f")]
    assert lg.list_namespaces(prefix=("nonexistent",)) == []
    assert lg.list_namespaces(prefix=("users", "123")) == [("users", "123")]
    assert sorted(lg.list_namespaces(max_depth=2)) == [("a", "b"), ("a", "c"), ("admin", "users"), ("b", "a"),
                                                       ("users", "123"), ("users", "456")]
    assert sorted(lg.list_namespaces()) == sorted(nss)


def test_list_namespaces_wildcards_and_pages(lg):
    _fill(lg, [("users", "123"), ("users", "456"), ("users", "789", "settings"), ("admin", "users", "789"),
               ("guests", "123"), ("guests", "456", "preferences")])
    assert sorted(lg.list_namespaces(prefix=("users", "*"))) == [("users", "123"), ("users", "456"),
                                                                  ("users", "789", "settings")]
    assert lg.list_namespaces(suffix=("*", "preferences")) == [("guests", "456", "preferences")]
    assert lg.list_namespaces(prefix=("*", "users"), suffix=("*", "settings")) == []
    for i in range(20):
        lg.put(("namespace", f"sub_{i:02d}"), "k", {"v": i})
    for off in (0, 5, 15):
        assert lg.list_namespaces(prefix=("namespace",), limit=5, offset=off) == [
            ("namespace", f"sub_{i:02d}") for i in range(off, off + 5)]


def test_list_namespaces_empty_and_after_delete(lg):
    assert lg.list_namespaces() == []
    lg.put(("x",), "k", {"v": 1})
    lg.delete(("x",), "k")
    assert lg.list_namespaces() == []


# ------------------------------------------------------------------------------- filters
DOCS = [("doc1", {"text": "red apple", "color": "red", "score": 4.5, "tags": ["fruit"], "meta": {"a": 1, "b": 2}}),
        ("doc2", {"text": "red car", "color": "red", "score": 3.0, "tags": ["vehicle"], "meta": {"a": 2}}),
        ("doc3", {"text": "green apple", "color": "green", "score": 4.0, "tags": ["fruit"]}),
        ("doc4", {"text": "blue car", "color": "blue", "score": 3.5, "flag": True})]


@pytest.fixture
def docs(lg):
    for k, v in DOCS:
        lg.put(("test",), k, v)
    return lg


@pytest.mark.parametrize("flt,keys", [
    ({"color": "red"}, ["doc1", "doc2"]),
    ({"color": {"$eq": "green"}}, ["doc3"]),
    ({"color": {"$ne": "red"}}, ["doc3", "doc4"]),
    ({"score": {"$gt": 3.5}}, ["doc1", "doc3"]),
    ({"score": {"$gte": 3.5}}, ["doc1", "doc3", "doc4"]),
    ({"score": {"$lt": 3.5}}, ["doc2"]),
    ({"score": {"$lte": 3.5}}, ["doc2", "doc4"]),
    ({"score": {"$gte": 3.0, "$lt": 4.5}}, ["doc2", "doc3", "doc4"]),
    ({"score": {"$gte": 4.0}, "color": "green"}, ["doc3"]),
    ({"score": 4}, ["doc3"]),                                  # 4 == 4.0
    ({"flag": 1}, ["doc4"]),                                   # True == 1, as in InMemoryStore
    ({"flag": True}, ["doc4"]),
    ({"flag": None}, ["doc1", "doc2", "doc3"]),                # a missing key reads as None
    ({"meta": {"a": {"$gte": 2}}}, ["doc2"]),                  # operators inside a sub-dict
    ({"score": {"$gt": "3.9"}}, ["doc1", "doc3"]),             # float() of the operand
    ({"color": {"$gt": 1}}, []),                               # float("red") fails: no match
    ({"color": {"$exists": False}}, []),
    ({"tags": ["fruit"]}, ["doc1", "doc3"]),                   # list equality
    ({"meta": {"a": 1}}, ["doc1"]),                            # nested sub-dict match
    ({"color": {"$in": ["blue", "green"]}}, ["doc3", "doc4"]),
    ({"missing": "x"}, []),
    ({"$or": [{"color": "blue"}, {"score": {"$gt": 4.4}}]}, ["doc1", "doc4"]),
])
def test_filters_without_query(docs, flt, keys):
    assert sorted(i.key for i in docs.search(("test",), filter=flt)) == keys


def test_vector_search_order_filters_and_pagination(docs):
    res = docs.search(("test",), query="apple", filter={"color": "red"})
    assert [r.key for r in res] == ["doc1", "doc2"]
    assert res[0].score > res[1].score
    assert [r.key for r in docs.search(("test",), query="car", filter={"color": "red"})] == ["doc2", "doc1"]
    res = docs.search(("test",), query="blue", filter={"score": {"$gt": 3.2}})
    assert len(res) == 3 and res[0].key == "doc4"
    res = docs.search(("test",), query="apple", filter={"score": {"$gte": 4.0}, "color": "green"})
    assert [r.key for r in res] == ["doc3"]
    everything = docs.search(("test",), query="red apple", limit=10)
    assert len(everything) == 4
    assert [r.score for r in everything] == sorted((r.score for r in everything), reverse=True)
    p1 = docs.search(("test",), query="red apple", limit=2)
    p2 = docs.search(("test",), query="red apple", limit=2, offset=2)
    assert [r.key for r in p1 + p2] == [r.key for r in everything]
    # cosine scores of the normalised embedder, as the store computes them
    emb = docs._embed
    q = emb(["red apple"], kind="query")[0]
    v = emb([json.dumps(DOCS[0][1], sort_keys=True)])[0]
    assert everything[0].key == "doc1" and everything[0].score == pytest.approx(float(q @ v), abs=1e-5)


def test_search_edge_queries_and_prefixes(docs):
    assert len(docs.search(("test",), query="")) == 4              # "" = no query
    assert len(docs.search(("test",), query=None)) == 4
    assert len(docs.search(("test",), query="test " * 100)) == 4
    assert len(docs.search(("test",), query="test!@#$%^&*()")) == 4
    docs.put(("test", "sub"), "deep", {"text": "red apple pie"})
    assert {r.key for r in docs.search(("test",), query="apple pie", limit=10)} == {"doc1", "doc2", "doc3", "doc4", "deep"}
    assert [r.key for r in docs.search(("test", "sub"), query="apple")] == ["deep"]
    assert docs.search(("nope",), query="apple") == []
    assert docs.search(("test",), limit=0) == []


def test_update_reembeds_and_index_false_is_not_vector_searched(lg):
    ns = ("test",)
    lg.put(ns, "doc1", {"text": "zany zebra Xerxes"})
    lg.put(ns, "doc2", {"text": "something about dogs"})
    lg.put(ns, "doc3", {"text": "text about birds"})
    first = lg.search(ns, query="Zany Xerxes")
    assert first[0].key == "doc1"
    lg.put(ns, "doc1", {"text": "new text about dogs"})
    after = next(r.score for r in lg.search(ns, query="Zany Xerxes") if r.key == "doc1")
    assert after < first[0].score
    lg.put(ns, "doc4", {"text": "new text about dogs"}, index=False)
    assert "doc4" not in [r.key for r in lg.search(ns, query="new text about dogs", limit=3)]
    assert "doc4" not in [r.key for r in lg.search(ns, query="new text about dogs", limit=10)]
    assert lg.get(ns, "doc4").value == {"text": "new text about dogs"}
    assert "doc4" in [r.key for r in lg.search(ns)]                 # but listed without a query


def test_index_fields_select_the_embedded_text(tmp_path):
    emb = HashEmbedder()
    with MemkernStore(tmp_path / "s", embedder=emb, fields=["text"]) as s:
        s.put(("d",), "a", {"text": "apple", "other": "car car car"})
        s.put(("d",), "b", {"text": "car", "other": "apple apple"})
        s.put(("d",), "c", {"text": "zzz", "title": "apple"}, index=["title"])
        assert [r.key for r in s.search(("d",), query="apple", limit=2)] == ["a", "c"]
        rid = s._keys[("lg.d", "a")]
        assert s.store.get(rid).summary == "apple"


def test_puts_of_one_batch_are_embedded_in_one_call(tmp_path):
    emb = HashEmbedder()
    with MemkernStore(tmp_path / "s", embedder=emb) as s:
        before = emb.calls
        s.batch([PutOp(("a",), f"k{i}", {"text": f"item {i}"}) for i in range(20)]
                + [PutOp(("b",), "x", {"text": "other"})])
        assert emb.calls - before == 1 and s.store.count("lg.a") == 20 and s.store.count("lg.b") == 1


# ------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("op,err,where", [
    (PutOp(("a",), "k", {"x": float("nan")}), MemkernTypeError, r"ops\[1\]\.value\['x'\]"),
    (PutOp(("a",), "k", {1: "x"}), MemkernTypeError, r"ops\[1\]\.value"),
    (PutOp(("a",), "k", {"__lg_key__": "x"}), MemkernValueError, r"ops\[1\]\.value"),
    (PutOp(("a",), "k", "not a dict"), MemkernTypeError, r"ops\[1\]\.value"),
    (PutOp(("a",), "k", {"x": object()}), MemkernTypeError, r"ops\[1\]\.value"),
    (PutOp(("a",), "k", {"x": "\ud800"}), MemkernValueError, r"ops\[1\]\.value"),
    (PutOp(("a",), 5, {"x": 1}), MemkernTypeError, r"ops\[1\]\.key"),
    (PutOp(("a",), "k", {"x": 1}, index="text"), MemkernTypeError, r"ops\[1\]\.index"),
    (PutOp(("a",), "k", {"x": 1}, ttl=-5.0), MemkernValueError, r"ops\[1\]\.ttl"),
    (PutOp(("a",), "k", {"x": 1}, ttl="5"), MemkernTypeError, r"ops\[1\]\.ttl"),
    (SearchOp(("a",), {"x": {"$gt": "abc"}}), MemkernTypeError, r"ops\[1\]\.filter\['x'\]"),
    (SearchOp(("a",), {"x": {"y": {"$regex": 1}}}), MemkernValueError, r"ops\[1\]\.filter\['x'\]\['y'\]"),
    (SearchOp(("a",), {"__lg_ttl__": 1}), MemkernValueError, r"ops\[1\]\.filter"),
    (GetOp(("a",), "k", refresh_ttl=None), MemkernTypeError, r"ops\[1\]\.refresh_ttl"),
    (PutOp(("a.b",), "k", {"x": 1}), MemkernNamespaceError, r"ops\[1\]\.namespace\[0\]"),
    (SearchOp(("a",), {"x": {"$regex": "a"}}), MemkernValueError, r"ops\[1\]\.filter\['x'\]"),
    (SearchOp(("a",), {"x": {"$in": "ab"}}), MemkernTypeError, r"ops\[1\]\.filter\['x'\]"),
    (SearchOp(("a",), {"x": 1}, limit=-1), MemkernValueError, r"ops\[1\]\.limit"),
    (SearchOp(("a",), None, 10, 0, 5), MemkernTypeError, r"ops\[1\]\.query"),
    ("get me", MemkernTypeError, r"ops\[1\]"),
])
def test_bad_op_raises_naming_it_and_writes_nothing(lg, op, err, where):
    lg.put(("a",), "seed", {"x": 0})
    v_before = lg.store.get(lg._keys[("lg.a", "seed")]).version
    with pytest.raises(err, match=where):
        lg.batch([PutOp(("a",), "seed", {"x": 99}), op, PutOp(("a",), "new", {"x": 1})])
    assert lg.get(("a",), "new") is None
    assert lg.get(("a",), "seed").value == {"x": 0}
    assert lg.store.get(lg._keys[("lg.a", "seed")]).version == v_before
    assert lg.store.count("lg.a") == 1


def test_public_methods_raise_memkern_errors(lg):
    with pytest.raises(MemkernValueError, match="limit"):
        lg.search(("a",), limit=-1)
    with pytest.raises(MemkernTypeError, match="filter"):
        lg.search(("a",), filter=[("x", 1)])
    with pytest.raises(MemkernValueError, match="max_depth"):
        lg.list_namespaces(max_depth=0)
    with pytest.raises(MemkernTypeError, match="namespace"):
        lg.get("a", "k")
    with pytest.raises(MemkernValueError, match="embedder"):
        MemkernStore(lg.store, embedder=HashEmbedder(dim=8))
    with pytest.raises(MemkernTypeError, match="embedder"):
        MemkernStore(lg.store, embedder=42)


def test_embedder_failure_writes_nothing(tmp_path):
    class Broken(HashEmbedder):
        def encode(self, texts, kind="passage"):
            if any("boom" in t for t in texts):
                raise RuntimeError("embedder down")
            return super().encode(texts, kind)

    with MemkernStore(tmp_path / "s", embedder=Broken()) as s:
        with pytest.raises(RuntimeError):
            s.batch([PutOp(("a",), "k1", {"t": "fine"}), PutOp(("a",), "k2", {"t": "boom"})])
        assert s.list_namespaces() == [] and s.get(("a",), "k1") is None


# ------------------------------------------------------------------------------- async
def test_abatch_under_gather(lg):
    colors = ["red", "blue", "green", "yellow", "purple"]
    items = ["apple", "car", "house", "book", "phone"]
    docs = [(f"doc{i}", {"text": f"{colors[i % 5]} {items[i % 5]}", "color": colors[i % 5],
                         "score": [3.0, 3.5, 4.0, 4.5, 5.0][i % 5], "index": i}) for i in range(50)]

    async def main():
        await asyncio.gather(*[lg.aput(("test",), k, v) for k, v in docs])
        await asyncio.gather(*[lg.adelete(("test",), k) for k, _ in docs[:10]])
        queries = [("apple", {"color": "red"}), ("car", {"color": "blue"}), ("phone", {"score": {"$gt": 4.99}}),
                   ("book", {"score": {"$lte": 3.5}}), ("house", {"index": {"$gt": 25}})]
        res = await asyncio.gather(*[lg.asearch(("test",), query=q, filter=f) for q, f in queries],
                                   lg.alist_namespaces(), lg.aget(("test",), "doc20"), lg.aget(("test",), "doc3"))
        return queries, res

    queries, res = asyncio.run(main())
    for (q, f), hits in zip(queries, res[:5]):
        assert hits, (q, f)
        for h in hits:
            from memkern.integrations.filters import matches, parse
            assert matches(parse(f), h.value) and int(h.key[3:]) >= 10
    assert res[5] == [("test",)]
    assert res[6].value["index"] == 20 and res[7] is None
    assert lg.store.count("lg.test") == 40


# ------------------------------------------------------------------------------- LangMem on it
def test_langmem_memory_tools_run_on_memkern_store(lg):
    langmem = pytest.importorskip("langmem")
    ns = ("memories", "alice")
    manage = langmem.create_manage_memory_tool(namespace=ns, store=lg)
    search = langmem.create_search_memory_tool(namespace=ns, store=lg)
    out = manage.invoke({"content": "Alice prefers green tea in the morning", "action": "create"})
    mid = out.split()[-1]
    manage.invoke({"content": "Alice's dog is called Biscuit", "action": "create"})
    manage.invoke({"content": "Alice works on compilers", "action": "create"})
    found = json.loads(search.invoke({"query": "which tea in the morning"}))
    assert found[0]["key"] == mid and found[0]["value"] == {"content": "Alice prefers green tea in the morning"}
    assert found[0]["namespace"] == list(ns) and found[0]["score"] >= found[-1]["score"]
    manage.invoke({"content": "Alice switched to black tea", "action": "update", "id": mid})
    assert lg.get(ns, mid).value == {"content": "Alice switched to black tea"}
    manage.invoke({"action": "delete", "id": mid})
    assert lg.get(ns, mid) is None
    assert len(json.loads(search.invoke({"query": "tea"}))) == 2
    assert lg.list_namespaces() == [ns]
