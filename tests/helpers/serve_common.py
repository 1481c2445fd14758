"""Helpers shared by the server tests (test_serve_scopes, test_serve_hardening, ...):
a real uvicorn server (memkern's guarded protocol) in a thread, the tests' API key, a hash
embedder service over a real MemoryStore, raw socket requests, and a real ``mcp`` stdio client
session with ``memkern mcp``."""
from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
from pathlib import Path

from fakes_rmm import HashEmbedder

from memkern.server import Limits, MemoryService
from memkern.server.app import create_app, uvicorn_config

KEY = "test-key-123"


@contextlib.contextmanager
def running(service: MemoryService, *, api_key: str | None = KEY, header_timeout: float = 10.0,
            max_connections: int = 256, **app_kw):
    """``memkern serve``'s app and protocol for ``service`` in a thread; yields the base URL."""
    import uvicorn

    app = create_app(service, api_key=api_key, **app_kw)
    config = uvicorn_config(app, host="127.0.0.1", port=0, log_level="critical", lifespan="off",
                            header_timeout=header_timeout, max_connections=max_connections)
    server = uvicorn.Server(config)
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    deadline = time.time() + 20
    while not server.started:
        if time.time() > deadline or not t.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        t.join(10)


def hash_service(store, **limits) -> MemoryService:
    return MemoryService(store, embedder=HashEmbedder(64), limits=Limits(**limits) if limits else None)


def raw_request(url: str, data: bytes, timeout: float = 10.0) -> bytes:
    """Send ``data`` on a fresh connection and read until the server closes it (or ``timeout``)."""
    host, port = url.rsplit("/", 1)[-1].split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(data)
        out = b""
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                break
            if not chunk:
                break
            out += chunk
        return out


@contextlib.asynccontextmanager
async def mcp_session(store, log_dir, command: list[str] | None = None, extra: tuple[str, ...] = ()):
    """An initialised ``mcp`` ``ClientSession`` over stdio with ``<command> mcp --store STORE`` (default
    ``python -m memkern``; one thread, offline; ``extra``: more options), the server's stderr kept in ``log_dir/mcp-stderr.log``."""
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    cmd = command or [sys.executable, "-m", "memkern"]
    params = StdioServerParameters(command=cmd[0], args=[*cmd[1:], "mcp", "--store", str(store), *extra],
                                   env=dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1"))
    with open(Path(log_dir) / "mcp-stderr.log", "w") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write):
            async with ClientSession(read, write) as s:
                await s.initialize()
                yield s
