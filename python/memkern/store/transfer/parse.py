"""Reading and checking an export file (format: :mod:`memkern.store.transfer`).

Import reads and checks **every** line first (JSON within the document bounds of
:mod:`memkern.base.validate`, types, UTF-8, the field bounds, ids unique and ascending, versions
1..n, embedding size = ``dim``, finite vectors within the norm bound, topic <-> turn links both ways
with each topic before its turns, reranker files that load as a reranker of ``dim``
(:func:`memkern.score.reranker.read_state_bytes`) and their checksums, the trailer's counts) and
writes nothing if any check fails; errors name the line and the field.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from ...base.paths import check_namespace
from ...base.validate import check_namespace_str, check_text, check_time, parse_json, short
from ...errors import MemkernError, MemkernTypeError, MemkernValueError, bad_arg
from ..checks import MAX_ID, MAX_NORM, check_meta, check_summary, check_turns
from .format import FORMAT, FORMAT_VERSION, OPS, RERANKER_FILES

__all__ = ["ExportVersion", "ExportRecord", "ParsedExport", "Line", "parse", "check_record", "check_reranker_data"]



@dataclass
class ExportVersion:
    """One checked version of a record line (``embedding``: float32 ``[dim]``, ``None`` until
    re-embedded for a file without embeddings)."""

    version: int
    op: str
    summary: str
    turns: list
    meta: dict
    updated_at: float
    embedding: np.ndarray | None


@dataclass
class ExportRecord:
    """One checked record line (``versions``: its :class:`ExportVersion` list, oldest first)."""

    id: int
    namespace: str
    level: str
    topic_id: int | None
    turn_ids: list
    status: str
    reason: str | None
    created_at: float
    updated_at: float
    event_time: float | None
    versions: list


@dataclass
class ParsedExport:
    """A checked export file: the header's fields, the :class:`ExportRecord` list (ascending ids)
    and the reranker files as ``(namespace, file kind, bytes)``."""

    dim: int
    metric: str
    embeddings: bool
    namespaces: list
    records: list = field(default_factory=list)
    rerankers: list = field(default_factory=list)  # (namespace, file kind, bytes)


class Line:
    """Check helpers that name the source line and the field."""

    def __init__(self, src: str, lineno: int):
        self.where = f"{src}: line {lineno}"

    def fail(self, name: str, expected: str, got: Any, cls: type = MemkernValueError) -> MemkernError:
        return cls(f"{self.where}: {name}: expected {expected}, got {got!r}")

    def wrap(self, exc: MemkernError) -> MemkernError:
        return type(exc)(f"{self.where}: {exc.args[0] if exc.args else exc}")

    def get(self, d: dict, key: str, types: tuple, what: str, none_ok: bool = False) -> Any:
        if key not in d:
            raise self.fail(key, what, "nothing (missing)")
        v = d[key]
        if v is None and none_ok:
            return None
        if isinstance(v, bool) and bool not in types or not isinstance(v, types):
            shown = short(v) if isinstance(v, (int, float)) else (v[:80] if isinstance(v, str) else
                                                                  None if v is None else type(v).__name__)
            raise self.fail(key, what, shown)
        return v

    def time(self, d: dict, key: str, none_ok: bool = False) -> float | None:
        """Unix seconds within the time bounds (:func:`memkern.base.validate.check_time`)."""
        if key not in d:
            raise self.fail(key, "unix seconds", "nothing (missing)")
        try:
            return check_time(key, d[key], none_ok=none_ok)
        except MemkernError as e:
            raise self.wrap(e) from None

    def text(self, d: dict, key: str, what: str, **kw: Any) -> Any:
        """A str field within the text bounds (:func:`memkern.base.validate.check_text`)."""
        if key not in d:
            raise self.fail(key, what, "nothing (missing)")
        try:
            return check_text(key, d[key], **kw)
        except MemkernError as e:
            raise self.wrap(e) from None


def _read_lines(source: Any) -> tuple[str, Iterable[str]]:
    if isinstance(source, (str, os.PathLike)):
        p = Path(source)
        if not p.is_file():
            raise bad_arg("source", "an export file (JSON Lines)", str(p))
        return str(p), p.read_text(encoding="utf-8", errors="strict").split("\n")
    if hasattr(source, "read"):
        data = source.read()
        if isinstance(data, (bytes, bytearray)):
            data = bytes(data).decode("utf-8", errors="strict")
        if not isinstance(data, str):
            raise bad_arg("source", "a text file object", type(data).__name__, MemkernTypeError)
        return str(getattr(source, "name", "<stream>")), data.split("\n")
    raise bad_arg("source", "a file path or a text file object", type(source).__name__, MemkernTypeError)


def parse(source: Any) -> ParsedExport:
    try:
        src, lines = _read_lines(source)
    except UnicodeDecodeError as e:
        raise MemkernValueError(f"source: expected UTF-8 text, got invalid bytes at offset {e.start}") from None
    if lines and lines[-1] == "":
        lines = lines[:-1]
    if not lines:
        raise MemkernValueError(f"{src}: expected a memkern export (header line first), got an empty file")
    objs = []
    for i, text in enumerate(lines, start=1):
        L = Line(src, i)
        obj = parse_json(text, L.where, "one JSON object")
        if not isinstance(obj, dict):
            raise L.fail("line", "a JSON object", type(obj).__name__)
        objs.append((L, obj))
    L, h = objs[0]
    if h.get("kind") != "header" or h.get("format") != FORMAT:
        raise L.fail("header", f'{{"kind": "header", "format": "{FORMAT}", ...}} as the first line',
                     {k: h.get(k) for k in ("kind", "format")})
    fv = L.get(h, "format_version", (int,), f"{FORMAT_VERSION}")
    if fv != FORMAT_VERSION:
        raise L.fail("format_version", f"{FORMAT_VERSION} (this memkern reads version {FORMAT_VERSION})", fv)
    dim = L.get(h, "dim", (int,), "an int in 1..65536")
    if not 1 <= dim <= 65536:
        raise L.fail("dim", "an int in 1..65536", dim)
    metric = L.get(h, "metric", (str,), '"ip", "l2" or "cos"')
    if metric not in ("ip", "l2", "cos"):
        raise L.fail("metric", '"ip", "l2" or "cos"', metric)
    has_emb = L.get(h, "embeddings", (bool,), "true or false")
    nss = L.get(h, "namespaces", (list,), "a list of namespace names")
    for j, ns in enumerate(nss):
        if not isinstance(ns, str) or not ns:
            raise L.fail(f"namespaces[{j}]", "a non-empty str", ns if not isinstance(ns, (list, dict)) else type(ns).__name__)
        try:
            check_namespace_str(ns)
        except MemkernError as e:
            raise L.wrap(type(e)(f"namespaces[{j}]{str(e)[len('namespace'):]}")) from None
    if len(set(nss)) != len(nss):
        raise L.fail("namespaces", "distinct names", [n for n in nss if nss.count(n) > 1][:3])
    out = ParsedExport(dim, metric, has_emb, list(nss))
    seen: dict[int, ExportRecord] = {}
    end = None
    last_id = -1
    for L, obj in objs[1:]:
        if end is not None:
            raise L.fail("line", "nothing after the end line", str(obj.get("kind"))[:40])
        kind = obj.get("kind")
        if not isinstance(kind, str):
            raise L.fail("kind", '"record", "reranker" or "end"', kind if not isinstance(kind, (list, dict)) else
                         type(kind).__name__)
        if kind == "record":
            rec = check_record(L, obj, out)
            if rec.id in seen:
                raise L.fail("id", "ids unique in the file", rec.id)
            if rec.id <= last_id:
                raise L.fail("id", f"ascending ids (after {last_id})", rec.id)
            last_id = rec.id
            seen[rec.id] = rec
            out.records.append(rec)
        elif kind == "reranker":
            out.rerankers.append(_check_reranker(L, obj, out))
        elif kind == "end":
            end = (L, obj)
        else:
            raise L.fail("kind", '"record", "reranker" or "end"', kind[:40])
    if end is None:
        raise MemkernValueError(f"{src}: expected an end line (the file is truncated?), got {len(lines)} lines "
                                "without one")
    L, e = end
    if L.get(e, "records", (int,), "the number of record lines") != len(out.records):
        raise L.fail("records", f"{len(out.records)} (the record lines in the file)", e["records"])
    if L.get(e, "rerankers", (int,), "the number of reranker lines") != len(out.rerankers):
        raise L.fail("rerankers", f"{len(out.rerankers)} (the reranker lines in the file)", e["rerankers"])
    _check_links(src, out.records, seen)
    return out


def _check_vector(L: Line, text: Any, name: str, dim: int, metric: str) -> np.ndarray:
    if not isinstance(text, str):
        raise L.fail(name, f"base64 of {dim} little-endian float32", type(text).__name__)
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise L.fail(name, "base64 text", text[:40]) from None
    if len(raw) != 4 * dim:
        raise L.fail(name, f"{dim} float32 values ({4 * dim} bytes) for dim={dim} (dim mismatch?)",
                     f"{len(raw)} bytes ({len(raw) / 4:g} values)")
    v = np.frombuffer(raw, dtype="<f4").astype(np.float32)
    if not np.isfinite(v).all():
        raise L.fail(name, "finite values", "NaN or inf")
    norm = float(np.sqrt(np.square(v, dtype=np.float64).sum()))
    if norm > MAX_NORM:
        raise L.fail(name, f"an L2 norm <= {MAX_NORM:g}", f"norm {norm:.3g}")
    if metric == "cos" and norm == 0:
        raise L.fail(name, 'a nonzero vector (metric "cos")', "a zero vector")
    return v


def check_record(L: Line, d: dict, out: ParsedExport) -> ExportRecord:
    rid = L.get(d, "id", (int,), "an int in 0..2**63-1")
    if not 0 <= rid <= MAX_ID:
        raise L.fail("id", "an int in 0..2**63-1", rid)
    ns = L.get(d, "namespace", (str,), "a non-empty str")
    if ns not in out.namespaces:
        raise L.fail("namespace", f"one of the header's namespaces {out.namespaces}", ns)
    level = L.get(d, "level", (str,), '"topic" or "turn"')
    if level not in ("topic", "turn"):
        raise L.fail("level", '"topic" or "turn"', level)
    topic_id = L.get(d, "topic_id", (int,), "an int (turn records) or null (topics)", none_ok=True)
    if (level == "turn") != (topic_id is not None):
        raise L.fail("topic_id", "an int for a turn record and null for a topic", topic_id)
    if topic_id is not None and not 0 <= topic_id < rid:
        raise L.fail("topic_id", f"the id of a topic record before this turn (0..{rid - 1})", topic_id)
    turn_ids = L.get(d, "turn_ids", (list,), "a list of ints")
    if any(isinstance(c, bool) or not isinstance(c, int) or not 0 <= c <= MAX_ID for c in turn_ids):
        raise L.fail("turn_ids", "a list of ids (ints in 0..2**63-1)", _few(turn_ids))
    if level == "turn" and turn_ids:
        raise L.fail("turn_ids", "[] for a turn record", turn_ids)
    status = L.get(d, "status", (str,), '"active" or "invalidated"')
    if status not in ("active", "invalidated"):
        raise L.fail("status", '"active" or "invalidated"', status)
    reason = L.get(d, "reason", (str,), "a str (invalidated records) or null", none_ok=True)
    if status == "invalidated" and reason is None:
        raise L.fail("reason", "a str for an invalidated record", None)
    if reason is not None:
        if status != "invalidated":
            raise L.fail("reason", "null for an active record", reason[:80])
        L.text(d, "reason", "a str")
    created = L.time(d, "created_at")
    updated = L.time(d, "updated_at")
    event = L.time(d, "event_time", none_ok=True) if "event_time" in d else None
    vs = L.get(d, "versions", (list,), "a non-empty list of versions")
    if not vs:
        raise L.fail("versions", "a non-empty list of versions", vs)
    versions = []
    for j, v in enumerate(vs):
        name = f"versions[{j}]"
        if not isinstance(v, dict):
            raise L.fail(name, "an object", type(v).__name__)
        num = L.get(v, "version", (int,), f"{j + 1}")
        if num != j + 1:
            raise L.fail(f"{name}.version", f"{j + 1} (versions numbered 1..n, oldest first)", num)
        op = L.get(v, "op", (str,), '"add", "merge" or "update"')
        if op not in OPS or (j == 0) != (op == "add"):
            raise L.fail(f"{name}.op", '"add" for version 1, "merge" or "update" after', op)
        try:
            summary = check_summary(L.get(v, "summary", (str,), "a str"), f"{name}.summary")
            turns = check_turns(L.get(v, "turns", (list,), "a list of turn dicts"), f"{name}.turns")
            meta = check_meta(L.get(v, "meta", (dict,), "an object"), f"{name}.meta")
        except MemkernError as e:
            raise L.wrap(e) from None
        if level == "turn" and len(turns) != 1:
            raise L.fail(f"{name}.turns", "one turn for a turn record", f"{len(turns)} turns")
        t = L.time(v, "updated_at")
        emb = None
        if out.embeddings:
            if "embedding" not in v:
                raise L.fail(f"{name}.embedding", "a vector (the header says embeddings: true)", "nothing")
            emb = _check_vector(L, v["embedding"], f"{name}.embedding", out.dim, out.metric)
        elif "embedding" in v:
            raise L.fail(f"{name}.embedding", "no vector (the header says embeddings: false)", "a vector")
        versions.append(ExportVersion(num, op, summary, turns, meta, t, emb))
    return ExportRecord(rid, ns, level, topic_id, list(turn_ids), status, reason, created, updated, event, versions)


def _check_reranker(L: Line, d: dict, out: ParsedExport) -> tuple[str, str, bytes]:
    ns = L.get(d, "namespace", (str,), "a namespace name")
    try:
        check_namespace(ns)
    except MemkernError as e:
        raise L.wrap(e) from None
    if ns not in out.namespaces:
        raise L.fail("namespace", f"one of the header's namespaces {out.namespaces}", ns)
    kind = L.get(d, "file", (str,), '"state" or "buffer"')
    if kind not in RERANKER_FILES:
        raise L.fail("file", '"state" or "buffer"', kind)
    if any(k == ns and f == kind for k, f, _ in out.rerankers):
        raise L.fail("file", f"one {kind!r} file per namespace", f"a second one for {ns!r}")
    try:
        data = base64.b64decode(L.get(d, "data", (str,), "base64 text").encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise L.fail("data", "base64 text", str(d["data"])[:40]) from None
    digest = L.get(d, "sha256", (str,), "a hex SHA-256")
    if hashlib.sha256(data).hexdigest() != digest:
        raise L.fail("sha256", f"the SHA-256 of data ({hashlib.sha256(data).hexdigest()})", digest[:80])
    try:
        check_reranker_data(data, kind, out.dim, "data")
    except MemkernError as e:
        raise L.wrap(e) from None
    return ns, kind, data


def check_reranker_data(data: bytes, kind: str, dim: int, name: str) -> None:
    """The bytes of a reranker file must load as what their kind says: a reranker state of ``dim``
    (:func:`memkern.score.reranker.read_state_bytes`) or a reward buffer
    (:func:`memkern.score.reranker.read_buffer_bytes`); MemkernValueError naming ``name`` otherwise."""
    from ...score.reranker import read_buffer_bytes, read_state_bytes

    if kind == "state":
        read_state_bytes(data, dim, name)
    else:
        read_buffer_bytes(data, dim, name)


def _check_links(src: str, records: list[ExportRecord], by_id: dict[int, ExportRecord]) -> None:
    for r in records:
        if r.level == "turn":
            t = by_id.get(r.topic_id)
            if t is None or t.level != "topic" or t.namespace != r.namespace or r.id not in t.turn_ids:
                raise MemkernValueError(f"{src}: record {r.id}: topic_id: expected a topic record of namespace "
                                        f"{r.namespace!r} in the file listing it in turn_ids, got {r.topic_id}")
            if t.status == "invalidated" and r.status != "invalidated":
                raise MemkernValueError(f"{src}: record {r.id}: status: expected \"invalidated\" (its topic "
                                        f"{t.id} is invalidated), got {r.status!r}")
        else:
            kids = [c for c in r.turn_ids]
            if kids != sorted(set(kids)) or any(by_id.get(c) is None or by_id[c].topic_id != r.id for c in kids):
                raise MemkernValueError(f"{src}: record {r.id}: turn_ids: expected ascending ids of turn records of "
                                        f"this topic in the file, got {_few(kids)}")


def _few(xs: list, n: int = 8) -> Any:
    """A list as an error message shows it (the first ``n`` items)."""
    return xs if len(xs) <= n else f"{xs[:n]} ... ({len(xs)} items)"


# ----------------------------------------------------------------------------------- writing
