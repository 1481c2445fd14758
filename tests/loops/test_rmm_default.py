"""RMM's default memory: no chat model (TextTiling topics, append decider), each turn embedded
once, templated turn texts, the hybrid turn stage with context terms in one store call (filters
inside it), the topic term only for long budgets, and the reranker's prior keeping the first
stage's order."""
from __future__ import annotations

import numpy as np
import pytest

from fakes_rmm import HashEmbedder
from memkern import InMemoryStore, MemoryStore
from memkern.loops.rmm import RMM, RMMConfig

DIM = 64
NS = "u"


def dialogue():
    """Three dated sessions of two speakers; evidence ("adopted a beagle") never names the speaker
    in its content, which the question does."""
    s1 = [("Ann", "I finally adopted a beagle puppy last week"), ("Bo", "Wonderful, what is his name?"),
          ("Ann", "His name is Pepper and he loves the park"), ("Bo", "Parks are great for dogs"),
          ("Ann", "My violin lessons start tomorrow evening"), ("Bo", "Bach or something modern?"),
          ("Ann", "Bach partitas, slowly"), ("Bo", "Good luck with the violin")]
    s2 = [("Bo", "I ran the Boston marathon in April"), ("Ann", "How long did it take you?"),
          ("Bo", "Four hours and ten minutes"), ("Ann", "That is a solid time"),
          ("Bo", "Next I want to try a trail race"), ("Ann", "Trail races are muddy fun")]
    s3 = [("Ann", "Pepper chewed my violin case"), ("Bo", "Oh no, is the violin fine?"),
          ("Ann", "The violin is fine, the case is not"), ("Bo", "Puppies chew everything"),
          ("Bo", "I moved to Oslo for the winter"), ("Ann", "Oslo must be cold and dark"),
          ("Bo", "Cold but very cosy"), ("Ann", "Send me pictures of the snow")]
    out = []
    for si, s in enumerate((s1, s2, s3)):
        out.append([{"role": "user" if sp == "Ann" else "assistant", "speaker": sp, "content": c,
                     "turn_id": f"D{si + 1}:{j + 1}"} for j, (sp, c) in enumerate(s)])
    return out


DATES = ["8 May 2023", "20 May 2023", "2 June 2023"]


def bank(store, **kw):
    emb = HashEmbedder(DIM)
    rmm = RMM(store, embedder=emb, namespace=NS, persist=False, explore=False, **kw)
    for i, s in enumerate(dialogue()):
        rmm.end_session(s, session_id=f"session_{i + 1}", date=DATES[i])
    return rmm, emb


@pytest.fixture(params=["native", "inmemory"])
def store(request, tmp_path):
    s = MemoryStore(tmp_path / "s", dim=DIM, metric="cos") if request.param == "native" else InMemoryStore(DIM, "cos")
    yield s
    s.close()


def test_default_needs_no_chat_model_and_embeds_each_turn_once(store):
    rmm, emb = bank(store)
    assert rmm.extractor_kind == "embedding" and rmm.decider_kind == "add" and rmm.retrieval == "turn+topic"
    assert rmm._chat_model is None  # never built: extraction, decisions and retrieval need no model
    got = rmm.retrieve("What did Ann adopt?", turns=5)
    assert rmm._chat_model is None and got.n_turns == 5
    # each turn's templated text was embedded exactly once (for TextTiling and its turn record)
    texts = [t for batch, kind in emb.calls if kind == "passage" for t in batch]
    turn_texts = [rmm.turn_template.render_turn({**t, "date": DATES[i]}) for i, s in enumerate(dialogue()) for t in s]
    assert all(texts.count(t) == 1 for t in turn_texts)
    assert store.count(NS, level="turn") == 22


def test_turn_records_hold_templated_text_and_the_callers_turns(store):
    rmm, _ = bank(store)
    recs = store.get_batch([int(i) for i in store.ids(NS, level="turn")])
    by_id = {r.turn["turn_id"]: r for r in recs}
    r = by_id["D1:1"]
    assert r.summary == "[2023-05-08] Ann: I finally adopted a beagle puppy last week"
    assert r.turn == {"role": "user", "speaker": "Ann", "content": "I finally adopted a beagle puppy last week",
                      "turn_id": "D1:1", "session_id": "session_1", "turn_index": 0, "date": "8 May 2023",
                      # RMM's documented annotation: the week "last week" names, said on 8 May 2023
                      "mentioned_time": [1682899200.0, 1683504000.0]}
    shown = rmm.retrieve("What did Ann adopt?", turns=3)
    assert all(set(t) >= {"role", "content", "speaker", "turn_id"} for m in shown.memories for t in m["turns"])


def test_a_question_naming_the_speaker_finds_the_evidence(store):
    rmm, _ = bank(store)
    got = rmm.retrieve("Ann adopted which puppy?", turns=3)
    assert "D1:1" in got.all_turn_ids


def test_first_stage_settings_and_the_topic_term_only_for_long_budgets(store):
    rmm, _ = bank(store)
    c = RMMConfig()
    assert (c.turn_stage, c.lexical_weight, c.neighbour_weight, c.session_weight, c.alpha, c.topic_min_turns) == \
        ("hybrid", 0.5, 0.3, 0.3, 0.5, 10)
    kw5, kw10, kw_resp = rmm._first_stage("q", 5, {}), rmm._first_stage("q", 10, {}), rmm._first_stage("q", None, {})
    assert kw5["alpha"] == 0.0 and kw10["alpha"] == 0.5 and kw_resp["alpha"] == 0.5  # respond shows 5 * 3 turns
    assert kw5 | {"alpha": 0.5} == kw10
    assert kw10 == dict(alpha=0.5, mode="hybrid", texts=["q"], fusion="weighted", lexical_weight=0.5,
                        neighbour_weight=0.3, group_weight=0.3, group_key="session_id", candidates=80)
    assert rmm._first_stage("q", 5, {"filter": {"a": 1}})["filter"] == {"a": 1}


@pytest.mark.parametrize("budget", [2, 5, 9, 12])
def test_retrieve_is_the_store_first_stage_order(store, budget):
    # the candidates' embeddings (best turn + alpha * topic) would order the memories differently:
    # the reranker's prior (the first-stage score) keeps the store's order, so the budget takes
    # the store's best turns
    rmm, emb = bank(store, top_k=8)
    q = "Which violin pieces does Ann practise with Bo?"
    got = rmm.retrieve(q, turns=budget)
    ids, _ = store.search(NS, emb.encode([q], kind="query"), k=budget, level="turn+topic",
                          **rmm._first_stage(q, budget, {}))
    want = [store.get(int(i)).turn["turn_id"] for i in ids[0]]
    assert sorted(got.all_turn_ids) == sorted(want)


def test_filters_and_time_ranges_act_inside_the_turn_search(store):
    rmm, emb = bank(store)
    got = rmm.retrieve("violin Pepper", turns=6, filter={"session_id": "session_3"})
    assert got.n_turns == 6 and all(t.startswith("D3:") for t in got.all_turn_ids)
    from memkern.text.template import event_seconds

    lo, hi = event_seconds("15 May 2023"), event_seconds("1 June 2023")
    got = rmm.retrieve("violin marathon Pepper", turns=10, time_range=(lo, hi))
    assert got.n_turns == 6 and all(t.startswith("D2:") for t in got.all_turn_ids)
    # the same as the store's one-call search with those filters
    q = "violin marathon Pepper"
    ids, _ = store.search(NS, emb.encode([q], kind="query"), k=10, level="turn+topic", time_range=(lo, hi),
                          **rmm._first_stage(q, 10, {}))
    assert sorted(got.all_turn_ids) == sorted(store.get(int(i)).turn["turn_id"] for i in ids[0] if i >= 0)


def test_neighbour_context_fills_the_budget_with_the_adjacent_turn(store):
    # "wonderful" matches only D1:2 (Bo's reply); what it replies to is the turn before it, D1:1,
    # which shares no word with the question: the neighbour term brings it into a 2-turn budget
    q = "Who said wonderful?"
    on, _ = bank(store)
    off, _ = bank(InMemoryStore(DIM, "cos"), neighbour_weight=0.0, session_weight=0.0)
    got_on, got_off = on.retrieve(q, turns=2).all_turn_ids, off.retrieve(q, turns=2).all_turn_ids
    assert sorted(got_on) == ["D1:1", "D1:2"]
    assert "D1:2" in got_off and "D1:1" not in got_off


def test_config_checks():
    for bad in (dict(turn_stage="sparse"), dict(lexical_weight=1.5), dict(neighbour_weight=float("nan")),
                dict(session_weight="0.3"), dict(candidates=0), dict(topic_min_turns=0), dict(alpha=1e9),
                dict(text_template="{speaker} only")):
        with pytest.raises(Exception, match=next(iter(bad))):
            RMMConfig(**bad)


def test_text_template_sets_the_turn_texts(store):
    rmm, _ = bank(store, text_template="{content}")
    r = store.get(int(store.ids(NS, level="turn")[0]))
    assert r.summary == r.turn["content"]
    # the vectors still embed the turn template
    assert rmm.turn_template.render_turn(r.turn).startswith("[2023-05-08] Ann: ")


def test_a_fresh_reranker_keeps_the_first_stage_order_of_the_candidates(store):
    # the candidates' embeddings (best turn + alpha * topic) order them by dense similarity; the
    # first stage fuses BM25 and context terms: the prior makes the reranker keep its order
    rmm, emb = bank(store, top_k=8)
    for q in ("Who said wonderful?", "Ann adopted which puppy?", "violin case chewed", "Oslo snow pictures",
              "How long did the marathon take Bo?", "Bach partitas"):
        timings: dict = {}
        qv = emb.encode([q], kind="query")
        ids, _, m_sel, sel, groups = rmm._retrieve_and_rerank(qv, timings, order_all=True, explore=False,
                                                              search_kw=rmm._first_stage(q, 5, {}))
        assert m_sel.tolist() == ids.tolist(), q
        best = [groups[int(i)].best for i in ids]
        assert best == sorted(best, reverse=True)
