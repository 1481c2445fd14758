"""Data helpers shared by the memory experiments: datasets, question lists, means by type.

:func:`load_dataset` builds or loads a :class:`memkern.data.schema.Dataset`;
:func:`questions_by_conversation` groups the questions that have evidence labels by
conversation (the experiments score one conversation's units at a time).
"""
from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

import numpy as np

from ..data.schema import Conversation, Dataset, Question
from ..errors import bad_arg

__all__ = ["load_dataset", "dataset_info", "questions_with_evidence", "questions_by_conversation", "progress_bar",
           "mean", "by_type", "DATA_SOURCES"]

DATA_SOURCES = ("generated", "dialogues", "longmemeval", "locomo")


def load_dataset(source: str = "generated", path: str | None = None, *, users: int = 12, sessions: int = 30,
                 seed: int = 0, limit: int | None = None, conversations: Sequence[str] | None = None) -> Dataset:
    """``source``: ``"generated"`` (:func:`~memkern.data.generate_history`; args users/sessions/seed),
    ``"dialogues"`` (:func:`~memkern.data.generate_dialogues`; ``users`` = conversations), ``"longmemeval"``
    or ``"locomo"`` (path: a file or a folder of per-conversation files; ``conversations``: the
    sample ids to keep, :func:`~memkern.data.load_locomo`)."""
    from .. import data as D

    if source == "generated":
        return D.generate_history(users, sessions, seed=seed)
    if source == "dialogues":
        return D.generate_dialogues(users, sessions, seed=seed)
    if source in ("longmemeval", "locomo"):
        if not path:
            raise bad_arg("path", f"a {source} file", path)
        if source == "longmemeval":
            return D.load_longmemeval(path, limit=limit)
        return D.load_locomo(path, limit=limit, conversations=conversations)
    raise bad_arg("source", "'generated', 'dialogues', 'longmemeval' or 'locomo'", source)


def dataset_info(ds: Dataset) -> dict[str, Any]:
    """The ``dataset`` block of a result: name, content hash, sizes, generator meta."""
    return dict(name=ds.name, hash=ds.content_hash(), conversations=len(ds.conversations), sessions=ds.n_sessions,
                turns=ds.n_turns, questions=ds.n_questions, meta=ds.meta)


def questions_with_evidence(ds: Dataset, max_questions: int | None = None
                            ) -> tuple[list[tuple[Conversation, Question]], int]:
    """``((conversation, question) pairs with evidence labels, number skipped for having none)``."""
    out = [(c, q) for c, q in ds.questions() if q.evidence_turn_ids]
    skipped = ds.n_questions - len(out)
    if max_questions is not None:
        out = out[:max_questions]
    return out, skipped


def questions_by_conversation(ds: Dataset, max_questions: int | None = None
                              ) -> tuple[list[tuple[Conversation, list[Question]]], int]:
    """``([(conversation, its questions with evidence)], skipped)`` in dataset order."""
    qs, skipped = questions_with_evidence(ds, max_questions)
    by: dict[str, list[Question]] = {}
    for c, q in qs:
        by.setdefault(c.conversation_id, []).append(q)
    return [(c, by[c.conversation_id]) for c in ds.conversations if c.conversation_id in by], skipped


def progress_bar(it: Iterable, progress: bool, **kw: Any) -> Iterable:
    """``it`` wrapped in a tqdm bar when ``progress``."""
    if not progress:
        return it
    from tqdm.auto import tqdm

    return tqdm(it, **kw)


def mean(xs: Iterable[float]) -> float:
    """Mean of the non-NaN values (NaN when there are none)."""
    v = [float(x) for x in xs if not (isinstance(x, float) and math.isnan(x))]
    return float(np.mean(v)) if v else math.nan


def by_type(rows: Sequence[dict[str, Any]], names: Sequence[str]) -> dict[str, dict[str, float]]:
    """Per ``question_type``: the mean of each metric in ``names`` and the question count."""
    out: dict[str, dict[str, float]] = {}
    for t in sorted({r["question_type"] for r in rows}):
        sel = [r for r in rows if r["question_type"] == t]
        out[t] = {n: mean([r[n] for r in sel]) for n in names} | {"questions": len(sel)}
    return out
