"""Writing checked records (:mod:`memkern.store.transfer.parse`) into a store: :func:`import_records`
into an open store with their ids, and the build of a fresh store an import installs."""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from ...errors import MemkernError, MemkernTypeError, bad_arg
from ...base.validate import json_text
from ..checks import MAX_NORM, NO_TIMES
from ..engine import MemoryStore
from ..native import native_module
from .format import OPS, native
from .parse import ExportRecord, Line, ParsedExport, check_record

__all__ = ["import_records", "embed_missing", "exact_inputs", "write_records"]



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
    parsed = ParsedExport(store.dim, store.metric, True, [namespace])
    recs: list[ExportRecord] = []
    for i, d in enumerate(records):
        L = Line("records", i)
        L.where = f"records[{i}]"
        if not isinstance(d, dict):
            raise L.fail("record", "a dict", type(d).__name__, MemkernTypeError)
        recs.append(check_record(L, d, parsed))
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
    levels = native_module().Level
    native(store).import_records(
        namespace, np.array([r.id for r in order], np.int64),
        np.array([int(getattr(levels, r.level)) for r in order], np.uint8),
        np.array([-1 if r.topic_id is None else r.topic_id for r in order], np.int64),
        np.array([r.status == "invalidated" for r in order], np.uint8), [r.reason or "" for r in order],
        np.array([r.created_at for r in order], np.float64), np.array([r.updated_at for r in order], np.float64),
        np.array([math.nan if r.event_time is None else r.event_time for r in order], np.float64),
        [[(OPS[v.op], v.summary, json_text(v.turns, "turns"), json_text(v.meta, "meta"), v.updated_at)
          for v in r.versions] for r in order], vecs)
    return len(order)


# ----------------------------------------------------------------------------------- reading + checks


def embed_missing(parsed: ParsedExport, embedder: Any) -> None:
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


def exact_inputs(parsed: ParsedExport) -> int:
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


def write_records(store: MemoryStore, parsed: ParsedExport, renumber: bool = False) -> tuple[dict, bool]:
    """Write the checked records into ``store`` (fresh unless ``renumber``); returns (id map, renumbered)."""
    n = native(store)
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
                        np.zeros(m, np.uint8), np.full(m, -1, np.int64), NO_TIMES)
            filled.extend(int(x) for x in got)
            next_id = r.id
        # one add call for a run of records of one namespace (first versions), the later versions after
        j = i
        batch: list[ExportRecord] = []
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
                    np.array([int(getattr(native_module().Level, b.level)) for b in batch], np.uint8), parents,
                    times if not np.isnan(times).all() else NO_TIMES)
        for b, new in zip(batch, got):
            id_map[b.id] = int(new)
            if not renumber and int(new) != b.id:
                raise MemkernError(f"import: store id {int(new)} for file id {b.id}: the target store was not new")
        next_id += len(batch)
        empty = np.zeros((0, dim), np.float32)
        for b in batch:
            for v in b.versions[1:]:
                n.new_version(id_map[b.id], getattr(native_module().Op, v.op), v.summary, v.embedding[None, :], json_text(v.turns, "turns"),
                              json_text(v.meta, "meta"), [], [], [], empty, False, None, NO_TIMES)
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
