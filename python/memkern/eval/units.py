"""Retrievable units of a conversation and the experiments' embedding cache.

:class:`CachedEmbedder` wraps an embedder with an on-disk cache keyed by (model, kind, text);
:func:`build_units` cuts a conversation into units at one granularity (:data:`GRANULARITIES`)
and embeds them.
"""
from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..base.atomic import atomic_write
from ..data.schema import Conversation
from ..errors import bad_arg

log = logging.getLogger("memkern")

__all__ = ["CachedEmbedder", "Units", "build_units", "make_extractor", "default_cache_dir", "GRANULARITIES", "BUDGETS"]

GRANULARITIES = ("turn", "session", "mix", "chunk4", "topic-embedding", "topic-llm")
BUDGETS = (5, 10, 20)


def default_cache_dir() -> Path:
    """Embedding cache of the experiments (under :func:`memkern.base.paths.cache_dir`)."""
    from ..base.paths import cache_dir

    return cache_dir("eval-embeddings")


class CachedEmbedder:
    """Wrap an embedder (``encode(texts, kind) -> float32 [n, d]``) with a disk cache.

    Vectors are keyed by sha1(model name, kind, text) and kept in one ``.npz`` per model under
    ``cache_dir`` (written by :meth:`flush`, and automatically every ``flush_every`` new vectors).
    ``cache_dir=None`` disables the disk (memory cache only).
    """

    def __init__(self, embedder: Any = None, cache_dir: str | os.PathLike | None = "default",
                 flush_every: int = 4096, progress: bool = False):
        if embedder is None:
            from ..models import Embedder

            embedder = Embedder()
        self.embedder = embedder
        self.model_name = str(getattr(embedder, "model_name", type(embedder).__name__))
        self.progress = progress
        self.dim = int(embedder.dim)
        self._mem: dict[str, np.ndarray] = {}
        self._new = 0
        self.flush_every = int(flush_every)
        self.path: Path | None = None
        self.hits = 0
        self.misses = 0
        self._added: list[str] | None = None  # keys embedded since fork() (None: not a fork)
        if cache_dir is not None:
            d = default_cache_dir() if cache_dir == "default" else Path(cache_dir)
            tag = hashlib.sha1(self.model_name.encode()).hexdigest()[:12]
            self.path = d / f"emb-{tag}-{self.dim}.npz"
            if self.path.exists():
                try:
                    z = np.load(self.path)
                    keys, vecs = z["keys"], z["vecs"]
                    self._mem = {str(k): vecs[i] for i, k in enumerate(keys)}
                except Exception as e:  # a broken cache is rebuilt, never trusted
                    log.warning("embedding cache %s unreadable (%s); starting empty", self.path, e)

    @staticmethod
    def _key(model: str, kind: str, text: str) -> str:
        return hashlib.sha1(f"{model}\x00{kind}\x00{text}".encode("utf-8")).hexdigest()

    def encode(self, texts: Sequence[str], kind: str = "passage", **kw: Any) -> np.ndarray:
        """float32 ``[n, d]``, L2-normalised rows; only texts not in the cache are embedded."""
        texts = list(texts)
        keys = [self._key(self.model_name, kind, t) for t in texts]
        todo: dict[str, str] = {}
        for k, t in zip(keys, texts):
            if k not in self._mem and k not in todo:
                todo[k] = t
        self.hits += len(texts) - len(todo)
        self.misses += len(todo)
        if todo:
            vecs = np.asarray(self.embedder.encode(list(todo.values()), kind=kind,
                                                   progress=self.progress and len(todo) > 256), dtype=np.float32)
            vecs = vecs / np.maximum(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12)
            for k, v in zip(todo, vecs):
                self._mem[k] = v
            if self._added is not None:
                self._added.extend(todo)
            self._new += len(todo)
            if self._new >= self.flush_every:
                self.flush()
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        return np.stack([self._mem[k] for k in keys]).astype(np.float32, copy=False)

    def fork(self) -> "CachedEmbedder":
        """A copy that shares the model and starts from this cache's vectors but never sees the
        vectors embedded here later (nor adds to them), and writes no file: one evaluation task's
        view of the cache (:mod:`memkern.eval.tasks`). :meth:`added` returns what it embedded."""
        f = object.__new__(CachedEmbedder)
        f.__dict__.update(self.__dict__)
        f._mem = dict(self._mem)
        f._added = []
        f._new = 0
        f.path = None
        f.hits = f.misses = 0
        return f

    def added(self) -> dict[str, np.ndarray]:
        """The vectors a :meth:`fork` embedded (cache key -> float32 ``[d]``), in embedding order."""
        if self._added is None:
            raise bad_arg("self", "a fork() of a CachedEmbedder", "the original cache")
        return {k: self._mem[k] for k in self._added}

    def absorb(self, vectors: dict[str, np.ndarray]) -> None:
        """Add a fork's :meth:`added` vectors; keys already cached keep their vector."""
        for k, v in vectors.items():
            if k not in self._mem:
                self._mem[k] = np.asarray(v, dtype=np.float32)
                self._new += 1

    def flush(self) -> None:
        if self.path is None or self._new == 0:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        keys = np.array(list(self._mem), dtype="U40")
        vecs = np.stack(list(self._mem.values())).astype(np.float32)
        atomic_write(self.path, lambda f: np.savez(f, keys=keys, vecs=vecs))
        self._new = 0

    def count_tokens(self, text: str) -> int:
        tok = getattr(self.embedder, "tokenizer", None)
        if tok is None:
            return len(text.split())
        return len(tok(text, add_special_tokens=False)["input_ids"])


@dataclass
class Units:
    """The retrievable units of one conversation at one granularity.

    ``turn_ids[j]``: the turn ids unit ``j`` contains (in dialogue order); ``texts[j]``: the text
    its key embedding is computed from (a turn's content, ``role: content`` lines for sessions and
    chunks, the summary for topics); ``emb``: float32 ``[U, d]``, L2-normalised rows.
    """

    turn_ids: list[list[str]]
    texts: list[str]
    emb: np.ndarray | None = None


def _session_text(turns) -> str:
    return "\n".join(f"{t.role}: {t.content}" for t in turns)


def _topic_segments(conv: Conversation, extractor: Any, seed: int = 0) -> list[tuple[list[str], str]]:
    """(turn ids, summary) per topic, for every session of ``conv`` (one batched extractor call)."""
    sess_dicts = [[{"role": t.role, "content": t.content, "speaker": t.speaker, "date": t.date or s.date}
                   for t in s.turns] for s in conv.sessions]
    topics = extractor.extract_batch(sess_dicts, seed=seed)
    out = []
    for s, tops in zip(conv.sessions, topics):
        covered: set[int] = set()
        for tp in tops:
            idx = sorted(i for i in tp.turns if 0 <= i < len(s.turns))
            covered.update(idx)
            if idx:
                out.append(([s.turns[i].turn_id for i in idx], tp.summary))
        # a turn no topic claims stays retrievable only through nothing: report it
        missing = [i for i in range(len(s.turns)) if i not in covered]
        if missing:
            log.debug("topics of %s leave %d turns uncovered", s.session_id, len(missing))
    return out


def build_units(conv: Conversation, granularity: str, emb: CachedEmbedder | None = None,
                extractor: Any = None, seed: int = 0) -> Units:
    """Units of ``conv`` at ``granularity`` (one of :data:`GRANULARITIES`), embedded if ``emb``."""
    if granularity == "turn":
        u = Units([[t.turn_id] for t in conv.turns()], [t.content for t in conv.turns()])
    elif granularity == "session":
        u = Units([[t.turn_id for t in s.turns] for s in conv.sessions if s.turns],
                  [_session_text(s.turns) for s in conv.sessions if s.turns])
    elif granularity == "mix":
        a, b = build_units(conv, "turn"), build_units(conv, "session")
        u = Units(a.turn_ids + b.turn_ids, a.texts + b.texts)
    elif granularity == "chunk4":
        ids, texts = [], []
        for s in conv.sessions:
            for i in range(0, len(s.turns), 4):
                ch = s.turns[i:i + 4]
                ids.append([t.turn_id for t in ch])
                texts.append(_session_text(ch))
        u = Units(ids, texts)
    elif granularity in ("topic-embedding", "topic-llm"):
        if extractor is None:
            raise bad_arg("extractor", f"an extractor for granularity {granularity!r}", None)
        segs = _topic_segments(conv, extractor, seed=seed)
        u = Units([s[0] for s in segs], [s[1] for s in segs])
    else:
        raise bad_arg("granularity", f"one of {GRANULARITIES}", granularity)
    if emb is not None:
        u.emb = emb.encode(u.texts, kind="passage") if u.texts else np.zeros((0, emb.dim), np.float32)
    return u


def make_extractor(kind: str, emb: CachedEmbedder, chat_model: Any = None, threshold: float = 0.3,
                    llm_max_new_tokens: int = 160):
    """The extractor ``kind`` the topic granularities use: ``"embedding"`` (TextTiling-like, the
    default turn template), ``"sentences"`` (user sentences clustered at ``threshold``) or ``"llm"``."""
    from ..ingest.extract import make_extractor as _make

    if kind == "embedding":
        return _make("embedding", embedder=emb)
    if kind == "sentences":
        return _make("sentences", embedder=emb, threshold=threshold)
    if chat_model is None:
        from ..models import ChatModel

        chat_model = ChatModel()
    return _make("llm", chat_model=chat_model, max_new_tokens=llm_max_new_tokens)
