"""RMM's retrieval stage: top-K search (topic or turn+topic), then the reranker's top-M.

Topic mode searches topic records. Two-level mode (``retrieval="turn+topic"``) searches
``4 * top_k`` turn records scored ``sim(q, turn) + alpha * sim(q, its topic)`` and groups them by
topic (:meth:`RetrieveStage._retrieve_turn_topic`). The reranker then chooses ``top_m`` of the
``<= top_k`` candidates (:meth:`RetrieveStage._retrieve_and_rerank`).
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from ..errors import MemkernValueError

__all__ = ["RetrieveStage"]


def _normalize(x: np.ndarray) -> np.ndarray:
    """Rows of ``x`` (float32 ``[..., d]``) scaled to unit length (zero rows stay ~0)."""
    x = np.asarray(x, dtype=np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def _turn_order(turn_record: Any) -> int:
    """A turn record's position in its topic's turn list (old sessions first: conversation order)."""
    pos = (turn_record.meta or {}).get("turn_position", 0)
    return int(pos) if isinstance(pos, int) else 0


class RetrieveStage:
    """Retrieval + rerank of :class:`memkern.RMM` (a mixin: it uses the RMM's ``store``,
    ``namespace``, ``config`` fields and ``reranker``)."""

    @property
    def two_level(self) -> bool:
        """Whether this RMM runs two-level memory (``retrieval="turn+topic"``)."""
        return self.retrieval == "turn+topic"

    def _retrieve_turn_topic(self, q: np.ndarray) -> tuple[np.ndarray, dict[int, tuple[Any, list[Any], float]]]:
        """Turn+topic search, grouped by topic.

        Searches ``4 * top_k`` turns scored ``sim(q, turn) + alpha * sim(q, topic)`` and walks
        them best first: the first ``top_k`` distinct topics become the candidates (in order of
        their best turn), each keeping its best ``turns_per_memory`` retrieved turns.

        Returns
        -------
        ids : int64 [n]
            Candidate topic ids, ``n <= top_k``.
        groups : dict
            ``topic id -> (topic record, [turn records, best first], best turn+topic score)``.
        """
        groups: dict[int, tuple[Any, list[Any], float]] = {}
        if self.store.count(self.namespace, level="turn") == 0:
            return np.zeros(0, np.int64), groups
        tids, scores = self.store.search(self.namespace, q, k=4 * self.top_k, level="turn+topic", alpha=self.alpha)
        tids, scores = np.asarray(tids).reshape(-1), np.asarray(scores).reshape(-1)
        keep = tids >= 0
        pairs = self.store.turns_with_topics(tids[keep])
        for (turn, topic), s in zip(pairs, scores[keep]):
            g = groups.get(int(topic.id))
            if g is None:
                if len(groups) >= self.top_k:
                    continue
                groups[int(topic.id)] = g = (topic, [], float(s))
            if len(g[1]) < self.turns_per_memory:
                g[1].append(turn)
        return np.fromiter(groups, dtype=np.int64, count=len(groups)), groups

    def _retrieve_and_rerank(self, q: np.ndarray, timings: dict[str, float]):
        """Top-K search then top-M selection.

        Returns (candidate ids, candidates, selected ids, selection, groups); ``groups`` is the
        turn+topic grouping of :meth:`_retrieve_turn_topic` (empty in topic mode).
        """
        import torch

        t0 = time.perf_counter()
        groups: dict[int, tuple[Any, list[Any], float]] = {}
        if self.store.count(self.namespace) == 0:
            timings["retrieve"] = time.perf_counter() - t0
            timings["rerank"] = 0.0
            return np.zeros(0, np.int64), None, np.zeros(0, np.int64), None, groups
        if self.two_level:
            ids, groups = self._retrieve_turn_topic(q)
        else:
            ids, _ = self.store.search(self.namespace, q, k=self.top_k)
            ids = np.asarray(ids).reshape(-1)
            ids = ids[ids >= 0].astype(np.int64)
        emb = np.asarray(self.store.embeddings(ids), dtype=np.float32) if len(ids) else np.zeros((0, self.store.dim), np.float32)
        if self.two_level and len(ids):
            # Reranker candidate = best turn + alpha * topic: a fresh reranker's score q . c is then
            # exactly the turn+topic retrieval score (the topic vector alone would re-rank by topic).
            best = np.asarray(self.store.embeddings([int(groups[int(i)][1][0].id) for i in ids]), dtype=np.float32)
            emb = best + np.float32(self.alpha) * emb
        timings["retrieve"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        n = len(ids)
        if n <= self.top_m:
            # Nothing to choose: every candidate is shown, the reranker neither samples nor learns.
            timings["rerank"] = time.perf_counter() - t0
            return ids, emb, ids, None, groups
        cand = torch.zeros(1, self.top_k, self.store.dim, dtype=torch.float32)
        cand[0, :n] = torch.from_numpy(emb)
        mask = torch.zeros(1, self.top_k, dtype=torch.bool)
        mask[0, :n] = True
        sel = self.reranker.select(torch.from_numpy(q), cand, mask=mask, seed=self.seed + self.n_responses,
                                   greedy=not self.explore)
        picks = [int(i) for i in sel.indices[0].tolist()]
        bad = [i for i in picks if not 0 <= i < n]
        if bad:
            raise MemkernValueError(f"reranker.select: expected indices of unmasked candidates in [0, {n}), got {picks}")
        timings["rerank"] = time.perf_counter() - t0
        return ids, emb, ids[picks], sel, groups

    def _shown_memories(self, m_sel: np.ndarray, groups: dict[int, tuple[Any, list[Any], float]]):
        """The chosen memories as the answer prompt shows them: ``(memories, shown turn ids)``.

        Two-level: each chosen topic's summary with only its best retrieved turns, in
        conversation order. Topic mode: each record's summary with its raw turns.
        """
        if self.two_level:
            memories, shown = [], []
            for i in m_sel:
                trs = sorted(groups[int(i)][1], key=_turn_order)
                memories.append({"summary": groups[int(i)][0].summary, "turns": [t.turn for t in trs]})
                shown.append([int(t.id) for t in trs])
            return memories, shown
        records = [self.store.get(int(i)) for i in m_sel]
        return [{"summary": r.summary, "turns": r.turns} for r in records], [[] for _ in m_sel]
