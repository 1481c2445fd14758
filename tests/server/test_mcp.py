"""`memkern mcp`: the MCP server tested with the `mcp` package's own client over stdio.

The client spawns `memkern mcp --store PATH` (offline default embedder and chat model) and calls
every tool, including bad input (a tool error naming the argument, nothing written) and one
`respond` with the default chat model.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from pathlib import Path

import pytest

pytest.importorskip("mcp")

from mcp import ClientSession, StdioServerParameters  # noqa: E402
from mcp.client.stdio import stdio_client  # noqa: E402

import memkern  # noqa: E402
from memkern.server.mcp import TOOL_NAMES  # noqa: E402


def _payload(result):
    assert result.content, result
    return json.loads(result.content[0].text)


README = Path(__file__).resolve().parents[2] / "docs" / "servers.md"


def _readme_config() -> dict:
    text = README.read_text(encoding="utf-8")
    block = re.search(r"```json\n(.*?)```", text[text.index("# Servers"):], re.S).group(1)
    return json.loads(block)["mcpServers"]["memkern"]


@pytest.mark.slow
def test_mcp_server_over_stdio_from_the_readme_config(tmp_path):
    """The README's client configuration, with this environment's `memkern` script and a temporary
    store in place of the example path."""
    store = tmp_path / "store"
    cfg = _readme_config()
    assert cfg["command"] == "memkern" and cfg["args"][:2] == ["mcp", "--store"] and len(cfg["args"]) == 3
    script = Path(sys.executable).parent / "memkern"
    assert script.exists()

    async def session_run():
        params = StdioServerParameters(command=str(script), args=cfg["args"][:2] + [str(store)],
                                       env=dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1"))
        with open(tmp_path / "mcp-stderr.log", "w") as errlog:
            async with stdio_client(params, errlog=errlog) as (read, write):
                async with ClientSession(read, write) as s:
                    await s.initialize()
                    tools = await s.list_tools()
                    assert sorted(t.name for t in tools.tools) == sorted(TOOL_NAMES)
                    add = next(t for t in tools.tools if t.name == "add_memory")
                    assert {"messages", "user_id", "agent_id", "run_id", "infer"} <= set(add.input_schema["properties"])

                    conv = [{"role": "user", "content": "I started working as a pastry chef in Lyon."},
                            {"role": "assistant", "content": "Congratulations!"}]
                    r = await s.call_tool("add_memory", {"messages": conv, "user_id": "alice"})
                    assert not r.is_error, r
                    added = _payload(r)["results"]
                    assert [x["event"] for x in added] == ["ADD"]
                    mid = added[0]["id"]
                    r = await s.call_tool("add_memory", {"messages": "My cat is called Miso.", "user_id": "alice",
                                                         "run_id": "s2", "infer": False})
                    cat = _payload(r)["results"][0]["id"]

                    found = _payload(await s.call_tool("search_memories", {"query": "What is my job?",
                                                                            "user_id": "alice", "limit": 2}))
                    assert [x["id"] for x in found["results"]] == [mid, cat]
                    assert "pastry chef" in found["results"][0]["memory"] and found["results"][0]["score"] > 0
                    only_run = _payload(await s.call_tool("search_memories", {"query": "pets", "user_id": "alice",
                                                                               "run_id": "s2"}))
                    assert [x["id"] for x in only_run["results"]] == [cat]
                    assert _payload(await s.call_tool("get_memory", {"memory_id": mid, "user_id": "alice"}))["user_id"] == "alice"
                    up = _payload(await s.call_tool("update_memory", {"memory_id": cat, "text": "My cat Miso is 3.",
                                                                      "user_id": "alice"}))
                    assert up["version"] == 2 and up["memory"] == "My cat Miso is 3."
                    hist = _payload(await s.call_tool("memory_history", {"memory_id": cat, "user_id": "alice"}))["results"]
                    assert [h["new_memory"] for h in hist] == ["My cat is called Miso.", "My cat Miso is 3."]
                    listed = _payload(await s.call_tool("list_memories", {"user_id": "alice"}))["results"]
                    assert sorted(x["id"] for x in listed) == sorted([mid, cat])

                    # bad input: a tool error naming the argument; nothing written
                    r = await s.call_tool("add_memory", {"messages": "hello", "user_id": "a:b", "infer": False})
                    assert r.is_error and "user_id" in r.content[0].text
                    r = await s.call_tool("add_memory", {"messages": [{"role": "user"}], "user_id": "zed"})
                    assert r.is_error and "messages[0]['content']" in r.content[0].text
                    r = await s.call_tool("search_memories", {"query": "x", "user_id": "alice", "limit": 0})
                    assert r.is_error and "limit" in r.content[0].text

                    # the RMM loop with the offline default chat model
                    resp = _payload(await s.call_tool("respond", {"query": "What is my job?", "user_id": "alice"}))
                    assert isinstance(resp["answer"], str) and [m["id"] for m in resp["memories"]] == [mid]
                    assert len(resp["rewards"]) == 1

                    assert _payload(await s.call_tool("delete_memory", {"memory_id": cat, "user_id": "alice"}))["deleted"] is True
                    r = await s.call_tool("get_memory", {"memory_id": cat, "user_id": "alice"})
                    assert r.is_error and str(cat) in r.content[0].text
        return mid

    mid = asyncio.run(session_run())
    with memkern.MemoryStore(store) as st:  # the server closed the store cleanly
        assert st.namespaces() == ["u:alice"] and st.count("u:alice") == 1 and st.get(mid).summary
