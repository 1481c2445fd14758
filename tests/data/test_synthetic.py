"""Generated multi-session histories: determinism, exact evidence labels, scale, validation."""
from __future__ import annotations

import re
import time

import pytest

from memkern.data import generate_history
from memkern.data import synthetic as syn
from memkern.errors import MemkernValueError


@pytest.fixture(scope="module")
def ds():
    return generate_history(3, 40, seed=11)


def test_deterministic_and_seed_dependent():
    a = generate_history(2, 15, seed=5)
    b = generate_history(2, 15, seed=5)
    c = generate_history(2, 15, seed=6)
    assert a.content_hash() == b.content_hash() and a.to_dict() == b.to_dict()
    assert a.content_hash() != c.content_hash()


def test_structure_ids_dates(ds):
    ds.validate()
    assert ds.n_sessions == 120 and len(ds.conversations) == 3
    types = {q.question_type for _, q in ds.questions()}
    assert types == set(syn.QUESTION_TYPES)
    for c in ds.conversations:
        dates = [s.date for s in c.sessions]
        assert dates == sorted(dates) and len(set(dates)) == len(dates)
        for s in c.sessions:
            assert [t.turn_id for t in s.turns] == [f"{s.session_id}#{i}" for i in range(len(s.turns))]
        assert all(q.question_date > dates[-1] for q in c.questions)


def test_evidence_labels_are_exact(ds):
    for c in ds.conversations:
        tm = c.turn_map()
        sess_date = {s.session_id: s.date for s in c.sessions}
        used = set()
        for q in c.questions:
            ev = [tm[e] for e in q.evidence_turn_ids]
            assert ev and all(t.role == "user" and t.has_answer for t in ev)
            used.update(q.evidence_turn_ids)
            assert q.evidence_session_ids == list(dict.fromkeys(t.session_id for t in ev))
            last = max(ev, key=lambda t: (sess_date[t.session_id], t.turn_index))
            if q.question_type in ("single-session-user", "knowledge-update"):
                if q.answer == "the trip was cancelled":
                    assert re.search(r"call off|cancelled", last.content)
                else:
                    assert q.answer in last.content
                    # the assistant never repeats the value, so it cannot stand in for the evidence
                    assert not any(q.answer in t.content for t in c.turns() if t.role == "assistant")
                if q.question_type == "knowledge-update":
                    assert len(ev) >= 2 and len({t.session_id for t in ev}) == len(ev)
                else:
                    assert len(ev) == 1
            elif q.question_type == "multi-session":
                assert q.answer == str(len(ev)) and len(ev) >= 2
                spec = next(s for s in syn._EVENTS.values() if s["question"] == q.question)
                pats = [re.escape(t).replace(re.escape("{v}"), "(.+)") for t in spec["state"]]
                assert all(any(re.search(p, t.content) for p in pats) for t in ev)
                # every statement of this event kind by the user is labelled (none missing)
                stated = [t for t in c.turns() if t.role == "user" and any(re.search(p, t.content) for p in pats)]
                assert {t.turn_id for t in stated} == set(q.evidence_turn_ids)
            elif q.question_type == "single-session-preference":
                spec = next(s for s in syn._PREFS.values() if s["question"] == q.question)
                assert len(ev) == 1 and any(stmt in ev[0].content for stmt in spec["values"].values())
            elif q.question_type == "temporal-reasoning":
                assert len(ev) == 2 and ev[0].session_id != ev[1].session_id
                first = min(ev, key=lambda t: sess_date[t.session_id])
                opts = re.match(r"Which came earlier: (.+) or (.+)\?$", q.question).groups()
                assert q.answer in opts
                # the answer's value (its description minus the verb phrase) is in the earlier turn
                value = re.sub(r"^(getting|starting as|moving to|starting|signing up for|planning the trip to|"
                               r"adopting|seeing|hiking|baking|visiting) ", "", q.answer).removesuffix(" live")
                assert value in first.content
        # every labelled turn is evidence of some question
        assert {t.turn_id for t in c.turns() if t.has_answer} == used


def test_hard_negatives_exist(ds):
    """Distractors reuse the user's own values in other people's mouths (same vocabulary)."""
    n = 0
    for c in ds.conversations:
        ev = {e for q in c.questions for e in q.evidence_turn_ids}
        for q in c.questions:
            if q.question_type in ("single-session-user", "knowledge-update") and "cancelled" not in q.answer:
                n += sum(1 for t in c.turns() if q.answer in t.content and t.turn_id not in ev)
    assert n >= 5


@pytest.mark.slow
def test_scales_to_10000_sessions():
    t0 = time.perf_counter()
    big = generate_history(2, 5000, seed=0)
    assert big.n_sessions == 10_000 and time.perf_counter() - t0 < 60
    assert big.n_questions > 2 * 20 and big.n_turns > 50_000


@pytest.mark.parametrize("kw, name", [
    (dict(n_users=0), "n_users"), (dict(sessions_per_user=2), "sessions_per_user"),
    (dict(p_update=1.5), "p_update"), (dict(p_other=-1), "p_other"),
    (dict(segments_per_session=(3, 1)), "segments_per_session"), (dict(start_date="tomorrow"), "start_date"),
])
def test_bad_arguments(kw, name):
    args = dict(n_users=1, sessions_per_user=5) | kw
    with pytest.raises(MemkernValueError, match=name):
        generate_history(**args)
