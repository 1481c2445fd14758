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
