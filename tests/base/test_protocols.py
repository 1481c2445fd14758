"""The written interfaces (memkern.protocols): who satisfies them, what fails them, how RMM uses them."""
from __future__ import annotations

import importlib
import re
from pathlib import Path

import numpy as np
import pytest

import memkern
from memkern import models as M
from memkern import protocols as P
from memkern.errors import MemkernTypeError, MemkernValueError
from memkern.ingest.extract import EmbeddingExtractor, LLMExtractor, Topic
from memkern.ingest.apply import Candidate, Decision, EmbeddingDecider, LLMDecider

from fakes_rmm import FakeStore, HashEmbedder, ScriptedChat

PROTOCOLS = [P.Store, P.TurnStore, P.Embedder, P.ChatModel, P.Extractor, P.Decider]
README = Path(__file__).resolve().parents[2] / "docs" / "rmm.md"


def members(proto: type) -> list[str]:
    """Names a protocol requires (its own and inherited protocol members)."""
    names: set[str] = set()
    for base in proto.__mro__:
        if base in (object,) or base.__name__ in ("Protocol", "Generic"):
            continue
        names |= {n for n in vars(base) if not n.startswith("_")}
    return sorted(names)


def class_satisfies(cls: type, proto: type) -> bool:
    """Class-level check (no instance, so no weights loaded): every member is defined."""
    return all(hasattr(cls, n) for n in members(proto))


def test_exported_lazily_from_memkern():
    assert "protocols" in memkern.__all__
    assert memkern.protocols is importlib.import_module("memkern.protocols")
    for name in ("Store", "TurnStore", "Embedder", "ChatModel", "Extractor", "Decider"):
        assert getattr(memkern.protocols, name) in PROTOCOLS


def test_members_are_the_documented_contract():
    assert members(P.Store) == sorted([
        "add", "add_batch", "close", "count", "delete", "dim", "embeddings", "flush", "get", "get_batch",
        "history", "ids", "invalidate", "merge", "namespaces", "path", "search", "update"])
    assert members(P.TurnStore) == sorted(members(P.Store) + ["turns_with_topics"])
    assert members(P.Embedder) == ["dim", "encode"]
    assert members(P.ChatModel) == ["count_tokens", "generate"]
    assert members(P.Extractor) == ["extract", "extract_batch"]
    assert members(P.Decider) == ["decide_batch"]


def test_memory_store_is_a_turn_store(tmp_path):
    with memkern.MemoryStore(tmp_path / "s", dim=8) as store:
        assert isinstance(store, P.Store) and isinstance(store, P.TurnStore)


def test_fakes_satisfy_their_protocols():
    store = FakeStore(dim=8)
    assert isinstance(store, P.Store)
    assert not isinstance(store, P.TurnStore)  # no two-level memory
    assert isinstance(HashEmbedder(8), P.Embedder)
    assert isinstance(ScriptedChat([]), P.ChatModel)


def test_fake_store_batch_methods_follow_the_contract():
    store = FakeStore(dim=4)
    ids = store.add_batch("ns", ["a", "b"], np.eye(4, dtype=np.float32)[:2], metas=[{"k": 1}, None])
    assert ids.dtype == np.int64 and ids.tolist() == [0, 1]
    assert [r.summary for r in store.get_batch(ids)] == ["a", "b"]
    assert store.get(0).meta == {"k": 1}


def test_model_classes_satisfy_their_protocols():
    assert class_satisfies(M.Embedder, P.Embedder)
    assert class_satisfies(M.ChatModel, P.ChatModel)
    assert class_satisfies(M.OpenAIChatModel, P.ChatModel)
    assert isinstance(M.OpenAIChatModel("http://127.0.0.1:9/v1", "m", retries=0), P.ChatModel)
    assert not class_satisfies(M.Embedder, P.ChatModel)


@pytest.mark.slow
def test_tiny_chat_model_instance_is_a_chat_model():
    assert isinstance(M.tiny_chat_model(seed=0), P.ChatModel)


def test_extractors_and_deciders_satisfy_their_protocols():
    chat, emb = ScriptedChat([]), HashEmbedder(8)
    for ex in (LLMExtractor(chat), EmbeddingExtractor(emb)):
        assert isinstance(ex, P.Extractor) and not isinstance(ex, P.Decider)
    for dec in (LLMDecider(chat), EmbeddingDecider()):
        assert isinstance(dec, P.Decider) and not isinstance(dec, P.Extractor)


def _full(proto: type, missing: str | None = None) -> object:
    body = {n: (lambda self, *a, **k: None) for n in members(proto) if n != missing}
    return type(f"Partial{proto.__name__}", (), body)()


@pytest.mark.parametrize("proto", PROTOCOLS, ids=lambda p: p.__name__)
def test_an_object_missing_a_member_does_not_satisfy(proto):
    assert isinstance(_full(proto), proto)
    for name in members(proto):
        assert not isinstance(_full(proto, missing=name), proto), name
    assert not isinstance(object(), proto)


# ------------------------------------------------------------------ one decide_batch signature
class SeedChat:
    def __init__(self):
        self.seeds: list = []

    def generate(self, prompts, max_new_tokens=None, json=False, temperature=0.0, seed=None):
        self.seeds.append(seed)
        return ['{"action": "MERGE", "index": 0, "summary": "merged"}' for _ in prompts]

    def count_tokens(self, text):
        return len(text.split())


ITEMS = [("User said: I now live in Paris.", [Candidate(3, "User said: I live in Rome.", 0.7)]),
         ("User said: something new.", [])]


def test_unified_decide_batch_signature_for_both_deciders():
    chat = SeedChat()
    llm, emb = LLMDecider(chat), EmbeddingDecider()
    for dec in (llm, emb):
        a = dec.decide_batch(ITEMS)                # old style of both
        b = dec.decide_batch(ITEMS, seed=7)        # old style of LLMDecider, now both
        c = dec.decide_batch(items=ITEMS, seed=None)
        d = dec.decide_batch(ITEMS, 7)
        assert [x.action for x in a] == [x.action for x in b] == [x.action for x in c] == [x.action for x in d]
        assert a[1].action == "ADD"
    assert [x.action for x in llm.decide_batch(ITEMS)] == ["MERGE", "ADD"]
    assert [x.action for x in emb.decide_batch(ITEMS, seed=1)] == ["UPDATE", "ADD"]
    assert chat.seeds == [0, 7, None, 7, 0]  # the seed reaches the model


# ------------------------------------------------------------------ RMM takes and checks plug-ins
class RecordingDecider:
    def __init__(self):
        self.seeds: list = []

    def decide_batch(self, items, seed=0):
        self.seeds.append(seed)
        return [Decision("ADD", reason="test") for _ in items]


class UserTurnExtractor:
    def extract_batch(self, sessions, seed=0):
        return [[Topic("User said: " + t["content"], [i], "custom") for i, t in enumerate(s) if t["role"] == "user"]
                for s in sessions]

    def extract(self, turns, seed=0):
        return self.extract_batch([turns], seed)[0]


def test_rmm_uses_custom_extractor_and_decider():
    store, dec = FakeStore(dim=16), RecordingDecider()
    for decider_kind in ("llm", "embedding"):  # the built-in ones, by name
        rmm = memkern.RMM(FakeStore(dim=16), chat_model=ScriptedChat([]), embedder=HashEmbedder(16),
                          decider=decider_kind, persist=False, extractor="llm")
        assert isinstance(rmm.decider, P.Decider)
    rmm = memkern.RMM(store, chat_model=ScriptedChat([]), embedder=HashEmbedder(16), extractor=UserTurnExtractor(),
                      decider=dec, seed=5, persist=False)
    res = rmm.end_session([{"role": "user", "content": "I play chess."}, {"role": "assistant", "content": "Nice."},
                           {"role": "user", "content": "I also play the cello."}])
    assert [r.action for r in res] == ["ADD", "ADD"]
    assert sorted(store.get(i).summary for i in store.ids("default")) == [
        "User said: I also play the cello.", "User said: I play chess."]
    assert dec.seeds == [5]
    assert rmm.extractor.__class__ is UserTurnExtractor and rmm.decider is dec


def test_rmm_refuses_objects_missing_a_method():
    chat, emb = ScriptedChat([]), HashEmbedder(16)
    with pytest.raises(MemkernTypeError, match="store"):
        memkern.RMM(_full(P.Store, missing="search"), chat_model=chat, embedder=emb, persist=False, extractor="llm")
    with pytest.raises(MemkernTypeError, match="chat_model"):
        memkern.RMM(FakeStore(dim=16), chat_model=_full(P.ChatModel, missing="count_tokens"), embedder=emb, extractor="llm")
    with pytest.raises(MemkernTypeError, match="embedder"):
        memkern.RMM(FakeStore(dim=16), chat_model=chat, embedder=_full(P.Embedder, missing="encode"), extractor="llm")
    with pytest.raises(MemkernTypeError, match="extractor"):
        memkern.RMM(FakeStore(dim=16), chat_model=chat, embedder=emb, extractor=_full(P.Extractor, missing="extract"))
    with pytest.raises(MemkernTypeError, match="decider"):
        memkern.RMM(FakeStore(dim=16), chat_model=chat, embedder=emb, decider=_full(P.Decider, missing="decide_batch"), extractor="llm")
    with pytest.raises(MemkernTypeError, match="two-level"):  # a Store but not a TurnStore
        memkern.RMM(FakeStore(dim=16), chat_model=chat, embedder=emb, retrieval="turn+topic", extractor="llm")
    with pytest.raises(MemkernValueError, match="extractor"):
        memkern.RMM(FakeStore(dim=16), chat_model=chat, embedder=emb, extractor="regex")
    rmm = memkern.RMM(FakeStore(dim=16), chat_model=chat, embedder=emb, persist=False, extractor="llm")
    with pytest.raises(MemkernTypeError, match="two-level"):
        rmm.index_turns()


def test_memreread_refuses_a_chat_model_missing_a_method():
    with pytest.raises(MemkernTypeError, match="chat_model"):
        memkern.MemReread(chat_model=_full(P.ChatModel, missing="generate"))
    assert memkern.MemReread(chat_model=SeedChat()).chat_model is not None


# ------------------------------------------------------------------ the README example runs
def test_readme_plug_in_example_runs():
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## How to plug in your own"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert "memkern.RMM(" in code and "decider=AlwaysAdd()" in code
    exec(compile(code, "docs/rmm.md#how-to-plug-in-your-own", "exec"), {"__name__": "readme_example"})


def test_accepts_keyword_answers_per_function_and_binding():
    from memkern.protocols import accepts_keyword

    class A:
        def f(self, x, *, y=0):
            return x

        def g(self, **kw):
            return kw

    a = A()
    for _ in range(2):  # the second round is answered from what the first one learned
        assert accepts_keyword(A.f, "self") and not accepts_keyword(a.f, "self")  # bound: no self
        assert accepts_keyword(a.f, "x") and accepts_keyword(a.f, "y") and not accepts_keyword(a.f, "z")
        assert accepts_keyword(a.g, "anything")
        assert not accepts_keyword(len, "obj") and accepts_keyword(lambda *, k: k, "k")
    b = A()
    b.f = lambda x: x  # an instance attribute: a different function, asked afresh
    assert not accepts_keyword(b.f, "y") and accepts_keyword(a.f, "y")
