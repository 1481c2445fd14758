"""Loader of dialogue-session files (what ``memkern ingest`` and ``memkern demo --file`` read).

One loader validates the whole file before anything uses it, so a bad value deep in the file is
reported (naming the file, the session and the turn) before any memory is written.

Accepted layouts:

- the bundled format: ``{"sessions": [{"session_id", "date", "turns": [...]}], "questions": [...],
  "user": ...}`` (``questions``: ``{"question", "answer"?}``, used by the demo);
- a JSON list of sessions, each a list of turns or a ``{"session_id"?, "date"?, "turns"}`` object;
- LongMemEval (:mod:`memkern.data.longmemeval`): sessions shared by several questions are kept
  once, in order;
- LoCoMo (:mod:`memkern.data.locomo`): one session per ``session_N`` of each sample, session id
  ``"<sample_id>:session_N"``, turns keep their ``dia_id``.

A turn is a dict with ``content`` (str; ``text`` is accepted instead) and ``role`` (str, default
``"user"``); other keys are kept. LongMemEval and LoCoMo files are validated by their own loaders.

Every layout then meets the bounds of :mod:`memkern.base.validate` (what the store accepts): each
session's ``date`` reads as a date in years 1-9999 (:func:`memkern.text.template.event_seconds`, the
check ``RMM.end_session(date=...)`` applies), session ids of at most ``MAX_ID_CHARS``
characters, turns within the text, name and JSON bounds (:func:`memkern.base.validate.check_turn`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from ..errors import MemkernError
from ..text.template import event_seconds
from ..base.validate import MAX_ID_CHARS, check_text, check_turn
from .locomo import parse_locomo
from .longmemeval import parse_longmemeval
from .schema import DatasetFormatError, read_json

__all__ = ["SessionFile", "load_session_file", "load_sessions", "parse_sessions"]


@dataclass
class SessionFile:
    """A loaded session file.

    Attributes
    ----------
    sessions : list of dict
        ``{"session_id": str, "date": str | None, "turns": [{"role": str, "content": str, ...}]}``
        in file order.
    questions : list of dict
        ``{"question": str, "answer": str | None}`` (bundled layout only; empty otherwise).
    user : str or None
        The bundled layout's ``user`` name.
    layout : str
        ``"bundled"``, ``"list"``, ``"longmemeval"`` or ``"locomo"``.
    """

    sessions: list[dict[str, Any]]
    questions: list[dict[str, Any]] = field(default_factory=list)
    user: str | None = None
    layout: str = "list"


def load_session_file(path: str | os.PathLike) -> SessionFile:
    """Read and validate a session file (see the module docstring for the layouts).

    Raises
    ------
    DatasetFileNotFoundError (a FileNotFoundError)
        The file does not exist.
    DatasetFormatError (a ValueError)
        The file is a directory, not UTF-8, not JSON, nested too deeply, of no known layout, or
        a value is missing or mistyped; the message names the file and the field, e.g.
        ``sessions[4].turns[0].content``.
    """
    p = os.fspath(path)
    data = read_json(p, "sessions")
    try:
        return parse_sessions(data)
    except DatasetFormatError as e:
        raise DatasetFormatError(f"{p}: {e}") from None


def check_sessions(sessions: list[dict[str, Any]], where: str = "sessions") -> None:
    """Every session within the bounds the store and ``RMM.end_session`` apply: a readable ``date``
    (or none), a bounded session id, every turn :func:`memkern.base.validate.check_turn`. Raises
    :class:`DatasetFormatError` naming the session (index and id) and the field."""
    for i, s in enumerate(sessions):
        at = f"{where}[{i}] (session {str(s['session_id'])[:60]!r})"
        try:
            check_text(f"{at}.session_id", s["session_id"], max_chars=MAX_ID_CHARS)
            event_seconds(s.get("date"), f"{at}.date")
            for j, t in enumerate(s["turns"]):
                check_turn(t, f"{at}.turns[{j}]")
        except MemkernError as e:
            raise DatasetFormatError(str(e)) from None


def load_sessions(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The sessions of :func:`load_session_file` (``[{"session_id", "date", "turns"}]``)."""
    return load_session_file(path).sessions


def parse_sessions(data: Any) -> SessionFile:
    """Map already-parsed JSON of any accepted layout to a :class:`SessionFile` (validated, also
    against the store's bounds: :func:`check_sessions`)."""
    out = _parse_layout(data)
    check_sessions(out.sessions)
    return out


def _parse_layout(data: Any) -> SessionFile:
    if isinstance(data, dict) and "sessions" in data:
        return _bundled(data)
    if isinstance(data, dict) and "conversation" in data:
        data = [data]
    if not isinstance(data, list):
        raise DatasetFormatError("root: expected a JSON list of sessions or a {\"sessions\": [...]} object, got "
                                 f"{type(data).__name__}")
    first = data[0] if data else None
    if isinstance(first, dict) and "haystack_sessions" in first:
        return _longmemeval(data)
    if isinstance(first, dict) and "conversation" in first:
        return _locomo(data)
    out = []
    for i, s in enumerate(data):
        if isinstance(s, dict):
            out.append(_session(s, f"[{i}]", i))
        else:
            out.append(_session({"turns": s}, f"[{i}]", i, bare=True))
    return SessionFile(_nonempty(out, "root"), layout="list")


def _bundled(data: dict) -> SessionFile:
    sessions = data["sessions"]
    if not isinstance(sessions, list):
        raise DatasetFormatError(f"sessions: expected a list of sessions, got {type(sessions).__name__}")
    out = [_session(s, f"sessions[{i}]", i) if isinstance(s, dict)
           else _session({"turns": s}, f"sessions[{i}]", i, bare=True) for i, s in enumerate(sessions)]
    questions = data.get("questions", [])
    if not isinstance(questions, list):
        raise DatasetFormatError(f"questions: expected a list, got {type(questions).__name__}")
    qs = []
    for i, q in enumerate(questions):
        if not isinstance(q, dict) or not isinstance(q.get("question"), str) or not q["question"].strip():
            got = q.get("question") if isinstance(q, dict) else q
            raise DatasetFormatError(f"questions[{i}].question: expected a non-empty str, got {got!r}")
        ans = q.get("answer")
        if ans is not None and not isinstance(ans, str):
            raise DatasetFormatError(f"questions[{i}].answer: expected a str or null, got {ans!r}")
        qs.append({"question": q["question"], "answer": ans})
    user = data.get("user")
    if user is not None and not isinstance(user, str):
        raise DatasetFormatError(f"user: expected a str or null, got {user!r}")
    return SessionFile(_nonempty(out, "sessions"), qs, user, "bundled")


def _session(s: dict, where: str, index: int, bare: bool = False) -> dict[str, Any]:
    turns = s.get("turns")
    tw = where if bare else f"{where}.turns"
    if not isinstance(turns, list):
        raise DatasetFormatError(f"{tw}: expected a list of turns, got {type(turns).__name__}")
    sid = s.get("session_id", f"s{index + 1}")
    if isinstance(sid, bool) or not isinstance(sid, (str, int)) or str(sid) == "":
        raise DatasetFormatError(f"{where}.session_id: expected a non-empty str, got {sid!r}")
    date = s.get("date")
    if date is not None and not isinstance(date, str):
        raise DatasetFormatError(f"{where}.date: expected a str or null, got {date!r}")
    return {"session_id": str(sid), "date": date, "turns": [_turn(t, f"{tw}[{j}]") for j, t in enumerate(turns)]}


def _turn(t: Any, where: str) -> dict[str, Any]:
    if not isinstance(t, dict):
        raise DatasetFormatError(f"{where}: expected a turn object with 'content', got {type(t).__name__}")
    if "content" not in t and "text" in t:
        t = dict(t, content=t["text"])
    content = t.get("content")
    if not isinstance(content, str):
        raise DatasetFormatError(f"{where}.content: expected a str, got {type(content).__name__} {_show(content)}")
    role = t.get("role", "user")
    if not isinstance(role, str) or not role:
        raise DatasetFormatError(f"{where}.role: expected a non-empty str, got {role!r}")
    return dict(t, role=role)


def _longmemeval(data: list) -> SessionFile:
    ds = parse_longmemeval(data)
    out, seen = [], set()
    for conv in ds.conversations:
        for s in conv.sessions:
            # A haystack session shared by several questions (or repeated in one, where the
            # loader renames it "<id>~k") is ingested once: the key is its date and content.
            key = (s.date, tuple((t.role, t.content) for t in s.turns))
            if key in seen:
                continue
            seen.add(key)
            out.append({"session_id": s.session_id, "date": s.date,
                        "turns": [{"role": t.role, "content": t.content} for t in s.turns]})
    return SessionFile(_nonempty(out, "haystack_sessions"), layout="longmemeval")


def _locomo(data: list) -> SessionFile:
    ds = parse_locomo(data)
    out = []
    for conv in ds.conversations:
        for s in conv.sessions:
            out.append({"session_id": f"{conv.conversation_id}:{s.session_id}", "date": s.date,
                        "turns": [{"role": t.role, "content": t.content, "dia_id": t.turn_id} for t in s.turns]})
    return SessionFile(out, layout="locomo")


def _show(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def _nonempty(sessions: list, where: str) -> list:
    if not sessions:
        raise DatasetFormatError(f"{where}: expected at least one session, got none")
    return sessions
