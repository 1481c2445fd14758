"""RMM reads greedily and explores only to learn: retrieve and respond show the reranker's best
memories; exploration (``RMMConfig.explore``, a share of respond calls) draws from the reranker's
own Philox stream, which advances per call, is reproducible from the seed and survives a reopen."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fakes_rmm import FakeStore, HashEmbedder, ScriptedChat
from memkern.errors import MemkernValueError
from memkern.score.reranker import Reranker
from memkern.loops.rmm import RMM, RMMConfig

DIM = 64
K, M = 8, 3
QUERIES = [f"topic{i} hobby{i % 3}?" for i in range(8)]


def _store(tmp_path, n=16, name="fake"):
    store = FakeStore(dim=DIM, path=str(tmp_path / name))
    emb = HashEmbedder(DIM)
    texts = [f"The user fact number {i} about topic{i} and hobby{i % 3}." for i in range(n)]
    for t, e in zip(texts, emb.encode(texts)):
        store.add("u", t, e, turns=[{"role": "user", "content": t}])
    return store, emb


def _noisy_reranker(seed=0):
    """A reranker whose best memories differ from the retriever's order (random adapters)."""
    rr = Reranker(DIM, top_m=M, seed=seed)
    g = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        rr.Wq.copy_(torch.randn(DIM, DIM, generator=g) * 0.4)
        rr.Wm.copy_(torch.randn(DIM, DIM, generator=g) * 0.4)
    return rr


def _rmm(store, emb, chat=None, **kw):
    args = dict(chat_model=chat or ScriptedChat(lambda m: '{"answer": "x", "citations": [0]}'), embedder=emb,
                namespace="u", top_k=K, top_m=M, batch_size=100, retrieval="topic")
    args.update(kw)
    return RMM(store, **args)


def _best(rmm, query):
    """The reranker's top-M of the query's candidates, by score (what greedy must show)."""
    q = rmm.embedder.encode([query], kind="query")
    ids, _ = rmm.store.search("u", q, k=K)
    ids = ids[0][ids[0] >= 0]
    cand = torch.from_numpy(np.asarray(rmm.store.embeddings(ids), np.float32))
    s = rmm.reranker.scores(torch.from_numpy(q[0]), cand)
    return [int(ids[i]) for i in torch.argsort(s, descending=True, stable=True)[:M]]


def test_default_config_reads_greedily():
    cfg = RMMConfig()
    assert cfg.explore == 0.0
    assert RMMConfig(explore=True).explore == 1.0 and RMMConfig(explore=False).explore == 0.0
    for bad in (-0.1, 1.5, float("nan"), "0.1"):
        with pytest.raises(MemkernValueError, match="explore"):
            RMMConfig(explore=bad)


def test_retrieve_and_respond_show_the_best_memories_every_call(tmp_path):
    store, emb = _store(tmp_path)
    rmm = _rmm(store, emb, reranker=_noisy_reranker())
    for q in QUERIES:
        best = _best(rmm, q)
        shown = [rmm.retrieve(q).memory_ids for _ in range(3)]
        assert shown == [best] * 3, q                      # deterministic, and the reranker's best
        r = rmm.respond(q)
        assert r.memory_ids == best and not r.explored and r.selection.greedy
    assert rmm.reranker._offset == 0                       # nothing drew from the random stream


def test_retrieve_refuses_to_explore(tmp_path):
    store, emb = _store(tmp_path)
    rmm = _rmm(store, emb, explore=1.0)
    with pytest.raises(MemkernValueError, match="explore"):
        rmm.retrieve(QUERIES[0], explore=True)
    best = _best(rmm, QUERIES[0])
    assert rmm.retrieve(QUERIES[0]).memory_ids == best     # even with explore=1.0 in the config
    assert rmm.retrieve(QUERIES[0], turns=2, explore=False).n_turns == 2


def _draws(rmm, n, query=QUERIES[1]):
    out = []
    for _ in range(n):
        r = rmm.respond(query)
        out.append((r.memory_ids, int(r.selection.offset), r.explored))
    return out


def test_exploration_noise_advances_per_call_and_is_reproducible(tmp_path):
    store, emb = _store(tmp_path)
    a = _draws(_rmm(store, emb, explore=1.0, seed=7, persist=False), 12)
    assert [o for _, o, _ in a] == [K * i for i in range(12)]     # the counter advances per call
    assert all(e for _, _, e in a)
    assert len({tuple(ids) for ids, _, _ in a}) > 3                # so the draws differ
    store2, emb2 = _store(tmp_path, name="again")
    b = _draws(_rmm(store2, emb2, explore=1.0, seed=7, persist=False), 12)
    assert [ids for ids, _, _ in a] == [ids for ids, _, _ in b]      # reproducible from the seed
    store3, emb3 = _store(tmp_path, name="other")
    c = _draws(_rmm(store3, emb3, explore=1.0, seed=8, persist=False), 12)
    assert [ids for ids, _, _ in a] != [ids for ids, _, _ in c]


def test_reopened_rmm_continues_the_stream(tmp_path):
    store, emb = _store(tmp_path)
    first = _rmm(store, emb, explore=1.0, seed=3, batch_size=2)
    before = _draws(first, 5)
    first.close()
    reopened = _rmm(store, emb, explore=1.0, seed=3, batch_size=2)
    after = _draws(reopened, 3)
    assert [o for _, o, _ in after] == [K * i for i in range(5, 8)]  # no replay of old noise
    # the same stream as one RMM that never closed (updates included: batch_size 2, saved state)
    store2, emb2 = _store(tmp_path, name="once")
    once = _draws(_rmm(store2, emb2, explore=1.0, seed=3, batch_size=2), 8)
    assert [ids for ids, _, _ in before + after] == [ids for ids, _, _ in once]


def test_explore_share_is_a_logged_coin_from_the_stream(tmp_path):
    store, emb = _store(tmp_path)
    rmm = _rmm(store, emb, explore=0.25, seed=5, persist=False, batch_size=1000, reranker=_noisy_reranker(seed=5))
    got = _draws(rmm, 200, query=QUERIES[2])
    explored = np.array([e for _, _, e in got])
    assert 0.15 < explored.mean() < 0.35                          # ~ the share asked for
    assert rmm.reranker._offset == 200 * K                         # every call drew (the stream advanced)
    assert [o for _, o, e in got if e] == [K * i for i, (_, _, e) in enumerate(got) if e]
    from memkern.ops import philox_uniform
    from memkern.loops.rmm.retrieve import EXPLORE_COIN_KEY

    coins = philox_uniform(5 ^ EXPLORE_COIN_KEY, torch.arange(200, dtype=torch.int64) * K)
    assert explored.tolist() == (coins < 0.25).tolist()
    best = _best(rmm, QUERIES[2])
    assert all(ids == best for ids, _, e in got if not e)          # the other calls show the best
