"""``memkern serve`` (HTTP, FastAPI) and ``memkern mcp`` (Model Context Protocol over stdio).

Install with ``pip install memkern[serve]``. :class:`MemoryService` (``service.py``) holds the
operations both servers expose; :func:`create_app` (``app.py``) is the HTTP app;
``mcp.py`` the MCP server; ``scopes.py`` maps mem0's ``user_id`` / ``agent_id`` / ``run_id`` to
memkern namespaces. ``limits.py`` holds the request limits and the 409 / 503 errors,
``shared_models.py`` the embedder and chat model the threads share, ``ledger.py`` the record of
accepted feedback.
"""
from __future__ import annotations

from .scopes import Scope, decode, encode, make_scope
from .service import Limits, MemoryService


def create_app(service, api_key=None, **kw):
    """The HTTP app (see :mod:`memkern.server.app`); needs ``memkern[serve]``."""
    from .app import create_app as _create

    return _create(service, api_key=api_key, **kw)


__all__ = ["Limits", "MemoryService", "Scope", "create_app", "decode", "encode", "make_scope"]
