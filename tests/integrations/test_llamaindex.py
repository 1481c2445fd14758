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

from fakes_embed import PLANE_VECTORS, HashEmbedder, PlaneEmbedder, llama_embedding  # noqa: E402
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
        vs.query(_q("x", mode=VectorStoreQueryMode.SVM))
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


# ------------------------------------------------------------------------------- query modes
def _index(vs, texts, metas=None):
    from llama_index.core import Document, StorageContext, VectorStoreIndex

    metas = metas or [{}] * len(texts)
    # the metadata stays out of the embedded text, so the vectors are the embedder's for the texts
    docs = [Document(text=t, id_=t, metadata=metas[i], excluded_embed_metadata_keys=list(metas[i]))
            for i, t in enumerate(texts)]
    return VectorStoreIndex.from_documents(docs, storage_context=StorageContext.from_defaults(vector_store=vs))


@pytest.fixture
def settings_embed():
    """Settings.embed_model = MemkernEmbedding(PlaneEmbedder(fallback="words")) for one test."""
    from llama_index.core import Settings

    from memkern.integrations.llamaindex import MemkernEmbedding

    before = Settings._embed_model
    emb = MemkernEmbedding(PlaneEmbedder(fallback="words"))
    Settings.embed_model = emb
    yield emb
    Settings._embed_model = before


def _texts(got):
    return [n.node.get_content() for n in got]


def test_mmr_through_a_vector_store_index(make_store, settings_embed):
    vs = MemkernVectorStore(make_store(4, "cos"), namespace="mmr")
    index = _index(vs, ["a", "a twin", "b", "c"], [{"i": i} for i in range(4)])
    assert _texts(index.as_retriever(similarity_top_k=3).retrieve("q")) == ["a", "a twin", "b"]
    got = index.as_retriever(similarity_top_k=3, vector_store_query_mode="mmr").retrieve("q")
    assert _texts(got) == ["a", "b", "c"]                 # the twin of the first pick makes way
    assert got[0].score == pytest.approx(0.5 * 0.95, abs=1e-3)     # MMR scores, as LlamaIndex's stores give
    assert got[1].score == pytest.approx(0.5 * 0.8 - 0.5 * float(PLANE_VECTORS["a"] @ PLANE_VECTORS["b"]), abs=1e-3)
    one = index.as_retriever(similarity_top_k=3, vector_store_query_mode="mmr", vector_store_kwargs={"mmr_threshold": 1.0})
    assert _texts(one.retrieve("q")) == ["a", "a twin", "b"]
    # the candidates are the store's best mmr_prefetch_k, after the filters
    few = index.as_retriever(similarity_top_k=3, vector_store_query_mode="mmr", vector_store_kwargs={"mmr_prefetch_k": 3})
    assert _texts(few.retrieve("q")) == ["a", "b", "a twin"]
    flt = MetadataFilters(filters=[MetadataFilter(key="i", value=1, operator=FilterOperator.GTE)])
    assert _texts(index.as_retriever(similarity_top_k=2, vector_store_query_mode="mmr", filters=flt).retrieve("q")) == \
        ["a twin", "b"]
    vs.close()


def test_mmr_agrees_with_llamaindex_and_takes_every_pick_into_account():
    """LlamaIndex's own MMR (get_top_k_mmr_embeddings) compares a candidate with the latest pick
    only; from the third pick on, memkern's compares it with every pick (MMR as defined). The first
    two picks and their scores are the same."""
    from llama_index.core.indices.query.embedding_utils import get_top_k_mmr_embeddings

    from memkern.integrations.mmr import mmr

    rng = np.random.default_rng(1)
    for _ in range(40):
        n, d = int(rng.integers(2, 25)), int(rng.integers(2, 10))
        cands = rng.standard_normal((n, d))
        q = rng.standard_normal(d)
        lam = float(rng.choice([0.3, 0.5, 0.8, 1.0]))   # at 0 LlamaIndex's first pick is candidate 0
        li_scores, li_ids = get_top_k_mmr_embeddings(q.tolist(), cands.tolist(), similarity_top_k=2, mmr_threshold=lam)
        picks, scores = mmr(q, cands, 2, lam)
        assert picks.tolist() == li_ids and scores == pytest.approx(li_scores, abs=1e-9)
    t = PLANE_VECTORS
    cands = np.stack([t["a"], t["a twin"], t["b"], t["c"]])
    assert get_top_k_mmr_embeddings(t["q"].tolist(), cands.tolist(), similarity_top_k=3)[1] == [0, 2, 1]
    assert mmr(t["q"], cands, 3, 0.5)[0].tolist() == [0, 2, 3]     # the twin is still redundant with "a"


HYBRID_TEXTS = ["Biscuit is the name of the dog", "the puppy sleeps on the sofa", "cats chase mice at night"]


class MeaningEmbedder(PlaneEmbedder):
    """The query "Biscuit" embeds next to "the puppy sleeps on the sofa" (what a dense model would
    miss): the dense and lexical rankings disagree."""

    def __init__(self):
        super().__init__(fallback="words")
        self.table = {"Biscuit": np.asarray([1, 0, 0, 0], np.float32),
                      HYBRID_TEXTS[0]: np.asarray([0, 1, 0, 0], np.float32),
                      HYBRID_TEXTS[1]: np.asarray([0.9, 0.436, 0, 0], np.float32),
                      HYBRID_TEXTS[2]: np.asarray([0, 0, 1, 0], np.float32)}


def test_hybrid_is_the_stores_hybrid_search_with_alpha_as_one_minus_lexical_weight(make_store):
    from llama_index.core import Settings

    from memkern.integrations.llamaindex import MemkernEmbedding

    before = Settings._embed_model
    Settings.embed_model = MemkernEmbedding(MeaningEmbedder())
    try:
        store = make_store(4, "cos")
        vs = MemkernVectorStore(store, namespace="h")
        index = _index(vs, HYBRID_TEXTS)

        def hybrid(**kw):
            return index.as_retriever(similarity_top_k=2, vector_store_query_mode="hybrid", **kw).retrieve("Biscuit")

        assert _texts(hybrid(alpha=1.0))[0] == HYBRID_TEXTS[1]               # vector only
        lex = hybrid(alpha=0.0)                                              # lexical only: one shares a term
        assert _texts(lex)[0] == HYBRID_TEXTS[0] and lex[0].score == pytest.approx(1.0) and lex[1].score == 0.0
        q = np.asarray([1, 0, 0, 0], np.float32)
        for alpha, w in [(None, 0.35), (0.2, 0.8), (0.9, 0.1)]:
            ids, scores = store.search("h", q, 2, mode="hybrid", texts=["Biscuit"], lexical_weight=w)
            want = [r.summary for r in store.get_batch(ids[0][ids[0] >= 0])]
            got = hybrid(alpha=alpha)
            assert _texts(got) == want and [g.score for g in got] == pytest.approx(scores[0][:len(want)].tolist())
        assert _texts(hybrid(alpha=0.2))[0] == HYBRID_TEXTS[0]               # the name wins with weight 0.8
        rrf = index.as_retriever(similarity_top_k=3, vector_store_query_mode="hybrid",
                                 vector_store_kwargs={"fusion": "rrf"}).retrieve("Biscuit")
        ids, scores = store.search("h", q, 3, mode="hybrid", texts=["Biscuit"], fusion="rrf")
        assert [g.score for g in rrf] == pytest.approx(scores[0].tolist())
        assert len(index.as_retriever(similarity_top_k=1, hybrid_top_k=3, vector_store_query_mode="hybrid")
                   .retrieve("Biscuit")) == 3
        vs.close()
    finally:
        Settings._embed_model = before


@pytest.mark.parametrize("mode", ["sparse", "text_search"])
def test_sparse_and_text_search_are_the_stores_bm25(make_store, settings_embed, mode):
    store = make_store(4, "cos")
    vs = MemkernVectorStore(store, namespace="bm25")
    texts = ["green tea in the morning", "black tea and green apples", "coffee at noon", "a green door"]
    index = _index(vs, texts, [{"n": i} for i in range(4)])
    settings_embed._fn.embedder.kinds.clear()
    got = index.as_retriever(similarity_top_k=5, vector_store_query_mode=mode).retrieve("green tea")
    ids, scores = store.search("bm25", None, 5, mode="lexical", texts=["green tea"])
    keep = ids[0] >= 0
    assert _texts(got) == [r.summary for r in store.get_batch(ids[0][keep])] and "coffee at noon" not in _texts(got)
    assert [g.score for g in got] == pytest.approx(scores[0][keep].tolist()) and len(got) == 3
    assert settings_embed._fn.embedder.kinds == []        # a lexical search embeds nothing
    flt = MetadataFilters(filters=[MetadataFilter(key="n", value=1, operator=FilterOperator.GTE)])
    got = index.as_retriever(similarity_top_k=5, vector_store_query_mode=mode, filters=flt).retrieve("green tea")
    assert _texts(got) == ["black tea and green apples", "a green door"]
    res = vs.query(VectorStoreQuery(query_str="green", similarity_top_k=5, sparse_top_k=1, mode=mode))
    assert len(res.ids) == (1 if mode == "sparse" else 3)
    vs.close()


def test_memkern_embedding_is_a_llamaindex_embedding_with_query_and_passage_kinds():
    import asyncio

    from llama_index.core.base.embeddings.base import BaseEmbedding

    from memkern.integrations.llamaindex import MemkernEmbedding

    inner = PlaneEmbedder(fallback="words")
    e = MemkernEmbedding(inner, embed_batch_size=2)
    assert isinstance(e, BaseEmbedding) and e.dim == 4 and e.model_name == "PlaneEmbedder"
    assert e.get_query_embedding("q") == pytest.approx(inner.table["q"].tolist()) and inner.kinds == ["query"]
    rows = e.get_text_embedding_batch(["a", "b", "c"])
    assert rows[2] == pytest.approx(inner.table["c"].tolist()) and inner.kinds[1:] == ["passage", "passage"]
    assert asyncio.run(e.aget_query_embedding("a")) == pytest.approx(inner.table["a"].tolist())
    assert asyncio.run(e.aget_text_embedding("b")) == pytest.approx(inner.table["b"].tolist())
    assert inner.kinds[-2:] == ["query", "passage"]
    with pytest.raises(MemkernTypeError, match="query"):
        e.get_query_embedding(None)
    with pytest.raises(MemkernValueError, match="embed_batch_size"):
        MemkernEmbedding(inner, embed_batch_size=0)
    with pytest.raises(MemkernTypeError, match="embedder"):
        MemkernEmbedding(object())


@pytest.mark.slow
def test_memkern_embedding_default_is_the_offline_minilm(tmp_path):
    from llama_index.core import Settings

    from memkern.integrations.llamaindex import MemkernEmbedding

    before = Settings._embed_model
    Settings.embed_model = MemkernEmbedding()
    try:
        assert Settings.embed_model.dim == 384
        vs = MemkernVectorStore(tmp_path / "s", dim=384)
        index = _index(vs, ["Alice moved to Lisbon in May", "bananas are rich in potassium"])
        for mode in ["default", "hybrid", "mmr", "sparse"]:
            got = index.as_retriever(similarity_top_k=1, vector_store_query_mode=mode).retrieve("Where does Alice live?")
            assert _texts(got) == ["Alice moved to Lisbon in May"], mode
        vs.close()
    finally:
        Settings._embed_model = before


class NoModeStore:
    """A store whose search has no ``mode`` (only dense search), to check the refusal."""

    def __init__(self, inner):
        self._inner = inner

    def search(self, namespace, queries, k=20, filter=None):
        return self._inner.search(namespace, queries, k, filter=filter)

    def __getattr__(self, name):
        return getattr(self._inner, name)


@pytest.mark.parametrize("query,kw,err,where", [
    (lambda: _q("x", mode=VectorStoreQueryMode.HYBRID), {}, MemkernTypeError, "query.query_str"),
    (lambda: _q("x", mode=VectorStoreQueryMode.HYBRID, query_str="x", alpha=1.5), {}, MemkernValueError,
     "query.alpha"),
    (lambda: _q("x", mode=VectorStoreQueryMode.HYBRID, query_str="x"), {"fusion": "max"}, MemkernValueError,
     "fusion"),
    (lambda: _q("x", mode=VectorStoreQueryMode.HYBRID, query_str="x", hybrid_top_k=0), {}, MemkernValueError,
     "hybrid_top_k"),
    (lambda: VectorStoreQuery(query_str="x", mode=VectorStoreQueryMode.HYBRID), {}, MemkernValueError,
     "query.query_embedding"),
    (lambda: VectorStoreQuery(query_str=None, mode=VectorStoreQueryMode.SPARSE), {}, MemkernTypeError,
     "query.query_str"),
    (lambda: VectorStoreQuery(query_str="x", mode=VectorStoreQueryMode.SPARSE, sparse_top_k=-1), {},
     MemkernValueError, "sparse_top_k"),
    (lambda: VectorStoreQuery(query_str="x", mode=VectorStoreQueryMode.MMR), {}, MemkernValueError,
     "query.query_embedding"),
    (lambda: _q("x", mode=VectorStoreQueryMode.MMR, mmr_threshold=2.0), {}, MemkernValueError,
     "query.mmr_threshold"),
    (lambda: _q("x", mode=VectorStoreQueryMode.MMR), {"mmr_threshold": -0.1}, MemkernValueError, "mmr_threshold"),
    (lambda: _q("x", mode=VectorStoreQueryMode.MMR), {"mmr_prefetch_k": 0}, MemkernValueError, "mmr_prefetch_k"),
    (lambda: _q("x", mode=VectorStoreQueryMode.MMR), {"mmr_prefetch_factor": 0.5}, MemkernValueError,
     "mmr_prefetch_factor"),
    (lambda: _q("x", mode=VectorStoreQueryMode.LINEAR_REGRESSION), {}, MemkernValueError, "query.mode"),
])
def test_bad_mode_queries_name_the_argument(vs, query, kw, err, where):
    with pytest.raises(err, match=where):
        vs.query(query(), **kw)


def test_lexical_modes_need_a_store_with_lexical_search(vs):
    v = MemkernVectorStore(NoModeStore(vs.client))
    assert v.query(_q("apple", k=1, mode=VectorStoreQueryMode.MMR)).ids != []
    with pytest.raises(MemkernValueError, match="query.mode"):
        v.query(_q("apple", mode=VectorStoreQueryMode.HYBRID, query_str="apple"))
