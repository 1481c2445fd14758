"""Export of a store as JSON Lines (format: :mod:`memkern.store.transfer`).

Export writes its file through :func:`memkern.base.atomic.atomic_write` (mode 0600) and refuses a path
inside a store folder (:func:`memkern.base.paths.check_outside_stores`: symbolic links, hard links and
case folding included), so it can never overwrite a store's own files. A reranker file of the
store that is not a valid reranker is left out (logged).
"""
from __future__ import annotations

import base64
import hashlib
import io
import json
import logging
import os
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from ...base.atomic import atomic_write
from ...base.paths import check_namespace, check_outside_stores, reranker_file
from ...errors import MemkernError, MemkernKeyError, MemkernTypeError, MemkernValueError, bad_arg
from ..engine import MemoryStore
from .format import FORMAT, FORMAT_VERSION, RERANKER_FILES, native
from .parse import check_reranker_data

log = logging.getLogger("memkern")

__all__ = ["export_store", "export_lines", "export_records"]


def _b64(vec: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(vec, dtype="<f4").tobytes()).decode("ascii")


# ----------------------------------------------------------------------------------- export


def export_store(store: MemoryStore | str | os.PathLike, out: str | os.PathLike | io.TextIOBase, *,
                 namespaces: Sequence[str] | None = None, embeddings: bool = True) -> dict:
    """Write ``store`` (a :class:`~memkern.MemoryStore`, an :class:`~memkern.InMemoryStore`, or a
    store directory, opened and closed here) to ``out`` as JSON Lines (format:
    :mod:`memkern.store.transfer`). A path is written through a temporary file renamed into place.

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
    with MemoryStore(p, read_only=True) as s:  # a consistent view, beside a process writing the store too
        return _export(s, out, namespaces, embeddings)


def _chosen(store: MemoryStore, namespaces: Sequence[str] | None) -> list[str]:
    have = store.namespaces()
    if namespaces is None:
        return list(have)
    if isinstance(namespaces, str) or not isinstance(namespaces, Sequence):
        raise bad_arg("namespaces", "a list of namespace names or None", type(namespaces).__name__,
                      MemkernTypeError)
    chosen: list[str] = []
    for ns in namespaces:
        if ns not in have:
            raise MemkernKeyError(f"namespaces: unknown namespace {ns!r} (the store holds {have})")
        if ns not in chosen:
            chosen.append(ns)
    return chosen


def _export(store: MemoryStore, out: Any, namespaces: Sequence[str] | None, embeddings: bool) -> dict:
    chosen = _chosen(store, namespaces)
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
    stats: dict = {}
    for line in export_lines(store, namespaces, embeddings, stats):
        f.write(line)
    return stats


def export_lines(store: MemoryStore, namespaces: Sequence[str] | None = None, embeddings: bool = True,
                 stats: dict | None = None) -> Iterator[str]:
    """The export of ``store`` (format: :mod:`memkern.store.transfer`) as JSON Lines, one str per
    line (``"\\n"``-terminated), produced as they are read (what ``GET /v1/export`` streams).

    Parameters
    ----------
    namespaces : list of str, optional
        Only these (default all); as :func:`export_store`.
    stats : dict, optional
        Filled at the end with ``records``, ``namespaces`` and ``rerankers``.
    """
    from ...base.version import __version__

    if not isinstance(embeddings, bool):
        raise bad_arg("embeddings", "a bool", type(embeddings).__name__, MemkernTypeError)
    namespaces = _chosen(store, namespaces)
    n = native(store)
    header = {"kind": "header", "format": FORMAT, "format_version": FORMAT_VERSION, "dim": store.dim,
              "metric": store.metric, "embeddings": embeddings, "namespaces": namespaces,
              "memkern_version": __version__}
    yield json.dumps(header, ensure_ascii=False) + "\n"
    ids = []
    for ns in namespaces:
        for level in ("topic", "turn"):
            ids.extend(int(i) for i in store.ids(ns, include_invalidated=True, level=level))
    ids.sort()
    count = 0
    for start in range(0, len(ids), 512):
        for rec in export_records(store, ids[start:start + 512], embeddings):
            yield json.dumps(rec, ensure_ascii=False, allow_nan=False) + "\n"
            count += 1
    rerankers = []
    if store.path is not None:
        for ns in namespaces:
            try:
                check_namespace(ns)
            except MemkernError:
                continue  # a name that cannot have reranker files
            for kind, suffix in RERANKER_FILES.items():
                p = reranker_file(store.path, ns, suffix)
                if p.is_file():
                    data = p.read_bytes()
                    try:
                        check_reranker_data(data, kind, store.dim, str(p))
                    except MemkernValueError as e:
                        log.warning("export: leaving out %s, not a valid reranker file (%s)", p, e)
                        continue
                    yield json.dumps({"kind": "reranker", "namespace": ns, "file": kind,
                                      "sha256": hashlib.sha256(data).hexdigest(),
                                      "data": base64.b64encode(data).decode("ascii")}) + "\n"
                    rerankers.append(f"{ns}{suffix}")
    yield json.dumps({"kind": "end", "records": count, "rerankers": len(rerankers)}) + "\n"
    if stats is not None:
        stats.update({"records": count, "namespaces": list(namespaces), "rerankers": rerankers})


def export_records(store: MemoryStore, ids: Sequence[int], embeddings: bool = True) -> list[dict]:
    """The records ``ids`` of ``store`` as record lines of the export format (:mod:`memkern.store.transfer`):
    ``{"kind": "record", "id", "namespace", "level", "topic_id", "turn_ids", "status", "reason",
    "created_at", "updated_at", "event_time"?, "versions": [...]}`` with the whole version history,
    each version's vector as base64 of its float32 bits. :func:`import_records` writes them back
    with their ids (the rebalance of a :class:`~memkern.distributed.ShardedStore` moves records so)."""
    n = native(store)
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
