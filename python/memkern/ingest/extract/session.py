"""What every extractor does with a session: check its turns, read the user's salient statements,
build the fallback topic, and attach user turns that no topic references.
"""
from __future__ import annotations

import re
from typing import Any, Sequence

from ...base.validate import check_turn
from ...errors import MemkernTypeError, bad_arg
from ...protocols import Topic

__all__ = ["validate_turns", "salient_sentences", "fallback_topic", "attach_uncovered"]


def validate_turns(turns: Any, name: str = "turns") -> list[dict]:
    """Check a session: a list of dicts with string ``role`` and ``content``; returns a list copy."""
    if isinstance(turns, (str, bytes)) or not isinstance(turns, Sequence):
        raise bad_arg(name, "a list of turn dicts with 'role' and 'content'", type(turns).__name__, MemkernTypeError)
    out = []
    for i, t in enumerate(turns):
        if not isinstance(t, dict):
            raise bad_arg(f"{name}[{i}]", "a dict with 'role' and 'content'", type(t).__name__, MemkernTypeError)
        if "content" not in t or not isinstance(t["content"], str):
            raise bad_arg(f"{name}[{i}]['content']", "a str", t.get("content"), MemkernTypeError)
        if not isinstance(t.get("role", "user"), str):
            raise bad_arg(f"{name}[{i}]['role']", "a str", t.get("role"), MemkernTypeError)
        check_turn(t if "role" in t else dict(t, role="user"), f"{name}[{i}]")  # sizes, UTF-8, JSON values
        out.append(t)
    return out


_SENT_SPLIT = re.compile(r"(?<=[.!?])\s+")
_FILLER = re.compile(
    r"^(hi|hey|hello|thanks|thank you|ok|okay|sure|yes|no|great|cool|bye|good morning|good night)[\s,.!]*",
    re.I,
)


def salient_sentences(texts: Sequence[str], max_sentences: int = 3) -> list[str]:
    """Informative sentences of user turns: questions and greetings dropped, order kept."""
    out = []
    for text in texts:
        for s in _SENT_SPLIT.split(" ".join(text.split())):
            s = s.strip()
            core = _FILLER.sub("", s).strip()
            if len(core) < 8 or s.endswith("?"):
                continue
            out.append(core[0].upper() + core[1:] if core else core)
    return out[:max_sentences] if max_sentences > 0 else out


def fallback_topic(turns: Sequence[dict], max_chars: int = 400) -> Topic:
    """One topic holding the session's user statements verbatim (used when extraction fails)."""
    user = [i for i, t in enumerate(turns) if str(t.get("role", "user")) == "user"] or list(range(len(turns)))
    sents = salient_sentences([turns[i]["content"] for i in user], max_sentences=0)
    text = " ".join(sents) if sents else " ".join(" ".join(turns[i]["content"].split()) for i in user)
    if len(text) > max_chars:
        text = text[: max_chars - 3] + "..."
    return Topic(summary=f"User said: {text}" if text else "User said nothing notable.", turns=list(range(len(turns))), source="fallback")


def attach_uncovered(topics: list[Topic], turns: Sequence[dict]) -> None:
    """Attach each user turn no topic references to the topic nearest in turn index (in place)."""
    covered = {i for t in topics for i in t.turns}
    for i, turn in enumerate(turns):
        if i in covered or str(turn.get("role", "user")) != "user":
            continue
        best = min(topics, key=lambda tp: min((abs(j - i) for j in tp.turns), default=10**9))
        best.turns = sorted(set(best.turns) | {i})
