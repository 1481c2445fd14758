"""RMM.arespond / aend_session under asyncio.gather, the RMM lock, and RMM.feedback.

The chat model sleeps in generate (releasing the GIL, as a real model does), so concurrent
responses on one RMM really interleave: without the lock, a flush running while another response
appends its rewards clears rewards that never reached the reranker.
"""
from __future__ import annotations

import asyncio
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import memkern

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "helpers"))
from fakes_rmm import HashEmbedder  # noqa: E402


class SlowChat:
    """Cites memory 0; sleeps in generate; counts the calls running at once."""

    def __init__(self, delay: float = 0.004):
        self.delay = delay
        self.active = 0
        self.max_active = 0
        self._guard = threading.Lock()

    def generate(self, prompts, max_new_tokens=None, json=False, temperature=0.0, seed=None):
        with self._guard:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        time.sleep(self.delay)
        with self._guard:
            self.active -= 1
        return ['{"answer": "ok", "citations": [0]}' for _ in prompts]

    def count_tokens(self, text):
        return len(text.split())


class CountingReranker(memkern.Reranker):
    """A real reranker that counts the response rows each update trains on."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.rows_trained = 0
        self.seen_rewards: list[np.ndarray] = []

    def update(self, selection, rewards):
        time.sleep(0.002)  # a slow step widens any race between flush and append
        self.rows_trained += int(np.asarray(rewards).shape[0])
        self.seen_rewards.append(np.asarray(rewards))
        return super().update(selection, rewards)


def _rmm(tmp_path, n_facts=8, **kw):
    store = memkern.MemoryStore(tmp_path / "s", dim=64, metric="cos")
    emb = HashEmbedder(64)
    facts = [f"fact {i} about the garden and plants number {i}" for i in range(n_facts)]
    store.add_batch("u", facts, emb.encode(facts))
    rr = CountingReranker(64, top_m=2)
    rmm = memkern.RMM(store, chat_model=SlowChat(), embedder=emb, reranker=rr, namespace="u", extractor="embedding",
                      top_k=6, top_m=2, persist=False, **kw)
    return store, rmm, rr


def test_arespond_under_gather_uses_every_reward_once(tmp_path):
    store, rmm, rr = _rmm(tmp_path, batch_size=3)

    async def main():
        with ThreadPoolExecutor(8) as ex:
            return await asyncio.gather(*(rmm.arespond(f"what about plants {i}?", executor=ex) for i in range(24)))

    responses = asyncio.run(main())
    assert len(responses) == 24 and all(r.answer == "ok" and len(r.memory_ids) == 2 for r in responses)
    assert all(r.selection is not None for r in responses)
    assert rmm.n_responses == 24
    # every response's rewards trained the reranker exactly once (or wait in the buffer)
    assert rr.rows_trained + rmm.pending == 24 and rmm.n_updates == 8 and rmm.pending == 0
    # responses ran one at a time on this RMM (the lock), each with its own draw seed
    assert rmm.chat_model.max_active == 1
    store.close()


def test_arespond_does_not_block_the_event_loop(tmp_path):
    store, rmm, _ = _rmm(tmp_path, batch_size=100)
    rmm.chat_model.delay = 0.05
    ticks = []

    async def ticker():
        for _ in range(10):
            ticks.append(time.perf_counter())
            await asyncio.sleep(0.005)

    async def main():
        await asyncio.gather(rmm.arespond("plants?"), ticker())

    asyncio.run(main())
    assert len(ticks) == 10 and max(np.diff(ticks)) < 0.045  # the loop kept running during generate
    store.close()


def test_two_rmms_respond_in_parallel(tmp_path):
    """The lock is per RMM: two namespaces' responses overlap."""
    store = memkern.MemoryStore(tmp_path / "s", dim=64, metric="cos")
    emb, chat = HashEmbedder(64), SlowChat(delay=0.05)
    for ns in ("a", "b"):
        store.add_batch(ns, [f"{ns} likes tea"], emb.encode([f"{ns} likes tea"]))
    rmms = [memkern.RMM(store, chat_model=chat, embedder=emb, namespace=ns, extractor="embedding", persist=False)
            for ns in ("a", "b")]

    async def main():
        await asyncio.gather(*(r.arespond("tea?") for r in rmms for _ in range(2)))

    asyncio.run(main())
    assert chat.max_active == 2
    store.close()


def test_aend_session_serialises_prospective_reflection(tmp_path):
    """Concurrent end_session calls of one fact on one RMM: one ADD, the rest NOOP."""
    store = memkern.MemoryStore(tmp_path / "s", dim=64, metric="cos")

    class SlowEmb(HashEmbedder):
        def encode(self, texts, kind="passage", **kw):
            time.sleep(0.003)
            return super().encode(texts, kind, **kw)

    rmm = memkern.RMM(store, chat_model=SlowChat(), embedder=SlowEmb(64), namespace="u", extractor="embedding",
                      persist=False)
    _six_concurrent_sessions_store_one_fact(rmm, store)


def test_end_sessions_holds_the_lock_from_search_to_write(tmp_path):
    """The race of unlocked end_session calls made certain: a decider that sleeps between the
    candidate search and the write. Under the RMM lock the calls serialise (one ADD, the rest
    NOOP); without it every call searches the empty bank first and adds (the fact stored 6 times),
    whatever the thread scheduling."""
    store = memkern.MemoryStore(tmp_path / "s", dim=64, metric="cos")

    from memkern.ingest.apply import EmbeddingDecider

    class SlowDecider(EmbeddingDecider):
        def decide_batch(self, items, seed=0):
            time.sleep(0.1)          # releases the GIL: the other calls run their search meanwhile
            return super().decide_batch(items, seed)

    rmm = memkern.RMM(store, chat_model=SlowChat(), embedder=HashEmbedder(64), namespace="u",
                      extractor="embedding", decider=SlowDecider(), persist=False)
    _six_concurrent_sessions_store_one_fact(rmm, store)


def test_feedback_trains_on_the_responses_draw(tmp_path):
    store, rmm, rr = _rmm(tmp_path, batch_size=2)
    r = rmm.respond("plants?")
    assert rmm.pending == 1 and r.rewards == [1.0, -1.0]  # SlowChat cites memory 0
    assert rmm.feedback(r, [-1.0, 0.5]) is True
    assert rmm.pending == 0 and rmm.n_updates == 1 and rr.rows_trained == 2
    # one update on both rows: the citation rewards, then the feedback, with the same draw
    np.testing.assert_array_equal(rr.seen_rewards[0], [[1.0, -1.0], [-1.0, 0.5]])
    for bad in ([1.0], [1.0, 2.0], "ab", [True, 1.0], None):
        with pytest.raises(memkern.MemkernValueError, match="rewards"):
            rmm.feedback(r, bad)
    with pytest.raises(memkern.MemkernTypeError, match="response"):
        rmm.feedback("not a response", [1.0])
    assert rmm.pending == 0
    # nothing chosen (every candidate shown): nothing to learn
    small, rmm2, _ = _rmm(tmp_path / "small", n_facts=2, batch_size=2)
    r2 = rmm2.respond("plants?")
    assert r2.selection is None and rmm2.feedback(r2, [1.0, 1.0]) is False and rmm2.pending == 0
    store.close()
    small.close()


def test_aretrieve_under_gather_equals_retrieve(tmp_path):
    """aretrieve runs retrieve in a thread pool under the RMM's lock: the same memories and turn
    ids as the synchronous call, for every query, while responses train the reranker."""
    store, rmm, rr = _rmm(tmp_path, batch_size=2, explore=False)
    queries = [f"what about plants {i}?" for i in range(8)]
    want = [rmm.retrieve(q, turns=3) for q in queries]

    async def main():
        with ThreadPoolExecutor(4) as ex:
            return await asyncio.gather(*(rmm.aretrieve(q, 3, executor=ex) for q in queries))

    got = asyncio.run(main())
    assert [g.memory_ids for g in got] == [w.memory_ids for w in want]
    assert [g.turn_ids for g in got] == [w.turn_ids for w in want]
    assert all(g.budget == 3 for g in got)
    store.close()


def test_aend_session_takes_the_date_like_end_session(tmp_path):
    """aend_session(turns, session_id, date, timestamp=...) passes each argument where
    end_session takes it (the date is stored with every turn)."""
    store = memkern.MemoryStore(tmp_path / "s", dim=64, metric="cos")
    rmm = memkern.RMM(store, chat_model=SlowChat(), embedder=HashEmbedder(64), namespace="u", extractor="embedding",
                      persist=False)
    turns = [{"role": "user", "content": "I adopted a cat called Miso.", "speaker": "Ana"}]
    asyncio.run(rmm.aend_session(turns, "s1", "2023-05-08", timestamp="t-1"))
    (rid,) = store.ids("u")
    turn = store.get(int(rid)).turns[0]
    assert turn["date"] == "2023-05-08" and turn["timestamp"] == "t-1"
    store.close()


def _six_concurrent_sessions_store_one_fact(rmm, store) -> None:
    """Six concurrent aend_session calls with the same fact: one ADD, five NOOPs, one record."""
    turns = [{"role": "user", "content": "My favourite mountain is the Matterhorn in Switzerland."}]

    async def main():
        with ThreadPoolExecutor(6) as ex:
            return await asyncio.gather(*(rmm.aend_session(turns, session_id=f"s{i}", executor=ex) for i in range(6)))

    results = asyncio.run(main())
    assert sorted(r.action for res in results for r in res) == ["ADD"] + ["NOOP"] * 5
    assert store.count("u") == 1
    store.close()
