"""Several processes on one store: ``GET /v1/export`` streams a live server's store, and the read
commands (``memkern inspect``, ``memkern export``, ``memkern ask --no-learn``, ``memkern mcp
--read-only``) run beside a process that holds the store for writing."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

import memkern  # noqa: E402
from memkern.server import MemoryService  # noqa: E402
from memkern.server.scopes import KeyRing  # noqa: E402
from memkern.server import scopes as S  # noqa: E402
from memkern.store.transfer import import_store  # noqa: E402

from fakes_rmm import HashEmbedder  # noqa: E402
from serve_common import KEY, mcp_session, running  # noqa: E402


def test_get_export_streams_a_consistent_backup_while_the_server_writes(tmp_path):
    with memkern.MemoryStore(tmp_path / "store", dim=64, metric="cos") as st:
        svc = MemoryService(st, embedder=HashEmbedder(64))
        with running(svc) as url, httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"},
                                               timeout=30) as http:
            for i in range(5):
                assert http.post("/v1/memories", json={"messages": f"note {i}", "user_id": "alice",
                                                       "infer": False}).status_code == 200
            with http.stream("GET", "/v1/export") as r:
                assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
                it = r.iter_lines()
                first = next(it)
                # a write while the export streams is not in it (the export reads one point in time)
                assert http.post("/v1/memories", json={"messages": "later", "user_id": "bob",
                                                       "infer": False}).status_code == 200
                lines = [first, *it]
            rows = [json.loads(x) for x in lines if x]
            assert rows[0]["kind"] == "header" and rows[-1] == {"kind": "end", "records": 5, "rerankers": 0}
            assert sorted(x["versions"][-1]["summary"] for x in rows if x["kind"] == "record") == [f"note {i}" for i in range(5)]
            (tmp_path / "backup.jsonl").write_text("\n".join(lines) + "\n")
            import_store(tmp_path / "restored", tmp_path / "backup.jsonl")
            with memkern.MemoryStore(tmp_path / "restored") as back:
                assert back.count("u:alice") == 5
            assert httpx.get(f"{url}/v1/export").status_code == 401
            r = http.get("/v1/export", params={"namespace": "nope"})
            assert r.status_code == 404 and "nope" in r.text
        ring = KeyRing({"k-admin": None, "k-alice": S.Scope("alice")})
        with running(svc, api_key=None, api_keys=ring) as url:
            r = httpx.get(f"{url}/v1/export", headers={"Authorization": "Bearer k-alice"})
            assert r.status_code == 403 and "scope" in r.text
            r = httpx.get(f"{url}/v1/export", headers={"Authorization": "Bearer k-admin"}, params={"embeddings": "false"})
            assert r.status_code == 200 and '"embeddings": false' in r.text.splitlines()[0]
        svc.close()
    mem = MemoryService(memkern.InMemoryStore(64), embedder=HashEmbedder(64))
    with running(mem) as url:                      # nothing on disk to view: 422, no store opened
        r = httpx.get(f"{url}/v1/export", headers={"Authorization": f"Bearer {KEY}"})
        assert r.status_code == 422 and "store on disk" in r.text


HOLDER = textwrap.dedent(r"""
    import sys, numpy as np
    from memkern.cli.common import open_store
    s = open_store(sys.argv[1], dim=384)
    print("held", flush=True)
    for line in sys.stdin:                         # "namespace<TAB>text" per memory, then wait for EOF
        ns, text = line.rstrip("\n").split("\t")
        s.add(ns, text, np.full(384, 1 / 384 ** 0.5, np.float32))
        print("added", flush=True)
    s.close()
""")


@pytest.fixture
def held(tmp_path):
    """A store held for writing by another process (its LOCK taken), holding one memory."""
    path = tmp_path / "store"
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    assert p.stdout.readline().strip() == "held"
    for ns in ("default", "u:alice"):
        p.stdin.write(f"{ns}\tmy sister plays the cello\n")
        p.stdin.flush()
        assert p.stdout.readline().strip() == "added"
    yield path, p
    p.stdin.close()
    p.wait(30)


def cli(*args):
    return subprocess.run([sys.executable, "-m", "memkern", *args], capture_output=True, text=True, timeout=300)


def test_read_commands_run_beside_a_writer(held, tmp_path):
    path, writer = held
    with pytest.raises(memkern.MemkernError, match="already open"):
        memkern.MemoryStore(path)
    r = cli("inspect", "--store", str(path), "--json")
    assert r.returncode == 0, r.stderr
    assert "my sister plays the cello" in r.stdout
    r = cli("export", "--store", str(path), "--out", str(tmp_path / "x.jsonl"))
    assert r.returncode == 0, r.stderr
    assert "exported 2 records" in r.stdout
    r = cli("forget", "--store", str(path), "--id", "0")   # a write still needs the lock
    assert r.returncode != 0 and "already open" in r.stderr


@pytest.mark.slow
def test_ask_no_learn_answers_beside_a_writer_and_writes_nothing(held, tmp_path):
    path, _ = held
    before = sorted(p.name for p in path.iterdir())
    r = cli("ask", "What does my sister play?", "--store", str(path), "--no-learn", "--max-new-tokens", "8", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["memory_ids"] == [0]
    assert sorted(p.name for p in path.iterdir()) == before   # no reranker, no buffer, no snapshot


@pytest.mark.slow
def test_mcp_read_only_serves_reads_of_a_live_store(held, tmp_path):
    path, writer = held

    async def go():
        async with mcp_session(path, tmp_path, extra=("--read-only",)) as s:
            names = sorted(t.name for t in (await s.list_tools()).tools)
            first = json.loads((await s.call_tool("list_memories", {"user_id": "alice"})).content[0].text)
            writer.stdin.write("u:alice\tthe writer's second memory\n")   # the writer adds; the view follows
            writer.stdin.flush()
            assert writer.stdout.readline().strip() == "added"
            second = json.loads((await s.call_tool("list_memories", {"user_id": "alice"})).content[0].text)
            added = await s.call_tool("add_memory", {"messages": "x", "user_id": "alice"})
            return names, first, second, added

    names, first, second, added = asyncio.run(go())
    assert names == ["get_memory", "list_memories", "memory_history", "search_memories"]
    assert [m["memory"] for m in first["results"]] == ["my sister plays the cello"]
    assert [m["memory"] for m in second["results"]] == ["my sister plays the cello", "the writer's second memory"]
    assert added.is_error and "add_memory" in added.content[0].text
