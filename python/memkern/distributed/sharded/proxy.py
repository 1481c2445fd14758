"""``ShardedStore``: the :class:`memkern.MemoryStore` API over the shard actors (layout, routing,
ids and durability: :mod:`memkern.distributed.sharded`)."""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
import weakref
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from ...errors import MemkernError, MemkernKeyError, MemkernTypeError, MemkernValueError, bad_arg
from ...store.checks import check_ids, check_namespace, is_torch
from ...store.record import turns_with_topics as _turns_with_topics
from .actor import Shard
from .layout import FORMAT, ID_SHIFT, MAX_SHARDS, shard_of, write_json_atomic
from .rebalance import RebalanceMixin

log = logging.getLogger("memkern")

__all__ = ["ShardedStore", "ShardUnavailableError"]


class ShardUnavailableError(MemkernError, RuntimeError):
    """A shard actor died while it ran a write: the write may or may not have been applied."""


# ------------------------------------------------------------------------------------ the store

class ShardedStore(RebalanceMixin):
    """The :class:`memkern.MemoryStore` API over ``shards`` Ray actors, one store directory each.

    Parameters
    ----------
    path : str or os.PathLike
        Folder of the sharded store (created if missing); see :mod:`memkern.distributed.sharded` for its layout.
    dim : int, optional
        Embedding width; required to create a store (an existing one uses its manifest's).
    metric : {"ip", "l2", "cos"}, optional
        ``None``: ``"ip"`` for a new store, the stored metric otherwise.
    shards : int, optional
        Number of shard actors (1..:data:`MAX_SHARDS`); required to create a store. An existing
        store keeps its count: a different value raises (use :meth:`rebalance`).
    max_restarts : int
        Ray restarts of a dead shard actor (-1: unlimited, the default).
    actor_options : dict, optional
        Extra ``ray.remote`` options of the shard actors (``num_cpus`` defaults to 0).
    **store_options
        Passed to every shard's :class:`memkern.MemoryStore` (``fsync``, ``snapshot_every``,
        ``flat_limit``, ``ef_search``, ...).

    Notes
    -----
    A local Ray instance is started when none is running. Records returned by ``get`` carry
    global ids (also in ``topic_id`` / ``turn_ids``); their ``embedding`` is read through this
    store. ``search`` and the other per-namespace calls pass their keyword arguments to the
    shard's ``MemoryStore`` untouched.
    """

    def __init__(self, path: str | os.PathLike, dim: int | None = None, metric: str | None = None, *,
                 shards: int | None = None, max_restarts: int = -1, actor_options: dict | None = None,
                 **store_options: Any) -> None:
        from .. import ensure_ray

        if not isinstance(path, (str, os.PathLike)):
            raise bad_arg("path", "a str or os.PathLike", type(path).__name__, MemkernTypeError)
        if shards is not None and (isinstance(shards, bool) or not isinstance(shards, int)
                                   or not 1 <= shards <= MAX_SHARDS):
            raise bad_arg("shards", f"an int in 1..{MAX_SHARDS}", shards)
        if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < -1:
            raise bad_arg("max_restarts", "an int >= -1", max_restarts)
        self._closed = True
        _check_store_options(store_options)
        self._path = Path(path)
        self._path.mkdir(mode=0o700, parents=True, exist_ok=True)
        man = self._path / "manifest.json"
        if man.exists():
            m = json.loads(man.read_text())
            if m.get("format") == 1:
                raise MemkernValueError(
                    f"{man}: expected format {FORMAT}, got format 1 (a sharded store whose shards numbered ids "
                    "locally, written before rebalancing kept ids): export each shard's namespaces "
                    "(memkern.store.transfer.export_store) and add them to a new ShardedStore")
            if m.get("format") != FORMAT or m.get("id_shift") != ID_SHIFT:
                raise MemkernValueError(f"{man}: expected format {FORMAT} with id_shift {ID_SHIFT}, got {m}")
            if dim is not None and int(dim) != m["dim"]:
                raise bad_arg("dim", f"{m['dim']} (the store's)", dim)
            if metric is not None and metric != m["metric"]:
                raise bad_arg("metric", f"{m['metric']!r} (the store's)", metric)
            journal = self._path / "rebalance.json"
            if shards is not None and shards != m["shards"] and not journal.exists():
                raise bad_arg("shards", f"{m['shards']} (the store's; change it with rebalance())", shards)
        else:
            if dim is None:
                raise bad_arg("dim", f"an int to create a new sharded store at {self._path}", None)
            if shards is None:
                raise bad_arg("shards", f"an int to create a new sharded store at {self._path}", None)
            if isinstance(dim, bool) or not isinstance(dim, int) or not 1 <= dim <= 65536:
                raise bad_arg("dim", "an int in 1..65536", dim)
            if metric is not None and metric not in ("ip", "l2", "cos"):
                raise bad_arg("metric", '"ip", "l2" or "cos"', metric)
            m = dict(format=FORMAT, dim=int(dim), metric=metric or "ip", shards=int(shards), id_shift=ID_SHIFT)
            write_json_atomic(man, m)
        self._manifest = m
        self._dim = int(m["dim"])
        self._metric = str(m["metric"])
        self._n = int(m["shards"])
        self._store_options = dict(store_options)
        self._ray = ensure_ray()
        opts = dict(num_cpus=0, max_restarts=max_restarts, max_task_retries=0)
        opts.update(actor_options or {})
        self._actor_cls = self._ray.remote(**opts)(Shard)
        self._actors: list[Any] = []
        self._load_locations()
        self._closed = False
        self._start_actors(self._n)
        if (self._path / "rebalance.json").exists():
            j = json.loads((self._path / "rebalance.json").read_text())
            log.warning("sharded store %s: resuming the interrupted rebalance %d -> %d shards", self._path,
                        j["from"], j["to"])
            self.rebalance(int(j["to"]))

    # ------------------------------------------------------------------ plumbing
    def _start_actors(self, n: int) -> None:
        while len(self._actors) < n:
            i = len(self._actors)
            d = str(self._path / f"shard-{i:03d}")
            self._actors.append(self._actor_cls.remote(d, i, self._dim, self._metric, self._store_options))
        self._ray.get([a.ping.remote() for a in self._actors])

    def _check_open(self) -> None:
        if self._closed:
            raise MemkernValueError(f"sharded store {self._path}: expected an open store, got a closed one")

    def _unwrap(self, err: BaseException) -> BaseException:
        cause = getattr(err, "cause", None)
        if isinstance(cause, BaseException) and isinstance(err, self._ray.exceptions.RayTaskError):
            return cause
        return err

    def _get(self, refs: Any, shard: int | Sequence[int], write: bool) -> Any:
        """``ray.get`` that turns task errors back into the store's own exceptions and dead-actor
        errors into :class:`ShardUnavailableError` (writes) or a retry signal (reads)."""
        rex = self._ray.exceptions
        try:
            return self._ray.get(refs)
        except (rex.ActorDiedError, rex.ActorUnavailableError) as e:
            if write:
                raise ShardUnavailableError(
                    f"shard {shard}: its actor died during a write; the write may or may not have been applied "
                    f"(the actor restarts from its directory): {type(e).__name__}") from None
            raise _Retry() from None
        except rex.RayTaskError as e:
            raise self._unwrap(e) from None

    def _call(self, shard: int, kind: str, name: str, *args: Any, **kwargs: Any) -> Any:
        self._check_open()
        actor = self._actors[shard]
        deadline = time.monotonic() + 120.0
        while True:
            try:
                return self._get(getattr(actor, kind).remote(name, args, kwargs), shard, kind == "write")
            except _Retry:
                if time.monotonic() > deadline:
                    raise ShardUnavailableError(f"shard {shard}: did not come back within 120 s") from None
                time.sleep(0.05)

    def _fan(self, kind: str, per_shard: dict[int, tuple[str, tuple, dict]]) -> dict[int, Any]:
        """One ``read``/``write`` dispatch per shard, all in flight at once; results by shard."""
        return self._fan_method(kind, {s: (n, a, k) for s, (n, a, k) in per_shard.items()}, write=kind == "write")

    def _load_locations(self) -> None:
        """The routing table of moved records (``locations.npz``; empty when nothing moved)."""
        f = self._path / "locations.npz"
        if f.exists():
            with np.load(f) as z:
                self._moved_ids, self._moved_to = z["ids"].astype(np.int64), z["shards"].astype(np.int64)
        else:
            self._moved_ids, self._moved_to = np.zeros(0, np.int64), np.zeros(0, np.int64)

    def _route(self, ids: np.ndarray) -> np.ndarray:
        """Shard of each id (int64 ``[n]``): its entry in the moved-records table, else its home ``id >> 48``."""
        shards = ids >> ID_SHIFT
        if self._moved_ids.size:
            pos = np.minimum(np.searchsorted(self._moved_ids, ids), self._moved_ids.size - 1)
            hit = self._moved_ids[pos] == ids
            shards = np.where(hit, self._moved_to[pos], shards)
        return shards

    def _shard_of_id(self, id: Any, name: str = "id") -> tuple[int, int]:
        from ...store.checks import check_id

        gid = check_id(id, name)
        s = int(self._route(np.array([gid], np.int64))[0])
        if s >= len(self._actors) or s >= self._n and not (self._path / "rebalance.json").exists():
            raise MemkernKeyError(f"{name}: unknown id {gid} (shard {s} of a {self._n}-shard store)")
        return s, gid

    def _record(self, shard: int, rec: Any) -> Any:
        return dataclasses.replace(rec, _store=weakref.ref(self))

    def shard_of(self, namespace: str) -> int:
        """The shard index that holds ``namespace`` now."""
        return shard_of(check_namespace(namespace), self._n)

    # ------------------------------------------------------------------ properties
    @property
    def path(self) -> Path:
        return self._path

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def metric(self) -> str:
        return self._metric

    @property
    def shards(self) -> int:
        return self._n

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def actors(self) -> list[Any]:
        """The shard actor handles (index = shard)."""
        return list(self._actors[: self._n])

    def __repr__(self) -> str:
        return f"ShardedStore({str(self._path)!r}, dim={self._dim}, metric={self._metric!r}, shards={self._n})"

    def __enter__(self) -> "ShardedStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ writes (one shard each)
    def add(self, namespace: str, summary: str, embedding: Any, turns: list[dict] | None = None,
            meta: dict | None = None, **kwargs: Any) -> int:
        """:meth:`memkern.MemoryStore.add` on the namespace's shard; returns the global id."""
        s = self.shard_of(namespace)
        return int(self._call(s, "write", "add", namespace, summary, _np(embedding), turns, meta, **kwargs))

    def add_batch(self, namespace: str, summaries: Sequence[str], embeddings: Any,
                  turns: Sequence[list[dict] | None] | None = None, metas: Sequence[dict | None] | None = None,
                  **kwargs: Any) -> np.ndarray:
        """:meth:`memkern.MemoryStore.add_batch` (atomic) on the namespace's shard; global ids int64 ``[n]``."""
        s = self.shard_of(namespace)
        return np.asarray(self._call(s, "write", "add_batch", namespace, summaries, _np(embeddings), turns, metas,
                                     **kwargs), np.int64)

    def merge(self, id: int, summary: str, embedding: Any, turns: list[dict] | None = None, **kwargs: Any) -> int:
        s, local = self._shard_of_id(id)
        return int(self._call(s, "write", "merge", local, summary, _np(embedding), turns, **kwargs))

    def update(self, id: int, summary: str | None = None, embedding: Any = None, turns: list[dict] | None = None,
               meta: dict | None = None, **kwargs: Any) -> int:
        s, local = self._shard_of_id(id)
        return int(self._call(s, "write", "update", local, summary, _np(embedding), turns, meta, **kwargs))

    def invalidate(self, id: int, reason: str = "") -> None:
        s, local = self._shard_of_id(id)
        self._call(s, "write", "invalidate", local, reason)

    def delete(self, id: int) -> None:
        s, local = self._shard_of_id(id)
        self._call(s, "write", "delete", local)

    # ------------------------------------------------------------------ reads
    def get(self, id: int) -> Any:
        s, local = self._shard_of_id(id)
        return self._record(s, self._call(s, "read", "get", local))

    def history(self, id: int) -> list[Any]:
        s, local = self._shard_of_id(id)
        return [self._record(s, r) for r in self._call(s, "read", "history", local)]

    def _group(self, ids: np.ndarray, name: str) -> dict[int, np.ndarray]:
        shards = self._route(ids)
        for s in np.unique(shards):
            if int(s) >= self._n:
                bad = int(ids[shards == s][0])
                raise MemkernKeyError(f"{name}: unknown id {bad} (shard {int(s)} of a {self._n}-shard store)")
        return {int(s): np.flatnonzero(shards == s) for s in np.unique(shards)}

    def get_batch(self, ids: Iterable[int]) -> list[Any]:
        """Records of global ``ids`` (int64 ``[n]``), in order: one call per shard involved, in parallel."""
        arr = check_ids(list(ids) if not hasattr(ids, "__array__") and not is_torch(ids) else ids)
        groups = self._group(arr, "ids")
        res = self._fan("read", {s: ("get_batch", (arr[pos],), {}) for s, pos in groups.items()})
        out: list[Any] = [None] * len(arr)
        for s, pos in groups.items():
            for p, r in zip(pos, res[s]):
                out[p] = self._record(s, r)
        return out

    def embeddings(self, ids: Any) -> np.ndarray:
        """Stored vectors of global ``ids`` as float32 ``[n, d]`` (one call per shard, in parallel)."""
        arr = check_ids(ids)
        groups = self._group(arr, "ids")
        res = self._fan("read", {s: ("embeddings", (arr[pos],), {}) for s, pos in groups.items()})
        out = np.empty((len(arr), self._dim), dtype=np.float32)
        for s, pos in groups.items():
            out[pos] = res[s]
        return out

    def turns_with_topics(self, ids: Iterable[int]) -> list[tuple[Any, Any]]:
        """As :meth:`memkern.MemoryStore.turns_with_topics` (``-1`` padding skipped)."""
        return _turns_with_topics(self, ids)

    def search(self, namespace: str, queries: Any, k: int = 20, ef: int | None = None,
               include_invalidated: bool = False, **kwargs: Any) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`memkern.MemoryStore.search` on the namespace's shard (keyword arguments passed
        untouched); ids are global, ``-1`` padding kept."""
        s = self.shard_of(namespace)
        ids, scores = self._call(s, "read", "search", namespace, _np(queries), k, ef, include_invalidated, **kwargs)
        return np.asarray(ids, np.int64), scores

    def search_many(self, requests: Sequence[tuple[str, Any]], **kwargs: Any) -> list[tuple[np.ndarray, np.ndarray]]:
        """Search several namespaces at once: ``requests`` is a list of ``(namespace, queries)``;
        one call per shard involved, all shards in parallel; results in request order.
        ``kwargs`` (``k``, ``level``, ``mode``, ...) apply to every request."""
        if isinstance(requests, (str, bytes)) or not isinstance(requests, Sequence):
            raise bad_arg("requests", "a list of (namespace, queries) pairs", type(requests).__name__,
                          MemkernTypeError)
        by_shard: dict[int, list[int]] = {}
        for i, r in enumerate(requests):
            if not isinstance(r, (tuple, list)) or len(r) != 2:
                raise bad_arg(f"requests[{i}]", "a (namespace, queries) pair", r)
            by_shard.setdefault(self.shard_of(r[0]), []).append(i)
        self._check_open()
        deadline = time.monotonic() + 120.0
        out: list[Any] = [None] * len(requests)
        pending = by_shard
        while pending:
            refs = {s: self._actors[s].search_many.remote([(requests[i][0], _np(requests[i][1]), kwargs)
                                                           for i in idx]) for s, idx in pending.items()}
            retry = {}
            for s, ref in refs.items():
                try:
                    res = self._get(ref, s, False)
                except _Retry:
                    retry[s] = pending[s]
                    continue
                for i, (ids, sc) in zip(pending[s], res):
                    out[i] = (np.asarray(ids, np.int64), sc)
            pending = retry
            if pending:
                if time.monotonic() > deadline:
                    raise ShardUnavailableError(f"shards {sorted(pending)}: did not come back within 120 s")
                time.sleep(0.05)
        return out

    def namespaces(self) -> list[str]:
        """Namespaces holding at least one record, over all shards, sorted."""
        res = self._fan("read", {s: ("namespaces", (), {}) for s in range(self._n)})
        return sorted({ns for v in res.values() for ns in v})

    def ids(self, namespace: str, include_invalidated: bool = False, **kwargs: Any) -> np.ndarray:
        s = self.shard_of(namespace)
        return np.asarray(self._call(s, "read", "ids", namespace, include_invalidated, **kwargs), np.int64)

    def count(self, namespace: str, include_invalidated: bool = False, **kwargs: Any) -> int:
        s = self.shard_of(namespace)
        return int(self._call(s, "read", "count", namespace, include_invalidated, **kwargs))

    def __contains__(self, id: object) -> bool:
        try:
            s, local = self._shard_of_id(id)
        except (MemkernKeyError, MemkernTypeError):
            return False
        return bool(self._call(s, "read", "__contains__", local))

    # ------------------------------------------------------------------ ingest support
    def ingested_sessions(self, key: str = "ingest_session") -> set[tuple[str, str]]:
        """``(namespace, session id)`` pairs already written by :func:`memkern.distributed.ingest`."""
        out: set[tuple[str, str]] = set()
        got = self._fan_method("ingested_sessions", {s: (key,) for s in range(self._n)})
        for v in got.values():
            out.update((a, b) for a, b in v)
        return out

    def write_sessions(self, items: list[dict], key: str = "ingest_session") -> dict[int, list]:
        """Write ingest items (one per session: ``session_id``, ``namespace``, ``summaries``,
        ``embeddings`` ``[n, d]``, ``turns``, ``metas``, ``turn_embeddings``), each shard's share in
        one call, all shards in parallel; a shard skips sessions its ledger holds. Returns, per
        shard, ``(session id, namespace, global ids)`` of the sessions written now."""
        by: dict[int, list[dict]] = {}
        for it in items:
            by.setdefault(self.shard_of(it["namespace"]), []).append(it)
        got = self._fan_method("add_sessions", {s: (key, v) for s, v in by.items()}, write=True)
        return {s: [(sid, ns, [int(i) for i in ids]) for sid, ns, ids in v] for s, v in got.items()}

    def _fan_method(self, method: str, per_shard: dict[int, tuple], write: bool = False) -> dict[int, Any]:
        """One call of the actor method ``method`` per shard, all in flight at once (reads retried)."""
        self._check_open()
        out: dict[int, Any] = {}
        pending = dict(per_shard)
        deadline = time.monotonic() + 120.0
        while pending:
            refs = {s: getattr(self._actors[s], method).remote(*a) for s, a in pending.items()}
            retry = {}
            for s, ref in refs.items():
                try:
                    out[s] = self._get(ref, s, write)
                except _Retry:
                    retry[s] = pending[s]
            pending = retry
            if pending:
                if time.monotonic() > deadline:
                    raise ShardUnavailableError(f"shards {sorted(pending)}: did not come back within 120 s")
                time.sleep(0.05)
        return out

    # ------------------------------------------------------------------ maintenance (all shards)
    def flush(self) -> None:
        self._fan("write", {s: ("flush", (), {}) for s in range(self._n)})

    def snapshot(self) -> None:
        self._fan("write", {s: ("snapshot", (), {}) for s in range(self._n)})

    def compact(self) -> None:
        self._fan("write", {s: ("compact", (), {}) for s in range(self._n)})

    def memory_bytes(self) -> int:
        """Heap bytes of all shards' native stores."""
        return int(sum(self._fan("read", {s: ("memory_bytes", (), {}) for s in range(self._n)}).values()))

    def shard_stats(self) -> list[dict[str, int]]:
        """Per shard: ``namespaces`` and ``memory_bytes`` (for balance checks and capacity planning)."""
        ns = self._fan("read", {s: ("namespaces", (), {}) for s in range(self._n)})
        mb = self._fan("read", {s: ("memory_bytes", (), {}) for s in range(self._n)})
        return [dict(shard=s, namespaces=len(ns[s]), memory_bytes=int(mb[s])) for s in range(self._n)]

    def close(self) -> None:
        """Close every shard's store (snapshot + fsync) and end the actors. Idempotent."""
        if self._closed:
            return
        try:
            self._ray.get([a.close.remote() for a in self._actors])
        finally:
            for a in self._actors:
                self._ray.kill(a, no_restart=True)
            self._actors = []
            self._closed = True

class _Retry(Exception):
    pass


def _check_store_options(options: dict) -> None:
    """Validate the shards' MemoryStore options in the caller (a bad value raises the store's own
    error naming it, before any manifest or actor exists): open and close a throwaway store."""
    import tempfile

    from ...store.engine import MemoryStore

    for k in ("path", "dim", "metric", "id_range"):
        if k in options:
            raise bad_arg("store_options", "MemoryStore options other than path/dim/metric/id_range (each shard has its own)", k)
    with tempfile.TemporaryDirectory(prefix="memkern-sharded-check-") as d:
        try:
            MemoryStore(d, dim=1, **options).close()
        except TypeError as e:
            if isinstance(e, MemkernError):
                raise
            raise MemkernTypeError(f"store_options: {e}") from None


def _np(x: Any) -> Any:
    """Torch tensors travel to the actors as numpy arrays (the store accepts both)."""
    if is_torch(x):
        return x.detach().cpu().numpy()
    return x
