"""Prompts of the MemReread loop (read -> decompose -> reread -> integrate -> answer).

Every builder returns chat messages (``list[dict]``) for :class:`memkern.ChatModel`. Memories are
plain text, one fact per line; only the decompose step answers in JSON (parsed by
:func:`memkern.text.jsonrepair.parse_json` and validated by the code). The code, not the model,
enforces the memory cap, refuses repeated sub-questions and keeps facts marked
:data:`CONFIRMED_TAG`.
"""
from __future__ import annotations

from typing import Sequence

# Facts that the sub-answer and the memory agree on carry this tag; later steps must keep them
# (and memkern re-appends any tagged line a rewrite dropped).
CONFIRMED_TAG = "[confirmed]"

EMPTY_MEMORY = "(empty)"

# ---------------------------------------------------------------------------------------------
# READ: must rewrite the memory after reading one more chunk of the document: keep every earlier
# fact that helps answer the question, add the new relevant facts of this chunk (with names,
# numbers and dates as written), drop nothing marked [confirmed], and write nothing else. Output:
# the new memory, one fact per line (plain text, no preamble).
READ_SYSTEM = (
    "You read a long document piece by piece to answer a question later. You keep notes (the "
    "memory). After each new piece, write the updated notes: keep the earlier notes that help "
    "answer the question, add the facts from the new piece that help answer it, copying names, "
    f"numbers and dates exactly. Keep every note marked {CONFIRMED_TAG}. Write one fact per line "
    "and nothing else. If nothing is relevant, repeat the earlier notes unchanged."
)


def read_messages(question: str, memory: str, chunk: str, chunk_index: int, n_chunks: int) -> list[dict]:
    """Memory update after reading chunk ``chunk_index`` (0-based) of ``n_chunks``."""
    return [
        {"role": "system", "content": READ_SYSTEM},
        {"role": "user", "content": (
            f"Question: {question}\n\n"
            f"Notes so far:\n{memory.strip() or EMPTY_MEMORY}\n\n"
            f"Piece {chunk_index + 1} of {n_chunks}:\n{chunk}\n\n"
            "Write the updated notes.")},
    ]


# ---------------------------------------------------------------------------------------------
# DECOMPOSE: must judge whether the notes already answer the question; if not, must ask exactly
# ONE sub-question: the most important missing piece, more specific than the question, fully
# self-contained (names instead of pronouns), and different from every earlier sub-question.
# Output JSON: {"enough": true} or {"enough": false, "sub_question": "..."}.
DECOMPOSE_SYSTEM = (
    "You check whether notes are enough to answer a question. If they are, answer "
    '{"enough": true}. If not, ask the ONE most important missing question: more specific than '
    "the main question, understandable on its own (use names, not he/she/it/they), and not one "
    'that was already asked. Then answer {"enough": false, "sub_question": "..."}. '
    "Answer with JSON only."
)

DECOMPOSE_EXAMPLE_IN = (
    "Question: In which city was the founder of Acme born?\n"
    "Notes:\nAcme was founded by Dana Reyes in 1999.\n"
    "Already asked: (none)"
)
DECOMPOSE_EXAMPLE_OUT = '{"enough": false, "sub_question": "In which city was Dana Reyes born?"}'


def decompose_messages(question: str, memory: str, history: Sequence[tuple[str, str]],
                       refused: Sequence[str] = ()) -> list[dict]:
    """Sufficiency check / next sub-question. ``history``: earlier (sub-question, answer) pairs;
    ``refused``: sub-questions the code rejected as repeats in this round (shown so the model
    asks something else)."""
    asked = "\n".join(f"- {q} -> {a}" for q, a in history) or "(none)"
    body = f"Question: {question}\nNotes:\n{memory.strip() or EMPTY_MEMORY}\nAlready asked: {asked}"
    if refused:
        body += "\nRejected as repeats (do not ask again): " + "; ".join(refused)
    return [
        {"role": "system", "content": DECOMPOSE_SYSTEM},
        {"role": "user", "content": DECOMPOSE_EXAMPLE_IN},
        {"role": "assistant", "content": DECOMPOSE_EXAMPLE_OUT},
        {"role": "user", "content": body},
    ]


# ---------------------------------------------------------------------------------------------
# INTEGRATE: must rewrite the main notes with the answer to a sub-question: the sub-answer wins
# any conflict, duplicates and facts irrelevant to the main question go, and facts that both the
# notes and the sub-answer support are tagged [confirmed] (already tagged lines stay). Output: the
# new notes, one fact per line.
INTEGRATE_SYSTEM = (
    "You merge new evidence into notes for answering a question. Rewrite the notes using the "
    "answer to a sub-question: when they disagree, trust the sub-answer; remove duplicate notes "
    "and notes that do not help the question; add the sub-answer as a note. Put "
    f"{CONFIRMED_TAG} at the end of each note that both the old notes and the sub-answer support, "
    f"and keep notes already marked {CONFIRMED_TAG}. Write one fact per line and nothing else."
)


def integrate_messages(question: str, memory: str, sub_question: str, sub_answer: str) -> list[dict]:
    """Root memory rewrite from (question, memory, sub-question, sub-answer)."""
    return [
        {"role": "system", "content": INTEGRATE_SYSTEM},
        {"role": "user", "content": (
            f"Question: {question}\n\nNotes:\n{memory.strip() or EMPTY_MEMORY}\n\n"
            f"Sub-question: {sub_question}\nSub-answer: {sub_answer}\n\nWrite the updated notes.")},
    ]


# ---------------------------------------------------------------------------------------------
# ANSWER: must answer the question from the notes alone, as briefly as possible (a name, number,
# date or short phrase), saying "unknown" when the notes do not contain the answer.
ANSWER_SYSTEM = (
    "Answer the question using only the notes. Give just the answer (a name, number, date or "
    'short phrase) with no explanation. If the notes do not contain it, answer "unknown".'
)


def answer_messages(question: str, memory: str) -> list[dict]:
    """Final (or sub-question) answer from a memory."""
    return [
        {"role": "system", "content": ANSWER_SYSTEM},
        {"role": "user", "content": f"Notes:\n{memory.strip() or EMPTY_MEMORY}\n\nQuestion: {question}\nAnswer:"},
    ]


__all__ = [
    "ANSWER_SYSTEM",
    "CONFIRMED_TAG",
    "DECOMPOSE_SYSTEM",
    "EMPTY_MEMORY",
    "INTEGRATE_SYSTEM",
    "READ_SYSTEM",
    "answer_messages",
    "decompose_messages",
    "integrate_messages",
    "read_messages",
]
