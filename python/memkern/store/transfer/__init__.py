"""Export and import of a store as JSON Lines (``memkern export`` / ``memkern import``).

Modules: :mod:`~memkern.store.transfer.format` (the format's names and the native layer),
:mod:`~memkern.store.transfer.export` (writing the file), :mod:`~memkern.store.transfer.parse`
(reading and checking it), :mod:`~memkern.store.transfer.write` (writing checked records into a
store) and :mod:`~memkern.store.transfer.install` (the atomic import of a file).

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

Import (:func:`import_store`) reads and checks every line first and writes nothing if any check
fails (the checks: :mod:`~memkern.store.transfer.parse`); export writes through one atomic write
and never into a store folder (:mod:`~memkern.store.transfer.export`); atomicity, ids and what a
round trip keeps: :mod:`~memkern.store.transfer.install`.
"""
from __future__ import annotations

from .export import export_records, export_store
from .format import FORMAT, FORMAT_VERSION
from .install import ImportResult, import_store
from .write import import_records

__all__ = [
    "export_store",
    "import_store",
    "export_records",
    "import_records",
    "ImportResult",
    "FORMAT",
    "FORMAT_VERSION",
]
