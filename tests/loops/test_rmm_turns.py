"""RMM with two-level memory (issue 7, ``retrieval="turn+topic"``): turn records kept complete by
every update action, turn+topic retrieval grouped by topic, the prompt showing only each chosen
topic's best retrieved turns, deletion, topic mode unchanged. Real MemoryStore, fake chat model and
bag-of-words embedder; one test with the real MiniLM embedder."""
from __future__ import annotations

import json

import numpy as np
import pytest

from fakes_rmm import FakeStore, HashEmbedder, ScriptedChat
from memkern.errors import MemkernTypeError, MemkernValueError
from memkern.ingest import prompts
from memkern.loops.rmm import RMM
from memkern.store import MemoryStore
from memkern.text.template import default_template

DIM = 64
NS = "u"


def topics_json(*items):
    return json.dumps({"topics": [{"summary": s, "turns": t} for s, t in items]})


def scripted(extract=(), decide=(), answer=None):
    """Chat answering by prompt kind; ``answer`` is a fixed answer text (all prompts recorded)."""
    queues = {"extract": list(extract), "decide": list(decide)}
    answers: list[str] = []

    def respond(msgs):
        system = msgs[0]["content"]
        if "extract long-term memories" in system:
            return queues["extract"].pop(0)
        if "memory bank" in system:
            return queues["decide"].pop(0)
        answers.append(msgs[-1]["content"])
        if answer is None:
            raise AssertionError("unexpected answer call")
        return answer

    return ScriptedChat(respond), queues, answers


def unit(x):
    x = np.asarray(x, np.float32)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def check_two_level(store: MemoryStore, emb: HashEmbedder, ns: str = NS) -> int:
    """Every topic (invalidated ones included) has exactly one turn record per turn, linked to
    it, with its status and the embedding of its content; active turn count matches. Returns the
    number of turn records checked."""
    n_active_turns, checked = 0, 0
    for tid in store.ids(ns, include_invalidated=True):
        rec = store.get(int(tid))
        assert len(rec.turn_ids) == len(rec.turns), (rec.id, rec.turn_ids, rec.turns)
        trs = store.get_batch(rec.turn_ids)
        assert sorted(json.dumps(t.turn, sort_keys=True) for t in trs) == sorted(json.dumps(t, sort_keys=True) for t in rec.turns)
        for t in trs:
            assert t.level == "turn" and t.topic_id == rec.id and t.status == rec.status
        if trs:
            got = store.embeddings(list(rec.turn_ids))
            # the turn template's text (the content alone for turns without speaker and date)
            want = unit(HashEmbedder(emb.dim).encode([default_template(None).render_turn(t.turn) for t in trs]))
            np.testing.assert_allclose(got, want, atol=1e-5)
        checked += len(trs)
        if rec.status == "active":
            n_active_turns += len(rec.turns)
    assert store.count(ns, level="turn") == n_active_turns
    return checked


def session(tag: str, *texts: str) -> list[dict]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(texts)]


# ------------------------------------------------------------------------------------ writes
@pytest.mark.parametrize("kind", ["native", "inmemory"])
def test_every_action_keeps_turn_records_complete(tmp_path, kind):
    """The whole RMM loop (extract, decide, every action, turn records) on both stores."""
    from memkern.store.memory import InMemoryStore

    store = MemoryStore(tmp_path / "s", dim=DIM, metric="cos") if kind == "native" else InMemoryStore(DIM, "cos")
    emb = HashEmbedder(DIM)
    chat, q, _ = scripted(
        extract=[
            topics_json(("The user works as a nurse.", [0, 1, 2])),
            topics_json(("The user works as a nurse at night.", [0, 1])),  # -> MERGE
            topics_json(("The user now works as a data analyst.", [0, 1])),  # -> UPDATE
            topics_json(("The user works as a data analyst.", [0])),  # -> NOOP (new turn unioned)
            topics_json(("The user no longer works.", [0, 1])),  # -> INVALIDATE
        ],
        decide=[
            '{"action": "MERGE", "index": 0, "summary": "The user works as a nurse, on night shifts."}',
            '{"action": "UPDATE", "index": 0, "summary": "The user works as a data analyst."}',
            '{"action": "NOOP", "index": 0}',
            '{"action": "INVALIDATE", "index": 0}',
        ],
    )
    rmm = RMM(store, chat_model=chat, embedder=emb, namespace=NS, persist=False, coverage_threshold=None,
              decider_kwargs={"min_similarity": -1.0}, retrieval="turn+topic", extractor="llm")
    sessions = [
        ("a", session("a", "I am a nurse.", "Which hospital?", "The city hospital downtown.")),
        ("b", session("b", "Night shifts mostly.", "That must be tiring.")),
        ("c", session("c", "I switched jobs, I am an analyst now.", "Congratulations on the switch.")),
        ("d", session("d", "Still an analyst these days.", "Good to hear.")),
        ("e", session("e", "I quit my job.", "Sorry to hear about that.")),
    ]
    want_turns = [3, 5, 7, 8]
    for (sid, turns), n in zip(sessions[:4], want_turns):
        n_calls = len(emb.calls)
        r = rmm.end_session(turns, session_id=sid)
        rid = r[0].id
        assert len(store.get(rid).turns) == n
        assert check_two_level(store, emb) == n
        # the session's turns were embedded once, in one batch, as passages
        assert ([t["content"] for t in turns], "passage") in emb.calls[n_calls:]
    assert [x.action for x in [r[0]]] == ["NOOP"]
    # old turns reuse their stored vectors: each turn's text was embedded exactly once
    embedded = [t for texts, _ in emb.calls for t in texts]
    assert embedded.count("I am a nurse.") == 1 and embedded.count("Night shifts mostly.") == 1

    r = rmm.end_session(sessions[4][1], session_id="e")
    assert r[0].action == "INVALIDATE"
    old, new = store.get(r[0].target_id), store.get(r[0].id)
    assert old.status == "invalidated" and len(new.turn_ids) == 2
    assert check_two_level(store, emb) == 10
    assert store.count(NS, level="turn") == 2  # the invalidated topic's turns left search
    ids, _ = store.search(NS, emb.encode(["I am a nurse."]), k=10, level="turn")
    assert set(ids[0][ids[0] >= 0].tolist()) == set(new.turn_ids)
    assert all(not v for v in q.values())


def _topic_mode_bank(tmp_path, turns: list[dict], date=None):
    """A bank written in topic mode (no turn records): topics 'cat' (turns 0-1) and 'tennis' (2-3)."""
    store = MemoryStore(tmp_path / "s", dim=DIM, metric="cos")
    emb = HashEmbedder(DIM)
    chat, _, _ = scripted(
        extract=[topics_json(("The user has a cat called Miso.", [0, 1]), ("The user plays tennis.", [2, 3]))],
        answer='{"answer": "Miso", "citations": [0]}',
    )
    old = RMM(store, chat_model=chat, embedder=emb, namespace=NS, persist=False, coverage_threshold=None,
              decider_kwargs={"min_similarity": 1.01}, retrieval="topic", extractor="llm")
    old.end_session(turns, "a", date=date)
    return store, emb


def test_topic_mode_bank_gets_turn_records_on_merge_and_index_turns(tmp_path):
    store, emb = _topic_mode_bank(tmp_path, session("a", "My cat is called Miso.", "Cute name.",
                                                     "I play tennis on Sundays.", "Nice sport."))
    assert store.count(NS) == 2 and store.count(NS, level="turn") == 0
    cat, tennis = [int(i) for i in store.ids(NS)]

    chat2, _, prompts_seen = scripted(
        extract=[topics_json(("The user has a cat called Miso, a tabby.", [0]))],
        decide=['{"action": "MERGE", "index": 0, "summary": "The user has a cat called Miso, a tabby."}'],
        answer='{"answer": "Miso", "citations": [0]}',
    )
    rmm = RMM(store, chat_model=chat2, embedder=emb, namespace=NS, persist=False, coverage_threshold=None,
              decider_kwargs={"min_similarity": -1.0}, retrieval="turn+topic", top_k=2, top_m=1, extractor="llm")
    # a bank with no turn records at all (written in topic mode) is searched by topic instead
    assert rmm.respond("What is my cat called?").memory_ids == [cat]
    assert rmm.retrieve("What is my cat called?", turns=2, explore=False).turn_ids == [["a#0", "a#1"]]
    r = rmm.end_session(session("b", "Miso is a tabby."), "b")
    assert (r[0].action, r[0].id) == ("MERGE", cat)
    rec = store.get(cat)
    assert len(rec.turns) == 3 and len(rec.turn_ids) == 3  # the old turns were given records too
    assert len(store.get(tennis).turn_ids) == 0
    assert rmm.index_turns() == 1 and rmm.index_turns() == 0
    assert check_two_level(store, emb) == 5
    assert rmm.inspect()[1]["turn_records"] == 2
    resp = rmm.respond("What is my cat Miso?")
    assert resp.memory_ids == [cat] and len(resp.turn_ids[0]) >= 1


# ------------------------------------------------------------------------------------ respond
TOPICS = [
    ("The user runs marathons.", ["I love running long races.", "Which races exactly?",
                                  "I ran the Boston marathon in April.", "Impressive pace there!"]),
    ("The user has a beagle.", ["My dog Pepper is a beagle.", "Cute! How old is Pepper?",
                                "Pepper turned three in May.", "Happy birthday to the pup."]),
    ("The user works as a nurse.", ["I work night shifts at the hospital.", "Is it tiring?",
                                    "Very, but the ward team is great.", "Teams matter a lot."]),
    ("The user plays the violin.", ["I practise violin every evening.", "Classical pieces?",
                                    "Mostly Bach partitas lately.", "Bach is a great choice."]),
    ("The user lives in Oslo.", ["I moved to Oslo last year.", "How are the winters in Oslo?",
                                 "Dark and cold but cosy.", "Cosy sounds nice."]),
    ("The user cooks Thai food.", ["I cook Thai curry on weekends.", "Green or red curry?",
                                   "Green curry with extra basil.", "Basil makes it fresh."]),
]


def _bank(tmp_path, answer='{"answer": "x", "citations": [0]}', **kw):
    store = MemoryStore(tmp_path / "s", dim=DIM, metric="cos")
    emb = HashEmbedder(DIM)
    chat, _, prompts_seen = scripted(extract=[topics_json((s, [0, 1, 2, 3])) for s, _ in TOPICS], answer=answer)
    args = dict(chat_model=chat, embedder=emb, namespace=NS, persist=False, coverage_threshold=None,
                decider_kwargs={"min_similarity": 1.01}, explore=False, top_k=4, top_m=2, extractor="llm")
    args.update(kw)
    rmm = RMM(store, **args)
    rmm.end_sessions([session(f"s{i}", *turns) for i, (_, turns) in enumerate(TOPICS)], [f"s{i}" for i in range(len(TOPICS))])
    return rmm, store, emb, prompts_seen


def expected_groups(store, q, k_turns, top_k, per, alpha):
    """Brute force: every active turn scored cos(q, turn) + alpha cos(q, topic), best k_turns,
    grouped by topic in rank order."""
    tids = [int(i) for i in store.ids(NS, level="turn")]
    recs = store.get_batch(tids)
    qn = unit(q)[0]
    te = store.embeddings(tids)
    topic_e = {r.topic_id: store.embeddings([r.topic_id])[0] for r in recs}
    scores = [float(qn @ e + alpha * (qn @ topic_e[r.topic_id])) for r, e in zip(recs, te)]
    order = sorted(range(len(tids)), key=lambda i: -scores[i])[:k_turns]
    groups: dict[int, list[int]] = {}
    for i in order:
        t = recs[i].topic_id
        if t not in groups and len(groups) >= top_k:
            continue
        g = groups.setdefault(t, [])
        if len(g) < per:
            g.append(tids[i])
    return groups


@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_respond_shows_only_best_retrieved_turns_of_selected_topics(tmp_path, alpha):
    # the dense turn stage without context terms, the topic term always on: the brute force below
    rmm, store, emb, seen = _bank(tmp_path, retrieval="turn+topic", alpha=alpha, turns_per_memory=2,
                                  turn_stage="dense", neighbour_weight=0.0, session_weight=0.0, topic_min_turns=1)
    check_two_level(store, emb)
    query = "Which marathon did I run, and how old is my dog Pepper?"
    q = emb.encode([query], kind="query")
    want = expected_groups(store, q, 4 * rmm.top_k, rmm.top_k, 2, alpha)
    ids, groups = rmm._retrieve_turn_topic(q, rmm._first_stage(query, None, {}))
    assert ids.tolist() == list(want) and len(ids) == rmm.top_k
    # groups keep every retrieved turn best first; the shown ones are the first turns_per_memory
    assert {t: g.turn_ids[:2] for t, g in groups.items()} == want

    r = rmm.respond(query)
    # a fresh reranker choosing greedily keeps the retriever's order
    assert r.memory_ids == list(want)[:2] and len(r.turn_ids) == 2
    prompt = seen[-1]
    all_turns = {int(t): store.get(int(t)) for t in store.ids(NS, level="turn")}
    shown = set()
    for i, (mid, tids) in enumerate(zip(r.memory_ids, r.turn_ids)):
        assert f"[{i}] {store.get(mid).summary}" in prompt
        assert sorted(tids) == sorted(want[mid])  # only retrieved turns, the topic's best ones
        assert all(all_turns[t].topic_id == mid for t in tids)
        pos = [all_turns[t].meta["turn_position"] for t in tids]
        assert pos == sorted(pos)  # shown in conversation order
        shown |= set(tids)
    for t, rec in all_turns.items():
        assert (rec.turn["content"] in prompt) == (t in shown), rec.turn["content"]
    assert "I ran the Boston marathon in April." in prompt and "My dog Pepper is a beagle." in prompt


def test_delete_topic_removes_its_turns_from_respond(tmp_path):
    rmm, store, emb, seen = _bank(tmp_path, retrieval="turn+topic", top_k=3, top_m=1)
    r = rmm.respond("Where did I run the Boston marathon?")
    gone = r.memory_ids[0]
    assert store.get(gone).summary == "The user runs marathons."
    gone_turns = set(store.get(gone).turn_ids)
    assert set(r.turn_ids[0]) <= gone_turns
    n_turns = store.count(NS, level="turn")
    store.delete(gone)
    assert store.count(NS, level="turn") == n_turns - 4
    ids, _ = store.search(NS, emb.encode(["I ran the Boston marathon in April."]), k=50, level="turn")
    assert not gone_turns & set(ids[0].tolist())
    r2 = rmm.respond("Where did I run the Boston marathon?")
    assert gone not in r2.memory_ids and not gone_turns & {t for ts in r2.turn_ids for t in ts}
    assert "I ran the Boston marathon in April." not in seen[-1]
    check_two_level(store, emb)


def test_topic_mode_unchanged(tmp_path):
    rmm, store, emb, seen = _bank(tmp_path, retrieval="topic")
    assert rmm.retrieval == "topic"
    assert store.count(NS, level="turn") == 0  # no turn records written
    r = rmm.respond("Where did I run the Boston marathon?")
    ids, _ = store.search(NS, emb.encode(["Where did I run the Boston marathon?"], kind="query"), k=4)
    assert r.memory_ids == [int(i) for i in ids[0][:2]] and r.turn_ids == [[], []]
    recs = [store.get(i) for i in r.memory_ids]
    want = prompts.answer_messages("Where did I run the Boston marathon?",
                                   [{"summary": x.summary, "turns": x.turns} for x in recs])
    assert seen[-1] == want[-1]["content"]


def test_answer_prompt_selected_turns():
    mem = [{"summary": "The user has a dog.", "turns": [{"role": "assistant", "content": "Pepper is a beagle then."},
                                                        {"role": "user", "content": "He is three."}]}]
    plain = prompts.answer_messages("dog?", mem, max_turns_per_memory=3)[-1]["content"]
    sel = prompts.answer_messages("dog?", mem, max_turns_per_memory=3, selected_turns=True)[-1]["content"]
    assert "Pepper is a beagle" not in plain and "He is three." in plain  # user turns only
    assert "assistant: Pepper is a beagle then." in sel and "user: He is three." in sel
    one = prompts.answer_messages("dog?", mem, max_turns_per_memory=1, selected_turns=True)[-1]["content"]
    assert "Pepper" in one and "three" not in one


def test_bad_arguments(tmp_path):
    store = MemoryStore(tmp_path / "s", dim=DIM, metric="cos")
    emb = HashEmbedder(DIM)
    with pytest.raises(MemkernValueError, match="retrieval"):
        RMM(store, embedder=emb, retrieval="turns")
    with pytest.raises(MemkernTypeError, match="store"):
        RMM(FakeStore(DIM), embedder=emb, retrieval="turn+topic")
    with pytest.raises(MemkernValueError, match="alpha"):
        RMM(store, embedder=emb, retrieval="turn+topic", alpha=float("nan"))
    with pytest.raises(MemkernValueError, match="turns_per_memory"):
        RMM(store, embedder=emb, retrieval="turn+topic", turns_per_memory=0)
    with pytest.raises(MemkernTypeError, match="store"):
        RMM(FakeStore(DIM), embedder=emb).index_turns()


def test_real_minilm_turn_topic(tmp_path):
    from memkern.models import Embedder

    emb = Embedder()
    store = MemoryStore(tmp_path / "s", dim=emb.dim, metric="cos")
    chat, _, seen = scripted(
        extract=[topics_json(("The user has a dog.", [0, 1, 2, 3])), topics_json(("The user's job.", [0, 1, 2, 3])),
                 topics_json(("The user's hobbies.", [0, 1, 2, 3]))],
        answer='{"answer": "A beagle.", "citations": [0]}',
    )
    rmm = RMM(store, chat_model=chat, embedder=emb, namespace=NS, persist=False, coverage_threshold=None,
              decider_kwargs={"min_similarity": 1.01}, retrieval="turn+topic", top_k=3, top_m=1,
              turns_per_memory=3, explore=False, extractor="llm")
    rmm.end_sessions([
        session("a", "We got a puppy last week.", "How fun! What breed?", "He is a beagle called Pepper.", "Lovely."),
        session("b", "I started at the hospital.", "As a nurse?", "Yes, on the night ward.", "Good luck."),
        session("c", "I paint on Sundays.", "Oil or watercolour?", "Watercolour landscapes.", "Beautiful."),
    ], ["a", "b", "c"])
    assert store.count(NS, level="turn") == 12
    r = rmm.respond("What is my dog called?")
    assert store.get(r.memory_ids[0]).summary == "The user has a dog."
    shown = [t.turn["content"] for t in store.get_batch(r.turn_ids[0])]
    assert len(shown) == 3 and "He is a beagle called Pepper." in shown and "Lovely." not in shown
    assert all(store.get(t).topic_id == r.memory_ids[0] for t in r.turn_ids[0])
    assert "He is a beagle called Pepper." in seen[-1] and "night ward" not in seen[-1]


def test_old_turns_given_records_later_embed_through_the_turn_template(tmp_path):
    """A topic-mode bank's turns (with speaker and date) given turn records later, by
    index_turns and by a MERGE, are embedded from the same templated text as turns written in
    two-level mode ("[date] Speaker: content"), not from their content alone."""
    turns = [dict(t, speaker=("Ann" if i % 2 == 0 else "Bo")) for i, t in enumerate(
        session("a", "My cat is called Miso.", "Cute name.", "I play tennis on Sundays.", "Nice sport."))]
    store, emb = _topic_mode_bank(tmp_path, turns, date="2023-05-08")
    cat, tennis = [int(i) for i in store.ids(NS)]
    chat2, _, _ = scripted(
        extract=[topics_json(("The user has a cat called Miso, a tabby.", [0]))],
        decide=['{"action": "MERGE", "index": 0, "summary": "The user has a cat called Miso, a tabby."}'],
        answer='{"answer": "Miso", "citations": [0]}',
    )
    rmm = RMM(store, chat_model=chat2, embedder=emb, namespace=NS, persist=False, coverage_threshold=None,
              decider_kwargs={"min_similarity": -1.0}, retrieval="turn+topic", top_k=2, top_m=1, extractor="llm")
    rmm.end_session([{"role": "user", "content": "Miso is a tabby.", "speaker": "Ann"}], "b", date="2023-06-01")
    assert rmm.index_turns() == 1
    for topic in (cat, tennis):
        trs = store.get_batch(store.get(topic).turn_ids)
        assert trs and all(t.turn.get("speaker") for t in trs)
        want = unit(HashEmbedder(DIM).encode([default_template(None).render_turn(t.turn) for t in trs]))
        np.testing.assert_allclose(store.embeddings([t.id for t in trs]), want, atol=1e-5)
    assert check_two_level(store, emb) == 5
