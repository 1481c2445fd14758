"""Search quality of MemoryStore: recall@10 against exact search on clustered data."""
from __future__ import annotations

import numpy as np
import pytest

from memkern.data.vectors import clustered_vectors as clustered
from memkern.store import DEFAULT_EF_SEARCH, MemoryStore


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
