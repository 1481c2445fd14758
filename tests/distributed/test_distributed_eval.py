"""``memkern eval memory ... --ray``: the same JSON as the local run, bit for bit, with the same
seeds, from (seed, configuration, conversations) tasks."""
from __future__ import annotations

import json

import pytest

from _ray_local import local_ray
from fakes_eval import cached


@pytest.fixture(scope="module")
def ray():
    r = local_ray()
    import fakes_embed
    import fakes_eval

    # the test embedders travel by value: Ray workers do not have tests/ on their path
    for m in (fakes_embed, fakes_eval):
        r.cloudpickle.register_pickle_by_value(m)
    return r


def _strip(x):
    """The result without its wall-clock fields (timings, timestamps): those are all that may differ."""
    if isinstance(x, dict):
        return {k: _strip(v) for k, v in x.items()
                if k not in ("timings", "environment") and not k.endswith("seconds")}
    if isinstance(x, list):
        return [_strip(v) for v in x]
    return x


def _dump(r) -> str:
    from memkern.eval.report import _clean

    return json.dumps(_strip(_clean(r)), sort_keys=True)


@pytest.mark.slow
def test_ray_tasks_equal_local_tasks(ray):
    """Four experiments x two seeds, every configuration and conversation its own Ray task, with an
    embedder whose vectors depend on the batch (cold cache): the merged results equal the local
    ones, and the driver's cache ends up with the same vectors in the same order."""
    import numpy as np

    from memkern.eval.data import load_dataset
    from memkern.eval.granularity import granularity_experiment
    from memkern.eval.reflection import ReflectionExperiment
    from memkern.eval.retrieval import retrieval_experiment
    from memkern.eval.tasks import plan, run_experiments
    from memkern.eval.turn_in_topic import turn_in_topic_experiment

    runs = []
    for seed in (0, 1):
        ds = load_dataset("dialogues", users=2, sessions=6, seed=seed)
        runs += [(retrieval_experiment(alphas=[1.0], rmm=False, seed=seed), ds),
                 (granularity_experiment(["turn", "session", "topic-embedding"], seed=seed), ds),
                 (turn_in_topic_experiment([0.0, 1.0], ["chunk4", "topic-embedding"], seed=seed), ds),
                 (ReflectionExperiment(presets=("default", "paper"), seed=seed,
                                       kwargs=dict(seeds=[seed], batch_size=4, eval_every=8)), ds)]
    # per conversation (2) for every configuration; reflection per preset only (online training)
    assert sum(len(plan(e, d, 1)) for e, d in runs) == 2 * (2 + 3 * 2 + 2 * 2 + 2)
    local_emb, ray_emb = cached(), cached()
    local = run_experiments(runs, local_emb, conversations_per_task=1)
    remote = run_experiments(runs, ray_emb, conversations_per_task=1, use_ray=True)
    assert not any(isinstance(r, BaseException) for r in local + remote)
    for a, b in zip(local, remote):
        assert _dump(a) == _dump(b)
    assert [_dump(r) for r in local[:4]] != [_dump(r) for r in local[4:]]  # the seeds differ
    assert list(local_emb._mem) == list(ray_emb._mem)
    assert all(np.array_equal(local_emb._mem[k], ray_emb._mem[k]) for k in local_emb._mem)


@pytest.mark.slow
def test_cli_ray_equals_local(ray, tmp_path, capsys, monkeypatch):
    """The CLI on the real MiniLM: the retrieval experiment, two seeds, every conversation its own
    task. The Ray run reads the cache the local run wrote (cold-cache equality with a
    batch-dependent embedder is the test above)."""
    import memkern.models
    from memkern.cli import main

    minilm = memkern.models.Embedder()  # loaded once for both runs (the slow part on 2 shared cores)
    monkeypatch.setattr(memkern.models, "Embedder", lambda *a, **kw: minilm)

    common = ["eval", "memory", "retrieval", "--seeds", "0", "1", "--quiet", "--users", "2", "--sessions", "4",
              "--alphas", "1", "--no-rmm", "--task-conversations", "1", "--cache-dir", str(tmp_path / "cache")]
    assert main(common + ["--out", str(tmp_path / "local")]) == 0
    assert main(common + ["--out", str(tmp_path / "ray"), "--ray"]) == 0
    capsys.readouterr()
    (a,) = (tmp_path / "local").glob("retrieval-*.json")
    (b,) = (tmp_path / "ray").glob("retrieval-*.json")
    ra, rb = json.loads(a.read_text()), json.loads(b.read_text())
    assert ra["config"]["aggregated_over"] == 2 and len(rb["per_seed"]) == 2
    assert ra["per_seed"][0]["metrics"]["turn+1*texttiling"]["questions"] > 0
    # everything but the wall-clock fields is identical, floats to the bit
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
    # a job argument that is an ObjectRef is fetched in the task
    ref = ray.put([4.0, 6.0])
    assert run_jobs(mean_std, [(ref,)]) == [mean_std([4.0, 6.0])]


def test_a_failed_task_fails_its_run_only(ray):
    from memkern.errors import MemkernValueError
    from memkern.eval.data import load_dataset
    from memkern.eval.granularity import granularity_experiment
    from memkern.eval.tasks import run_experiments

    ds = load_dataset("dialogues", users=2, sessions=6, seed=0)
    bad = granularity_experiment(["turn"], seed=0)
    object.__setattr__(bad, "granularities", ("turn", "nope"))  # fails inside its task
    for use_ray in (False, True):
        got = run_experiments([(bad, ds), (granularity_experiment(["turn"], seed=0), ds)], cached(),
                              conversations_per_task=1, use_ray=use_ray)
        assert isinstance(got[0], MemkernValueError) and "granularity" in str(got[0])
        assert got[1].metrics["turn"]["questions"] > 0
