"""``ShardedStore``: the :class:`memkern.MemoryStore` API over N Ray actors, one store directory each.

Layout on disk (``path``)::

    manifest.json        {"format": 2, "dim", "metric", "shards": N, "id_shift": 48}
    shard-000/ ...       one MemoryStore directory per shard (its own WAL + snapshots)
    rebalance.json       only while a rebalance runs: its journal (see :meth:`ShardedStore.rebalance`)
    moved.parts/         only while a rebalance runs: the ids each finished move took along
    locations.npz        records living off their home shard (moved by a rebalance): sorted ids + shard

Routing: a namespace lives on exactly one shard, ``shard_of(namespace, N)`` =
``blake2b(namespace as UTF-8, 8-byte digest) as a little-endian uint64, mod N``: stable across
processes, machines and Python versions (never Python's salted ``hash()``).

Ids: the store of shard ``s`` hands out the ids of its own range ``[s << 48, (s + 1) << 48)``
(``MemoryStore(id_range=...)``; never reused), and those ids are the ones every call sees: no
translation. Every id is therefore unique across shards, and its *home* shard is ``id >> 48``.
A rebalance moves records with their ids (:meth:`ShardedStore.rebalance`): a moved record lives
off its home shard, and ``locations.npz`` (sorted ids + their shard, loaded by the caller, 10 bytes
per moved record) routes it; every other id routes itself to ``id >> 48``. The destination store
refuses an incoming id that would collide (one it holds, or one of its own unused range), so a
moved id can never be handed out again. A shard may hold up to 2**48 ids and there may be up to
2**15 shards (ids stay below 2**63). Shard directories are never deleted (also not by a rebalance
to fewer shards), so a shard's range is never handed out twice. Stores of format 1 (ids local to
each shard, before moves kept them) are refused with a clear error.

Durability: each actor opens its store with the given options (``fsync="always"`` by default).
An actor that dies is restarted by Ray (``max_restarts``) and reopens its directory, replaying the
log: every write the caller saw acknowledged is there. A write whose actor died before it replied
raises :class:`ShardUnavailableError`: its outcome is unknown (the store applied it atomically or
not at all); reads are retried once the actor is back.

Fan-out: calls that name several ids (``get_batch``, ``embeddings``) or several namespaces
(:meth:`ShardedStore.search_many`, :meth:`ShardedStore.namespaces`) send one call per shard at once
and merge the results in the caller, in the caller's order.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import time
import weakref
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from ..base.atomic import atomic_write
from ..errors import MemkernError, MemkernKeyError, MemkernTypeError, MemkernValueError, bad_arg
from ..store.checks import check_ids, check_namespace, is_torch
from ..store.record import turns_with_topics as _turns_with_topics

log = logging.getLogger("memkern")

__all__ = ["ShardedStore", "ShardUnavailableError", "shard_of", "ID_SHIFT", "MAX_SHARDS"]

#: Bits of an id below its home shard's index: shard ``s`` hands out ``[s << ID_SHIFT, (s + 1) << ID_SHIFT)``.
ID_SHIFT = 48
#: Most shards a store may have (ids stay below 2**63).
MAX_SHARDS = 1 << (63 - ID_SHIFT)
_FORMAT = 2


class ShardUnavailableError(MemkernError, RuntimeError):
    """A shard actor died while it ran a write: the write may or may not have been applied."""


def shard_of(namespace: str, shards: int) -> int:
    """The shard (``0..shards-1``) that holds ``namespace``: blake2b-64 of its UTF-8 bytes mod ``shards``."""
    h = hashlib.blake2b(namespace.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(h, "little") % shards


def id_range(shard: int) -> tuple[int, int]:
    """``(first, end)``: the ids the store of ``shard`` hands out (its home range)."""
    return shard << ID_SHIFT, (shard + 1) << ID_SHIFT


def _write_json_atomic(path: Path, obj: Any) -> None:
    _write_atomic(path, lambda f: f.write(json.dumps(obj).encode("utf-8")))


def _write_atomic(path: Path, write: Any) -> None:
    """``write(binary file)`` into ``path``: the one atomic durable write
    (:func:`memkern.base.atomic.atomic_write`)."""
    atomic_write(path, write)


# ------------------------------------------------------------------------------------ the actor

class _Shard:
    """Body of a shard actor: one :class:`memkern.MemoryStore` on one directory."""

    def __init__(self, directory: str, shard: int, dim: int, metric: str, options: dict) -> None:
        from ..store.engine import MemoryStore

        self.directory = directory
        self.store = MemoryStore(directory, dim=dim, metric=metric, id_range=id_range(shard), **options)

    def ping(self) -> int:
        return os.getpid()

    # generic dispatch: reads may be retried after a restart, writes never are
    def read(self, name: str, args: tuple, kwargs: dict) -> Any:
        return self._strip(getattr(self.store, name)(*args, **kwargs))

    def write(self, name: str, args: tuple, kwargs: dict) -> Any:
        return self._strip(getattr(self.store, name)(*args, **kwargs))

    @staticmethod
    def _strip(value: Any) -> Any:
        from ..store.engine import Record

        if isinstance(value, Record):
            return dataclasses.replace(value, _store=None)
        if isinstance(value, list) and value and isinstance(value[0], Record):
            return [dataclasses.replace(r, _store=None) for r in value]
        return value

    def search_many(self, requests: list[tuple[str, Any, dict]]) -> list[tuple[np.ndarray, np.ndarray]]:
        return [self.store.search(ns, q, **kw) for ns, q, kw in requests]

    def ingested_sessions(self, key: str) -> list[tuple[str, str]]:
        """``(namespace, session id)`` of the topic records whose ``meta[key]`` is a session id
        (the ingest ledger), read once per actor life from the store's meta index: the distinct
        values of ``key`` per namespace (``meta_values``; no record is read). The index is derived
        from the very records a session's atomic ``add_batch`` writes (also on log replay and
        snapshot load), so it cannot fall out of step with them."""
        if getattr(self, "_ledger", None) is None:
            n = self.store._n()
            self._ledger = {(ns, v) for ns in self.store.namespaces() for v in n.meta_values(ns, key, 0)
                            if isinstance(v, str)}
        return sorted(self._ledger)

    def add_sessions(self, key: str, items: list[dict]) -> list[tuple[str, str, list[int]]]:
        """Write each item's topics (one atomic ``add_batch`` per session, ``meta[key]`` = its
        session id) unless the ledger already holds ``(namespace, session id)``; returns
        ``(session id, namespace, local ids)`` of the sessions written now."""
        self.ingested_sessions(key)
        done = self._ledger
        out = []
        for it in items:
            sid, ns = str(it["session_id"]), it["namespace"]
            if (ns, sid) in done:  # already written (an earlier run, or twice in this run)
                continue
            if not it["summaries"]:
                out.append((sid, ns, []))
                continue
            metas = [dict(m, **{key: sid}) for m in it["metas"]]
            kw = {}
            if it.get("turn_embeddings") is not None:
                kw["turn_embeddings"] = it["turn_embeddings"]
            ids = self.store.add_batch(ns, it["summaries"], it["embeddings"], it["turns"], metas, **kw)
            done.add((ns, sid))
            out.append((sid, ns, [int(i) for i in ids]))
        return out

    # ---- rebalance helpers
    def _ns_ids(self, ns: str) -> np.ndarray:
        return np.concatenate([np.asarray(self.store.ids(ns, include_invalidated=True, level=lv), np.int64)
                               for lv in ("topic", "turn")])

    def export_namespace(self, ns: str) -> list[dict]:
        """Every record of ``ns`` (topics and turns, active and invalidated) as export-format record
        dicts with their whole history (:func:`memkern.store.transfer.export_records`)."""
        from ..store.transfer.install import export_records

        ids = np.sort(self._ns_ids(ns))
        return export_records(self.store, ids) if len(ids) else []

    def import_namespace(self, ns: str, records: list[dict]) -> int:
        """Write ``records`` (from :meth:`export_namespace`) into ``ns`` here with their ids and
        histories: one atomic, logged write (:func:`memkern.store.transfer.import_records`). Idempotent:
        when this shard already holds all of them (an interrupted run's write landed) it writes
        nothing; an id deleted here and not compacted away yet (the namespace left this shard
        before) makes it compact once and retry. Returns the records written."""
        from ..errors import MemkernKeyError as _KeyError
        from ..store.transfer.install import import_records

        if not records:
            return 0
        want = np.array([r["id"] for r in records], np.int64)
        held = np.isin(want, self._ns_ids(ns))
        if held.all():  # the atomic import of an interrupted run landed: nothing twice
            return 0
        if held.any():
            raise MemkernError(f"shard {self.directory}: namespace {ns!r} holds {int(held.sum())} of the "
                               f"{len(want)} records being moved in (an import is atomic: expected all or none)")
        try:
            return import_records(self.store, ns, records)
        except _KeyError as e:
            if "compact" not in str(e):
                raise
            self.store.compact()  # drops the tombstones of ids that left this shard earlier
            return import_records(self.store, ns, records)

    def drop_namespace(self, ns: str) -> int:
        """Delete every topic record of ``ns`` (their turn records go with them); returns how many."""
        ids = self.store.ids(ns, include_invalidated=True)
        for rid in ids:
            self.store.delete(int(rid))
        return int(len(ids))

    def close(self) -> None:
        self.store.close()


# ------------------------------------------------------------------------------------ the store

class ShardedStore:
    """The :class:`memkern.MemoryStore` API over ``shards`` Ray actors, one store directory each.

    Parameters
    ----------
    path : str or os.PathLike
        Folder of the sharded store (created if missing); see the module docstring for its layout.
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
        from . import ensure_ray

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
                    f"{man}: expected format {_FORMAT}, got format 1 (a sharded store whose shards numbered ids "
                    "locally, written before rebalancing kept ids): export each shard's namespaces "
                    "(memkern.store.transfer.export_store) and add them to a new ShardedStore")
            if m.get("format") != _FORMAT or m.get("id_shift") != ID_SHIFT:
                raise MemkernValueError(f"{man}: expected format {_FORMAT} with id_shift {ID_SHIFT}, got {m}")
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
            m = dict(format=_FORMAT, dim=int(dim), metric=metric or "ip", shards=int(shards), id_shift=ID_SHIFT)
            _write_json_atomic(man, m)
        self._manifest = m
        self._dim = int(m["dim"])
        self._metric = str(m["metric"])
        self._n = int(m["shards"])
        self._store_options = dict(store_options)
        self._ray = ensure_ray()
        opts = dict(num_cpus=0, max_restarts=max_restarts, max_task_retries=0)
        opts.update(actor_options or {})
        self._actor_cls = self._ray.remote(**opts)(_Shard)
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
        from ..store.checks import check_id

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

    # ------------------------------------------------------------------ rebalance
    def rebalance(self, new_shards: int) -> dict[str, int]:
        """Move whole namespaces so that each lives on ``shard_of(namespace, new_shards)``.

        Explicit and resumable: the plan is written to ``rebalance.json`` (a journal) before
        anything moves, and each namespace advances ``pending -> copied -> done`` with the
        journal rewritten atomically after each step. A copy is one atomic, logged write on the
        destination (:func:`memkern.store.transfer.import_records`: every record with its id, whole
        version history, ``created_at`` / ``updated_at``, ``event_time``, status and reason, and
        the topic <-> turn links); the ids it took along are saved (``moved.parts/``, fsynced)
        before the journal says ``copied``, and the source copy is deleted only then. Calling
        ``rebalance`` again (or reopening the store) after a crash resumes from the journal: a
        copy that landed before the crash is found on the destination and not written twice.
        Routing switches to ``new_shards`` when every move is done: ``locations.npz`` (the moved
        ids' shards) is written first, then the manifest.

        Ids do not change: a moved record keeps its id, which routes to its new shard through
        ``locations.npz``. Do not write to the store while a rebalance runs (a namespace being
        moved is copied as it was when its move started).

        Returns
        -------
        dict
            ``{"namespaces": moved namespaces, "records": moved records (topics and turns)}``.
        """
        self._check_open()
        if isinstance(new_shards, bool) or not isinstance(new_shards, int) or not 1 <= new_shards <= MAX_SHARDS:
            raise bad_arg("new_shards", f"an int in 1..{MAX_SHARDS}", new_shards)
        jpath = self._path / "rebalance.json"
        if jpath.exists():
            journal = json.loads(jpath.read_text())
            if journal["to"] != new_shards:
                raise bad_arg("new_shards", f"{journal['to']} (an interrupted rebalance to {journal['to']} shards "
                              f"must finish first)", new_shards)
        else:
            if new_shards == self._n:
                return {"namespaces": 0, "records": 0}
            moves = []
            for s in range(self._n):
                for ns in self._call(s, "read", "namespaces"):
                    d = shard_of(ns, new_shards)
                    if d != s:
                        moves.append(dict(ns=ns, src=s, dst=d, state="pending"))
            for f in (self._path / "moved.parts").glob("*"):  # leftovers of a run cut short after its end
                f.unlink()
            journal = {"from": self._n, "to": new_shards, "moves": moves}
            _write_json_atomic(jpath, journal)
        self._start_actors(max(journal["from"], journal["to"]))
        parts = self._path / "moved.parts"
        parts.mkdir(mode=0o700, exist_ok=True)
        for mi, mv in enumerate(journal["moves"]):
            ns, src, dst = mv["ns"], mv["src"], mv["dst"]
            if mv["state"] == "pending":
                records = self._get(self._actors[src].export_namespace.remote(ns), src, True)
                self._get(self._actors[dst].import_namespace.remote(ns, records), dst, True)
                if getattr(self, "_crash_after_copy", False):
                    raise RuntimeError("rebalance: simulated crash after a copy (test hook _crash_after_copy)")
                ids = np.array([r["id"] for r in records], np.int64)
                _write_atomic(parts / f"{mi:08d}.npy", lambda f: np.save(f, ids))
                mv["state"] = "copied"
                _write_json_atomic(jpath, journal)
            if mv["state"] == "copied":
                self._get(self._actors[src].drop_namespace.remote(ns), src, True)
                mv["state"] = "done"
                _write_json_atomic(jpath, journal)
                crash = getattr(self, "_crash_after_moves", None)
                if crash is not None and sum(m["state"] == "done" for m in journal["moves"]) >= crash:
                    raise RuntimeError("rebalance: simulated crash (test hook _crash_after_moves)")
        # the routing table: the earlier one updated with this run's moves (latest wins; a record
        # back on its home shard needs no entry). Rewriting it on a resumed run gives the same table.
        table = dict(zip(self._moved_ids.tolist(), self._moved_to.tolist()))
        moved = 0
        for mi, mv in enumerate(journal["moves"]):
            f = parts / f"{mi:08d}.npy"
            if f.exists():
                for i in np.load(f).tolist():
                    table[i] = mv["dst"]
                    moved += 1
        table = {i: s for i, s in table.items() if s != i >> ID_SHIFT}
        order = np.array(sorted(table), np.int64)
        dests = np.array([table[i] for i in order.tolist()], np.int64)
        self._fan("write", {s: ("flush", (), {}) for s in range(len(self._actors))})
        _write_atomic(self._path / "locations.npz", lambda f: np.savez(f, ids=order, shards=dests))
        self._manifest["shards"] = journal["to"]
        _write_json_atomic(self._path / "manifest.json", self._manifest)
        self._moved_ids, self._moved_to = order, dests
        self._n = journal["to"]
        jpath.unlink()
        for f in parts.glob("*"):
            f.unlink()
        parts.rmdir()
        # shards beyond the new count stay on disk (their id ranges are never handed out again)
        for a in self._actors[self._n:]:
            self._ray.get(a.close.remote())
            self._ray.kill(a, no_restart=True)
        self._actors = self._actors[: self._n]
        return {"namespaces": len(journal["moves"]), "records": moved}


class _Retry(Exception):
    pass


def _check_store_options(options: dict) -> None:
    """Validate the shards' MemoryStore options in the caller (a bad value raises the store's own
    error naming it, before any manifest or actor exists): open and close a throwaway store."""
    import tempfile

    from ..store.engine import MemoryStore

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
