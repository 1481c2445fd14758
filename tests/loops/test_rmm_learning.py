"""What RMM's reranker learns from: the shown best memories' citations (greedy slate REINFORCE),
exploration by demotion, the alternative learners of the learning experiment, and one loop with a
real (tiny, random) chat model."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fakes_rmm import FakeStore, HashEmbedder, ScriptedChat
from memkern.eval.learning import CitingChat, HiddenSampleReranker, SwapLastReranker, bootstrap_ci
from memkern.score.reranker import PRESETS, Reranker
from memkern.loops.rmm import RMM
from memkern.loops.rmm.feedback import default_reranker

DIM = 64
K, M = 8, 3


def _store(n=12):
    store = FakeStore(dim=DIM, path=None)
    emb = HashEmbedder(DIM)
    texts = [f"The user fact number {i} about topic{i} and hobby{i % 3}." for i in range(n)]
    for t, e in zip(texts, emb.encode(texts)):
        store.add("u", t, e, turns=[{"role": "user", "content": t}])
    return store, emb


class Spy:
    """Records what reaches ``update``; delegates everything to a real reranker."""

    def __init__(self, rr):
        self.rr = rr
        self.updates = []

    def select(self, *a, **k):
        return self.rr.select(*a, **k)

    def update(self, sel, rewards):
        self.updates.append((sel, torch.as_tensor(rewards).clone()))
        return self.rr.update(sel, rewards)

    def save(self, path):
        self.rr.save(path)


def _positions(sel, row=0):
    idx = sel.indices if sel.indices.dim() == 2 else sel.indices.unsqueeze(0)
    return [int(i) for i in idx[row]]


def test_fresh_rmm_reranker_is_the_rmm_preset():
    rr = default_reranker(DIM, 4, seed=9)
    assert rr.seed == 9 and rr.top_m == 4
    for k, v in PRESETS["rmm"].items():
        assert rr.config()[k] == v, k
    store, emb = _store()
    rmm = RMM(store, chat_model=ScriptedChat(['{"answer": "x", "citations": []}']), embedder=emb, namespace="u",
              top_k=K, top_m=M, seed=4, retrieval="topic", persist=False)
    assert rmm.reranker.config() == default_reranker(DIM, M, seed=4).config()


def test_respond_learns_from_the_citations_of_the_best_memories_it_showed():
    store, emb = _store()
    cites = iter([[1], [0, 2], [], [2]])
    chat = ScriptedChat(lambda m: json.dumps({"answer": "x", "citations": next(cites)}))
    spy = Spy(default_reranker(DIM, M, seed=0))
    rmm = RMM(store, chat_model=chat, embedder=emb, namespace="u", reranker=spy, top_k=K, top_m=M, batch_size=2,
              retrieval="topic", persist=False)
    shown = []
    for q in ("topic1 hobby1?", "topic2 hobby2?", "topic3?", "topic4 hobby1?"):
        best = rmm.retrieve(q).memory_ids                   # the greedy read just before the call
        r = rmm.respond(q)
        assert r.memory_ids == best and not r.explored
        shown.append(r)
    assert len(spy.updates) == 2
    for (sel, R), pair in zip(spy.updates, (shown[:2], shown[2:])):
        assert sel.greedy                                    # the shown best slate, not a draw
        for row, r in enumerate(pair):
            assert len(_positions(sel, row)) == M
            assert R[row].tolist() == r.rewards             # +1 cited / -1 not, in the order shown
    # a later call shows the learned best (the update moved the adapters)
    assert spy.rr.adapter_norm() > 0


def test_an_uncited_shown_memory_makes_way_for_an_unshown_one():
    # exploration by demotion: after an update in which the shown memories of a query went uncited
    # (and another row of the batch had a citation), an unshown candidate of that query overtakes
    # one of them; nothing random was shown
    store, emb = _store()
    q_dead, q_ok = "topic5 hobby2 fact?", "topic7 hobby1?"
    answers = {q_dead: [], q_ok: [0]}
    chat = ScriptedChat(lambda m: json.dumps({"answer": "x", "citations": answers[m[-1]["content"].rsplit(
        "Question: ", 1)[1]]}))
    rmm = RMM(store, chat_model=chat, embedder=emb, namespace="u", top_k=K, top_m=M, batch_size=2,
              retrieval="topic", persist=False)
    before = rmm.retrieve(q_dead).memory_ids
    ranked0 = rmm.retrieve(q_dead, turns=K).memory_ids
    for _ in range(3):
        rmm.respond(q_dead)
        rmm.respond(q_ok)
    after = rmm.retrieve(q_dead).memory_ids
    assert set(after) != set(before)
    newcomer = [i for i in after if i not in before]
    assert newcomer and all(ranked0.index(i) >= M for i in newcomer)   # came from below the shown set


def test_citing_chat_cites_by_the_simulation_rule():
    prompt = ("Memories:\n[0] [2023-05-08] Ann: I adopted a beagle called Pepper last week.\n"
              "    [2023-05-08] Bo: Lovely dog!\n[1] [2023-05-09] Ann: Work was busy today.\n"
              "    [2023-05-09] Bo: I moved to Oslo in the winter and love it.\n[2] Nothing here.\n\n"
              "Question: Where did Bo move?")
    chat = CitingChat({"Where did Bo move?": ["Bo: I moved to Oslo in the winter and love"]})
    out = json.loads(chat.generate([[{"role": "user", "content": prompt}]])[0])
    assert out["citations"] == [1]
    blocks, q = CitingChat.blocks(prompt)
    assert len(blocks) == 3 and q == "Where did Bo move?"
    assert json.loads(chat.generate(["Memories:\n[0] x\n\nQuestion: unknown?"])[0])["citations"] == []


def test_hidden_sample_scores_its_slots_by_the_shown_citations():
    rr = Reranker(DIM, top_m=M, seed=1)
    proxy = HiddenSampleReranker(rr)
    g = torch.Generator().manual_seed(0)
    q, C = torch.randn(2, DIM, generator=g), torch.randn(2, K, DIM, generator=g)
    sel = proxy.select(q, C, greedy=True, prior=torch.zeros(2, K))
    best = rr.select(q, C, greedy=True, prior=torch.zeros(2, K))
    assert torch.equal(sel.indices, best.indices) and sel.greedy      # the user sees the best
    seen = []

    def update(s, R):
        seen.append((s.indices.clone(), torch.as_tensor(R).clone()))

    rr.update = update
    R = torch.tensor([[1.0, -1.0, -1.0], [-1.0, 1.0, -1.0]])
    proxy.update(sel, R)
    (idx, Rh), = seen
    for b in range(2):
        shown = sel.indices[b].tolist()
        for j, h in enumerate(sel.hidden[b].tolist()):
            if h in shown:
                assert idx[b, j] == h and Rh[b, j] == R[b, shown.index(h)]
            else:
                assert idx[b, j] == -1                               # never shown: no reward


def test_swap_last_swaps_in_a_candidate_from_below():
    rr = Reranker(DIM, top_m=M, seed=1)
    g = torch.Generator().manual_seed(3)
    q, C = torch.randn(1, DIM, generator=g), torch.randn(1, K, DIM, generator=g)
    best = rr.select(q, C, greedy=True).indices[0].tolist()
    always = SwapLastReranker(rr, share=1.0, seed=0).select(q, C, greedy=True)
    assert not always.greedy and always.indices[0, :-1].tolist() == best[:-1]
    assert int(always.indices[0, -1]) not in best
    never = SwapLastReranker(rr, share=0.0, seed=0).select(q, C, greedy=True)
    assert never.greedy and never.indices[0].tolist() == best


def test_bootstrap_interval_resamples_questions():
    v = np.array([0.1, 0.1, 0.3, 0.3])
    m, lo, hi = bootstrap_ci(v, np.array(["a", "a", "b", "b"]), n=500)
    assert m == pytest.approx(0.2) and 0.1 <= lo <= m <= hi <= 0.3
    assert bootstrap_ci(np.full(5, 0.5), np.arange(5)) == pytest.approx((0.5, 0.5, 0.5))
    # a question's rows stay together: two groups can only give means 0.1, 0.2 or 0.3
    rng_means = {round(x, 6) for x in np.unique(np.round(
        [bootstrap_ci(v, np.array(["a", "a", "b", "b"]), n=1, seed=s)[1] for s in range(40)], 6))}
    assert rng_means <= {0.1, 0.2, 0.3}


@pytest.mark.slow
def test_the_loop_with_a_real_tiny_chat_model():
    from memkern.models import tiny_chat_model

    chat = tiny_chat_model(seed=0, max_new_tokens=12)
    store, emb = _store()
    rmm = RMM(store, chat_model=chat, embedder=emb, namespace="u", top_k=K, top_m=M, batch_size=2,
              retrieval="topic", persist=False, answer_max_new_tokens=12, cite_fallback=0.0)
    for q in ("topic1 hobby1?", "topic2?", "topic3 hobby0?", "topic4?"):
        best = rmm.retrieve(q).memory_ids
        r = rmm.respond(q)
        assert r.raw and r.memory_ids == best and not r.explored
        assert len(r.rewards) == M and set(r.rewards) <= {1.0, -1.0}
    assert rmm.n_updates == 2 and rmm.pending == 0
