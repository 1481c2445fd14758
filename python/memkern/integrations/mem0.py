"""mem0 on memkern: ``MemkernVectorStore``, a mem0 ``VectorStoreBase`` provider named ``"memkern"``.

mem0 users keep their code and get memkern's store::

    from memkern.integrations import mem0 as mk
    mk.register()                        # adds the "memkern" vector store provider to mem0
    config = {"vector_store": {"provider": "memkern",
                               "config": {"path": "/data/mem", "collection_name": "mem0",
                                          "embedding_model_dims": 384}}, ...}
    m = mem0.Memory.from_config(config)

or, fully local (memkern's offline MiniLM embedder and, only if ``infer=True`` is used, memkern's
offline chat model; no API key, no network): ``m = mk.local_memory("/data/mem")``.

Registration is what mem0's factories allow: the provider name goes into
``VectorStoreFactory.provider_to_class``, its config class into ``VectorStoreConfig``'s provider
table, and this module is importable as ``mem0.configs.vector_stores.memkern`` (where mem0 looks
for a provider's config class). mem0's own embedder and LLM config tables are closed lists, so
:func:`local_memory` builds the ``Memory`` with placeholder OpenAI settings (never contacted) and
then swaps in :class:`MemkernEmbedding` and :class:`MemkernLLM`.

Storage: a collection is the memkern namespace ``"mem0.<collection_name>"``; a mem0 vector is one
topic record (``summary`` = ``payload["data"]``, the memory text; ``meta`` = the payload plus the
reserved key ``"__mem0_id__"``). Several provider instances on one path (mem0 makes one per
collection, plus the entity store) share one open store. Filters use mem0's grammar
(``{"user_id": "alice"}``, ``{"k": "*"}``, ``{"k": [..]}``, ``{"k": {"eq" | "ne" | "gt" | "gte" |
"lt" | "lte" | "in" | "nin" | "contains" | "icontains": v}}``, ``AND`` / ``OR`` / ``NOT`` lists, or
``$and`` / ``$or`` / ``$not``), translated by :func:`to_filter`.

Importing this module turns mem0's telemetry off (``MEM0_TELEMETRY=False``, also in mem0 modules
imported earlier) unless the environment already says otherwise: memkern never sends telemetry,
and mem0's is on by default.
"""
from __future__ import annotations

import os
import sys
import threading
import uuid
from typing import Any, Dict, List, Optional

import numpy as np

_TELEMETRY_CHOSEN = "MEM0_TELEMETRY" in os.environ     # the user's explicit choice is kept
os.environ.setdefault("MEM0_TELEMETRY", "False")

try:
    from mem0.vector_stores.base import VectorStoreBase
    from pydantic import BaseModel, ConfigDict, Field
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError("memkern.integrations.mem0 needs mem0: pip install 'memkern[mem0]'") from e

from ..errors import MemkernKeyError, MemkernTypeError, bad_arg
from ..base.validate import MAX_ID_CHARS, MAX_QUERY_CHARS, check_int, check_namespace_str
from . import filters as F


def _telemetry_off() -> None:
    """mem0 reads MEM0_TELEMETRY when it is first imported; if that happened before this module
    (and the user chose nothing), turn its module flags off too."""
    if _TELEMETRY_CHOSEN:
        return
    for name in ("mem0.memory.telemetry", "mem0.memory.main"):
        mod = sys.modules.get(name)
        if mod is not None and getattr(mod, "MEM0_TELEMETRY", False):
            mod.MEM0_TELEMETRY = False


_telemetry_off()
from ._common import apply_writes, as_embed_fn, check_text, open_store, release_store, time_kw
from .values import check_json_value

__all__ = ["MemkernVectorStore", "MemkernConfig", "MemkernEmbedding", "MemkernLLM", "OutputData", "register",
           "local_memory", "to_filter", "PROVIDER", "ID_KEY"]

PROVIDER = "memkern"
#: Reserved meta key holding mem0's vector id.
ID_KEY = "__mem0_id__"
_NS_PREFIX = "mem0."
_CHUNK = 256


class OutputData(BaseModel):
    """One result, shaped like mem0's providers' results."""

    id: Optional[str]
    score: Optional[float]
    payload: Optional[Dict]


class MemkernConfig(BaseModel):
    """Settings of the ``"memkern"`` provider (what goes in ``vector_store.config``)."""

    collection_name: str = Field("mem0", description="Collection (memkern namespace 'mem0.<name>')")
    path: Optional[str] = Field(None, description="memkern store directory (default: memkern's default store)")
    embedding_model_dims: int = Field(384, description="Width of the embedding vectors")
    store: Any = Field(None, description="An open memkern store to use instead of a path")

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")


# ------------------------------------------------------------------------------- filters
_M0 = {"eq": "eq", "ne": "ne", "gt": "gt", "gte": "gte", "lt": "lt", "lte": "lte", "in": "in", "nin": "nin",
       "contains": "contains", "icontains": "icontains"}
_LOGIC = {"AND": "and", "OR": "or", "NOT": "not", "$and": "and", "$or": "or", "$not": "not"}


def to_filter(filters: Any, name: str = "filters", _depth: int = 0) -> Any:
    """mem0's filter dict -> a parsed :mod:`memkern.integrations.filters` tree (nested at most
    :data:`memkern.base.validate.MAX_FILTER_DEPTH` levels)."""
    F.check_depth(_depth, name)
    if filters is None:
        return None
    if not isinstance(filters, dict):
        raise bad_arg(name, "a dict or None", type(filters).__name__, MemkernTypeError)
    parts = []
    seen_logic = set()
    for key, v in filters.items():
        if not isinstance(key, str):
            raise bad_arg(name, "str keys", f"key {key!r}", MemkernTypeError)
        if key in _LOGIC:
            kind = _LOGIC[key]
            if kind in seen_logic:          # mem0 may pass both "OR" and "$or" for the same list
                continue
            seen_logic.add(kind)
            if isinstance(v, dict):
                v = [v]
            if isinstance(v, str) or not isinstance(v, (list, tuple)):
                raise bad_arg(f"{name}[{key!r}]", "a list of filter dicts", type(v).__name__, MemkernTypeError)
            kids = [to_filter(sub, f"{name}[{key!r}][{i}]", _depth + 1) for i, sub in enumerate(v)]
            if kind == "not":
                parts.append(F.node("not", [F.node("or", kids)]) if any(k is not None for k in kids) else None)
            else:
                parts.append(F.node(kind, kids))
        elif isinstance(v, dict):
            ops = []
            for o, operand in v.items():
                if o not in _M0:
                    raise bad_arg(f"{name}[{key!r}]", f"an operator in {sorted(_M0)}", o)
                ops.append(F.cond(key, _M0[o], operand, name))
            parts.append(F.node("and", ops))
        elif v == "*":
            parts.append(F.cond(key, "exists", True, name))
        elif isinstance(v, list):
            parts.append(F.cond(key, "in", v, name))
        else:
            parts.append(F.cond(key, "eq", v, name))
    return F.node("and", parts)


# ------------------------------------------------------------------------------- the provider
def _check_collection(name: Any) -> str:
    return check_namespace_str(name, "collection_name")


def _check_top_k(k: Any, name: str = "top_k") -> int:
    return check_int(name, k, 1, type_error=True)


class MemkernVectorStore(VectorStoreBase):
    """mem0 ``VectorStoreBase`` on a memkern store (see the module docstring)."""

    _registry_lock = threading.Lock()

    def __init__(self, collection_name: str = "mem0", path: str | None = None, embedding_model_dims: int = 384,
                 store: Any = None) -> None:
        self.collection_name = _check_collection(collection_name)
        self.embedding_model_dims = _check_top_k(embedding_model_dims, "embedding_model_dims")
        if store is None:
            if path is None:
                from ..base.paths import default_store_path

                path = default_store_path()
            store = path
        self.store, self._owned = open_store(store, self.embedding_model_dims, "path", "embedding_model_dims")
        self._lock = threading.RLock()
        self._ids: dict[str, int] = {}
        self._load()

    @property
    def namespace(self) -> str:
        return _NS_PREFIX + self.collection_name

    def _load(self) -> None:
        self._ids = {}
        if self.namespace not in self.store.namespaces():
            return
        ids = np.asarray(self.store.ids(self.namespace))
        for s in range(0, len(ids), _CHUNK):
            for r in self.store.get_batch(ids[s:s + _CHUNK]):
                if isinstance(r.meta.get(ID_KEY), str):
                    self._ids[r.meta[ID_KEY]] = int(r.id)

    def close(self) -> None:
        if self._owned:
            self._owned = False
            release_store(self.store)

    # ------------------------------------------------------------------ collections
    def create_col(self, name: str, vector_size: int | None = None, distance: Any = None) -> None:
        """Use collection ``name`` (memkern namespaces need no creation); ``vector_size`` must be the store's dim."""
        name = _check_collection(name)
        if vector_size is not None and _check_top_k(vector_size, "vector_size") != self.store.dim:
            raise bad_arg("vector_size", f"the store's dim {self.store.dim}", vector_size)
        with self._lock:
            self.collection_name = name
            self._load()

    def list_cols(self) -> List[str]:
        return sorted(ns[len(_NS_PREFIX):] for ns in self.store.namespaces()
                      if ns.startswith(_NS_PREFIX) and self.store.count(ns) > 0)

    def delete_col(self) -> None:
        with self._lock:
            for rid in list(self._ids.values()):
                if rid in self.store:
                    self.store.delete(rid)
            self._ids.clear()

    def col_info(self) -> Dict:
        ns = self.namespace
        n = self.store.count(ns) if ns in self.store.namespaces() else 0
        return {"name": self.collection_name, "count": int(n), "dimension": self.store.dim,
                "metric": self.store.metric, "path": str(getattr(self.store, "path", ""))}

    def reset(self) -> None:
        self.delete_col()
        self.create_col(self.collection_name, self.store.dim)

    # ------------------------------------------------------------------ writes
    def _vec(self, v: Any, name: str) -> np.ndarray:
        try:
            arr = np.asarray(v, dtype=np.float32)
        except (TypeError, ValueError):
            raise bad_arg(name, f"a vector of {self.store.dim} floats", type(v).__name__, MemkernTypeError) from None
        if arr.shape != (self.store.dim,):
            raise bad_arg(name, f"shape [{self.store.dim}]", f"shape {list(arr.shape)}")
        if not np.isfinite(arr).all():
            raise bad_arg(name, "finite values", "NaN or inf")
        return arr

    def _payload(self, p: Any, name: str) -> dict:
        if p is None:
            p = {}
        if not isinstance(p, dict):
            raise bad_arg(name, "a dict", type(p).__name__, MemkernTypeError)
        check_json_value(p, name)
        if ID_KEY in p:
            raise bad_arg(name, f"no reserved key {ID_KEY!r}", ID_KEY)
        data = p.get("data", "")
        if not isinstance(data, str):
            raise bad_arg(f"{name}['data']", "a str (the memory text)", type(data).__name__, MemkernTypeError)
        return p

    def insert(self, vectors: Any, payloads: Any = None, ids: Any = None) -> List[str]:
        """Insert vectors (``[n, d]``) with payloads and ids (new UUID4 strings when ``None``), in
        one atomic ``add_batch``; an existing id gets a new version. Everything is checked first."""
        if isinstance(vectors, np.ndarray):
            vectors = list(vectors)
        if not isinstance(vectors, (list, tuple)):
            raise bad_arg("vectors", "a list of vectors", type(vectors).__name__, MemkernTypeError)
        n = len(vectors)
        if payloads is not None and (not isinstance(payloads, (list, tuple)) or len(payloads) != n):
            raise bad_arg("payloads", f"None or a list of {n} dicts",
                          f"length {len(payloads)}" if isinstance(payloads, (list, tuple)) else type(payloads).__name__)
        if ids is not None and (not isinstance(ids, (list, tuple)) or len(ids) != n):
            raise bad_arg("ids", f"None or a list of {n} str",
                          f"length {len(ids)}" if isinstance(ids, (list, tuple)) else type(ids).__name__)
        rows = [self._vec(v, f"vectors[{i}]") for i, v in enumerate(vectors)]
        pays = [self._payload(None if payloads is None else payloads[i], f"payloads[{i}]") for i in range(n)]
        out = [str(uuid.uuid4()) if ids is None or ids[i] is None else check_text(ids[i], f"ids[{i}]", MAX_ID_CHARS)
               for i in range(n)]
        if len(set(out)) != n:
            raise bad_arg("ids", "distinct ids", sorted({x for x in out if out.count(x) > 1}))
        if n == 0:
            return []
        with self._lock:
            new = [i for i in range(n) if out[i] not in self._ids]
            updates = [(self._ids[out[i]], dict(summary=pays[i].get("data", ""), embedding=rows[i],
                                                meta={**pays[i], ID_KEY: out[i]}))
                       for i in range(n) if out[i] in self._ids]
            adds = [(self.namespace, [pays[i].get("data", "") for i in new], np.stack([rows[i] for i in new]),
                     [{**pays[i], ID_KEY: out[i]} for i in new])] if new else []
            rids = apply_writes(self.store, updates, adds)
            if new:
                for i, rid in zip(new, rids[0].tolist()):
                    self._ids[out[i]] = int(rid)
        return out

    def _rid(self, vector_id: Any) -> int:
        vid = check_text(vector_id if not isinstance(vector_id, uuid.UUID) else str(vector_id), "vector_id", MAX_ID_CHARS)
        rid = self._ids.get(vid)
        if rid is None:
            raise MemkernKeyError(f"vector_id: unknown id {vid!r} in collection {self.collection_name!r}")
        return rid

    def delete(self, vector_id: Any) -> None:
        with self._lock:
            rid = self._rid(vector_id)
            self.store.delete(rid)
            self._ids.pop(str(vector_id), None)

    def update(self, vector_id: Any, vector: Any = None, payload: Any = None) -> None:
        """New version of ``vector_id`` with the given vector and / or payload (``None`` keeps it)."""
        with self._lock:
            rid = self._rid(vector_id)
            vec = self._vec(vector, "vector") if vector is not None else None
            if payload is not None:
                p = self._payload(payload, "payload")
                self.store.update(rid, summary=p.get("data", ""), embedding=vec, meta={**p, ID_KEY: str(vector_id)})
            elif vec is not None:
                self.store.update(rid, embedding=vec)

    # ------------------------------------------------------------------ reads
    def _out(self, r: Any, score: float | None = None) -> OutputData:
        payload = {k: v for k, v in r.meta.items() if k != ID_KEY}
        return OutputData(id=r.meta[ID_KEY], score=score, payload=payload)

    def get(self, vector_id: Any) -> OutputData | None:
        vid = str(vector_id) if isinstance(vector_id, uuid.UUID) else vector_id
        check_text(vid, "vector_id", MAX_ID_CHARS)
        rid = self._ids.get(vid)
        if rid is None:
            return None
        try:
            return self._out(self.store.get(rid))
        except KeyError:
            return None

    def search(self, query: Any, vectors: Any, top_k: int = 5, filters: Any = None, *, time_range: Any = None,
               time_field: str = "event", recency: Any = None, recency_weight: Any = None,
               now: Any = None) -> List[OutputData]:
        """The ``top_k`` most similar vectors matching ``filters``; score = the store's similarity
        (cosine for normalised embeddings, higher is better; plus the recency prior when asked).

        ``filters`` is mem0's filter dict; mem0's own time fields are payload keys, so
        ``{"created_at": {"gte": "2024-07-20"}}`` compares mem0's ISO strings. The keyword-only
        ``time_range`` / ``time_field`` / ``recency`` / ``recency_weight`` / ``now``
        (:func:`memkern.integrations._common.time_kw`) act on the store's record times inside
        the index search."""
        top_k = _check_top_k(top_k)
        tree = to_filter(filters)
        tkw = time_kw(self.store, time_range, time_field, recency, recency_weight, now)
        q = self._vec(vectors[0] if isinstance(vectors, (list, tuple)) and vectors and isinstance(vectors[0], (list, tuple, np.ndarray)) else vectors, "vectors")
        if self.namespace not in self.store.namespaces():
            return []
        _, scores, recs = F.search(self.store, self.namespace, q, top_k, tree, **tkw)
        return [self._out(r, float(s)) for r, s in zip(recs, scores.tolist())]

    def keyword_search(self, query: str, top_k: int = 5, filters: Any = None) -> List[OutputData] | None:
        """BM25 keyword search through the store's lexical index (``search(mode="lexical")``), so
        that mem0 scores hybrid; ``None`` (mem0 then ranks by similarity only) on a store without
        lexical search."""
        if not F.supports_mode(self.store):
            return None
        top_k = _check_top_k(top_k)
        tree = to_filter(filters)
        check_text(query, "query", MAX_QUERY_CHARS)
        if self.namespace not in self.store.namespaces():
            return []
        _, scores, recs = F.search(self.store, self.namespace, None, top_k, tree, mode="lexical", texts=[query])
        return [self._out(r, float(s)) for r, s in zip(recs, scores.tolist())]

    def list(self, filters: Any = None, top_k: int | None = 100) -> List[List[OutputData]]:
        """Vectors matching ``filters``, oldest first, at most ``top_k`` (``None``: all); wrapped in
        one outer list like mem0's other providers."""
        tree = to_filter(filters)
        limit = None if top_k is None else _check_top_k(top_k)
        out: list[OutputData] = []
        if self.namespace in self.store.namespaces():
            ids = np.asarray(self.store.ids(self.namespace))
            for s in range(0, len(ids), _CHUNK):
                for r in self.store.get_batch(ids[s:s + _CHUNK]):
                    if ID_KEY in r.meta and F.matches(tree, r.meta):
                        out.append(self._out(r))
                        if limit is not None and len(out) >= limit:
                            return [out]
        return [out]


# ------------------------------------------------------------------------------- embedder and LLM
class MemkernEmbedding:
    """A mem0 embedding model (``embed`` / ``embed_batch``) on memkern's embedder (``None``: MiniLM)."""

    def __init__(self, embedder: Any = None):
        self._fn = as_embed_fn(embedder)
        from mem0.configs.embeddings.base import BaseEmbedderConfig

        self.config = BaseEmbedderConfig(embedding_dims=self._fn.dim)

    def embed(self, text: str, memory_action: str | None = None) -> list[float]:
        kind = "query" if memory_action == "search" else "passage"
        return self._fn([check_text(text, "text")], kind=kind)[0].tolist()

    def embed_batch(self, texts: list[str], memory_action: str = "add") -> list[list[float]]:
        kind = "query" if memory_action == "search" else "passage"
        return self._fn([check_text(t, f"texts[{i}]") for i, t in enumerate(texts)], kind=kind).tolist()


class MemkernLLM:
    """A mem0 LLM (``generate_response``) on a memkern chat model, loaded on first use
    (``None``: memkern's offline SmolLM2-135M; small: expect weak fact extraction)."""

    def __init__(self, chat_model: Any = None, max_new_tokens: int = 512):
        self._chat = chat_model
        self.max_new_tokens = _check_top_k(max_new_tokens, "max_new_tokens")
        self.config = None

    def generate_response(self, messages: List[Dict[str, str]], response_format: Any = None, tools: Any = None,
                          tool_choice: str = "auto", **kwargs: Any) -> str:
        if self._chat is None:
            from ..models import ChatModel

            self._chat = ChatModel()
        json_mode = isinstance(response_format, dict) and response_format.get("type") == "json_object"
        return self._chat.generate([messages], max_new_tokens=self.max_new_tokens, json=json_mode)[0]


# ------------------------------------------------------------------------------- registration
_REGISTER_LOCK = threading.Lock()


def register() -> None:
    """Make ``"memkern"`` a mem0 vector store provider (idempotent)."""
    from mem0.utils.factory import VectorStoreFactory
    from mem0.vector_stores.configs import VectorStoreConfig

    with _REGISTER_LOCK:
        VectorStoreFactory.provider_to_class[PROVIDER] = f"{__name__}.MemkernVectorStore"
        table = VectorStoreConfig.__private_attributes__["_provider_configs"].default
        table[PROVIDER] = "MemkernConfig"
        sys.modules.setdefault(f"mem0.configs.vector_stores.{PROVIDER}", sys.modules[__name__])


def local_memory(path: str | os.PathLike, *, collection_name: str = "mem0", embedder: Any = None,
                 chat_model: Any = None, history_db_path: str | os.PathLike | None = None) -> Any:
    """A mem0 ``Memory`` that runs fully offline on memkern: memkern's store at ``path``, memkern's
    embedder (``None``: MiniLM) and, for ``add(..., infer=True)``, memkern's chat model. mem0's
    history database goes to ``history_db_path`` (default ``<path>/mem0_history.db``)."""
    from mem0 import Memory

    register()
    emb = MemkernEmbedding(embedder)
    p = os.fspath(path)
    os.makedirs(p, exist_ok=True)
    offline = {"api_key": "memkern-offline-placeholder"}    # never sent: both are replaced below
    m = Memory.from_config({
        "vector_store": {"provider": PROVIDER, "config": {"path": p, "collection_name": collection_name,
                                                          "embedding_model_dims": emb.config.embedding_dims}},
        "embedder": {"provider": "openai", "config": dict(offline, embedding_dims=emb.config.embedding_dims)},
        "llm": {"provider": "openai", "config": dict(offline)},
        "history_db_path": os.fspath(history_db_path) if history_db_path is not None else os.path.join(p, "mem0_history.db"),
    })
    m.embedding_model = emb
    m.llm = MemkernLLM(chat_model)
    return m
