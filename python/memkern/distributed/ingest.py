"""Bulk ingest on Ray Data: session files -> extraction + embedding -> a :class:`ShardedStore`.

Pipeline::

    sessions (JSONL / LongMemEval / LoCoMo / memkern session files, memkern.data loaders)
      -> skip the (namespace, session id) pairs the shards already hold (nothing re-embedded)
      -> ray.data.from_items -> map_batches(_Extract): a pool of Ray actors, each with one embedder
         (on a GPU when one is present: num_gpus=1 per actor) and one extractor
         (memkern.ingest.extract.make_extractor: "embedding", "llm", ...); per batch of sessions: topics
         of every session, then ONE encode call for all their summaries (and turns)
      -> the caller streams the results (iter_batches) and writes each shard's sessions with one
         call per shard, all shards in parallel; a progress bar counts sessions

Idempotency: every topic record written carries ``meta["ingest_session"] = session id``, and a
session's topics land in one atomic ``add_batch``. Before writing, the shard checks its ledger --
the set of ``(namespace, session id)`` its records carry -- and skips a session it already holds.
So a rerun after a failure (or a killed shard) writes every session exactly once: the store itself
is the ledger, and there is no second file to fall out of step with it. A (re)started shard reads
the ledger from the store's meta index (``Store.meta_values``: the distinct values of that key per
namespace, kept by the store on every write, log replay and snapshot load) without reading a
single record; the ledger survives a rebalance with the records that carry it.
"""
from __future__ import annotations

import json
import logging
import os
import pickle
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..errors import MemkernTypeError, bad_arg

log = logging.getLogger("memkern")

__all__ = ["ingest", "IngestReport", "load_sessions_any", "LEDGER_KEY"]

#: The meta key of an ingested topic record that names its session (the idempotency ledger).
LEDGER_KEY = "ingest_session"


@dataclass
class IngestReport:
    """What one :func:`ingest` call did."""

    sessions: int = 0            # sessions in the input
    skipped: int = 0             # already in the store before the run (not re-embedded)
    written: int = 0             # sessions written now
    duplicates: int = 0          # sessions a shard refused at write time (already held)
    records: int = 0             # topic records written now
    seconds: float = 0.0
    first_batch_s: float = 0.0   # start -> first batch written (loading, actor start-up, model load)
    first_batch_sessions: int = 0
    per_shard: dict[int, int] = field(default_factory=dict)   # sessions written per shard

    @property
    def sessions_per_s(self) -> float:
        """Sessions processed per second, start-up included."""
        return (self.written + self.duplicates) / self.seconds if self.seconds > 0 else 0.0

    @property
    def steady_sessions_per_s(self) -> float:
        """Sessions per second after the first batch (start-up and model loading excluded)."""
        n = self.written + self.duplicates - self.first_batch_sessions
        dt = self.seconds - self.first_batch_s
        return n / dt if n > 0 and dt > 0 else 0.0


def load_sessions_any(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Sessions ``{"session_id", "date", "turns"}`` of a file: ``.jsonl`` (one session object, or
    one list of turns, per line) or any layout :func:`memkern.data.sessions.load_session_file`
    reads (bundled, list, LongMemEval, LoCoMo). Validated before anything is written."""
    from ..data.schema import DatasetFormatError
    from ..data.sessions import load_session_file, parse_sessions

    p = Path(path)
    if p.suffix == ".jsonl":
        rows = []
        with open(p, encoding="utf-8") as f:
            for i, line in enumerate(f, 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except ValueError as e:
                        raise DatasetFormatError(f"{p}: line {i}: not JSON ({e})") from None
        return parse_sessions(rows).sessions
    return load_session_file(p).sessions


class _Extract:
    """Ray Data UDF: a batch of sessions -> per session its topics with embeddings (one encode call)."""

    def __init__(self, extractor: str, embedder: Any, chat_model: Any, seed: int, turn_level: bool,
                 extractor_kwargs: dict, threads: int) -> None:
        import torch

        from ..ingest.extract import make_extractor

        torch.set_num_threads(threads)
        if embedder is None or callable(embedder) and not hasattr(embedder, "encode"):
            from ..models import Embedder

            embedder = Embedder() if embedder is None else embedder()
        if callable(chat_model) and not hasattr(chat_model, "generate"):
            chat_model = chat_model()
        if extractor == "llm" and chat_model is None:
            from ..models import ChatModel

            chat_model = ChatModel()
        self.emb = embedder
        self.ex = make_extractor(extractor, chat_model=chat_model, embedder=embedder, **extractor_kwargs)
        self.seed = seed
        self.turn_level = turn_level

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        sessions = [json.loads(t) for t in batch["turns_json"]]
        topics = self.ex.extract_batch(sessions, seed=self.seed)
        flat = [t.summary for ts in topics for t in ts]
        vecs = np.asarray(self.emb.encode(flat, kind="passage"), dtype=np.float32) if flat else None
        turn_texts = [sessions[i][j]["content"] for i, ts in enumerate(topics) for t in ts for j in t.turns] \
            if self.turn_level else []
        tvecs = np.asarray(self.emb.encode(turn_texts, kind="passage"), dtype=np.float32) if turn_texts else None
        payloads, pos, tpos = [], 0, 0
        for i, ts in enumerate(topics):
            n = len(ts)
            sid = str(batch["session_id"][i])
            date = batch["date"][i]
            date = None if date is None or date == "" else str(date)
            turns = [[dict(sessions[i][j]) for j in t.turns] for t in ts]
            metas = [{"session_id": sid, "date": date, "turn_indices": list(t.turns), "source": t.source} for t in ts]
            te = None
            if self.turn_level and n:
                te = []
                for tl in turns:
                    te.append(tvecs[tpos:tpos + len(tl)] if tl else None)
                    tpos += len(tl)
            payloads.append(pickle.dumps(dict(
                session_id=sid, namespace=str(batch["namespace"][i]), summaries=[t.summary for t in ts],
                embeddings=vecs[pos:pos + n] if n else np.zeros((0, 1), np.float32), turns=turns, metas=metas,
                turn_embeddings=te)))
            pos += n
        return {"payload": np.array(payloads, dtype=object)}


def ingest(store: Any, source: str | os.PathLike | list[dict], *, namespace: str | Callable[[dict], str] = "default",
           extractor: str = "embedding", embedder: Any = None, chat_model: Any = None, seed: int = 0,
           batch_size: int = 16, concurrency: int = 1, num_gpus: float | None = None, turn_level: bool = False,
           extractor_kwargs: dict | None = None, threads: int = 1, progress: bool = True,
           limit: int | None = None) -> IngestReport:
    """Ingest the sessions of ``source`` into the :class:`ShardedStore` ``store`` on Ray Data.

    Parameters
    ----------
    store : ShardedStore
    source : path of a session file (see :func:`load_sessions_any`) or a list of session dicts
        ``{"session_id", "date"?, "turns"}``
    namespace : the namespace of every session, or a function ``session dict -> namespace``
        (picklable; e.g. ``lambda s: s["session_id"].split(":")[0]`` for LoCoMo's samples)
    extractor : a :func:`memkern.ingest.extract.make_extractor` name (``"embedding"``: TextTiling over the
        turn embeddings; ``"llm"``; ``"window"``; ``"sentences"``)
    embedder, chat_model : instances (pickled to each extraction actor) or zero-argument factories
        called inside the actor; ``None``: the offline default models (``Embedder()`` picks CUDA
        when present)
    seed : extraction seed (LLM sampling)
    batch_size : sessions per extraction call (one encode call per batch)
    concurrency : extraction actors
    num_gpus : GPUs per extraction actor; ``None``: 1 when the cluster has GPUs, else 0
    turn_level : also store every topic's turns as turn records (two-level memory)
    limit : the first N sessions only
    progress : a progress bar over sessions (Ray Data's own bars are switched off)

    Returns
    -------
    IngestReport
    """
    from . import ensure_ray
    from .sharded import ShardedStore

    if not isinstance(store, ShardedStore):
        raise bad_arg("store", "a memkern.distributed.ShardedStore", type(store).__name__, MemkernTypeError)
    from ..ingest.extract import EXTRACTORS

    if extractor not in EXTRACTORS:
        raise bad_arg("extractor", f"one of {sorted(EXTRACTORS)}", extractor)
    for name, v in (("batch_size", batch_size), ("concurrency", concurrency), ("threads", threads)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise bad_arg(name, "an int >= 1", v)
    if not (isinstance(namespace, str) and namespace) and not callable(namespace):
        raise bad_arg("namespace", "a non-empty str or a function session -> str", namespace)
    ray = ensure_ray()
    t0 = time.perf_counter()
    sessions = source if isinstance(source, list) else load_sessions_any(source)
    if isinstance(source, list):
        from ..data.sessions import parse_sessions

        sessions = parse_sessions(source).sessions
    if limit is not None:
        sessions = sessions[:limit]
    rows = []
    for s in sessions:
        ns = namespace if isinstance(namespace, str) else namespace(s)
        if not isinstance(ns, str) or not ns:
            raise bad_arg("namespace", "a function returning a non-empty str", f"{ns!r} for session {s['session_id']!r}")
        rows.append(dict(session_id=str(s["session_id"]), namespace=ns, date=s.get("date") or "",
                         turns_json=json.dumps(s["turns"], ensure_ascii=False)))
    report = IngestReport(sessions=len(rows))
    held = store.ingested_sessions()
    todo = [r for r in rows if (r["namespace"], r["session_id"]) not in held]
    report.skipped = len(rows) - len(todo)
    seen: set[tuple[str, str]] = set()
    dup_in_input = [r for r in todo if (r["namespace"], r["session_id"]) in seen or seen.add((r["namespace"], r["session_id"]))]
    if dup_in_input:
        r = dup_in_input[0]
        raise bad_arg("source", "unique session ids per namespace", f"session {r['session_id']!r} twice in "
                      f"namespace {r['namespace']!r}")
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(rows), initial=report.skipped, desc="ingest", unit="session")
    if todo:
        ctx = ray.data.DataContext.get_current()
        ctx.enable_progress_bars = False
        if num_gpus is None:
            num_gpus = 1 if ray.cluster_resources().get("GPU", 0) >= 1 else 0
        ds = ray.data.from_items(todo).map_batches(
            _Extract, fn_constructor_kwargs=dict(extractor=extractor, embedder=embedder, chat_model=chat_model,
                                                 seed=seed, turn_level=turn_level,
                                                 extractor_kwargs=dict(extractor_kwargs or {}), threads=threads),
            batch_size=batch_size, concurrency=concurrency, num_gpus=num_gpus, num_cpus=1 if not num_gpus else 0,
            batch_format="numpy")
        for batch in ds.iter_batches(batch_size=batch_size, batch_format="numpy", prefetch_batches=1):
            items = [pickle.loads(p) for p in batch["payload"]]
            res = store.write_sessions(items, LEDGER_KEY)
            for s, written in res.items():
                report.per_shard[s] = report.per_shard.get(s, 0) + len(written)
                report.written += len(written)
                report.records += sum(len(ids) for _, _, ids in written)
            n_items = len(items)
            if not report.first_batch_s:
                report.first_batch_s = time.perf_counter() - t0
                report.first_batch_sessions = n_items
            report.duplicates += n_items - sum(len(w) for w in res.values())
            if bar is not None:
                bar.update(n_items)
        store.flush()
    if bar is not None:
        bar.close()
    report.seconds = time.perf_counter() - t0
    log.info("ingest: %d sessions, %d skipped (already held), %d written (%d records), %d refused as duplicates, "
             "%.1f s", report.sessions, report.skipped, report.written, report.records, report.duplicates,
             report.seconds)
    return report
