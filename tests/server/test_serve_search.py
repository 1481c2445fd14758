"""Hybrid / lexical search and the store's filters over HTTP (a real uvicorn server, httpx) and MCP
(the `mcp` package's stdio client against `memkern mcp`): the same results, defaults and checks
as `MemoryStore.search` on the same store."""
from __future__ import annotations

import asyncio
import inspect
import json
import sys
from pathlib import Path

import numpy as np
import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

import memkern  # noqa: E402
from memkern.server import MemoryService  # noqa: E402
from memkern.server.app import SearchRequest  # noqa: E402

from fakes_rmm import HashEmbedder  # noqa: E402
from serve_common import KEY, mcp_session, running  # noqa: E402

DOCS = ["my sister Ada plays the cello every day", "the the the cello", "I play tennis with my sister on the weekend",
        "Ada Lovelace wrote the first program", "we bought a new cello case for the trip",
        "my sister my sister my sister", "daily practice makes the music better", "the weekend trip to the lake"]
QUERIES = ["sister cello practice", "Ada music weekend"]


@pytest.fixture
def world(tmp_path):
    """A store with DOCS in alice's scope (every other one tagged ``kind=even``, dated a day apart),
    its service and a client of the running server."""
    with memkern.MemoryStore(tmp_path / "store", dim=64, metric="cos") as st:
        svc = MemoryService(st, embedder=HashEmbedder(64))
        with running(svc) as url, httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"},
                                               timeout=30) as http:
            for i, d in enumerate(DOCS):
                r = http.post("/v1/memories", json={"messages": d, "user_id": "alice", "infer": False,
                                                    "metadata": {"kind": "even" if i % 2 == 0 else "odd"},
                                                    "date": 1_700_000_000 + 86_400 * i})
                assert r.status_code == 200, r.text
            yield st, svc, http
        svc.close()


def _store_hits(st, query, k=10, **kw):
    mode = kw.get("mode", "dense")
    q = None if mode == "lexical" else HashEmbedder(64).encode([query], kind="query")
    if mode != "dense":
        kw["texts"] = [query]
    ids, scores = st.search("u:alice", q, k=k, **kw)
    keep = ids[0] >= 0
    return ids[0][keep].tolist(), scores[0][keep].tolist()


def _http_hits(http, query, **body):
    r = http.post("/v1/memories/search", json={"query": query, "user_id": "alice", **body})
    assert r.status_code == 200, r.text
    res = r.json()["results"]
    return [x["id"] for x in res], [x["score"] for x in res]


@pytest.mark.parametrize("query", QUERIES)
def test_http_hybrid_search_returns_exactly_the_stores_hybrid_search(world, query):
    st, _, http = world
    want = _store_hits(st, query, mode="hybrid")
    assert _http_hits(http, query, mode="hybrid") == want
    # the modes differ on this data, so the mode really reached the store
    assert want[0] != _store_hits(st, query)[0] or want[0] != _store_hits(st, query, mode="lexical")[0]
    assert _http_hits(http, query, mode="lexical") == _store_hits(st, query, mode="lexical")
    assert _http_hits(http, query) == _store_hits(st, query)  # no mode: the store's default (dense)


def test_http_fusion_weight_filter_and_time_options_reach_the_store(world):
    st, _, http = world
    q = QUERIES[1]
    assert _store_hits(st, q, mode="hybrid", fusion="rrf")[0] != _store_hits(st, q, mode="hybrid")[0]
    assert _http_hits(http, q, mode="hybrid", fusion="rrf") == _store_hits(st, q, mode="hybrid", fusion="rrf")
    for w in (0.0, 0.9):
        assert _http_hits(http, q, mode="hybrid", fusion="weighted", lexical_weight=w) == \
            _store_hits(st, q, mode="hybrid", fusion="weighted", lexical_weight=w)
    flt = {"kind": "odd"}
    got = _http_hits(http, q, mode="hybrid", filter=flt)
    assert got == _store_hits(st, q, mode="hybrid", filter=flt) and got[0]
    assert all(st.get(i).meta["kind"] == "odd" for i in got[0])
    assert _http_hits(http, q, mode="hybrid", filters=flt) == got  # mem0's name for the same option
    tr = [1_700_000_000 + 86_400 * 2, 1_700_000_000 + 86_400 * 6]
    got = _http_hits(http, q, mode="lexical", time_range=tr)
    assert got == _store_hits(st, q, mode="lexical", time_range=tuple(tr)) and got[0]
    assert all(tr[0] <= st.get(i).event_time < tr[1] for i in got[0])
    assert len(got[0]) < len(_http_hits(http, q, mode="lexical")[0])
    rec = dict(recency=86_400.0, recency_weight=0.5, now=1_700_000_000 + 86_400 * 8)
    assert _http_hits(http, q, mode="hybrid", **rec) == _store_hits(st, q, mode="hybrid", time_field="event", **rec)


def test_search_defaults_are_the_stores():
    store_defaults = {k: p.default for k, p in inspect.signature(memkern.MemoryStore.search).parameters.items()}
    service = inspect.signature(MemoryService.search).parameters
    fields = SearchRequest.model_fields
    for name in ("mode", "fusion", "lexical_weight", "time_field", "recency", "recency_weight", "now"):
        assert service[name].default == store_defaults[name], name
        assert fields[name].default == store_defaults[name], name
    assert service["filter"].default is None and fields["filter"].default is None


@pytest.mark.parametrize("body, field", [
    ({"mode": "sparse"}, "mode"), ({"mode": "hybrid", "fusion": "max"}, "fusion"),
    ({"mode": "hybrid", "lexical_weight": 1.5}, "lexical_weight"), ({"mode": "lexical", "lexical_weight": -1}, "lexical_weight"),
    ({"filter": {"kind": {"$gt": 1}}}, "filter"), ({"filters": {"kind": {"$gt": 1}}}, "filters"),
    ({"filter": {"a": 1}, "filters": {"a": 1}}, "filter"), ({"mode": "hybrid", "time_field": "born"}, "time_field"),
    ({"mode": "hybrid", "recency": -5}, "recency"), ({"mode": 3}, "mode"),
])
@pytest.mark.parametrize("user", ["alice", "nobody"])  # checked even where no scope matches
def test_bad_search_options_are_422s_naming_the_field(world, body, field, user):
    st, _, http = world
    r = http.post("/v1/memories/search", json={"query": "cello", "user_id": user, **body})
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert detail.startswith(field), detail


def test_search_errors_are_the_stores_own_messages(world):
    st, svc, http = world
    q = HashEmbedder(64).encode(["cello"], kind="query")
    for opts in ({"mode": "sparse"}, {"mode": "hybrid", "fusion": "max"}, {"mode": "hybrid", "lexical_weight": 7.5}):
        with pytest.raises(memkern.MemkernValueError) as e:
            st.search("u:alice", q, k=10, texts=["cello"], **opts)
        r = http.post("/v1/memories/search", json={"query": "cello", "user_id": "alice", **opts})
        assert r.json()["detail"] == str(e.value)


def test_a_store_without_lexical_search_refuses_the_modes(tmp_path):
    class DenseOnly:
        """A store whose search takes vectors only (the Store protocol's minimum)."""

        def __init__(self, inner):
            self._inner, self.dim = inner, inner.dim

        def search(self, namespace, queries, k=20):
            return self._inner.search(namespace, queries, k=k)

        def __getattr__(self, name):
            return getattr(self._inner, name)

    with memkern.MemoryStore(tmp_path / "s", dim=64, metric="cos") as st:
        svc = MemoryService(DenseOnly(st), embedder=HashEmbedder(64))
        svc.add("the cello", user_id="alice", infer=False)
        assert svc.search("cello", user_id="alice")["results"][0]["memory"] == "the cello"
        for opts, name in (({"mode": "hybrid"}, "mode"), ({"fusion": "rrf"}, "fusion"),
                           ({"lexical_weight": 0.5}, "lexical_weight")):
            with pytest.raises(memkern.MemkernValueError, match=f"^{name}: expected the default"):
                svc.search("cello", user_id="alice", **opts)


# ------------------------------------------------------------------ MCP, with the real stdio client
@pytest.mark.slow
def test_mcp_search_tool_takes_the_same_options(tmp_path):
    store = tmp_path / "store"
    script = Path(sys.executable).parent / "memkern"

    async def session_run():
        out = {}
        async with mcp_session(store, tmp_path, [str(script)]) as s:
            tools = {t.name: t for t in (await s.list_tools()).tools}
            props = tools["search_memories"].input_schema["properties"]
            assert {"mode", "fusion", "lexical_weight", "filter", "filters", "time_range", "recency"} <= set(props)
            assert props["mode"]["default"] == "dense" and props["fusion"]["default"] == "coverage"
            for i, d in enumerate(DOCS):
                r = await s.call_tool("add_memory", {"messages": d, "user_id": "alice", "infer": False,
                                                     "metadata": {"kind": "even" if i % 2 == 0 else "odd"}})
                assert not r.is_error, r
            for q in QUERIES:
                for opts in ({"mode": "hybrid"}, {"mode": "lexical"}, {"mode": "hybrid", "fusion": "rrf"},
                             {"mode": "hybrid", "filter": {"kind": "odd"}}, {}):
                    r = await s.call_tool("search_memories", {"query": q, "user_id": "alice", **opts})
                    assert not r.is_error, r
                    res = json.loads(r.content[0].text)["results"]
                    out[q, json.dumps(opts, sort_keys=True)] = ([x["id"] for x in res], [x["score"] for x in res])
            for opts, field in (({"mode": "sparse"}, "mode"), ({"mode": ["hybrid"]}, "mode"),
                                ({"mode": "hybrid", "lexical_weight": 2.0}, "lexical_weight"),
                                ({"filter": {"a": 1}, "filters": {"a": 1}}, "filter")):
                r = await s.call_tool("search_memories", {"query": "cello", "user_id": "alice", **opts})
                assert r.is_error and r.content[0].text.split(": ", 1)[1].startswith(field), r
        return out

    got = asyncio.run(session_run())
    emb = memkern.Embedder()
    with memkern.MemoryStore(store) as st:
        for (q, opts_s), hits in got.items():
            opts = json.loads(opts_s)
            mode = opts.get("mode", "dense")
            qv = None if mode == "lexical" else emb.encode([q], kind="query")
            ids, scores = st.search("u:alice", qv, k=10, texts=None if mode == "dense" else [q], **opts)
            keep = ids[0] >= 0
            assert hits[0] == ids[0][keep].tolist(), (q, opts)
            np.testing.assert_allclose(hits[1], scores[0][keep], rtol=1e-5, atol=1e-6)
        hybrid, dense = got[QUERIES[1], '{"mode": "hybrid"}'], got[QUERIES[1], "{}"]
        lexical = got[QUERIES[1], '{"mode": "lexical"}']
        assert hybrid[0] != dense[0] or hybrid[0] != lexical[0]
