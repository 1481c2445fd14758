"""LangChain on memkern: ``MemkernVectorStore`` (a ``VectorStore``), ``MemkernRetriever`` (a
``BaseRetriever`` that can rerank with memkern's learned reranker and learn from citations) and
``MemkernEmbeddings`` (memkern's offline embedder as LangChain ``Embeddings``).

Storage: one LangChain document = one memkern topic record in the vector store's ``namespace``
(``summary`` = ``page_content``, ``meta`` = the document's metadata plus the reserved key
``"__lc_id__"``, the document id; ids not given are new UUID4 strings). Adding a document whose id
exists writes a new version of its record; deleting ids that hold no document is not an error
(LangChain's contract). ``filter=`` takes the dict grammar of :mod:`memkern.integrations.filters`
(``{"user": "alice", "n": {"$gte": 3}}``).

Search types of ``as_retriever``: ``"similarity"``; ``"mmr"`` (:meth:`MemkernVectorStore.
max_marginal_relevance_search`: maximal marginal relevance over the store's best ``fetch_k``,
:mod:`memkern.integrations.mmr`); ``"similarity_score_threshold"`` (relevance scores in [0, 1] by
LangChain's convention for the store's metric: the cosine similarity for ``"cos"`` / ``"ip"``
stores of normalised embeddings, ``1 - ||q - x|| / sqrt(2)`` for ``"l2"``; clipped to [0, 1]). The
langchain_tests standard vector-store suite passes (``tests/integrations/test_langchain_standard.py``).

Reranking: ``MemkernRetriever(vectorstore, k=4, candidates=20, reranker=...)`` retrieves
``candidates`` records and lets a :class:`memkern.Reranker` choose ``k`` of them (Gumbel-top-k
sampling, or ``greedy=True``). Each call gets a ``retrieval_id`` (in every returned document's
``metadata["memkern_retrieval_id"]`` and in ``retriever.last_retrieval_id``);
``retriever.feedback(cited)`` then turns the answer's citations into rewards (+1 for each shown
document that was cited, -1 for each one that was not) and runs one REINFORCE step
(``Reranker.update``), saving the reranker to ``reranker_path`` when one is set.
"""
from __future__ import annotations

import math
import os
import threading
import uuid
from collections import OrderedDict
from typing import Any, Callable, Iterable, Sequence

import numpy as np

try:
    from langchain_core.callbacks import CallbackManagerForRetrieverRun
    from langchain_core.documents import Document
    from langchain_core.embeddings import Embeddings
    from langchain_core.retrievers import BaseRetriever
    from langchain_core.vectorstores import VectorStore
    from pydantic import ConfigDict, PrivateAttr
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError("memkern.integrations.langchain needs LangChain: pip install 'memkern[langchain]'") from e

from ..errors import MemkernKeyError, MemkernTypeError, MemkernValueError, bad_arg
from ..base.validate import MAX_ID_CHARS, MAX_QUERY_CHARS, check_int, check_namespace_str
from . import filters as F
from ._common import (TIME_KEYS, EmbedFn, apply_writes, as_embed_fn, check_text, check_texts, open_store, pop_time_kw,
                      release_store, time_kw)
from .mmr import check_lambda, mmr
from .values import check_json_value

__all__ = ["MemkernEmbeddings", "MemkernVectorStore", "MemkernRetriever", "ID_KEY"]

#: Reserved meta key holding the LangChain document id.
ID_KEY = "__lc_id__"
_CHUNK = 256


class MemkernEmbeddings(Embeddings):
    """memkern's embedder as LangChain ``Embeddings`` (``None``: the offline MiniLM default)."""

    def __init__(self, embedder: Any = None):
        self._fn = as_embed_fn(embedder)

    @property
    def dim(self) -> int:
        return self._fn.dim

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return self._fn(check_texts(texts, "texts"), kind="passage").tolist()

    def embed_query(self, text: str) -> list[float]:
        return self._fn([check_text(text, "text", MAX_QUERY_CHARS)], kind="query")[0].tolist()


def _check_k(k: Any, name: str = "k") -> int:
    return check_int(name, k, 1, type_error=True)


def _cosine_relevance(score: float) -> float:
    return min(1.0, max(0.0, float(score)))


def _l2_relevance(score: float) -> float:
    return min(1.0, max(0.0, 1.0 - math.sqrt(max(0.0, -float(score))) / math.sqrt(2.0)))


class MemkernVectorStore(VectorStore):
    """A LangChain ``VectorStore`` on one namespace of a memkern store.

    Parameters
    ----------
    store_or_path : memkern store or str / os.PathLike (opened / created; closed by :meth:`close`)
    embedding : LangChain ``Embeddings``, memkern ``Embedder``, callable, or ``None`` (MiniLM)
    namespace : the memkern namespace holding the documents
    """

    def __init__(self, store_or_path: Any, embedding: Any = None, *, namespace: str = "langchain") -> None:
        self.namespace = check_namespace_str(namespace)
        self._embedding = embedding if isinstance(embedding, Embeddings) else None
        self._embed: EmbedFn = as_embed_fn(embedding)
        self.store, self._owned = open_store(store_or_path, self._embed.dim)
        self._lock = threading.RLock()
        self._ids: dict[str, int] = {}
        ids = np.asarray(self.store.ids(self.namespace)) if self.namespace in self.store.namespaces() else []
        for s in range(0, len(ids), _CHUNK):
            for r in self.store.get_batch(ids[s:s + _CHUNK]):
                if isinstance(r.meta.get(ID_KEY), str):
                    self._ids[r.meta[ID_KEY]] = int(r.id)

    @property
    def embeddings(self) -> Embeddings:
        if self._embedding is None:
            self._embedding = MemkernEmbeddings(self._embed)
        return self._embedding

    def close(self) -> None:
        if self._owned:
            self._owned = False
            release_store(self.store)

    # ------------------------------------------------------------------ writes
    def add_texts(self, texts: Iterable[str], metadatas: list[dict] | None = None, *,
                  ids: list[str] | None = None, **kwargs: Any) -> list[str]:
        """Embed and store ``texts`` (one call, atomic per namespace); returns their ids. Every
        argument is checked before anything is embedded or written."""
        texts = check_texts(texts, "texts")
        n = len(texts)
        if metadatas is not None and (isinstance(metadatas, dict) or len(metadatas) != n):
            raise bad_arg("metadatas", f"None or a list of {n} dicts",
                          type(metadatas).__name__ if isinstance(metadatas, dict) else f"length {len(metadatas)}")
        if ids is not None and (isinstance(ids, str) or len(ids) != n):
            raise bad_arg("ids", f"None or a list of {n} str", ids if isinstance(ids, str) else f"length {len(ids)}")
        metas = []
        for i in range(n):
            m = {} if metadatas is None or metadatas[i] is None else metadatas[i]
            if not isinstance(m, dict):
                raise bad_arg(f"metadatas[{i}]", "a dict", type(m).__name__, MemkernTypeError)
            check_json_value(m, f"metadatas[{i}]")
            if ID_KEY in m:
                raise bad_arg(f"metadatas[{i}]", f"no reserved key {ID_KEY!r}", ID_KEY)
            metas.append(m)
        out_ids = []
        for i in range(n):
            d = None if ids is None else ids[i]
            if d is None:
                d = str(uuid.uuid4())
            check_text(d, f"ids[{i}]", MAX_ID_CHARS)
            if not d:
                raise bad_arg(f"ids[{i}]", "a non-empty str", d)
            out_ids.append(d)
        if len(set(out_ids)) != n:
            raise bad_arg("ids", "distinct ids", sorted({d for d in out_ids if out_ids.count(d) > 1}))
        if n == 0:
            return []
        vecs = self._embed(texts, kind="passage")
        with self._lock:
            new = [i for i in range(n) if self._ids.get(out_ids[i]) is None]
            updates = [(self._ids[out_ids[i]], dict(summary=texts[i], embedding=vecs[i],
                                                    meta={**metas[i], ID_KEY: out_ids[i]}))
                       for i in range(n) if self._ids.get(out_ids[i]) is not None]
            adds = [(self.namespace, [texts[i] for i in new], vecs[new],
                     [{**metas[i], ID_KEY: out_ids[i]} for i in new])] if new else []
            ids = apply_writes(self.store, updates, adds)
            if new:
                for i, rid in zip(new, ids[0].tolist()):
                    self._ids[out_ids[i]] = int(rid)
        return out_ids

    def delete(self, ids: list[str] | None = None, **kwargs: Any) -> bool | None:
        """Delete the documents with these ids; ids of no document are skipped (LangChain's
        contract: deleting missing content is not an error). Returns ``True``. ``ids=None`` (which
        LangChain leaves to the store) is refused rather than taken as "delete everything"."""
        if ids is None:
            raise bad_arg("ids", "a list of document ids", None)
        ids = check_texts(ids, "ids")
        with self._lock:
            for d in dict.fromkeys(ids):
                rid = self._ids.pop(d, None)
                if rid is not None and rid in self.store:
                    self.store.delete(rid)
        return True

    # ------------------------------------------------------------------ reads
    def _doc(self, r: Any) -> Document:
        meta = {k: v for k, v in r.meta.items() if k != ID_KEY}
        return Document(id=r.meta.get(ID_KEY), page_content=r.summary, metadata=meta)

    def record_id(self, doc_id: str) -> int:
        """The memkern record id of a document id (:class:`memkern.MemkernKeyError` if unknown)."""
        rid = self._ids.get(doc_id)
        if rid is None:
            raise MemkernKeyError(f"doc_id: unknown document id {doc_id!r}")
        return rid

    def get_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        ids = check_texts(ids, "ids")
        rids = [self._ids[d] for d in ids if d in self._ids]
        return [self._doc(r) for r in self.store.get_batch(rids)] if rids else []

    def _search(self, q: np.ndarray, k: int, filter: Any, tkw: dict | None = None
                ) -> tuple[np.ndarray, np.ndarray, list]:
        tree = F.parse(filter, "filter")
        if self.namespace not in self.store.namespaces():
            return np.zeros(0, np.int64), np.zeros(0, np.float32), []
        return F.search(self.store, self.namespace, q, k, tree, **(tkw or {}))

    def similarity_search_with_score(self, query: str, k: int = 4, filter: dict | None = None,
                                     **kwargs: Any) -> list[tuple[Document, float]]:
        """``(document, score)`` pairs, best first; score = the store's similarity (cosine for
        normalised embeddings: higher is better; plus the recency prior when one is asked for).

        ``filter``: a metadata filter (:mod:`memkern.integrations.filters`). ``kwargs`` may hold
        ``time_range`` / ``time_field`` / ``recency`` / ``recency_weight`` / ``now``
        (:func:`memkern.integrations._common.time_kw`; e.g. through
        ``as_retriever(search_kwargs={"time_range": (start, None)})``)."""
        k = _check_k(k)
        F.parse(filter, "filter")
        tkw = pop_time_kw(self.store, kwargs)
        q = self._embed([check_text(query, "query", MAX_QUERY_CHARS)], kind="query")[0]
        _, scores, recs = self._search(q, k, filter, tkw)
        return [(self._doc(r), float(s)) for r, s in zip(recs, scores.tolist())]

    def similarity_search(self, query: str, k: int = 4, filter: dict | None = None, **kwargs: Any) -> list[Document]:
        """Documents of :meth:`similarity_search_with_score` (the same ``filter`` and time keywords)."""
        return [d for d, _ in self.similarity_search_with_score(query, k, filter, **kwargs)]

    def similarity_search_by_vector(self, embedding: list[float], k: int = 4, filter: dict | None = None,
                                    **kwargs: Any) -> list[Document]:
        k = _check_k(k)
        tkw = pop_time_kw(self.store, kwargs)
        q = self._query_vector(embedding)
        return [self._doc(r) for r in self._search(q, k, filter, tkw)[2]]

    def _select_relevance_score_fn(self) -> Callable[[float], float]:
        """Store score -> relevance in [0, 1], LangChain's convention for the store's metric (for
        normalised embeddings): ``"cos"`` / ``"ip"``: ``1 - cosine distance`` = the similarity;
        ``"l2"`` (score ``-||q - x||^2``): ``1 - ||q - x|| / sqrt(2)``; clipped to [0, 1] (opposite
        vectors, or unnormalised ones, would fall outside)."""
        return _l2_relevance if self.store.metric == "l2" else _cosine_relevance

    def max_marginal_relevance_search(self, query: str, k: int = 4, fetch_k: int = 20, lambda_mult: float = 0.5,
                                      filter: dict | None = None, **kwargs: Any) -> list[Document]:
        """``k`` documents picked by maximal marginal relevance (:mod:`memkern.integrations.mmr`)
        from the store's best ``fetch_k`` for ``query``. ``lambda_mult``: 1 = similarity order,
        0 = most diverse. ``filter`` and the time keywords as in :meth:`similarity_search_with_score`
        (they restrict the candidates)."""
        self._check_mmr(k, fetch_k, lambda_mult, filter)
        q = self._embed([check_text(query, "query", MAX_QUERY_CHARS)], kind="query")[0]
        return self.max_marginal_relevance_search_by_vector(q, k, fetch_k, lambda_mult, filter, **kwargs)

    def max_marginal_relevance_search_by_vector(self, embedding: list[float], k: int = 4, fetch_k: int = 20,
                                                lambda_mult: float = 0.5, filter: dict | None = None,
                                                **kwargs: Any) -> list[Document]:
        """:meth:`max_marginal_relevance_search` for a query vector (``[d]`` floats)."""
        k, fetch_k, lam = self._check_mmr(k, fetch_k, lambda_mult, filter)
        tkw = pop_time_kw(self.store, kwargs)
        q = self._query_vector(embedding)
        ids, _, recs = self._search(q, fetch_k, filter, tkw)
        if not len(ids):
            return []
        picks, _ = mmr(q, np.asarray(self.store.embeddings(ids)), k, lam)
        return [self._doc(recs[i]) for i in picks.tolist()]

    @staticmethod
    def _check_mmr(k: Any, fetch_k: Any, lambda_mult: Any, filter: Any) -> tuple[int, int, float]:
        k = _check_k(k)
        fetch_k = _check_k(fetch_k, "fetch_k")
        if fetch_k < k:
            raise bad_arg("fetch_k", f"an int >= k = {k} (the candidates MMR picks from)", fetch_k)
        lam = check_lambda(lambda_mult, "lambda_mult")
        F.parse(filter, "filter")
        return k, fetch_k, lam

    def _query_vector(self, embedding: Any) -> np.ndarray:
        try:
            q = np.asarray(embedding, dtype=np.float32)
        except (TypeError, ValueError):
            raise bad_arg("embedding", f"{self.store.dim} floats", type(embedding).__name__, MemkernTypeError) from None
        if q.ndim != 1 or q.shape[0] != self.store.dim or not np.isfinite(q).all():
            raise bad_arg("embedding", f"{self.store.dim} finite floats", f"shape {list(q.shape)}")
        return q

    @classmethod
    def from_texts(cls, texts: list[str], embedding: Any = None, metadatas: list[dict] | None = None, *,
                   ids: list[str] | None = None, store_or_path: Any = None, namespace: str = "langchain",
                   **kwargs: Any) -> "MemkernVectorStore":
        if store_or_path is None:
            raise bad_arg("store_or_path", "a memkern store or a path", None)
        vs = cls(store_or_path, embedding, namespace=namespace)
        vs.add_texts(texts, metadatas, ids=ids)
        return vs


class MemkernRetriever(BaseRetriever):
    """Retrieve ``candidates`` documents and show ``k``: the best ``k`` by similarity, or ``k``
    chosen by a learned :class:`memkern.Reranker` (``reranker=True`` makes a fresh one of the
    store's dim, or the one saved at ``reranker_path``). :meth:`feedback` learns from citations.
    ``filter`` (metadata) and ``time_range`` / ``time_field`` / ``recency`` / ``recency_weight`` /
    ``now`` (:func:`memkern.integrations._common.time_kw`) limit the candidates the reranker sees."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    vectorstore: Any
    k: int = 4
    candidates: int = 20
    reranker: Any = None
    reranker_path: Any = None
    greedy: bool = False
    filter: Any = None
    time_range: Any = None
    time_field: str = "event"
    recency: Any = None
    recency_weight: Any = None
    now: Any = None
    max_pending: int = 1024

    _pending: Any = PrivateAttr(default=None)
    _lock: Any = PrivateAttr(default=None)
    last_retrieval_id: Any = None

    def __init__(self, **kwargs: Any) -> None:
        # checked here, before pydantic, so that bad arguments raise memkern errors (pydantic would
        # wrap them in its ValidationError)
        vs = kwargs.get("vectorstore")
        if not isinstance(vs, MemkernVectorStore):
            raise bad_arg("vectorstore", "a MemkernVectorStore", type(vs).__name__, MemkernTypeError)
        k = _check_k(kwargs.get("k", 4), "k")
        c = _check_k(kwargs.get("candidates", 20), "candidates")
        if c < k:
            raise bad_arg("candidates", f"an int >= k = {k}", c)
        F.parse(kwargs.get("filter"), "filter")
        time_kw(vs.store, **{k: kwargs[k] for k in TIME_KEYS if k in kwargs})
        _check_k(kwargs.get("max_pending", 1024), "max_pending")
        rr = kwargs.get("reranker")
        if rr is True:
            from ..score.reranker import Reranker

            path = kwargs.get("reranker_path")
            rr = Reranker.load(path) if path is not None and os.path.exists(path) else Reranker(vs.store.dim, top_m=k)
            kwargs["reranker"] = rr
        elif rr is not None and not (hasattr(rr, "select") and hasattr(rr, "update")):
            raise bad_arg("reranker", "None, True or a memkern Reranker", type(rr).__name__, MemkernTypeError)
        if rr is not None and int(getattr(rr, "dim", vs.store.dim)) != vs.store.dim:
            raise bad_arg("reranker", f"a reranker of dim {vs.store.dim}", int(rr.dim))
        super().__init__(**kwargs)
        self._pending = OrderedDict()
        self._lock = threading.Lock()

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        vs: MemkernVectorStore = self.vectorstore
        q = vs._embed([check_text(query, "query", MAX_QUERY_CHARS)], kind="query")[0]
        want = self.candidates if self.reranker is not None else self.k
        tkw = time_kw(vs.store, self.time_range, self.time_field, self.recency, self.recency_weight, self.now)
        ids, scores, recs = vs._search(q, want, self.filter, tkw)
        rid = uuid.uuid4().hex
        if self.reranker is None or len(ids) <= self.k:
            docs = [vs._doc(r) for r in recs[:self.k]]
            shown = [d.id for d in docs]
            sel = None
        else:
            import torch

            n = len(ids)
            cand = torch.zeros(1, self.candidates, vs.store.dim, dtype=torch.float32)
            cand[0, :n] = torch.from_numpy(np.asarray(vs.store.embeddings(ids), dtype=np.float32))
            mask = torch.zeros(1, self.candidates, dtype=torch.bool)
            mask[0, :n] = True
            sel = self.reranker.select(torch.from_numpy(q[None, :]), cand, mask=mask, m=self.k, greedy=self.greedy)
            picks = [int(i) for i in sel.indices[0].tolist() if 0 <= int(i) < n]
            docs = [vs._doc(recs[i]) for i in picks]
            shown = [d.id for d in docs]
        for d in docs:
            d.metadata["memkern_retrieval_id"] = rid
        with self._lock:
            self._pending[rid] = (sel, shown)
            while len(self._pending) > self.max_pending:
                self._pending.popitem(last=False)
        self.last_retrieval_id = rid
        return docs

    def feedback(self, cited: Sequence[Any], retrieval_id: str | None = None) -> dict | None:
        """Reward the documents of one retrieval that the answer cited (+1) and those it did not (-1).

        Parameters
        ----------
        cited : documents or document ids that were cited (possibly empty: nothing shown helped)
        retrieval_id : which retrieval (default: the one in the cited documents' metadata, else the last)

        Returns
        -------
        The reranker's update statistics (a dict), or ``None`` when nothing was learned (no
        reranker, or the retrieval showed every candidate so there was no choice).
        """
        if isinstance(cited, (str, Document)) or not isinstance(cited, (list, tuple)):
            raise bad_arg("cited", "a list of documents or document ids", type(cited).__name__, MemkernTypeError)
        cited_ids = []
        for i, c in enumerate(cited):
            if isinstance(c, Document):
                if retrieval_id is None:
                    retrieval_id = c.metadata.get("memkern_retrieval_id")
                c = c.id
            cited_ids.append(check_text(c, f"cited[{i}]", MAX_ID_CHARS))
        if retrieval_id is None:
            retrieval_id = self.last_retrieval_id
        if retrieval_id is None:
            raise bad_arg("retrieval_id", "the id of a retrieval of this retriever", None)
        with self._lock:
            hit = self._pending.get(retrieval_id)
            if hit is None:
                raise MemkernKeyError(f"retrieval_id: unknown or already rewarded retrieval {retrieval_id!r}")
            sel, shown = hit
            stray = [c for c in cited_ids if c not in shown]
            if stray:
                raise bad_arg("cited", f"documents shown by retrieval {retrieval_id!r} ({shown})", stray)
            del self._pending[retrieval_id]
        if sel is None:
            return None
        import torch

        picks = sel.indices[0].tolist()
        rewards = torch.zeros(1, len(picks), dtype=torch.float32)
        j = 0
        for s, p in enumerate(picks):
            if p >= 0:
                rewards[0, s] = 1.0 if shown[j] in cited_ids else -1.0
                j += 1
        stats = dict(self.reranker.update(sel, rewards))
        if self.reranker_path is not None:
            self.reranker.save(self.reranker_path)
        return {k: float(v) for k, v in stats.items()}
