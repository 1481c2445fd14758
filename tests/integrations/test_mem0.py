"""memkern.integrations.mem0 against the real mem0ai package: the VectorStoreBase contract, mem0's
filter grammar, registration as a provider, and mem0's own ``Memory`` running on memkern fully
offline (every socket connection is refused during these tests; MEM0_TELEMETRY=False)."""
from __future__ import annotations

import os
import socket

import numpy as np
import pytest

os.environ["MEM0_TELEMETRY"] = "False"
os.environ.setdefault("MEM0_DIR", os.path.join(os.environ.get("TMPDIR", "/tmp"), "memkern-test-mem0"))

pytest.importorskip("mem0")

from fakes_embed import HashEmbedder  # noqa: E402
from memkern import MemkernKeyError, MemkernTypeError, MemkernValueError  # noqa: E402
from memkern.integrations import mem0 as mk  # noqa: E402


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    def refuse(self, *a, **kw):
        raise AssertionError(f"network access attempted: {a}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)


EMB = HashEmbedder()


def _v(text):
    return EMB.encode([text])[0].tolist()


@pytest.fixture
def vs(tmp_path):
    v = mk.MemkernVectorStore(collection_name="c1", path=str(tmp_path / "s"), embedding_model_dims=EMB.dim)
    texts = ["likes green tea", "has a dog named Biscuit", "works on compilers", "drinks coffee at night"]
    users = ["alice", "alice", "bob", "bob"]
    ids = v.insert([_v(t) for t in texts], [{"data": t, "user_id": u, "n": i} for i, (t, u) in enumerate(zip(texts, users))],
                   [f"id{i}" for i in range(4)])
    assert ids == ["id0", "id1", "id2", "id3"]
    yield v
    v.close()


def test_provider_contract(vs):
    res = vs.search("tea", _v("green tea"), top_k=2)
    assert res[0].id == "id0" and res[0].payload == {"data": "likes green tea", "user_id": "alice", "n": 0}
    assert res[0].score >= res[1].score
    assert [r.id for r in vs.search("x", _v("coffee"), top_k=5, filters={"user_id": "bob"})] == ["id3", "id2"]
    assert vs.get("id1").payload["data"] == "has a dog named Biscuit" and vs.get("missing") is None
    vs.update("id1", vector=_v("has a cat"), payload={"data": "has a cat", "user_id": "alice"})
    assert vs.get("id1").payload == {"data": "has a cat", "user_id": "alice"}
    assert vs.search("x", _v("has a cat"), top_k=1)[0].id == "id1"
    vs.delete("id2")
    assert vs.get("id2") is None
    listed = vs.list(filters={"user_id": "bob"})
    assert len(listed) == 1 and [o.id for o in listed[0]] == ["id3"]
    assert [o.id for o in vs.list(top_k=2)[0]] == ["id0", "id1"]
    assert vs.list_cols() == ["c1"]
    info = vs.col_info()
    assert info["name"] == "c1" and info["count"] == 3 and info["dimension"] == EMB.dim
    vs.create_col("c2", EMB.dim)
    assert vs.list(filters=None)[0] == [] and vs.collection_name == "c2"
    vs.insert([_v("other")], [{"data": "other"}], ["o1"])
    assert vs.list_cols() == ["c1", "c2"]
    vs.reset()
    assert vs.list()[0] == [] and vs.list_cols() == ["c1"]


def test_keyword_search_uses_the_store_lexical_index(vs):
    from memkern.integrations import filters as F

    if not F.supports_mode(vs.store):
        assert vs.keyword_search("dog") is None                    # mem0 then ranks by similarity only
        pytest.skip("this store has no lexical search (MemoryStore.search(mode=...) not on this branch)")
    hits = vs.keyword_search("Biscuit dog", top_k=3)
    assert [h.id for h in hits] == ["id1"] and hits[0].score > 0
    assert vs.keyword_search("Biscuit", top_k=3, filters={"user_id": "bob"}) == []
    assert [h.id for h in vs.keyword_search("coffee compilers", top_k=3, filters={"n": {"gte": 2}})] != []


@pytest.mark.parametrize("flt,ids", [
    ({"user_id": "alice"}, {"id0", "id1"}),
    ({"user_id": "*"}, {"id0", "id1", "id2", "id3"}),
    ({"user_id": ["bob", "carol"]}, {"id2", "id3"}),
    ({"n": {"gte": 1, "lt": 3}}, {"id1", "id2"}),
    ({"n": {"ne": 0}}, {"id1", "id2", "id3"}),
    ({"n": {"in": [0, 3]}}, {"id0", "id3"}),
    ({"n": {"nin": [0, 3]}}, {"id1", "id2"}),
    ({"data": {"contains": "dog"}}, {"id1"}),
    ({"data": {"icontains": "BISCUIT"}}, {"id1"}),
    ({"AND": [{"user_id": "alice"}, {"n": {"gt": 0}}]}, {"id1"}),
    ({"OR": [{"n": 0}, {"n": 3}]}, {"id0", "id3"}),
    ({"NOT": [{"user_id": "alice"}]}, {"id2", "id3"}),
    ({"$or": [{"n": 0}, {"n": 2}], "OR": [{"n": 0}, {"n": 2}]}, {"id0", "id2"}),   # mem0 may send both spellings
    ({"user_id": "alice", "$not": [{"n": 1}]}, {"id0"}),
])
def test_mem0_filter_grammar(vs, flt, ids):
    assert {r.id for r in vs.search("q", _v("tea dog compilers coffee"), top_k=10, filters=flt)} == ids
    assert {o.id for o in vs.list(filters=flt)[0]} == ids


@pytest.mark.parametrize("call,err,where", [
    (lambda v: v.insert([_v("a"), [0.0] * 3], [{"data": "a"}, {"data": "b"}]), MemkernValueError, r"vectors\[1\]"),
    (lambda v: v.insert([_v("a"), _v("b")], [{"data": "a"}, {"data": 5}]), MemkernTypeError, r"payloads\[1\]\['data'\]"),
    (lambda v: v.insert([_v("a"), _v("b")], [{"data": "a"}, {"x": float("nan")}]), MemkernTypeError, r"payloads\[1\]"),
    (lambda v: v.insert([_v("a"), _v("b")], [{"data": "a"}, {"__mem0_id__": "x"}]), MemkernValueError, r"payloads\[1\]"),
    (lambda v: v.insert([_v("a"), _v("b")], [{"data": "a"}]), MemkernValueError, "payloads"),
    (lambda v: v.insert([_v("a"), _v("b")], None, ["x", "x"]), MemkernValueError, "ids"),
    (lambda v: v.search("q", _v("a"), top_k=0), MemkernValueError, "top_k"),
    (lambda v: v.search("q", _v("a"), filters={"n": {"regex": "x"}}), MemkernValueError, "filters"),
    (lambda v: v.search("q", _v("a"), filters={"AND": "x"}), MemkernTypeError, "filters"),
    (lambda v: v.delete("nope"), MemkernKeyError, "vector_id"),
    (lambda v: v.update("nope", payload={"data": "x"}), MemkernKeyError, "vector_id"),
    (lambda v: v.update("id0", vector=[1.0] * 3), MemkernValueError, "vector"),
    (lambda v: v.create_col("c", 7), MemkernValueError, "vector_size"),
])
def test_bad_input_raises_and_writes_nothing(vs, call, err, where):
    before = [(o.id, o.payload) for o in vs.list()[0]]
    with pytest.raises(err, match=where):
        call(vs)
    assert [(o.id, o.payload) for o in vs.list()[0]] == before


def test_instances_on_one_path_share_the_store(tmp_path):
    a = mk.MemkernVectorStore("a", str(tmp_path / "s"), EMB.dim)
    b = mk.MemkernVectorStore("b", str(tmp_path / "s"), EMB.dim)
    assert a.store is b.store
    a.insert([_v("x")], [{"data": "x"}], ["1"])
    assert b.list()[0] == [] and sorted(b.list_cols()) == ["a"]
    a.close()
    assert not b.store.closed
    b.close()
    assert b.store.closed
    with pytest.raises(MemkernValueError, match="embedding_model_dims"):
        mk.MemkernVectorStore("a", str(tmp_path / "s"), 8)


def test_registered_provider_builds_from_mem0_config(tmp_path):
    from mem0.utils.factory import VectorStoreFactory
    from mem0.vector_stores.configs import VectorStoreConfig

    mk.register()
    mk.register()                                                       # idempotent
    cfg = VectorStoreConfig(provider="memkern", config={"path": str(tmp_path / "s"), "collection_name": "m",
                                                        "embedding_model_dims": EMB.dim})
    assert isinstance(cfg.config, mk.MemkernConfig)
    store = VectorStoreFactory.create("memkern", cfg.config)
    assert isinstance(store, mk.MemkernVectorStore) and store.collection_name == "m"
    with pytest.raises(ValueError):
        VectorStoreConfig(provider="memkern", config={"path": "x", "unknown_field": 1})
    store.close()


def test_mem0_memory_runs_offline_on_memkern(tmp_path):
    m = mk.local_memory(tmp_path / "mem", embedder=EMB)
    r = m.add([{"role": "user", "content": "I love green tea in the morning"}], user_id="alice", infer=False)
    mid = r["results"][0]["id"]
    m.add([{"role": "user", "content": "My dog is called Biscuit"}], user_id="alice", infer=False)
    m.add([{"role": "user", "content": "I write compilers"}], user_id="bob", infer=False)
    hits = m.search("what tea in the morning", filters={"user_id": "alice"}, limit=2)["results"]
    assert hits[0]["id"] == mid and hits[0]["memory"] == "I love green tea in the morning"
    assert all(h["user_id"] == "alice" for h in hits)
    assert m.get(mid)["memory"] == "I love green tea in the morning"
    m.update(mid, "I love black tea")
    assert m.get(mid)["memory"] == "I love black tea"
    assert [h["event"] for h in m.history(mid)][:2] == ["ADD", "UPDATE"]
    allbob = m.get_all(filters={"user_id": "bob"})["results"]
    assert [x["memory"] for x in allbob] == ["I write compilers"]
    m.delete(mid)
    assert m.get(mid) is None
    # the memories are memkern records: a reopened store has them
    vs = m.vector_store
    assert isinstance(vs, mk.MemkernVectorStore) and vs.store.count("mem0.mem0") == 2


@pytest.mark.slow
def test_mem0_telemetry_is_turned_off_even_if_mem0_was_imported_first(tmp_path):
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "MEM0_TELEMETRY"}
    env["MEM0_DIR"] = str(tmp_path)
    code = ("import mem0.memory.main as mm, mem0.memory.telemetry as mt\n"
            "before = (mt.MEM0_TELEMETRY, mm.MEM0_TELEMETRY)\n"
            "import memkern.integrations.mem0\n"
            "print(before, mt.MEM0_TELEMETRY, mm.MEM0_TELEMETRY)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["(True,", "True)", "False", "False"]
    env["MEM0_TELEMETRY"] = "True"                                     # an explicit choice is kept
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.stdout.split() == ["(True,", "True)", "True", "True"]


def test_llm_adapter_uses_a_memkern_chat_model():
    class Echo:
        def __init__(self):
            self.seen = []

        def generate(self, prompts, max_new_tokens=None, json=False, **kw):
            self.seen.append((prompts, max_new_tokens, json))
            return ['{"facts": []}']

    chat = Echo()
    llm = mk.MemkernLLM(chat, max_new_tokens=64)
    out = llm.generate_response([{"role": "user", "content": "hi"}], response_format={"type": "json_object"})
    assert out == '{"facts": []}' and chat.seen == [([[{"role": "user", "content": "hi"}]], 64, True)]
