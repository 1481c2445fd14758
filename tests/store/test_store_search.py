"""The dense search path at raw-hnswlib cost: the SIMD distance kernels (AVX-512 / AVX2+FMA /
scalar, picked at load time, capped by ``MEMKERN_SIMD``) agree with an exact float64 reference at
every dimension (vector tails included), and a parallel batch search (``num_threads=2``) returns
exactly what one thread returns."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from memkern import _store
from memkern.store import MemoryStore

# One process per kernel cap (the kernel is chosen once, when the module loads): exact-scan
# (flat) search scores of every metric at dimensions around the kernels' 8/16/32-float steps.
_KERNEL_SCRIPT = r"""
import json, sys, tempfile
import numpy as np
from memkern import _store
from memkern.store import MemoryStore
out = {"kernel": _store.Store.simd_kernel, "runs": []}
root = tempfile.mkdtemp()
for dim in (1, 5, 16, 17, 31, 33, 47, 384):
    rng = np.random.default_rng(dim)
    x = rng.standard_normal((40, dim)).astype(np.float32)
    q = rng.standard_normal((3, dim)).astype(np.float32)
    for metric in ("ip", "l2", "cos"):
        with MemoryStore(f"{root}/{metric}{dim}", dim=dim, metric=metric, fsync="never") as s:
            ids = s.add_batch("u", ["x"] * 40, x)
            got, sc = s.search("u", q, k=40)
            out["runs"].append(dict(dim=dim, metric=metric, ids=ids.tolist(), got=got.tolist(),
                                    scores=sc.tolist(), x=x.tolist(), q=q.tolist()))
print(json.dumps(out))
"""


def _reference(metric: str, q: np.ndarray, x: np.ndarray) -> np.ndarray:
    q, x = q.astype(np.float64), x.astype(np.float64)
    if metric == "ip":
        return q @ x.T
    if metric == "l2":
        return -((q[:, None, :] - x[None]) ** 2).sum(-1)
    return (q / np.linalg.norm(q, axis=1, keepdims=True)) @ (x / np.linalg.norm(x, axis=1, keepdims=True)).T


def _cpu_has_avx512() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return " avx512f" in f.read()
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.parametrize("cap", ["", "avx2", "scalar"])
def test_kernels_match_exact_reference(cap):
    env = dict(os.environ, MEMKERN_SIMD=cap)
    r = subprocess.run([sys.executable, "-c", _KERNEL_SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    if cap == "scalar":
        assert out["kernel"] == "scalar"
    elif cap == "avx2":
        assert out["kernel"] in ("avx2+fma", "scalar")
    elif _cpu_has_avx512():
        assert out["kernel"] == "avx512"  # the fast kernel is really the one in use
    for run in out["runs"]:
        x, q = np.asarray(run["x"], np.float32), np.asarray(run["q"], np.float32)
        ref = _reference(run["metric"], q, x)
        ids, got, sc = np.asarray(run["ids"]), np.asarray(run["got"]), np.asarray(run["scores"])
        row = {int(i): j for j, i in enumerate(ids)}
        for b in range(len(q)):
            want = ref[b][[row[int(i)] for i in got[b]]]
            scale = max(1.0, float(np.abs(ref[b]).max()))
            np.testing.assert_allclose(sc[b], want, rtol=0, atol=2e-5 * scale,
                                       err_msg=f"{out['kernel']} dim={run['dim']} metric={run['metric']}")
            # best first, and every record comes back (k = n): the order is the reference's
            assert sorted(got[b].tolist()) == sorted(ids.tolist())
            assert np.all(np.diff(want) <= 2e-5 * scale)


@pytest.mark.parametrize("metric", ["ip", "cos"])
def test_batch_search_identical_at_1_and_2_threads(tmp_path, metric):
    """num_threads=2 splits the query rows across threads (the call is large enough: B * work per
    row above the parallel threshold); ids and scores are bit-identical to one thread, for an
    HNSW namespace and for a flat one."""
    rng = np.random.default_rng(3)
    d = 24
    x = rng.standard_normal((1500, d)).astype(np.float32)
    small = rng.standard_normal((300, d)).astype(np.float32)
    q = rng.standard_normal((300, d)).astype(np.float32)
    p = tmp_path / "s"
    with MemoryStore(p, dim=d, metric=metric, fsync="never", num_threads=1) as s:
        s.add_batch("big", ["x"] * len(x), x)
        s.add_batch("small", ["x"] * len(small), small)
        assert s.native.index_kind("big", _store.Level.topic) == "hnsw"
        assert s.native.index_kind("small", _store.Level.topic) == "flat"
        one = {ns: s.search(ns, q, k=15, ef=64) for ns in ("big", "small")}
    with MemoryStore(p, num_threads=2) as s:
        two = {ns: s.search(ns, q, k=15, ef=64) for ns in ("big", "small")}
    for ns in one:
        np.testing.assert_array_equal(one[ns][0], two[ns][0])
        np.testing.assert_array_equal(one[ns][1], two[ns][1])
    # and the graph search is right: the flat namespace is exact, the graph close to it
    exact = _reference(metric, q, x)
    top = np.argsort(-exact, axis=1)[:, :10]
    recall = np.mean([len(set(one["big"][0][b, :10].tolist()) & set(top[b].tolist())) / 10 for b in range(len(q))])
    assert recall >= 0.95, recall


def test_native_property(tmp_path):
    """``MemoryStore.native`` is the open store's native layer, and refuses a closed store."""
    s = MemoryStore(tmp_path / "s", dim=4)
    assert isinstance(s.native, _store.Store)
    s.close()
    with pytest.raises(Exception, match="closed"):
        s.native
