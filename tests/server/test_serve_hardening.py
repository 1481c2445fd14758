"""Hostile input against `memkern serve` and `memkern mcp`: every read works whatever time a record
holds, lone surrogates and oversized fields are JSON errors (HTTP) or tool errors (MCP, never a
dropped request), feedback is accepted once per response, a keyless server answers only loopback
names, slow or half-open requests time out, concurrency is capped, and no status is plain text."""
from __future__ import annotations

import asyncio
import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

import memkern  # noqa: E402
from memkern.server import Limits, MemoryService  # noqa: E402
from memkern.base.validate import MAX_TIME, MIN_TIME, iso_time  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "helpers"))
from fakes_rmm import HashEmbedder, ScriptedChat  # noqa: E402
from serve_common import KEY, mcp_session, raw_request, running  # noqa: E402

H = {"X-API-Key": KEY}


def _svc(store, chat=None, **limits):
    return MemoryService(store, embedder=HashEmbedder(64), chat_model=chat, limits=Limits(**limits),
                         rmm_kwargs={"top_k": 4, "top_m": 2, "batch_size": 8})


@pytest.fixture
def store(tmp_path):
    with memkern.MemoryStore(tmp_path / "store", dim=64, metric="cos") as st:
        yield st


def _json_error(r, status):
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/json"), r.headers
    body = r.json()
    assert set(body) == {"detail", "error"}, body
    return body


# ------------------------------------------------------------------ dates: any stored time reads back
def test_every_stored_time_renders():
    """The renderer the read routes use never fails on a stored number: a time a store written
    before the date bounds may hold (|t| up to 1e12) renders as null, not a 500."""
    from types import SimpleNamespace

    svc = MemoryService(memkern.InMemoryStore(dim=64, metric="cos"), embedder=HashEmbedder(64))
    for t in (1e12, -1e12, 5e11, float("nan"), MAX_TIME, MIN_TIME, 0.0):
        rec = SimpleNamespace(namespace="u:a", id=1, summary="s", meta={}, version=1, status="active",
                              created_at=t, updated_at=t, event_time=t)
        d = svc._record_json(rec)
        assert d["event_time"] == iso_time(t) and d["created_at"] == iso_time(t)
    assert iso_time(MAX_TIME) == "9999-12-31T23:59:59+00:00" and iso_time(MIN_TIME) == "0001-01-01T00:00:00+00:00"


def test_one_far_date_does_not_poison_a_users_reads(store):
    """The issue's 5e11 s is refused at the add (naming date); the bounds the API accepts (years
    1-9999, also written straight to the store) read back through every read route, for the scope
    and its parent."""
    chat = ScriptedChat(lambda messages: '{"answer": "ok", "citations": [0]}')
    svc = _svc(store, chat)
    with running(svc) as url, httpx.Client(base_url=url, headers=H, timeout=60) as c:
        add = {"messages": "x", "user_id": "victim", "run_id": "r", "infer": False}
        for bad in (5e11, -1e12, MAX_TIME + 1, "10000-01-01"):
            r = c.post("/v1/memories", json={**add, "date": bad})
            assert r.status_code == 422 and "date" in r.json()["detail"], r.text
        for good in (MAX_TIME, MIN_TIME, "9999-12-31"):
            assert c.post("/v1/memories", json={**add, "date": good}).status_code == 200
        r = c.post("/v1/memories", json={**add, "messages": "dated", "date": "9999-12-31T23:59:59", "infer": True})
        assert r.status_code == 200, r.text
        emb = HashEmbedder(64).encode(["far future", "far past"])
        far = store.add_batch("u:victim:r:r", ["far future", "far past"], emb, event_times=[MAX_TIME, MIN_TIME])
        ok = c.post("/v1/memories", json={"messages": "I like tea", "user_id": "victim", "infer": False}).json()
        mid = ok["results"][0]["id"]
        for scope in ({"user_id": "victim"}, {"user_id": "victim", "run_id": "r"}):
            listed = c.get("/v1/memories", params=scope)
            assert listed.status_code == 200, listed.text
            times = {m["memory"]: m["event_time"] for m in listed.json()["results"]}
            assert times["far future"] == iso_time(MAX_TIME) and times["far past"] == iso_time(MIN_TIME)
            s = c.post("/v1/memories/search", json={"query": "far future tea x", "limit": 10, **scope})
            assert s.status_code == 200 and len(s.json()["results"]) >= 2, s.text
            s = c.post("/v1/memories/search", json={"query": "far", "time_range": [None, None], **scope})
            assert s.status_code == 200, s.text
            for i in far.tolist():
                assert c.get(f"/v1/memories/{i}", params=scope).status_code == 200
                assert c.get(f"/v1/memories/{i}/history", params=scope).status_code == 200
        r = c.post("/v1/respond", json={"query": "far future?", "user_id": "victim", "run_id": "r"})
        assert r.status_code == 200, r.text
        assert c.get(f"/v1/memories/{mid}", params={"user_id": "victim"}).json()["memory"] == "I like tea"
    svc.close()


# ------------------------------------------------------------------ lone surrogates
SUR = "x\ud800y"


class Utf8Embedder(HashEmbedder):
    """Encodes its texts to UTF-8 first, as the real embedder's tokenizer does (a lone surrogate
    there is a UnicodeEncodeError, not a memkern error)."""

    def encode(self, texts, kind="passage", **kw):
        for t in texts:
            t.encode("utf-8")
        return super().encode(texts, kind, **kw)


def test_lone_surrogates_are_json_errors_and_write_nothing(store):
    chat = ScriptedChat(lambda messages: '{"answer": "ok", "citations": [0]}')
    svc = MemoryService(store, embedder=Utf8Embedder(64), chat_model=chat,
                        rmm_kwargs={"top_k": 4, "top_m": 2, "batch_size": 8})
    with running(svc) as url, httpx.Client(base_url=url, headers=H, timeout=60) as c:
        mid = c.post("/v1/memories", json={"messages": "I like tea", "user_id": "a", "infer": False}
                     ).json()["results"][0]["id"]
        n0 = store.count("u:a")
        cases = [
            ("post", "/v1/memories", {"messages": SUR, "user_id": "a", "infer": False}, "messages[0]"),
            ("post", "/v1/memories", {"messages": SUR, "user_id": "a"}, "messages[0]"),
            ("post", "/v1/memories", {"messages": [{"role": SUR, "content": "hi"}], "user_id": "a", "infer": False},
             "role"),
            ("post", "/v1/memories", {"messages": [{"role": "user", "content": "hi", "name": SUR}], "user_id": "a",
                                      "infer": False}, "messages[0]"),
            ("post", "/v1/memories", {"messages": "hi", "user_id": "a", "infer": False, "metadata": {"k": SUR}},
             "metadata"),
            ("post", "/v1/memories", {"messages": "hi", "user_id": "a", "infer": False, "metadata": {SUR: 1}},
             "metadata"),
            ("post", "/v1/memories", {"messages": "hi", "user_id": SUR, "infer": False}, "user_id"),
            ("post", "/v1/memories", {"messages": "hi", "user_id": "a", "infer": False, "date": SUR}, "date"),
            ("post", "/v1/memories", {"messages": "hi", "user_id": "a", SUR: 1}, ""),
            ("post", "/v1/memories/search", {"query": SUR, "user_id": "a"}, "query"),
            ("post", "/v1/memories/search", {"query": "tea", "user_id": "a", "filters": {"k": SUR}}, "filters"),
            ("post", "/v1/memories/search", {"query": "tea", "user_id": "a", "time_range": [SUR, None]}, "time_range"),
            ("post", "/v1/respond", {"query": SUR, "user_id": "a"}, "query"),
            ("post", "/v1/respond", {"query": "tea?", "user_id": "a", "session_turns": [{"role": "user",
                                                                                         "content": SUR}]},
             "session_turns"),
            ("put", f"/v1/memories/{mid}", {"text": SUR, "user_id": "a"}, "text"),
            ("put", f"/v1/memories/{mid}", {"metadata": {"k": SUR}, "user_id": "a"}, "metadata"),
            ("post", "/v1/feedback", {"response_id": SUR, "rewards": [1.0]}, "response_id"),
        ]
        for method, path, body, name in cases:
            r = c.request(method.upper(), path, content=json.dumps(body).encode(),  # "\ud800" escapes
                          headers={"content-type": "application/json"})
            assert r.status_code in (404, 422), (path, body, r.status_code, r.text)
            assert name in r.json()["detail"], (path, r.text)
            assert r.content.isascii()
        r = c.get("/v1/memories?user_id=%ED%A0%80")  # a surrogate's bytes, percent-encoded
        assert r.status_code == 422 and "user_id" in r.json()["detail"]
        assert store.count("u:a") == n0 and store.get(mid).version == 1 and store.namespaces() == ["u:a"]
    svc.close()


# ------------------------------------------------------------------ sizes of every field
def test_every_field_is_bounded(store):
    svc = _svc(store)
    with running(svc) as url, httpx.Client(base_url=url, headers=H, timeout=60) as c:
        mid = c.post("/v1/memories", json={"messages": "I like tea", "user_id": "a", "infer": False}
                     ).json()["results"][0]["id"]
        n0 = store.count("u:a")
        deep: dict = {}
        d = deep
        for _ in range(40):
            d["k"] = {}
            d = d["k"]
        cases = [
            ({"messages": [{"role": "r" * 900_000, "content": "hi"}], "user_id": "a", "infer": False}, "role"),
            ({"messages": "hi", "user_id": "a", "infer": False, "metadata": {f"k{i}": i for i in range(30_000)}},
             "metadata"),
            ({"messages": [{"role": "user", "content": "hi", "extra": "e" * 20_000}], "user_id": "a",
              "infer": False}, "messages[0]"),
            ({"messages": "hi", "user_id": "a", "infer": False, "metadata": deep}, "metadata"),
        ]
        for body, name in cases:
            r = c.post("/v1/memories", json=body)
            assert r.status_code in (400, 413, 422), (name, r.status_code, r.text[:300])
            assert r.headers["content-type"].startswith("application/json") and name in r.json()["detail"]
            assert len(r.content) < 4000  # the rejected value is not echoed back whole
        r = c.put(f"/v1/memories/{mid}", json={"metadata": {f"k{i}": i for i in range(30_000)}, "user_id": "a"})
        assert r.status_code == 422 and "metadata" in r.json()["detail"]
        r = c.post("/v1/memories/search", json={"query": "tea", "user_id": "a",
                                                "filters": {"k": {"$in": ["v" * 100] * 400}}})
        assert r.status_code == 422 and "filters" in r.json()["detail"]
        assert store.count("u:a") == n0 and store.get(mid).version == 1
    svc.close()


def test_list_reads_only_the_records_it_returns(tmp_path):
    class Counting(memkern.MemoryStore):
        reads = 0

        def get(self, *a, **kw):
            type(self).reads += 1
            return super().get(*a, **kw)

        def get_batch(self, ids, *a, **kw):
            type(self).reads += len(list(ids))
            return super().get_batch(ids, *a, **kw)

    with Counting(tmp_path / "s", dim=64, metric="cos") as st:
        svc = _svc(st)
        for run in ("r1", "r2", "r3"):
            svc.add([{"role": "user", "content": f"{run} fact {i}"} for i in range(100)], user_id="a", run_id=run,
                    infer=False)
        Counting.reads = 0
        out = svc.list(user_id="a", limit=5)["results"]
        assert [m["id"] for m in out] == sorted(int(i) for ns in st.namespaces() for i in st.ids(ns))[:5]
        assert Counting.reads <= 5
        svc.close()


# ------------------------------------------------------------------ respond work is bounded
def test_respond_prompt_work_is_bounded(store):
    release = threading.Event()

    def slow(messages):
        release.wait(30)
        return '{"answer": "ok", "citations": [0]}'

    chat = ScriptedChat(slow)
    svc = _svc(store, chat, max_respond_chars=1000, max_pending_responds=1)
    svc.add([{"role": "user", "content": f"fact {i}"} for i in range(4)], user_id="a", infer=False)
    with running(svc) as url, httpx.Client(base_url=url, headers=H, timeout=60) as c:
        t0 = time.perf_counter()
        r = c.post("/v1/respond", json={"query": "q" * 30_000, "user_id": "a"})
        assert r.status_code == 422 and "query" in r.json()["detail"] and time.perf_counter() - t0 < 5
        r = c.post("/v1/respond", json={"query": "q" * 600, "user_id": "a",
                                        "session_turns": [{"role": "user", "content": "s" * 500}]})
        assert r.status_code == 422 and "session_turns" in r.json()["detail"]
        assert chat.calls == []
        with ThreadPoolExecutor(2) as ex:
            first = ex.submit(c.post, "/v1/respond", json={"query": "fact?", "user_id": "a"})
            deadline = time.time() + 20
            while not chat.calls and time.time() < deadline:
                time.sleep(0.01)
            second = c.post("/v1/respond", json={"query": "fact?", "user_id": "b"})
            body = _json_error(second, 503)
            assert body["error"] == "BusyError" and second.headers["retry-after"] == "1"
            release.set()
            assert first.result().status_code == 200
    svc.close()


# ------------------------------------------------------------------ feedback once
def test_feedback_is_accepted_once_even_after_a_restart(tmp_path):
    chat = ScriptedChat(lambda messages: '{"answer": "ok", "citations": [0]}')
    with memkern.MemoryStore(tmp_path / "s", dim=64, metric="cos") as st:
        svc = _svc(st, chat)
        svc.add([{"role": "user", "content": f"fact {i}"} for i in range(4)], user_id="a", infer=False)
        with running(svc) as url, httpx.Client(base_url=url, headers=H, timeout=60) as c:
            rids = [c.post("/v1/respond", json={"query": "fact?", "user_id": "a"}).json()["response_id"]
                    for _ in range(2)]
            assert c.post("/v1/feedback", json={"response_id": rids[0], "rewards": [1.0, -1.0]}).status_code == 200
            body = _json_error(c.post("/v1/feedback", json={"response_id": rids[0], "rewards": [1.0, -1.0]}), 409)
            assert body["error"] == "ConflictError" and "response_id" in body["detail"]
            # racing posts of one response: exactly one is accepted
            with ThreadPoolExecutor(8) as ex:
                codes = sorted(ex.map(lambda _: c.post("/v1/feedback", json={"response_id": rids[1],
                                                                              "rewards": [0.5, 0.5]}).status_code,
                                      range(8)))
            assert codes == [200] + [409] * 7
        pending = svc._rmms["u:a"].pending
        assert pending == 4  # two responses' citation rewards + two accepted feedbacks, no replay
        svc.close()
        assert (Path(st.path) / "server" / "feedback-given").read_text().split() == rids
        svc2 = _svc(st, chat)  # a restarted server over the same store
        with pytest.raises(memkern.server.service.ConflictError, match="response_id"):
            svc2.feedback(rids[0], [1.0, -1.0])
        svc2.close()


# ------------------------------------------------------------------ Host / Origin when keyless
@pytest.mark.slow
def test_keyless_server_answers_only_loopback_hosts_and_origins(store):
    svc = _svc(store)
    with running(svc, api_key=None) as url, httpx.Client(base_url=url, timeout=30) as c:
        port = url.rsplit(":", 1)[1]
        body = {"messages": "hi", "user_id": "a", "infer": False}
        for hdrs in ({"Host": "evil.example"}, {"Host": f"evil.example:{port}"}, {"Origin": "http://evil.example"},
                     {"Origin": "null"}, {"Origin": f"http://127.0.0.1.evil.example:{port}"},
                     {"Host": "localhost.evil.example"}):
            for r in (c.post("/v1/memories", json=body, headers=hdrs), c.get("/v1/memories", params={"user_id": "a"},
                                                                                headers=hdrs),
                      c.delete("/v1/memories/0", params={"user_id": "a"}, headers=hdrs), c.get("/health", headers=hdrs)):
                assert _json_error(r, 403)["error"] == "Forbidden", hdrs
        assert store.namespaces() == []
        for hdrs in ({}, {"Host": f"localhost:{port}"}, {"Host": f"[::1]:{port}"}, {"Origin": "http://localhost:3000"},
                     {"Origin": f"http://127.0.0.1:{port}"}):
            assert c.post("/v1/memories", json=body, headers=hdrs).status_code == 200, hdrs
    with running(svc, api_key=KEY) as url, httpx.Client(base_url=url, headers=H, timeout=30) as c:
        assert c.get("/v1/memories", params={"user_id": "a"}, headers={"Host": "memories.example.com"}
                     ).status_code == 200  # with a key, the key is the boundary
    with running(svc, api_key=KEY, allowed_hosts=["memories.example.com"]) as url, \
            httpx.Client(base_url=url, headers=H, timeout=30) as c:
        assert c.get("/health", headers={"Host": "memories.example.com"}).status_code == 200
        assert c.get("/health").status_code == 403
    svc.close()


# ------------------------------------------------------------------ slow and half-open requests
@pytest.mark.slow
def test_half_open_requests_time_out_and_the_server_keeps_serving(store):
    svc = _svc(store)
    with running(svc, header_timeout=1.0, body_timeout=1.0) as url, httpx.Client(base_url=url, headers=H,
                                                                                timeout=30) as c:
        host, port = "127.0.0.1", int(url.rsplit(":", 1)[1])
        socks = []
        for i in range(60):  # half-open: part of a request head, then nothing
            s = socket.create_connection((host, port))
            s.sendall(b"POST /v1/memories HTTP/1.1\r\nHost: x\r\n" if i % 2 else b"")
            socks.append(s)
        t0 = time.time()
        assert c.get("/health").status_code == 200  # served meanwhile
        closed = 0
        deadline = time.time() + 10
        for s in socks:
            s.settimeout(max(0.1, deadline - time.time()))
            try:
                data = s.recv(4096)
                while data and not data.endswith(b"}"):
                    more = s.recv(4096)
                    if not more:
                        break
                    data += more
            except socket.timeout:
                continue
            finally:
                s.close()
            if not data or data.startswith(b"HTTP/1.1 408"):
                closed += 1
        assert closed == len(socks) and time.time() - t0 < 8, (closed, time.time() - t0)
        # a body that stops arriving: 408 JSON after body_timeout
        out = raw_request(url, b"POST /v1/memories HTTP/1.1\r\nHost: localhost\r\nX-API-Key: " + KEY.encode() +
                          b"\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"messages\"")
        head, _, body = out.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408") and json.loads(body)["error"] == "RequestTimeout", out
        # a malformed request: 400 JSON
        out = raw_request(url, b"GARBAGE\x01 / HTTP/9\r\n\r\n")
        head, _, body = out.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400") and json.loads(body)["error"] == "BadRequest", out
        assert store.namespaces() == []
    svc.close()


@pytest.mark.slow
def test_concurrency_and_connection_caps_are_json_503s(store):
    class Slow(HashEmbedder):
        def encode(self, texts, kind="passage", **kw):
            time.sleep(0.5)
            return super().encode(texts, kind, **kw)

    svc = MemoryService(store, embedder=Slow(64), embed_batch=1)
    with running(svc, max_concurrent=2, max_connections=6) as url:
        def search(i):
            with httpx.Client(base_url=url, headers=H, timeout=60) as c:
                return c.post("/v1/memories/search", json={"query": f"tea {i}", "user_id": "a"})
        svc.add("I like tea", user_id="a", infer=False)
        with ThreadPoolExecutor(5) as ex:
            rs = list(ex.map(search, range(5)))
        codes = sorted(r.status_code for r in rs)
        assert codes.count(200) >= 2 and set(codes) <= {200, 503}, codes
        for r in rs:
            if r.status_code == 503:
                assert r.json()["error"] == "ServiceUnavailable" and r.headers["retry-after"] == "1"
        socks = [socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1]))) for _ in range(10)]
        refused = 0
        for s in socks:
            s.settimeout(0.5)
            try:
                data = s.recv(4096)
                if data.startswith(b"HTTP/1.1 503"):
                    assert b'"ServiceUnavailable"' in data
                    refused += 1
            except socket.timeout:
                pass
            s.close()
        assert refused >= 4
    svc.close()


def test_no_status_is_plain_text(store):
    svc = _svc(store)
    with running(svc) as url, httpx.Client(base_url=url, headers=H, timeout=30) as c:
        assert _json_error(c.get("/nope"), 404)["error"] == "NotFound"
        assert _json_error(c.patch("/v1/memories"), 405)["error"] == "MethodNotAllowed"
        assert _json_error(c.post("/v1/memories", content=b"{not json", headers={"content-type": "application/json"}),
                           422)
        assert _json_error(c.post("/v1/memories", content=b"[" * 200_000, headers={"content-type":
                                                                                  "application/json"}), 400)
        r = c.post("/v1/memories", content=b'{"messages": "hi", "user_id": "a", "metadata": {"n": ' + b"9" * 5000 +
                   b"}}", headers={"content-type": "application/json"})
        assert r.status_code in (400, 422) and r.headers["content-type"].startswith("application/json")
        assert _json_error(httpx.get(url + "/v1/memories", params={"user_id": "a"}), 401)["error"] == "Unauthorized"

        def boom():
            raise RuntimeError("disk on fire")
        store_ns = svc.store.namespaces
        svc.store.namespaces = boom  # an unexpected failure inside a route
        try:
            body = _json_error(c.get("/v1/memories", params={"user_id": "a"}), 500)
            assert body["error"] == "InternalServerError" and "disk on fire" not in body["detail"]
        finally:
            svc.store.namespaces = store_ns
    svc.close()


# ------------------------------------------------------------------ the API key's source
def test_api_key_flag_is_refused_and_a_key_file_works(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "MEMKERN_API_KEY"}
    p = subprocess.run([sys.executable, "-m", "memkern", "serve", "--store", str(tmp_path / "s"), "--api-key", "k"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "MEMKERN_API_KEY" in p.stderr and "--api-key-file" in p.stderr and " k " not in p.stderr
    assert not (tmp_path / "s").exists()

    from memkern.cli.main import build_parser
    from memkern.cli.serve import keys_of

    keyfile = tmp_path / "keys"
    keyfile.write_text("k-admin\nk-alice user_id=alice\n")
    keyfile.chmod(0o600)
    args = build_parser(load="memkern.cli.serve").parse_args(["serve", "--api-key-file", str(keyfile)])
    ring = keys_of(args)
    assert [s for _, s in ring.items()] == [None, memkern.server.Scope("alice")]
    os.environ["MEMKERN_API_KEY"] = "k-env"
    try:
        assert [k for k, _ in keys_of(args).items()] == ["k-admin", "k-alice", "k-env"]
    finally:
        del os.environ["MEMKERN_API_KEY"]
    keyfile.write_text("k user=alice\n")
    with pytest.raises(memkern.MemkernValueError, match="--api-key-file line 1"):
        keys_of(args)


# ------------------------------------------------------------------ MCP: no request is left unanswered
class RawMCP:
    """`memkern mcp` over raw JSON-RPC lines (what a client that sends "\\ud800" escapes writes)."""

    def __init__(self, store: Path, errlog: Path):
        self.p = subprocess.Popen([sys.executable, "-m", "memkern", "mcp", "--store", str(store), "--max-body-bytes",
                                   str(256 * 1024)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=open(errlog, "w"), env=dict(os.environ, OMP_NUM_THREADS="1",
                                                                     HF_HUB_OFFLINE="1"))
        self.send_obj({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}})
        assert self.recv(120)["id"] == 0
        self.send_obj({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def send(self, line: bytes) -> None:
        self.p.stdin.write(line + b"\n")
        self.p.stdin.flush()

    def send_obj(self, obj) -> None:
        self.send(json.dumps(obj).encode())

    def recv(self, timeout: float = 60):
        r, _, _ = select.select([self.p.stdout], [], [], timeout)
        assert r, "no response: the request was dropped"
        line = self.p.stdout.readline()
        assert line, "the server exited"
        return json.loads(line)

    def call(self, rid, tool: str, arguments_json: str) -> dict:
        self.send(f'{{"jsonrpc":"2.0","id":{rid},"method":"tools/call","params":{{"name":"{tool}",'
                  f'"arguments":{arguments_json}}}}}'.encode())
        out = self.recv()
        assert out["id"] == rid, out
        return out

    def close(self):
        self.p.stdin.close()
        assert self.p.wait(60) == 0


@pytest.mark.slow
def test_mcp_answers_every_request_it_cannot_read(tmp_path):
    mcp = RawMCP(tmp_path / "store", tmp_path / "err.log")
    try:
        r = mcp.call(1, "add_memory", '{"messages": "x\\ud800", "user_id": "a", "infer": false}')
        assert r["result"]["isError"] and "messages" in r["result"]["content"][0]["text"]
        assert "surrogate" in r["result"]["content"][0]["text"]
        r = mcp.call(2, "search_memories", '{"query": "\\udfff", "user_id": "a"}')
        assert r["result"]["isError"] and "query" in r["result"]["content"][0]["text"]
        r = mcp.call(3, "add_memory", '{"messages": "x", "user_id": "a", "metadata": {"k": ' + "[" * 100_000 +
                     "]" * 100_000 + "}}")
        assert r["result"]["isError"]
        r = mcp.call(4, "add_memory", '{"messages": "x", "user_id": "a", "metadata": {"k": "' + "v" * 3_000_000 +
                     '"}}')
        assert r["result"]["isError"] and "at most 262144 bytes" in r["result"]["content"][0]["text"]
        mcp.send(b'{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"add_memory","arguments":'
                 b'{"messages":"caf\xe9","user_id":"a"}}}')
        r = mcp.recv()
        assert r["id"] == 5 and r["result"]["isError"] and "UTF-8" in r["result"]["content"][0]["text"]
        mcp.send(b'{"jsonrpc":"2.0","id":"s6","method":"tools/list","params":{"cursor":"\\ud800"}}')
        r = mcp.recv()
        assert r["id"] == "s6" and r["error"]["code"] == -32600
        mcp.send(b"not json at all")  # no id: nothing to answer; the server carries on
        mcp.send_obj({"jsonrpc": "2.0", "id": 7, "method": "tools/list"})
        assert len(mcp.recv()["result"]["tools"]) == 9
        r = mcp.call(8, "add_memory", '{"messages": "fine", "user_id": "a", "infer": false}')
        assert not r["result"].get("isError") and json.loads(r["result"]["content"][0]["text"])["results"]
    finally:
        mcp.close()
    with memkern.MemoryStore(tmp_path / "store") as st:
        assert st.namespaces() == ["u:a"] and [st.get(int(i)).summary for i in st.ids("u:a")] == ["fine"]


@pytest.mark.slow
def test_mcp_arguments_are_never_coerced(tmp_path):
    """The real stdio client: bool / str / unknown arguments refused by name; a message that looks
    like JSON stays text; a metadata value over the limit is refused."""
    store = tmp_path / "store"

    async def session_run():
        out = {}
        async with mcp_session(store, tmp_path) as s:
            base = {"messages": "hello", "user_id": "a", "infer": False}
            for name, args in (("date", {**base, "date": True}), ("infer", {**base, "infer": "yes"}),
                               ("unknown", {**base, "colour": "red"}), ("limit", None),
                               ("meta", {**base, "metadata": {"v": "x" * 40_000}}),
                               ("messages", {**base, "messages": 5})):
                if args is None:
                    r = await s.call_tool("search_memories", {"query": "x", "user_id": "a", "limit": "5"})
                else:
                    r = await s.call_tool("add_memory", args)
                out[name] = (r.is_error, r.content[0].text)
            r = await s.call_tool("add_memory", {**base, "messages": '[{"role": "user", "content": "hi"}]'})
            out["json-text"] = json.loads(r.content[0].text)["results"]
        return out

    out = asyncio.run(session_run())
    for name, word in (("date", "date"), ("infer", "infer"), ("unknown", "colour"), ("limit", "limit"),
                       ("meta", "metadata"), ("messages", "messages")):
        assert out[name][0] and word in out[name][1], (name, out[name])
    assert [x["memory"] for x in out["json-text"]] == ['[{"role": "user", "content": "hi"}]']
    with memkern.MemoryStore(store) as st:
        assert st.count("u:a") == 1
