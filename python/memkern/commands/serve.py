"""``memkern serve``: the store over HTTP (FastAPI + uvicorn; ``pip install memkern[serve]``).

mem0-shaped routes (``/v1/memories``, search, get / update / delete / history), ``/v1/respond``
(the RMM loop) and ``/v1/feedback``; see :mod:`memkern.server.app`. Without an API key
(``--api-key`` or ``$MEMKERN_API_KEY``) it binds only to a loopback address.
"""
from __future__ import annotations

import argparse
import ipaddress
import os

from ..errors import bad_arg
from . import _common as C

LOOPBACK_NAMES = ("localhost",)


def is_loopback(host: str) -> bool:
    """Whether ``host`` only accepts connections from this machine (127.0.0.0/8, ::1, localhost)."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def add_server_args(p: argparse.ArgumentParser) -> None:
    """Options shared by ``memkern serve`` and ``memkern mcp``: store, models, limits."""
    from ..server.service import Limits

    C.add_store_args(p, namespace=None)
    p.add_argument("--embedder", default=None, metavar="ID_OR_PATH",
                   help="embedding model folder or id (default: the offline all-MiniLM-L6-v2)")
    p.add_argument("--chat-model", default=None, metavar="ID_OR_PATH",
                   help="chat model of /v1/respond (default: the offline SmolLM2-135M-Instruct, loaded on first use)")
    p.add_argument("--threads", type=C.positive_int, default=None, help="torch CPU threads (default: half the cores, 1-4)")
    d = Limits()
    p.add_argument("--max-messages", type=C.positive_int, default=d.max_messages,
                   help=f"messages in one add (default {d.max_messages})")
    p.add_argument("--max-text-chars", type=C.positive_int, default=d.max_text_chars,
                   help=f"characters of one message, query or memory text (default {d.max_text_chars})")
    p.add_argument("--embed-batch", type=C.positive_int, default=64,
                   help="most texts of concurrent requests embedded in one model call (default 64; 1: one request "
                        "at a time)")
    p.add_argument("--max-limit", type=C.positive_int, default=d.max_limit,
                   help=f"largest search / list limit (default {d.max_limit})")


def configure(p: argparse.ArgumentParser) -> None:
    from ..server.service import Limits

    add_server_args(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; any other "
                   "than a loopback address needs an API key)")
    p.add_argument("--port", type=C.nonneg_int, default=8000, help="port (default 8000; 0: any free port)")
    p.add_argument("--api-key", default=None, metavar="KEY",
                   help="required as 'Authorization: Bearer KEY' or 'X-API-Key: KEY' (default: $MEMKERN_API_KEY)")
    p.add_argument("--max-body-bytes", type=C.positive_int, default=Limits().max_body_bytes,
                   help=f"largest request body (default {Limits().max_body_bytes}; larger ones get 413)")
    p.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))


def api_key_of(args) -> str | None:
    """The API key (``--api-key``, else ``$MEMKERN_API_KEY``); an empty one is refused."""
    key = args.api_key if args.api_key is not None else os.environ.get("MEMKERN_API_KEY")
    if key is not None and not key.strip():
        raise bad_arg("--api-key", "a non-empty key", key)
    return key


def run(args: argparse.Namespace) -> int:
    key = api_key_of(args)
    if key is None and not is_loopback(args.host):
        raise bad_arg("--api-key", f"an API key (--api-key or $MEMKERN_API_KEY) to bind beyond localhost "
                      f"(--host {args.host})", None)
    try:
        import uvicorn

        from ..server.app import create_app
    except ImportError as e:
        raise bad_arg("memkern serve", "the serve extra: pip install 'memkern[serve]'", str(e)) from None
    from ..server.service import MemoryService

    with MemoryService.from_args(args) as service:
        app = create_app(service, api_key=key)
        print(f"memkern serve: store {C.store_path(args)} on http://{args.host}:{args.port}"
              f" ({'API key required' if key else 'no API key: localhost only'})", flush=True)
        server = _server_class(uvicorn)(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level))
        server.run()
    return 0


def _server_class(uvicorn):
    """uvicorn's Server, except that a SIGINT / SIGTERM ends :meth:`run` after the graceful shutdown
    instead of being raised again (which would kill the process before the store is closed)."""

    class Server(uvicorn.Server):
        exit_signal = None

        def handle_exit(self, sig, frame):
            super().handle_exit(sig, frame)
            self.exit_signal = sig
            captured = getattr(self, "_captured_signals", None)
            if isinstance(captured, list):
                captured.clear()

    return Server
