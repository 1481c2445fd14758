"""Every example of docs/adapters.md (the framework adapters) runs as written, on the real packages
and memkern's real offline MiniLM embedder (loaded once for all of them), with sockets refused."""
from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

os.environ["MEM0_TELEMETRY"] = "False"         # before anything imports mem0

README = Path(__file__).resolve().parents[2] / "docs" / "adapters.md"

SECTIONS = {
    "langgraph": ("## LangGraph store", ["langgraph", "langmem"]),
    "langchain": ("## LangChain vector store", ["langchain_core"]),
    "llamaindex": ("## LlamaIndex vector store", ["llama_index.core"]),
    "mem0": ("## mem0 provider", ["mem0"]),
    "otel": ("## OpenTelemetry", ["opentelemetry.sdk"]),
}


def _example(heading: str) -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index(heading)
    m = re.compile(r"\n#{2,3} ").search(text, start + 1)
    section = text[start:m.start() if m else None]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 1, f"{heading}: expected one python example, found {len(blocks)}"
    return blocks[0]


@pytest.fixture(scope="module")
def shared_embedder():
    from memkern import models

    return models.Embedder()


@pytest.mark.parametrize("name", ["langgraph", "langchain", "llamaindex", "mem0"])
def test_readme_adapter_example_runs(name, shared_embedder, monkeypatch, tmp_path):
    heading, mods = SECTIONS[name]
    for m in mods:
        pytest.importorskip(m)
    from memkern import models

    real = models.Embedder
    monkeypatch.setattr(models, "Embedder", lambda *a, **kw: shared_embedder if not a and not kw else real(*a, **kw))
    monkeypatch.setenv("MEM0_TELEMETRY", "False")
    monkeypatch.setenv("MEM0_DIR", str(tmp_path / "mem0"))

    def refuse(self, *a, **kw):
        raise AssertionError(f"network access attempted: {a}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    code = _example(heading)
    exec(compile(code, f"docs/adapters.md#{name}", "exec"), {"__name__": f"readme_{name}"})


def test_readme_otel_example_runs():
    # its own interpreter: the example sets the process-wide tracer provider
    pytest.importorskip("opentelemetry.sdk")
    code = _example(SECTIONS["otel"][0])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, MEMKERN_OTEL="1"))
    assert out.returncode == 0, out.stderr
