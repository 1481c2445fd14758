"""Time range and recency through every framework adapter (LangChain, LangGraph, LlamaIndex, mem0),
each against the real framework package: the store's record times (event_time, created_at,
updated_at) filter and re-rank inside the store's search, dates are accepted where a framework
has them (LangGraph's Item.created_at is a datetime), bad arguments raise memkern errors naming
them."""
from __future__ import annotations

import asyncio
import datetime as dt
import os

import numpy as np
import pytest

os.environ["MEM0_TELEMETRY"] = "False"
os.environ.setdefault("MEM0_DIR", os.path.join(os.environ.get("TMPDIR", "/tmp"), "memkern-test-mem0"))

from fakes_embed import HashEmbedder, llama_embedding  # noqa: E402
from memkern import MemkernTypeError, MemkernValueError, MemoryStore  # noqa: E402

EMB = HashEmbedder()
DAY = 86400.0
T0 = dt.datetime(2023, 5, 1, tzinfo=dt.timezone.utc).timestamp()
TEXTS = ["apple pie recipe", "apple orchard visit", "apple cider tasting", "car wash"]


def _date(store, ns):
    """Give the namespace's records event times T0, T0 + 1 day, ... in id order."""
    ids = sorted(int(i) for i in store.ids(ns))
    for j, rid in enumerate(ids):
        store.update(rid, event_time=T0 + j * DAY)
    return ids


@pytest.fixture
def store(tmp_path):
    with MemoryStore(tmp_path / "s", dim=EMB.dim, metric="cos") as st:
        yield st


# ---------------------------------------------------------------------------------- LangChain
def test_langchain_time_range_recency_and_retrievers(store):
    pytest.importorskip("langchain_core")
    from memkern.integrations.langchain import MemkernRetriever, MemkernVectorStore

    vs = MemkernVectorStore(store, EMB, namespace="docs")
    vs.add_texts(TEXTS, [{"i": i} for i in range(4)], ids=[f"d{i}" for i in range(4)])
    _date(store, "docs")
    got = vs.similarity_search("apple", k=4, time_range=(T0 + DAY, T0 + 3 * DAY))
    assert sorted(d.id for d in got) == ["d1", "d2"]
    got = vs.similarity_search("apple", k=4, filter={"i": {"$ne": 1}}, time_range=(T0 + DAY, None))
    assert sorted(d.id for d in got) == ["d2", "d3"]
    top = vs.similarity_search_with_score("apple", k=1, recency=DAY, recency_weight=10.0, now=T0 + 3 * DAY)
    assert top[0][0].id == "d3"                                  # the newest wins under a heavy prior
    # LangChain's own retriever passes search_kwargs through
    r = vs.as_retriever(search_kwargs={"k": 4, "time_range": (dt.datetime(2023, 5, 3, tzinfo=dt.timezone.utc), None)})
    assert sorted(d.id for d in r.invoke("apple")) == ["d2", "d3"]
    mr = MemkernRetriever(vectorstore=vs, k=2, candidates=4, time_range=("2023-05-01", "2023-05-02"))
    assert [d.id for d in mr.invoke("apple")] == ["d0"]
    with pytest.raises(MemkernValueError, match=r"^time_range\[0\]: expected a date string"):
        vs.similarity_search("apple", time_range=("soon", None))
    with pytest.raises(MemkernValueError, match=r"^time_field: "):
        MemkernRetriever(vectorstore=vs, time_field="when")
    vs.close()


# ---------------------------------------------------------------------------------- LangGraph
def test_langgraph_time_range_with_item_datetimes_and_recency(store):
    pytest.importorskip("langgraph")
    from memkern.integrations.langgraph import MemkernStore, encode_namespace

    lg = MemkernStore(store, embedder=EMB)
    for i, t in enumerate(TEXTS):
        lg.put(("docs",), f"k{i}", {"text": t})
    ids = _date(store, encode_namespace(("docs",)))
    assert len(ids) == 4
    got = lg.search(("docs",), query="apple", limit=4, time_range=(T0 + DAY, T0 + 3 * DAY))
    assert sorted(x.key for x in got) == ["k1", "k2"]
    # listing without a query: the range filters it; created_at / updated_at are LangGraph's own times
    assert sorted(x.key for x in lg.search(("docs",), limit=10, time_range=("2023-05-03", None))) == ["k2", "k3"]
    k0 = lg.get(("docs",), "k0")
    assert [x.key for x in lg.search(("docs",), limit=10, time_field="updated",
                                     time_range=(None, k0.updated_at + dt.timedelta(microseconds=1)))] == ["k0"]
    got = lg.search(("docs",), query="apple", limit=1, recency=DAY, recency_weight=10.0, now=T0 + 3 * DAY)
    assert got[0].key == "k3"
    got = asyncio.run(lg.asearch(("docs",), query="apple", limit=4, time_range=(None, T0 + DAY)))
    assert [x.key for x in got] == ["k0"]
    with pytest.raises(MemkernValueError, match=r"^recency: expected a search with a query"):
        lg.search(("docs",), recency=DAY)
    with pytest.raises(MemkernTypeError, match=r"^time_range\[1\]: "):
        lg.search(("docs",), query="apple", time_range=(None, [1]))
    lg.close()


# ---------------------------------------------------------------------------------- LlamaIndex
def test_llamaindex_query_kwargs_and_index_retriever(store):
    pytest.importorskip("llama_index.core")
    from llama_index.core import Document, StorageContext, VectorStoreIndex
    from llama_index.core.vector_stores.types import VectorStoreQuery

    from memkern.integrations.llamaindex import MemkernVectorStore

    v = MemkernVectorStore(store, namespace="li")
    index = VectorStoreIndex.from_documents([Document(text=t, metadata={"i": i}) for i, t in enumerate(TEXTS)],
                                            storage_context=StorageContext.from_defaults(vector_store=v),
                                            embed_model=llama_embedding(EMB))
    _date(store, "li")
    q = VectorStoreQuery(query_embedding=EMB.encode(["apple"])[0].tolist(), similarity_top_k=4)
    res = v.query(q, time_range=(T0 + 2 * DAY, None))
    assert sorted(n.metadata["i"] for n in res.nodes) == [2, 3]
    got = index.as_retriever(similarity_top_k=4, vector_store_kwargs={"time_range": (None, "2023-05-02")}).retrieve(
        "apple")
    assert [g.node.metadata["i"] for g in got] == [0]
    with pytest.raises(MemkernValueError, match=r"^recency: "):
        v.query(q, recency=-5)
    v.close()


# ---------------------------------------------------------------------------------- mem0
def test_mem0_search_time_keywords(tmp_path):
    pytest.importorskip("mem0")
    from memkern.integrations import mem0 as mk

    v = mk.MemkernVectorStore(collection_name="c1", path=str(tmp_path / "m"), embedding_model_dims=EMB.dim)
    v.insert([EMB.encode([t])[0].tolist() for t in TEXTS], [{"data": t, "user_id": "alice"} for t in TEXTS],
             [f"id{i}" for i in range(4)])
    _date(v.store, v.namespace)
    q = EMB.encode(["apple"])[0].tolist()
    got = v.search("apple", q, top_k=4, filters={"user_id": "alice"}, time_range=(T0 + DAY, T0 + 2 * DAY))
    assert [o.id for o in got] == ["id1"]
    got = v.search("apple", q, top_k=1, recency=DAY, recency_weight=10.0, now=T0 + 3 * DAY)
    assert [o.id for o in got] == ["id3"]
    with pytest.raises(MemkernValueError, match=r"^time_range: expected start <= end"):
        v.search("apple", q, time_range=(T0 + DAY, T0))
    v.close()
