"""memkern.integrations.llamaindex against the real llama-index-core: add / query with every
MetadataFilters operator and condition, delete by document, get / delete nodes, a
VectorStoreIndex on top of it, persistence, and atomic bad input."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llama_index.core")

from llama_index.core.schema import TextNode, RelatedNodeInfo, NodeRelationship  # noqa: E402
from llama_index.core.vector_stores.types import (  # noqa: E402
    FilterCondition,
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
    VectorStoreQuery,
    VectorStoreQueryMode,
)

from fakes_embed import HashEmbedder, llama_embedding  # noqa: E402
from memkern import MemkernKeyError, MemkernTypeError, MemkernValueError  # noqa: E402
from memkern.integrations.llamaindex import MemkernVectorStore, to_filter  # noqa: E402

EMB = HashEmbedder()
ROWS = [("n0", "red apple pie", {"color": "red", "n": 1, "tags": ["fruit", "sweet"], "title": "Apple Pie"}, "docA"),
        ("n1", "red sports car", {"color": "red", "n": 2, "tags": ["vehicle"], "title": "Fast Car"}, "docA"),
        ("n2", "green apple tree", {"color": "green", "n": 3, "tags": ["fruit", "plant"], "title": "Tree"}, "docB"),
        ("n3", "blue car wash", {"color": "blue", "n": 4, "tags": [], "title": "Car Wash"}, "docB"),
        ("n4", "a book about apples", {"color": "none", "n": 5, "title": "apple book"}, "docC")]


def _nodes():
    out = []
    for nid, text, meta, doc in ROWS:
        node = TextNode(id_=nid, text=text, metadata=dict(meta), embedding=EMB.encode([text])[0].tolist())
        node.relationships[NodeRelationship.SOURCE] = RelatedNodeInfo(node_id=doc)
        out.append(node)
    return out


@pytest.fixture
def vs(tmp_path):
    v = MemkernVectorStore(tmp_path / "s", dim=EMB.dim)
    assert v.add(_nodes()) == [r[0] for r in ROWS]
    yield v
    v.close()


def _q(text, k=5, **kw):
    return VectorStoreQuery(query_embedding=EMB.encode([text])[0].tolist(), similarity_top_k=k, **kw)


def _f(*filters, condition=FilterCondition.AND):
    return MetadataFilters(filters=list(filters), condition=condition)


def test_query_returns_nodes_scores_and_ids(vs):
    res = vs.query(_q("red apple pie", k=3))
    assert res.ids[0] == "n0" and res.similarities[0] == pytest.approx(1.0, abs=1e-5)
    assert res.similarities == sorted(res.similarities, reverse=True)
    n = res.nodes[0]
    assert n.node_id == "n0" and n.get_content() == "red apple pie" and n.metadata["title"] == "Apple Pie"
    assert n.ref_doc_id == "docA" and "__li_id__" not in n.metadata


@pytest.mark.parametrize("filters,ids", [
    (_f(MetadataFilter(key="color", value="red")), {"n0", "n1"}),
    (_f(MetadataFilter(key="color", value="red", operator=FilterOperator.NE)), {"n2", "n3", "n4"}),
    (_f(MetadataFilter(key="n", value=3, operator=FilterOperator.GT)), {"n3", "n4"}),
    (_f(MetadataFilter(key="n", value=3, operator=FilterOperator.GTE)), {"n2", "n3", "n4"}),
    (_f(MetadataFilter(key="n", value=2, operator=FilterOperator.LT)), {"n0"}),
    (_f(MetadataFilter(key="n", value=2, operator=FilterOperator.LTE)), {"n0", "n1"}),
    (_f(MetadataFilter(key="color", value=["blue", "green"], operator=FilterOperator.IN)), {"n2", "n3"}),
    (_f(MetadataFilter(key="color", value=["red", "none"], operator=FilterOperator.NIN)), {"n2", "n3"}),
    (_f(MetadataFilter(key="tags", value="fruit", operator=FilterOperator.CONTAINS)), {"n0", "n2"}),
    (_f(MetadataFilter(key="tags", value=["plant", "vehicle"], operator=FilterOperator.ANY)), {"n1", "n2"}),
    (_f(MetadataFilter(key="tags", value=["fruit", "sweet"], operator=FilterOperator.ALL)), {"n0"}),
    (_f(MetadataFilter(key="title", value="Car", operator=FilterOperator.TEXT_MATCH)), {"n1", "n3"}),
    (_f(MetadataFilter(key="title", value="APPLE", operator=FilterOperator.TEXT_MATCH_INSENSITIVE)), {"n0", "n4"}),
    (_f(MetadataFilter(key="tags", value=None, operator=FilterOperator.IS_EMPTY)), {"n3", "n4"}),
    (_f(MetadataFilter(key="color", value="red"), MetadataFilter(key="n", value=2)), {"n1"}),
    (_f(MetadataFilter(key="color", value="blue"), MetadataFilter(key="n", value=1), condition=FilterCondition.OR),
     {"n0", "n3"}),
    (_f(MetadataFilter(key="color", value="red"), condition=FilterCondition.NOT), {"n2", "n3", "n4"}),
    (_f(_f(MetadataFilter(key="color", value="red"), MetadataFilter(key="color", value="green"),
           condition=FilterCondition.OR), MetadataFilter(key="n", value=2, operator=FilterOperator.GT)), {"n2"}),
])
def test_every_filter_operator_and_condition(vs, filters, ids):
    res = vs.query(_q("apple car", k=5, filters=filters))
    assert set(res.ids) == ids
    assert {n.node_id for n in vs.get_nodes(filters=filters)} == ids


def test_doc_and_node_id_restrictions_and_top_k(vs):
    assert set(vs.query(_q("apple", doc_ids=["docB"])).ids) == {"n2", "n3"}
    assert vs.query(_q("book", node_ids=["n4", "n1"], k=1)).ids == ["n4"]
    assert len(vs.query(_q("apple", k=2)).ids) == 2


def test_delete_by_document_nodes_and_clear(vs):
    vs.delete("docA")
    assert {n.node_id for n in vs.get_nodes()} == {"n2", "n3", "n4"}
    vs.delete_nodes(node_ids=["n2"])
    vs.delete_nodes(filters=_f(MetadataFilter(key="color", value="blue")))
    assert [n.node_id for n in vs.get_nodes()] == ["n4"]
    vs.add(_nodes()[:1])
    vs.clear()
    assert vs.get_nodes() == [] and vs.query(_q("apple")).ids == []


def test_readd_updates_and_reopen(tmp_path):
    v = MemkernVectorStore(tmp_path / "s", dim=EMB.dim, namespace="li")
    v.add(_nodes())
    node = _nodes()[0]
    node.text = "red cherry pie"
    node.embedding = EMB.encode(["red cherry pie"])[0].tolist()
    v.add([node])
    assert v.client.count("li") == 5
    v.close()
    v2 = MemkernVectorStore(tmp_path / "s", namespace="li")           # dim read from the existing store
    assert v2.query(_q("cherry", k=1)).nodes[0].get_content() == "red cherry pie"
    v2.close()


def test_vector_store_index_on_memkern(tmp_path):
    from llama_index.core import Document, StorageContext, VectorStoreIndex

    v = MemkernVectorStore(tmp_path / "s", dim=EMB.dim)
    ctx = StorageContext.from_defaults(vector_store=v)
    docs = [Document(text="memkern stores memories on disk", metadata={"user": "alice"}),
            Document(text="bananas are yellow fruit", metadata={"user": "bob"})]
    index = VectorStoreIndex.from_documents(docs, storage_context=ctx, embed_model=llama_embedding(EMB))
    got = index.as_retriever(similarity_top_k=1).retrieve("where are memories stored")
    assert got[0].node.get_content() == "memkern stores memories on disk"
    flt = MetadataFilters(filters=[MetadataFilter(key="user", value="bob")])
    got = index.as_retriever(similarity_top_k=2, filters=flt).retrieve("memories")
    assert [g.node.metadata["user"] for g in got] == ["bob"]
    v.close()


@pytest.mark.parametrize("make,err,where", [
    (lambda ns: ns[:1] + [TextNode(id_="x", text="t")], MemkernValueError, r"nodes\[1\]\.embedding"),
    (lambda ns: ns[:1] + [TextNode(id_="x", text="t", embedding=[0.0] * 3)], MemkernValueError, r"nodes\[1\]\.embedding"),
    (lambda ns: ns[:1] + [TextNode(id_="x", text="t", embedding=[float("nan")] * 64)], MemkernValueError,
     r"nodes\[1\]\.embedding"),
    (lambda ns: ns[:1] + [TextNode(id_="x", text="t", embedding=[0.1] * 64, metadata={"__li_id__": 1})],
     MemkernValueError, r"nodes\[1\]\.metadata"),
    (lambda ns: ns[:1] + ["not a node"], MemkernTypeError, r"nodes\[1\]"),
    (lambda ns: ns[:1] + ns[:1], MemkernValueError, "nodes"),
])
def test_bad_nodes_write_nothing(tmp_path, make, err, where):
    v = MemkernVectorStore(tmp_path / "s", dim=EMB.dim)
    with pytest.raises(err, match=where):
        v.add(make(_nodes()))
    assert v.get_nodes() == []
    v.close()


def test_bad_queries_raise_memkern_errors(vs):
    with pytest.raises(MemkernValueError, match="query.mode"):
        vs.query(_q("x", mode=VectorStoreQueryMode.HYBRID))
    with pytest.raises(MemkernValueError, match="query.query_embedding"):
        vs.query(VectorStoreQuery(query_embedding=None, similarity_top_k=2))
    with pytest.raises(MemkernValueError, match="query.query_embedding"):
        vs.query(VectorStoreQuery(query_embedding=[0.1, 0.2], similarity_top_k=2))
    with pytest.raises(MemkernValueError, match="similarity_top_k"):
        vs.query(_q("x", k=0))
    with pytest.raises(MemkernTypeError, match="filters"):
        to_filter({"color": "red"})
    with pytest.raises(MemkernValueError, match="node_ids"):
        vs.delete_nodes()
    with pytest.raises(MemkernValueError, match="dim"):
        MemkernVectorStore(vs.client, dim=8)
    with pytest.raises(MemkernValueError, match="dim"):
        MemkernVectorStore(vs.client.path.parent / "fresh")        # a new store needs dim
    with pytest.raises(MemkernTypeError, match="namespace"):
        MemkernVectorStore(vs.client, namespace=3)
    assert len(vs.get_nodes()) == 5
