"""Synthetic embedding vectors for store tests and benchmarks."""
from __future__ import annotations

import numpy as np

__all__ = ["clustered_vectors"]


def clustered_vectors(n: int, d: int, n_clusters: int, seed: int, rank: int = 64, noise: float = 0.5,
              sample_seed: int | None = None) -> np.ndarray:
    """Unit vectors from a mixture of low-rank Gaussians (a stand-in for sentence embeddings,
    which have a low intrinsic dimension): cluster centre + a point of the cluster's random
    ``rank``-dim subspace + isotropic noise. ``seed`` fixes the clusters, ``sample_seed`` the draws
    (queries are fresh draws from the same clusters)."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((n_clusters, d)).astype(np.float32)
    bases = (rng.standard_normal((n_clusters, rank, d)) / np.sqrt(rank)).astype(np.float32)
    rs = rng if sample_seed is None else np.random.default_rng(sample_seed)
    x = np.empty((n, d), dtype=np.float32)
    for s in range(0, n, 8192):
        m = min(8192, n - s)
        lab = rs.integers(0, n_clusters, m)
        z = rs.standard_normal((m, rank)).astype(np.float32)
        eps = noise * rs.standard_normal((m, d)).astype(np.float32)
        x[s:s + m] = centres[lab] + np.einsum("nr,nrd->nd", z, bases[lab]) + eps
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
