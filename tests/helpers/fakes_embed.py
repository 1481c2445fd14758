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
