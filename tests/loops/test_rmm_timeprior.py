"""RMM's time term (memkern.loops.rmm.timeprior): a question's time reorders the first stage's turns
(soft), or bounds them (hard); turns are annotated with the time they mention; ``now`` defaults
to the bank's latest session date; a caller's own time filters switch the term off."""
from __future__ import annotations

import datetime as dt

import pytest

from fakes_rmm import HashEmbedder
from memkern.errors import MemkernValueError
from memkern.loops.rmm import RMM, RMMConfig
from memkern.store import MemoryStore

DIM = 64
NS = "u"


class NoChat:
    def generate(self, prompts, max_new_tokens=None, json=False, temperature=0.0, seed=None):
        raise AssertionError("retrieve must not call the chat model")

    def count_tokens(self, text):
        return len(text.split())


def secs(y, m, d):
    return dt.datetime(y, m, d, tzinfo=dt.timezone.utc).timestamp()


# Each session: the fact turn plus small talk. The July turn shares more words with the questions
# than the May one, so without the time term it ranks first.
SESSIONS = [
    ("2023-05-04", [("Maria", "My mom and I made lasagna for dinner last night!", "D1:1"),
                    ("John", "That sounds lovely, family time matters.", "D1:2")]),
    ("2023-06-12", [("John", "I ran a charity race on Sunday morning.", "D2:1"),
                    ("Maria", "Congrats on the race, John!", "D2:2")]),
    ("2023-06-14", [("John", "After all that I went fishing with my kids.", "D3:1"),
                    ("Maria", "Fishing is relaxing.", "D3:2")]),
    ("2023-07-10", [("Maria", "Maria: I make dinner with my mom for her friends, what a dinner with mom.", "D4:1"),
                    ("John", "Nice, I like cooking too.", "D4:2")]),
]


def bank(tmp_path, **kw):
    store = MemoryStore(tmp_path / "s", dim=DIM, metric="cos", fsync="never")
    args = dict(chat_model=NoChat(), embedder=HashEmbedder(DIM), namespace=NS, persist=False, extractor="embedding",
                explore=False, top_k=8, top_m=4)
    args.update(kw)
    r = RMM(store, **args)
    for i, (date, turns) in enumerate(SESSIONS):
        r.end_session([{"role": "user" if s == "Maria" else "assistant", "content": c, "speaker": s, "turn_id": t}
                       for s, c, t in turns], session_id=f"session_{i + 1}", date=date)
    return r, store


def ranked(r, q, n=8, **kw):
    return r.retrieve(q, turns=n, **kw).all_turn_ids


def first_stage(r, q, now=None):
    """The two-level first stage's turns, best first, after the time term (what the reranker and
    the turn budget then read): [(turn id, score)]."""
    tq = r._time_query(q, now, {})
    _, groups = r._retrieve_turn_topic(r._embed([q], kind="query"), {}, tq)
    pairs = [(r.store.get(t).turn["turn_id"], s) for g in groups.values() for t, s in zip(g.turn_ids, g.scores)]
    return sorted(pairs, key=lambda x: -x[1])


def first_of(ids, a, b):
    """Which of turn ids a, b comes first."""
    return a if ids.index(a) < ids.index(b) else b


def test_soft_prior_prefers_the_named_date(tmp_path):
    q = "What did Maria make for dinner with her mom on May 3, 2023?"
    off, st = bank(tmp_path / "a", time_prior="off")
    base = [t for t, _ in first_stage(off, q)]
    assert first_of(base, "D1:1", "D4:1") == "D4:1"  # the word-overlap winner
    on, st2 = bank(tmp_path / "b")
    assert on.config.time_prior == "soft"
    got = first_stage(on, q)
    ids = [t for t, _ in got]
    assert ids[0] == "D1:1" and set(ids) == set(base)  # reordered, none dropped
    sc = dict(got)
    assert sc["D4:1"] == pytest.approx(dict(first_stage(off, q))["D4:1"], abs=5e-3)  # July: ~no prior
    assert set(ranked(on, q)) == set(ranked(off, q))
    assert on.retrieve(q, turns=8).timings["time"] < 0.05
    for x in (off, on):
        x.close()
    st.close(); st2.close()


def test_turns_carry_the_time_they_mention(tmp_path):
    r, st = bank(tmp_path)
    turn = next(t.turn for t, _ in st.turns_with_topics(st.ids(NS, level="turn"))
                if t.turn.get("turn_id") == "D1:1")
    assert turn["mentioned_time"] == [secs(2023, 5, 3), secs(2023, 5, 4)]  # "last night", said on May 4
    plain = next(t.turn for t, _ in st.turns_with_topics(st.ids(NS, level="turn")) if t.turn.get("turn_id") == "D1:2")
    assert "mentioned_time" not in plain
    r.close(); st.close()


def test_intent_prefers_turns_that_mention_a_time(tmp_path):
    q = "When did Maria make dinner with her mom for friends?"
    off, st = bank(tmp_path / "a", time_prior="off")
    assert first_of([t for t, _ in first_stage(off, q)], "D1:1", "D4:1") == "D4:1"
    on, st2 = bank(tmp_path / "b", time_intent_weight=1.0)
    assert first_of([t for t, _ in first_stage(on, q)], "D1:1", "D4:1") == "D1:1"  # it says "last night"
    zero, st3 = bank(tmp_path / "c", time_intent_weight=0.0)
    assert [t for t, _ in first_stage(zero, q)] == [t for t, _ in first_stage(off, q)]
    for x in (off, on, zero, st, st2, st3):
        x.close()


def test_hard_range_keeps_only_turns_in_the_window(tmp_path):
    r, st = bank(tmp_path, time_prior="hard")
    got = ranked(r, "What did Maria make for dinner in July 2023?")
    assert got and all(t.startswith("D4:") for t in got)  # session 4 (July 10) only
    assert ranked(r, "What did Maria make for dinner?")  # no range: nothing filtered
    r.close(); st.close()


def test_now_defaults_to_the_latest_session_and_can_be_given(tmp_path):
    r, st = bank(tmp_path, time_prior="hard")
    # latest session: 2023-07-10 (a Monday); "last week" = July 3-10 (+ the 7-day lag): session 4 only
    assert all(t.startswith("D4:") for t in ranked(r, "What happened last week?"))
    # now = 2023-06-20: last week = June 12-19 (+ lag): sessions 2 and 3
    got = ranked(r, "What happened last week?", now=secs(2023, 6, 20))
    assert got and {t.split(":")[0] for t in got} == {"D2", "D3"}
    # a later session moves the default now
    r.end_session([{"role": "user", "content": "Back from holiday.", "speaker": "Maria", "turn_id": "D5:1"}],
                  session_id="session_5", date="2023-09-01")
    assert ranked(r, "What happened last week?") == ["D5:1"]
    # a fresh reader of the same bank reads the latest event time from the store
    r2 = RMM(st, chat_model=NoChat(), embedder=HashEmbedder(DIM), namespace=NS, persist=False, extractor="embedding",
             explore=False, top_k=8, top_m=4, time_prior="hard")
    assert r2._latest_event_time() == secs(2023, 9, 1)
    r2.close(); r.close(); st.close()


def test_an_undated_bank_is_read_once_for_now(tmp_path):
    """A bank without event times is not re-read on every question (a 10k-record bank made
    ``respond`` O(N)); a dated session written later still moves ``now``."""
    store = MemoryStore(tmp_path / "s", dim=DIM, metric="cos", fsync="never")
    emb = HashEmbedder(DIM)
    for i in range(40):
        store.add(NS, f"undated memory {i}", emb.encode([f"undated memory {i}"])[0])
    r = RMM(store, chat_model=NoChat(), embedder=emb, namespace=NS, persist=False, extractor="embedding",
            explore=False, top_k=8, top_m=4)
    sizes = []
    real = store.get_batch
    store.get_batch = lambda ids, *a, **k: (sizes.append(len(ids)), real(ids, *a, **k))[1]
    for q in ("What happened last week?", "Where is the memory?", "What happened last week?"):
        r.retrieve(q)
    assert sizes.count(40) == 1, sizes  # the namespace was read for its latest event time once
    assert r._latest_event_time() is None
    r.end_session([{"role": "user", "content": "Back from holiday.", "speaker": "Maria", "turn_id": "D5:1"}],
                  session_id="session_5", date="2023-09-01")
    assert r._time_now(None) == secs(2023, 9, 1)
    assert sizes.count(40) == 1
    r.close(); store.close()


def test_respond_reads_now_from_the_session_turns(tmp_path):
    r, st = bank(tmp_path)
    assert r._time_now(None, [{"role": "user", "content": "hi", "date": "2023-06-20"}]) == secs(2023, 6, 20)
    assert r._time_now(None, [{"role": "user", "content": "hi"}]) == secs(2023, 7, 10)
    assert r._time_now(5.0, [{"role": "user", "content": "hi", "date": "2023-06-20"}]) == 5.0
    r.close(); st.close()


def test_an_explicit_time_filter_turns_the_term_off(tmp_path):
    r, st = bank(tmp_path, time_prior="hard")
    q = "What did Maria make for dinner in July 2023?"
    got = ranked(r, q, time_range=(secs(2023, 5, 1), secs(2023, 5, 31)))
    assert got and all(t.startswith("D1:") for t in got)  # the caller's range, not July
    assert r._time_query(q, None, {"recency": 1.0}) is None
    r.close(); st.close()


def test_anchor_is_placed_by_a_lexical_search(tmp_path):
    r, st = bank(tmp_path, time_prior="hard")
    tq = r._time_query("What did John do the day after the charity race?", None, {})
    assert tq is None  # hard: the anchored range went into the search keywords
    kw = {}
    r._time_query("What did John do two days after the charity race?", None, kw)
    # the race turn is in session 2 (2023-06-12): two days after = June 14 (+ lag)
    assert kw["time_range"][0] == secs(2023, 6, 14)
    got = ranked(r, "What did John do two days after the charity race?")
    assert got and {t.split(":")[0] for t in got} == {"D3"}
    r.close(); st.close()


def test_config_checks():
    assert RMMConfig().time_prior == "soft"
    with pytest.raises(MemkernValueError, match="time_prior"):
        RMMConfig(time_prior="sometimes")
    for name in ("time_weight", "time_intent_weight"):
        for bad in (-0.1, float("nan"), float("inf")):
            with pytest.raises(MemkernValueError, match=name):
                RMMConfig(**{name: bad})
