"""`memkern serve` / `memkern mcp` and time: a conversation's date on add becomes the records'
event_time; search and respond take filters, time_range (dates or unix seconds), time_field and a
recency prior, checked with one-line errors and nothing written; one service set-up
(memkern.cli.serve.service_from_args) for both commands."""
from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import sys
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("mcp")

import memkern  # noqa: E402
from memkern.server import Limits, MemoryService  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "helpers"))
from fakes_rmm import FakeStore, HashEmbedder, ScriptedChat  # noqa: E402
from test_serve import KEY, running  # noqa: E402

MAY8 = dt.datetime(2023, 5, 8, tzinfo=dt.timezone.utc).timestamp()
JUN1 = dt.datetime(2023, 6, 1, tzinfo=dt.timezone.utc).timestamp()


@pytest.fixture
def service(tmp_path):
    st = memkern.MemoryStore(tmp_path / "store", dim=64, metric="cos")
    chat = ScriptedChat(lambda msgs: '{"answer": "ok", "citations": [0]}')
    svc = MemoryService(st, embedder=HashEmbedder(64), chat_model=chat, limits=Limits(max_text_chars=500))
    yield svc
    svc.close()
    st.close()


@pytest.fixture
def client(service):
    with running(service) as url, httpx.Client(base_url=url, headers={"X-API-Key": KEY}, timeout=30) as c:
        yield c


def _add(client, content, date, infer=False, user="alice", **kw):
    r = client.post("/v1/memories", json={"messages": [{"role": "user", "content": content}], "user_id": user,
                                          "infer": infer, "date": date, **kw})
    assert r.status_code == 200, r.text
    return r.json()["results"]


def test_http_date_time_range_recency_and_filters(client, service):
    old = _add(client, "I ran the Boston marathon", "2023-05-08", metadata={"topic": "run"})[0]["id"]
    new = _add(client, "I ran the Boston marathon again", JUN1, metadata={"topic": "run2"})[0]["id"]
    inferred = _add(client, "I ran the Boston marathon with my beagle", "1:56 pm on 9 May, 2023", infer=True,
                    user="bob")[0]["id"]
    assert service.store.get(old).event_time == MAY8 and service.store.get(new).event_time == JUN1
    assert service.store.get(inferred).event_time == MAY8 + 86400 + 13 * 3600 + 56 * 60
    got = client.get(f"/v1/memories/{old}", params={"user_id": "alice"}).json()
    assert got["event_time"].startswith("2023-05-08T00:00:00")

    def search(user="alice", **kw):
        r = client.post("/v1/memories/search", json={"query": "Boston marathon", "user_id": user, "limit": 5, **kw})
        assert r.status_code == 200, r.text
        return [x["id"] for x in r.json()["results"]]

    assert set(search()[:2]) == {old, new}
    assert search(time_range=["2023-05-20", None]) == [new]
    assert search(time_range=[None, "2023-05-20T00:00:00+00:00"])[:1] == [old]
    assert search("bob", time_range=[MAY8, MAY8 + 86400]) == [] and search("bob") == [inferred]
    assert search("bob", time_range=["2023-05-09", "2023-05-10"]) == [inferred]
    assert search(filters={"topic": "run"}) == [old]
    assert search(time_range=[0, 1e9], time_field="created") == []
    assert search(recency=86400.0, recency_weight=5.0, now=JUN1 + 3600)[0] == new
    # respond: the first-stage search sees only what passes
    r = client.post("/v1/respond", json={"query": "Boston marathon", "user_id": "alice",
                                         "time_range": ["2023-05-20", None]})
    assert r.status_code == 200, r.text
    assert [m["id"] for m in r.json()["memories"]] == [new]
    r = client.post("/v1/respond", json={"query": "Boston marathon", "user_id": "alice", "filters": {"topic": "run"}})
    assert [m["id"] for m in r.json()["memories"]] == [old]
    # two-level memory (bob's inferred add has turn records): the filtered turn search
    r = client.post("/v1/respond", json={"query": "Boston marathon", "user_id": "bob",
                                         "time_range": ["2023-05-09", None]})
    assert [m["id"] for m in r.json()["memories"]] == [inferred]
    r = client.post("/v1/respond", json={"query": "Boston marathon", "user_id": "bob",
                                         "time_range": ["2023-05-10", None]})
    assert r.json()["memories"] == []


@pytest.mark.parametrize("body,where", [
    ({"time_range": ["someday", None]}, "time_range[0]: expected a date string"),
    ({"time_range": [5, 1]}, "time_range: expected start <= end"),
    ({"time_range": [1, 2, 3]}, "time_range: expected a (start, end) pair"),
    ({"time_field": "event_time"}, "time_field: expected"),
    ({"recency": -1}, "recency: expected a finite real in (0"),
    ({"filters": {"k": {"$gt": 1}}}, "filters['k']: expected"),
])
def test_http_bad_time_arguments_are_one_line_422s(client, service, body, where):
    for route in ("/v1/memories/search", "/v1/respond"):
        r = client.post(route, json={"query": "x", "user_id": "alice", **body})
        assert r.status_code == 422, (route, r.text)
        detail = r.json()["detail"]
        assert detail.startswith(where) and "\n" not in detail, detail


def test_http_bad_date_writes_nothing(client, service):
    for infer in (False, True):
        r = client.post("/v1/memories", json={"messages": "hello", "user_id": "alice", "infer": infer,
                                              "date": "the other day"})
        assert r.status_code == 422 and r.json()["detail"].startswith("date: expected a date string"), r.text
    assert service.store.namespaces() == []


def test_store_without_time_support_refuses_time_arguments():
    svc = MemoryService(FakeStore(64), embedder=HashEmbedder(64))
    with pytest.raises(memkern.MemkernValueError, match=r"^time_range: expected none, got time_range, which this"):
        svc.search("x", user_id="alice", time_range=[0, None])
    with pytest.raises(memkern.MemkernValueError, match=r"^filters: expected none"):
        svc.search("x", user_id="alice", filters={"a": 1})
    with pytest.raises(memkern.MemkernValueError, match=r"^date: expected none"):
        svc.add("hello", user_id="alice", infer=False, date="2023-05-08")
    assert svc.search("x", user_id="alice") == {"results": []}


def test_mcp_tools_take_date_and_time_arguments(service):
    from memkern.server.mcp import build_server

    server = build_server(service)

    async def call(name, args):
        out = await server.call_tool(name, args)  # mcp's CallToolResult
        assert not out.is_error, out
        return json.loads(out.content[0].text)

    async def main():
        await call("add_memory", {"messages": "I ran the Boston marathon", "user_id": "alice", "infer": False,
                                  "date": "2023-05-08"})
        await call("add_memory", {"messages": "I ran the Boston marathon again", "user_id": "alice", "infer": False,
                                  "date": JUN1})
        found = await call("search_memories", {"query": "Boston marathon", "user_id": "alice",
                                               "time_range": ["2023-05-20", None]})
        resp = await call("respond", {"query": "Boston marathon", "user_id": "alice", "time_range": [None, JUN1]})
        return found, resp

    found, resp = asyncio.run(main())
    assert [x["memory"] for x in found["results"]] == ["I ran the Boston marathon again"]
    assert [m["memory"] for m in resp["memories"]] == ["I ran the Boston marathon"]


# ------------------------------------------------------------------------- one service set-up
def _args(command, store, *extra):
    from memkern.cli.main import build_parser

    return build_parser(load=f"memkern.cli.{command}").parse_args(
        [command, "--store", str(store), "--max-messages", "7", "--max-limit", "9", *extra])


@pytest.mark.parametrize("command", ["serve", "mcp"])
def test_from_args_builds_the_service_of_both_commands(tmp_path, command):
    args = _args(command, tmp_path / "st")
    from memkern.cli.serve import service_from_args

    with service_from_args(args) as svc:
        assert svc.limits.max_messages == 7 and svc.limits.max_limit == 9 and svc.store.dim == 384
        assert not svc.store.closed
        store = svc.store
        assert svc.embedder_options == {"backend": "auto", "query_cache": 4096}
    assert store.closed
    with service_from_args(_args(command, tmp_path / "st", "--embedder-backend", "torch", "--query-cache", "0")) as svc:
        assert svc.embedder_options == {"backend": "torch", "query_cache": 0}


@pytest.mark.parametrize("command", ["serve", "mcp"])
def test_serve_and_mcp_run_through_from_args(tmp_path, monkeypatch, command):
    """Both commands set their service up through cli.serve.service_from_args (one definition)."""
    seen = []

    @contextlib.contextmanager
    def fake_from_args(args):
        seen.append(args.command)
        yield "service"

    monkeypatch.setattr("memkern.cli.serve.service_from_args", fake_from_args)

    class Ran(Exception):
        pass

    def stop(*a, **k):
        raise Ran()

    if command == "serve":
        import uvicorn

        import memkern.server.app as app_mod

        monkeypatch.setattr(app_mod, "create_app", lambda service, **kw: seen.append(kw.get("freeze_gc")) or stop())
        monkeypatch.setattr(uvicorn, "Config", stop)
        from memkern.cli import serve as cmd
    else:
        import memkern.server.mcp as mcp_mod

        monkeypatch.setattr(mcp_mod, "build_server", lambda service: stop())
        from memkern.cli import mcp as cmd
    with pytest.raises(Ran):
        cmd.run(_args(command, tmp_path / "st"))
    # serve: the service, then create_app told that this process serves from now on (gc.freeze after the load)
    assert seen == (["serve", True] if command == "serve" else [command])
