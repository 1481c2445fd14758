"""A deterministic, dependency-free embedder for the adapter tests: hashed bag of words.

Texts sharing words get similar vectors (cosine = word overlap), so similarity orderings in the
tests are predictable; a text with no word gets the unit vector e0. Counts calls and texts so tests
can check batching.
"""
from __future__ import annotations

import hashlib
import re

import numpy as np


class HashEmbedder:
    def __init__(self, dim: int = 64):
        self.dim = dim
        self.calls = 0
        self.texts = 0

    def _row(self, text: str) -> np.ndarray:
        v = np.zeros(self.dim, dtype=np.float32)
        for w in re.findall(r"\w+", text.lower()):
            h = int.from_bytes(hashlib.blake2b(w.encode(), digest_size=8).digest(), "little")
            v[h % self.dim] += 1.0
        n = float(np.linalg.norm(v))
        if n == 0.0:
            v[0] = 1.0
            return v
        return v / n

    def encode(self, texts, kind: str = "passage") -> np.ndarray:
        texts = list(texts)
        self.calls += 1
        self.texts += len(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack([self._row(t) for t in texts]).astype(np.float32)


def llama_embedding(emb: HashEmbedder):
    """``emb`` as a LlamaIndex ``BaseEmbedding`` (llama-index-core imported on call)."""
    from llama_index.core.embeddings import BaseEmbedding

    class Hash(BaseEmbedding):
        def _get_text_embedding(self, text):
            return emb.encode([text])[0].tolist()

        def _get_query_embedding(self, query):
            return emb.encode([query])[0].tolist()

        async def _aget_query_embedding(self, query):
            return self._get_query_embedding(query)

    return Hash()


def _unit(*x: float) -> np.ndarray:
    v = np.asarray(x, dtype=np.float32)
    return v / np.linalg.norm(v)


#: Fixed unit vectors (d = 4): "q" = e0; "a" (cos 0.95 with q) and "a twin" (0.94) are
#: near-duplicates; "b" (0.8) leans the other way from q than "a" does, "c" (0.7) off the plane;
#: "far" is opposite to q.
PLANE_VECTORS = {"q": _unit(1, 0, 0, 0), "a": _unit(0.95, 0.312, 0, 0), "a twin": _unit(0.94, 0.341, 0, 0),
                 "b": _unit(0.8, -0.6, 0, 0), "c": _unit(0.7, 0, 0.714, 0), "far": _unit(-1, 0, 0, 0.1)}


class PlaneEmbedder:
    """:data:`PLANE_VECTORS` for their texts (``table``); any other text gets the vector of "q"
    (``fallback="q"``) or its hashed bag of words (``fallback="words"``). Records the kinds it is
    asked for (``kinds``)."""

    dim = 4

    def __init__(self, fallback: str = "q"):
        self.table = dict(PLANE_VECTORS)
        self.words = HashEmbedder(dim=4) if fallback == "words" else None
        self.kinds: list = []

    def encode(self, texts, kind="passage"):
        self.kinds.append(kind)
        return np.stack([self.table[t] if t in self.table else
                         (self.words.encode([t])[0] if self.words is not None else self.table["q"])
                         for t in texts]).astype(np.float32)
