"""Hostile input to the store (issue 10, items 4 and 9): every bad argument gives a memkern error
naming it, before anything is allocated or stored; nothing crashes, no score is ever NaN or inf.

Calls that used to crash the process (huge ``k``: ``B * k`` overflowed) run in a subprocess, so a
segfault fails the test cleanly instead of killing pytest. They call both the public
``MemoryStore.search`` and the native ``_store.Store`` directly: the C++ layer checks the limits
itself and never relies on the Python layer.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from memkern.errors import MemkernError, MemkernKeyError, MemkernTypeError, MemkernValueError
from memkern.base.validate import MAX_JSON_DEPTH
from memkern.store import MAX_K, MemoryStore

D = 8

_CRASH_SCRIPT = textwrap.dedent(
    """
    import json, sys, tempfile
    import numpy as np
    from memkern._store import Level
    from memkern.store.memory import InMemoryStore
    from memkern.store import MemoryStore
    case, kind = sys.argv[1], sys.argv[2]
    rng = np.random.default_rng(0)
    s = MemoryStore(tempfile.mkdtemp() + "/s", dim=8, fsync="never") if kind == "native" else InMemoryStore(8)
    for i in range(3):
        s.add("u", f"t{i}", rng.standard_normal(8).astype(np.float32),
              [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
              turn_embeddings=rng.standard_normal((2, 8)).astype(np.float32))
    q = rng.standard_normal((1, 8)).astype(np.float32)
    q2 = rng.standard_normal((2, 8)).astype(np.float32)
    q4 = rng.standard_normal((4, 8)).astype(np.float32)
    q100 = rng.standard_normal((100, 8)).astype(np.float32)
    n = s._native
    calls = {
        "k=2**63": lambda: s.search("u", q, k=2**63),
        "k=2**64": lambda: s.search("u", q, k=2**64),
        "B=2 k=2**63": lambda: s.search("u", q2, k=2**63),
        "B=4 turn k=2**62": lambda: s.search("u", q4, k=2**62, level="turn"),
        "native B=2 k=2**63": lambda: n.search("u", q2, 2**63, 16, False, Level.topic),
        "native B=4 turn k=2**62": lambda: n.search("u", q4, 2**62, 16, False, Level.turn),
        "native B=4 turn+topic k=2**62": lambda: n.search_turn_topic("u", q4, 2**62, 16, False, 1.0, 10),
        "k=10**12": lambda: s.search("u", q, k=10**12),
        "turn k=2**62": lambda: s.search("u", q, k=2**62, level="turn"),
        "turn+topic candidates=2**62": lambda: s.search("u", q, k=5, level="turn+topic", candidates=2**62),
        "turn+topic k=2**62": lambda: s.search("u", q, k=2**62, level="turn+topic"),
        "ef=2**63": lambda: s.search("u", q, k=5, ef=2**63),
        "B*k too large": lambda: s.search("u", q100, k=2**20),
        "native k=2**63": lambda: n.search("u", q, 2**63, 16, False, Level.topic),
        "native k=2**62 turn": lambda: n.search("u", q, 2**62, 16, False, Level.turn),
        "native k=10**12": lambda: n.search("u", q, 10**12, 16, False, Level.topic),
        "native ef=2**63": lambda: n.search("u", q, 5, 2**63, False, Level.topic),
        "native B*k": lambda: n.search("u", q100, 2**20, 16, False, Level.topic),
        "native candidates=2**63": lambda: n.search_turn_topic("u", q, 5, 16, False, 1.0, 2**63),
        "native turn+topic k=2**62": lambda: n.search_turn_topic("u", q, 2**62, 16, False, 1.0, 10),
        "native alpha=1e38": lambda: n.search_turn_topic("u", q, 5, 16, False, 1e38, 10),
    }
    try:
        calls[case]()
        out = {"result": "returned"}
    except Exception as e:
        out = {"result": "raised", "cls": type(e).__name__, "memkern": type(e).__module__ == "memkern.errors",
               "msg": str(e)}
    print(json.dumps(out))
    """
)

_CRASH_CASES = {
    "k=2**63": "k",
    "k=2**64": "k",
    "B=2 k=2**63": "k",
    "B=4 turn k=2**62": "k",
    "native B=2 k=2**63": "k",
    "native B=4 turn k=2**62": "k",
    "native B=4 turn+topic k=2**62": "k",
    "k=10**12": "k",
    "turn k=2**62": "k",
    "turn+topic candidates=2**62": "candidates",
    "turn+topic k=2**62": "k",
    "ef=2**63": "ef",
    "B*k too large": "k",
    "native k=2**63": "k",
    "native k=2**62 turn": "k",
    "native k=10**12": "k",
    "native ef=2**63": "ef",
    "native B*k": "k",
    "native candidates=2**63": "candidates",
    "native turn+topic k=2**62": "k",
    "native alpha=1e38": "alpha",
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(_CRASH_CASES))
def test_huge_sizes_raise_before_allocating(case, store_kind):
    """On both modes of the engine (disk and in memory)."""
    proc = subprocess.run([sys.executable, "-c", _CRASH_SCRIPT, case, store_kind], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, f"{case}: exit code {proc.returncode} (crash?)\n{proc.stderr[-2000:]}"
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["result"] == "raised", (case, out)
    assert out["memkern"] and out["cls"] == "MemkernValueError", (case, out)
    assert out["msg"].startswith(_CRASH_CASES[case] + ":"), (case, out)


@pytest.fixture()
def store(make_store):
    """Both stores (``make_store``, tests/conftest.py)."""
    return make_store(D, fsync="never")


def test_k_above_count_pads_and_cap_is_allowed(store):
    rng = np.random.default_rng(1)
    store.add_batch("u", ["a", "b"], rng.standard_normal((2, D)).astype(np.float32))
    ids, sc = store.search("u", rng.standard_normal(D).astype(np.float32), k=MAX_K)
    assert ids.shape == (1, MAX_K) and set(ids[0, :2].tolist()) == {0, 1} and (ids[0, 2:] == -1).all()
    assert np.isfinite(sc).all()


# ------------------------------------------------------------------ scores never NaN / inf


@pytest.mark.parametrize("metric", ["ip", "l2", "cos"])
def test_huge_finite_vectors_are_refused_and_scores_stay_finite(make_store, metric):
    with make_store(2, metric, name=metric, fsync="never") as s:
        # Issue 10: finite vectors whose products overflow float32 scored [nan, inf] on "ip".
        for bad in ([3e38, 3e38], [3e38, -3e38], [1e19, 0.0]):
            with pytest.raises(MemkernValueError, match=r"^embedding: .*L2 norm <= 1e\+?18"):
                s.add("u", "x", np.array(bad, np.float32))
            with pytest.raises(MemkernValueError, match=r"^queries: .*L2 norm <= 1e\+?18"):
                s.search("u", np.array(bad, np.float32), k=2)
        assert s.count("u") == 0
        # The largest vectors allowed still give finite scores, in every order.
        big = 7e17
        rows = np.array([[big, big], [big, -big], [-big, -big], [1.0, 2.0]], np.float32)
        s.add_batch("u", ["a", "b", "c", "d"], rows)
        for q in rows:
            for level in ("topic",):
                ids, sc = s.search("u", q, k=4, level=level)
                assert (ids >= 0).all() and np.isfinite(sc).all(), (q, sc)
        with pytest.raises(MemkernValueError, match="^embedding: .*L2 norm"):
            s.update(0, embedding=np.array([3e38, 3e38], np.float32))


def test_alpha_is_bounded(store):
    q = np.ones(D, np.float32)
    for alpha in (1e38, float("inf"), float("nan"), 101.0, True):
        with pytest.raises(MemkernError, match="^alpha:"):
            store.search("u", q, k=2, level="turn+topic", alpha=alpha)


# ------------------------------------------------------------------ strings, ids, meta, paths


def test_lone_surrogates_name_the_argument(store):
    v = np.ones(D, np.float32)
    bad = "a\ud800b"
    cases = [
        ("namespace", lambda: store.add(bad, "s", v)),
        ("summary", lambda: store.add("u", bad, v)),
        ("turns[0]['content']", lambda: store.add("u", "s", v, [{"role": "user", "content": bad}])),
        ("meta['k']", lambda: store.add("u", "s", v, meta={"k": bad})),
        ("meta key", lambda: store.add("u", "s", v, meta={bad: 1})),
        ("namespace", lambda: store.search(bad, v, k=1)),
        ("namespace", lambda: store.count(bad)),
        ("summaries[1]", lambda: store.add_batch("u", ["ok", bad], np.ones((2, D), np.float32))),
    ]
    for name, call in cases:
        with pytest.raises(MemkernValueError) as ei:
            call()
        assert str(ei.value).startswith(name), (name, str(ei.value))
        assert "surrogate" in str(ei.value)
    rid = store.add("u", "s", v)
    with pytest.raises(MemkernValueError, match="^reason:"):
        store.invalidate(rid, bad)
    with pytest.raises(MemkernValueError, match="^summary:"):
        store.update(rid, summary=bad)
    assert store.count("u") == 1 and store.get(rid).summary == "s" and store.get(rid).version == 1


@pytest.mark.parametrize("bad", [2**63, 2**64, 2**70, -1, -(2**64)])
def test_out_of_range_ids_raise_memkern_key_error(store, bad):
    rid = store.add("u", "s", np.ones(D, np.float32))
    calls = [
        lambda: store.get(bad),
        lambda: store.delete(bad),
        lambda: store.invalidate(bad),
        lambda: store.update(bad, summary="x"),
        lambda: store.merge(bad, "x", np.ones(D, np.float32)),
        lambda: store.history(bad),
    ]
    for call in calls:
        with pytest.raises(MemkernKeyError, match=r"^'?id: unknown id"):
            call()
    if bad >= 0:
        with pytest.raises(MemkernError, match="^'?ids"):
            store.get_batch([bad])
        with pytest.raises(MemkernKeyError, match="^'?ids: unknown id"):
            store.embeddings(np.array([bad], dtype=np.uint64) if bad < 2**64 else [bad])
    assert bad not in store and rid in store


@pytest.mark.parametrize("bad", ["3", 1.0, None, [1], True])
def test_non_int_ids_raise_memkern_type_error(store, bad):
    with pytest.raises(MemkernTypeError, match="^id:"):
        store.get(bad)


@pytest.mark.slow
def test_deep_meta_is_refused_by_name(store):
    v = np.ones(D, np.float32)
    deep: dict = {}
    cur = deep
    for _ in range(100_000):  # deeper than Python's recursion limit
        cur["x"] = {}
        cur = cur["x"]
    with pytest.raises(MemkernValueError, match=r"^meta: expected JSON nested at most 32"):
        store.add("u", "s", v, meta=deep)
    deep_list: list = []
    cur_l = deep_list
    for _ in range(100_000):
        cur_l.append([])
        cur_l = cur_l[0]
    with pytest.raises(MemkernValueError, match=r"^meta: expected JSON nested at most 32"):
        store.add("u", "s", v, meta={"a": deep_list})
    with pytest.raises(MemkernValueError, match=r"^turns\[0\]: expected JSON nested"):
        store.add("u", "s", v, [{"role": "user", "content": "c", "extra": deep_list}])

    def nested(depth: int) -> dict:  # `depth` containers in all, the outer dict included
        m: dict = {}
        c = m
        for _ in range(depth - 1):
            c["x"] = {}
            c = c["x"]
        return m

    rid = store.add("u", "s", v, meta=nested(MAX_JSON_DEPTH))  # the limit itself is fine
    assert store.get(rid).meta == nested(MAX_JSON_DEPTH)
    with pytest.raises(MemkernValueError, match="nested at most"):
        store.add("u", "s", v, meta=nested(MAX_JSON_DEPTH + 1))
    assert store.count("u") == 1


def test_non_string_meta_keys_are_refused_not_renamed(store):
    v = np.ones(D, np.float32)
    for meta, where in (({1: "a"}, "meta"), ({"a": {2: "b"}}, "meta['a']"), ({(1, 2): 0}, "meta"),
                        ({None: 0}, "meta")):
        with pytest.raises(MemkernTypeError) as ei:
            store.add("u", "s", v, meta=meta)
        assert str(ei.value).startswith(where + ": expected str keys"), str(ei.value)
    with pytest.raises(MemkernTypeError, match=r"^turns\[0\]: expected str keys"):
        store.add("u", "s", v, [{"role": "user", "content": "c", 5: "x"}])
    with pytest.raises(MemkernTypeError, match=r"^meta\['s'\]: expected JSON-compatible"):
        store.add("u", "s", v, meta={"s": {1, 2}})
    assert store.count("u") == 0
    rid = store.add("u", "s", v, meta={"1": "a", "n": [1, 2.5, None, True]})
    assert store.get(rid).meta == {"1": "a", "n": [1, 2.5, None, True]}


def test_record_embedding_is_a_copy_taken_at_get(store):
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((2, D)).astype(np.float32)
    rid = store.add("u", "s", a)
    rec = store.get(rid)
    batch = store.get_batch([rid])[0]
    store.update(rid, embedding=b)
    # The records read before the update keep the vector they were read with.
    np.testing.assert_array_equal(rec.embedding, a)
    np.testing.assert_array_equal(batch.embedding, a)
    np.testing.assert_array_equal(store.get(rid).embedding, b)
    # Each record owns its array: writing into one changes neither the store nor another record.
    rec2 = store.get(rid)
    rec2.embedding[:] = 0
    np.testing.assert_array_equal(store.get(rid).embedding, b)
    # And a record outlives its store's closing.
    store.close()
    np.testing.assert_array_equal(rec.embedding, a)


def test_nul_in_path_is_refused(tmp_path):
    for p in (str(tmp_path / "a\0b"), tmp_path / "x\0"):
        with pytest.raises(MemkernValueError, match="^path: expected a path without NUL"):
            MemoryStore(p, dim=D)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(MemkernTypeError, match="^path:"):
        MemoryStore(12, dim=D)


@pytest.mark.parametrize(
    "kwargs, name",
    [({"num_threads": 10**6}, "num_threads"), ({"flat_limit": -1}, "flat_limit"), ({"flat_limit": 2**40}, "flat_limit"),
     ({"ef_search": 2**63}, "ef_search"), ({"M": 2**40}, "M"), ({"ef_construction": 2**63}, "ef_construction"),
     ({"fsync_interval": float("inf")}, "fsync_interval")],
)
def test_open_sizes_are_bounded(tmp_path, kwargs, name):
    with pytest.raises(MemkernError, match=f"^{name}:"):
        MemoryStore(tmp_path / "s", dim=D, **kwargs)
