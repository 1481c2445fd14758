"""``memkern serve``: the store over HTTP (FastAPI + uvicorn; ``pip install memkern[serve]``).

mem0-shaped routes (``/v1/memories``, search, get / update / delete / history), ``/v1/respond``
(the RMM loop) and ``/v1/feedback``; see :mod:`memkern.server.app`. API keys come from
``$MEMKERN_API_KEY`` (one key, any scope) and ``--api-key-file`` (one key a line, optionally
bound to a scope: ``KEY user_id=alice``); never from the command line, where ``ps`` shows them.
Without a key it binds only to a loopback address and answers only loopback ``Host`` /
``Origin`` names.
"""
from __future__ import annotations

import argparse
import contextlib
import ipaddress
import logging
import os
from typing import TYPE_CHECKING, Any, Iterator

from ..errors import bad_arg, missing_dependency
from . import common as C

if TYPE_CHECKING:  # pragma: no cover
    from ..server.service import MemoryService

LOOPBACK_NAMES = ("localhost",)
log = logging.getLogger("memkern")


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
    from ..server.service import DEFAULT_QUERY_CACHE, Limits

    C.add_store_args(p, namespace=None)
    p.add_argument("--embedder", default=None, metavar="ID_OR_PATH",
                   help="embedding model folder or id (default: the offline all-MiniLM-L6-v2)")
    p.add_argument("--chat-model", default=None, metavar="ID_OR_PATH",
                   help="chat model of /v1/respond (default: the offline SmolLM2-135M-Instruct, loaded on first use)")
    p.add_argument("--threads", type=C.positive_int, default=None,
                   help="CPU threads of the models (default: every core, at most 8)")
    p.add_argument("--embedder-backend", choices=("auto", "torch", "onnx"), default="auto",
                   help="the embedder's route (default auto: ONNX Runtime on CPU when installed, else torch)")
    p.add_argument("--query-cache", type=C.nonneg_int, default=DEFAULT_QUERY_CACHE,
                   help=f"query embeddings kept in an exact LRU (default {DEFAULT_QUERY_CACHE}; 0: none)")
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
    p.add_argument("--max-body-bytes", type=C.positive_int, default=d.max_body_bytes,
                   help=f"largest request (HTTP body / MCP message; default {d.max_body_bytes}; larger ones are "
                        "refused)")
    p.add_argument("--max-respond-chars", type=C.positive_int, default=d.max_respond_chars,
                   help=f"characters of a respond's query and session turns together (default {d.max_respond_chars})")
    p.add_argument("--max-pending-responds", type=C.positive_int, default=d.max_pending_responds,
                   help=f"responds running or waiting for the chat model at once (default {d.max_pending_responds}; "
                        "one more is refused as busy)")


def configure(p: argparse.ArgumentParser) -> None:
    add_server_args(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; any other "
                   "than a loopback address needs an API key)")
    p.add_argument("--port", type=C.nonneg_int, default=8000, help="port (default 8000; 0: any free port)")
    p.add_argument("--api-key", default=None, metavar="KEY", help=argparse.SUPPRESS)  # refused: shows in ps
    p.add_argument("--api-key-file", default=None, metavar="PATH",
                   help="API keys, one a line: 'KEY' (any scope) or 'KEY user_id=ID [agent_id=ID] [run_id=ID]' "
                        "(held to that scope); with $MEMKERN_API_KEY, one more key for any scope")
    p.add_argument("--allowed-host", action="append", default=None, metavar="NAME",
                   help="a Host / Origin name answered (repeatable; default without a key: 127.0.0.1, localhost, "
                        "::1; with a key: any)")
    p.add_argument("--header-timeout", type=C.positive_float, default=10.0,
                   help="seconds a client may take to send a request's headers (default 10)")
    p.add_argument("--body-timeout", type=C.positive_float, default=30.0,
                   help="seconds a client may take to send a request's body (default 30; 408 after)")
    p.add_argument("--max-concurrent", type=C.positive_int, default=64,
                   help="requests handled at once (default 64; 503 beyond)")
    p.add_argument("--max-connections", type=C.positive_int, default=256,
                   help="open connections (default 256; refused beyond)")
    p.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))


def keys_of(args):
    """The server's :class:`~memkern.server.app.KeyRing` (``$MEMKERN_API_KEY`` and
    ``--api-key-file``), or ``None`` without keys. ``--api-key`` is refused (a key on the command
    line is visible to every local user in ``ps``)."""
    from ..server.scopes import KeyRing

    if args.api_key is not None:
        raise bad_arg("--api-key", "the key in $MEMKERN_API_KEY or in a file given with --api-key-file (a key "
                      "on the command line shows in ps)", "--api-key")
    keys: dict = {}
    if args.api_key_file is not None:
        path = os.path.expanduser(args.api_key_file)
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
            mode = os.stat(path).st_mode
        except (OSError, UnicodeDecodeError) as e:
            raise bad_arg("--api-key-file", "a readable UTF-8 file of keys", f"{args.api_key_file}: {e}") from None
        if mode & 0o077:
            log.warning("serve: %s is readable by other users (chmod 600 it)", args.api_key_file)
        keys.update(KeyRing.parse(text, "--api-key-file").items())
    env = os.environ.get("MEMKERN_API_KEY")
    if env is not None:
        if not env.strip():
            raise bad_arg("$MEMKERN_API_KEY", "a non-empty key", env)
        keys[env.strip()] = None
    return KeyRing(keys) if keys else None


def run(args: argparse.Namespace) -> int:
    keys = keys_of(args)
    if keys is None and not is_loopback(args.host):
        raise bad_arg("--api-key-file", f"an API key ($MEMKERN_API_KEY or --api-key-file) to bind beyond localhost "
                      f"(--host {args.host})", None)
    try:
        import uvicorn

        from ..server.app import create_app, uvicorn_config
    except ImportError as e:
        raise missing_dependency(e, "memkern serve", "serve") or e
    hosts = args.allowed_host
    if hosts is None and keys is None and args.host not in ("127.0.0.1", "localhost", "::1"):
        from ..server.app import LOOPBACK_HOSTS

        hosts = sorted(LOOPBACK_HOSTS | {args.host.strip("[]").lower()})
    with service_from_args(args) as service:
        app = create_app(service, api_keys=keys, allowed_hosts=hosts, body_timeout=args.body_timeout,
                         max_concurrent=args.max_concurrent, freeze_gc=True)  # this process serves from here on
        print(f"memkern serve: store {C.store_path(args)} on http://{args.host}:{args.port}"
              f" ({'API key required' if keys else 'no API key: localhost only'})", flush=True)
        server = _server_class(uvicorn)(uvicorn_config(app, host=args.host, port=args.port, log_level=args.log_level,
                                                       header_timeout=args.header_timeout,
                                                       max_connections=args.max_connections))
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


@contextlib.contextmanager
def service_from_args(args: Any) -> Iterator["MemoryService"]:
    """The service ``memkern serve`` and ``memkern mcp`` run, set up from their shared CLI
    options (:func:`add_server_args`), as a context manager.

    Sets the torch threads (``--threads``), builds the ``--embedder`` (``None``: the offline
    default, built by the service's start-up load, which ``create_app`` / ``build_server`` start)
    and ``--chat-model``, opens the store (``--store``, created with the embedder's width), and
    applies the ``Limits`` options. On exit the kept RMMs are saved
    (:meth:`MemoryService.close`) and then the store is closed.
    """
    from ..server.service import Limits, MemoryService

    C.set_threads(args, all_cores=True)
    emb = None
    opts = {"backend": args.embedder_backend, "query_cache": args.query_cache}
    if args.embedder:
        from ..models import Embedder

        emb = Embedder(args.embedder, **opts)
    chat = None
    if args.chat_model:
        from ..models import ChatModel

        chat = ChatModel(args.chat_model)
    limits = Limits(max_body_bytes=args.max_body_bytes, max_messages=args.max_messages,
                    max_text_chars=args.max_text_chars, max_limit=args.max_limit,
                    max_respond_chars=args.max_respond_chars, max_pending_responds=args.max_pending_responds)
    with C.open_store(C.store_path(args), dim=C.DEFAULT_DIM if emb is None else emb.dim,
                      read_only=getattr(args, "read_only", False)) as store:
        service = MemoryService(store, embedder=emb, chat_model=chat, limits=limits, embed_batch=args.embed_batch,
                                embedder_options=opts)
        try:
            yield service
        finally:
            service.close()  # rerankers saved; the store is closed (snapshot) by the `with`
