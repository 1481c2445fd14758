"""memkern.text.contradict: first-person slot statements and when a later one makes an earlier one stale;
EmbeddingDecider UPDATEs / INVALIDATEs instead of MERGE; RMM(supersede=True) invalidates the stale
turn record and keeps it readable with its reason."""
from __future__ import annotations

import pytest

from fakes_rmm import HashEmbedder
from memkern.text.contradict import Statement, contradicts, find_contradictions, same_value, statements
from memkern.errors import MemkernTypeError
from memkern.loops.rmm import RMM
from memkern.store import MemoryStore
from memkern.ingest.apply import Candidate, EmbeddingDecider


def said(text, speaker="Ann"):
    return [(s.attribute, s.value, s.negated) for s in statements(text, speaker)]


@pytest.mark.parametrize("text,want", [
    ("I live in Berlin.", [("location", "berlin", False)]),
    ("We still live in New York City.", [("location", "new york city", False)]),
    ("I moved to Munich last month!", [("location", "munich", False)]),
    ("We're moving to St. Louis at the end of May.", [("location", "st. louis", False)]),
    ("We moved again! We're settling into a house in Denver now.", [("location", "denver", False)]),
    ("We relocated for good, home is Raleigh these days.", [("location", "raleigh", False)]),
    ("Nine years! Lisbon feels like home at this point.", [("location", "lisbon", False)]),
    ("I don't live in Oslo anymore.", [("location", "oslo", True)]),
    ("I used to live in Paris.", [("location", "paris", True)]),
    ("I work as a nurse at St. Mary's Hospital.", [("job", "nurse at st. mary's hospital", False)]),
    ("I just started a new position as a UX designer at Lumen Labs.", [("job", "ux designer at lumen labs", False)]),
    ("I got promoted to assistant manager!", [("job", "assistant manager", False)]),
    ("I no longer work at the bakery.", [("job", "bakery", True)]),
    ("I quit my job", [("job", None, True)]),
    ("Lost my job as a banker yesterday, so I'm starting a business.", [("job", "banker", True)]),
    ("I got laid off from Acme.", [("job", "acme", True)]),
    ("Today was my last shift at the bakery.", [("job", "bakery", True)]),
    ("I left my old job, and I'm working as a data analyst at Brightwave now.",
     [("job", None, True), ("job", "data analyst at brightwave", False)]),
    ("I'm dating Tom.", [("relationship", "tom", False)]),
    ("We broke up.", [("relationship", None, True)]),
    ("I'm single again.", [("relationship", "single", False)]),
    ("We adopted a beagle named Biscuit.", [("pet", "biscuit", False)]),
    ("Max passed away last week.", [("pet", "max", True)]),
    ("We had to say goodbye to Max.", [("pet", "max", True)]),
    ("So now I drive a red Mazda 3.", [("car", "red mazda 3", False)]),
    ("Big change, I sold my previous car and bought a blue Subaru Outback.",
     [("car", None, True), ("car", "blue subaru outback", False)]),
    ("I'm vegetarian now.", [("diet", "vegetarian", False)]),
    ("I'm no longer vegetarian.", [("diet", "vegetarian", True)]),
    ("My favorite band is Queen.", [("favorite:band", "queen", False)]),
    ("We're planning our anniversary trip to Vancouver this year.", [("trip:anniversary", "vancouver", False)]),
    ("Change of plans, the anniversary trip is going to Kyoto instead.", [("trip:anniversary", "kyoto", False)]),
    ("I stopped doing pottery.", [("activity", "pottery", True)]),
])
def test_statements(text, want):
    assert said(text) == want


@pytest.mark.parametrize("text", [
    "My sister lives in Paris.", "My best friend Lucas just bought a white Tesla Model 3.",
    "Do you live in Oslo?", "If I lived in Rome I would be happy.", "I wish I lived in Lisbon.",
    "I'm thinking about moving to Denver.", "I'd love to work as a chef someday.", "When did you move to Berlin?",
    "I dropped off the cookies at the shelter.", "Tom went out and bought a Honda.", "I'm in a good mood.",
    "Lisbon is lovely in spring.", "I moved the couch to the other room.", "I work out every morning.",
    "I never lived in Oslo.", "Do I live in Berlin or in Munich now?", "If I moved to Denver, I would miss you.",
    "I hope I work at Google one day.", "My sister moved to Denver, she said I live too far away.", "",
])
def test_not_statements(text):
    assert said(text) == []


def test_subject_is_the_speaker():
    assert {s.subject for s in statements("I live in Berlin.", "Caroline")} == {"caroline"}
    assert {s.subject for s in statements("I live in Berlin.")} == {"user"}
    with pytest.raises(MemkernTypeError, match="text"):
        statements(None)
    with pytest.raises(MemkernTypeError, match="speaker"):
        statements("I live in Berlin.", 3)


def st(text, speaker="Ann"):
    (s,) = statements(text, speaker)
    return s


@pytest.mark.parametrize("old,new,want", [
    ("I live in Berlin.", "I moved to Munich.", True),
    ("I moved to Munich.", "I live in Berlin.", True),
    ("I live in Berlin.", "We still live in Berlin, Germany.", False),     # the same place
    ("I live in Berlin.", "I don't live in Berlin anymore.", True),
    ("I live in Berlin.", "I don't live in Paris anymore.", False),        # another value withdrawn
    ("I work at the bakery.", "I quit my job", True),
    ("I work as a nurse at St. Mary's.", "I work as a nurse at St. Mary's Hospital.", False),
    ("I work as a nurse.", "I got promoted to head nurse.", False),        # "nurse" within "head nurse"
    ("I'm dating Tom.", "We broke up.", True),
    ("I'm dating Tom.", "I'm single again.", True),
    ("We adopted a beagle named Biscuit.", "Biscuit passed away.", True),
    ("We adopted a beagle named Biscuit.", "Max passed away.", False),
    ("We adopted a beagle named Biscuit.", "We adopted a kitten named Miso.", False),  # pets add up
    ("I signed up for pottery on Tuesdays.", "I stopped doing pottery.", True),
    ("I signed up for pottery on Tuesdays.", "I stopped doing yoga.", False),
    ("My favorite band is Queen.", "My favorite band is ABBA.", True),
    ("My favorite band is Queen.", "My favorite film is Heat.", False),
    ("I'm vegetarian now.", "I'm no longer vegetarian.", True),
])
def test_contradicts(old, new, want):
    assert contradicts(st(new), st(old)) is want


def test_contradicts_needs_the_same_subject_and_an_active_old_statement():
    assert not contradicts(st("I moved to Munich.", "Bob"), st("I live in Berlin.", "Ann"))
    withdrawn = st("I don't live in Berlin anymore.")
    assert not contradicts(st("I live in Munich."), withdrawn)  # the old one was a withdrawal
    assert same_value("berlin", "berlin germany") and same_value(None, "x") and not same_value("berlin", "munich")


def test_find_contradictions_pairs_keys():
    old = [(7, st("I live in Berlin.")), (8, st("I work at the bakery.")), (9, st("I live in Berlin.", "Bob"))]
    got = find_contradictions(statements("I moved to Munich and I quit my job.", "Ann") +
                              statements("I quit my job.", "Ann"), old)
    assert sorted(k for k, _, _ in got) == [7, 8]
    assert all(isinstance(n, Statement) and isinstance(o, Statement) for _, n, o in got)


# --------------------------------------------------------------------------------------------- decider


def test_embedding_decider_updates_instead_of_merging():
    d = EmbeddingDecider()
    (dec,) = d.decide_batch([("User said: I live in Berlin now.",
                              [Candidate(1, "User said: I moved to Munich. I love pottery.", 0.7)])])
    assert dec.action == "UPDATE" and dec.target == 0
    assert dec.summary == "User said: I love pottery. I live in Berlin now."  # the stale sentence dropped
    assert "munich" in dec.reason
    (dec,) = d.decide_batch([("User said: I quit my job.", [Candidate(1, "User said: I work at the bakery.", 0.5)])])
    assert dec.action == "INVALIDATE" and dec.target == 0
    # the contradicted memory need not be the most similar candidate
    (dec,) = d.decide_batch([("User said: I live in Berlin now.",
                              [Candidate(1, "User said: Berlin has great bakeries.", 0.8),
                               Candidate(2, "User said: I moved to Munich.", 0.5)])])
    assert dec.action == "UPDATE" and dec.target == 1
    # another person's fact, or no slot at all: the similarity rules as before
    (dec,) = d.decide_batch([("User said: My sister lives in Berlin.", [Candidate(1, "User said: I moved to Munich.", 0.7)])])
    assert dec.action == "MERGE"
    off = EmbeddingDecider(slots=False)
    (dec,) = off.decide_batch([("User said: I live in Berlin now.", [Candidate(1, "User said: I moved to Munich.", 0.7)])])
    assert dec.action == "MERGE"  # what the decider did before
    (dec,) = d.decide_batch([("User said: I moved to Munich.", [Candidate(1, "User said: I moved to Munich.", 0.95)])])
    assert dec.action == "NOOP"


# --------------------------------------------------------------------------------------------- RMM

DIM = 64


class NoChat:
    def generate(self, prompts, max_new_tokens=None, json=False, temperature=0.0, seed=None):
        raise AssertionError("no chat model in this test")

    def count_tokens(self, text):
        return len(text.split())


SESSIONS = [
    ("2023-05-01", [("Ann", "I live in Berlin, near the big park.", "D1:1"), ("Bob", "Berlin is a great city.", "D1:2"),
                    ("Bob", "I work at the bakery downtown.", "D1:3")]),
    ("2023-06-01", [("Bob", "My sister lives in Munich now.", "D2:1"), ("Ann", "Munich sounds fun.", "D2:2")]),
    ("2023-07-01", [("Ann", "Big news: I moved to Munich last week!", "D3:1"), ("Bob", "Congrats on the move!", "D3:2"),
                    ("Bob", "I quit my job at the bakery.", "D3:3")]),
]


def make(tmp_path, **kw):
    store = MemoryStore(tmp_path / "s", dim=DIM, metric="cos", fsync="never")
    r = RMM(store, chat_model=NoChat(), embedder=HashEmbedder(DIM), namespace="u", persist=False,
            extractor="embedding", explore=False, top_k=8, top_m=4, **kw)
    out = []
    for i, (date, turns) in enumerate(SESSIONS):
        r.end_session([{"role": "user" if s == "Ann" else "assistant", "content": c, "speaker": s, "turn_id": t}
                       for s, c, t in turns], session_id=f"session_{i + 1}", date=date)
        out.append(list(r.last_superseded))
    return r, store, out


def turn_record(store, turn_id, include_invalidated=True):
    for i in store.ids("u", include_invalidated=include_invalidated, level="turn"):
        rec = store.get(int(i))
        if rec.turn.get("turn_id") == turn_id:
            return rec
    return None


def test_rmm_supersede_invalidates_the_stale_turn_and_keeps_its_history(tmp_path):
    r, store, sup = make(tmp_path, supersede=True)
    assert sup[0] == [] and sup[1] == []  # Bob's sister moving is not Ann's fact
    assert sorted(t for _, t, _ in sup[2]) == ["D3:1", "D3:3"]
    old = turn_record(store, "D1:1")
    assert old.status == "invalidated" and "D3:1" in old.invalidated_reason and "munich" in old.invalidated_reason
    assert turn_record(store, "D1:3").status == "invalidated"
    assert turn_record(store, "D1:1", include_invalidated=False) is None
    # the topic still holds the old turn (the history), the new fact is active and retrievable
    topic = store.get(old.topic_id)
    assert any(t.get("turn_id") == "D1:1" for t in topic.turns)
    assert turn_record(store, "D3:1").status == "active"
    shown = r.retrieve("Where does Ann live?", turns=8).all_turn_ids
    assert "D3:1" in shown and "D1:1" not in shown
    assert "D1:2" in shown or "D1:2" in r.retrieve("Berlin great city", turns=8).all_turn_ids  # others stay
    r.close(); store.close()


def test_rmm_supersede_off_by_default_keeps_both(tmp_path):
    r, store, sup = make(tmp_path)
    assert r.config.supersede is False and sup == [[], [], []]
    assert turn_record(store, "D1:1").status == "active"
    shown = r.retrieve("Where does Ann live?", turns=8).all_turn_ids
    assert "D1:1" in shown and "D3:1" in shown
    r.close(); store.close()


def test_rmm_supersede_index_survives_reopening(tmp_path):
    r, store, _ = make(tmp_path, supersede=True)
    r.close()
    # a new reader of the bank reads the earlier statements from the store
    r2 = RMM(store, chat_model=NoChat(), embedder=HashEmbedder(DIM), namespace="u", persist=False,
             extractor="embedding", explore=False, supersede=True)
    r2.end_session([{"role": "user", "content": "We moved to Hamburg in August.", "speaker": "Ann", "turn_id": "D4:1"}],
                   session_id="session_4", date="2023-08-20")
    assert [t for _, t, _ in r2.last_superseded] == ["D4:1"]
    assert turn_record(store, "D3:1").status == "invalidated"
    # an older session fed late never supersedes a newer statement
    r2.end_session([{"role": "user", "content": "I live in Paris.", "speaker": "Ann", "turn_id": "D0:1"}],
                   session_id="session_0", date="2023-01-01")
    assert r2.last_superseded == [] and turn_record(store, "D4:1").status == "active"
    r2.close(); store.close()
