"""Loader (and writer) for the published long-context QA record format.

One record per question, as in the LongBench release of HotpotQA, 2WikiMultiHopQA, MuSiQue, ...::

    {"input": "<question>", "context": "<long document>", "answers": ["<gold>", ...],
     "length": <words>, "dataset": "hotpotqa", "language": "en", "all_classes": null,
     "_id": "<id>"}

Files are a JSON list of records or JSON Lines (one record per line; ``.jsonl``). Required:
``context`` (str), ``input`` (str) and ``answers`` (list of str; a single str is accepted). All
other fields are optional and kept in ``meta``. Generated items (:mod:`memkern.data.haystack`)
can be written in the same format with :func:`save_longqa`, so users run their own files and
memkern's through the same ``memkern eval reread --data FILE`` path.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable

from ..base.atomic import atomic_write
from .haystack import LongQAItem
from ..base.validate import check_int
from .schema import DatasetFormatError, parse_json_text, read_text

__all__ = ["load_longqa", "save_longqa", "longqa_record"]

_KNOWN = {"input", "context", "answers", "length", "dataset", "_id", "id", "supporting_facts"}


def _records(path: Path) -> list:
    text = read_text(path, "long-context QA")
    stripped = text.lstrip()
    if not stripped:
        return []
    if stripped[0] == "[":
        try:
            data = parse_json_text(text, str(path))
        except json.JSONDecodeError as e:
            raise DatasetFormatError(f"{path}: expected a JSON list of records, got invalid JSON ({e})") from e
        return data
    if stripped[0] == "{" and path.suffix.lower() == ".json":
        try:
            data = parse_json_text(text, str(path))
        except json.JSONDecodeError:
            data = None  # maybe JSON Lines with a .json name
        if isinstance(data, dict):
            if isinstance(data.get("data"), list):
                return data["data"]
            return [data]
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(parse_json_text(line, f"{path}: line {n}"))
        except json.JSONDecodeError as e:
            raise DatasetFormatError(f"{path}: line {n}: expected one JSON record per line, got invalid JSON ({e})") from e
    return out


def load_longqa(path: str | os.PathLike, limit: int | None = None, dataset: str | None = None) -> list[LongQAItem]:
    """Load long-context QA records (``context`` / ``input`` / ``answers``) as :class:`LongQAItem` s.

    Parameters
    ----------
    path : JSON list or JSON Lines file.
    limit : keep the first ``limit`` records.
    dataset : keep only records whose ``dataset`` field equals this.

    Raises
    ------
    DatasetFormatError
        A record lacks a required field or has a wrong type; the message names the record and
        the field.
    """
    p = Path(path).expanduser()
    if not p.is_file():
        raise DatasetFormatError(f"path: expected an existing JSON/JSONL file, got {str(p)!r}")
    check_int("limit", limit, 1, none_ok=True, error=DatasetFormatError)
    recs = _records(p)
    if not isinstance(recs, list):
        raise DatasetFormatError(f"{p}: expected a list of records, got {type(recs).__name__}")
    items: list[LongQAItem] = []
    for i, r in enumerate(recs):
        where = f"{p}: record {i}"
        if not isinstance(r, dict):
            raise DatasetFormatError(f"{where}: expected an object, got {type(r).__name__}")
        for f in ("context", "input"):
            if not isinstance(r.get(f), str):
                raise DatasetFormatError(f"{where}: field {f!r}: expected str, got {type(r.get(f)).__name__}")
        ans = r.get("answers")
        if isinstance(ans, str):
            ans = [ans]
        if not isinstance(ans, list) or not ans or not all(isinstance(a, (str, int, float)) for a in ans):
            raise DatasetFormatError(f"{where}: field 'answers': expected a non-empty list of str, got {ans!r}")
        ds = r.get("dataset")
        if dataset is not None and ds != dataset:
            continue
        length = r.get("length")
        mk = r.get("memkern") if isinstance(r.get("memkern"), dict) else {}
        items.append(LongQAItem(
            item_id=str(r.get("_id", r.get("id", f"{p.stem}-{i}"))),
            context=r["context"], question=r["input"], answers=[str(a) for a in ans],
            task=str(ds) if ds else p.stem,
            length=int(length) if isinstance(length, (int, float)) and not isinstance(length, bool) else -1,
            n_tokens=int(mk.get("n_tokens", -1)),
            evidence=list(mk.get("evidence") or r.get("supporting_facts") or r.get("evidence") or []),
            seed=mk.get("seed"),
            meta={**(mk.get("meta") or {}), **{k: v for k, v in r.items() if k not in _KNOWN and k != "memkern"}}))
        if limit is not None and len(items) >= limit:
            break
    return items


def longqa_record(item: LongQAItem) -> dict:
    """``item`` in the published record format (extra memkern fields under ``memkern``)."""
    return {"_id": item.item_id, "input": item.question, "context": item.context, "answers": list(item.answers),
            "length": item.length, "dataset": item.task,
            "memkern": {"n_tokens": item.n_tokens, "evidence": item.evidence, "seed": item.seed,
                        "meta": item.meta}}


def save_longqa(items: Iterable[LongQAItem], path: str | os.PathLike) -> Path:
    """Write items as JSON Lines in the published format; returns the path."""
    p = Path(path).expanduser()
    p.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(longqa_record(it), ensure_ascii=False) + "\n" for it in items)
    atomic_write(p, text)
    return p
