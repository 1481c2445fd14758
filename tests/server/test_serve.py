"""`memkern serve`: the HTTP API tested with a real client (httpx) against a running uvicorn server.

The server runs in a thread on a free port, over a real MemoryStore; the embedder is the
bag-of-words HashEmbedder (fast, deterministic) except in the subprocess test, which runs the
`memkern serve` command with the offline default embedder.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")

import memkern  # noqa: E402
from memkern.server import Limits, MemoryService  # noqa: E402
from memkern.server import scopes as S  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "helpers"))
from fakes_rmm import HashEmbedder, ScriptedChat  # noqa: E402
from serve_common import running  # noqa: E402

KEY = "test-key-123"
README = Path(__file__).resolve().parents[2] / "docs" / "servers.md"


@pytest.fixture
def store(tmp_path):
    with memkern.MemoryStore(tmp_path / "store", dim=64, metric="cos") as st:
        yield st


@pytest.fixture
def service(store):
    svc = MemoryService(store, embedder=HashEmbedder(64), limits=Limits(max_body_bytes=64 * 1024, max_messages=8,
                                                                        max_text_chars=500))
    yield svc
    svc.close()


@pytest.fixture
def client(service):
    with running(service) as url, httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"},
                                               timeout=30) as c:
        yield c


def _raw_add(client, content, user="alice", **kw):
    body = {"messages": [{"role": "user", "content": content}], "user_id": user, "infer": False, **kw}
    r = client.post("/v1/memories", json=body)
    assert r.status_code == 200, r.text
    return r.json()["results"]


# ---------------------------------------------------------------------------------- routes
def test_add_get_search_update_history_delete_round_trip(client, store):
    res = _raw_add(client, "I moved to Berlin last week", metadata={"source": "chat"})
    assert [r["event"] for r in res] == ["ADD"]
    mid = res[0]["id"]
    _raw_add(client, "My sister plays the cello")
    A = {"user_id": "alice"}
    got = client.get(f"/v1/memories/{mid}", params=A).json()
    assert got["memory"] == "I moved to Berlin last week" and got["user_id"] == "alice"
    assert got["metadata"] == {"source": "chat"} and got["namespace"] == "u:alice"
    # search: mem0's shape, best first, scores are the store's cosine scores
    r = client.post("/v1/memories/search", json={"query": "where did I move? Berlin", "user_id": "alice", "limit": 5})
    assert r.status_code == 200
    results = r.json()["results"]
    assert [x["id"] for x in results][0] == mid and len(results) == 2
    assert {"id", "memory", "score"} <= set(results[0]) and results[0]["score"] >= results[1]["score"]
    q = HashEmbedder(64).encode(["where did I move? Berlin"])[0]
    assert results[0]["score"] == pytest.approx(float(store.embeddings([mid])[0] @ q), abs=1e-5)
    # update: a new version, re-embedded (search now finds the new text)
    r = client.put(f"/v1/memories/{mid}", json={"text": "I moved to Munich in May", "user_id": "alice"})
    assert r.status_code == 200 and r.json()["version"] == 2
    top = client.post("/v1/memories/search", json={"query": "Munich", "user_id": "alice", "limit": 1}).json()
    assert top["results"][0]["id"] == mid and top["results"][0]["memory"] == "I moved to Munich in May"
    hist = client.get(f"/v1/memories/{mid}/history", params=A).json()["results"]
    assert [(h["version"], h["event"], h["old_memory"], h["new_memory"]) for h in hist] == [
        (1, "ADD", None, "I moved to Berlin last week"), (2, "UPDATE", "I moved to Berlin last week", "I moved to Munich in May")]
    # delete: 404 afterwards, with the argument named
    assert client.delete(f"/v1/memories/{mid}", params=A).json() == {"id": mid, "deleted": True}
    r = client.get(f"/v1/memories/{mid}", params=A)
    assert r.status_code == 404 and r.json()["error"] == "MemkernKeyError" and str(mid) in r.json()["detail"]
    assert client.delete(f"/v1/memories/{mid}", params=A).status_code == 404
    listed = client.get("/v1/memories", params={"user_id": "alice"}).json()["results"]
    assert [x["memory"] for x in listed] == ["My sister plays the cello"]


def test_add_with_inference_folds_repeated_facts(client, store):
    conv = [{"role": "user", "content": "I adopted a grey cat named Pixel last spring."},
            {"role": "assistant", "content": "Lovely!"}]
    first = client.post("/v1/memories", json={"messages": conv, "user_id": "bob"}).json()["results"]
    assert [r["event"] for r in first] == ["ADD"] and "Pixel" in first[0]["memory"]
    again = client.post("/v1/memories", json={"messages": conv, "user_id": "bob"}).json()["results"]
    assert [r["event"] for r in again] == ["NOOP"] and again[0]["id"] == first[0]["id"]
    assert store.count("u:bob") == 1
    rec = store.get(first[0]["id"])  # the NOOP kept the second session's turns as evidence
    assert [t["content"] for t in rec.turns] == [c["content"] for c in conv] * 2


def test_openapi_schema_lists_the_routes(client):
    spec = client.get("/openapi.json").json()
    for path in ("/v1/memories", "/v1/memories/search", "/v1/memories/{memory_id}", "/v1/memories/{memory_id}/history",
                 "/v1/respond", "/v1/feedback", "/health"):
        assert path in spec["paths"], path
    assert set(spec["paths"]["/v1/memories/{memory_id}"]) == {"get", "put", "delete"}


# ---------------------------------------------------------------------------------- scopes
def test_scopes_map_to_namespaces_and_isolate_users(client, store):
    _raw_add(client, "alice likes green tea")
    _raw_add(client, "bob likes green tea", user="bob")
    r = client.post("/v1/memories", json={"messages": "alice drinks green tea on trips", "user_id": "alice",
                                          "run_id": "trip-1", "infer": False})
    assert r.status_code == 200
    r = client.post("/v1/memories", json={"messages": "the planner agent prefers tea", "agent_id": "planner",
                                          "infer": False})
    assert r.status_code == 200
    assert sorted(store.namespaces()) == ["a:planner", "u:alice", "u:alice:r:trip-1", "u:bob"]

    def found(**scope):
        res = client.post("/v1/memories/search", json={"query": "green tea", "limit": 10, **scope}).json()["results"]
        return sorted(x["memory"] for x in res)

    # user_id alone: every scope of alice (mem0's semantics), never bob's
    assert found(user_id="alice") == ["alice drinks green tea on trips", "alice likes green tea"]
    assert found(user_id="alice", run_id="trip-1") == ["alice drinks green tea on trips"]
    assert found(user_id="bob") == ["bob likes green tea"]
    assert found(agent_id="planner") == ["the planner agent prefers tea"]
    assert found(user_id="carol") == []
    res = client.post("/v1/memories/search", json={"query": "tea", "user_id": "alice", "run_id": "trip-1"}).json()
    assert res["results"][0]["run_id"] == "trip-1" and res["results"][0]["agent_id"] is None


def test_scope_encoding_is_injective_and_validated():
    cases = [S.Scope("alice"), S.Scope(None, "a"), S.Scope("a", "b", "c"), S.Scope(run_id="u"),
             S.Scope("x@y.com", None, "2024-01-01"), S.Scope("u", "r")]
    names = [S.encode(s) for s in cases]
    assert len(set(names)) == len(cases)
    assert [S.decode(n) for n in names] == cases
    assert S.encode(S.Scope("a" * 38, "b" * 38, "c" * 38)) == "u:" + "a" * 38 + ":a:" + "b" * 38 + ":r:" + "c" * 38
    assert S.decode("alice") is None and S.decode("r:x:u:y") is None and S.decode("u:a:u:b") is None
    for bad in ("a:b", "", ".hidden", "a..b", "a b", "x" * 39, "ü"):
        with pytest.raises(memkern.MemkernValueError, match="user_id"):
            S.make_scope(user_id=bad)
    with pytest.raises(memkern.MemkernTypeError, match="agent_id"):
        S.make_scope(agent_id=3)
    with pytest.raises(memkern.MemkernValueError, match="user_id/agent_id/run_id"):
        S.make_scope()


# ---------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("body, status, names", [
    ({"messages": [{"role": "user", "content": "x"}], "user_id": "a:b", "infer": False}, 422, "user_id"),
    ({"messages": [{"role": "user", "content": "x"}], "infer": False}, 422, "user_id/agent_id/run_id"),
    ({"messages": [{"role": "user", "content": 3}], "user_id": "a", "infer": False}, 422, "messages[0]['content']"),
    ({"messages": [{"role": "user"}], "user_id": "a"}, 422, "messages[0]['content']"),
    ({"messages": [{"role": 1, "content": "x"}], "user_id": "a"}, 422, "messages[0]['role']"),
    ({"messages": 5, "user_id": "a"}, 422, "messages"),
    ({"user_id": "a"}, 422, "messages"),
    ({"messages": [{"role": "user", "content": "   "}], "user_id": "a", "infer": False}, 422, "messages[0].content"),
    ({"messages": "hi", "userid": "a"}, 422, "userid"),
    ({"messages": "hi", "user_id": "a", "metadata": [1]}, 422, "metadata"),
    ({"messages": "hi", "user_id": "a", "metadata": {"k": "v"}}, 422, "metadata"),
    ({"messages": "hi", "user_id": "a", "infer": "yes"}, 422, "infer"),
])
def test_bad_add_requests_name_the_argument_and_write_nothing(client, store, body, status, names):
    r = client.post("/v1/memories", json=body)
    assert r.status_code == status, r.text
    assert names in r.json()["detail"]
    assert store.namespaces() == []


def test_bad_search_update_and_id_requests(client, store):
    mid = _raw_add(client, "I like jazz")[0]["id"]
    for body, names in [({"query": "", "user_id": "alice"}, "query"), ({"query": "x", "user_id": "alice", "limit": 0}, "limit"),
                        ({"query": "x", "user_id": "alice", "limit": "5"}, "limit"), ({"query": "x"}, "user_id"),
                        ({"query": "x", "user_id": "alice", "filters": "user"}, "filters"),
                        ({"query": "x", "user_id": "alice", "threshold": "high"}, "threshold")]:
        r = client.post("/v1/memories/search", json=body)
        assert r.status_code == 422 and names in r.json()["detail"], (body, r.text)
    import inspect

    r = client.post("/v1/memories/search", json={"query": "jazz", "user_id": "alice", "filters": {"source": "x"}})
    if "filter" in inspect.signature(store.search).parameters:  # metadata filters in this build's store
        assert r.status_code == 200 and r.json()["results"] == []
    else:
        assert r.status_code == 422 and r.json()["detail"].startswith("filters: expected none")
    r = client.get("/v1/memories/abc", params={"user_id": "alice"})
    assert r.status_code == 422 and "memory_id" in r.json()["detail"]
    assert client.get("/v1/memories/999999", params={"user_id": "alice"}).status_code == 404
    r = client.put(f"/v1/memories/{mid}", json={"user_id": "alice"})
    assert r.status_code == 422 and "text/metadata" in r.json()["detail"]
    r = client.put(f"/v1/memories/{mid}", json={"text": 5, "user_id": "alice"})
    assert r.status_code == 422 and "text" in r.json()["detail"]
    r = client.put(f"/v1/memories/{mid}", params={"user_id": "alice"}, content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422
    assert store.get(mid).version == 1 and store.get(mid).summary == "I like jazz"


# ---------------------------------------------------------------------------------- auth
def test_api_key_is_required_and_checked(service):
    with running(service, api_key=KEY) as url, httpx.Client(base_url=url) as c:
        body = {"messages": "hello there", "user_id": "a", "infer": False}
        r = c.post("/v1/memories", json=body)
        assert r.status_code == 401 and "API key" in r.json()["detail"]
        assert r.headers["www-authenticate"] == "Bearer"
        assert c.post("/v1/memories", json=body, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert c.post("/v1/memories", json=body, headers={"X-API-Key": KEY + "x"}).status_code == 401
        assert c.get("/v1/memories/1", headers={"Authorization": KEY}).status_code == 401  # no "Bearer"
        assert service.store.namespaces() == []
        assert c.post("/v1/memories", json=body, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
        assert c.post("/v1/memories", json=body, headers={"X-API-Key": KEY}).status_code == 200
        assert c.get("/health").json()["status"] == "ok"  # public
        assert "/v1/memories" in c.get("/openapi.json").json()["paths"]  # public
    with running(service, api_key=None) as url, httpx.Client(base_url=url) as c:  # localhost without a key
        assert c.get("/v1/memories", params={"user_id": "a"}).status_code == 200


def test_serve_refuses_a_wide_bind_without_a_key(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "MEMKERN_API_KEY"}
    p = subprocess.run([sys.executable, "-m", "memkern", "serve", "--store", str(tmp_path / "s"), "--host", "0.0.0.0"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip().splitlines() == [p.stderr.strip()] and "--api-key" in p.stderr
    assert not (tmp_path / "s").exists()


def test_loopback_detection():
    from memkern.cli.serve import is_loopback

    assert all(is_loopback(h) for h in ("127.0.0.1", "localhost", "::1", "127.1.2.3", "[::1]"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "10.0.0.1", "example.com", ""))


# ---------------------------------------------------------------------------------- limits
def test_request_size_limits(client, store):
    big = "x" * (70 * 1024)
    r = client.post("/v1/memories", json={"messages": big, "user_id": "a", "infer": False})
    assert r.status_code == 413 and "body" in r.json()["detail"] and str(64 * 1024) in r.json()["detail"]

    def chunks():  # no Content-Length: counted as it streams
        for _ in range(80):
            yield b" " * 1024
    r = client.post("/v1/memories", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"] == "PayloadTooLarge"
    msgs = [{"role": "user", "content": f"fact {i}"} for i in range(9)]
    r = client.post("/v1/memories", json={"messages": msgs, "user_id": "a", "infer": False})
    assert r.status_code == 422 and "at most 8 messages" in r.json()["detail"]
    r = client.post("/v1/memories", json={"messages": "y" * 501, "user_id": "a", "infer": False})
    assert r.status_code == 422 and "messages[0].content" in r.json()["detail"] and "500" in r.json()["detail"]
    r = client.post("/v1/memories/search", json={"query": "q" * 501, "user_id": "a"})
    assert r.status_code == 422 and "query" in r.json()["detail"]
    assert store.namespaces() == []
    ok = client.post("/v1/memories", json={"messages": msgs[:8], "user_id": "a", "infer": False})
    assert ok.status_code == 200 and store.count("u:a") == 8


# ---------------------------------------------------------------------------------- concurrency
class SlowHashEmbedder(HashEmbedder):
    """Sleeps in every call (the GIL is released), so racing requests interleave."""

    def encode(self, texts, kind="passage", **kw):
        time.sleep(0.003)
        return super().encode(texts, kind, **kw)


@pytest.mark.slow
def test_concurrent_clients_lose_nothing(tmp_path):
    with memkern.MemoryStore(tmp_path / "s", dim=64, metric="cos") as store:
        svc = MemoryService(store, embedder=SlowHashEmbedder(64))
        users, per = 6, 8
        with running(svc) as url:
            def worker(u):
                ids = []
                with httpx.Client(base_url=url, headers={"X-API-Key": KEY}, timeout=60) as c:
                    for i in range(per):
                        r = c.post("/v1/memories", json={"messages": f"user{u} fact number {i} about topic{i}",
                                                         "user_id": f"user{u}", "infer": False})
                        assert r.status_code == 200, r.text
                        ids += [x["id"] for x in r.json()["results"]]
                        s = c.post("/v1/memories/search", json={"query": f"fact number {i}", "user_id": f"user{u}"})
                        assert s.status_code == 200
                        assert all(x["user_id"] == f"user{u}" for x in s.json()["results"])
                return ids

            with ThreadPoolExecutor(users) as ex:
                all_ids = [i for ids in ex.map(worker, range(users)) for i in ids]
        assert len(all_ids) == len(set(all_ids)) == users * per
        for u in range(users):
            assert store.count(f"u:user{u}") == per
            assert sorted(r.summary for r in store.get_batch(store.ids(f"u:user{u}"))) == sorted(
                f"user{u} fact number {i} about topic{i}" for i in range(per))


@pytest.mark.slow
def test_concurrent_inferred_adds_of_one_fact_are_serialised(tmp_path):
    """Eight clients add the same fact for one user at once: prospective reflection is a
    read-modify-write (search candidates, decide, write), so without the namespace lock several
    see an empty bank and each ADDs a copy. With it: one ADD, seven NOOPs. (The store's search and
    add sleep a little, as a large HNSW search and an fsync do, so the read -> write window is wide.)"""

    class SlowSearchStore(memkern.MemoryStore):
        def search(self, *a, **kw):
            out = super().search(*a, **kw)
            time.sleep(0.01)
            return out

        def add(self, *a, **kw):
            time.sleep(0.02)
            return super().add(*a, **kw)

    with SlowSearchStore(tmp_path / "s", dim=64, metric="cos") as store:
        svc = MemoryService(store, embedder=SlowHashEmbedder(64))
        conv = [{"role": "user", "content": "My favourite mountain is the Matterhorn in Switzerland."}]
        with running(svc) as url:
            def add(_):
                with httpx.Client(base_url=url, headers={"X-API-Key": KEY}, timeout=60) as c:
                    r = c.post("/v1/memories", json={"messages": conv, "user_id": "dana"})
                    assert r.status_code == 200, r.text
                    return [x["event"] for x in r.json()["results"]]
            with ThreadPoolExecutor(8) as ex:
                events = sorted(e for evs in ex.map(add, range(8)) for e in evs)
        assert events == ["ADD"] + ["NOOP"] * 7
        assert store.count("u:dana") == 1


# ---------------------------------------------------------------------------------- respond
def test_respond_and_feedback(tmp_path):
    """The RMM loop over HTTP (a scripted chat model citing memory 0; the real default model runs in
    tests/server/test_mcp.py): answer, memories shown, citation rewards, then explicit feedback."""
    chat = ScriptedChat(lambda messages: '{"answer": "Lisbon", "citations": [0]}')
    with memkern.MemoryStore(tmp_path / "s", dim=64, metric="cos") as store:
        svc = MemoryService(store, embedder=HashEmbedder(64), chat_model=chat,
                            rmm_kwargs={"top_k": 4, "top_m": 2, "batch_size": 2})
        with running(svc) as url, httpx.Client(base_url=url, headers={"X-API-Key": KEY}, timeout=120) as c:
            for fact in ("I live in Lisbon", "I work as a nurse", "I play the violin", "I have two dogs", "I like chess"):
                c.post("/v1/memories", json={"messages": fact, "user_id": "eve", "infer": False})
            r = c.post("/v1/respond", json={"query": "Where do I live?", "user_id": "eve"})
            assert r.status_code == 200, r.text
            out = r.json()
            assert out["answer"] == "Lisbon" and len(out["memories"]) == 2 and out["citations"] == [0]
            assert out["rewards"] == [1.0, -1.0] and "Where do I live?" in str(chat.calls[0]["prompts"])
            assert {m["id"] for m in out["memories"]} <= set(store.ids("u:eve").tolist())
            rmm = svc._rmms["u:eve"]
            assert rmm.pending == 1
            bad = c.post("/v1/feedback", json={"response_id": out["response_id"], "rewards": [1.0]})
            assert bad.status_code == 422 and "rewards" in bad.json()["detail"]  # refused: not spent
            fb = c.post("/v1/feedback", json={"response_id": out["response_id"], "rewards": [1.0, -1.0]})
            assert fb.status_code == 200 and fb.json()["applied"] is True
            assert rmm.n_updates == 1 and rmm.pending == 0  # batch_size 2: citation rewards + feedback
            bad = c.post("/v1/feedback", json={"response_id": "nope", "rewards": [1.0, 1.0]})
            assert bad.status_code == 404 and "response_id" in bad.json()["detail"]
            bad = c.post("/v1/respond", json={"query": " ", "user_id": "eve"})
            assert bad.status_code == 422 and "query" in bad.json()["detail"]
        svc.close()
        assert (Path(store.path) / "rerankers" / "u:eve.pt").exists()


# ---------------------------------------------------------------------------------- the command
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _readme_block(lang: str, heading: str = "# Servers") -> str:
    text = README.read_text(encoding="utf-8")
    return re.search(rf"```{lang}\n(.*?)```", text[text.index(heading):], re.S).group(1)


@pytest.mark.slow
def test_readme_example_runs_against_the_memkern_serve_command(tmp_path, monkeypatch):
    """The README's server example (curl lines when curl exists, then the httpx code) against the
    real command: default MiniLM embedder, a store created by the command, SIGTERM, reopen."""
    port = _free_port()
    env = dict(os.environ, MEMKERN_API_KEY=KEY)
    proc = subprocess.Popen([sys.executable, "-m", "memkern", "serve", "--store", str(tmp_path / "store"),
                             "--port", str(port), "--log-level", "warning", "--threads", "1"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 90
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                raise AssertionError(f"server did not start: {proc.stderr.read() if proc.poll() is not None else ''}")
            time.sleep(0.2)
        bash = _readme_block("bash")
        assert bash.startswith("MEMKERN_API_KEY=change-me memkern serve --store ./memories")
        if shutil.which("curl"):
            curls = bash.split("\n", 1)[1].replace("localhost:8000", f"127.0.0.1:{port}").replace("change-me", KEY)
            out = subprocess.run(["bash", "-c", curls], capture_output=True, text=True, timeout=120, check=True).stdout
            dec, pos, docs = json.JSONDecoder(), 0, []
            while pos < len(out):
                doc, pos = dec.raw_decode(out, pos)
                docs.append(doc)
            assert docs[0]["results"][0]["event"] == "ADD" and "cello" in docs[1]["results"][0]["memory"]
        monkeypatch.setenv("MEMKERN_URL", url)
        monkeypatch.setenv("MEMKERN_API_KEY", KEY)
        code = _readme_block("python")
        assert "/v1/memories/search" in code
        exec(compile(code, "docs/servers.md", "exec"), {"__name__": "readme_example"})
        assert httpx.get(url + "/health").json()["dim"] == 384
    finally:
        proc.terminate()
        proc.wait(30)
    assert proc.returncode == 0, proc.stderr.read()
    with memkern.MemoryStore(tmp_path / "store") as st:  # closed cleanly; the deleted memory is gone
        texts = [st.get(int(i)).summary for i in st.ids("u:alice")]
        assert "Berlin" not in " ".join(texts) and (not shutil.which("curl") or any("cello" in t for t in texts))


# ---------------------------------------------------------------------------------- the shared embedder
def test_batching_embedder_serves_concurrent_callers_in_shared_batches():
    from memkern.server.shared_models import BatchingEmbedder

    class Recording(HashEmbedder):
        def __init__(self):
            super().__init__(64)
            self.active = 0
            self.max_active = 0
            self.sizes = []

        def encode(self, texts, kind="passage", **kw):
            self.active += 1
            self.max_active = max(self.max_active, self.active)
            time.sleep(0.01)
            if any(t == "boom" for t in texts):
                self.active -= 1
                raise memkern.MemkernValueError("texts: expected no 'boom', got 'boom'")
            self.sizes.append((len(texts), kind))
            out = super().encode(texts, kind)
            self.active -= 1
            return out

    inner = Recording()
    emb = BatchingEmbedder(inner, max_batch=8)
    ref = HashEmbedder(64)
    texts = [[f"text {i} {j}" for j in range(1 + i % 3)] for i in range(24)]
    kinds = ["query" if i % 4 == 0 else "passage" for i in range(24)]

    def call(i):
        if i == 5:
            with pytest.raises(memkern.MemkernValueError, match="boom"):
                emb.encode(["fine", "boom"])
            return None
        return emb.encode(texts[i], kind=kinds[i])

    with ThreadPoolExecutor(12) as ex:
        outs = list(ex.map(call, range(24)))
    for i, out in enumerate(outs):
        if i != 5:  # every caller gets exactly its own rows
            np.testing.assert_array_equal(out, ref.encode(texts[i], kinds[i]))
    assert inner.max_active == 1  # the model is called by one thread at a time
    assert emb.batches < 23 and max(n for n, _ in inner.sizes) <= 8  # shared batches, within max_batch


def test_rmm_cache_saves_and_drops_the_least_recently_used(tmp_path):
    """At most max_rmms RMMs (each holds a reranker) stay in memory; the one dropped is saved first,
    and feedback on its earlier response still trains the namespace's reranker."""
    chat = ScriptedChat(lambda messages: '{"answer": "ok", "citations": [0]}')
    with memkern.MemoryStore(tmp_path / "s", dim=64, metric="cos") as store:
        svc = MemoryService(store, embedder=HashEmbedder(64), chat_model=chat, max_rmms=1,
                            rmm_kwargs={"top_k": 4, "top_m": 2, "batch_size": 2})
        for user in ("ann", "ben"):
            svc.add([{"role": "user", "content": f"{user} fact {i}"} for i in range(4)], user_id=user, infer=False)
        first = svc.respond("fact?", user_id="ann")
        svc.respond("fact?", user_id="ben")
        assert list(svc._rmms) == ["u:ben"]
        assert (Path(store.path) / "rerankers" / "u:ann.buffer.pt").exists()  # ann's pending rewards saved
        out = svc.feedback(first["response_id"], [1.0, -1.0])
        assert out["applied"] is True and out["pending"] == 0  # reloaded buffer (1) + feedback = batch of 2
        assert svc._rmms["u:ann"].n_updates == 1
        svc.close()
