"""memkern.store.bank: a namespace's bank listed, counted and deleted without models (what `memkern
inspect`, `memkern forget` and `RMM.inspect` / `RMM.stats` use)."""
from __future__ import annotations

import numpy as np
import pytest

from fakes_rmm import FakeStore
from memkern.store.bank import Bank, namespace_ids
from memkern.errors import MemkernValueError

DIM = 8


def _vec(i: int) -> np.ndarray:
    v = np.zeros(DIM, np.float32)
    v[i % DIM] = 1.0
    return v


def _store(tmp_path) -> FakeStore:
    store = FakeStore(dim=DIM, path=str(tmp_path / "s"))
    store.add("other", "someone else", _vec(7), turns=[{"role": "user", "content": "x", "session_id": "o"}])
    for i, s in enumerate(["tea", "coffee", "berlin"]):
        store.add("u", f"the user likes {s}", _vec(i),
                  turns=[{"role": "user", "content": s, "session_id": f"s{i}"},
                         {"role": "user", "content": s + "!", "session_id": f"s{i}"}])
    return store


def test_inspect_lists_the_namespace_by_id_with_status_filter(tmp_path):
    store = _store(tmp_path)
    ids = namespace_ids(store, "u")
    assert ids == sorted(ids) and len(ids) == 3
    store.invalidate(ids[1], "changed")
    store.update(ids[2], summary="the user lives in Berlin")
    bank = Bank(store, "u")
    rows = bank.inspect()
    assert [r["id"] for r in rows] == ids
    assert [r["status"] for r in rows] == ["active", "invalidated", "active"]
    assert rows[2]["summary"] == "the user lives in Berlin" and rows[2]["version"] == 2
    assert rows[0]["sessions"] == ["s0"] and rows[0]["turns"] == 2
    assert [r["id"] for r in bank.inspect(include_invalidated=False)] == [ids[0], ids[2]]
    assert bank.stats() == {"namespace": "u", "records": 3, "by_status": {"active": 2, "invalidated": 1}}


def test_reset_deletes_one_namespace_and_its_reranker_files(tmp_path):
    from memkern.base.paths import RERANKER_SUFFIXES, reranker_file

    store = _store(tmp_path)
    files = [reranker_file(store.path, "u", sfx) for sfx in RERANKER_SUFFIXES]
    for f in files:
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(b"x")
    assert Bank(store, "u").reset() == 3
    assert namespace_ids(store, "u") == [] and not any(f.exists() for f in files)
    assert len(namespace_ids(store, "other")) == 1  # another namespace is untouched


def test_bad_namespace_rejected_before_anything_is_deleted(tmp_path):
    store = _store(tmp_path)
    with pytest.raises(MemkernValueError, match="namespace"):
        Bank(store, "../u")
    assert len(namespace_ids(store, "u")) == 3


def test_rmm_inspect_and_stats_are_the_bank(tmp_path):
    from fakes_rmm import HashEmbedder
    from memkern.loops.rmm import RMM

    store = _store(tmp_path)
    rmm = RMM(store, embedder=HashEmbedder(DIM), namespace="u", persist=False)
    assert rmm.inspect() == Bank(store, "u").inspect()
    assert rmm.stats() == {**Bank(store, "u").stats(), "responses": 0, "reranker_updates": 0, "pending_rewards": 0}
