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
from memkern.errors import MemkernValueError

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


# ---------------------------------------------------------------- the plain dense fast path
def _general(s: MemoryStore, *args, **kw):
    """The general prepared call (prepare_search(...).run), what the fast path must equal."""
    from memkern.store.prepare import prepare_search

    return prepare_search(s.dim, s.ef_search, *args, **kw).run(s)


@pytest.mark.parametrize("metric", ["ip", "cos"])
def test_fast_path_equals_general_path(tmp_path, metric):
    """MemoryStore.search's plain dense path (dense_args straight into the engine) returns exactly
    what the general prepared call returns: both levels, 1-D / 2-D / strided / float64 queries,
    ``ef`` given, k above the record count, invalidated records in or out."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((300, 24)).astype(np.float32)
    with MemoryStore(tmp_path / "s", dim=24, metric=metric, fsync="never", flat_limit=16) as s:
        ids = s.add_batch("u", ["x"] * 300, x, turns=[[{"role": "user", "content": f"t{i}"}] for i in range(300)],
                          turn_embeddings=[x[i:i + 1] for i in range(300)])
        s.invalidate(int(ids[0]))
        q = rng.standard_normal((4, 48)).astype(np.float32)
        cases = [(q[:, ::2], 10, None), (q[0, ::2].copy(), 5, 40), (q[:2, :24].astype(np.float64), 400, None),
                 (np.ascontiguousarray(q[:, :24]), 3, 7)]
        for qq, k, ef in cases:
            for level in ("topic", "turn"):
                for inv in (False, True):
                    a = s.search("u", qq, k=k, ef=ef, include_invalidated=inv, level=level)
                    b = _general(s, "u", qq, k, ef, inv, level=level)
                    assert a[0].dtype == np.int64 and a[1].dtype == np.float32
                    np.testing.assert_array_equal(a[0], b[0])
                    np.testing.assert_array_equal(a[1], b[1])
        assert (s.search("u", q[0, :24], k=300)[0] != int(ids[0])).all()  # invalidated stays out
        assert (s.search("nobody", q[0, :24], k=3)[0] == -1).all()


def test_fast_path_checks_before_the_engine(tmp_path):
    """Bad queries fail in the Python check (its message names the first bad index), never in
    the engine; a closed store's error comes first, whatever the arguments."""
    from memkern.errors import MemkernTypeError, MemkernValueError

    s = MemoryStore(tmp_path / "s", dim=8, fsync="never")
    s.add("u", "x", np.ones(8, np.float32))
    for bad in (np.nan, np.inf, -np.inf):
        q = np.ones((1, 8), np.float32)
        q[0, 3] = bad
        with pytest.raises(MemkernValueError, match=r"queries: expected finite values, got 'NaN or inf at index \(0, 3\)'"):
            s.search("u", q)
    big = np.full((1, 8), 3e38, np.float32)  # finite values: the engine's norm bound names them
    with pytest.raises(MemkernValueError, match="queries: expected an L2 norm"):
        s.search("u", big)
    with pytest.raises(MemkernValueError, match=r"queries: expected shape \[B, 8\]"):
        s.search("u", np.ones((1, 9), np.float32))
    with pytest.raises(MemkernTypeError, match="k"):
        s.search("u", np.ones(8, np.float32), k=True)
    with pytest.raises(MemkernValueError, match="k"):
        s.search("u", np.ones(8, np.float32), k=0)
    with pytest.raises(MemkernValueError, match="ef"):
        s.search("u", np.ones(8, np.float32), ef=0)
    with pytest.raises(MemkernTypeError, match="namespace"):
        s.search(b"u", np.ones(8, np.float32))
    with pytest.raises(MemkernValueError, match="namespace"):
        s.search("\ud800", np.ones(8, np.float32))
    assert s.search("ü", np.ones(8, np.float32), k=1)[0][0, 0] == -1  # non-ASCII: the full check, valid
    s.close()
    for q in (np.ones(8, np.float32), np.full(8, np.nan, np.float32), "junk"):
        with pytest.raises(MemkernValueError, match="expected an open store"):
            s.search("u", q)


def test_stored_rows_ok():
    """The native stored-vector check of the write path: finite values and every row's norm within
    the engine's bound, exactly the rule the engine applies (the add fast path relies on it)."""
    f = _store.stored_rows_ok
    big = np.float32(7e17)
    assert f(np.ones(5, np.float32)) and f(np.full((3, 2), big)) and f(np.full(3, np.finfo(np.float32).tiny / 4))
    assert not f(np.zeros(0, np.float32)) and not f(np.zeros((0, 4), np.float32))  # empty: the full check
    for shape in ((37,), (3, 13)):
        x = np.ones(shape, np.float32)
        for i in (0, x.size // 2, x.size - 1):  # first, middle, last value (last row)
            for v in (np.nan, np.inf, -np.inf, np.float32(1e19)):
                y = x.copy().reshape(-1)
                y[i] = v
                assert not f(y.reshape(shape)), (shape, i, v)
    # The bound itself: a norm of 1e18 passes, the next float32 above it does not.
    at = np.float32(1e18)
    above = np.nextafter(at, np.float32(np.inf))
    assert f(np.array([at, 0], np.float32)) is (float(at) <= 1e18)
    assert not f(np.array([above, 0], np.float32))
    assert not f(np.array([[1, 0], [above, 0]], np.float32))


def test_add_accepts_and_refuses_what_the_engine_does(make_store):
    """A float32 vector takes the native fast path; a float64 or strided one the full check; both
    store the same values, and a bad value in any position is refused with the argument named."""
    rng = np.random.default_rng(4)
    with make_store(8, "ip", name="fast", fsync="never") as s:
        x = rng.standard_normal((3, 16)).astype(np.float32)
        a = s.add("u", "a", x[0, ::2].copy())                       # fast path
        b = s.add("u", "b", x[1, ::2].astype(np.float64))           # full check (exact float64)
        c = s.add("u", "c", x[2, ::2])                              # strided view: full check
        np.testing.assert_array_equal(s.embeddings([a, b, c]), x[:, ::2])
        for i in (0, 7):
            for v in (np.nan, np.inf):
                y = np.ones(8, np.float32)
                y[i] = v
                with pytest.raises(MemkernValueError, match=rf"^embedding: expected finite values, got 'NaN or inf at index \({i},\)'"):
                    s.add("u", "x", y)
        with pytest.raises(MemkernValueError, match=r"^embedding: .*L2 norm <= 1e\+?18"):
            s.add("u", "x", np.full(8, 5e17, np.float32))
        assert s.count("u") == 3


def test_all_finite():
    """The native finiteness check of the query path: every NaN / inf bit pattern, anywhere."""
    f = _store.all_finite
    x = np.zeros(37, np.float32)
    assert f(x) and f(np.zeros(0, np.float32)) and f(np.full(5, np.finfo(np.float32).max))
    assert f(np.full(3, np.finfo(np.float32).tiny / 4))  # subnormals are finite
    for i in (0, 17, 36):
        for v in (np.nan, np.inf, -np.inf, np.frombuffer(b"\x01\x00\x80\x7f", np.float32)[0]):  # signalling NaN
            y = x.copy()
            y[i] = v
            assert not f(y) and not f(y.reshape(1, 37))
