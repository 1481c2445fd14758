"""Fake backends for the RMM orchestration tests (scripted chat model, bag-of-words embedder,
in-memory store following the MemoryStore protocol). Real-model tests live beside them."""
from __future__ import annotations

import copy
import hashlib
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from memkern.base.turns import union_turns


class HashEmbedder:
    """Deterministic bag-of-words embedder: each lower-cased word hashes to a random unit vector;
    a text is the normalised sum (texts sharing words are similar)."""

    def __init__(self, dim: int = 64):
        self._dim = dim
        self.calls: list[tuple[list[str], str]] = []

    @property
    def dim(self) -> int:
        return self._dim

    def _word(self, w: str) -> np.ndarray:
        seed = int.from_bytes(hashlib.sha256(w.encode()).digest()[:8], "little")
        v = np.random.default_rng(seed).standard_normal(self._dim)
        return v / np.linalg.norm(v)

    def encode(self, texts: Sequence[str], kind: str = "passage", **kw: Any) -> np.ndarray:
        self.calls.append((list(texts), kind))
        out = np.zeros((len(texts), self._dim), np.float32)
        for i, t in enumerate(texts):
            words = re.findall(r"[a-z0-9']+", t.lower())
            for w in words:
                out[i] += self._word(w)
            n = np.linalg.norm(out[i])
            out[i] = out[i] / n if n > 0 else self._word("<empty>")
        return out


class ScriptedChat:
    """Chat model whose answers come from ``respond(messages) -> str`` (or a list, in order)."""

    def __init__(self, respond: Callable[[list[dict]], str] | Sequence[str]):
        self._fn = respond if callable(respond) else None
        self._queue = list(respond) if not callable(respond) else []
        self.calls: list[dict] = []

    def generate(self, prompts, max_new_tokens=None, json=False, temperature=0.0, seed=None):
        self.calls.append({"prompts": list(prompts), "max_new_tokens": max_new_tokens, "json": json})
        out = []
        for p in prompts:
            out.append(self._fn(p) if self._fn is not None else self._queue.pop(0))
        return out

    def count_tokens(self, text: str) -> int:
        return len(text.split())


@dataclass
class FakeRecord:
    id: int
    namespace: str
    summary: str
    turns: list
    meta: dict
    version: int = 1
    status: str = "active"
    embedding: np.ndarray = field(default=None, repr=False)


class FakeStore:
    """In-memory store following :class:`memkern.protocols.Store` (exact search, versions, invalidation)."""

    def __init__(self, dim: int = 64, path: str | None = None):
        self.dim = dim
        self.path = path
        self._recs: dict[int, FakeRecord] = {}
        self._hist: dict[int, list[FakeRecord]] = {}
        self._next = 0

    def add(self, namespace, summary, embedding, turns=None, meta=None):
        rid = self._next
        self._next += 1
        e = np.asarray(embedding, np.float32).reshape(self.dim)
        self._recs[rid] = FakeRecord(rid, namespace, summary, list(turns or []), dict(meta or {}), embedding=e)
        self._hist[rid] = []
        return rid

    def add_batch(self, namespace, summaries, embeddings, turns=None, metas=None):
        E = np.asarray(embeddings, np.float32).reshape(len(summaries), self.dim)
        turns = turns or [None] * len(summaries)
        metas = metas or [None] * len(summaries)
        return np.array([self.add(namespace, s, e, t, m) for s, e, t, m in zip(summaries, E, turns, metas)], np.int64)

    def get_batch(self, ids):
        return [self.get(int(i)) for i in ids]

    def get(self, rid):
        if rid not in self._recs:
            raise KeyError(rid)
        return copy.deepcopy(self._recs[rid])

    def _bump(self, rid):
        r = self._recs[rid]
        self._hist[rid].append(copy.deepcopy(r))
        r.version += 1
        return r

    def merge(self, rid, summary, embedding, turns):
        r = self._bump(rid)
        r.summary = summary
        r.embedding = np.asarray(embedding, np.float32).reshape(self.dim)
        r.turns = union_turns(r.turns, turns)  # the one turn identity (memkern.base.turns)
        return rid

    def update(self, rid, summary=None, embedding=None, turns=None, meta=None):
        r = self._bump(rid)
        if summary is not None:
            r.summary = summary
        if embedding is not None:
            r.embedding = np.asarray(embedding, np.float32).reshape(self.dim)
        if turns is not None:
            r.turns = list(turns)
        if meta is not None:
            r.meta = dict(meta)
        return rid

    def invalidate(self, rid, reason):
        r = self._bump(rid)
        r.status = "invalidated"
        r.meta = dict(r.meta, invalidated_reason=reason)

    def delete(self, rid):
        if rid not in self._recs:
            raise KeyError(rid)
        del self._recs[rid]

    def history(self, rid):
        return copy.deepcopy(self._hist[rid]) + [self.get(rid)]

    def ids(self, namespace, include_invalidated=True):
        return np.array(
            [i for i, r in self._recs.items() if r.namespace == namespace and (include_invalidated or r.status == "active")],
            np.int64,
        )

    def count(self, namespace):
        return sum(1 for r in self._recs.values() if r.namespace == namespace and r.status == "active")

    def namespaces(self):
        return sorted({r.namespace for r in self._recs.values()})

    def embeddings(self, ids):
        return np.stack([self._recs[int(i)].embedding for i in ids]).astype(np.float32)

    def search(self, namespace, queries, k=20, ef=None, include_invalidated=False):
        q = np.asarray(queries, np.float32).reshape(-1, self.dim)
        live = [r for r in self._recs.values() if r.namespace == namespace and (include_invalidated or r.status == "active")]
        ids = np.full((len(q), k), -1, np.int64)
        scores = np.full((len(q), k), -np.inf, np.float32)
        if live:
            E = np.stack([r.embedding for r in live])
            s = q @ E.T
            for b in range(len(q)):
                order = np.argsort(-s[b], kind="stable")[:k]
                ids[b, : len(order)] = [live[j].id for j in order]
                scores[b, : len(order)] = s[b, order]
        return ids, scores

    def flush(self):
        pass

    def close(self):
        pass
