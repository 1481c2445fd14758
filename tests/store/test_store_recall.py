"""Search quality of MemoryStore: recall@10 against exact search on clustered data."""
from __future__ import annotations

import numpy as np
import pytest

from memkern.data.vectors import clustered_vectors as clustered
from memkern.store import DEFAULT_EF_SEARCH, MemoryStore


def recall_at(got: np.ndarray, exact: np.ndarray, k: int) -> float:
    return float(np.mean([len(set(got[i, :k].tolist()) & set(exact[i, :k].tolist())) / k for i in range(len(got))]))


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_search_for_every_record_is_exhaustive_after_heavy_updates(tmp_path):
    """k >= the namespace's size returns every live record in exact score order, even after
    thousands of in-place embedding updates (which can leave graph nodes unreachable)."""
    d = 24
    rng = np.random.default_rng(0)
    with MemoryStore(tmp_path / "s", dim=d, fsync="never") as s:
        ids = list(s.add_batch("u", [f"r{i}" for i in range(3000)], rng.standard_normal((3000, d)).astype(np.float32)))
        for _ in range(3000):
            s.merge(int(ids[rng.integers(len(ids))]), "m", rng.standard_normal(d).astype(np.float32), [])
        for _ in range(300):
            s.delete(int(ids.pop(int(rng.integers(len(ids))))))
        emb = s.embeddings(ids)
        q = rng.standard_normal((3, d)).astype(np.float32)
        got, scores = s.search("u", q, k=len(ids) + 5, ef=10)
        exact = q @ emb.T
        for b in range(3):
            assert set(got[b, : len(ids)].tolist()) == set(ids)
            assert (got[b, len(ids):] == -1).all()
            np.testing.assert_allclose(scores[b, : len(ids)], np.sort(exact[b])[::-1], rtol=1e-5, atol=1e-5)
