"""The ``"sentences"`` extractor (LLM-free): user sentences clustered by similarity to running topic
centroids; a topic's summary is its salient user statements.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from ...errors import bad_arg
from ...protocols import Topic
from .session import attach_uncovered, fallback_topic, salient_sentences, validate_turns

if TYPE_CHECKING:  # pragma: no cover
    from ...protocols import Embedder

__all__ = ["SentenceExtractor"]


class SentenceExtractor:
    """LLM-free extraction by clustering the user's sentences (``"sentences"``; deterministic).

    Units are the sentences of the user turns (greetings, fillers and questions dropped). The
    first unit of a user turn is embedded together with the assistant turn just before it (so
    that "It does, lots of night shifts." stays with the question it answers). Units are scanned
    in order: a unit joins the topic of this session whose centroid (normalised mean of its unit
    embeddings) is most similar, if that similarity is ``>= threshold``; otherwise it starts a new
    topic. A topic's summary is ``"User said: "`` + its sentences in order (at most
    ``max_sentences``; the most central ones when it has more); its turns are the user turns of
    its sentences plus the assistant replies that follow them. One turn can thus feed several
    topics, and a topic can span turns far apart.

    Parameters
    ----------
    embedder : object with ``encode(texts, kind="passage") -> float32 [n, d]``
    threshold : float
        Cosine similarity to a topic centroid needed to join it (default 0.3, calibrated on
        MiniLM, where sentences on one subject score ~0.3-0.7 and unrelated ones ~0.0-0.2).
    max_sentences : int
        Sentences kept in a summary.
    context_weight : float
        Weight of the preceding assistant turn in the first unit's embedding.
    min_words : int
        A topic with fewer words joins its most similar topic of the session.
    """

    name = "sentences"

    def __init__(self, embedder: Embedder, threshold: float = 0.3, max_sentences: int = 4, context_weight: float = 0.5,
                 min_words: int = 6):
        if not 0.0 <= float(threshold) <= 1.0:
            raise bad_arg("threshold", "a float in [0, 1]", threshold)
        if int(max_sentences) < 1:
            raise bad_arg("max_sentences", "an int >= 1", max_sentences)
        self.embedder = embedder
        self.threshold = float(threshold)
        self.max_sentences = int(max_sentences)
        self.context_weight = float(context_weight)
        self.min_words = int(min_words)
        self.last_stats: dict[str, Any] = {}

    @staticmethod
    def _units(turns: Sequence[dict]) -> list[tuple[int, str, int | None]]:
        """(user turn index, sentence, preceding assistant turn index or None) per unit."""
        units = []
        for i, t in enumerate(turns):
            if str(t.get("role", "user")) != "user":
                continue
            prev = i - 1 if i > 0 and str(turns[i - 1].get("role", "user")) != "user" else None
            for k, sent in enumerate(salient_sentences([t["content"]], max_sentences=0)):
                units.append((i, sent, prev if k == 0 else None))
        return units

    def extract_batch(self, sessions: Sequence[Sequence[dict]], seed: int | None = None) -> list[list[Topic]]:
        """Topics of each session (``seed`` is accepted for protocol compatibility; unused)."""
        sessions = [validate_turns(s, f"sessions[{i}]") for i, s in enumerate(sessions)]
        units = [self._units(s) for s in sessions]
        texts: list[str] = []
        ctx_texts: list[str] = []
        for s, us in zip(sessions, units):
            texts += [u[1] for u in us]
            ctx_texts += [s[u[2]]["content"] for u in us if u[2] is not None]
        t0 = time.perf_counter()
        allt = texts + ctx_texts
        emb = np.asarray(self.embedder.encode(allt, kind="passage"), dtype=np.float32) if allt else np.zeros((0, 1), np.float32)
        self.last_stats = {"seconds": time.perf_counter() - t0, "calls": 1 if allt else 0, "units": len(texts)}
        emb = emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
        sent_e, ctx_e = emb[: len(texts)], emb[len(texts):]
        out: list[list[Topic]] = []
        pos = cpos = 0
        for s, us in zip(sessions, units):
            e = sent_e[pos : pos + len(us)].copy()
            for j, u in enumerate(us):
                if u[2] is not None:
                    v = e[j] + self.context_weight * ctx_e[cpos]
                    e[j] = v / max(float(np.linalg.norm(v)), 1e-12)
                    cpos += 1
            pos += len(us)
            segs: list[list[int]] = []
            for j in range(len(us)):
                best, best_sim = None, -2.0
                for g, seg in enumerate(segs):
                    c = e[seg].sum(0)
                    sim = float(e[j] @ c) / max(float(np.linalg.norm(c)), 1e-12)
                    if sim > best_sim:
                        best, best_sim = g, sim
                if best is not None and best_sim >= self.threshold:
                    segs[best].append(j)
                else:
                    segs.append([j])
            # A tiny segment (fewer than min_words words, e.g. "I'm Maya.") joins its most similar
            # neighbour segment rather than becoming a memory of its own.
            changed = True
            while changed and len(segs) > 1:
                changed = False
                for g, seg in enumerate(segs):
                    if sum(len(us[j][1].split()) for j in seg) >= self.min_words:
                        continue
                    c = e[seg].sum(0)
                    others = [h for h in range(len(segs)) if h != g]
                    h = max(others, key=lambda h: float(e[segs[h]].sum(0) @ c) / max(float(np.linalg.norm(e[segs[h]].sum(0))), 1e-12))
                    segs[h] = sorted(segs[h] + seg)
                    del segs[g]
                    changed = True
                    break
            topics = []
            for seg in segs:
                keep = seg
                if len(seg) > self.max_sentences:
                    c = e[seg].mean(0)
                    keep = sorted(sorted(seg, key=lambda j: -float(e[j] @ c))[: self.max_sentences])
                user_idx = sorted({us[j][0] for j in seg})
                turn_idx = set(user_idx)
                for i in user_idx:  # the assistant replies that follow
                    k = i + 1
                    while k < len(s) and str(s[k].get("role", "user")) != "user":
                        turn_idx.add(k)
                        k += 1
                summary = "User said: " + " ".join(us[j][1] for j in keep)
                topics.append(Topic(summary=summary, turns=sorted(turn_idx), source="sentences"))
            if s and not topics:
                topics = [fallback_topic(s)]
            elif s:
                attach_uncovered(topics, s)
            out.append(topics)
        return out

    def extract(self, turns: Sequence[dict], seed: int | None = None) -> list[Topic]:
        """Topics of one session (see :meth:`extract_batch`)."""
        return self.extract_batch([turns])[0]
