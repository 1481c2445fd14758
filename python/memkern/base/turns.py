"""Turn identity: when two turn dicts are "the same turn" (one definition for every layer).

A record keeps each distinct turn once: :meth:`memkern.MemoryStore.merge` (the MERGE action) and
:func:`union_turns` (UPDATE / NOOP, :mod:`memkern.ingest.apply`) drop a new turn that is the same turn as
one already kept, and the two-level turn records are matched to turns the same way.

Two turns are the same turn when their :func:`turn_key` is equal:

- a turn with a ``turn_id`` (the caller's own id of the message) is identified by that id and
  its ``content``: the same message sent again, re-annotated with another ``session_id``,
  ``turn_index``, ``timestamp`` or any other key, is still the same turn; an edited message (same
  id, other words) is another turn, so its new words are kept;
- otherwise by ``(session_id, turn_index, role, content)``: other keys (``timestamp``, speaker
  names, metadata) do not make a turn different, while two different utterances at the same
  position (an edited turn) are two turns.

Missing keys count as ``None``.
"""
from __future__ import annotations

import json
from typing import Any, Sequence

__all__ = ["turn_key", "union_turns"]


def turn_key(turn: dict) -> str:
    """The identity of a turn dict (equal keys = the same turn; see the module docstring).

    Parameters
    ----------
    turn : dict
        A turn (``role``, ``content``, optionally ``turn_id``, ``session_id``, ``turn_index``, ...).

    Returns
    -------
    str
        A hashable key (JSON text, so unhashable ids such as lists work too).
    """
    tid = turn.get("turn_id")
    if tid is not None:
        parts: list[Any] = ["turn_id", tid, turn.get("content")]
    else:
        parts = ["position", turn.get("session_id"), turn.get("turn_index"), turn.get("role"), turn.get("content")]
    return json.dumps(parts, ensure_ascii=False, sort_keys=True, default=str)


def union_turns(old: Sequence[dict] | None, new: Sequence[dict] | None) -> list[dict]:
    """Old turns then the new ones not already present (:func:`turn_key`), in order; a turn
    repeated within ``new`` is kept once."""
    out = list(old or [])
    seen = {turn_key(t) for t in out}
    for t in new or []:
        k = turn_key(t)
        if k not in seen:
            seen.add(k)
            out.append(t)
    return out
