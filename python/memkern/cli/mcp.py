"""``memkern mcp``: a store's memory operations as Model Context Protocol tools over stdio.

An MCP client (Claude Desktop, an IDE, an agent framework) starts ``memkern mcp --store PATH``
and calls the tools of :mod:`memkern.server.mcp` (``pip install memkern[serve]``). stdout carries
the protocol only; logs go to stderr.
"""
from __future__ import annotations

import argparse

from ..errors import missing_dependency
from .serve import add_server_args


def configure(p: argparse.ArgumentParser) -> None:
    add_server_args(p)
    p.add_argument("--read-only", action="store_true",
                   help="serve the read tools only, on a read-only view of the store (beside a running "
                        "`memkern serve` or other writer); each call sees the writer's latest writes")


def run(args: argparse.Namespace) -> int:
    try:
        from ..server.mcp import build_server, run_stdio
    except ImportError as e:  # pragma: no cover - the extra is part of the test set-up
        raise missing_dependency(e, "memkern mcp", "serve") or e
    try:
        import mcp  # noqa: F401
    except ImportError as e:
        raise missing_dependency(e, "memkern mcp", "serve") or e
    from . import serve

    with serve.service_from_args(args) as service:
        run_stdio(build_server(service))
    return 0
