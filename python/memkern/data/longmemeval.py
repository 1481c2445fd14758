"""Loader (and writer) for LongMemEval files.

Published format: a JSON list of questions, each with ``question_id``, ``question_type``,
``question``, ``answer``, ``question_date``, ``haystack_session_ids``, ``haystack_dates``,
``haystack_sessions`` (a list of sessions, each a list of turns ``{"role", "content",
"has_answer"?}``) and ``answer_session_ids``.

Each LongMemEval question has its own haystack, so each question becomes one
:class:`~memkern.data.schema.Conversation` (id = question_id) holding its haystack sessions and
that one question. Turn ids are ``"<session_id>#<turn index>"``. Evidence turns are the turns
marked ``has_answer`` inside the question's answer sessions (falling back to ``has_answer`` turns
anywhere in the haystack if the answer sessions carry none); questions without any such turn
(e.g. abstention questions) keep an empty ``evidence_turn_ids``.
"""
from __future__ import annotations

import json
import os
from typing import Any

from .schema import Conversation, Dataset, DatasetFormatError, Question, Session, Turn, read_json, require

__all__ = ["load_longmemeval", "parse_longmemeval", "to_longmemeval"]


def load_longmemeval(path: str | os.PathLike, limit: int | None = None) -> Dataset:
    """Load a LongMemEval JSON file (``longmemeval_s.json``, ``_m``, ``_oracle``).

    Parameters
    ----------
    path : str or PathLike
        The file.
    limit : int, optional
        Keep only the first ``limit`` questions.

    Raises
    ------
    FileNotFoundError
        The file does not exist.
    DatasetFormatError (a ValueError)
        A field is missing or of the wrong type (``has_answer`` must be a JSON boolean or 0/1);
        the message names the field as ``question[i].field``; also a directory, a file that is
        not UTF-8 or JSON nested too deeply.
    """
    data = read_json(path, "LongMemEval")
    ds = parse_longmemeval(data, limit=limit)
    ds.meta["source"] = os.fspath(path)
    return ds


def parse_longmemeval(data: Any, limit: int | None = None, name: str = "longmemeval") -> Dataset:
    """Map already-parsed LongMemEval JSON (a list of question objects) to a :class:`Dataset`."""
    if not isinstance(data, list):
        raise DatasetFormatError(f"LongMemEval root: expected a JSON list of questions, got {type(data).__name__}")
    if limit is not None:
        data = data[: int(limit)]
    convs: list[Conversation] = []
    seen: set[str] = set()
    for i, item in enumerate(data):
        where = f"question[{i}]"
        qid = str(require(item, "question_id", (str, int), where))
        where = f"question[{i}] ({qid})"
        if qid in seen:
            raise DatasetFormatError(f"{where}.question_id: expected unique ids, got duplicate {qid!r}")
        seen.add(qid)
        qtype = require(item, "question_type", str, where)
        question = require(item, "question", str, where)
        answer = item.get("answer", "")
        if not isinstance(answer, (str, int, float, list)):
            raise DatasetFormatError(f"{where}.answer: expected a string, got {type(answer).__name__}")
        qdate = item.get("question_date")
        sids = require(item, "haystack_session_ids", list, where)
        dates = require(item, "haystack_dates", list, where)
        hs = require(item, "haystack_sessions", list, where)
        ans_sids = [str(s) for s in require(item, "answer_session_ids", list, where)]
        if not (len(sids) == len(dates) == len(hs)):
            raise DatasetFormatError(
                f"{where}.haystack_sessions: expected as many sessions as haystack_session_ids and "
                f"haystack_dates ({len(sids)}, {len(dates)}), got {len(hs)}")
        sessions: list[Session] = []
        used_sids: set[str] = set()
        for j, (sid, date, turns) in enumerate(zip(sids, dates, hs)):
            sid = str(sid)
            if sid in used_sids:  # duplicated haystack sessions occur; keep ids unique
                k = 1
                while f"{sid}~{k}" in used_sids:
                    k += 1
                sid = f"{sid}~{k}"
            used_sids.add(sid)
            if not isinstance(turns, list):
                raise DatasetFormatError(f"{where}.haystack_sessions[{j}]: expected a list of turns, got {type(turns).__name__}")
            sess = Session(sid, None if date is None else str(date))
            for k, t in enumerate(turns):
                tw = f"{where}.haystack_sessions[{j}][{k}]"
                role = require(t, "role", str, tw)
                content = require(t, "content", str, tw)
                has_answer = _flag(t.get("has_answer", False), f"{tw}.has_answer")
                sess.turns.append(Turn(f"{sid}#{k}", role, content, sid, k, sess.date, role, has_answer))
            sessions.append(sess)
        evid = [t.turn_id for s in sessions if s.session_id in ans_sids for t in s.turns if t.has_answer]
        if not evid:
            evid = [t.turn_id for s in sessions for t in s.turns if t.has_answer]
        present = {s.session_id for s in sessions}
        q = Question(qid, question, answer if isinstance(answer, str) else json.dumps(answer), qtype, evid,
                     [s for s in ans_sids if s in present], None if qdate is None else str(qdate), qid)
        convs.append(Conversation(qid, sessions, [q]))
    ds = Dataset(name, convs)
    ds.validate()
    return ds


def _flag(v: Any, where: str) -> bool:
    """A JSON boolean (``true`` / ``false``) or 0 / 1; anything else (e.g. the string ``"no"``,
    which ``bool()`` would read as True) raises :class:`DatasetFormatError` naming ``where``."""
    if isinstance(v, bool):
        return v
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    raise DatasetFormatError(f"{where}: expected true, false, 0 or 1, got {type(v).__name__} {str(v)[:60]!r}")


def to_longmemeval(dataset: Dataset) -> list[dict[str, Any]]:
    """Write a :class:`Dataset` in LongMemEval's published format (one entry per question).

    Every question of a conversation gets that conversation's sessions as its haystack (sessions
    dated after the question are left out); ``has_answer`` marks the question's evidence turns.
    """
    out = []
    for conv, q in dataset.questions():
        ev = set(q.evidence_turn_ids)
        sessions = [s for s in conv.sessions if q.question_date is None or s.date is None or s.date <= q.question_date]
        hs = []
        for s in sessions:
            turns = []
            for t in s.turns:
                d = {"role": t.role, "content": t.content}
                if t.turn_id in ev:
                    d["has_answer"] = True
                turns.append(d)
            hs.append(turns)
        out.append({
            "question_id": q.question_id,
            "question_type": q.question_type,
            "question": q.question,
            "answer": q.answer,
            "question_date": q.question_date,
            "haystack_session_ids": [s.session_id for s in sessions],
            "haystack_dates": [s.date for s in sessions],
            "haystack_sessions": hs,
            "answer_session_ids": list(q.evidence_session_ids),
        })
    return out
