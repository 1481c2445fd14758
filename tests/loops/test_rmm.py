"""RMM orchestration: exact store effects of each update action, reward buffering and update
cadence, citation parsing, persistence, errors; plus a short run with the real offline models."""
from __future__ import annotations

import json
import logging
import os

import numpy as np
import pytest
import torch

from fakes_rmm import FakeStore, HashEmbedder, ScriptedChat
from memkern.errors import MemkernTypeError, MemkernValueError
from memkern.loops.rmm import RMM, Response, parse_answer

DIM = 64


def _real_store_cls():
    try:
        from memkern.store import MemoryStore

        return MemoryStore
    except Exception:  # the native store is not built here
        return None


REAL_STORE = _real_store_cls()
STORES = ["fake", "inmemory"] + (["real"] if REAL_STORE is not None else [])  # "real" last (real-model test)


def make_store(kind, tmp_path, dim=DIM):
    if kind == "fake":
        return FakeStore(dim=dim, path=str(tmp_path / "fake"))
    if kind == "inmemory":
        from memkern.store.memory import InMemoryStore

        return InMemoryStore(dim, "cos")
    return REAL_STORE(path=str(tmp_path / "store"), dim=dim, metric="cos")


def topics_json(*items):
    return json.dumps({"topics": [{"summary": s, "turns": t} for s, t in items]})


def scripted(extract=None, decide=None, answer=None):
    """Chat answering by prompt kind (system prompt decides which script is used)."""
    queues = {"extract": list(extract or []), "decide": list(decide or []), "answer": list(answer or [])}

    def respond(msgs):
        system = msgs[0]["content"]
        kind = "extract" if "extract long-term memories" in system else ("decide" if "memory bank" in system else "answer")
        q = queues[kind]
        if not q:
            raise AssertionError(f"unexpected {kind} call")
        return q.pop(0)

    return ScriptedChat(respond), queues


SESSION = [
    {"role": "user", "content": "I work as a nurse at the city hospital."},
    {"role": "assistant", "content": "That sounds demanding."},
    {"role": "user", "content": "My dog Pepper is a beagle."},
]


# ------------------------------------------------------------------------------------ parse_answer
@pytest.mark.parametrize(
    "text, n, answer, cites, parsed",
    [
        ('{"answer": "A nurse.", "citations": [0, 2]}', 3, "A nurse.", [0, 2], True),
        ('{"answer": "A nurse.", "citations": ["[1]", "0"]}', 3, "A nurse.", [0, 1], True),
        ('{"answer": "A nurse.", "citations": "0, 2"}', 3, "A nurse.", [0, 2], True),
        ('{"answer": "A nurse.", "citations": [0, 7, -1, true]}', 3, "A nurse.", [0], True),
        ('```json\n{"answer": "Pepper", "citations": [1],}\n```', 2, "Pepper", [1], True),
        ("{'answer': 'Pepper', 'citations': [1]}", 2, "Pepper", [1], True),
        ('{"answer": "Pepper [1]", "citations": []}', 2, "Pepper", [1], True),
        ("She works as a nurse [0] and has a dog [1][5].", 3, "She works as a nurse and has a dog .", [0, 1], False),
        ("I don't know.", 3, "I don't know.", [], False),
        ('{"answer": "Lisbon", "citations": [0]} extra {"answer": "x"}', 1, "Lisbon", [0], True),
        ('{"answer": 42, "citations": [0]}', 1, "42", [0], True),
    ],
)
def test_parse_answer(text, n, answer, cites, parsed):
    a, c, p = parse_answer(text, n)
    assert (a, c, p) == (answer, cites, parsed)


# ------------------------------------------------------------------------------------ update effects
@pytest.mark.parametrize("store_kind", STORES)
def test_add_then_each_action_exact_effects(store_kind, tmp_path):
    store = make_store(store_kind, tmp_path)
    emb = HashEmbedder(DIM)
    chat, q = scripted(
        extract=[
            topics_json(("The user works as a nurse.", [0, 1])),
            topics_json(("The user works as a nurse at night.", [0])),  # -> MERGE
            topics_json(("The user now works as a data analyst.", [0])),  # -> UPDATE
            topics_json(("The user works as a data analyst.", [0])),  # -> NOOP
            topics_json(("The user no longer works.", [0])),  # -> INVALIDATE
        ],
        decide=[
            '{"action": "MERGE", "index": 0, "summary": "The user works as a nurse, on night shifts."}',
            '{"action": "UPDATE", "index": 0, "summary": "The user works as a data analyst."}',
            '{"action": "NOOP", "index": 0}',
            '{"action": "INVALIDATE", "index": 0}',
        ],
    )
    rmm = RMM(store, chat_model=chat, embedder=emb, namespace="u1", persist=False, coverage_threshold=None,
              decider_kwargs={"min_similarity": -1.0}, extractor="llm")
    s = lambda text: [{"role": "user", "content": text}, {"role": "assistant", "content": "ok"}]  # noqa: E731

    r = rmm.end_session(s("I am a nurse."), session_id="a")
    assert [x.action for x in r] == ["ADD"] and r[0].target_id is None
    rid = r[0].id
    rec = store.get(rid)
    assert rec.summary == "The user works as a nurse." and rec.version == 1
    assert [(t["session_id"], t["turn_index"], t["role"]) for t in rec.turns] == [("a", 0, "user"), ("a", 1, "assistant")]
    assert rec.meta["session_id"] == "a" and rec.meta["source"] == "llm"
    assert store.count("u1") == 1
    e_before = store.embeddings([rid])[0].copy()

    r = rmm.end_session(s("Night shifts mostly."), session_id="b")
    assert [(x.action, x.id, x.target_id) for x in r] == [("MERGE", rid, rid)]
    rec = store.get(rid)
    assert rec.summary == "The user works as a nurse, on night shifts."
    assert rec.version == 2 and store.count("u1") == 1
    assert [t["session_id"] for t in rec.turns] == ["a", "a", "b"]  # unioned, nothing lost
    e_merged = store.embeddings([rid])[0]
    want = emb.encode([rec.summary])[0]
    np.testing.assert_allclose(e_merged / np.linalg.norm(e_merged), want, atol=1e-5)  # re-embedded
    assert not np.allclose(e_merged, e_before)

    r = rmm.end_session(s("I switched jobs, I am an analyst now."), session_id="c")
    assert [(x.action, x.id) for x in r] == [("UPDATE", rid)]
    rec = store.get(rid)
    assert rec.summary == "The user works as a data analyst." and rec.version == 3
    assert [t["session_id"] for t in rec.turns] == ["a", "a", "b", "c"]
    hist = store.history(rid)
    assert [h.summary for h in hist][:2] == ["The user works as a nurse.", "The user works as a nurse, on night shifts."]

    r = rmm.end_session(s("Still an analyst."), session_id="d")
    assert [(x.action, x.id) for x in r] == [("NOOP", rid)]
    rec = store.get(rid)
    assert rec.summary == "The user works as a data analyst."  # unchanged
    assert store.count("u1") == 1
    assert "d" in [t["session_id"] for t in rec.turns]  # turns kept

    r = rmm.end_session(s("I quit my job."), session_id="e")
    assert [(x.action, x.target_id) for x in r] == [("INVALIDATE", rid)]
    new_id = r[0].id
    assert new_id != rid
    old = store.get(rid)
    assert str(old.status).lower() != "active"
    new = store.get(new_id)
    assert new.summary == "The user no longer works." and new.meta["invalidates"] == rid
    assert [t["session_id"] for t in new.turns] == ["e"]
    # invalidated memories are not retrieved
    ids, _ = store.search("u1", emb.encode(["The user works as a data analyst."]), k=5)
    assert rid not in ids[0].tolist() and new_id in ids[0].tolist()
    assert all(not v for v in q.values())  # every scripted answer consumed exactly


@pytest.mark.parametrize(
    "bad",
    ['{"action": "REPLACE", "index": 0}', '{"action": "MERGE", "index": 9}', "I think you should merge them.",
     '{"action": "UPDATE", "index": "first"}', '{"action": "NOOP", "index": -1}'],
)
def test_invalid_decision_falls_back_to_add(bad, tmp_path, caplog):
    store = FakeStore(DIM)
    chat, _ = scripted(extract=[topics_json(("The user has a cat.", [0])), topics_json(("The user has a cat named Tom.", [0]))],
                       decide=[bad])
    rmm = RMM(store, chat_model=chat, embedder=HashEmbedder(DIM), persist=False, coverage_threshold=None,
              decider_kwargs={"min_similarity": -1.0}, extractor="llm")
    first = rmm.end_session(SESSION[:1], session_id="a")[0]
    with caplog.at_level(logging.WARNING, logger="memkern"):
        r = rmm.end_session(SESSION[:1], session_id="b")[0]
    assert r.action == "ADD" and r.fallback and r.id != first.id
    assert store.count("default") == 2
    assert store.get(first.id).version == 1  # the target is untouched
    assert "falling back to ADD" in caplog.text


def test_no_similar_memory_adds_without_model_call():
    store = FakeStore(DIM)
    chat, _ = scripted(extract=[topics_json(("The user has a cat.", [0])), topics_json(("Quantum chromodynamics lecture.", [0]))])
    rmm = RMM(store, chat_model=chat, embedder=HashEmbedder(DIM), persist=False, coverage_threshold=None, extractor="llm")
    rmm.end_session(SESSION[:1])
    r = rmm.end_session(SESSION[:1])
    assert [x.action for x in r] == ["ADD"]
    assert len(chat.calls) == 2  # two extractions, no decision call


# ------------------------------------------------------------------------------------ extraction robustness
def test_extraction_retry_then_success(caplog):
    store = FakeStore(DIM)
    chat, _ = scripted(extract=["Sure, here are the topics: the user is a nurse", topics_json(("The user is a nurse.", [0]))])
    rmm = RMM(store, chat_model=chat, embedder=HashEmbedder(DIM), persist=False, coverage_threshold=None, extractor="llm")
    r = rmm.end_session(SESSION)
    assert [x.summary for x in r] == ["The user is a nurse."]
    assert len(chat.calls) == 2
    retry_prompt = chat.calls[1]["prompts"][0]
    assert retry_prompt[-1]["content"].startswith("Your answer was not valid JSON")
    assert rmm.extractor.last_stats["retries"] == 1


def test_extraction_failure_keeps_the_session(caplog):
    store = FakeStore(DIM)
    chat, _ = scripted(extract=["I am sorry, I cannot help.", '{"topics": []}'])
    rmm = RMM(store, chat_model=chat, embedder=HashEmbedder(DIM), persist=False, extractor="llm")
    with caplog.at_level(logging.WARNING, logger="memkern"):
        r = rmm.end_session(SESSION, session_id="x")
    assert len(r) == 1 and r[0].action == "ADD" and r[0].topic_source == "fallback"
    rec = store.get(r[0].id)
    assert len(rec.turns) == len(SESSION)  # every turn kept
    assert "nurse" in rec.summary and "Pepper" in rec.summary
    assert "fallback topic" in caplog.text


def test_bad_turn_indices_and_coverage():
    store = FakeStore(DIM)
    # indices out of range / strings / floats; only the first statement is summarised
    chat, _ = scripted(extract=['{"topics": [{"summary": "The user works as a nurse at the city hospital.", "turns": ["0", 7, 1.0, -2]}]}'])
    rmm = RMM(store, chat_model=chat, embedder=HashEmbedder(DIM), persist=False, coverage_threshold=0.45, extractor="llm")
    r = rmm.end_session(SESSION, session_id="s")
    summaries = [x.summary for x in r]
    assert summaries[0] == "The user works as a nurse at the city hospital."
    assert store.get(r[0].id).turns[0]["turn_index"] == 0
    assert sorted(t["turn_index"] for t in store.get(r[0].id).turns) == [0, 1]
    # the uncovered statement about the dog became its own topic
    assert any("Pepper" in s for s in summaries[1:])


def test_example_echo_is_dropped():
    store = FakeStore(DIM)
    echo = '{"topics": [{"summary": "The user starts a new job at a bakery on Monday.", "turns": [2]}, {"summary": "The user is a nurse.", "turns": [0]}]}'
    chat, _ = scripted(extract=[echo])
    rmm = RMM(store, chat_model=chat, embedder=HashEmbedder(DIM), persist=False, coverage_threshold=None, extractor="llm")
    r = rmm.end_session(SESSION)
    assert [x.summary for x in r] == ["The user is a nurse."]


# ------------------------------------------------------------------------------------ respond and rewards
def _filled_rmm(tmp_path, n=12, batch_size=2, chat=None, store_kind="fake", **kw):
    store = make_store(store_kind, tmp_path)
    emb = HashEmbedder(DIM)
    texts = [f"The user fact number {i} about topic{i} and hobby{i % 3}." for i in range(n)]
    store.add_batch("u", texts, emb.encode(texts), turns=[[{"role": "user", "content": t}] for t in texts]) \
        if hasattr(store, "add_batch") else [store.add("u", t, e, turns=[{"role": "user", "content": t}]) for t, e in zip(texts, emb.encode(texts))]
    return RMM(store, chat_model=chat, embedder=emb, namespace="u", batch_size=batch_size, top_k=8, top_m=3, **kw, extractor="llm")


class SpyReranker:
    def __init__(self, real):
        self.real = real
        self.updates = []

    def select(self, *a, **k):
        return self.real.select(*a, **k)

    def update(self, sel, rewards):
        self.updates.append((sel, rewards.clone()))
        return self.real.update(sel, rewards)

    def save(self, path):
        self.real.save(path)


def test_rewards_buffered_and_update_cadence(tmp_path):
    from memkern.score.reranker import Reranker

    answers = ['{"answer": "a", "citations": [0]}', '{"answer": "b", "citations": [1, 2]}', "no json [2]",
               '{"answer": "d", "citations": []}', '{"answer": "e", "citations": [0]}']
    chat = ScriptedChat(answers)
    spy = SpyReranker(Reranker(DIM, top_m=3, seed=0))
    rmm = _filled_rmm(tmp_path, chat=chat, reranker=spy, batch_size=2)
    w0 = spy.real.Wq.detach().clone()
    r1 = rmm.respond("topic1 hobby1?")
    assert isinstance(r1, Response) and len(r1.memory_ids) == 3 and r1.citations == [0]
    assert r1.rewards == [1.0, -1.0, -1.0]
    assert rmm.pending == 1 and not spy.updates
    r2 = rmm.respond("topic2?")
    assert r2.rewards == [-1.0, 1.0, 1.0]
    assert len(spy.updates) == 1 and rmm.pending == 0 and rmm.n_updates == 1
    sel, R = spy.updates[0]
    assert tuple(sel.indices.shape) == (2, 3) and tuple(sel.candidates.shape) == (2, 8, DIM)
    assert R.tolist() == [[1.0, -1.0, -1.0], [-1.0, 1.0, 1.0]]
    assert not torch.equal(w0, spy.real.Wq.detach())  # the step moved the adapters
    r3 = rmm.respond("topic3?")
    assert r3.citations == [2] and not r3.parsed
    assert len(spy.updates) == 1 and rmm.pending == 1
    rmm.respond("topic4?")
    assert len(spy.updates) == 2
    # the ids shown are the store ids of the chosen candidates, in prompt order
    prompt = chat.calls[0]["prompts"][0][-1]["content"]
    for i, mid in enumerate(r1.memory_ids):
        assert f"[{i}] {rmm.store.get(mid).summary}" in prompt
    assert set(r1.timings) >= {"embed", "retrieve", "rerank", "generate", "update", "total"}


def test_reranker_persisted_and_buffer_survives(tmp_path):
    chat = ScriptedChat(lambda m: '{"answer": "x", "citations": [0]}')
    rmm = _filled_rmm(tmp_path, chat=chat, batch_size=2)
    path = os.path.join(rmm.store.path, "rerankers", "u.pt")
    rmm.respond("topic1?")
    rmm.close()
    assert os.path.exists(path[:-3] + ".buffer.pt")
    rmm.respond("topic2?")  # second response: update + save
    assert os.path.exists(path) and not os.path.exists(path[:-3] + ".buffer.pt")
    w = rmm.reranker.Wq.detach().clone()
    rmm.respond("topic3?")
    rmm.close()
    # a new RMM on the same store reloads both the reranker and the pending reward
    rmm2 = RMM(rmm.store, chat_model=chat, embedder=rmm.embedder, namespace="u", batch_size=2, top_k=8, top_m=3, extractor="llm")
    assert rmm2.pending == 1
    assert torch.equal(rmm2.reranker.Wq.detach(), w)
    rmm2.respond("topic4?")
    assert rmm2.pending == 0 and rmm2.n_updates == 1


def test_few_memories_skip_reranker(tmp_path):
    store = FakeStore(DIM, path=None)
    emb = HashEmbedder(DIM)
    store.add("u", "The user likes tea.", emb.encode(["The user likes tea."])[0])

    class NoReranker:
        def select(self, *a, **k):
            raise AssertionError("select must not be called with <= top_m candidates")

    chat = ScriptedChat(['{"answer": "tea", "citations": [0]}', '{"answer": "?", "citations": [0]}'])
    rmm = RMM(store, chat_model=chat, embedder=emb, namespace="u", reranker=NoReranker(), extractor="llm")
    r = rmm.respond("What does the user drink?")
    assert r.answer == "tea" and r.citations == [0] and rmm.pending == 0
    # an empty namespace: no memories, answer still produced, nothing to cite
    rmm_empty = RMM(store, chat_model=chat, embedder=emb, namespace="nobody", reranker=NoReranker(), extractor="llm")
    r = rmm_empty.respond("Anything?")
    assert r.memory_ids == [] and r.citations == [] and r.rewards == []
    assert "(no memories)" in chat.calls[-1]["prompts"][0][-1]["content"]


def test_inspect_and_stats():
    store = FakeStore(DIM)
    chat, _ = scripted(extract=[topics_json(("The user is a nurse.", [0]), ("The user has a beagle.", [2]))])
    rmm = RMM(store, chat_model=chat, embedder=HashEmbedder(DIM), persist=False, coverage_threshold=None, extractor="llm")
    rmm.end_session(SESSION, session_id="s1")
    bank = rmm.inspect()
    assert [b["summary"] for b in bank] == ["The user is a nurse.", "The user has a beagle."]
    assert bank[0]["sessions"] == ["s1"] and bank[0]["version"] == 1 and bank[0]["status"] == "active"
    assert rmm.stats()["records"] == 2


# ------------------------------------------------------------------------------------ errors
def test_bad_arguments():
    store = FakeStore(DIM)
    emb = HashEmbedder(DIM)
    with pytest.raises(MemkernValueError, match="extractor"):
        RMM(store, embedder=emb, extractor="regex")
    with pytest.raises(MemkernValueError, match="namespace"):
        RMM(store, embedder=emb, namespace="")
    with pytest.raises(MemkernValueError, match="top_m"):
        RMM(store, embedder=emb, top_k=3, top_m=5)
    with pytest.raises(MemkernValueError, match="batch_size"):
        RMM(store, embedder=emb, batch_size=0)
    with pytest.raises(MemkernValueError, match="embedder.dim"):
        RMM(store, embedder=HashEmbedder(DIM + 1))
    rmm = RMM(store, chat_model=ScriptedChat([]), embedder=emb, persist=False, extractor="llm")
    with pytest.raises(MemkernValueError, match="query"):
        rmm.respond("   ")
    with pytest.raises(MemkernTypeError, match=r"sessions\[0\]\[1\]"):
        rmm.end_session([{"role": "user", "content": "hi"}, "oops"])
    with pytest.raises(MemkernTypeError, match="content"):
        rmm.end_session([{"role": "user", "content": None}])
    with pytest.raises(MemkernTypeError, match="session_turns"):
        rmm.respond("q?", session_turns="not turns")
    assert store.count("default") == 0  # nothing half-written


# ------------------------------------------------------------------------------------ real models
@pytest.fixture(scope="module")
def real_models():
    from memkern.models import ChatModel, Embedder

    try:
        return ChatModel(), Embedder()
    except Exception as exc:  # pragma: no cover - the offline models are part of the test set-up
        pytest.fail(f"offline default models unavailable: {exc}")


@pytest.mark.slow
@pytest.mark.parametrize("extractor", ["llm", "embedding"])
def test_real_models_end_to_end(real_models, extractor, tmp_path):
    chat, emb = real_models
    store = make_store(STORES[-1], tmp_path, dim=emb.dim)
    rmm = RMM(store, chat_model=chat, embedder=emb, namespace="t", extractor=extractor, top_k=6, top_m=2, batch_size=2,
              answer_max_new_tokens=40)
    sessions = [
        [{"role": "user", "content": "I work as a nurse at St. Mary's Hospital."},
         {"role": "assistant", "content": "Nursing must keep you busy."},
         {"role": "user", "content": "I also adopted a beagle called Pepper."}],
        [{"role": "user", "content": "I am no longer a nurse. I now work as a data analyst at Tidewell."},
         {"role": "assistant", "content": "Congratulations on the new job!"}],
    ]
    results = rmm.end_sessions(sessions, ["s1", "s2"])
    assert all(results) and all(r.action in ("ADD", "MERGE", "UPDATE", "INVALIDATE", "NOOP") for rs in results for r in rs)
    bank = rmm.inspect()
    stored_turns = {(t["session_id"], t["turn_index"]) for b in bank for t in store.get(b["id"]).turns}
    assert {("s1", 0), ("s1", 2), ("s2", 0)} <= stored_turns  # no user statement lost
    text = " ".join(b["summary"] for b in bank).lower()
    assert "pepper" in text or "beagle" in text
    assert results[0][0].timings["extract"] > 0
    r = rmm.respond("What is the name of my dog?")
    assert isinstance(r.answer, str) and r.raw
    assert len(r.memory_ids) == min(2, len([b for b in bank if b["status"] == "active"]))
    assert len(r.rewards) == len(r.memory_ids) and set(r.rewards) <= {1.0, -1.0}
    assert r.timings["generate"] > 0


# ------------------------------------------------------------------------------------ embedding decider
from memkern.ingest.apply import Candidate, EmbeddingDecider, merge_summaries, supersede_summary  # noqa: E402


@pytest.mark.parametrize(
    "summary, sim, action",
    [
        ("User said: I have a cat.", 0.95, "NOOP"),
        ("User said: I am no longer vegetarian.", 0.5, "INVALIDATE"),
        ("User said: I moved to Berlin.", 0.5, "UPDATE"),
        ("User said: I quit tennis and switched to golf.", 0.5, "UPDATE"),  # change wins over withdrawal
        ("User said: I stopped running.", 0.40, "ADD"),  # cue but not similar enough
        ("User said: My cat likes fish.", 0.7, "MERGE"),
        ("User said: My cat likes fish.", 0.55, "ADD"),
    ],
)
def test_embedding_decider_thresholds(summary, sim, action):
    d = EmbeddingDecider().decide_batch([(summary, [Candidate(7, "User said: old.", sim)])])[0]
    assert d.action == action
    assert d.target == (None if action == "ADD" else 0)
    if action == "MERGE":
        assert d.summary == "User said: old. My cat likes fish."


def test_embedding_decider_per_sentence_supersede():
    emb = HashEmbedder(DIM)
    old = "User said: I live in Lyon with my cat. I play tennis on sundays."
    new = "User said: I moved from Lyon with my cat to Berlin."
    s, kept = supersede_summary(old, new, emb.encode, threshold=0.4)
    assert kept == 1 and s == "User said: I play tennis on sundays. I moved from Lyon with my cat to Berlin."
    dec = EmbeddingDecider(embed=emb.encode)
    # a withdrawal that leaves another statement standing becomes an UPDATE dropping only the withdrawn one
    d = dec.decide_batch([("User said: I no longer play tennis on sundays.", [Candidate(1, old, 0.6)])])[0]
    assert d.action == "UPDATE" and "Lyon" in d.summary and d.summary.count("tennis") == 1
    d = dec.decide_batch([("User said: I no longer play tennis on sundays.", [Candidate(1, "User said: I play tennis on sundays.", 0.6)])])[0]
    assert d.action == "INVALIDATE"
    assert merge_summaries("User said: A. B.", "User said: B. C.") == "User said: A. B. C."


def test_citation_fallback_by_similarity(tmp_path):
    chat = ScriptedChat(['{"answer": "The user fact number 1 about topic1 and hobby1."}',
                         '{"answer": "The user fact number 1 about topic1 and hobby1.", "citations": []}'])
    rmm = _filled_rmm(tmp_path, chat=chat, batch_size=10, seed=3, cite_fallback=0.99)
    r = rmm.respond("topic1 hobby1 fact number 1?")
    assert r.citation_source == "similarity"
    target = [i for i, m in enumerate(r.memory_ids) if "topic1 " in rmm.store.get(m).summary]
    assert r.citations == target
    r2 = rmm.respond("topic1 hobby1 fact number 1?")  # an explicit empty list is the model's choice
    assert r2.citation_source == "model" and r2.citations == [] and set(r2.rewards) == {-1.0}


def test_greedy_selection_is_retriever_order_for_fresh_reranker(tmp_path):
    chat = ScriptedChat(lambda m: '{"answer": "x", "citations": [0]}')
    rmm = _filled_rmm(tmp_path, chat=chat, explore=False)
    q = rmm.embedder.encode(["topic5 hobby2?"], kind="query")
    ids, _ = rmm.store.search("u", q, k=8)
    r = rmm.respond("topic5 hobby2?")
    assert r.memory_ids == [int(i) for i in ids[0][:3]]


def test_unreadable_reward_buffer_is_ignored(tmp_path, caplog):
    chat = ScriptedChat(lambda m: '{"answer": "x", "citations": [0]}')
    rmm = _filled_rmm(tmp_path, chat=chat, batch_size=4)
    rmm.respond("topic1?")
    rmm.close()
    bpath = os.path.join(rmm.store.path, "rerankers", "u.buffer.pt")
    with open(bpath, "wb") as f:
        f.write(b"not a torch file")
    with caplog.at_level(logging.WARNING, logger="memkern"):
        rmm2 = RMM(rmm.store, chat_model=chat, embedder=rmm.embedder, namespace="u", top_k=8, top_m=3, extractor="llm")
    assert rmm2.pending == 0 and "ignoring unreadable reward buffer" in caplog.text
    assert rmm2.respond("topic2?").memory_ids  # memory still works


def test_invented_model_summary_is_rejected(caplog):
    store = FakeStore(DIM)
    chat, _ = scripted(
        extract=[topics_json(("The user has a beagle called Pepper.", [0])),
                 topics_json(("The beagle Pepper learned to sit.", [0]))],
        decide=['{"action": "MERGE", "index": 0, "summary": "The user is very smart, and has a lot of skills."}'],
    )
    rmm = RMM(store, chat_model=chat, embedder=HashEmbedder(DIM), persist=False, coverage_threshold=None,
              decider_kwargs={"min_similarity": -1.0}, extractor="llm")
    rid = rmm.end_session(SESSION[:1])[0].id
    with caplog.at_level(logging.WARNING, logger="memkern"):
        r = rmm.end_session(SESSION[:1])[0]
    assert r.action == "MERGE" and "unrelated" in r.note
    assert store.get(rid).summary == "The user has a beagle called Pepper. The beagle Pepper learned to sit."


# ------------------------------------------------------------------------------------ settings (RMMConfig)
def test_config_and_keyword_overrides_agree():
    import dataclasses

    from memkern.loops.rmm import RMMConfig

    store = FakeStore(DIM)
    emb = HashEmbedder(DIM)
    cfg = RMMConfig(top_k=8, top_m=3, batch_size=2, seed=7, explore=False)
    by_config = RMM(store, embedder=emb, config=cfg, persist=False)
    by_keywords = RMM(store, embedder=emb, top_k=8, top_m=3, batch_size=2, seed=7, explore=False, persist=False)
    assert by_config.config == by_keywords.config
    assert (by_config.top_k, by_config.top_m, by_config.batch_size, by_config.seed, by_config.explore) == (8, 3, 2, 7, False)
    # A keyword overrides the same field of config; the other fields stay.
    mixed = RMM(store, embedder=emb, config=cfg, top_m=5, persist=False)
    assert mixed.config == dataclasses.replace(cfg, top_m=5, persist=False) and cfg.top_m == 3
    assert RMM(store, embedder=emb).config == RMMConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.top_k = 1  # type: ignore[misc]
    with pytest.raises(AttributeError):
        by_config.top_k = 1  # settings are read from the config, not set on the RMM


def test_config_errors_name_the_argument():
    from memkern.loops.rmm import RMMConfig

    store = FakeStore(DIM)
    emb = HashEmbedder(DIM)
    with pytest.raises(MemkernValueError, match=r"top_m: expected <= top_k \(3\), got 5"):
        RMMConfig(top_k=3, top_m=5)
    with pytest.raises(MemkernValueError, match=r"top_m: expected <= top_k \(3\), got 5"):
        RMM(store, embedder=emb, config=RMMConfig(top_k=3), top_m=5)
    with pytest.raises(MemkernValueError, match="save_every: expected a positive int, got 0"):
        RMMConfig(save_every=0)
    with pytest.raises(MemkernTypeError, match="unexpected keyword argument 'top_n'"):
        RMM(store, embedder=emb, top_n=3)
    with pytest.raises(MemkernTypeError, match="config: expected None or a memkern.loops.rmm.RMMConfig, got 'dict'"):
        RMM(store, embedder=emb, config={"top_k": 3})
    # Every setting is checked when the config is built (not on first use).
    for bad in ({"seed": -1}, {"answer_max_new_tokens": 0}, {"coverage_threshold": float("nan")},
                {"cite_fallback": "0.5"}, {"alpha": True}, {"retrieval": "turns"}):
        with pytest.raises(MemkernValueError, match=next(iter(bad))):
            RMMConfig(**bad)
