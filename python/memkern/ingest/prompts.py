"""Prompts of the RMM loop (prospective and retrospective reflection).

The prompts are written for small local models as well as big ones: a short system line, one
tiny worked example of the exact JSON shape, then the data. Every answer is JSON and is parsed
by :func:`memkern.text.jsonrepair.parse_json`, so the prompts only need to make the *shape* likely;
the code validates every field.
"""
from __future__ import annotations

from typing import Any, Sequence

# ---------------------------------------------------------------------------------------------
# EXTRACT: must turn one dialogue session (numbered turns) into topic memories, each a short
# third-person summary of what the user said about one topic plus the indices of the turns it
# comes from. A topic may span several turns; a turn may feed several topics. Output:
# {"topics": [{"summary": str, "turns": [int, ...]}, ...]}; {"topics": []} when nothing is worth
# remembering.
EXTRACT_SYSTEM = (
    "You extract long-term memories from a conversation. Write each topic the user talked about "
    "as one short sentence about the user, and list the numbers of the turns it comes from. "
    'Answer with JSON only: {"topics": [{"summary": "...", "turns": [0, 1]}]}'
)

EXTRACT_EXAMPLE_IN = (
    "[0] user: I just adopted a cat called Miso.\n"
    "[1] assistant: Congratulations! How is Miso settling in?\n"
    "[2] user: Great. Also, I start my new job at the bakery on Monday."
)
EXTRACT_EXAMPLE_OUT = (
    '{"topics": [{"summary": "The user adopted a cat called Miso.", "turns": [0, 1, 2]}, '
    '{"summary": "The user starts a new job at a bakery on Monday.", "turns": [2]}]}'
)

# A stricter follow-up used for the single retry after an unparseable answer.
EXTRACT_RETRY = (
    'Your answer was not valid JSON. Answer again with only the JSON object {"topics": [...]} and '
    "nothing else."
)

# ---------------------------------------------------------------------------------------------
# UPDATE: must decide how one new memory relates to the most similar existing memories:
# ADD (new information), MERGE (same topic, compatible details: give the combined summary),
# UPDATE (same fact, newer state replaces the old one: give the new summary), INVALIDATE (the
# user withdraws or denies an old memory), NOOP (the new memory says nothing new). Output:
# {"action": "ADD|MERGE|UPDATE|INVALIDATE|NOOP", "index": int, "summary": str}; index names an
# existing memory (ignored for ADD).
UPDATE_SYSTEM = (
    "You maintain a memory bank about a user. Compare the NEW memory with the OLD memories and "
    "choose one action: ADD if it is new information; MERGE if it adds details to an old memory "
    "on the same topic; UPDATE if it replaces an old fact with a newer one; INVALIDATE if the "
    "user says an old memory is no longer true; NOOP if it repeats an old memory. "
    'Answer with JSON only: {"action": "...", "index": 0, "summary": "..."} where index is the '
    "old memory concerned and summary is the memory to keep."
)

UPDATE_EXAMPLE_IN = (
    "OLD memories:\n[0] The user lives in Lyon.\n[1] The user plays tennis.\n"
    "NEW memory: The user moved from Lyon to Berlin."
)
UPDATE_EXAMPLE_OUT = '{"action": "UPDATE", "index": 0, "summary": "The user lives in Berlin (moved from Lyon)."}'

# ---------------------------------------------------------------------------------------------
# ANSWER: must answer the user's question from numbered memories (summary + raw turns) and the
# current session, and cite by number the memories actually used. Output:
# {"answer": str, "citations": [int, ...]}; citations [] when no memory helped.
# Two-level memory (selected_turns=True): under each summary come only the turns retrieval found
# best for this question (any role: an assistant turn may hold the fact), so the model sees the
# exact wording where it matters and no unrelated turns of a long topic; the memory number, not
# the turn, is what gets cited.
ANSWER_SYSTEM = (
    "You are a helpful assistant with a memory of past conversations with the user. Answer the "
    "question briefly using the numbered memories, and cite the numbers of the memories you used. "
    'Answer with JSON only: {"answer": "...", "citations": [0]}'
)

# One worked example (small models copy the shape of an example far more reliably than they
# follow a description of it).
ANSWER_EXAMPLE_IN = (
    "Memories:\n[0] The user plays the violin.\n[1] The user lives in Oslo with a cat called Miso.\n\n"
    "Question: What is my cat's name?"
)
ANSWER_EXAMPLE_OUT = '{"answer": "Your cat is called Miso.", "citations": [1]}'


def _fmt_memory_turn(turn: dict, max_chars: int = 160) -> str:
    """A remembered turn as the answer prompt shows it: its date and speaker through the turn
    template (``"[2023-05-08] Caroline: ..."``; the role when there is no speaker), because
    temporal questions need the date."""
    from ..text.template import TurnTemplate, turn_date

    content = " ".join(str(turn.get("content", "")).split())
    if len(content) > max_chars:
        content = content[: max_chars - 3] + "..."
    return TurnTemplate().render(content, turn.get("speaker") or str(turn.get("role", "user")), turn_date(turn))


def _fmt_turn(turn: dict, index: int | None = None, max_chars: int = 300) -> str:
    role = str(turn.get("role", "user"))
    content = " ".join(str(turn.get("content", "")).split())
    if len(content) > max_chars:
        content = content[: max_chars - 3] + "..."
    return f"[{index}] {role}: {content}" if index is not None else f"{role}: {content}"


def extract_messages(turns: Sequence[dict], retry_of: str | None = None) -> list[dict[str, str]]:
    """Chat messages asking for the topics of one session.

    Parameters
    ----------
    turns : sequence of dict
        The session's turns (``role``, ``content``); shown numbered from 0.
    retry_of : str, optional
        The previous, unparseable answer; when given, it is shown and the retry instruction added.
    """
    body = "\n".join(_fmt_turn(t, i) for i, t in enumerate(turns))
    msgs = [
        {"role": "system", "content": EXTRACT_SYSTEM},
        {"role": "user", "content": EXTRACT_EXAMPLE_IN},
        {"role": "assistant", "content": EXTRACT_EXAMPLE_OUT},
        {"role": "user", "content": body},
    ]
    if retry_of is not None:
        msgs += [
            {"role": "assistant", "content": retry_of[:400]},
            {"role": "user", "content": EXTRACT_RETRY},
        ]
    return msgs


def update_messages(new_summary: str, old_summaries: Sequence[str]) -> list[dict[str, str]]:
    """Chat messages asking for the update decision of one new memory against old ones."""
    olds = "\n".join(f"[{i}] {s}" for i, s in enumerate(old_summaries))
    return [
        {"role": "system", "content": UPDATE_SYSTEM},
        {"role": "user", "content": UPDATE_EXAMPLE_IN},
        {"role": "assistant", "content": UPDATE_EXAMPLE_OUT},
        {"role": "user", "content": f"OLD memories:\n{olds}\nNEW memory: {new_summary}"},
    ]


def answer_messages(
    question: str,
    memories: Sequence[dict[str, Any]],
    session_turns: Sequence[dict] | None = None,
    max_turns_per_memory: int = 1,
    max_turn_chars: int = 160,
    max_summary_chars: int = 300,
    selected_turns: bool = False,
) -> list[dict[str, str]]:
    """Chat messages asking for a cited answer.

    Parameters
    ----------
    question : str
    memories : sequence of dict
        Each with ``summary`` and optionally ``turns`` (raw turns); numbered 0..M-1 in order.
        With ``selected_turns``, ``turns`` are the memory's best retrieved turns (two-level
        memory) in the order to show.
    session_turns : sequence of dict, optional
        The current session so far (most recent last); the last 6 are shown.
    max_turns_per_memory, max_turn_chars, max_summary_chars : int
        Budget of raw turns shown under each memory, and of each summary (small models are slow
        on long prompts). Raw turns the summary already quotes are not repeated.
    selected_turns : bool
        ``False``: the first ``max_turns_per_memory`` *user* turns of each memory are shown.
        Remembered turns show their date and speaker (``"[2023-05-08] Caroline: ..."``).
        ``True``: the given turns were chosen by retrieval, so turns of any role are shown (up to
        ``max_turns_per_memory``).
    """
    lines = []
    for i, m in enumerate(memories):
        summary = " ".join(str(m["summary"]).split())
        if len(summary) > max_summary_chars:
            summary = summary[: max_summary_chars - 3] + "..."
        lines.append(f"[{i}] {summary}")
        user_turns = [t for t in (m.get("turns") or []) if selected_turns or str(t.get("role", "user")) == "user"]
        # Raw turns the summary already quotes (embedding-extractor summaries) would only cost tokens.
        user_turns = [t for t in user_turns if " ".join(str(t.get("content", "")).split())[:40] not in summary]
        for t in user_turns[:max_turns_per_memory]:
            lines.append("    " + _fmt_memory_turn(t, max_turn_chars))
    mem_block = "\n".join(lines) if lines else "(no memories)"
    parts = [f"Memories:\n{mem_block}"]
    if session_turns:
        recent = "\n".join(_fmt_turn(t, None, max_turn_chars) for t in list(session_turns)[-6:])
        parts.append(f"Current conversation:\n{recent}")
    parts.append(f"Question: {question}")
    return [
        {"role": "system", "content": ANSWER_SYSTEM},
        {"role": "user", "content": ANSWER_EXAMPLE_IN},
        {"role": "assistant", "content": ANSWER_EXAMPLE_OUT},
        {"role": "user", "content": "\n\n".join(parts)},
    ]
