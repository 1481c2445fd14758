"""Embedders for the evaluation-task tests (wrapped in :class:`memkern.eval.units.CachedEmbedder`).

:class:`BatchDependentEmbedder` gives a text a vector that depends on the batch it is embedded in
(as a batched transformer's float output may): a run's result then depends on which texts each
task embeds together, so only an exact task decomposition, with every task seeing the same cache
snapshot on every path, makes two runs equal.
"""
from __future__ import annotations

import numpy as np

from fakes_embed import HashEmbedder


class BatchDependentEmbedder(HashEmbedder):
    model_name = "batch-dependent-hash"

    def encode(self, texts, kind: str = "passage", progress: bool = False, **kw) -> np.ndarray:
        v = super().encode(texts, kind)
        if len(v):
            v[:, len(v) % self.dim] += 0.5  # the batch shows in every vector
        return v


def cached(embedder=None, dim: int = 32):
    from memkern.eval.units import CachedEmbedder

    return CachedEmbedder(embedder or BatchDependentEmbedder(dim), cache_dir=None)
