"""The learning experiment end to end on generated dialogues (hash embedder), and its CLI."""
from __future__ import annotations

import json
import math

import pytest

from fakes_rmm import HashEmbedder
from memkern.data import generate_dialogues
from memkern.errors import MemkernValueError
from memkern.eval import report
from memkern.eval.learning import ARMS, learning_experiment, run_learning
from memkern.eval.units import CachedEmbedder


@pytest.fixture(scope="module")
def dialogues():
    return generate_dialogues(2, 6, seed=1)


@pytest.fixture
def emb():
    return CachedEmbedder(HashEmbedder(48), cache_dir=None)


@pytest.mark.slow
def test_every_arm_runs_and_what_is_shown_is_accounted_for(dialogues, emb, tmp_path):
    res = run_learning(dialogues, emb=emb, splits=2, seed=3)
    m = res.metrics
    assert [a for a in m if a != "rows"] == list(ARMS)
    rows = m["rows"]
    n_q = sum(1 for c in dialogues.conversations for q in c.questions
              if q.evidence_turn_ids and q.question_type != "adversarial")
    for arm in ARMS:
        test = [r for r in rows if r["arm"] == arm and r["phase"] == "test"]
        train = [r for r in rows if r["arm"] == arm and r["phase"] == "train"]
        assert len(test) + (len(train) if arm != "direct" else len(test)) == 2 * n_q or arm == "direct"
        h = m[arm]["heldout"]["5"]
        assert h["questions"] == len(test) and h["delta_lo"] <= h["delta"] <= h["delta_hi"]
    # the greedy read is what respond shows: no cost, no exploration
    zero = dict(delta=0.0, delta_lo=0.0, delta_hi=0.0)
    assert m["greedy"]["shown_minus_greedy"] == zero and m["greedy"]["explored"] == 0.0
    assert m["hidden"]["shown_minus_greedy"] == zero
    assert m["explore=1"]["explored"] == 1.0 and 0.0 <= m["explore=0.05"]["explored"] < 0.5
    assert 0.0 < m["swap-last"]["explored"] < 1.0
    # every RMM arm starts from the same fresh reranker: equal "before" rows question by question
    before = {}
    for r in rows:
        if r["phase"] == "test" and r["arm"] != "direct":
            before.setdefault((r["split"], r["question_id"]), set()).add(r["before@5"])
    assert all(len(v) == 1 for v in before.values())
    assert "direct" in m and "shown" not in m["direct"]
    table = res.format_table()
    assert "greedy" in table and "(not through RMM)" in table
    agg = report.aggregate([res, res])                    # several seeds: mean and spread tables
    assert "std over 2 runs" in report.format_aggregate(agg)
    p = report.write_result(res, tmp_path / "learning.json")
    back = json.loads(p.read_text())
    assert back["config"]["experiment"] == "learning" and "greedy" in report.format_table(back)


def test_pooled_learning_shares_one_reranker(dialogues, emb):
    res = run_learning(dialogues, emb=emb, splits=1, arms=("greedy",), pool=True)
    updates = {r["updates"] for r in res.metrics["rows"] if r["phase"] == "test"}
    train = [r for r in res.metrics["rows"] if r["phase"] == "train"]
    assert len(updates) == 1                  # one reranker: the same step count for every conversation
    assert len({r["conversation"] for r in train}) == 2


def test_bad_options_are_named():
    with pytest.raises(MemkernValueError, match="arms"):
        learning_experiment(arms=("greedy", "explore=2"))
    with pytest.raises(MemkernValueError, match="splits"):
        learning_experiment(splits=0)
    with pytest.raises(MemkernValueError, match="test_frac"):
        learning_experiment(test_frac=1.0)


@pytest.mark.slow
def test_cli_learning_experiment(tmp_path, capsys):
    from memkern.cli import main

    rc = main(["eval", "memory", "learning", "--data", "dialogues", "--users", "1", "--sessions", "6", "--seeds", "0",
               "--learning-splits", "1", "--learning-arms", "greedy", "explore=1", "--out", str(tmp_path), "--quiet",
               "--cache-dir", str(tmp_path / "c")])
    assert rc == 0
    out = capsys.readouterr().out
    assert "greedy" in out and "explore=1" in out and "shown-greedy" in out
    (p,) = tmp_path.glob("learning-*.json")
    res = json.loads(p.read_text())
    assert res["config"]["arms"] == ["greedy", "explore=1"]
    assert not math.isnan(res["metrics_mean"]["greedy"]["shown"])
    assert res["metrics_mean"]["explore=1"]["explored"] == 1.0
    assert main(["eval", "memory", "learning", "--conversations", "conv-26", "--out", str(tmp_path)]) == 2
    assert "--conversations" in capsys.readouterr().err


def test_the_greedy_read_compared_with_a_call_is_the_one_before_it(dialogues, emb):
    # every call updates the reranker (batch 1, large steps): a greedy read taken after the call differs
    res = run_learning(dialogues, emb=emb, splits=1, arms=("greedy",), batch_size=1,
                       reranker_kwargs=dict(lr=5.0, max_norm=50.0, clip_grad_norm=None))
    assert res.metrics["greedy"]["shown_minus_greedy"] == dict(delta=0.0, delta_lo=0.0, delta_hi=0.0)
    train = [r for r in res.metrics["rows"] if r["phase"] == "train"]
    assert all(r["shown"] == r["greedy"] for r in train)
