"""``memkern ingest FILE``: add dialogue sessions from a JSON file to a store (prospective reflection).

Accepted files: the bundled format (``{"sessions": [{"session_id", "date", "turns"}]}``), a list of
sessions (each a list of ``{"role", "content"}`` turns), LongMemEval (questions with
``haystack_sessions``; shared sessions ingested once) and LoCoMo (``conversation.session_N``);
see :mod:`memkern.data.sessions`.

All or nothing:

1. The arguments (``-n`` included) and then the whole file are validated before any model runs
   and before any store is opened or created: a bad value anywhere (e.g. the 5th session's
   ``content: 7``) is reported naming its session and turn, and nothing is written or created.
2. The sessions are folded (topic extraction, embeddings, ADD / MERGE / UPDATE / INVALIDATE
   decisions) into a scratch store in a temporary folder that starts as a copy of the
   namespace's active memories. The real store is not written while models run, so a model
   failure or an interrupt leaves it as it was.
3. The result is then committed to the real store: every new memory in **one** atomic, logged
   ``add_batch`` call (it lands completely or not at all), then one logged write per older memory
   that changed (its final content as one new version; invalidations last). If one of those later
   writes fails, the new memories are deleted again and the changed older memories are written
   back to their previous content (as a further version); an invalidation that already landed
   stays. Ingesting into a new or empty namespace is therefore fully atomic. Versions made and
   superseded within one ingest are folded into one (a memory added and then merged in the same
   file is stored once, merged).
A store created by this call is removed again if the commit fails.
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import common as C


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE", type=C.input_file, help="JSON file of sessions")
    C.add_store_args(p)
    C.add_model_args(p)
    p.add_argument("--extractor", choices=("llm", "embedding", "window", "sentences"), default="embedding",
                   help="how memories are built: 'embedding' (default: LLM-free topic segmentation and "
                        "similarity-based updates; fast) or 'llm' (the paper's way: the chat model extracts "
                        "topics and decides updates; slow on CPU, best with --chat-model BIGGER_MODEL)")
    p.add_argument("--limit", type=C.positive_int, default=None, metavar="N", help="ingest only the first N sessions")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    path = C.store_path(args)
    existed = path.exists()
    exists = C.store_exists(path)  # --store naming a file is rejected here, before anything runs
    sessions = C.load_sessions(args.file)  # the whole file validated before anything is written
    if args.limit is not None:
        sessions = sessions[: args.limit]
    chat, emb = C.build_models(args, need_chat=args.extractor == "llm")
    store = C.open_store(path, dim=emb.dim) if exists else None
    try:
        plan, actions = _stage(args, store, sessions, chat, emb)
        created = store is None
        if created:  # a new store is created only now, with everything computed
            store = C.open_store(path, dim=emb.dim)
        try:
            commit(store, args.namespace, plan)
        except BaseException:
            if created and not existed:
                store.close()
                store = None
                shutil.rmtree(path, ignore_errors=True)
            raise
        store.flush()
        print(f"ingested {len(sessions)} sessions into {path} namespace {args.namespace!r}: "
              + ", ".join(f"{a} {actions[a]}" for a in ("ADD", "MERGE", "UPDATE", "INVALIDATE", "NOOP")))
        print(f"namespace now holds {store.count(args.namespace)} active memories")
        return 0
    finally:
        if store is not None:
            store.close()


# ------------------------------------------------------------------------------ staging

@dataclass
class Plan:
    """What one ingest writes to the real store.

    ``new``: records to add (``summary``, ``embedding`` float32 [d], ``turns``, ``meta``,
    ``turn_embeddings`` float32 [len(turns), d] or None, ``invalidated`` reason or None), in
    creation order. ``changed``: ``(real id, same fields)`` for older records whose content
    changed. ``invalidate``: ``(real id, reason)`` for older records invalidated.
    """

    new: list[dict[str, Any]] = field(default_factory=list)
    changed: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    invalidate: list[tuple[int, str]] = field(default_factory=list)


def _turn_matrix(store, rec) -> np.ndarray | None:
    """The stored turn-record vectors of topic ``rec`` in turn order, float32 [len(turns), d], or
    None when the topic has no complete set of turn records."""
    n = len(rec.turns or [])
    if not rec.turn_ids or len(rec.turn_ids) != n:
        return None
    kids = store.get_batch(list(rec.turn_ids))
    pos = [k.meta.get("turn_position") if isinstance(k.meta, dict) else None for k in kids]
    if sorted(p for p in pos if isinstance(p, int)) != list(range(n)):
        return None
    vecs = store.embeddings(list(rec.turn_ids))
    out = np.empty_like(vecs)
    out[pos] = vecs
    return out


def _fields(store, rec) -> dict[str, Any]:
    return {"summary": rec.summary, "embedding": store.embeddings([rec.id])[0], "turns": list(rec.turns or []),
            "meta": dict(rec.meta or {}), "turn_embeddings": _turn_matrix(store, rec),
            "event_time": getattr(rec, "event_time", None)}


def _event_times(fields: list[dict[str, Any]]) -> dict[str, Any]:
    """``add_batch``'s ``event_times`` keyword for these records (none when no record has one)."""
    ets = [f.get("event_time") for f in fields]
    return {"event_times": ets} if any(t is not None for t in ets) else {}


def _stage(args, store, sessions, chat, emb) -> tuple[Plan, Counter]:
    """Fold ``sessions`` into a scratch copy of the namespace; return what to write and the
    decision counts. ``store`` (the real one, or None when it does not exist yet) is only read."""
    from ..loops.rmm import RMM
    from ..store.engine import MemoryStore

    ns = args.namespace
    metric = store.metric if store is not None else "cos"
    with tempfile.TemporaryDirectory(prefix="memkern-ingest-") as tmp:
        stage = MemoryStore(os.path.join(tmp, "stage"), dim=emb.dim, metric=metric, fsync="never", snapshot_every=0)
        try:
            real_of: dict[int, int] = {}
            if store is not None:
                ids = [int(i) for i in store.ids(ns)]  # active topic records
                if ids:
                    old = [_fields(store, r) for r in store.get_batch(ids)]
                    tes = [f["turn_embeddings"] for f in old]
                    sids = stage.add_batch(ns, [f["summary"] for f in old], np.stack([f["embedding"] for f in old]),
                                           [f["turns"] for f in old], [f["meta"] for f in old],
                                           turn_embeddings=tes if any(t is not None for t in tes) else None,
                                           **_event_times(old))
                    real_of = {int(s): r for s, r in zip(sids, ids)}
            rmm = RMM(stage, chat_model=chat, embedder=emb, namespace=ns, extractor=args.extractor, seed=args.seed,
                      persist=False, **C.rmm_retrieval_kwargs(args))
            bar = C.progress_bar(len(sessions), "ingest", not args.no_progress)
            actions: Counter = Counter()
            for start in range(0, len(sessions), 4):
                chunk = sessions[start : start + 4]
                results = rmm.end_sessions([s["turns"] for s in chunk], [s["session_id"] for s in chunk],
                                           dates=[s.get("date") for s in chunk], progress=lambda _n: bar.update(1))
                for res in results:
                    actions.update(r.action for r in res)
            bar.close()
            plan = Plan()
            for sid in sorted(int(i) for i in stage.ids(ns, include_invalidated=True)):
                rec = stage.get(sid)
                reason = (rec.invalidated_reason or "") if rec.status == "invalidated" else None
                if sid not in real_of:
                    plan.new.append(dict(_fields(stage, rec), invalidated=reason))
                    continue
                if rec.version > 1:
                    plan.changed.append((real_of[sid], _fields(stage, rec)))
                if reason is not None:
                    plan.invalidate.append((real_of[sid], reason))
            return plan, actions
        finally:
            stage.close()


# ------------------------------------------------------------------------------ commit

def _write_version(store, rid: int, f: dict[str, Any]) -> None:
    store.update(rid, summary=f["summary"], embedding=f["embedding"], turns=f["turns"], meta=f["meta"],
                 turn_embeddings=f["turn_embeddings"], event_time=f.get("event_time"))


def commit(store, namespace: str, plan: Plan) -> list[int]:
    """Write ``plan`` to ``store``: new records in one atomic ``add_batch``, then the changed and
    invalidated older records; on a failure after the batch, undo it (see the module docstring)
    and re-raise. Returns the new records' ids."""
    added: list[int] = []
    if plan.new:
        tes = [f["turn_embeddings"] for f in plan.new]
        added = [int(i) for i in store.add_batch(
            namespace, [f["summary"] for f in plan.new], np.stack([f["embedding"] for f in plan.new]),
            [f["turns"] for f in plan.new], [f["meta"] for f in plan.new],
            turn_embeddings=tes if any(t is not None for t in tes) else None, **_event_times(plan.new))]
    restored: list[tuple[int, dict[str, Any]]] = []
    try:
        for rid, f in plan.changed:
            before = _fields(store, store.get(rid))
            _write_version(store, rid, f)
            restored.append((rid, before))
        for rid, f in zip(added, plan.new):
            if f["invalidated"] is not None:
                store.invalidate(rid, f["invalidated"])
        for rid, reason in plan.invalidate:
            store.invalidate(rid, reason)
    except BaseException:
        for rid in added:
            try:
                store.delete(rid)
            except Exception:  # noqa: BLE001 - keep undoing the rest; the first error is re-raised
                pass
        for rid, before in reversed(restored):
            try:
                _write_version(store, rid, before)
            except Exception:  # noqa: BLE001
                pass
        raise
    return added


__all__ = ["Plan", "commit", "configure", "run"]
