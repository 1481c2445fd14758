"""memkern.integrations.langchain against the real langchain-core: the VectorStore contract, filters,
atomic bad input, persistence, and the retriever whose learned reranker learns from citations."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

pytest.importorskip("langchain_core")

from langchain_core.documents import Document  # noqa: E402

from fakes_embed import HashEmbedder, PlaneEmbedder  # noqa: E402
from memkern import MemkernKeyError, MemkernTypeError, MemkernValueError, Reranker  # noqa: E402
from memkern.integrations.langchain import (  # noqa: E402
    MemkernEmbeddings,
    MemkernRetriever,
    MemkernVectorStore,
)

TEXTS = ["red apple pie", "red sports car", "green apple tree", "blue car wash", "a book about apples"]
METAS = [{"color": "red", "n": 1}, {"color": "red", "n": 2}, {"color": "green", "n": 3}, {"color": "blue", "n": 4},
         {"color": "none", "n": 5}]


@pytest.fixture
def vs(tmp_path):
    v = MemkernVectorStore(tmp_path / "s", HashEmbedder(), namespace="docs")
    v.add_texts(TEXTS, METAS, ids=[f"d{i}" for i in range(5)])
    yield v
    v.close()


def test_add_search_filter_delete_get(vs):
    docs = vs.similarity_search("apple", k=2)
    assert [d.id for d in docs] == ["d0", "d2"] or [d.id for d in docs] == ["d2", "d0"]
    assert all(isinstance(d, Document) and "__lc_id__" not in d.metadata for d in docs)
    scored = vs.similarity_search_with_score("red apple pie", k=5)
    assert scored[0][0].id == "d0" and scored[0][1] == pytest.approx(1.0, abs=1e-5)
    assert [s for _, s in scored] == sorted((s for _, s in scored), reverse=True)
    assert [d.id for d in vs.similarity_search("apple", k=5, filter={"color": "red"})] == ["d0", "d1"]
    assert vs.similarity_search("car", k=5, filter={"n": {"$gte": 3}})[0].id == "d3"
    assert {d.id for d in vs.similarity_search("car", k=5, filter={"n": {"$gte": 3}})} == {"d2", "d3", "d4"}
    got = vs.get_by_ids(["d3", "nope", "d1"])
    assert [d.id for d in got] == ["d3", "d1"] and got[0].page_content == "blue car wash" and got[0].metadata == METAS[3]
    assert vs.delete(["d0", "d1"]) is True
    assert [d.id for d in vs.similarity_search("apple", k=5, filter={"color": "red"})] == []
    assert vs.delete(["d4", "d0", "never"]) is True         # d0 is gone, "never" never was: skipped
    assert [d.id for d in vs.get_by_ids(["d4", "d2", "d3"])] == ["d2", "d3"] and vs.store.count("docs") == 2
    rel = vs.similarity_search_with_relevance_scores("green apple tree", k=1)
    assert rel[0][0].id == "d2" and 0.99 <= rel[0][1] <= 1.0


def test_add_documents_upserts_by_id_and_survives_reopen(tmp_path):
    emb = HashEmbedder()
    v = MemkernVectorStore(tmp_path / "s", emb)
    ids = v.add_documents([Document(page_content="alpha", metadata={"a": 1}, id="x"),
                           Document(page_content="beta", metadata={})])
    assert ids[0] == "x" and len(ids[1]) == 36
    v.add_documents([Document(page_content="alpha two", metadata={"a": 2}, id="x")])
    assert v.store.count("langchain") == 2
    rid = v.record_id("x")
    assert [r.summary for r in v.store.history(rid)] == ["alpha", "alpha two"]
    v.close()
    v2 = MemkernVectorStore(tmp_path / "s", emb)
    assert v2.get_by_ids(["x"])[0].metadata == {"a": 2}
    assert v2.similarity_search("beta", k=1)[0].id == ids[1]
    v2.close()


def test_from_texts_as_retriever_and_async(tmp_path):
    v = MemkernVectorStore.from_texts(TEXTS, HashEmbedder(), METAS, store_or_path=tmp_path / "s")
    r = v.as_retriever(search_kwargs={"k": 2, "filter": {"color": "red"}})
    assert {d.page_content for d in r.invoke("apple")} == {"red apple pie", "red sports car"}
    docs = asyncio.run(v.asimilarity_search("blue car", k=1))
    assert docs[0].page_content == "blue car wash"
    v.close()


def test_memkern_embeddings_is_a_langchain_embeddings(vs):
    e = MemkernEmbeddings(HashEmbedder())
    rows = e.embed_documents(["a b", "c"])
    assert len(rows) == 2 and len(rows[0]) == 64 and isinstance(rows[0][0], float)
    assert np.allclose(e.embed_query("a b"), rows[0])
    # a LangChain Embeddings also works as the store's embedding
    with pytest.raises(MemkernValueError, match="embedder"):
        MemkernVectorStore(vs.store, MemkernEmbeddings(HashEmbedder(dim=8)))
    v2 = MemkernVectorStore(vs.store, e, namespace="other")
    v2.add_texts(["zebra"], ids=["z"])
    assert v2.similarity_search("zebra", k=3)[0].id == "z" and len(v2.similarity_search("zebra", k=3)) == 1


@pytest.mark.parametrize("call,err,where", [
    (lambda v: v.add_texts(["ok", 5]), MemkernTypeError, r"texts\[1\]"),
    (lambda v: v.add_texts(["ok", "x"], [{"a": 1}]), MemkernValueError, "metadatas"),
    (lambda v: v.add_texts(["ok", "x"], [{"a": 1}, {"b": float("inf")}]), MemkernTypeError, r"metadatas\[1\]"),
    (lambda v: v.add_texts(["ok", "x"], [{"a": 1}, {"__lc_id__": "y"}]), MemkernValueError, r"metadatas\[1\]"),
    (lambda v: v.add_texts(["ok", "x"], ids=["same", "same"]), MemkernValueError, "ids"),
    (lambda v: v.add_texts(["ok", "\ud800"]), MemkernValueError, r"texts\[1\]"),
    (lambda v: v.similarity_search("x", k=0), MemkernValueError, "k"),
    (lambda v: v.similarity_search("x", filter={"a": {"$bad": 1}}), MemkernValueError, "filter"),
    (lambda v: v.similarity_search(None), MemkernTypeError, "query"),
    (lambda v: v.similarity_search_by_vector([0.0] * 3), MemkernValueError, "embedding"),
    (lambda v: v.delete(None), MemkernValueError, "ids"),
])
def test_bad_input_names_the_argument_and_writes_nothing(vs, call, err, where):
    before = vs.store.count("docs")
    with pytest.raises(err, match=where):
        call(vs)
    assert vs.store.count("docs") == before and vs.similarity_search("ok", k=10, filter={"a": 1}) == []


# ------------------------------------------------------------------------------- the retriever
class TableEmbedder:
    """Fixed vectors per text (d = 16), to place a gold document where retrieval ranks it low."""

    dim = 16

    def __init__(self):
        e = np.eye(16, dtype=np.float32)
        self.table = {"q": e[0]}
        for j in range(1, 10):
            v = 0.9 * e[0] + 0.436 * e[j]
            self.table[f"distractor {j}"] = v / np.linalg.norm(v)
        gold = 0.6 * e[0] + 0.8 * e[10]
        self.table["gold"] = gold / np.linalg.norm(gold)

    def encode(self, texts, kind="passage"):
        return np.stack([self.table[t] for t in texts]).astype(np.float32)


def _gold_store(tmp_path):
    v = MemkernVectorStore(tmp_path / "g", TableEmbedder())
    names = [f"distractor {j}" for j in range(1, 10)] + ["gold"]
    v.add_texts(names, [{"name": n} for n in names], ids=names)
    return v


def test_retriever_without_reranker_shows_top_k(tmp_path):
    v = _gold_store(tmp_path)
    r = MemkernRetriever(vectorstore=v, k=3)
    docs = r.invoke("q")
    assert len(docs) == 3 and "gold" not in [d.id for d in docs]
    rid = docs[0].metadata["memkern_retrieval_id"]
    assert r.last_retrieval_id == rid and all(d.metadata["memkern_retrieval_id"] == rid for d in docs)
    assert r.feedback([docs[0]]) is None                  # no reranker: nothing to learn
    v.close()


@pytest.mark.slow
def test_citation_feedback_teaches_the_reranker(tmp_path):
    v = _gold_store(tmp_path)
    path = tmp_path / "rr.pt"
    r = MemkernRetriever(vectorstore=v, k=2, candidates=10, reranker=True, reranker_path=path)
    greedy = MemkernRetriever(vectorstore=v, k=2, candidates=10, reranker=r.reranker, greedy=True)
    assert "gold" not in [d.id for d in greedy.invoke("q")]          # a fresh reranker = retrieval order
    shown_gold = []
    for step in range(60):
        docs = r.invoke("q")
        cited = [d for d in docs if d.id == "gold"]
        shown_gold.append(bool(cited))
        stats = r.feedback(cited)
        assert stats is not None and np.isfinite(stats["loss"])
    assert "gold" in [d.id for d in greedy.invoke("q")], "the cited document is not ranked up"
    assert sum(shown_gold[-20:]) > sum(shown_gold[:20])
    assert path.exists() and Reranker.load(path).adapter_norm() > 0
    # a retriever reloading the saved reranker ranks the same way
    r2 = MemkernRetriever(vectorstore=v, k=2, candidates=10, reranker=True, reranker_path=path, greedy=True)
    assert "gold" in [d.id for d in r2.invoke("q")]
    v.close()


def test_feedback_rejects_bad_citations(tmp_path):
    v = _gold_store(tmp_path)
    r = MemkernRetriever(vectorstore=v, k=2, candidates=10, reranker=True)
    docs = r.invoke("q")
    norm = r.reranker.adapter_norm()
    with pytest.raises(MemkernValueError, match="cited"):
        r.feedback(["not-shown-id"])
    with pytest.raises(MemkernTypeError, match="cited"):
        r.feedback("gold")
    with pytest.raises(MemkernKeyError, match="retrieval_id"):
        r.feedback([], retrieval_id="nope")
    assert r.reranker.adapter_norm() == norm                         # nothing learned from bad input
    r.feedback([docs[0]])
    with pytest.raises(MemkernKeyError, match="retrieval_id"):
        r.feedback([docs[0]])                                        # each retrieval is rewarded once
    with pytest.raises(MemkernValueError, match="candidates"):
        MemkernRetriever(vectorstore=v, k=5, candidates=3)
    with pytest.raises(MemkernTypeError, match="vectorstore"):
        MemkernRetriever(vectorstore=object())
    with pytest.raises(MemkernValueError, match="reranker"):
        MemkernRetriever(vectorstore=v, reranker=Reranker(8))
    v.close()


# ------------------------------------------------------------------------------- MMR and relevance
PLANE = ["a", "a twin", "b", "c", "far"]


@pytest.fixture
def plane(make_store):
    v = MemkernVectorStore(make_store(4, "cos"), PlaneEmbedder(), namespace="plane")
    v.add_texts(PLANE, [{"i": i} for i in range(5)], ids=PLANE)
    yield v
    v.close()


def test_mmr_trades_similarity_for_diversity(plane):
    assert [d.id for d in plane.similarity_search("q", k=3)] == ["a", "a twin", "b"]
    # lambda 1: similarity order; 0.5: the twin of the first pick is skipped for b and c
    assert [d.id for d in plane.max_marginal_relevance_search("q", k=3, lambda_mult=1.0)] == ["a", "a twin", "b"]
    assert [d.id for d in plane.max_marginal_relevance_search("q", k=3, lambda_mult=0.5)] == ["a", "b", "c"]
    # candidates are the store's best fetch_k only ("far" never competes) and pass the filter
    assert [d.id for d in plane.max_marginal_relevance_search("q", k=3, fetch_k=3)] == ["a", "b", "a twin"]
    assert [d.id for d in plane.max_marginal_relevance_search("q", k=2, filter={"i": {"$gte": 1}})] == ["a twin", "b"]
    q = PlaneEmbedder().table["q"].tolist()
    assert [d.id for d in plane.max_marginal_relevance_search_by_vector(q, k=3)] == ["a", "b", "c"]
    got = asyncio.run(plane.amax_marginal_relevance_search("q", k=3))
    assert [d.id for d in got] == ["a", "b", "c"] and got[1].page_content == "b" and got[1].metadata == {"i": 2}
    assert [d.id for d in asyncio.run(plane.amax_marginal_relevance_search_by_vector(q, k=2))] == ["a", "b"]
    r = plane.as_retriever(search_type="mmr", search_kwargs={"k": 3, "fetch_k": 5, "lambda_mult": 0.5})
    assert [d.id for d in r.invoke("q")] == ["a", "b", "c"]
    assert [d.id for d in asyncio.run(r.ainvoke("q"))] == ["a", "b", "c"]


def test_mmr_equals_langchains_own_on_random_candidates():
    from langchain_core.vectorstores.utils import maximal_marginal_relevance

    from memkern.integrations.mmr import mmr

    rng = np.random.default_rng(0)
    for trial in range(60):
        n, d = int(rng.integers(1, 30)), int(rng.integers(2, 12))
        cands = rng.standard_normal((n, d)).astype(np.float32)
        if trial % 5 == 0:
            cands[rng.integers(n)] = 0.0                  # a zero vector: similarity 0 in both
        q = rng.standard_normal(d).astype(np.float32)
        k, lam = int(rng.integers(1, n + 3)), float(rng.choice([0.0, 0.25, 0.5, 0.9, 1.0]))
        want = maximal_marginal_relevance(q, cands.tolist(), lambda_mult=lam, k=k)
        assert mmr(q, cands, k, lam)[0].tolist() == want, (trial, n, k, lam)


def test_relevance_scores_follow_langchains_convention_per_metric(make_store):
    emb = PlaneEmbedder()
    t = emb.table
    for metric, want in [("cos", lambda x: max(0.0, float(t["q"] @ x))),
                         ("ip", lambda x: max(0.0, float(t["q"] @ x))),
                         ("l2", lambda x: max(0.0, 1 - float(np.linalg.norm(t["q"] - x)) / np.sqrt(2)))]:
        v = MemkernVectorStore(make_store(4, metric, name=metric), emb, namespace="r")
        v.add_texts(PLANE, ids=PLANE)
        rel = v.similarity_search_with_relevance_scores("q", k=5)
        assert [d.id for d, _ in rel] == ["a", "a twin", "b", "c", "far"], metric
        for d, s in rel:
            assert 0.0 <= s <= 1.0 and s == pytest.approx(want(t[d.id]), abs=1e-5), (metric, d.id)
        assert rel[-1][1] == 0.0                               # "far" is opposite: relevance 0, not < 0
        r = v.as_retriever(search_type="similarity_score_threshold",
                           search_kwargs={"score_threshold": 0.7, "k": 5})
        assert [d.id for d in r.invoke("q")] == [d.id for d, s in rel if s >= 0.7] != []
        assert [d.id for d in asyncio.run(r.ainvoke("q"))] == [d.id for d, s in rel if s >= 0.7]
        v.close()


@pytest.mark.parametrize("call,err,where", [
    (lambda v: v.max_marginal_relevance_search("q", k=5, fetch_k=3), MemkernValueError, "fetch_k"),
    (lambda v: v.max_marginal_relevance_search("q", lambda_mult=1.5), MemkernValueError, "lambda_mult"),
    (lambda v: v.max_marginal_relevance_search("q", lambda_mult="x"), MemkernTypeError, "lambda_mult"),
    (lambda v: v.max_marginal_relevance_search("q", k=0), MemkernValueError, "k"),
    (lambda v: v.max_marginal_relevance_search("q", filter={"a": {"$bad": 1}}), MemkernValueError, "filter"),
    (lambda v: v.max_marginal_relevance_search_by_vector([1.0, 0.0]), MemkernValueError, "embedding"),
    (lambda v: v.max_marginal_relevance_search_by_vector([float("nan")] * 4), MemkernValueError, "embedding"),
])
def test_mmr_bad_input_names_the_argument(plane, call, err, where):
    with pytest.raises(err, match=where):
        call(plane)


def test_mmr_on_an_empty_store(make_store):
    v = MemkernVectorStore(make_store(4), PlaneEmbedder(), namespace="empty")
    assert v.max_marginal_relevance_search("q", k=3) == []
    v.close()
