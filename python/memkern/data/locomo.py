"""Loader for LoCoMo files.

Published format: a JSON list of samples, each with ``conversation`` (``speaker_a``,
``speaker_b``, ``session_N``, ``session_N_date_time``; turns ``{"speaker", "dia_id":
"D<session>:<turn>", "text"}``) and ``qa`` (``question``, ``answer`` or ``adversarial_answer``,
``evidence``: a list of dia_ids, ``category`` 1-5).

Per-conversation layout (what the repository's ``locomo10.zip`` unpacks to): one conversation per
file, its fields at the top level (``speaker_a``, ``speaker_b``, ``session_N``,
``session_N_date_time``, ``qa``, ...), the sample id taken from the file name
(``conv-26.json`` -> ``"conv-26"``) unless the file has a ``sample_id``. :func:`load_locomo`
reads such a file, or a folder of them.

Each sample becomes one :class:`~memkern.data.schema.Conversation`; turn ids are the dia_ids
(unique within a sample), session ids ``"session_N"``. ``role`` is ``"user"`` for speaker_a and
``"assistant"`` for speaker_b (the speaker's name is kept in ``speaker``). Question type is
``"category_<n>"`` (``n`` in 1-5; anything else is rejected). Answers are strings or numbers
(numbers are kept as their string); a question without ``answer`` (or with ``null``) takes its
``adversarial_answer``. Evidence ids are split on ``;``, ``,`` and whitespace (the published file
has a few joined ids); evidence ids naming no turn are dropped with a warning (logged and
counted in ``dataset.meta["dropped_evidence"]``).
"""
from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any, Sequence

from .schema import Conversation, Dataset, DatasetFormatError, Question, Session, Turn, read_json, require

__all__ = ["load_locomo", "parse_locomo", "LOCOMO_CATEGORIES"]

log = logging.getLogger("memkern")

LOCOMO_CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
_SESSION_RE = re.compile(r"^session_(\d+)$")
#: The published file joins some evidence ids in one string with "; ", ",", or spaces
#: (e.g. "D8:6; D9:17", "D9:1 D4:4 D4:6"); each separator (and any run of them) splits.
_EVIDENCE_SPLIT = re.compile(r"[;,\s]+")


def _category(v: Any, where: str) -> int:
    """A LoCoMo category: an int (or a numeric string) in 1..5."""
    if isinstance(v, bool):
        raise DatasetFormatError(f"{where}: expected an integer 1-5, got {v!r}")
    try:
        cat = int(v)
    except ValueError:
        raise DatasetFormatError(f"{where}: expected an integer 1-5, got {v!r}") from None
    if cat not in LOCOMO_CATEGORIES:
        raise DatasetFormatError(f"{where}: expected an integer 1-5, got {v!r}")
    return cat


def _answer(v: Any, where: str) -> str:
    """A LoCoMo answer: a string, or a number (some answers are years or counts) as its string."""
    if isinstance(v, str):
        return v
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return str(v)
    raise DatasetFormatError(f"{where}: expected a string or a number, got {type(v).__name__} {str(v)[:60]!r}")


def _natural(name: str) -> list:
    """Sort key: digit runs compared as numbers (``conv-3`` before ``conv-26``)."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def _as_sample(data: Any, stem: str) -> Any:
    """A per-conversation file's object as a published sample (``conversation`` + ``qa``); any
    other JSON is returned unchanged."""
    if isinstance(data, dict) and "conversation" not in data and "speaker_a" in data:
        return {"sample_id": str(data.get("sample_id", stem)),
                "conversation": {k: v for k, v in data.items() if k not in ("qa", "sample_id")},
                "qa": data.get("qa", [])}
    return data


def load_locomo(path: str | os.PathLike, limit: int | None = None,
                conversations: Sequence[str] | None = None) -> Dataset:
    """Load LoCoMo: the published file (``locomo10.json``), one per-conversation file, or a folder
    of per-conversation files (``*.json``, in natural name order).

    Parameters
    ----------
    path : str or PathLike
    limit : int, optional
        Keep only the first ``limit`` samples.
    conversations : sequence of str, optional
        Keep only these sample ids (e.g. ``["conv-26", "conv-30"]``), in this order. In a folder
        only the files ``<id>.json`` are read (the others are never opened). An id the data does
        not hold raises :class:`DatasetFormatError`.

    Raises
    ------
    FileNotFoundError, DatasetFormatError (a ValueError naming the field, e.g.
    ``sample[0].conversation.session_1[3].dia_id``, ``sample[0].qa[2].answer`` for an answer that
    is neither a string nor a number, ``qa[i].category`` outside 1-5; also a directory, a file that
    is not UTF-8 or JSON nested too deeply).
    """
    want = None
    if conversations is not None:
        if isinstance(conversations, (str, bytes)) or not all(isinstance(c, str) and c for c in conversations):
            raise DatasetFormatError(f"conversations: expected a list of sample ids, got {conversations!r}")
        want = list(dict.fromkeys(conversations))
    p = Path(path)
    if p.is_dir():
        if want is not None:
            files = [p / f"{c}.json" for c in want]
            missing = [f.name for f in files if not f.is_file()]
            if missing:
                raise DatasetFormatError(f"LoCoMo folder {os.fspath(path)!r}: expected {', '.join(missing)} "
                                         f"(conversations {want}), got no such file")
        else:
            files = sorted((f for f in p.iterdir() if f.suffix == ".json" and f.is_file()), key=lambda f: _natural(f.name))
            if not files:
                raise DatasetFormatError(f"LoCoMo folder {os.fspath(path)!r}: expected *.json conversation files, got none")
        data = []
        for f in files:
            item = _as_sample(read_json(f, "LoCoMo"), f.stem)
            data.extend(item if isinstance(item, list) else [item])
    else:
        data = _as_sample(read_json(path, "LoCoMo"), p.stem)
    if want is not None:
        samples = data if isinstance(data, list) else [data]
        by_id = {str(x.get("sample_id", f"conv-{i}")) if isinstance(x, dict) else None: x
                 for i, x in enumerate(samples)}
        missing = [c for c in want if c not in by_id]
        if missing:
            raise DatasetFormatError(f"conversations: expected sample ids the data holds "
                                     f"({', '.join(sorted(k for k in by_id if k))}), got {', '.join(missing)}")
        data = [by_id[c] for c in want]
    ds = parse_locomo(data, limit=limit)
    ds.meta["source"] = os.fspath(path)
    ds.meta["conversations"] = [c.conversation_id for c in ds.conversations]
    return ds


def parse_locomo(data: Any, limit: int | None = None, name: str = "locomo") -> Dataset:
    """Map already-parsed LoCoMo JSON (a list of samples, one sample, or one per-conversation
    object) to a :class:`Dataset`."""
    data = _as_sample(data, "conv-0")
    if isinstance(data, dict) and "conversation" in data:
        data = [data]
    if not isinstance(data, list):
        raise DatasetFormatError(f"LoCoMo root: expected a JSON list of samples, got {type(data).__name__}")
    if limit is not None:
        data = data[: int(limit)]
    convs: list[Conversation] = []
    dropped = 0
    for i, sample in enumerate(data):
        where = f"sample[{i}]"
        conv = require(sample, "conversation", dict, where)
        cid = str(sample.get("sample_id", f"conv-{i}"))
        where = f"sample[{i}] ({cid})"
        spk_a = require(conv, "speaker_a", str, f"{where}.conversation")
        spk_b = conv.get("speaker_b")
        nums = sorted(int(m.group(1)) for k in conv if (m := _SESSION_RE.match(k)))
        if not nums:
            raise DatasetFormatError(f"{where}.conversation.session_1: expected at least one session_N field, got none")
        sessions: list[Session] = []
        ids: set[str] = set()
        for n in nums:
            sw = f"{where}.conversation.session_{n}"
            turns = conv[f"session_{n}"]
            if not isinstance(turns, list):
                raise DatasetFormatError(f"{sw}: expected a list of turns, got {type(turns).__name__}")
            date = conv.get(f"session_{n}_date_time")
            sid = f"session_{n}"
            sess = Session(sid, None if date is None else str(date))
            for k, t in enumerate(turns):
                tw = f"{sw}[{k}]"
                speaker = require(t, "speaker", str, tw)
                dia = require(t, "dia_id", str, tw).strip()
                text = require(t, "text", str, tw)
                if "blip_caption" in t and t.get("blip_caption"):
                    text = f"{text} [shares a photo: {t['blip_caption']}]"
                if dia in ids:
                    raise DatasetFormatError(f"{tw}.dia_id: expected unique ids within the sample, got duplicate {dia!r}")
                ids.add(dia)
                role = "user" if speaker == spk_a else ("assistant" if spk_b is None or speaker == spk_b else "user")
                sess.turns.append(Turn(dia, role, text, sid, k, sess.date, speaker, False))
            sessions.append(sess)
        turn_sid = {t.turn_id: t.session_id for s in sessions for t in s.turns}
        qa = require(sample, "qa", list, where)
        questions: list[Question] = []
        for j, item in enumerate(qa):
            qw = f"{where}.qa[{j}]"
            question = require(item, "question", str, qw)
            cat = _category(require(item, "category", (int, str), qw), f"{qw}.category")
            if item.get("answer") is not None or "adversarial_answer" not in item:
                if "answer" not in item:
                    raise DatasetFormatError(f"{qw}.answer: expected 'answer' or 'adversarial_answer', got neither")
                answer = _answer(item["answer"], f"{qw}.answer")
            else:  # no answer (or null) but an adversarial answer: category-5 questions
                answer = _answer(item["adversarial_answer"], f"{qw}.adversarial_answer")
            ev_raw = item.get("evidence", [])
            if not isinstance(ev_raw, list):
                raise DatasetFormatError(f"{qw}.evidence: expected a list of dia_ids, got {type(ev_raw).__name__}")
            ev: list[str] = []
            for e in ev_raw:
                if not isinstance(e, str):
                    raise DatasetFormatError(f"{qw}.evidence: expected dia_id strings, got {e!r}")
                for part in _EVIDENCE_SPLIT.split(e.strip()):
                    if not part:
                        continue
                    if part in turn_sid:
                        if part not in ev:
                            ev.append(part)
                    else:
                        dropped += 1
                        log.warning("LoCoMo %s.evidence: dia_id %r names no turn; dropped", qw, part)
            ev_s = []
            for e in ev:
                if turn_sid[e] not in ev_s:
                    ev_s.append(turn_sid[e])
            questions.append(Question(f"{cid}/q{j}", question, answer, f"category_{cat}", ev, ev_s, None, cid))
        convs.append(Conversation(cid, sessions, questions))
    ds = Dataset(name, convs, {"dropped_evidence": dropped})
    ds.validate()
    return ds
