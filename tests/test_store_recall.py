"""Search quality of MemoryStore: recall@10 against exact search on clustered data."""
from __future__ import annotations

import numpy as np
import pytest

from memkern.store import DEFAULT_EF_SEARCH, MemoryStore


def clustered(n: int, d: int, n_clusters: int, seed: int, rank: int = 64, noise: float = 0.5,
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


def recall_at(got: np.ndarray, exact: np.ndarray, k: int) -> float:
    return float(np.mean([len(set(got[i, :k].tolist()) & set(exact[i, :k].tolist())) / k for i in range(len(got))]))


@pytest.mark.parametrize("metric", ["ip", "cos", "l2"])
def test_recall_at_10_default_ef(tmp_path, metric):
    n, d = 8000, 384
    x = clustered(n, d, 40, seed=0)
    q = clustered(300, d, 40, seed=0, sample_seed=1)
    with MemoryStore(tmp_path / metric, dim=d, metric=metric, fsync="never") as s:
        ids = s.add_batch("u", [""] * n, x)
        s.add_batch("other", [""] * 500, clustered(500, d, 40, seed=0, sample_seed=2))  # must never leak in
        got, scores = s.search("u", q, k=20)
        assert s.ef_search == DEFAULT_EF_SEARCH
    if metric == "l2":
        dist = (q * q).sum(1)[:, None] - 2 * q @ x.T + (x * x).sum(1)[None]
        exact = ids[np.argsort(dist, axis=1)[:, :10]]
    else:
        exact = ids[np.argsort(-(q @ x.T), axis=1)[:, :10]]
    assert np.isin(got, ids).all()
    r = recall_at(got, exact, 10)
    assert r >= 0.95, f"recall@10 = {r:.3f} at the default ef={DEFAULT_EF_SEARCH}"
    assert np.all(np.diff(scores, axis=1) <= 1e-6)


def test_recall_grows_with_ef(tmp_path):
    n, d = 4000, 64
    x = clustered(n, d, 40, seed=3, rank=32, noise=0.6)
    q = clustered(200, d, 40, seed=3, rank=32, noise=0.6, sample_seed=4)
    exact = np.argsort(-(q @ x.T), axis=1)[:, :10]
    with MemoryStore(tmp_path / "s", dim=d, fsync="never") as s:
        ids = s.add_batch("u", [""] * n, x)
        assert (ids == np.arange(n)).all()
        r = [recall_at(s.search("u", q, k=10, ef=ef)[0], exact, 10) for ef in (10, 40, 400)]
    assert r[0] <= r[1] + 1e-9 <= r[2] + 2e-9 and r[2] >= 0.99, r
