"""MemReread: answer a question over a long text by reading it in chunks into a bounded memory,
rereading what is missing.
"""

from __future__ import annotations

from .loop import (
    Call,
    MemReread,
    Result,
    TraceEntry,
    ROLES,
    normalize_question,
)

__all__ = [
    "Call",
    "MemReread",
    "Result",
    "TraceEntry",
    "ROLES",
    "normalize_question",
]
