"""A write that fails half-way (an I/O error in the store) leaves nothing applied, through every adapter:
the writes already made by the call are undone before the error propagates."""
from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("MEM0_TELEMETRY", "False")

from fakes_embed import HashEmbedder  # noqa: E402
from memkern import MemoryStore  # noqa: E402


class FlakyStore(MemoryStore):
    """A real MemoryStore whose ``fail`` -th call of ``method`` raises OSError (before writing)."""

    def arm(self, method: str, nth: int) -> None:
        self._plan = (method, nth)
        self._seen = 0

    def _maybe(self, method: str) -> None:
        plan = getattr(self, "_plan", None)
        if plan and plan[0] == method:
            self._seen += 1
            if self._seen == plan[1]:
                self._plan = None
                raise OSError(28, "No space left on device (injected)")

    def add_batch(self, *a, **kw):
        self._maybe("add_batch")
        return super().add_batch(*a, **kw)

    def update(self, *a, **kw):
        self._maybe("update")
        return super().update(*a, **kw)


EMB = HashEmbedder()


def _snapshot(store):
    out = {}
    for ns in store.namespaces():
        for r in store.get_batch(store.ids(ns)):
            out[r.id] = (ns, r.summary, r.meta, r.embedding.tolist())
    return out


@pytest.fixture
def flaky(tmp_path):
    s = FlakyStore(tmp_path / "s", dim=EMB.dim)
    yield s
    s.close()


def test_langgraph_batch_failing_midway_applies_nothing(flaky):
    pytest.importorskip("langgraph")
    from langgraph.store.base import PutOp

    from memkern.integrations.langgraph import MemkernStore

    lg = MemkernStore(flaky, embedder=EMB)
    lg.put(("a",), "k1", {"text": "old"})
    lg.put(("b",), "k2", {"text": "keep"})
    lg.put(("b",), "k3", {"text": "to delete"})
    before = _snapshot(flaky)
    for method, nth in [("add_batch", 2), ("add_batch", 1), ("update", 2)]:
        flaky.arm(method, nth)
        with pytest.raises(OSError):
            lg.batch([PutOp(("a",), "k1", {"text": "new"}), PutOp(("b",), "k2", {"text": "changed"}),
                      PutOp(("c",), "x", {"text": "added"}), PutOp(("d",), "y", {"text": "added too"}),
                      PutOp(("b",), "k3", None)])
        now = _snapshot(flaky)
        assert {i: v for i, v in now.items()} == before, (method, nth)
        assert lg.get(("a",), "k1").value == {"text": "old"} and lg.get(("c",), "x") is None
        assert lg.get(("b",), "k2").value == {"text": "keep"} and lg.get(("b",), "k3") is not None
        assert sorted(lg.list_namespaces()) == [("a",), ("b",)]
    lg.batch([PutOp(("c",), "x", {"text": "added"})])                  # and it still works
    assert lg.get(("c",), "x").value == {"text": "added"}


def test_langchain_add_failing_midway_applies_nothing(flaky):
    pytest.importorskip("langchain_core")
    from memkern.integrations.langchain import MemkernVectorStore

    vs = MemkernVectorStore(flaky, EMB)
    vs.add_texts(["first"], [{"v": 1}], ids=["d1"])
    before = _snapshot(flaky)
    flaky.arm("add_batch", 1)
    with pytest.raises(OSError):
        vs.add_texts(["first changed", "brand new"], [{"v": 2}, {"v": 3}], ids=["d1", "d2"])
    assert _snapshot(flaky) == before
    assert vs.get_by_ids(["d1", "d2"])[0].page_content == "first" and len(vs.get_by_ids(["d2"])) == 0


def test_llamaindex_add_failing_midway_applies_nothing(flaky):
    pytest.importorskip("llama_index.core")
    from llama_index.core.schema import TextNode

    from memkern.integrations.llamaindex import MemkernVectorStore

    vs = MemkernVectorStore(flaky)
    node = lambda i, t: TextNode(id_=i, text=t, embedding=EMB.encode([t])[0].tolist())  # noqa: E731
    vs.add([node("n1", "first")])
    before = _snapshot(flaky)
    flaky.arm("add_batch", 1)
    with pytest.raises(OSError):
        vs.add([node("n1", "first changed"), node("n2", "new")])
    assert _snapshot(flaky) == before
    assert [n.get_content() for n in vs.get_nodes()] == ["first"]


def test_mem0_insert_failing_midway_applies_nothing(flaky):
    pytest.importorskip("mem0")
    from memkern.integrations.mem0 import MemkernVectorStore

    vs = MemkernVectorStore("c", store=flaky, embedding_model_dims=EMB.dim)
    v = lambda t: EMB.encode([t])[0].tolist()  # noqa: E731
    vs.insert([v("first")], [{"data": "first"}], ["m1"])
    before = _snapshot(flaky)
    flaky.arm("add_batch", 1)
    with pytest.raises(OSError):
        vs.insert([v("first changed"), v("new")], [{"data": "first changed"}, {"data": "new"}], ["m1", "m2"])
    assert _snapshot(flaky) == before
    assert vs.get("m1").payload == {"data": "first"} and vs.get("m2") is None
    assert np.allclose(flaky.embeddings([vs._ids["m1"]])[0], EMB.encode(["first"])[0], atol=1e-6)
