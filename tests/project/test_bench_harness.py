"""The benchmark harness (bench/harness.py): interleaving, statistics, CPU/wall, threads, checks."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import harness  # noqa: E402
from harness import CheckFailed, Side, compare, latencies, pin_threads  # noqa: E402


def test_rounds_are_interleaved_with_warmup():
    log = []
    c = compare(Side("a", lambda: log.append("a")), Side("b", lambda: log.append("b")),
                Side("c", lambda: log.append("c")), check=None, rounds=5, warmup=2)
    assert log == ["a", "b", "c"] * 7
    assert c.order == log
    assert [len(s.times) for s in c.sides] == [5, 5, 5]  # warm-up rounds are not timed


def test_setup_runs_before_each_call_untimed():
    log = []
    c = compare(Side("a", lambda: log.append("a"), setup=lambda: (log.append("sa"), time.sleep(0.02))),
                Side("b", lambda: log.append("b")), check=None, rounds=5, warmup=0)
    assert log == ["sa", "a", "b"] * 5
    assert c.side("a").median < 0.015  # the 20 ms setup is not in the timing


def test_statistics_and_paired_ratio():
    # deterministic sleeps: a takes ~2x b; per-round ratios are paired
    seq_a = iter([0.004, 0.006, 0.008, 0.010, 0.012])
    seq_b = iter([0.002, 0.003, 0.004, 0.005, 0.006])
    c = compare(Side("a", lambda: time.sleep(next(seq_a))), Side("b", lambda: time.sleep(next(seq_b))),
                check=None, rounds=5, warmup=0)
    a, b = c.side("a"), c.side("b")
    assert a.min <= a.q1 <= a.median <= a.q3 <= a.max
    assert 0.008 <= a.median < 0.012 and 0.004 <= b.median < 0.007
    assert 1.3 < c.ratio < 2.6 and abs(c.speedup - 1 / c.ratio) < 1e-12
    d = c.to_dict()
    assert d["ratio"] == c.ratio and len(d["ratios"]) == 5 and d["sides"][0]["rounds"] == 5


def test_quantile_matches_numpy():
    np = pytest.importorskip("numpy")
    xs = [5.0, 1.0, 3.0, 9.0, 7.0, 2.0]
    for q in (0.0, 0.25, 0.5, 0.75, 0.99, 1.0):
        assert harness._quantile(xs, q) == pytest.approx(float(np.quantile(xs, q)))


def test_cpu_per_wall_shows_sleeping_vs_busy():
    def busy():
        t = time.perf_counter()
        while time.perf_counter() - t < 0.01:
            pass

    c = compare(Side("sleep", lambda: time.sleep(0.01)), Side("busy", busy), check=None, rounds=5, warmup=0)
    assert c.side("sleep").cpu_per_wall < 0.3  # waiting, as a starved side would
    assert c.side("busy").cpu_per_wall > 0.3


def test_failing_check_raises():
    with pytest.raises(CheckFailed, match="a and b differ"):
        compare(Side("a", lambda: 1), Side("b", lambda: 2), check=lambda x, y: x == y, rounds=5)
    def raising(x, y):
        assert x == y, "values differ"
    with pytest.raises(CheckFailed, match="values differ"):
        compare(Side("a", lambda: 1), Side("b", lambda: 2), check=raising, rounds=5)
    # a check that passes in warm-up but fails on the last round still raises
    vals = iter(range(100))
    with pytest.raises(CheckFailed, match="last round"):
        compare(Side("a", lambda: 0), Side("b", lambda: next(vals)), check=lambda x, y: x == y, rounds=5)
    c = compare(Side("a", lambda: 3), Side("b", lambda: 3), check=lambda x, y: x == y, rounds=5)
    assert c.checked


def test_bad_arguments():
    s = Side("a", lambda: 0)
    with pytest.raises(ValueError, match="sides"):
        compare(s, check=None)
    with pytest.raises(ValueError, match="rounds"):
        compare(s, Side("b", lambda: 0), check=None, rounds=0)
    with pytest.raises(ValueError, match="distinct"):
        compare(s, Side("a", lambda: 0), check=None)


def test_pin_threads_sets_and_restores():
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    env = os.environ.get("OMP_NUM_THREADS")
    with pin_threads(2) as st:
        assert torch.get_num_threads() == 2 and st["torch"] == 2 and st["OMP_NUM_THREADS"] == "2"
        c = compare(Side("a", lambda: 0), Side("b", lambda: 0, threads=7), check=None, rounds=5)
        assert c.settings["torch"] == 2 and c.side("a").threads == 2 and c.side("b").threads == 7
    assert torch.get_num_threads() == before and os.environ.get("OMP_NUM_THREADS") == env


def test_latencies_alternate_and_check_each_call():
    log = []
    out = latencies(Side("a", None), Side("b", None), calls=[lambda s, j: log.append(("a", j)) or j,
                                                             lambda s, j: log.append(("b", j)) or j],
                    n=6, warmup=1, check=lambda x, y: x == y)
    assert log[:6] == [("a", 0), ("b", 0), ("a", 0), ("b", 0), ("a", 1), ("b", 1)] and len(log) == 14
    assert out["a"]["calls"] == 6 and out["a"]["p50_s"] <= out["a"]["p99_s"]
    with pytest.raises(CheckFailed, match="call 2"):
        latencies(Side("a", None), Side("b", None), calls=[lambda s, j: j, lambda s, j: min(j, 1)], n=5,
                  warmup=0, check=lambda x, y: x == y)


def test_machine_info_states_versions():
    m = harness.machine_info()
    assert m["cores"] >= 1 and "memkern" in m["versions"] and "UTC" in m["date"]
    assert "cores" in harness.fmt_machine(m)


def test_interleaved_add_vs_hnswlib(tmp_path):
    """The shared add loop of bench_store / bench_lexical: both sides get every record, chunk by
    chunk, and its statistics are the per-chunk times it measured."""
    hnswlib = pytest.importorskip("hnswlib")
    import numpy as np

    from memkern.store import MemoryStore

    x = np.random.default_rng(0).standard_normal((250, 8)).astype(np.float32)
    texts = [f"t{i}" for i in range(250)]
    index = hnswlib.Index(space="ip", dim=8)
    index.init_index(max_elements=300, M=8, ef_construction=50, random_seed=100)
    more = np.random.default_rng(1).standard_normal((50, 8)).astype(np.float32)
    with MemoryStore(tmp_path / "s", dim=8, metric="ip", fsync="never") as store:
        r = harness.interleaved_add_vs_hnswlib(store, index, x, texts, chunk=100, namespace="ns")
        assert store.count("ns") == 250 and index.get_current_count() == 250
        ids, _ = store.search("ns", x[:5], k=1)
        # a second call grows the same index: its labels continue from ``start``
        r2 = harness.interleaved_add_vs_hnswlib(store, index, more, texts[:50], chunk=100, namespace="ns", start=250)
        assert store.count("ns") == 300 and sorted(r2["records"]) == list(range(250, 300))
    assert index.get_current_count() == 300
    assert sorted(index.get_ids_list()) == list(range(300))
    assert np.allclose(index.get_items([260])[0], more[10])
    assert sorted(r["records"]) == list(range(250)) and r["records"][120]["summary"] == "t120"
    assert len(r["store_s"]) == len(r["hnswlib_s"]) == 3  # chunks of 100, 100, 50
    assert r["t_store"] == pytest.approx(sum(r["store_s"])) and r["t_base"] == pytest.approx(sum(r["hnswlib_s"]))
    assert r["ratio"] == pytest.approx(r["t_store"] / r["t_base"])
    per_chunk = sorted(a / b for a, b in zip(r["store_s"], r["hnswlib_s"]))
    assert r["ratio_median"] == pytest.approx(per_chunk[1])
    labels, _ = index.knn_query(x[:5], k=1)
    assert labels.ravel().tolist() == ids.ravel().tolist()  # same records on both sides, same order
