"""``memkern eval memory ... --ray``: the same JSON as the local run, bit for bit, with the same seeds."""
from __future__ import annotations

import json

import pytest

from _ray_local import local_ray


@pytest.fixture(scope="module")
def ray():
    return local_ray()


def _strip(x):
    """The result without its wall-clock fields (timings, timestamps): those are all that may differ."""
    if isinstance(x, dict):
        return {k: _strip(v) for k, v in x.items()
                if k not in ("timings", "environment") and not k.endswith("seconds")}
    if isinstance(x, list):
        return [_strip(v) for v in x]
    return x


def test_ray_eval_equals_local(ray, tmp_path, capsys):
    from memkern.cli import main

    common = ["eval", "memory", "reflection", "--users", "1", "--sessions", "4", "--seeds", "0", "1", "--quiet",
              "--presets", "default", "--eval-every", "8", "--cache-dir", str(tmp_path / "cache")]
    assert main(common + ["--out", str(tmp_path / "local")]) == 0
    assert main(common + ["--out", str(tmp_path / "ray"), "--ray"]) == 0
    capsys.readouterr()
    (a,) = (tmp_path / "local").glob("reflection-*.json")
    (b,) = (tmp_path / "ray").glob("reflection-*.json")
    ra, rb = json.loads(a.read_text()), json.loads(b.read_text())
    assert ra["config"]["aggregated_over"] == 2 and len(rb["per_seed"]) == 2
    # the plot paths name their own output folders; everything else is identical, floats to the bit
    for r in (ra, rb):
        for s in r["per_seed"]:
            s["config"].pop("plot")
        r["config"].pop("plot")
    assert json.dumps(_strip(ra), sort_keys=True) == json.dumps(_strip(rb), sort_keys=True)
    # and the seeds did differ (the comparison is not between two copies of one run)
    assert ra["per_seed"][0]["dataset"]["hash"] != ra["per_seed"][1]["dataset"]["hash"]


def test_run_jobs_keeps_order_and_errors(ray):
    from memkern.distributed.evaluate import JobFailed, run_jobs
    from memkern.errors import MemkernValueError
    from memkern.eval.metrics import mean_std

    out = run_jobs(mean_std, [([1.0, 2.0, 3.0],), ([5.0],), ([2.0, 2.0],)])
    assert out == [mean_std([1.0, 2.0, 3.0]), mean_std([5.0]), mean_std([2.0, 2.0])]
    from memkern.eval.data import load_dataset

    got = run_jobs(load_dataset, [("nope",), ("generated",)], shared={"users": 1, "sessions": 4},
                   return_exceptions=True)
    assert isinstance(got[0], JobFailed) and isinstance(got[0].error, MemkernValueError)
    assert got[1].content_hash() == load_dataset("generated", users=1, sessions=4).content_hash()
    with pytest.raises(MemkernValueError, match="source"):
        run_jobs(load_dataset, [("nope",)])
