"""Export and import of a store as JSON Lines (``memkern export`` / ``memkern import``).

File format (UTF-8, one JSON object per line, ``format_version`` 1):

1. Header: ``{"kind": "header", "format": "memkern-export", "format_version": 1, "dim": d,
   "metric": "ip"|"l2"|"cos", "embeddings": true|false, "namespaces": [...], "memkern_version": ...}``.
2. One line per record (topic and turn records), ascending id::

     {"kind": "record", "id": 7, "namespace": "alice", "level": "topic"|"turn",
      "topic_id": null|int, "turn_ids": [int, ...], "status": "active"|"invalidated",
      "reason": null|str, "created_at": float, "updated_at": float, "event_time": float (if set),
      "versions": [{"version": 1, "op": "add"|"merge"|"update", "summary": str, "turns": [...],
                    "meta": {...}, "updated_at": float, "embedding": "<base64>"}, ...]}

   ``versions`` is the whole history, oldest first, the last one current. ``embedding`` is the
   stored float32 vector, little-endian, base64 (exact bits); it is absent with
   ``embeddings=False``.
3. One line per reranker file of an exported namespace (``<store>/rerankers/<ns>.pt`` and
   ``<ns>.buffer.pt``, see :func:`memkern.base.paths.reranker_file`): ``{"kind": "reranker",
   "namespace": ns, "file": "state"|"buffer", "sha256": hex, "data": "<base64>"}`` (the bytes as
   they are).
4. Trailer: ``{"kind": "end", "records": n, "rerankers": m}`` (a truncated file is refused).

Import (:func:`import_store`) reads and checks **every** line first (JSON within the document
bounds of :mod:`memkern.base.validate`, types, UTF-8, the field bounds, ids unique and ascending,
versions 1..n, embedding size = ``dim``, finite vectors within the norm bound, topic <-> turn
links both ways with each topic before its turns, reranker files that load as a reranker of
``dim`` (:func:`memkern.score.reranker.read_state_bytes`) and their checksums, the trailer's counts)
and writes nothing if any check fails; errors name the line and the field.

Export writes its file through :func:`memkern.base.atomic.atomic_write` (mode 0600) and refuses a path
inside a store folder (:func:`memkern.base.paths.check_outside_stores`: symbolic links, hard links and
case folding included), so it can never overwrite a store's own files. A reranker file of the
store that is not a valid reranker is left out (logged).

Atomicity: a failure or a kill at any point leaves the target as it was, at worst with a
``.<name>.import-*`` directory beside it (removable; never read).

* A new store (the path is absent or an empty directory): the whole store (records, a snapshot,
  the reranker files) is built in a hidden directory beside the target, fsynced and renamed into
  place.
* An existing store: the file's namespaces are *added* (a namespace the store already holds, or
  has reranker files for, is refused: an import never merges into a namespace). With the store
  held open (its lock keeps every other writer out), its files are copied beside it, the import
  goes into the copy, and the two directories are swapped in one step
  (``renameat2(RENAME_EXCHANGE)``, Linux); the old one is then removed. This costs a copy of the
  store. The store must not be open elsewhere (its lock is taken).
* An :class:`~memkern.InMemoryStore` that has never been written: the records are built into a
  fresh one that replaces its content in one step.

Ids: a new store takes the file's ids exactly (its ids are assigned in order, so the import fills
the id gaps left by deleted records with placeholder records that it deletes and compacts away);
should the gaps outnumber the records by far (more than ``4 * records + 4096``), ids are
renumbered in the file's order instead and every link (``topic_id``, ``turn_ids``) follows the
map, which :func:`import_store` returns. An existing store numbers the imported records after
its own (renumbered, links following).

What a round trip keeps exactly: namespaces, ids (see above), levels and topic <-> turn links,
``event_time``,
every version (number, op, summary, turns, meta, embedding bits), status and invalidation reason,
and the reranker files. (Metric ``"cos"``: a store normalises what it is given, so the import
gives it, for each unit vector, an input that normalises back to the same bits; the rare vector
with no such input, counted in ``ImportResult.inexact_vectors``, lands one ulp away.) What it does not: ``created_at`` / ``updated_at`` are the store's own
clock (a store sets them when a record is written), so imported records carry the import time;
the exported values stay in the file.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import io
import json
import logging
import math
import os
import secrets
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from ...base.atomic import atomic_write, fsync_dir
from ...errors import MemkernError, MemkernKeyError, MemkernTypeError, MemkernValueError, bad_arg
from ...base.paths import check_namespace, check_outside_stores, reranker_file
from ..checks import MAX_NORM, check_meta, check_summary, check_turns
from ..engine import MemoryStore
from ...base.validate import check_namespace_str, check_text, check_time, json_text, parse_json, short

log = logging.getLogger("memkern")

__all__ = ["export_store", "import_store", "export_records", "import_records", "ImportResult", "FORMAT",
           "FORMAT_VERSION"]

FORMAT = "memkern-export"
FORMAT_VERSION = 1
_OPS = {"add": 0, "merge": 1, "update": 2}


def _native_enums():
    """The native module (its ``Level`` / ``Op`` enums: the typed contract of ``_store.pyi``)."""
    from ... import _store

    return _store

_RERANKER_FILES = {"state": ".pt", "buffer": ".buffer.pt"}
_MAX_ID = (1 << 63) - 1
_NO_TIMES = np.zeros(0, dtype=np.float64)  # the native "no event times" (NaN per item means none)


def _b64(vec: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(vec, dtype="<f4").tobytes()).decode("ascii")


def _native(store: MemoryStore):
    # The store's native layer (MemoryStore.native): the export needs each version's op, the import
    # needs to add turn records under an existing topic and to write a version with a given op,
    # which the public API does not.
    return store.native


# ----------------------------------------------------------------------------------- export


def export_store(store: MemoryStore | str | os.PathLike, out: str | os.PathLike | io.TextIOBase, *,
                 namespaces: Sequence[str] | None = None, embeddings: bool = True) -> dict:
    """Write ``store`` (a :class:`~memkern.MemoryStore`, an :class:`~memkern.InMemoryStore`, or a
    store directory, opened and closed here) to ``out`` as JSON Lines (format in the module
    docstring). A path is written through a temporary file renamed into place.

    Parameters
    ----------
    namespaces : list of str, optional
        Only these namespaces (each must hold records); default all.
    embeddings : bool
        Include the stored vectors (exact float32); without them an import re-embeds the texts.

    Returns
    -------
    dict with ``records``, ``namespaces``, ``rerankers`` (counts and names written).
    """
    if not isinstance(embeddings, bool):
        raise bad_arg("embeddings", "a bool", type(embeddings).__name__, MemkernTypeError)
    if isinstance(store, MemoryStore):
        return _export(store, out, namespaces, embeddings)
    if not isinstance(store, (str, os.PathLike)):
        raise bad_arg("store", "a MemoryStore, an InMemoryStore or a store directory", type(store).__name__,
                      MemkernTypeError)
    p = Path(store)
    if not ((p / "CURRENT").exists() or (p / "wal.log").exists()):
        raise bad_arg("store", "an existing memkern store directory", str(p))
    with MemoryStore(p) as s:
        return _export(s, out, namespaces, embeddings)


def _export(store: MemoryStore, out: Any, namespaces: Sequence[str] | None, embeddings: bool) -> dict:
    have = store.namespaces()
    if namespaces is None:
        chosen = list(have)
    else:
        if isinstance(namespaces, str) or not isinstance(namespaces, Sequence):
            raise bad_arg("namespaces", "a list of namespace names or None", type(namespaces).__name__,
                          MemkernTypeError)
        chosen = []
        for ns in namespaces:
            if ns not in have:
                raise MemkernKeyError(f"namespaces: unknown namespace {ns!r} (the store holds {have})")
            if ns not in chosen:
                chosen.append(ns)
    if isinstance(out, (str, os.PathLike)):
        path = check_outside_stores(out, store.path, arg="out")
        stats: dict = {}

        def write(f: Any) -> None:
            text = io.TextIOWrapper(f, encoding="utf-8", newline="\n")
            stats.update(_write(store, text, chosen, embeddings))
            text.flush()
            text.detach()

        atomic_write(path, write)
        return stats
    if not hasattr(out, "write"):
        raise bad_arg("out", "a file path or a text file object", type(out).__name__, MemkernTypeError)
    return _write(store, out, chosen, embeddings)


def _write(store: MemoryStore, f: Any, namespaces: list[str], embeddings: bool) -> dict:
    from ...base.version import __version__

    n = _native(store)
    header = {"kind": "header", "format": FORMAT, "format_version": FORMAT_VERSION, "dim": store.dim,
              "metric": store.metric, "embeddings": embeddings, "namespaces": namespaces,
              "memkern_version": __version__}
    f.write(json.dumps(header, ensure_ascii=False) + "\n")
    ids = []
    for ns in namespaces:
        for level in ("topic", "turn"):
            ids.extend(int(i) for i in store.ids(ns, include_invalidated=True, level=level))
    ids.sort()
    count = 0
    for start in range(0, len(ids), 512):
        for rec in export_records(store, ids[start:start + 512], embeddings):
            f.write(json.dumps(rec, ensure_ascii=False, allow_nan=False) + "\n")
            count += 1
    rerankers = []
    if store.path is not None:
        for ns in namespaces:
            try:
                check_namespace(ns)
            except MemkernError:
                continue  # a name that cannot have reranker files
            for kind, suffix in _RERANKER_FILES.items():
                p = reranker_file(store.path, ns, suffix)
                if p.is_file():
                    data = p.read_bytes()
                    try:
                        _check_reranker_data(data, kind, store.dim, str(p))
                    except MemkernValueError as e:
                        log.warning("export: leaving out %s, not a valid reranker file (%s)", p, e)
                        continue
                    f.write(json.dumps({"kind": "reranker", "namespace": ns, "file": kind,
                                        "sha256": hashlib.sha256(data).hexdigest(),
                                        "data": base64.b64encode(data).decode("ascii")}) + "\n")
                    rerankers.append(f"{ns}{suffix}")
    f.write(json.dumps({"kind": "end", "records": count, "rerankers": len(rerankers)}) + "\n")
    return {"records": count, "namespaces": list(namespaces), "rerankers": rerankers}


def export_records(store: MemoryStore, ids: Sequence[int], embeddings: bool = True) -> list[dict]:
    """The records ``ids`` of ``store`` as record lines of the export format (module docstring):
    ``{"kind": "record", "id", "namespace", "level", "topic_id", "turn_ids", "status", "reason",
    "created_at", "updated_at", "event_time"?, "versions": [...]}`` with the whole version history,
    each version's vector as base64 of its float32 bits. :func:`import_records` writes them back
    with their ids (the rebalance of a :class:`~memkern.distributed.ShardedStore` moves records so)."""
    n = _native(store)
    out = []
    for d in n.get_batch(np.asarray(list(ids), dtype=np.int64)):
        versions = []
        for v in n.history(int(d.id)):
            ver = {"version": int(v.version), "op": v.op.name, "summary": v.summary,
                   "turns": json.loads(v.turns_json), "meta": json.loads(v.meta_json),
                   "updated_at": float(v.updated_at)}
            if embeddings:
                ver["embedding"] = _b64(np.asarray(v.embedding, dtype=np.float32))
            versions.append(ver)
        status = d.status.name
        rec = {"kind": "record", "id": int(d.id), "namespace": d.namespace, "level": d.level.name,
               "topic_id": int(d.parent) if d.parent >= 0 else None,
               "turn_ids": [int(c) for c in d.children], "status": status,
               "reason": d.reason if status == "invalidated" else None,
               "created_at": float(d.created_at), "updated_at": float(d.updated_at)}
        if d.event_time is not None:
            rec["event_time"] = float(d.event_time)
        rec["versions"] = versions
        out.append(rec)
    return out


def import_records(store: MemoryStore, namespace: str, records: Sequence[dict]) -> int:
    """Write ``records`` (record lines of the export format, with embeddings, e.g. from
    :func:`export_records`) into the open ``store``'s ``namespace`` keeping each record's id, its
    whole version history (ops, texts, vectors as their exact bits, ``updated_at`` of every
    version), ``created_at`` / ``updated_at``, ``event_time``, status and reason, and the topic <->
    turn links: one atomic, logged write (the native ``import_records``; crash-safe like ``add``).

    Every record is checked first (as a file's lines are); the store refuses an id it holds, one it
    deleted and has not compacted away yet, and one in its own unused id range (which it would hand
    out later): :class:`~memkern.MemkernKeyError` / :class:`~memkern.MemkernValueError`, nothing
    written. A turn's topic is in ``records`` or already in the namespace. Returns the records written.
    """
    if isinstance(records, (str, bytes, dict)) or not isinstance(records, Sequence):
        raise bad_arg("records", "a list of record dicts (export format)", type(records).__name__, MemkernTypeError)
    parsed = _Parsed(store.dim, store.metric, True, [namespace])
    recs: list[_Record] = []
    for i, d in enumerate(records):
        L = _Line("records", i)
        L.where = f"records[{i}]"
        if not isinstance(d, dict):
            raise L.fail("record", "a dict", type(d).__name__, MemkernTypeError)
        recs.append(_check_record(L, d, parsed))
    if not recs:
        return 0
    # topics first, then each topic's turns in its turn_ids order (the order its children keep)
    by_id = {r.id: r for r in recs}
    order = [r for r in recs if r.level == "topic"]
    placed = {r.id for r in order}
    for t in list(order):
        for c in t.turn_ids:
            if c in by_id and c not in placed and by_id[c].level == "turn":
                order.append(by_id[c])
                placed.add(c)
    order += [r for r in recs if r.id not in placed]
    vecs = np.stack([v.embedding for r in order for v in r.versions]).astype(np.float32)
    levels = _native_enums().Level
    _native(store).import_records(
        namespace, np.array([r.id for r in order], np.int64),
        np.array([int(getattr(levels, r.level)) for r in order], np.uint8),
        np.array([-1 if r.topic_id is None else r.topic_id for r in order], np.int64),
        np.array([r.status == "invalidated" for r in order], np.uint8), [r.reason or "" for r in order],
        np.array([r.created_at for r in order], np.float64), np.array([r.updated_at for r in order], np.float64),
        np.array([math.nan if r.event_time is None else r.event_time for r in order], np.float64),
        [[(_OPS[v.op], v.summary, json_text(v.turns, "turns"), json_text(v.meta, "meta"), v.updated_at)
          for v in r.versions] for r in order], vecs)
    return len(order)


# ----------------------------------------------------------------------------------- reading + checks


@dataclass
class _Version:
    version: int
    op: str
    summary: str
    turns: list
    meta: dict
    updated_at: float
    embedding: np.ndarray | None


@dataclass
class _Record:
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
class _Parsed:
    dim: int
    metric: str
    embeddings: bool
    namespaces: list
    records: list = field(default_factory=list)
    rerankers: list = field(default_factory=list)  # (namespace, file kind, bytes)


class _Line:
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


def _parse(source: Any) -> _Parsed:
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
        L = _Line(src, i)
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
    out = _Parsed(dim, metric, has_emb, list(nss))
    seen: dict[int, _Record] = {}
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
            rec = _check_record(L, obj, out)
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


def _check_vector(L: _Line, text: Any, name: str, dim: int, metric: str) -> np.ndarray:
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


def _check_record(L: _Line, d: dict, out: _Parsed) -> _Record:
    rid = L.get(d, "id", (int,), "an int in 0..2**63-1")
    if not 0 <= rid <= _MAX_ID:
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
    if any(isinstance(c, bool) or not isinstance(c, int) or not 0 <= c <= _MAX_ID for c in turn_ids):
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
        if op not in _OPS or (j == 0) != (op == "add"):
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
        versions.append(_Version(num, op, summary, turns, meta, t, emb))
    return _Record(rid, ns, level, topic_id, list(turn_ids), status, reason, created, updated, event, versions)


def _check_reranker(L: _Line, d: dict, out: _Parsed) -> tuple[str, str, bytes]:
    ns = L.get(d, "namespace", (str,), "a namespace name")
    try:
        check_namespace(ns)
    except MemkernError as e:
        raise L.wrap(e) from None
    if ns not in out.namespaces:
        raise L.fail("namespace", f"one of the header's namespaces {out.namespaces}", ns)
    kind = L.get(d, "file", (str,), '"state" or "buffer"')
    if kind not in _RERANKER_FILES:
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
        _check_reranker_data(data, kind, out.dim, "data")
    except MemkernError as e:
        raise L.wrap(e) from None
    return ns, kind, data


def _check_reranker_data(data: bytes, kind: str, dim: int, name: str) -> None:
    """The bytes of a reranker file must load as what their kind says: a reranker state of ``dim``
    (:func:`memkern.score.reranker.read_state_bytes`) or a reward buffer
    (:func:`memkern.score.reranker.read_buffer_bytes`); MemkernValueError naming ``name`` otherwise."""
    from ...score.reranker import read_buffer_bytes, read_state_bytes

    if kind == "state":
        read_state_bytes(data, dim, name)
    else:
        read_buffer_bytes(data, dim, name)


def _check_links(src: str, records: list[_Record], by_id: dict[int, _Record]) -> None:
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


@dataclass
class ImportResult:
    """What :func:`import_store` wrote.

    Attributes
    ----------
    records : int
        Records written (topic and turn records).
    namespaces : list of str
    id_map : dict[int, int]
        File id -> store id (the identity unless the ids had to be renumbered).
    renumbered : bool
    rerankers : list of str
        Reranker files written (``<namespace>.pt`` / ``<namespace>.buffer.pt``); none for an
        InMemoryStore (it keeps no files; ``rerankers_skipped`` lists them).
    path : str or None
    inexact_vectors : int
        Metric "cos" only: vectors stored one ulp away from the file's bits (no float32 input
        normalises to them exactly; about 1 in 500 at d <= 8, none seen at d >= 64).
    """

    records: int
    namespaces: list
    id_map: dict
    renumbered: bool
    rerankers: list
    rerankers_skipped: list
    path: str | None
    inexact_vectors: int = 0


def _embed_missing(parsed: _Parsed, embedder: Any) -> None:
    if parsed.embeddings:
        return
    if embedder is None or not hasattr(embedder, "encode"):
        raise bad_arg("embedder", "an Embedder (the file was exported without embeddings, so the texts are "
                      "embedded again)", embedder)
    if getattr(embedder, "dim", parsed.dim) != parsed.dim:
        raise bad_arg("embedder.dim", f"the file's dim ({parsed.dim})", getattr(embedder, "dim", None))
    texts = [v.summary for r in parsed.records for v in r.versions]
    emb = np.asarray(embedder.encode(texts, kind="passage")) if texts else np.zeros((0, parsed.dim), np.float32)
    if emb.shape != (len(texts), parsed.dim) or not np.isfinite(emb).all():
        raise bad_arg("embedder.encode(...)", f"finite float32 [{len(texts)}, {parsed.dim}]", tuple(emb.shape))
    emb = emb.astype(np.float32)
    norms = np.sqrt(np.square(emb, dtype=np.float64).sum(axis=1)) if len(emb) else np.zeros(0)
    if len(emb) and (norms.max() > MAX_NORM or (parsed.metric == "cos" and (norms == 0).any())):
        raise bad_arg("embedder.encode(...)", "vectors within the store's norm rules", "a zero or huge vector")
    j = 0
    for r in parsed.records:
        for v in r.versions:
            v.embedding = emb[j]
            j += 1


def _exact_inputs(parsed: _Parsed) -> int:
    """For metric "cos", replace each stored unit vector by an input the store normalises back to
    exactly those bits (a store renormalises what it is given, which moves ~15% of unit vectors by
    one ulp). Returns how many vectors have no such input (they may differ by one ulp)."""
    if parsed.metric != "cos" or not parsed.embeddings:
        return 0
    from ..memory import _cos_preimage

    inexact = 0
    for r in parsed.records:
        for v in r.versions:
            x = _cos_preimage(v.embedding)
            if x is None:
                inexact += 1
            else:
                v.embedding = x
    return inexact


def _write_records(store: MemoryStore, parsed: _Parsed, renumber: bool = False) -> tuple[dict, bool]:
    """Write the checked records into ``store`` (fresh unless ``renumber``); returns (id map, renumbered)."""
    n = _native(store)
    recs = parsed.records
    dim = parsed.dim
    max_id = recs[-1].id if recs else -1
    gaps = max_id + 1 - len(recs)
    renumber = renumber or gaps > 4 * len(recs) + 4096
    id_map: dict[int, int] = {}
    scratch = "memkern-import-gaps"
    while scratch in parsed.namespaces:
        scratch += "_"
    placeholder = np.zeros((1, dim), np.float32)
    placeholder[0, 0] = 1.0
    filled: list[int] = []
    next_id = 0
    i = 0
    while i < len(recs):
        r = recs[i]
        if not renumber and r.id > next_id:  # fill the gap with placeholders (deleted below)
            m = r.id - next_id
            got = n.add(scratch, [""] * m, ["[]"] * m, ["{}"] * m, np.repeat(placeholder, m, axis=0),
                        np.zeros(m, np.uint8), np.full(m, -1, np.int64), _NO_TIMES)
            filled.extend(int(x) for x in got)
            next_id = r.id
        # one add call for a run of records of one namespace (first versions), the later versions after
        j = i
        batch: list[_Record] = []
        while j < len(recs) and recs[j].namespace == r.namespace and (renumber or recs[j].id == next_id + len(batch)):
            batch.append(recs[j])
            j += 1
            if len(batch) >= 4096:
                break
        pos = {b.id: k for k, b in enumerate(batch)}
        parents = np.array([-1 if b.topic_id is None else (-2 - pos[b.topic_id] if b.topic_id in pos
                                                              else id_map[b.topic_id]) for b in batch], np.int64)
        first = [b.versions[0] for b in batch]
        times = np.array([math.nan if b.event_time is None else b.event_time for b in batch], np.float64)
        got = n.add(r.namespace, [v.summary for v in first], [json_text(v.turns, "turns") for v in first],
                    [json_text(v.meta, "meta") for v in first], np.stack([v.embedding for v in first]),
                    np.array([int(getattr(_native_enums().Level, b.level)) for b in batch], np.uint8), parents,
                    times if not np.isnan(times).all() else _NO_TIMES)
        for b, new in zip(batch, got):
            id_map[b.id] = int(new)
            if not renumber and int(new) != b.id:
                raise MemkernError(f"import: store id {int(new)} for file id {b.id}: the target store was not new")
        next_id += len(batch)
        empty = np.zeros((0, dim), np.float32)
        for b in batch:
            for v in b.versions[1:]:
                n.new_version(id_map[b.id], getattr(_native_enums().Op, v.op), v.summary, v.embedding[None, :], json_text(v.turns, "turns"),
                              json_text(v.meta, "meta"), [], [], [], empty, False, None, _NO_TIMES)
        i = j
    for x in filled:
        n.delete(x)
    # invalidations: turn records first (their own reasons), then topics (which skip those)
    for level in ("turn", "topic"):
        for r in recs:
            if r.level == level and r.status == "invalidated" and n.get(id_map[r.id]).status.name != "invalidated":
                n.invalidate(id_map[r.id], r.reason)
    if filled:
        store.compact()
    return id_map, renumber


_fsync_dir = fsync_dir


def _write_rerankers(root: Path, parsed: _Parsed) -> list[str]:
    """The file's (checked) reranker files under ``root/rerankers/``, each by one atomic durable
    write; the store folder fsynced."""
    written = []
    for ns, kind, data in parsed.rerankers:
        p = reranker_file(root, ns, _RERANKER_FILES[kind])
        p.parent.mkdir(exist_ok=True)
        atomic_write(p, data)
        written.append(p.name)
    if (root / "rerankers").is_dir():
        fsync_dir(root)
    return written


def _renameat2():
    import ctypes

    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


def _exchange_available() -> None:
    if _renameat2() is None:
        raise MemkernError("store: importing into an existing store swaps two directories atomically "
                           "(renameat2 RENAME_EXCHANGE, Linux), which this system lacks; import into a new path")


def _exchange(a: Path, b: Path) -> None:
    """Swap directories ``a`` and ``b`` in one atomic step (``renameat2(RENAME_EXCHANGE)``)."""
    import ctypes

    at_fdcwd, rename_exchange = -100, 2
    if _renameat2()(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"exchange {a} and {b}: {os.strerror(err)}", str(b))


def _import_into_existing(path: Path, tmp: Path, parsed: _Parsed, store_kwargs: dict) -> tuple[dict, list]:
    """Add the file's namespaces to the store at ``path``, atomically: with the store held open (its
    lock keeps every other writer out), copy its files beside it, import into the copy (ids
    renumbered after the store's own), then swap the two directories in one step."""
    with MemoryStore(path) as live:
        if (live.dim, live.metric) != (parsed.dim, parsed.metric):
            raise bad_arg("store", f"a store of dim={parsed.dim}, metric={parsed.metric!r} (the file's)",
                          f"dim={live.dim}, metric={live.metric!r} (dim mismatch)" if live.dim != parsed.dim
                          else f"metric={live.metric!r}")
        clash = sorted(set(parsed.namespaces) & set(live.namespaces()))
        clash += [ns for ns in parsed.namespaces if ns not in clash and any(
            _has_reranker(path, ns, suffix) for suffix in _RERANKER_FILES.values())]
        if clash:
            raise bad_arg("namespaces", "namespaces the store does not hold yet (an import adds namespaces, it "
                          "never merges into one)", clash)
        if getattr(live.native, "replayed_entries", 0):
            # The copy must be one snapshot, and closing `live` after the swap must write nothing
            # (it would write into the new store's folder): a snapshot now leaves it nothing to do.
            live.snapshot()
        shutil.copytree(path, tmp, ignore=shutil.ignore_patterns("LOCK", "*.tmp"))
        with MemoryStore(tmp, fsync="never", snapshot_every=0, **store_kwargs) as s:
            id_map, _ = _write_records(s, parsed, renumber=True)
            s.snapshot()
        written = _write_rerankers(tmp, parsed)
        _exchange(tmp, path)
        _fsync_dir(path.parent)
    return id_map, written


def _has_reranker(root: Path, ns: str, suffix: str) -> bool:
    try:
        return reranker_file(root, ns, suffix).exists()
    except MemkernError:
        return False


def import_store(target: str | os.PathLike | MemoryStore, source: str | os.PathLike | io.TextIOBase, *,
                 embedder: Any = None, **store_kwargs: Any) -> ImportResult:
    """Import an export file (:func:`export_store`) into a new store, atomically.

    Parameters
    ----------
    target : str, os.PathLike or InMemoryStore
        A store directory: new (absent or empty; built beside it and renamed into place) or an
        existing store (the file's namespaces are added to a copy that is swapped in). Or an
        :class:`~memkern.InMemoryStore` that was never written to. See the module docstring.
    source : str, os.PathLike or text file object
        The JSON Lines file.
    embedder : Embedder, optional
        Needed for a file written without embeddings: every version's text is embedded
        (``kind="passage"``).
    store_kwargs
        Passed to :class:`~memkern.MemoryStore` (e.g. ``M``, ``ef_construction``) for a path.

    Returns
    -------
    ImportResult

    Raises
    ------
    MemkernValueError / MemkernTypeError
        The file fails a check (named by line and field; nothing was written), or the target is
        not a new store.
    """
    from ..memory import InMemoryStore

    if isinstance(target, InMemoryStore):
        n = target.native
        if n.next_id != 0 or target._id_range is not None:
            raise bad_arg("target", "an InMemoryStore without id_range that was never written to (import builds a "
                          "new store)", f"one holding ids up to {n.next_id - 1}" if n.next_id else
                          f"one with id_range={target._id_range}")
        parsed = _parse(source)
        if parsed.dim != target.dim or parsed.metric != target.metric:
            raise bad_arg("target", f"a store of dim={parsed.dim}, metric={parsed.metric!r} (the file's)",
                          f"dim={target.dim}, metric={target.metric!r} (dim mismatch)" if parsed.dim != target.dim
                          else f"metric={target.metric!r}")
        _embed_missing(parsed, embedder)
        inexact = _exact_inputs(parsed)
        fresh = InMemoryStore(parsed.dim, parsed.metric, **target._options)
        id_map, renumbered = _write_records(fresh, parsed)
        target._native, fresh._native = fresh._native, None  # one step: the target shows all of it or none
        return ImportResult(len(parsed.records), parsed.namespaces, id_map, renumbered, [],
                            [f"{ns}{_RERANKER_FILES[k]}" for ns, k, _ in parsed.rerankers], None, inexact)
    if isinstance(target, MemoryStore):
        raise bad_arg("target", "a path for a new store or an empty InMemoryStore (import never writes into an "
                      "open store)", repr(target))
    if not isinstance(target, (str, os.PathLike)):
        raise bad_arg("target", "a store directory path or an InMemoryStore", type(target).__name__,
                      MemkernTypeError)
    path = check_outside_stores(target, arg="store", folder=True)
    existing = path.is_dir() and ((path / "CURRENT").exists() or (path / "wal.log").exists())
    if path.exists() and not existing and (not path.is_dir() or any(path.iterdir())):
        raise bad_arg("store", "a memkern store directory, or a new one (absent or empty)", str(path))
    if existing:
        _exchange_available()
    parsed = _parse(source)
    _embed_missing(parsed, embedder)
    inexact = _exact_inputs(parsed)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.import-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        if existing:
            id_map, written = _import_into_existing(path, tmp, parsed, store_kwargs)
            renumbered = True
        else:
            with MemoryStore(tmp, dim=parsed.dim, metric=parsed.metric, fsync="never", snapshot_every=0,
                             **store_kwargs) as s:
                id_map, renumbered = _write_records(s, parsed)
                s.snapshot()  # everything durable in one snapshot before the rename
            written = _write_rerankers(tmp, parsed)
            os.rename(tmp, path)  # atomic; replaces an empty directory
            _fsync_dir(path.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if existing:
        shutil.rmtree(tmp, ignore_errors=True)  # the store as it was before (swapped out); never read
    return ImportResult(len(parsed.records), parsed.namespaces, id_map, renumbered, written, [], str(path), inexact)
