"""Scopes are an access boundary: two users' clients try every id route on each other's memories
and on namespaces that are not server scopes (the CLI's ``demo``, a LangGraph store's
``lg.users.alice``), over HTTP (httpx against uvicorn) and over MCP (the real stdio client); API
keys bound to a scope hold their requests to it."""
from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import numpy as np
import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

import memkern  # noqa: E402
from memkern.server import scopes as S  # noqa: E402
from memkern.server.scopes import KeyRing  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "helpers"))
from fakes_rmm import HashEmbedder, ScriptedChat  # noqa: E402
from serve_common import KEY, hash_service, mcp_session, running  # noqa: E402

FOREIGN = ("demo", "lg.users.alice")  # namespaces of `memkern ingest -n demo` and the LangGraph adapter


@pytest.fixture
def world(tmp_path):
    """alice (two scopes), bob, an agent scope, and two non-scope namespaces written directly."""
    with memkern.MemoryStore(tmp_path / "store", dim=64, metric="cos") as st:
        svc = hash_service(st)
        ids = {}
        for name, scope in (("alice", {"user_id": "alice"}), ("alice_run", {"user_id": "alice", "run_id": "s1"}),
                            ("bob", {"user_id": "bob"}), ("agent", {"agent_id": "planner"})):
            ids[name] = svc.add(f"{name} secret fact about tea", infer=False, **scope)["results"][0]["id"]
        emb = HashEmbedder(64).encode(["foreign secret"])
        for ns in FOREIGN:
            ids[ns] = int(st.add_batch(ns, ["foreign secret"], emb)[0])
        yield svc, st, ids
        svc.close()


def _routes(c: httpx.Client, mid: int, scope: dict):
    """Every id route on ``mid`` as ``scope``: (name, response)."""
    return [("get", c.get(f"/v1/memories/{mid}", params=scope)),
            ("history", c.get(f"/v1/memories/{mid}/history", params=scope)),
            ("put", c.put(f"/v1/memories/{mid}", json={"text": "overwritten", "metadata": {"x": 1}, **scope})),
            ("put-query", c.put(f"/v1/memories/{mid}", params=scope, json={"text": "overwritten"})),
            ("delete", c.delete(f"/v1/memories/{mid}", params=scope))]


def _snapshot(st, ids):
    return {k: (st.get(i).summary, st.get(i).version, dict(st.get(i).meta or {})) for k, i in ids.items()}


def test_users_cannot_reach_each_others_ids_or_foreign_namespaces(world):
    svc, st, ids = world
    before = _snapshot(st, ids)
    with running(svc) as url, httpx.Client(base_url=url, headers={"X-API-Key": KEY}, timeout=30) as c:
        # the body of a 404 is the one an unknown id gets: nothing tells an existing id apart
        missing = max(ids.values()) + 1000
        ref = {name: r.json() for name, r in _routes(c, missing, {"user_id": "alice"})}
        assert all(r["error"] == "MemkernKeyError" for r in ref.values())
        attempts = [("alice", "bob"), ("alice", "agent"), ("bob", "alice"), ("bob", "alice_run")]
        attempts += [(u, ns) for u in ("alice", "bob") for ns in FOREIGN]
        for caller, target in attempts:
            for name, r in _routes(c, ids[target], {"user_id": caller}):
                assert r.status_code == 404, (caller, target, name, r.text)
                assert r.json() == json.loads(json.dumps(ref[name]).replace(str(missing), str(ids[target]))), \
                    (caller, target, name)
        # other scope fields do not widen the reach: an agent or run id of someone else's scope
        for scope in ({"agent_id": "planner", "user_id": "bob"}, {"user_id": "bob", "run_id": "s1"},
                      {"run_id": "s1", "agent_id": "x"}):
            for name, r in _routes(c, ids["alice_run"], scope):
                assert r.status_code == 404, (scope, name)
        # an id route needs a scope
        for r in (c.get(f"/v1/memories/{ids['alice']}"), c.delete(f"/v1/memories/{ids['alice']}"),
                  c.get(f"/v1/memories/{ids['alice']}/history"), c.put(f"/v1/memories/{ids['alice']}", json={"text": "x"})):
            assert r.status_code == 422 and "user_id/agent_id/run_id" in r.json()["detail"], r.text
        assert _snapshot(st, ids) == before  # nothing was read into a response, nothing was written

        # one's own ids: the exact scope and any scope that contains it (as search and list match)
        assert c.get(f"/v1/memories/{ids['alice_run']}", params={"user_id": "alice"}).json()["run_id"] == "s1"
        assert c.get(f"/v1/memories/{ids['alice_run']}", params={"user_id": "alice", "run_id": "s1"}).status_code == 200
        assert c.get(f"/v1/memories/{ids['agent']}", params={"agent_id": "planner"}).status_code == 200
        r = c.put(f"/v1/memories/{ids['bob']}", json={"text": "bob likes coffee now", "user_id": "bob"})
        assert r.status_code == 200 and r.json()["version"] == 2
        assert len(c.get(f"/v1/memories/{ids['bob']}/history", params={"user_id": "bob"}).json()["results"]) == 2
        assert c.delete(f"/v1/memories/{ids['bob']}", params={"user_id": "bob"}).json()["deleted"] is True
        # query and body must agree on PUT
        r = c.put(f"/v1/memories/{ids['alice']}", params={"user_id": "alice"}, json={"text": "x", "user_id": "bob"})
        assert r.status_code == 422 and "user_id" in r.json()["detail"]
    for ns in FOREIGN:
        assert st.get(ids[ns]).summary == "foreign secret" and st.get(ids[ns]).version == 1


def test_keys_bound_to_a_scope_hold_their_requests_to_it(world):
    svc, st, ids = world
    ring = KeyRing({"key-alice": S.Scope("alice"), "key-bob": S.Scope("bob"), "key-admin": None})
    with running(svc, api_key=None, api_keys=ring) as url:
        ca = httpx.Client(base_url=url, headers={"Authorization": "Bearer key-alice"}, timeout=30)
        cb = httpx.Client(base_url=url, headers={"X-API-Key": "key-bob"}, timeout=30)
        admin = httpx.Client(base_url=url, headers={"X-API-Key": "key-admin"}, timeout=30)
        # no scope in the request: the key's is filled in
        mine = ca.get("/v1/memories").json()["results"]
        assert sorted(m["namespace"] for m in mine) == ["u:alice", "u:alice:r:s1"]
        assert ca.get(f"/v1/memories/{ids['alice']}").json()["memory"] == "alice secret fact about tea"
        r = ca.post("/v1/memories", json={"messages": "alice adds this", "infer": False})
        assert r.status_code == 200 and st.get(r.json()["results"][0]["id"]).namespace == "u:alice"
        found = ca.post("/v1/memories/search", json={"query": "secret fact tea", "limit": 20}).json()["results"]
        assert found and {x["user_id"] for x in found} == {"alice"}
        # naming another user: 403, whatever the route; the other user's ids: 404
        for r in (ca.get("/v1/memories", params={"user_id": "bob"}),
                  ca.post("/v1/memories", json={"messages": "x", "user_id": "bob", "infer": False}),
                  ca.post("/v1/memories/search", json={"query": "tea", "user_id": "bob"}),
                  ca.get(f"/v1/memories/{ids['bob']}", params={"user_id": "bob"}),
                  ca.delete(f"/v1/memories/{ids['bob']}", params={"user_id": "bob"})):
            assert r.status_code == 403 and r.json()["error"] == "ScopeForbidden" and "user_id" in r.json()["detail"]
        for target in ("bob", "agent", *FOREIGN):
            for name, r in _routes(ca, ids[target], {}):
                assert r.status_code == 404, (target, name, r.text)
        assert cb.get(f"/v1/memories/{ids['alice']}").status_code == 404
        # narrowing within one's own scope is fine
        assert [m["namespace"] for m in ca.get("/v1/memories", params={"run_id": "s1"}).json()["results"]] == [
            "u:alice:r:s1"]
        # the admin key reaches any scope it names
        assert admin.get(f"/v1/memories/{ids['bob']}", params={"user_id": "bob"}).status_code == 200
        assert admin.get(f"/v1/memories/{ids['bob']}").status_code == 422
        assert httpx.get(url + "/v1/memories", params={"user_id": "alice"}).status_code == 401
        for c in (ca, cb, admin):
            c.close()
    assert st.get(ids["bob"]).version == 1


def test_feedback_with_a_bound_key_only_for_its_own_responses(tmp_path):
    chat = ScriptedChat(lambda messages: '{"answer": "ok", "citations": [0]}')
    with memkern.MemoryStore(tmp_path / "s", dim=64, metric="cos") as st:
        svc = memkern.server.MemoryService(st, embedder=HashEmbedder(64), chat_model=chat,
                                           rmm_kwargs={"top_k": 4, "top_m": 2, "batch_size": 8})
        for u in ("alice", "bob"):
            svc.add([{"role": "user", "content": f"{u} fact {i}"} for i in range(4)], user_id=u, infer=False)
        ring = KeyRing({"ka": S.Scope("alice"), "kb": S.Scope("bob")})
        with running(svc, api_key=None, api_keys=ring) as url:
            ca = httpx.Client(base_url=url, headers={"X-API-Key": "ka"}, timeout=60)
            cb = httpx.Client(base_url=url, headers={"X-API-Key": "kb"}, timeout=60)
            out = cb.post("/v1/respond", json={"query": "fact?"}).json()
            r = ca.post("/v1/feedback", json={"response_id": out["response_id"], "rewards": [1.0, -1.0]})
            assert r.status_code == 404 and "response_id" in r.json()["detail"]
            assert cb.post("/v1/feedback", json={"response_id": out["response_id"], "rewards": [1.0, -1.0]}
                           ).status_code == 200
            ca.close()
            cb.close()
        svc.close()


def test_key_file_format():
    ring = KeyRing.parse("# keys\nk-admin\n\nk-alice user_id=alice\nk-run user_id=alice run_id=s1\n")
    assert ring.items() == [("k-admin", None), ("k-alice", S.Scope("alice")), ("k-run", S.Scope("alice", None, "s1"))]
    assert ring.match({b"authorization": b"Bearer k-run"}) == (True, S.Scope("alice", None, "s1"))
    assert ring.match({b"x-api-key": b"nope"}) == (False, None)
    for bad, what in (("k user=alice", "line 1"), ("k user_id=a:b", "user_id"), ("", "at least one key"),
                      ("k\nk", "repeated"), ("k user_id=a user_id=b", "line 1")):
        with pytest.raises(memkern.MemkernValueError, match=what):
            KeyRing.parse(bad)


@pytest.mark.slow
def test_mcp_id_tools_are_scoped_over_stdio(tmp_path):
    """The real stdio MCP client against `memkern mcp`: get / update / delete / history of another
    user's id or of a non-scope namespace is the same tool error as an unknown id."""
    store = tmp_path / "store"
    with memkern.MemoryStore(store, dim=384, metric="cos") as st:
        rng = np.random.default_rng(0)
        v = rng.standard_normal((3, 384)).astype(np.float32)
        demo = int(st.add_batch("demo", ["demo secret"], v[:1])[0])
        bob = int(st.add_batch("u:bob", ["bob secret"], v[1:2])[0])
        alice = int(st.add_batch("u:alice", ["alice note"], v[2:3])[0])

    async def session_run():
        out = {}
        async with mcp_session(store, tmp_path) as s:
            for target, mid in (("demo", demo), ("bob", bob), ("unknown", 10 ** 6)):
                for tool, extra in (("get_memory", {}), ("memory_history", {}), ("delete_memory", {}),
                                    ("update_memory", {"text": "overwritten"})):
                    r = await s.call_tool(tool, {"memory_id": mid, "user_id": "alice", **extra})
                    out[(target, tool)] = (r.is_error, r.content[0].text.replace(str(mid), "ID"))
            r = await s.call_tool("get_memory", {"memory_id": alice, "user_id": "alice"})
            out["own"] = json.loads(r.content[0].text)["memory"]
            r = await s.call_tool("get_memory", {"memory_id": alice})
            out["no scope"] = (r.is_error, r.content[0].text)
        return out

    out = asyncio.run(session_run())
    for tool in ("get_memory", "memory_history", "delete_memory", "update_memory"):
        assert out[("unknown", tool)][0] and "memory_id" in out[("unknown", tool)][1]
        assert out[("demo", tool)] == out[("bob", tool)] == out[("unknown", tool)], tool
    assert out["own"] == "alice note"
    assert out["no scope"][0] and "user_id/agent_id/run_id" in out["no scope"][1]
    with memkern.MemoryStore(store) as st:
        assert st.get(demo).summary == "demo secret" and st.get(bob).summary == "bob secret"
        assert st.get(demo).version == st.get(bob).version == 1
