"""RMM.retrieve: what respond shows, without the model; turn budgets; caller turn ids; the turn
template (speaker + date) in what is embedded; the TextTiling extractor and append decider as
the default two-level memory."""
from __future__ import annotations

import numpy as np
import pytest

from fakes_rmm import HashEmbedder, ScriptedChat
from memkern.errors import MemkernValueError
from memkern.loops.rmm import RMM
from memkern.store import MemoryStore
from memkern.text.template import TurnTemplate

DIM = 64
NS = "u"
SUBJECTS = ["marathon race running Boston", "beagle dog Pepper puppy", "nurse hospital night shifts",
            "violin Bach practice evening", "Oslo winter moved city", "pottery class clay wheel"]


class NoChat:
    """A chat model that must not be called."""

    def generate(self, prompts, max_new_tokens=None, json=False, seed=None):
        raise AssertionError("retrieve must not call the chat model")

    def count_tokens(self, text):
        return len(text.split())


def sessions(n_sessions=3):
    """Dialogue sessions of two named speakers; each session talks about two subjects in turn."""
    out = []
    for s in range(n_sessions):
        turns = []
        for k, subj in enumerate((SUBJECTS[(2 * s) % 6], SUBJECTS[(2 * s + 1) % 6])):
            for j in range(4):
                turns.append({"role": "user" if j % 2 == 0 else "assistant", "speaker": "Ann" if j % 2 == 0 else "Bo",
                              "content": f"{subj} part {j} session {s}", "turn_id": f"D{s + 1}:{4 * k + j + 1}"})
        out.append(turns)
    return out


def bank(tmp_path, chat=None, **kw):
    store = MemoryStore(tmp_path / "s", dim=DIM, metric="cos")
    emb = HashEmbedder(DIM)
    args = dict(chat_model=chat or NoChat(), embedder=emb, namespace=NS, persist=False, extractor="embedding",
                explore=False, top_k=6, top_m=2)
    args.update(kw)
    rmm = RMM(store, **args)
    for i, s in enumerate(sessions()):
        rmm.end_session(s, session_id=f"session_{i + 1}", date=f"1:56 pm on {8 + i} May, 2023")
    return rmm, store, emb


def test_default_two_level_memory_embeds_turns_through_the_template(tmp_path):
    rmm, store, emb = bank(tmp_path)
    assert rmm.retrieval == "turn+topic" and rmm.decider_kind == "add"
    # TextTiling: each session's two subjects become two topics of 4 turns (nothing merged away)
    assert store.count(NS) == 6 and store.count(NS, level="turn") == 24
    tids = [int(t) for t in store.ids(NS, level="turn")]
    recs = {r.turn["turn_id"]: r for r in (store.get(t) for t in tids)}
    rec = recs["D2:3"]
    assert rec.turn["speaker"] == "Ann" and rec.turn["date"] == "1:56 pm on 9 May, 2023"
    want = emb.encode(["[2023-05-09] Ann: " + rec.turn["content"]])[0]
    assert np.allclose(store.embeddings([rec.id])[0], want, atol=1e-5)
    topic = store.get(rec.topic_id)
    assert topic.summary.startswith("[2023-05-09] Ann: ") and topic.meta["date"] == "1:56 pm on 9 May, 2023"


def test_retrieve_is_what_respond_shows(tmp_path):
    chat = ScriptedChat(['{"answer": "Pepper", "citations": [0]}'] * 4)
    rmm, store, emb = bank(tmp_path, chat=chat)
    q = "How is the beagle dog Pepper?"
    got = rmm.retrieve(q)
    resp = rmm.respond(q)
    assert got.memory_ids == resp.memory_ids and got.record_ids == resp.turn_ids and len(got.memory_ids) == 2
    # shown turns carry the caller's ids; the best memory is the beagle topic
    assert all(t.startswith("D") for t in got.all_turn_ids) and "beagle" in got.memories[0]["summary"]
    assert got.n_turns == sum(len(x) for x in got.record_ids) <= 2 * rmm.turns_per_memory


@pytest.mark.parametrize("budget", [1, 3, 5, 10, 20])
def test_turn_budget_takes_the_best_scored_turns(tmp_path, budget):
    rmm, store, emb = bank(tmp_path, chat=NoChat())
    q = "Ann and the violin Bach practice"
    got = rmm.retrieve(q, turns=budget)
    assert got.budget == budget and got.n_turns == min(budget, 24)
    # the same turns as the store's own turn+topic ranking (the first stage RMM asks for), cut at the budget
    ids, _ = store.search(NS, emb.encode([q], kind="query"), k=24, level="turn+topic",
                          **rmm._first_stage(q, budget, {}))
    best = [store.get(int(i)).turn["turn_id"] for i in ids[0][:budget]]
    assert sorted(got.all_turn_ids) == sorted(best)
    # memories in retrieval order, each with its turns in conversation order
    for keys in got.turn_ids:
        assert keys == sorted(keys, key=lambda k: int(k.split(":")[1]))


def test_turns_per_memory_caps_respond_not_the_budget(tmp_path):
    rmm, store, emb = bank(tmp_path, turns_per_memory=2)
    shown = rmm.retrieve("violin Bach practice evening")
    assert len(shown.memory_ids) == rmm.top_m and max(len(k) for k in shown.turn_ids) <= 2
    got = rmm.retrieve("violin Bach practice evening", turns=6)
    assert got.n_turns == 6 and max(len(k) for k in got.turn_ids) == 4  # the whole violin topic first


def test_retrieve_topic_mode_and_ids_without_turn_id(tmp_path):
    store = MemoryStore(tmp_path / "s", dim=DIM, metric="cos")
    rmm = RMM(store, chat_model=NoChat(), embedder=HashEmbedder(DIM), namespace=NS, persist=False,
              extractor="window", retrieval="topic", explore=False, top_k=4, top_m=2)
    s = [{k: v for k, v in t.items() if k != "turn_id"} for t in sessions(1)[0]]
    rmm.end_session(s, session_id="a")
    got = rmm.retrieve("beagle dog Pepper", turns=3)
    # windows of 4 turns; the budget cuts the first memory to 3 turns; ids are session#index
    assert got.n_turns == 3 and got.turn_ids == [["a#4", "a#5", "a#6"]] and got.record_ids == [[]]
    assert len(rmm.retrieve("beagle dog Pepper", turns=8).memory_ids) == 2


def test_retrieve_validation(tmp_path):
    rmm, _, _ = bank(tmp_path)
    for bad in (0, -1, 2.5, True):
        with pytest.raises(MemkernValueError, match="turns"):
            rmm.retrieve("dog", turns=bad)
    with pytest.raises(MemkernValueError, match="query"):
        rmm.retrieve("  ")
    empty = RMM(MemoryStore(tmp_path / "e", dim=DIM, metric="cos"), chat_model=NoChat(), embedder=HashEmbedder(DIM),
                persist=False, extractor="embedding")
    assert empty.retrieve("anything", turns=5).memory_ids == []
    with pytest.raises(MemkernValueError, match="template"):
        RMM(MemoryStore(tmp_path / "t", dim=DIM, metric="cos"), template="{speaker} only")
    assert TurnTemplate(rmm.config.template).render("x", "Ann", "2023-05-08") == "[2023-05-08] Ann: x"


def test_append_decider_keeps_every_stretch():
    from memkern.ingest.apply import AppendDecider, Candidate

    d = AppendDecider()
    out = d.decide_batch([("a b", []), ("a b", [Candidate(3, "a b", 1.0)]), ("a b c", [Candidate(3, "a b", 0.99)]),
                          ("a b", [Candidate(3, "a  b!", 0.9995)])])
    assert [x.action for x in out] == ["ADD", "NOOP", "ADD", "ADD"] and out[1].target == 0
    with pytest.raises(MemkernValueError, match="noop_threshold"):
        AppendDecider(noop_threshold=2.0)
