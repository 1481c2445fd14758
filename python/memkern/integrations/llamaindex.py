"""LlamaIndex on memkern: ``MemkernVectorStore``, a ``BasePydanticVectorStore`` with metadata filters.

One LlamaIndex node = one memkern topic record in the store's ``namespace``: ``summary`` = the
node's text, the vector = ``node.embedding`` (LlamaIndex embeds before ``add``), ``meta`` = the
node's metadata at the top level (what filters see) plus LlamaIndex's own serialisation keys
(``_node_content``, ``_node_type``, ``ref_doc_id``, ...) and the reserved key ``"__li_id__"`` (the
node id). Adding a node whose id exists writes a new version of its record.

``query(VectorStoreQuery(query_embedding=..., similarity_top_k=k, filters=MetadataFilters(...),
doc_ids=..., node_ids=...))`` returns the best ``k`` matching nodes (empty ``doc_ids`` /
``node_ids`` lists, which ``VectorStoreIndex`` passes, restrict nothing), similarities = the store's
scores (cosine for normalised embeddings). Every ``FilterOperator`` is supported (``==  !=  >  >=
<  <=  in  nin  any  all  contains  text_match  text_match_insensitive  is_empty``) with the
``and`` / ``or`` / ``not`` conditions, through :mod:`memkern.integrations.filters` (pushed into
the index search where the store supports it). Query modes: ``DEFAULT`` (vector similarity),
``HYBRID`` (the store's own hybrid search of the embedding and the query string; ``alpha`` ->
``lexical_weight = 1 - alpha``), ``SPARSE`` / ``TEXT_SEARCH`` (the store's BM25 search) and
``MMR`` (maximal marginal relevance, ``mmr_threshold``); see :meth:`MemkernVectorStore.query`.
Other modes raise :class:`memkern.MemkernValueError`.

``MemkernEmbedding`` is memkern's embedder (default: the offline MiniLM) as a LlamaIndex
``BaseEmbedding``, for ``Settings.embed_model`` or ``VectorStoreIndex(..., embed_model=...)``.
"""
from __future__ import annotations

import asyncio
import math
import threading
from collections import defaultdict
from typing import Any, List, Optional, Sequence

import numpy as np

try:
    from llama_index.core.base.embeddings.base import BaseEmbedding
    from llama_index.core.bridge.pydantic import PrivateAttr
    from llama_index.core.schema import BaseNode
    from llama_index.core.vector_stores.types import (
        BasePydanticVectorStore,
        FilterCondition,
        FilterOperator,
        MetadataFilter,
        MetadataFilters,
        VectorStoreQuery,
        VectorStoreQueryMode,
        VectorStoreQueryResult,
    )
    from llama_index.core.vector_stores.utils import metadata_dict_to_node, node_to_metadata_dict
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError("memkern.integrations.llamaindex needs LlamaIndex: pip install 'memkern[llamaindex]'") from e

from ..errors import MemkernTypeError, bad_arg
from ..base.validate import MAX_ID_CHARS, MAX_QUERY_CHARS, check_int
from . import filters as F
from ._common import apply_writes, as_embed_fn, check_text, check_texts, open_store, pop_time_kw, release_store
from .mmr import check_lambda, mmr
from .values import check_json_value

__all__ = ["MemkernVectorStore", "MemkernEmbedding", "to_filter", "ID_KEY"]

#: Reserved meta key holding the node id.
ID_KEY = "__li_id__"
_CHUNK = 256
#: The query modes ``MemkernVectorStore.query`` runs (see there).
_MODES = (VectorStoreQueryMode.DEFAULT, VectorStoreQueryMode.HYBRID, VectorStoreQueryMode.SPARSE,
          VectorStoreQueryMode.TEXT_SEARCH, VectorStoreQueryMode.MMR)
#: MMR candidates per result when ``mmr_prefetch_k`` is not given (LlamaIndex's vector stores' default).
_MMR_PREFETCH_FACTOR = 4.0

_OPS = {
    FilterOperator.EQ: "eq", FilterOperator.NE: "ne", FilterOperator.GT: "gt", FilterOperator.GTE: "gte",
    FilterOperator.LT: "lt", FilterOperator.LTE: "lte", FilterOperator.IN: "in", FilterOperator.NIN: "nin",
    FilterOperator.CONTAINS: "contains", FilterOperator.TEXT_MATCH: "contains",
    FilterOperator.TEXT_MATCH_INSENSITIVE: "icontains",
}


def _one(f: Any, name: str, depth: int) -> Any:
    if isinstance(f, MetadataFilters):
        return to_filter(f, name, depth + 1)
    if not isinstance(f, MetadataFilter):
        raise bad_arg(name, "a MetadataFilter or MetadataFilters", type(f).__name__, MemkernTypeError)
    op = FilterOperator(f.operator)
    if op in _OPS:
        return F.cond(f.key, _OPS[op], f.value, name)
    if op in (FilterOperator.ANY, FilterOperator.ALL):
        if isinstance(f.value, (str, bytes)) or not isinstance(f.value, list):
            raise bad_arg(f"{name}[{f.key!r}]", f"a list of values for {op.value!r}", type(f.value).__name__,
                          MemkernTypeError)
        kids = [F.cond(f.key, "contains", v, name) for v in f.value]
        if not kids:     # any of nothing matches nothing; all of nothing matches everything
            return F.node("not", [F.cond(f.key, "exists", False, name)]) if op is FilterOperator.ALL else \
                F.node("and", [F.cond(f.key, "exists", True, name), F.cond(f.key, "exists", False, name)])
        return F.node("or" if op is FilterOperator.ANY else "and", kids)
    if op is FilterOperator.IS_EMPTY:
        return F.node("or", [F.cond(f.key, "exists", False, name), F.cond(f.key, "eq", None, name),
                             F.cond(f.key, "eq", [], name)])
    raise bad_arg(f"{name}[{f.key!r}]", "a supported FilterOperator", op)  # pragma: no cover (all covered)


def to_filter(filters: Optional[MetadataFilters], name: str = "filters", _depth: int = 0) -> Any:
    """LlamaIndex ``MetadataFilters`` -> a parsed :mod:`memkern.integrations.filters` tree (nested at
    most :data:`memkern.base.validate.MAX_FILTER_DEPTH` levels)."""
    F.check_depth(_depth, name)
    if filters is None:
        return None
    if not isinstance(filters, MetadataFilters):
        raise bad_arg(name, "a MetadataFilters or None", type(filters).__name__, MemkernTypeError)
    kids = [_one(f, f"{name}.filters[{i}]", _depth) for i, f in enumerate(filters.filters)]
    cond = FilterCondition(filters.condition or FilterCondition.AND)
    if cond is FilterCondition.NOT:
        return F.node("not", [F.node("and", kids)]) if kids else None
    return F.node("or" if cond is FilterCondition.OR else "and", kids)


class MemkernVectorStore(BasePydanticVectorStore):
    """A LlamaIndex vector store on one namespace of a memkern store.

    Parameters
    ----------
    store_or_path : memkern store or str / os.PathLike
    dim : int, optional
        Needed only to create a new store from a path (the embedding model's width).
    namespace : str
        The memkern namespace holding the nodes.
    """

    stores_text: bool = True
    flat_metadata: bool = False
    namespace: str = "llamaindex"

    _store: Any = PrivateAttr(default=None)
    _owned: bool = PrivateAttr(default=False)
    _ids: Any = PrivateAttr(default=None)
    _lock: Any = PrivateAttr(default=None)

    def __init__(self, store_or_path: Any, dim: int | None = None, namespace: str = "llamaindex", **kw: Any) -> None:
        if not isinstance(namespace, str):
            raise bad_arg("namespace", "a non-empty str", type(namespace).__name__, MemkernTypeError)
        if not namespace:
            raise bad_arg("namespace", "a non-empty str", namespace)
        check_text(namespace, "namespace")
        super().__init__(namespace=namespace, **kw)
        self._store, self._owned = open_store(store_or_path, dim, dim_name="dim")
        self._lock = threading.RLock()
        self._ids = {}
        if namespace in self._store.namespaces():
            ids = np.asarray(self._store.ids(namespace))
            for s in range(0, len(ids), _CHUNK):
                for r in self._store.get_batch(ids[s:s + _CHUNK]):
                    if isinstance(r.meta.get(ID_KEY), str):
                        self._ids[r.meta[ID_KEY]] = int(r.id)

    @classmethod
    def class_name(cls) -> str:
        return "MemkernVectorStore"

    @property
    def client(self) -> Any:
        """The memkern store."""
        return self._store

    def close(self) -> None:
        if self._owned:
            self._owned = False
            release_store(self._store)

    # ------------------------------------------------------------------ writes
    def add(self, nodes: Sequence[BaseNode], **kwargs: Any) -> List[str]:
        """Store ``nodes`` (each with an ``embedding`` of the store's dim); returns their ids. Every
        node is checked before anything is written; new ids go in one atomic ``add_batch``."""
        if isinstance(nodes, BaseNode) or not isinstance(nodes, (list, tuple)):
            raise bad_arg("nodes", "a list of nodes", type(nodes).__name__, MemkernTypeError)
        d = self._store.dim
        rows, texts, metas, ids = [], [], [], []
        for i, node in enumerate(nodes):
            if not isinstance(node, BaseNode):
                raise bad_arg(f"nodes[{i}]", "a LlamaIndex node", type(node).__name__, MemkernTypeError)
            if node.embedding is None:
                raise bad_arg(f"nodes[{i}].embedding", f"a vector of {d} floats (embed the nodes first)", None)
            v = np.asarray(node.embedding, dtype=np.float32)
            if v.shape != (d,) or not np.isfinite(v).all():
                raise bad_arg(f"nodes[{i}].embedding", f"{d} finite floats", f"shape {list(v.shape)}")
            check_json_value(node.metadata, f"nodes[{i}].metadata")
            if ID_KEY in node.metadata:
                raise bad_arg(f"nodes[{i}].metadata", f"no reserved key {ID_KEY!r}", ID_KEY)
            meta = node_to_metadata_dict(node, remove_text=True, flat_metadata=self.flat_metadata)
            meta[ID_KEY] = node.node_id
            check_text(node.node_id, f"nodes[{i}].node_id", MAX_ID_CHARS)
            rows.append(v)
            texts.append(check_text(node.get_content(), f"nodes[{i}].text"))
            metas.append(meta)
            ids.append(node.node_id)
        if len(set(ids)) != len(ids):
            raise bad_arg("nodes", "distinct node ids", sorted({x for x in ids if ids.count(x) > 1}))
        if not ids:
            return []
        with self._lock:
            new = [i for i, x in enumerate(ids) if x not in self._ids]
            updates = [(self._ids[x], dict(summary=texts[i], embedding=rows[i], meta=metas[i]))
                       for i, x in enumerate(ids) if x in self._ids]
            adds = [(self.namespace, [texts[i] for i in new], np.stack([rows[i] for i in new]),
                     [metas[i] for i in new])] if new else []
            rids = apply_writes(self._store, updates, adds)
            if new:
                for i, rid in zip(new, rids[0].tolist()):
                    self._ids[ids[i]] = int(rid)
        return ids

    def _scan(self, tree: Any) -> list:
        """Every record of the namespace matching ``tree`` (oldest first)."""
        if self.namespace not in self._store.namespaces():
            return []
        ids = np.asarray(self._store.ids(self.namespace))
        out = []
        for s in range(0, len(ids), _CHUNK):
            out.extend(r for r in self._store.get_batch(ids[s:s + _CHUNK]) if F.matches(tree, r.meta))
        return out

    def delete(self, ref_doc_id: str, **delete_kwargs: Any) -> None:
        """Delete every node of document ``ref_doc_id``."""
        check_text(ref_doc_id, "ref_doc_id", MAX_ID_CHARS)
        self._delete_records(self._scan(F.cond("ref_doc_id", "eq", ref_doc_id, "ref_doc_id")))

    def delete_nodes(self, node_ids: Optional[List[str]] = None, filters: Optional[MetadataFilters] = None,
                     **delete_kwargs: Any) -> None:
        """Delete the nodes with these ids and / or matching ``filters`` (and-ed)."""
        tree = self._tree(node_ids, None, filters)
        if tree is None:
            raise bad_arg("node_ids", "node ids or filters (use clear() to delete everything)", None)
        self._delete_records(self._scan(tree))

    def clear(self) -> None:
        self._delete_records(self._scan(None))

    def _delete_records(self, recs: list) -> None:
        with self._lock:
            for r in recs:
                if int(r.id) in self._store:
                    self._store.delete(int(r.id))
                self._ids.pop(r.meta.get(ID_KEY), None)

    # ------------------------------------------------------------------ reads
    def _tree(self, node_ids: Any, doc_ids: Any, filters: Any) -> Any:
        kids = [to_filter(filters)]
        if node_ids is not None:
            kids.append(F.cond(ID_KEY, "in", check_texts(node_ids, "node_ids"), "node_ids"))
        if doc_ids is not None:
            kids.append(F.cond("ref_doc_id", "in", check_texts(doc_ids, "doc_ids"), "doc_ids"))
        return F.node("and", kids)

    def _node(self, r: Any) -> BaseNode:
        meta = {k: v for k, v in r.meta.items() if k != ID_KEY}
        return metadata_dict_to_node(meta, text=r.summary)

    def get_nodes(self, node_ids: Optional[List[str]] = None, filters: Optional[MetadataFilters] = None) -> List[BaseNode]:
        return [self._node(r) for r in self._scan(self._tree(node_ids, None, filters))]

    def query(self, query: VectorStoreQuery, **kwargs: Any) -> VectorStoreQueryResult:
        """The best nodes for ``query`` that pass ``query.filters`` / ``node_ids`` / ``doc_ids``,
        by ``query.mode``:

        * ``DEFAULT``: the ``similarity_top_k`` nodes most similar to ``query.query_embedding``
          (similarities = the store's scores);
        * ``HYBRID``: the store's hybrid search (:meth:`memkern.MemoryStore.search` with
          ``mode="hybrid"``) of the embedding and ``query.query_str``; ``hybrid_top_k`` (else
          ``similarity_top_k``) nodes. ``query.alpha`` (LlamaIndex: 0 = lexical only, 1 = vector
          only) sets ``lexical_weight = 1 - alpha``; ``None`` keeps the store's default (0.35).
          ``kwargs`` may hold ``fusion`` (``"coverage"``, the default, ``"rrf"`` or ``"weighted"``);
          similarities = the fused scores;
        * ``SPARSE`` / ``TEXT_SEARCH``: the store's lexical BM25 search of ``query.query_str``
          (no embedding needed); ``sparse_top_k`` (``SPARSE``, else ``similarity_top_k``) nodes
          that share a term with the query; similarities = BM25 scores;
        * ``MMR``: maximal marginal relevance (:mod:`memkern.integrations.mmr`) over the store's
          best ``mmr_prefetch_k`` (default ``ceil(mmr_prefetch_factor * similarity_top_k)``,
          factor 4) for the embedding; ``mmr_threshold`` (``query.mmr_threshold``, else
          ``kwargs["mmr_threshold"]``, else 0.5) weighs the similarity to the query against the
          similarity to the nodes already picked (1 = plain similarity order, 0 = most diverse);
          similarities = each node's MMR score when picked, as in LlamaIndex's own stores.

        ``kwargs`` may also hold ``time_range`` / ``time_field`` / ``recency`` /
        ``recency_weight`` / ``now`` (:func:`memkern.integrations._common.time_kw`), e.g. through
        ``index.as_retriever(vector_store_kwargs={"time_range": (start, None)})``. Other modes
        raise :class:`memkern.MemkernValueError`."""
        if not isinstance(query, VectorStoreQuery):
            raise bad_arg("query", "a VectorStoreQuery", type(query).__name__, MemkernTypeError)
        try:
            mode = VectorStoreQueryMode(query.mode)
        except ValueError:
            raise bad_arg("query.mode", f"one of {', '.join(m.name for m in _MODES)}", query.mode) from None
        if mode not in _MODES:
            raise bad_arg("query.mode", f"one of {', '.join(m.name for m in _MODES)}", mode.name)
        k = _top_k(query.similarity_top_k, "query.similarity_top_k")
        lexical = mode in (VectorStoreQueryMode.SPARSE, VectorStoreQueryMode.TEXT_SEARCH)
        q = None if lexical and query.query_embedding is None else self._embedding(query.query_embedding)
        # an empty id list means "no restriction" here: VectorStoreIndex passes node_ids=[] for stores
        # that keep the text themselves (get_nodes / delete_nodes keep [] as "none")
        tree = self._tree(query.node_ids or None, query.doc_ids or None, query.filters)
        tkw = pop_time_kw(self._store, kwargs)
        if mode is VectorStoreQueryMode.MMR:
            if query.mmr_threshold is not None:
                lam = check_lambda(query.mmr_threshold, "query.mmr_threshold")
            else:
                lam = kwargs.get("mmr_threshold")
                lam = 0.5 if lam is None else check_lambda(lam, "mmr_threshold")
            fetch = kwargs.get("mmr_prefetch_k")
            if fetch is None:
                factor = kwargs.get("mmr_prefetch_factor", _MMR_PREFETCH_FACTOR)
                if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor >= 1:
                    raise bad_arg("mmr_prefetch_factor", "a number >= 1", factor)
                fetch = math.ceil(factor * k)
            fetch = _top_k(fetch, "mmr_prefetch_k")
        elif mode is not VectorStoreQueryMode.DEFAULT:
            if not F.supports_mode(self._store):
                raise bad_arg("query.mode", f"DEFAULT or MMR ({type(self._store).__name__}.search has no "
                              "lexical or hybrid mode)", mode.name)
            text = check_text(query.query_str, "query.query_str", MAX_QUERY_CHARS)
            tkw.update(mode="lexical" if lexical else "hybrid", texts=[text])
            if mode is VectorStoreQueryMode.HYBRID:
                k = _top_k(query.hybrid_top_k, "query.hybrid_top_k") if query.hybrid_top_k is not None else k
                if query.alpha is not None:
                    tkw["lexical_weight"] = 1.0 - check_lambda(query.alpha, "query.alpha")
                if "fusion" in kwargs:
                    tkw["fusion"] = kwargs["fusion"]
            elif mode is VectorStoreQueryMode.SPARSE and query.sparse_top_k is not None:
                k = _top_k(query.sparse_top_k, "query.sparse_top_k")
            if lexical:
                q = None
        if self.namespace not in self._store.namespaces():
            return VectorStoreQueryResult(nodes=[], similarities=[], ids=[])
        if mode is VectorStoreQueryMode.MMR:
            ids, _, recs = F.search(self._store, self.namespace, q, fetch, tree, **tkw)
            picks, scores = mmr(q, np.asarray(self._store.embeddings(ids)), k, lam) if len(ids) else ([], [])
            recs = [recs[i] for i in np.asarray(picks, dtype=np.int64).tolist()]
        else:
            _, scores, recs = F.search(self._store, self.namespace, q, k, tree, **tkw)
        return VectorStoreQueryResult(nodes=[self._node(r) for r in recs], similarities=[float(s) for s in scores],
                                      ids=[r.meta[ID_KEY] for r in recs])

    def _embedding(self, e: Any) -> np.ndarray:
        d = self._store.dim
        if e is None:
            raise bad_arg("query.query_embedding", f"a vector of {d} floats", None)
        try:
            q = np.asarray(e, dtype=np.float32)
        except (TypeError, ValueError):
            raise bad_arg("query.query_embedding", f"{d} finite floats", type(e).__name__, MemkernTypeError) from None
        if q.shape != (d,) or not np.isfinite(q).all():
            raise bad_arg("query.query_embedding", f"{d} finite floats", f"shape {list(q.shape)}")
        return q


def _top_k(k: Any, name: str) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise bad_arg(name, "an int >= 1", k)
    return k


class MemkernEmbedding(BaseEmbedding):
    """memkern's embedder as a LlamaIndex ``BaseEmbedding``, e.g. ``Settings.embed_model =
    MemkernEmbedding()``.

    Queries are embedded with ``kind="query"``, nodes with ``kind="passage"`` (the embedder's
    query / passage prefixes apply); the async methods run the embedder in a worker thread.

    Parameters
    ----------
    embedder : a memkern :class:`memkern.Embedder` (``encode(texts, kind)``), any embedder
        :func:`memkern.integrations._common.as_embed_fn` takes, or ``None``: the offline default
        (MiniLM, 384-d, loaded on construction)
    embed_batch_size : texts per ``encode`` call when LlamaIndex embeds nodes (default 32)
    """

    _fn: Any = PrivateAttr(default=None)

    def __init__(self, embedder: Any = None, embed_batch_size: int = 32, **kwargs: Any) -> None:
        fn = as_embed_fn(embedder)
        check_int("embed_batch_size", embed_batch_size, 1, 2048, type_error=True)
        name = kwargs.pop("model_name", None) or str(getattr(fn.embedder, "model_name", None)
                                                    or type(fn.embedder).__name__)
        super().__init__(model_name=name, embed_batch_size=embed_batch_size, **kwargs)
        self._fn = fn

    @classmethod
    def class_name(cls) -> str:
        return "MemkernEmbedding"

    @property
    def dim(self) -> int:
        """Embedding width ``d`` (the store's ``dim`` must match)."""
        return self._fn.dim

    def _get_query_embedding(self, query: str) -> List[float]:
        return self._fn([check_text(query, "query", MAX_QUERY_CHARS)], kind="query")[0].tolist()

    def _get_text_embedding(self, text: str) -> List[float]:
        return self._fn([check_text(text, "text")], kind="passage")[0].tolist()

    def _get_text_embeddings(self, texts: List[str]) -> List[List[float]]:
        return self._fn(check_texts(texts, "texts"), kind="passage").tolist()

    async def _aget_query_embedding(self, query: str) -> List[float]:
        return await asyncio.to_thread(self._get_query_embedding, query)

    async def _aget_text_embedding(self, text: str) -> List[float]:
        return await asyncio.to_thread(self._get_text_embedding, text)

    async def _aget_text_embeddings(self, texts: List[str]) -> List[List[float]]:
        return await asyncio.to_thread(self._get_text_embeddings, texts)
