"""mem0's own SDK (the real ``mem0ai`` package, unmodified) against ``memkern serve``: every memory
method of ``MemoryClient`` and ``AsyncMemoryClient`` with ``host=`` pointing at a real server in a
thread, and mem0's OSS server paths. Only 127.0.0.1 is reachable (``loopback_only``)."""
from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

os.environ["MEM0_TELEMETRY"] = "False"
os.environ.setdefault("MEM0_DIR", os.path.join(os.environ.get("TMPDIR", "/tmp"), "memkern-test-mem0"))

import httpx  # noqa: E402
import pytest  # noqa: E402

pytest.importorskip("mem0")
pytest.importorskip("fastapi")

from mem0 import AsyncMemoryClient, MemoryClient  # noqa: E402
from mem0.exceptions import MemoryNotFoundError  # noqa: E402
from serve_common import KEY, hash_service, running  # noqa: E402

import memkern  # noqa: E402
from memkern.server.scopes import KeyRing, Scope  # noqa: E402

DOCS = Path(__file__).resolve().parents[2] / "docs" / "servers.md"
#: The memory methods of mem0's client (the platform's project / webhook / export / summary /
#: profile / feedback methods: test_mem0_platform.py).
MEMORY_METHODS = ("add", "get", "get_all", "search", "update", "delete", "delete_all", "history", "users",
                  "delete_users", "reset", "batch_update", "batch_delete")


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch):
    real_connect = socket.socket.connect

    def connect(self, address):
        if isinstance(address, tuple) and address[0] not in ("127.0.0.1", "::1", "localhost"):
            raise ConnectionRefusedError(f"no network in these tests: {address!r}")
        return real_connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)


@pytest.fixture
def server(tmp_path):
    with memkern.MemoryStore(tmp_path / "store", dim=64, metric="cos") as st:
        with running(hash_service(st)) as url:
            yield url, st


def _raw(text: str) -> dict:
    return {"role": "user", "content": text}


def test_memory_client_every_memory_method(server):
    url, st = server
    called = set()
    c = MemoryClient(api_key=KEY, host=url)                    # pings /v1/ping/ with "Token <key>"
    alice, bob = {"user_id": "alice"}, {"user_id": "bob"}
    added = c.add([_raw("I play the cello every Sunday."), _raw("My sister lives in Lisbon.")],
                  filters=alice, infer=False)["results"]
    called.add("add")
    ids = [r["id"] for r in added]
    assert [r["event"] for r in added] == ["ADD", "ADD"] and all(isinstance(i, str) for i in ids)
    c.add("Bob's dog is called Rex.", user_id="bob", infer=False)   # top-level entity id (v1 style)
    c.add("The planner prefers short plans.", filters={"AND": [{"user_id": "alice"}, {"app_id": "planner"}]},
          infer=False)

    got = c.get(ids[0])
    called.add("get")
    assert got["id"] == ids[0] and got["memory"] == "I play the cello every Sunday." and got["user_id"] == "alice"

    page = c.get_all(filters=alice)
    called.add("get_all")
    assert page["count"] == 3 and {m["id"] for m in page["results"]} >= set(ids) and page["next"] is None
    assert all(m["user_id"] == "alice" for m in page["results"])
    first = c.get_all(filters=alice, page=1, page_size=2)
    second = c.get_all(filters=alice, page=2, page_size=2)
    assert len(first["results"]) == 2 and first["next"] and len(second["results"]) == 1 and second["previous"]
    assert {m["id"] for m in first["results"] + second["results"]} == {m["id"] for m in page["results"]}
    assert c.get_all(filters={"AND": [alice, {"agent_id": "planner"}]})["count"] == 1  # app_id is the agent_id

    hits = c.search("Which instrument do I play?", filters=alice, top_k=5)["results"]
    called.add("search")
    cello = next(h for h in hits if h["id"] == ids[0])
    assert cello["score"] is not None and all(h["user_id"] == "alice" for h in hits)
    lexical = c.search("cello", filters=alice, top_k=1, keyword_search=True)["results"]
    assert [h["id"] for h in lexical] == [ids[0]]
    assert all(h["user_id"] == "bob" for h in c.search("dog", filters=bob)["results"])

    upd = c.update(ids[0], text="I play the viola every Sunday.", metadata={"source": "chat"})
    called.add("update")
    assert upd["id"] == ids[0] and upd["memory"] == "I play the viola every Sunday."
    assert c.get(ids[0])["metadata"] == {"source": "chat"}

    versions = c.history(ids[0])
    called.add("history")
    assert isinstance(versions, list) and [v["event"] for v in versions] == ["ADD", "UPDATE"]
    assert versions[-1]["old_memory"] == "I play the cello every Sunday." and versions[-1]["memory_id"] == ids[0]

    out = c.batch_update([{"memory_id": ids[1], "text": "My sister lives in Porto."}])
    called.add("batch_update")
    assert "1" in out["message"] and c.get(ids[1])["memory"] == "My sister lives in Porto."

    ents = {(e["type"], e["name"]): e["total_memories"] for e in c.users()["results"]}
    called.add("users")
    assert ents == {("user", "alice"): 3, ("user", "bob"): 1, ("agent", "planner"): 1}

    c.delete(ids[0])
    called.add("delete")
    with pytest.raises(MemoryNotFoundError):
        c.get(ids[0])
    assert ids[0] not in {h["id"] for h in c.search("viola", filters=alice)["results"]}

    c.batch_delete([{"memory_id": ids[1]}])
    called.add("batch_delete")
    with pytest.raises(MemoryNotFoundError):
        c.get(ids[1])

    c.delete_all(user_id="bob")
    called.add("delete_all")
    assert c.get_all(filters=bob)["count"] == 0 and c.get_all(filters=alice)["count"] == 1

    c.add("Bob is back.", filters=bob, infer=False)
    assert c.delete_users(user_id="bob")["message"] == "Entity deleted successfully."
    called.add("delete_users")
    assert c.get_all(filters=bob)["count"] == 0

    c.reset()                                                    # delete_users over every entity
    called.add("reset")
    assert c.users()["results"] == [] and all(len(st.ids(ns)) == 0 for ns in st.namespaces())
    assert called == set(MEMORY_METHODS)


def test_async_memory_client_every_memory_method(server):
    url, st = server

    async def run():
        called = set()
        async with AsyncMemoryClient(api_key=KEY, host=url) as c:
            run_scope = {"AND": [{"user_id": "carol"}, {"run_id": "s1"}]}
            added = (await c.add([_raw("Carol drinks green tea."), _raw("Carol hikes in the Alps.")],
                                 filters=run_scope, infer=False))["results"]
            called.add("add")
            ids = [r["id"] for r in added]
            assert (await c.get(ids[1]))["run_id"] == "s1"
            called.add("get")
            assert (await c.get_all(filters={"user_id": "carol"}))["count"] == 2
            called.add("get_all")
            hits = (await c.search("tea", filters={"user_id": "carol"}, keyword_search=True, top_k=1))["results"]
            called.add("search")
            assert [h["id"] for h in hits] == [ids[0]]
            assert (await c.update(ids[0], text="Carol drinks black tea."))["memory"] == "Carol drinks black tea."
            called.add("update")
            assert [v["event"] for v in await c.history(ids[0])] == ["ADD", "UPDATE"]
            called.add("history")
            await c.batch_update([{"memory_id": ids[1], "metadata": {"k": 1}}])
            called.add("batch_update")
            assert (await c.get(ids[1]))["metadata"] == {"k": 1}
            users = {(e["type"], e["name"]) for e in (await c.users())["results"]}
            called.add("users")
            assert users == {("user", "carol"), ("run", "s1")}
            await c.delete(ids[0])
            called.add("delete")
            with pytest.raises(MemoryNotFoundError):
                await c.get(ids[0])
            await c.batch_delete([{"memory_id": ids[1]}])
            called.add("batch_delete")
            await c.add("Carol again.", filters={"user_id": "carol"}, infer=False)
            await c.delete_all(filters={"user_id": "carol"})     # filters in the query string
            called.add("delete_all")
            assert (await c.get_all(filters={"user_id": "carol"}))["count"] == 0
            await c.add("Dave.", filters={"agent_id": "dave"}, infer=False)
            await c.delete_users(agent_id="dave")
            called.add("delete_users")
            await c.add("Eve.", filters={"user_id": "eve"}, infer=False)
            await c.reset()
            called.add("reset")
            assert (await c.users())["results"] == []
        return called

    assert asyncio.run(run()) == set(MEMORY_METHODS)
    assert all(len(st.ids(ns)) == 0 for ns in st.namespaces())


def test_client_errors_and_scopes(tmp_path):
    """A wrong key fails the client's construction; a key bound to a scope reaches only it;
    unknown ids are 404s; options that would change what is kept are refused."""
    with memkern.MemoryStore(tmp_path / "store", dim=64, metric="cos") as st:
        ring = KeyRing({KEY: None, "alice-key": Scope(user_id="alice")})
        with running(hash_service(st), api_key=None, api_keys=ring) as url:
            with pytest.raises(ValueError, match="authorization"):
                MemoryClient(api_key="wrong", host=url)
            admin, alice = MemoryClient(api_key=KEY, host=url), MemoryClient(api_key="alice-key", host=url)
            bob_id = admin.add("Bob's secret.", filters={"user_id": "bob"}, infer=False)["results"][0]["id"]
            mine = alice.add("Alice's note.", infer=False)["results"][0]   # the bound key fills in user_id
            assert admin.get(mine["id"])["user_id"] == "alice"
            for call in (lambda: alice.get(bob_id), lambda: alice.delete(bob_id), lambda: alice.history(bob_id),
                         lambda: admin.get("no-such-id"), lambda: admin.get("123456")):
                with pytest.raises(MemoryNotFoundError):
                    call()
            assert {e["name"] for e in alice.users()["results"]} == {"alice"}
            assert {e["name"] for e in admin.users()["results"]} == {"alice", "bob"}
            with pytest.raises(Exception, match="expected 'alice'"):
                alice.get_all(filters={"user_id": "bob"})
            with pytest.raises(Exception, match="expiration_date"):
                admin.add("x", filters={"user_id": "bob"}, infer=False, expiration_date="2030-01-01")
            with pytest.raises(Exception, match="filters.OR"):
                admin.search("x", filters={"OR": [{"user_id": "a"}, {"user_id": "b"}]})
            with pytest.raises(Exception, match="app_id"):
                admin.get_all(filters={"agent_id": "x", "app_id": "y"})
            with pytest.raises(MemoryNotFoundError, match="999999"):   # one bad id: nothing deleted
                admin.batch_delete([{"memory_id": mine["id"]}, {"memory_id": "999999"}])
            assert admin.get(mine["id"])["id"] == mine["id"]
            # mem0's memory feedback, not redirected to memkern's /v1/feedback (response rewards)
            assert admin.feedback(mine["id"], "POSITIVE")["feedback"] == "POSITIVE"
            # memkern's own routes keep their shape without the slash
            with httpx.Client(base_url=url, headers={"Authorization": f"Token {KEY}"}) as http:
                assert http.get(f"/v1/memories/{mine['id']}").status_code == 422      # needs a scope
                assert http.get(f"/v1/memories/{mine['id']}", params={"user_id": "alice"}).json()["id"] == \
                    int(mine["id"])


def test_oss_server_paths(server):
    url, st = server
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}) as http:
        r = http.post("/memories", json={"messages": [_raw("Frank grows tomatoes.")], "user_id": "frank",
                                         "metadata": {"topic": "garden"}, "infer": False})
        assert r.status_code == 200, r.text
        mid = r.json()["results"][0]["id"]
        http.post("/memories", json={"messages": [_raw("Frank owns a bicycle.")], "user_id": "frank",
                                     "metadata": {"topic": "sport"}, "infer": False})
        assert len(http.get("/memories", params={"user_id": "frank"}).json()["results"]) == 2
        hits = http.post("/search", json={"query": "tomatoes", "user_id": "frank",
                                          "filters": {"topic": "garden"}}).json()["results"]
        assert [h["id"] for h in hits] == [mid]                      # OSS filters: metadata
        assert http.put(f"/memories/{mid}", json={"data": "Frank grows peppers."}).json()["memory"] == \
            "Frank grows peppers."
        assert [v["event"] for v in http.get(f"/memories/{mid}/history").json()] == ["ADD", "UPDATE"]
        assert http.get(f"/memories/{mid}").json()["memory"] == "Frank grows peppers."
        assert http.delete(f"/memories/{mid}").status_code == 200
        assert http.get(f"/memories/{mid}").status_code == 404
        http.post("/memories", json={"messages": "Gina.", "user_id": "gina", "infer": False})
        assert http.delete("/memories", params={"user_id": "gina"}).json()["deleted"] == 1
        assert http.post("/reset").json()["deleted"] == 1            # frank's bicycle
        assert all(len(st.ids(ns)) == 0 for ns in st.namespaces())


def _doc_block() -> str:
    text = DOCS.read_text(encoding="utf-8")
    start = text.index("<!-- test: by tests/server/test_mem0_client.py::test_docs_example_runs -->")
    body = text[start:].split("```python\n", 1)[1]
    return body.split("\n```", 1)[0]


def test_docs_example_runs(server, monkeypatch):
    """docs/servers.md's mem0 SDK example, verbatim, against the server."""
    url, _ = server
    monkeypatch.setenv("MEMKERN_URL", url)
    monkeypatch.setenv("MEMKERN_API_KEY", KEY)
    exec(compile(_doc_block(), "servers.md", "exec"), {"__name__": "docs_servers_mem0"})
