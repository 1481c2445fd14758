"""The typed Python <-> C++ contract of ``memkern._store``: enums for level, status and version op,
structured read-only records, and a ``.pyi`` stub that lists exactly what the module binds."""
from __future__ import annotations

import ast
import json
from pathlib import Path

import numpy as np
import pytest

from memkern import _store
from memkern._store import Level, Op, Status, StoredRecord, StoredVersion
from memkern.store.checks import LEVELS as _LEVELS
from memkern.store import MemoryStore

STUB = Path(__file__).resolve().parents[2] / "python" / "memkern" / "_store.pyi"


def _stub_classes() -> dict[str, set[str]]:
    tree = ast.parse(STUB.read_text())
    out = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            names = set()
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    names.add(item.name)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    names.add(item.target.id)
                elif isinstance(item, ast.Assign):
                    names.update(t.id for t in item.targets if isinstance(t, ast.Name))
            out[node.name] = {n for n in names if not n.startswith("_")}
    return out


def _public(cls) -> set[str]:
    return {n for n in dir(cls) if not n.startswith("_")}


def test_stub_lists_what_the_module_binds():
    stub = _stub_classes()
    for name in ("Store", "StoredRecord", "StoredVersion"):
        cls = getattr(_store, name)
        assert _public(cls) == stub[name], (name, _public(cls) ^ stub[name])
    for enum in (Level, Status, Op):
        members = {k: int(v) for k, v in enum.__members__.items()}
        declared = {}
        for node in ast.parse(STUB.read_text()).body:
            if isinstance(node, ast.ClassDef) and node.name == enum.__name__:
                for item in node.body:
                    if isinstance(item, ast.Assign):
                        declared[item.targets[0].id] = item.value.value
        assert members == declared, (enum.__name__, members, declared)


def test_enum_values_are_the_stored_bytes():
    assert (int(Level.topic), int(Level.turn)) == (0, 1)
    assert (int(Status.active), int(Status.invalidated)) == (0, 1)
    assert (int(Op.add), int(Op.merge), int(Op.update)) == (0, 1, 2)
    assert {name: int(getattr(Level, name)) for name in _LEVELS} == _LEVELS  # store.py's level table


@pytest.fixture()
def store(tmp_path):
    s = MemoryStore(tmp_path / "s", dim=4, fsync="never")
    yield s
    s.close()


def test_native_records_are_typed_and_read_only(store):
    v = np.array([1, 0, 0, 0], np.float32)
    rid = store.add("u", "topic", v, [{"role": "user", "content": "hi"}], meta={"a": 1},
                    turn_embeddings=np.ones((1, 4), np.float32))
    store.merge(rid, "topic 2", v * 2)
    n = store._native
    r = n.get(rid)
    assert isinstance(r, StoredRecord)
    assert (r.level, r.status, r.op, r.version) == (Level.topic, Status.active, Op.merge, 2)
    assert r.level is Level.topic and r.status is Status.active and r.op is Op.merge  # the enums' own objects
    assert r.parent == -1 and len(r.children) == 1 and r.summary == "topic 2" and json.loads(r.meta_json) == {"a": 1}
    t = n.get(r.children[0])
    assert (t.level, t.parent) == (Level.turn, rid)
    with pytest.raises(AttributeError):
        r.summary = "x"
    e = r.embedding
    e[:] = 0  # a copy: the record (and the store) keep the vector
    np.testing.assert_array_equal(r.embedding, v * 2)
    hist = n.history(rid)
    assert all(isinstance(h, StoredVersion) for h in hist)
    assert [(h.version, h.op, h.summary) for h in hist] == [(1, Op.add, "topic"), (2, Op.merge, "topic 2")]
    np.testing.assert_array_equal(hist[0].embedding, v)
    store.invalidate(rid, "old")
    assert n.get(rid).status == Status.invalidated and n.get_batch(np.array([rid]))[0].reason == "old"


def test_native_levels_and_ops_refuse_bare_integers(store):
    store.add("u", "topic", np.ones(4, np.float32))
    n = store._native
    q = np.ones((1, 4), np.float32)
    assert n.search("u", q, 1, 10, False, Level.topic)[0][0, 0] == 0
    for call in (lambda: n.search("u", q, 1, 10, False, 0), lambda: n.ids("u", False, 1),
                 lambda: n.count("u", False, 0), lambda: n.index_kind("u", 0)):
        with pytest.raises(TypeError):
            call()
    empty = np.zeros((0, 4), np.float32)
    with pytest.raises(TypeError):
        n.new_version(0, 2, "s", None, None, None, [], [], [], empty, False)
    with pytest.raises(ValueError, match="op: expected merge or update"):
        n.new_version(0, Op.add, "s", None, None, None, [], [], [], empty, False)
    assert store.get(0).version == 1  # nothing was written


def test_public_record_keeps_string_fields(store):
    rid = store.add("u", "topic", np.ones(4, np.float32), [{"role": "user", "content": "a"}],
                    turn_embeddings=np.ones((1, 4), np.float32))
    r = store.get(rid)
    assert (r.level, r.status, r.topic_id, r.invalidated_reason) == ("topic", "active", None, None)
    t = store.get(r.turn_ids[0])
    assert (t.level, t.topic_id, t.turn) == ("turn", rid, {"role": "user", "content": "a"})
    store.invalidate(rid, "gone")
    r = store.get(rid)
    assert (r.status, r.invalidated_reason) == ("invalidated", "gone")
    assert [h.version for h in store.history(rid)] == [1] and store.history(rid)[0].status == "invalidated"
