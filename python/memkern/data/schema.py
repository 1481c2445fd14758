"""One internal form for every multi-session memory benchmark memkern loads or generates.

A :class:`Dataset` holds :class:`Conversation` s (one user's history: LoCoMo samples, one
LongMemEval question's haystack, or one generated user). A conversation holds
:class:`Session` s of :class:`Turn` s, and the :class:`Question` s asked about it. Every turn has
a ``turn_id`` that is stable (the same file always gives the same ids) and unique within its
conversation; a question names its evidence by those ids.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator

from ..errors import MemkernError, MemkernValueError


class DatasetFormatError(MemkernValueError):
    """A benchmark file does not follow its published format; the message names the field."""


@dataclass
class Turn:
    """One message of a dialogue.

    ``turn_id`` is unique within its conversation (e.g. ``"s3#4"`` or LoCoMo's ``"D3:5"``).
    ``speaker`` is the speaker's name where the source has one (LoCoMo), else the role.
    """

    turn_id: str
    role: str
    content: str
    session_id: str
    turn_index: int
    date: str | None = None
    speaker: str | None = None
    has_answer: bool = False


@dataclass
class Session:
    session_id: str
    date: str | None
    turns: list[Turn] = field(default_factory=list)


@dataclass
class Question:
    """A question about one conversation.

    ``evidence_turn_ids``: the turns that hold the answer (LongMemEval ``has_answer`` turns,
    LoCoMo ``evidence`` dia_ids, exact labels for generated data); may be empty (e.g.
    LongMemEval abstention questions), in which case turn-level metrics skip the question and
    say so. ``evidence_session_ids``: sessions holding the evidence. ``question_type`` is the
    benchmark's type or category, as a string.
    """

    question_id: str
    question: str
    answer: str
    question_type: str
    evidence_turn_ids: list[str]
    evidence_session_ids: list[str]
    question_date: str | None = None
    conversation_id: str = ""


@dataclass
class Conversation:
    conversation_id: str
    sessions: list[Session]
    questions: list[Question] = field(default_factory=list)

    def turns(self) -> Iterator[Turn]:
        for s in self.sessions:
            yield from s.turns

    def turn_map(self) -> dict[str, Turn]:
        return {t.turn_id: t for t in self.turns()}


@dataclass
class Dataset:
    """A loaded or generated benchmark in memkern's internal form."""

    name: str
    conversations: list[Conversation]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def n_sessions(self) -> int:
        return sum(len(c.sessions) for c in self.conversations)

    @property
    def n_turns(self) -> int:
        return sum(len(s.turns) for c in self.conversations for s in c.sessions)

    @property
    def n_questions(self) -> int:
        return sum(len(c.questions) for c in self.conversations)

    def questions(self) -> Iterator[tuple[Conversation, Question]]:
        for c in self.conversations:
            for q in c.questions:
                yield c, q

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "meta": self.meta, "conversations": [asdict(c) for c in self.conversations]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Dataset":
        convs = []
        for c in d["conversations"]:
            sessions = [Session(s["session_id"], s["date"], [Turn(**t) for t in s["turns"]]) for s in c["sessions"]]
            convs.append(Conversation(c["conversation_id"], sessions, [Question(**q) for q in c["questions"]]))
        return cls(d["name"], convs, dict(d.get("meta", {})))

    def content_hash(self) -> str:
        """sha256 (hex, first 16 chars) of the canonical JSON of the content (not of ``meta``)."""
        blob = json.dumps([asdict(c) for c in self.conversations], sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]

    def validate(self) -> None:
        """Check id uniqueness and that every evidence id names a turn of its conversation."""
        for c in self.conversations:
            tm: dict[str, Turn] = {}
            for t in c.turns():
                if t.turn_id in tm:
                    raise DatasetFormatError(
                        f"turn_id: expected unique ids within conversation {c.conversation_id!r}, "
                        f"got duplicate {t.turn_id!r}")
                tm[t.turn_id] = t
            sids = {s.session_id for s in c.sessions}
            for q in c.questions:
                for e in q.evidence_turn_ids:
                    if e not in tm:
                        raise DatasetFormatError(
                            f"evidence_turn_ids of question {q.question_id!r}: expected turn ids of "
                            f"conversation {c.conversation_id!r}, got unknown {e!r}")
                for e in q.evidence_session_ids:
                    if e not in sids:
                        raise DatasetFormatError(
                            f"evidence_session_ids of question {q.question_id!r}: expected session ids "
                            f"of conversation {c.conversation_id!r}, got unknown {e!r}")

    def summary(self) -> str:
        types: dict[str, int] = {}
        for _, q in self.questions():
            types[q.question_type] = types.get(q.question_type, 0) + 1
        tstr = ", ".join(f"{k}: {v}" for k, v in sorted(types.items()))
        return (f"{self.name}: {len(self.conversations)} conversations, {self.n_sessions} sessions, "
                f"{self.n_turns} turns, {self.n_questions} questions ({tstr})")


def require(obj: Any, key: str, typ: type | tuple[type, ...], where: str) -> Any:
    """Return ``obj[key]``, raising :class:`DatasetFormatError` naming ``where.key`` if absent or mistyped."""
    if not isinstance(obj, dict):
        raise DatasetFormatError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    if key not in obj:
        raise DatasetFormatError(f"{where}.{key}: expected a field, got none (keys: {sorted(obj)[:12]})")
    v = obj[key]
    if not isinstance(v, typ):
        exp = typ.__name__ if isinstance(typ, type) else " or ".join(t.__name__ for t in typ)
        raise DatasetFormatError(f"{where}.{key}: expected {exp}, got {type(v).__name__} {str(v)[:60]!r}")
    return v


class DatasetFileNotFoundError(MemkernError, FileNotFoundError):
    """A data file does not exist (a :class:`FileNotFoundError` that is also a memkern error)."""


#: Deepest JSON nesting a data file may have (the published formats nest 4-6 levels):
#: :data:`memkern.base.validate.MAX_DOCUMENT_DEPTH`.
from ..base.validate import MAX_DOCUMENT_DEPTH as MAX_JSON_DEPTH  # noqa: E402


def read_text(path: Any, what: str) -> str:
    """The text of a UTF-8 data file, with errors that name the file.

    Raises
    ------
    DatasetFileNotFoundError (a FileNotFoundError)
        ``path`` does not exist.
    DatasetFormatError (a ValueError)
        ``path`` is a directory (or not a regular file) or is not valid UTF-8.
    """
    import os

    p = os.fspath(path)
    if not isinstance(p, str) or "\x00" in p:
        raise DatasetFormatError(f"{what} file: expected a path without NUL characters, got {p!r}")
    if not os.path.exists(p):
        raise DatasetFileNotFoundError(f"{what} file: expected an existing path, got {p!r}")
    if os.path.isdir(p):
        raise DatasetFormatError(f"{what} file {p!r}: expected a file, got a directory")
    try:
        with open(p, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError as e:
        raise DatasetFormatError(f"{what} file {p!r}: expected UTF-8 text, got an undecodable byte at offset "
                                 f"{e.start}") from None


def parse_json_text(text: str, where: str) -> Any:
    """``json.loads(text)`` within the document bounds of :func:`memkern.base.validate.parse_json` (no
    ``RecursionError``, no bare ``ValueError`` for a huge int, no NaN / Infinity), errors as
    :class:`DatasetFormatError` naming ``where``."""
    from ..base.validate import parse_json

    return parse_json(text, where, "JSON", DatasetFormatError, raw_syntax_errors=True)


def read_json(path: Any, what: str) -> Any:
    """Read a JSON (or JSON-lines) file with errors that name the file (missing file, directory,
    not UTF-8, invalid JSON, nesting deeper than :data:`MAX_JSON_DEPTH`)."""
    import os

    text = read_text(path, what)
    p = os.fspath(path)
    try:
        return parse_json_text(text, f"{what} file {p!r}")
    except json.JSONDecodeError as e:
        lines = [ln for ln in text.splitlines() if ln.strip()]
        if lines and all(ln.lstrip().startswith("{") for ln in lines[:3]):
            try:
                return [parse_json_text(ln, f"{what} file {p!r}") for ln in lines]
            except json.JSONDecodeError:
                pass
        raise DatasetFormatError(f"{what} file {p!r}: expected valid JSON, got a parse error: {e}") from None
