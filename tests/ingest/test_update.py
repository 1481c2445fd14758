"""Update semantics (ADD / MERGE / UPDATE / INVALIDATE / NOOP) at unit level: turn identity,
model-answer validation, and decisions whose target went inactive. The end-to-end effects are in
test_rmm.py; each test here kills a mutant of ``bench/mutants.py`` that those let through."""
from __future__ import annotations

import numpy as np
import pytest

from fakes_rmm import FakeStore, HashEmbedder
from memkern.ingest.apply import Candidate, Decision, LLMDecider, apply_decision, union_turns


def _turn(content, idx, session="s1", role="user"):
    return {"role": role, "content": content, "session_id": session, "turn_index": idx}


def test_union_keeps_distinct_turns_at_the_same_position():
    # An edited turn (same session, index and role, other words) is another turn: both are kept.
    old = [_turn("I live in Berlin.", 0)]
    new = [_turn("I live in Lisbon now.", 0), _turn("I live in Berlin.", 0)]
    out = union_turns(old, new)
    assert [t["content"] for t in out] == ["I live in Berlin.", "I live in Lisbon now."]


def test_union_is_order_preserving_and_deduplicates_exact_turns():
    a, b, c = _turn("a", 0), _turn("b", 1), _turn("c", 2, session="s2")
    assert union_turns([a, b], [b, c, a]) == [a, b, c]
    assert union_turns(None, [a, a]) == [a]
    assert union_turns([a], None) == [a]


@pytest.mark.parametrize("index, ok", [(0, True), (1, True), (2, False), (-1, False), ("[1]", True), ("7", False)])
def test_llm_decider_rejects_indices_outside_the_candidates(index, ok):
    cands = [Candidate(10, "Alice likes tea.", 0.8), Candidate(11, "Alice has a cat.", 0.7)]
    value = index if isinstance(index, int) else f'"{index}"'
    d = LLMDecider(chat_model=None).parse(f'{{"action": "MERGE", "index": {value}, "summary": "x"}}',
                                          "Alice likes green tea.", cands)
    if ok:
        assert (d.action, d.fallback) == ("MERGE", False)
        assert d.target in (0, 1)
    else:
        assert (d.action, d.fallback, d.target) == ("ADD", True, None)


@pytest.mark.parametrize("action", ["MERGE", "UPDATE", "NOOP", "INVALIDATE"])
def test_decision_on_an_invalidated_target_adds_instead(action):
    emb = HashEmbedder(64)
    store = FakeStore(64)
    old = "Alice works at the bakery."
    rid = store.add("alice", old, emb.encode([old])[0], turns=[_turn(old, 0)])
    store.invalidate(rid, "Alice quit the bakery.")
    new = "Alice works at the bakery on weekends."
    cands = [Candidate(rid, old, 0.9)]
    res = apply_decision(store, "alice", new, emb.encode([new])[0], [_turn(new, 3, session="s2")],
                         Decision(action, 0, new if action in ("MERGE", "UPDATE") else None), cands,
                         embed=lambda t: emb.encode(t))
    assert res.action == "ADD" and res.id != rid and "no longer active" in res.note
    kept = store.get(rid)
    assert kept.status == "invalidated" and kept.summary == old and kept.version == 2
    added = store.get(res.id)
    assert added.summary == new and added.status == "active"


def test_merge_into_active_target_keeps_both_turn_sets():
    emb = HashEmbedder(64)
    store = FakeStore(64)
    old = "Alice works at the bakery."
    rid = store.add("alice", old, emb.encode([old])[0], turns=[_turn(old, 0)])
    new = "Alice works at the bakery on Sundays."
    res = apply_decision(store, "alice", new, emb.encode([new])[0], [_turn(new, 0, session="s2")],
                         Decision("MERGE", 0, None), [Candidate(rid, old, 0.9)], embed=lambda t: emb.encode(t))
    assert (res.action, res.id) == ("MERGE", rid)
    rec = store.get(rid)
    assert [t["content"] for t in rec.turns] == [old, new]
    assert rec.version == 2 and np.isfinite(rec.embedding).all()


# ------------------------------------------------------------------------------- one turn identity
# MERGE goes through store.merge, UPDATE / NOOP through update.union_turns: both must agree on
# which turns are "the same turn" (memkern.base.turns.turn_key), on the real store and on the fake.
def _stores(tmp_path):
    from memkern.store import MemoryStore

    return [("real", MemoryStore(path=str(tmp_path / "real"), dim=64, metric="cos")), ("fake", FakeStore(64))]


@pytest.mark.parametrize("old_turn, new_turn, same", [
    # Re-annotated copy (an extra timestamp): the same turn.
    ({"role": "user", "content": "I adopted a cat.", "session_id": "s1", "turn_index": 0},
     {"role": "user", "content": "I adopted a cat.", "session_id": "s1", "turn_index": 0, "timestamp": "2024-05-01"}, True),
    # The caller's turn_id, re-ingested under another generated session id: the same turn.
    ({"role": "user", "content": "I adopted a cat.", "turn_id": "m-17", "session_id": "s-1700", "turn_index": 0},
     {"role": "user", "content": "I adopted a cat.", "turn_id": "m-17", "session_id": "s-1900", "turn_index": 0}, True),
    # Same turn_id, edited words: another turn (the new words are kept).
    ({"role": "user", "content": "I adopted a cat.", "turn_id": "m-17"},
     {"role": "user", "content": "I adopted two cats.", "turn_id": "m-17"}, False),
    # Same position, other words, no turn_id: another turn.
    ({"role": "user", "content": "I adopted a cat.", "session_id": "s1", "turn_index": 0},
     {"role": "user", "content": "I adopted a dog.", "session_id": "s1", "turn_index": 0}, False),
])
def test_merge_and_update_agree_on_the_same_turn(tmp_path, old_turn, new_turn, same):
    from memkern.base.turns import turn_key

    assert (turn_key(old_turn) == turn_key(new_turn)) == same
    emb = HashEmbedder(64)
    old, new = "Alice has a pet.", "Alice has a pet cat."
    for kind, store in _stores(tmp_path):
        kept = {}
        for action in ("MERGE", "UPDATE", "NOOP"):
            rid = store.add("alice", old, emb.encode([old])[0], turns=[old_turn])
            res = apply_decision(store, "alice", new, emb.encode([new])[0], [new_turn], Decision(action, 0, new),
                                 [Candidate(rid, old, 0.9)], embed=lambda t: emb.encode(t))
            assert res.id == rid
            kept[action] = store.get(rid).turns
        want = [old_turn] if same else [old_turn, new_turn]
        assert kept["MERGE"] == kept["UPDATE"] == kept["NOOP"] == want, kind
        if hasattr(store, "close"):
            store.close()
