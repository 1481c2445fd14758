"""Written interfaces: what memkern needs from each pluggable component.

Every protocol here is a :class:`typing.Protocol` marked ``@runtime_checkable``, so
``isinstance(obj, Store)`` tells whether ``obj`` has the needed methods (names only: Python does
not check signatures at run time; the docstrings are the contract). Implement them to plug your
own component into :class:`memkern.RMM` or :class:`memkern.MemReread`:

- :class:`Store`: :class:`memkern.MemoryStore`; used by ``RMM(store=...)`` and the CLI.
- :class:`TurnStore` (a Store with two-level memory): :class:`memkern.MemoryStore`; needed by
  ``RMM(retrieval="turn+topic")``.
- :class:`Embedder`: :class:`memkern.models.Embedder`; ``RMM(embedder=...)``.
- :class:`ChatModel`: :class:`memkern.models.ChatModel`, :class:`memkern.models.OpenAIChatModel`;
  ``RMM(chat_model=...)``, ``MemReread(chat_model=...)``.
- :class:`Extractor`: :class:`memkern.ingest.extract.LLMExtractor`,
  :class:`memkern.ingest.extract.EmbeddingExtractor`; ``RMM(extractor=...)``.
- :class:`Decider`: :class:`memkern.ingest.apply.LLMDecider`, :class:`memkern.ingest.apply.EmbeddingDecider`;
  ``RMM(decider=...)``.

Shapes are written ``[n, d]``; ``d`` is the store's / embedder's ``dim``. Ids are int64.

Optional store features
-----------------------
Two features go beyond :class:`Store`; memkern detects them from the methods' signatures, by
keyword name (:func:`accepts_keyword`: a parameter of that name, or ``**kwargs`` that forward to
a store which has it, as :class:`memkern.distributed.ShardedStore` does):

- **event time** (:func:`supports_event_time`): ``add`` / ``merge`` / ``update`` take
  ``event_time=`` (unix seconds). :meth:`memkern.RMM.end_session` then writes the session's date
  there; on a store without it the date is kept only in the turns and ``meta["date"]``.
- **filtered search** (:func:`search_keywords`): ``search`` takes ``filter=``, ``time_range=``,
  ``time_field=``, ``recency=``, ``recency_weight=``, ``now=`` (see
  :meth:`memkern.MemoryStore.search`). :meth:`memkern.RMM.retrieve` passes them through and
  raises :class:`memkern.MemkernTypeError` naming the argument when the store's ``search``
  lacks one.
- **hybrid two-level search** (:func:`supports_hybrid_turns`): ``add`` / ``merge`` / ``update``
  take ``turn_texts=`` (each turn record's text) and ``search`` takes ``mode=``, ``texts=`` and
  the context weights ``neighbour_weight=`` / ``group_weight=`` / ``group_key=`` for
  ``level="turn+topic"``. RMM's two-level memory then stores templated turn texts and reads
  through the hybrid turn stage; without it, the dense ``sim(q, turn) + alpha * sim(q, topic)``.

:class:`memkern.MemoryStore`, :class:`memkern.InMemoryStore` and
:class:`memkern.distributed.ShardedStore` have all three.
"""
from __future__ import annotations

import inspect
import types
import weakref
from dataclasses import dataclass, field
from typing import Any, Iterable, Protocol, Sequence, Union, runtime_checkable

import numpy as np

#: The five actions a :class:`Decider` may choose for a new memory.
ACTIONS = ("ADD", "MERGE", "UPDATE", "INVALIDATE", "NOOP")


@dataclass
class Topic:
    """One topic memory extracted from a session.

    Attributes
    ----------
    summary : str
        Short statement about the user.
    turns : list[int]
        Indices into the session's turns (sorted, unique, in range).
    source : str
        ``"llm"``, ``"embedding"`` or ``"fallback"`` (extraction failed; the session's user
        statements were kept verbatim).
    """

    summary: str
    turns: list[int] = field(default_factory=list)
    source: str = "llm"


@dataclass
class Candidate:
    """An existing memory similar to the new one: store ``id``, ``summary``, cosine ``similarity``."""

    id: int
    summary: str
    similarity: float


@dataclass
class Decision:
    """What to do with one new memory.

    ``target`` indexes the candidate list (``None`` for ADD); ``summary`` is the summary to keep
    for MERGE / UPDATE (``None``: the decider's default); ``fallback`` is True when an invalid
    model answer was replaced by ADD.
    """

    action: str
    target: int | None = None
    summary: str | None = None
    fallback: bool = False
    reason: str = ""


Message = dict
Prompt = Union[str, Sequence[Message]]

__all__ = ["ACTIONS", "Topic", "Candidate", "Decision", "Store", "TurnStore", "Embedder", "ChatModel", "Extractor", "Decider", "Prompt", "accepts_keyword",
           "supports_event_time", "supports_hybrid_turns", "search_keywords", "missing_search_keywords", "SEARCH_FILTER_KEYWORDS"]

#: The keyword arguments of a filtered / time-aware ``search`` (:meth:`memkern.MemoryStore.search`).
SEARCH_FILTER_KEYWORDS = ("filter", "time_range", "time_field", "recency", "recency_weight", "now")


def accepts_keyword(fn: Any, name: str) -> bool:
    """Whether callable ``fn`` takes keyword argument ``name``: a parameter of that name (not
    positional-only), or a ``**kwargs``. ``False`` for a callable without an inspectable
    signature (some builtins). Answers for Python functions and their bound methods are kept per
    function (``inspect.signature`` costs ~20 us, and hot paths ask on every call)."""
    bound = isinstance(fn, types.MethodType)
    func = fn.__func__ if bound else fn
    if not isinstance(func, types.FunctionType):
        return _accepts_keyword(fn, name)
    known = _ACCEPTS.get(func)
    if known is None:
        known = _ACCEPTS[func] = {}
    hit = known.get((bound, name))
    if hit is None:
        hit = known[(bound, name)] = _accepts_keyword(fn, name)
    return hit


_ACCEPTS: "weakref.WeakKeyDictionary[types.FunctionType, dict[tuple[bool, str], bool]]" = weakref.WeakKeyDictionary()


def _accepts_keyword(fn: Any, name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    for p in params:
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            return True
        if p.name == name and p.kind is not inspect.Parameter.POSITIONAL_ONLY:
            return True
    return False


def supports_event_time(store: Any) -> bool:
    """Whether ``store``'s ``add``, ``merge`` and ``update`` all take ``event_time=`` (see the
    module doc, "Optional store features")."""
    return all(accepts_keyword(getattr(store, m, None), "event_time") for m in ("add", "merge", "update"))


#: What a store's ``search`` takes for the hybrid two-level search (besides ``level`` / ``alpha``).
HYBRID_TURN_KEYWORDS = ("mode", "texts", "lexical_weight", "fusion", "candidates", "neighbour_weight",
                        "group_weight", "group_key")


def supports_hybrid_turns(store: Any) -> bool:
    """Whether ``store`` has the hybrid two-level search (see the module doc, "Optional store
    features"): ``turn_texts=`` on its writes and :data:`HYBRID_TURN_KEYWORDS` on ``search``."""
    writes = all(accepts_keyword(getattr(store, m, None), "turn_texts") for m in ("add", "merge", "update"))
    return writes and all(accepts_keyword(getattr(store, "search", None), k) for k in HYBRID_TURN_KEYWORDS)


def search_keywords(store: Any) -> frozenset:
    """Which of :data:`SEARCH_FILTER_KEYWORDS` ``store.search`` takes."""
    fn = getattr(store, "search", None)
    return frozenset(k for k in SEARCH_FILTER_KEYWORDS if accepts_keyword(fn, k))


def missing_search_keywords(store: Any, keywords: Iterable[str]) -> list[str]:
    """The ``keywords`` ``store.search`` does not take, in :data:`SEARCH_FILTER_KEYWORDS` order."""
    have = search_keywords(store)
    want = set(keywords)
    return [k for k in SEARCH_FILTER_KEYWORDS if k in want and k not in have]


@runtime_checkable
class Store(Protocol):
    """A versioned vector memory, partitioned by namespace (what RMM and the CLI rely on).

    Records are read back as objects with at least ``id`` (int), ``namespace`` (str),
    ``summary`` (str), ``turns`` (list of dict), ``meta`` (dict), ``version`` (int, 1 for a new
    record, +1 per write) and ``status`` (``"active"`` or ``"invalidated"``). Unknown ids raise
    ``KeyError`` (:class:`memkern.MemkernKeyError` in memkern's stores).

    Attributes
    ----------
    dim : int
        Embedding width ``d``; every vector given or returned has this many float32 entries.
    path : str or os.PathLike or None
        Folder of the store on disk (RMM keeps the namespace's reranker under
        ``<path>/rerankers/``); ``None`` for a store that is not persisted.
    """

    @property
    def dim(self) -> int: ...

    @property
    def path(self) -> Any: ...

    def add(self, namespace: str, summary: str, embedding: Any, turns: list[dict] | None = None,
            meta: dict | None = None) -> int:
        """Add one record; ``embedding`` is float32 ``[d]``. Returns the new id (int)."""
        ...

    def add_batch(self, namespace: str, summaries: Sequence[str], embeddings: Any,
                  turns: Sequence[list[dict] | None] | None = None,
                  metas: Sequence[dict | None] | None = None) -> np.ndarray:
        """Add ``n`` records at once; ``embeddings`` float32 ``[n, d]``. Returns int64 ids ``[n]``."""
        ...

    def merge(self, id: int, summary: str, embedding: Any, turns: list[dict] | None = None) -> int:
        """New version of ``id`` with ``summary``, ``embedding`` (float32 ``[d]``) and the union
        of its old and the new ``turns`` (old first, duplicates dropped). Returns ``id``'s
        new version or ``id`` (callers use neither)."""
        ...

    def update(self, id: int, summary: str | None = None, embedding: Any = None,
               turns: list[dict] | None = None, meta: dict | None = None) -> int:
        """New version of ``id`` replacing the given fields (``None`` keeps a field)."""
        ...

    def invalidate(self, id: int, reason: str = "") -> None:
        """Mark ``id`` invalidated: kept and readable, left out of :meth:`search` by default."""
        ...

    def delete(self, id: int) -> None:
        """Remove ``id`` from reads and search."""
        ...

    def get(self, id: int) -> Any:
        """The current version of record ``id``."""
        ...

    def get_batch(self, ids: Iterable[int]) -> list[Any]:
        """Records of ``ids`` (int64 ``[n]``), in order."""
        ...

    def history(self, id: int) -> list[Any]:
        """All versions of ``id``, oldest first; the last is the current one."""
        ...

    def embeddings(self, ids: Any) -> np.ndarray:
        """Stored vectors of ``ids`` (int64 ``[n]``) as float32 ``[n, d]``."""
        ...

    def search(self, namespace: str, queries: Any, k: int = 20, ef: int | None = None,
               include_invalidated: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """``k`` nearest records of ``namespace`` per query.

        Parameters
        ----------
        queries : float32 ``[b, d]`` (or ``[d]`` for one query).

        Returns
        -------
        ids : int64 ``[b, k]``, best first, ``-1`` where fewer than ``k`` records exist.
        scores : float32 ``[b, k]`` (higher is closer), ``-inf`` where ``ids`` is ``-1``.
        """
        ...

    def ids(self, namespace: str, include_invalidated: bool = False) -> np.ndarray:
        """All record ids of ``namespace``, int64 ``[n]``."""
        ...

    def count(self, namespace: str, include_invalidated: bool = False) -> int:
        """Number of records of ``namespace`` (active ones unless ``include_invalidated``)."""
        ...

    def namespaces(self) -> list[str]:
        """Namespaces holding at least one record, sorted."""
        ...

    def flush(self) -> None:
        """Make every acknowledged write durable."""
        ...

    def close(self) -> None:
        """Flush and release the store (idempotent)."""
        ...


@runtime_checkable
class TurnStore(Store, Protocol):
    """A :class:`Store` with two-level memory (topic records with one record per turn), needed by
    ``RMM(retrieval="turn+topic")`` and :meth:`memkern.RMM.index_turns`.

    On top of :class:`Store`: ``add`` / ``add_batch`` / ``merge`` / ``update`` take
    ``turn_embeddings`` (float32 ``[t, d]``, one row per turn); ``search``, ``ids`` and ``count``
    take ``level`` (``"topic"``, ``"turn"``; ``search`` also ``"turn+topic"`` with ``alpha``,
    the weight of the topic similarity in a turn's score); records carry ``level``,
    ``topic_id`` and ``turn_ids``.
    """

    def turns_with_topics(self, ids: Iterable[int]) -> list[tuple[Any, Any]]:
        """``(turn record, its topic record)`` pairs for turn-record ``ids`` (int64, ``-1``
        padding skipped), in order."""
        ...


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into vectors.

    Attributes
    ----------
    dim : int
        Width ``d`` of the vectors; must equal the store's ``dim``.
    """

    @property
    def dim(self) -> int: ...

    def encode(self, texts: Sequence[str], kind: str = "passage") -> np.ndarray:
        """Embed ``n`` texts.

        Parameters
        ----------
        texts : sequence of str, length ``n``.
        kind : ``"passage"`` (stored memories) or ``"query"`` (questions); asymmetric models
            may embed them differently.

        Returns
        -------
        float32 ``[n, d]``; memkern compares rows by cosine similarity.
        """
        ...


@runtime_checkable
class ChatModel(Protocol):
    """Generates text from chat prompts, in batches."""

    def generate(self, prompts: Sequence[Prompt], max_new_tokens: int | None = None, json: Any = False,
                 temperature: float = 0.0, seed: int | None = None) -> list[str]:
        """One completion per prompt.

        Parameters
        ----------
        prompts : sequence of prompts, length ``n``; each a str or a list of
            ``{"role": ..., "content": ...}`` messages.
        max_new_tokens : cap on generated tokens per prompt (``None``: the model's default).
        json : truthy when the answer must be a JSON value (callers still parse leniently).
        temperature : 0 means greedy.
        seed : sampling seed (``None``: unseeded).

        Returns
        -------
        list of ``n`` str.
        """
        ...

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` in this model's tokenizer (used to size prompts and chunks)."""
        ...


@runtime_checkable
class Extractor(Protocol):
    """Prospective reflection's first step: a session's turns -> topics.

    A session is a sequence of turn dicts (``role``, ``content``; extra keys kept). A topic is
    a :class:`memkern.ingest.extract.Topic`: ``summary`` (str), ``turns`` (indices into the session's
    turns, sorted) and ``source`` (str, e.g. ``"llm"``).
    """

    def extract(self, turns: Sequence[dict], seed: int | None = 0) -> list["Topic"]:
        """Topics of one session."""
        ...

    def extract_batch(self, sessions: Sequence[Sequence[dict]], seed: int | None = 0) -> list[list["Topic"]]:
        """Topics of ``n`` sessions (one batched model call where the extractor has a model);
        returns ``n`` lists, in order."""
        ...


@runtime_checkable
class Decider(Protocol):
    """Prospective reflection's second step: for each new topic and its most similar existing
    memories, choose ADD, MERGE, UPDATE, INVALIDATE or NOOP."""

    def decide_batch(self, items: Sequence[tuple[str, Sequence["Candidate"]]],
                     seed: int | None = 0) -> list["Decision"]:
        """One decision per item.

        Parameters
        ----------
        items : sequence of ``(new_summary, candidates)``, length ``n``; ``candidates`` are
            :class:`memkern.ingest.apply.Candidate` (``id``, ``summary``, ``similarity``) sorted by
            similarity, most similar first (possibly empty).
        seed : sampling seed for deciders that call a model; deterministic deciders ignore it.

        Returns
        -------
        list of ``n`` :class:`memkern.ingest.apply.Decision`; ``target`` indexes the item's
        ``candidates`` (``None`` for ADD).
        """
        ...
