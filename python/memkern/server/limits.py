"""Request size limits of ``memkern serve`` / ``memkern mcp`` and the errors a server answers when a
request passes one (:class:`ConflictError`: HTTP 409, :class:`BusyError`: HTTP 503)."""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import MemkernError, MemkernValueError

__all__ = ["BusyError", "ConflictError", "Limits"]


@dataclass(frozen=True)
class Limits:
    """Request size limits (checked before any model runs or anything is written).

    Attributes
    ----------
    max_body_bytes : int
        HTTP request body, MCP request line (413 / a tool error beyond it).
    max_messages : int
        Messages in one add / turns in one ``session_turns``.
    max_text_chars : int
        Characters of one message's content, a search query or a memory text.
    max_limit : int
        Largest ``limit`` of a search or a listing.
    max_meta_bytes : int
        ``metadata``, and the keys of one message other than ``role`` / ``content``, as compact
        JSON (UTF-8 bytes). Every value also keeps to the bounds every entry point shares
        (:mod:`memkern.base.validate`: a ``role`` of at most ``MAX_NAME_CHARS``, JSON nesting, key
        counts, int64 ints, UTF-8 text).
    max_respond_chars : int
        Characters of a respond's query plus its ``session_turns`` contents (the prompt the chat
        model reads grows with them).
    max_pending_responds : int
        Responds running or waiting for the chat model at once; one more is refused with
        :class:`BusyError` (HTTP 503) instead of queueing behind them.
    """

    max_body_bytes: int = 1 << 20
    max_messages: int = 256
    max_text_chars: int = 32_768
    max_limit: int = 1000
    max_meta_bytes: int = 16_384
    max_respond_chars: int = 4096
    max_pending_responds: int = 4


class ConflictError(MemkernValueError):
    """The request repeats one that may happen only once (feedback on a response): HTTP 409."""


class BusyError(MemkernError):
    """The server is at a concurrency limit; retry later: HTTP 503."""
