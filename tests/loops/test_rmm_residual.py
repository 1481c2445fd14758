"""A turn budget read (``RMM.retrieve(q, turns=N)``) scores each turn by its first-stage score
plus what the reranker learned about its memory (the reranker's score minus its prior), so a
trained reranker moves the turns a user is shown, and a fresh one shows the first stage's."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from memkern import InMemoryStore, MemoryStore
from memkern.loops.rmm.feedback import default_reranker
from memkern.loops.rmm.retrieve import _learned_residual
from test_rmm_default import DIM, bank


class Boost:
    """A reranker that adds ``bonus`` to the score of the candidate whose store id is ``target``
    (as a trained reranker's residual would); delegates everything else to a real reranker."""

    def __init__(self, rr, ids, target, bonus):
        self.rr, self.ids, self.target, self.bonus = rr, ids, target, bonus

    def __getattr__(self, name):
        return getattr(self.__dict__["rr"], name)

    def select(self, q, candidates, mask=None, greedy=False, m=None, prior=None, **kw):
        ids = self.ids
        prior = prior.clone()
        for pos, i in enumerate(ids):
            if int(i) == self.target:
                prior[0, pos] += self.bonus
        sel = self.rr.select(q, candidates, mask=mask, greedy=greedy, m=m, prior=prior, **kw)
        # report the unboosted prior: the boost is what this reranker "learned"
        return dataclasses.replace(sel, prior=_unboost(prior, ids, self.target, self.bonus))


def _unboost(prior, ids, target, bonus):
    out = prior.clone()
    for pos, i in enumerate(ids):
        if int(i) == target:
            out[0, pos] -= bonus
    return out


@pytest.fixture(params=["native", "inmemory"])
def store(request, tmp_path):
    s = MemoryStore(tmp_path / "s", dim=DIM, metric="cos") if request.param == "native" else InMemoryStore(DIM, "cos")
    yield s
    s.close()


def _candidates(rmm, emb, q, budget):
    timings: dict = {}
    qv = emb.encode([q], kind="query")
    ids, _, _, _, groups = rmm._retrieve_and_rerank(qv, timings, order_all=True, explore=0.0,
                                                     search_kw=rmm._first_stage(q, budget, {}))
    return ids, groups


def test_the_learned_residual_moves_the_turns_of_a_budget_read(store):
    rmm, emb = bank(store, top_k=8)
    q, budget = "Ann adopted which puppy?", 3
    ids, groups = _candidates(rmm, emb, q, budget)
    first = rmm.retrieve(q, turns=budget)
    # a fresh reranker: the first stage's best turns
    by_score = sorted(((s, t) for g in groups.values() for t, s in zip(g.turn_ids, g.scores)), key=lambda x: -x[0])
    assert sorted(t for ts in first.record_ids for t in ts) == sorted(t for _, t in by_score[:budget])
    # the last candidate memory, none of whose turns is shown, learned a large bonus
    target = int(ids[-1])
    assert not set(groups[target].turn_ids) & {t for ts in first.record_ids for t in ts}
    bonus = 10.0
    rmm._reranker = Boost(rmm.reranker, ids, target, bonus)
    got = rmm.retrieve(q, turns=budget)
    want = sorted(((s + (bonus if i == target else 0.0), t) for i, g in groups.items()
                   for t, s in zip(g.turn_ids, g.scores)), key=lambda x: -x[0])[:budget]
    assert sorted(t for ts in got.record_ids for t in ts) == sorted(t for _, t in want)
    assert got.memory_ids[0] == target and set(groups[target].turn_ids) <= set(got.record_ids[0])


def test_learned_residual_is_score_minus_prior():
    rr = default_reranker(DIM, 3, seed=0)
    g = torch.Generator().manual_seed(0)
    q = torch.nn.functional.normalize(torch.randn(1, DIM, generator=g), dim=-1)
    cand = torch.nn.functional.normalize(torch.randn(1, 6, DIM, generator=g), dim=-1)
    prior = torch.linspace(1.0, 0.0, 6).reshape(1, 6)
    ids = np.arange(100, 106, dtype=np.int64)
    fresh = _learned_residual(ids[:4], rr.select(q, cand, greedy=True, m=6, prior=prior))
    assert list(fresh) == [100, 101, 102, 103] and all(v == 0.0 for v in fresh.values())
    with torch.no_grad():
        rr.Wq.copy_(0.3 * torch.randn(DIM, DIM, generator=g) / DIM ** 0.5)
    sel = rr.select(q, cand, greedy=True, m=6, prior=prior)
    res = _learned_residual(ids, sel)
    want = (sel.scores - prior).reshape(-1)
    assert np.allclose([res[int(i)] for i in ids], want.numpy(), atol=1e-6) and float(want.abs().max()) > 1e-3
    assert _learned_residual(ids, None) is None
    assert _learned_residual(ids, dataclasses.replace(sel, prior=None)) is None
