"""Two-level memory (issue 7): turn records linked to their topic, turn and turn+topic search.

Runs on both stores (``make_store``, tests/conftest.py); reopening is MemoryStore's alone."""
from __future__ import annotations

import numpy as np
import pytest

from memkern import MemkernKeyError, MemkernValueError
from memkern.store import MemoryStore

D = 16


def unit(n: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, D)).astype(np.float32)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def conv(n: int, tag: str) -> list[dict]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"{tag}-{i}", "session_id": tag,
             "turn_index": i} for i in range(n)]


@pytest.fixture
def two_level(make_store):
    """12 topics with 1..6 turns each in namespace "u", plus one in "v"."""
    s = make_store(D, "cos", name="t")
    rng = np.random.default_rng(0)
    topics, turn_vecs = [], []
    sizes = [int(rng.integers(1, 7)) for _ in range(12)]
    te = [unit(n, 100 + i) for i, n in enumerate(sizes)]
    ids = s.add_batch("u", [f"topic {i}" for i in range(12)], unit(12, 1), turns=[conv(n, f"t{i}") for i, n in
                      enumerate(sizes)], turn_embeddings=te)
    other = s.add("v", "other", unit(1, 2)[0], conv(3, "o"), turn_embeddings=unit(3, 3))
    yield s, ids, sizes, te, other
    s.close()


def brute_turn_topic(s: MemoryStore, ns_topics, q, alpha):
    """Exact sim(q, turn) + alpha * sim(q, topic) over all active turns of the topics."""
    rows = []
    for t in ns_topics:
        rec = s.get(int(t))
        if rec.status != "active":
            continue
        tv = s.embeddings([int(t)])[0]
        for c in rec.turn_ids:
            cv = s.embeddings([c])[0]
            rows.append((float(q @ cv + alpha * (q @ tv)), c))
    rows.sort(key=lambda r: (-r[0], r[1]))
    return rows


def test_turn_records_link_to_topics(two_level):
    s, ids, sizes, te, other = two_level
    assert s.count("u") == 12 and s.count("u", level="turn") == sum(sizes)
    for i, t in enumerate(ids):
        rec = s.get(int(t))
        assert rec.level == "topic" and rec.topic_id is None and len(rec.turn_ids) == sizes[i]
        assert rec.turns == conv(sizes[i], f"t{i}")
        for j, c in enumerate(rec.turn_ids):
            tr = s.get(c)
            assert tr.level == "turn" and tr.topic_id == int(t) and tr.namespace == "u"
            assert tr.turn == rec.turns[j] and tr.summary == rec.turns[j]["content"]
            np.testing.assert_allclose(tr.embedding, te[i][j], rtol=1e-6, atol=1e-7)
    # topic search never returns turns, turn search never returns topics
    q = unit(5, 9)
    got, _ = s.search("u", q, k=30)
    assert set(got[got >= 0].tolist()) == set(ids.tolist())
    got, _ = s.search("u", q, k=100, level="turn")
    assert sorted(got[0][got[0] >= 0].tolist()) == sorted(c for t in ids for c in s.get(int(t)).turn_ids)


def test_turn_search_exact_membership_and_isolation(two_level):
    s, ids, sizes, te, other = two_level
    other_turns = set(s.get(other).turn_ids)
    for level in ("turn", "turn+topic"):
        got, sc = s.search("u", unit(8, 11), k=7, level=level)
        for row in got:
            for c in row[row >= 0]:
                tr = s.get(int(c))
                assert tr.level == "turn" and int(c) in s.get(tr.topic_id).turn_ids
                assert tr.topic_id in ids and int(c) not in other_turns
        assert np.isfinite(sc).all()


@pytest.mark.parametrize("alpha", [0.0, 1.0, 2.0])
def test_turn_plus_topic_scores_exact(two_level, alpha):
    s, ids, sizes, te, other = two_level
    q = unit(4, 21)
    n_turns = sum(sizes)
    got, sc = s.search("u", q, k=n_turns + 3, level="turn+topic", alpha=alpha, candidates=100, ef=200)
    for b in range(4):
        ref = brute_turn_topic(s, ids, q[b], alpha)
        assert got[b, :n_turns].tolist() == [c for _, c in ref]
        np.testing.assert_allclose(sc[b, :n_turns], [v for v, _ in ref], rtol=1e-5, atol=1e-5)
        assert (got[b, n_turns:] == -1).all()
    # default candidates (small k): the top few still match the exact ranking
    got5, sc5 = s.search("u", q, k=5, level="turn+topic", alpha=alpha)
    for b in range(4):
        np.testing.assert_allclose(sc5[b], [v for v, _ in brute_turn_topic(s, ids, q[b], alpha)[:5]], rtol=1e-5,
                                   atol=1e-5)


def test_turns_with_topics(two_level):
    s, ids, sizes, te, other = two_level
    got, _ = s.search("u", unit(2, 31), k=sum(sizes) + 2, level="turn+topic")
    pairs = s.turns_with_topics(got[0])
    assert len(pairs) == sum(sizes)  # padding skipped
    for (turn, topic), c in zip(pairs, got[0]):
        assert turn.id == c and topic.id == turn.topic_id and turn.id in topic.turn_ids
        assert topic.summary.startswith("topic ") and turn.turn in topic.turns
    with pytest.raises(MemkernValueError, match="turn record ids"):
        s.turns_with_topics([int(ids[0])])
    assert s.turns_with_topics(np.array([-1, -1])) == []


def test_delete_topic_deletes_its_turns(two_level):
    s, ids, sizes, te, other = two_level
    victim = int(ids[3])
    turns = s.get(victim).turn_ids
    before = s.count("u", level="turn")
    s.delete(victim)
    assert s.count("u", level="turn") == before - len(turns) and s.count("u") == 11
    for c in turns:
        with pytest.raises(MemkernKeyError, match="deleted"):
            s.get(c)
    for level in ("turn", "turn+topic"):
        got, _ = s.search("u", np.concatenate([te[3], unit(2, 5)]), k=200, level=level)
        assert not set(got.ravel().tolist()) & set(turns)
    # deleting a single turn unlinks it from its topic
    t0 = s.get(int(ids[0])).turn_ids
    s.delete(t0[0])
    assert s.get(int(ids[0])).turn_ids == t0[1:]
    s.compact()
    assert s.count("u", level="turn") == before - len(turns) - 1


def test_invalidate_topic_hides_turns(two_level):
    s, ids, sizes, te, other = two_level
    victim = int(ids[5])
    turns = s.get(victim).turn_ids
    s.invalidate(victim, "outdated")
    assert all(s.get(c).status == "invalidated" for c in turns)
    for level in ("turn", "turn+topic"):
        got, _ = s.search("u", te[5], k=100, level=level)
        assert not set(got.ravel().tolist()) & set(turns)
        got, _ = s.search("u", te[5], k=100, level=level, include_invalidated=True)
        assert set(turns) <= set(got.ravel().tolist())


def test_merge_and_update_turn_records(two_level, tmp_path):
    s, ids, sizes, te, other = two_level
    t = int(ids[0])
    old = s.get(t)
    new_turns = [old.turns[0], {"role": "user", "content": "brand new"}]
    s.merge(t, "merged", unit(1, 50)[0], new_turns, turn_embeddings=unit(2, 51))
    rec = s.get(t)
    assert rec.turns == old.turns + [new_turns[1]] and len(rec.turn_ids) == len(old.turn_ids) + 1
    added = s.get(rec.turn_ids[-1])
    assert added.turn == new_turns[1] and added.meta == {"turn_position": len(old.turns)}
    np.testing.assert_allclose(added.embedding, unit(2, 51)[1], rtol=1e-6, atol=1e-7)
    with pytest.raises(MemkernValueError, match="turn_embeddings"):  # would leave a turn without a record
        s.merge(t, "m2", unit(1, 52)[0], [{"role": "user", "content": "another"}])
    assert s.get(t).version == rec.version
    s.merge(t, "m3", unit(1, 52)[0], [new_turns[1]])  # nothing new: no turn embeddings needed
    assert s.get(t).turn_ids == rec.turn_ids
    # update of turns: needs embeddings for the new turns when turn records exist
    with pytest.raises(MemkernValueError, match="turn_embeddings"):
        s.update(t, turns=conv(2, "z"))
    s.update(t, turns=conv(2, "z"), turn_embeddings=unit(2, 60))
    rec = s.get(t)
    assert len(rec.turn_ids) == 2 and [s.get(c).summary for c in rec.turn_ids] == ["z-0", "z-1"]
    for c in added.id, *old.turn_ids:
        assert c not in s
    # refused: wrong number of turn embeddings changes nothing
    n_before = s.count("u", level="turn")
    with pytest.raises(MemkernValueError, match=r"turn_embeddings: expected shape \[2, 16\]"):
        s.add("u", "x", unit(1, 1)[0], conv(2, "q"), turn_embeddings=unit(3, 1))
    assert s.count("u", level="turn") == n_before and s.count("u") == 12
    # links survive reopening
    if not isinstance(s, MemoryStore) or s.path is None:
        return
    path = s.path
    s.close()
    with MemoryStore(path) as s2:
        assert s2.get(t).turn_ids == rec.turn_ids and s2.get(rec.turn_ids[0]).topic_id == t
        got, _ = s2.search("u", unit(1, 60)[0], k=1, level="turn")
        assert got[0, 0] == rec.turn_ids[0]


def test_mixed_batch_and_plain_turns(make_store):
    with make_store(D, name="m") as s:
        ids = s.add_batch("u", ["a", "b", "c"], unit(3, 0), turns=[conv(2, "a"), conv(1, "b"), None],
                          turn_embeddings=[unit(2, 1), None, None])
        assert len(s.get(int(ids[0])).turn_ids) == 2 and s.get(int(ids[1])).turn_ids == ()
        assert s.count("u", level="turn") == 2
        got, sc = s.search("u", unit(1, 1), k=4, level="turn+topic")
        assert (got[0, :2] >= 0).all() and (got[0, 2:] == -1).all()
        got, _ = s.search("nobody", unit(1, 1), k=2, level="turn+topic")
        assert (got == -1).all()
