"""memkern.eval.tasks: the memory experiments cut into (seed, configuration, conversations) tasks,
run one after the other here (the Ray path is in test_distributed_eval.py)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from fakes_eval import BatchDependentEmbedder, cached

from memkern.errors import MemkernValueError


@pytest.fixture(scope="module")
def ds():
    from memkern.eval.data import load_dataset

    return load_dataset("dialogues", users=3, sessions=6, seed=1)


def _json(result) -> str:
    from memkern.eval.report import _clean

    d = _clean(result)
    d.pop("timings"), d.pop("environment")
    return json.dumps(d, sort_keys=True)


def _experiments():
    from memkern.eval.granularity import granularity_experiment
    from memkern.eval.retrieval import retrieval_experiment
    from memkern.eval.turn_in_topic import turn_in_topic_experiment

    return [retrieval_experiment(alphas=[1.0], rmm=True, seed=3),
            granularity_experiment(["turn", "chunk4", "topic-embedding"], seed=3),
            turn_in_topic_experiment([0.0, 1.0], ["chunk4", "session"], seed=3)]


def test_plan_cuts_configurations_and_conversations(ds):
    from memkern.eval.data import questions_by_conversation
    from memkern.eval.tasks import Task, plan

    n = len(questions_by_conversation(ds)[0])
    assert n == 3
    retr, gran, tit = _experiments()
    assert plan(retr, ds, 1) == [Task("retrieval", 3, c, (i,)) for c in ("exact", "rmm-default") for i in range(n)]
    assert plan(retr, ds, 2) == [Task("retrieval", 3, c, b) for c in ("exact", "rmm-default") for b in ((0, 1), (2,))]
    assert plan(retr, ds, 0) == [Task("retrieval", 3, c, (0, 1, 2)) for c in ("exact", "rmm-default")]
    assert [(t.config, t.conversations) for t in plan(gran, ds, 1)] == \
        [(g, (i,)) for g in ("turn", "chunk4", "topic-embedding") for i in range(n)]
    assert [(t.config, t.conversations) for t in plan(tit, ds, 3)] == [("chunk4", (0, 1, 2)), ("session", (0, 1, 2))]
    # state carried across conversations (online reranker training): one task per configuration
    from memkern.eval.collapse import CollapseExperiment
    from memkern.eval.reflection import ReflectionExperiment

    assert [(t.config, t.conversations) for t in plan(ReflectionExperiment(presets=("default", "paper")), ds, 1)] == \
        [("default", None), ("paper", None)]
    assert len(plan(CollapseExperiment(presets=("default",), optimizers=("adam", "sgd"), lrs=(0.1, 0.2)), ds, 1)) == 4
    with pytest.raises(MemkernValueError, match="conversations_per_task"):
        plan(retr, ds, -1)


def test_a_task_covers_its_configuration_and_conversations_only(ds):
    from memkern.eval.data import questions_by_conversation
    from memkern.eval.tasks import plan, run_task

    convs = questions_by_conversation(ds)[0]
    retr = _experiments()[0]
    emb = cached()
    for t in plan(retr, ds, 1):
        out = run_task(retr, ds, t, emb)
        want = len(convs[t.conversations[0]][1])
        rows = out.partial["rows"]
        if t.config == "rmm-default":
            assert list(rows) == ["rmm-default"]
        else:
            assert "rmm-default" not in rows and "turn (content)" in rows and "turn+1*texttiling" in rows
        assert all(len(rs) == want for rs in rows.values())
        # the task embedded into its own fork: the run's cache is untouched until the merge
        assert out.embeddings and not emb._mem


@pytest.mark.slow
@pytest.mark.parametrize("k", [0, 1, 2])
def test_local_run_equals_one_loop_over_conversations(ds, k):
    """Whatever the cut, the merged result is the one-loop result (batch-independent vectors):
    rows concatenated in conversation order, every mean taken once over them."""
    from memkern.eval.tasks import run_local

    for exp in _experiments():
        ref = run_local(exp, ds, cached(_Hash(32)), conversations_per_task=3)
        got = run_local(exp, ds, cached(_Hash(32)), conversations_per_task=k)
        assert _json(got) == _json(ref), exp.name


class _Hash(BatchDependentEmbedder):
    """The hash embedder, batch independent."""

    model_name = "hash"

    def encode(self, texts, kind: str = "passage", progress: bool = False, **kw):
        return super(BatchDependentEmbedder, self).encode(texts, kind)


@pytest.mark.slow
def test_recall_is_the_mean_over_every_question_of_every_conversation(ds):
    """The merge averages the rows of all conversations once (not a mean of per-task means)."""
    from memkern.eval.data import questions_by_conversation
    from memkern.eval.tasks import plan, run_local, run_task

    retr = _experiments()[0]
    r = run_local(retr, ds, cached(), conversations_per_task=1)
    emb = cached()
    rows = [row for t in plan(retr, ds, 1) if t.config == "exact"
            for row in run_task(retr, ds, t, emb).partial["rows"]["turn (content)"]]
    assert r.metrics["turn (content)"]["questions"] == len(rows) == sum(len(q) for _, q in questions_by_conversation(ds)[0])
    assert r.metrics["turn (content)"]["recall@5turns"] == float(np.mean([x["recall@5turns"] for x in rows]))


@pytest.mark.slow
def test_cache_gets_every_tasks_vectors_in_plan_order(ds):
    from memkern.eval.tasks import plan, run_local, run_task

    retr = _experiments()[0]
    emb = cached()
    run_local(retr, ds, emb, conversations_per_task=1)
    want: dict = {}
    for t in plan(retr, ds, 1):
        for k, v in run_task(retr, ds, t, cached()).embeddings.items():
            want.setdefault(k, v)
    assert list(emb._mem) == list(want)
    assert all(np.array_equal(emb._mem[k], want[k]) for k in want)


def test_fork_sees_a_snapshot_and_returns_what_it_embedded():
    emb = cached()
    emb.encode(["a b"])
    f = emb.fork()
    f.encode(["a b", "c d"])
    assert list(f.added()) == [emb._key(emb.model_name, "passage", "c d")]
    assert len(emb._mem) == 1 and f.path is None
    with pytest.raises(MemkernValueError, match="fork"):
        emb.added()
    emb.absorb(f.added())
    assert len(emb._mem) == 2


def test_result_rows_in_plan_order(ds):
    """Result keys follow the configurations; each row list is in conversation order."""
    from memkern.eval.tasks import TaskOutput, Task, concat_rows, run_local

    r = run_local(_experiments()[0], ds, cached(_Hash(32)), conversations_per_task=1)
    assert list(r.metrics) == ["turn (speaker)", "turn (content)", "turn (template)", "lexical (template)",
                               "hybrid (content)", "hybrid (template)",
                               "hybrid (content, all turns)", "window4", "turn+1*window4",
                               "hybrid (content)+1*window4", "texttiling", "turn+1*texttiling",
                               "hybrid (content)+1*texttiling", "rmm-default"]
    outs = [TaskOutput(Task("x", 0, c, (i,)), {"rows": {c: [i]}}, {}, 0.0) for c in ("a", "b") for i in range(3)]
    assert concat_rows(outs) == {"a": [0, 1, 2], "b": [0, 1, 2]}
