"""``ShardedStore``: the :class:`memkern.MemoryStore` API over N Ray actors, one store directory each.

Layout on disk (``path``)::

    manifest.json        {"format": 1, "dim", "metric", "shards": N, "id_shift": 48}
    shard-000/ ...       one MemoryStore directory per shard (its own WAL + snapshots)
    rebalance.json       only while a rebalance runs: its journal (see :meth:`ShardedStore.rebalance`)
    moved-ids-<k>.npz    old -> new ids of the records the k-th rebalance moved

Routing: a namespace lives on exactly one shard, ``shard_of(namespace, N)`` =
``blake2b(namespace as UTF-8, 8-byte digest) as a little-endian uint64, mod N``: stable across
processes, machines and Python versions (never Python's salted ``hash()``).

Ids: the store of shard ``s`` allocates its own ids ``0, 1, 2, ...`` (never reused); the sharded
store hands out ``global = s << 48 | local``. Every id is therefore unique across shards and
routes itself: ``get``/``update``/``delete``/``embeddings(ids)`` go to shard ``id >> 48``.
A shard may hold up to 2**48 ids and there may be up to 2**15 shards (ids stay below 2**63).
Shard directories are never deleted (also not by a rebalance to fewer shards), so a shard's local
ids are never handed out twice.

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

from ..errors import MemkernError, MemkernKeyError, MemkernTypeError, MemkernValueError, bad_arg
from ..store import _check_ids, _check_namespace, _is_torch
from ..store import turns_with_topics as _turns_with_topics

log = logging.getLogger("memkern")

__all__ = ["ShardedStore", "ShardUnavailableError", "shard_of", "ID_SHIFT", "MAX_SHARDS"]

#: Bits of a global id that hold the shard-local id; the shard index sits above them.
ID_SHIFT = 48
_LOCAL_MASK = (1 << ID_SHIFT) - 1
#: Most shards a store may have (global ids stay below 2**63).
MAX_SHARDS = 1 << (63 - ID_SHIFT)
_FORMAT = 1


class ShardUnavailableError(MemkernError, RuntimeError):
    """A shard actor died while it ran a write: the write may or may not have been applied."""


def shard_of(namespace: str, shards: int) -> int:
    """The shard (``0..shards-1``) that holds ``namespace``: blake2b-64 of its UTF-8 bytes mod ``shards``."""
    h = hashlib.blake2b(namespace.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(h, "little") % shards


def _to_global(shard: int, local: int) -> int:
    if local > _LOCAL_MASK:
        raise MemkernError(f"shard {shard}: local id {local} exceeds 2**{ID_SHIFT} - 1 (shard full)")
    return (shard << ID_SHIFT) | local


def _split_id(gid: int) -> tuple[int, int]:
    return gid >> ID_SHIFT, gid & _LOCAL_MASK


def _ids_to_global(shard: int, ids: np.ndarray) -> np.ndarray:
    ids = np.asarray(ids, dtype=np.int64)
    if ids.size and int(ids.max()) > _LOCAL_MASK:
        raise MemkernError(f"shard {shard}: local id {int(ids.max())} exceeds 2**{ID_SHIFT} - 1 (shard full)")
    return np.where(ids >= 0, ids | np.int64(shard << ID_SHIFT), ids)


def _write_json_atomic(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ------------------------------------------------------------------------------------ the actor

class _Shard:
    """Body of a shard actor: one :class:`memkern.MemoryStore` on one directory."""

    def __init__(self, directory: str, dim: int, metric: str, options: dict) -> None:
        from ..store import MemoryStore

        self.directory = directory
        self.store = MemoryStore(directory, dim=dim, metric=metric, **options)

    def ping(self) -> int:
        return os.getpid()

    # generic dispatch: reads may be retried after a restart, writes never are
    def read(self, name: str, args: tuple, kwargs: dict) -> Any:
        return self._strip(getattr(self.store, name)(*args, **kwargs))

    def write(self, name: str, args: tuple, kwargs: dict) -> Any:
        return self._strip(getattr(self.store, name)(*args, **kwargs))

    @staticmethod
    def _strip(value: Any) -> Any:
        from ..store import Record

        if isinstance(value, Record):
            return dataclasses.replace(value, _store=None)
        if isinstance(value, list) and value and isinstance(value[0], Record):
            return [dataclasses.replace(r, _store=None) for r in value]
        return value

    def search_many(self, requests: list[tuple[str, Any, dict]]) -> list[tuple[np.ndarray, np.ndarray]]:
        return [self.store.search(ns, q, **kw) for ns, q, kw in requests]

    def ingested_sessions(self, key: str) -> list[tuple[str, str]]:
        """``(namespace, session id)`` of the topic records whose ``meta[key]`` names a session
        (the ingest ledger: the store itself, read once per actor life)."""
        if getattr(self, "_ledger", None) is None:
            out: set[tuple[str, str]] = set()
            for ns in self.store.namespaces():
                ids = self.store.ids(ns, include_invalidated=True)
                if len(ids):
                    for r in self.store.get_batch(ids):
                        v = r.meta.get(key) if isinstance(r.meta, dict) else None
                        if v is not None:
                            out.add((ns, str(v)))
            self._ledger = out
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
    def export_namespace(self, ns: str) -> list[dict]:
        """Every topic record of ``ns`` (active and invalidated) with what re-creating it needs."""
        st = self.store
        ids = st.ids(ns, include_invalidated=True)
        out = []
        if not len(ids):
            return out
        recs = st.get_batch(ids)
        embs = st.embeddings(ids)
        for r, e in zip(recs, embs):
            te, turn_ids = None, []
            if r.turn_ids and len(r.turn_ids) == len(r.turns):
                kids = st.get_batch(list(r.turn_ids))
                pos = [k.meta.get("turn_position") if isinstance(k.meta, dict) else None for k in kids]
                if sorted(p for p in pos if isinstance(p, int)) == list(range(len(r.turns))):
                    vec = st.embeddings(list(r.turn_ids))
                    te = np.empty_like(vec)
                    te[pos] = vec
                    turn_ids = [0] * len(pos)
                    for kid, p in zip(kids, pos):
                        turn_ids[p] = int(kid.id)
            out.append(dict(id=int(r.id), summary=r.summary, embedding=e, turns=list(r.turns), meta=dict(r.meta),
                            status=r.status, reason=r.invalidated_reason, turn_embeddings=te, turn_ids=turn_ids,
                            event_time=getattr(r, "event_time", None)))
        return out

    def import_namespace(self, ns: str, items: list[dict]) -> list[tuple[int, list[int]]]:
        """Replace ``ns`` on this shard by ``items`` (from :meth:`export_namespace`): a partial
        earlier copy is deleted first, the records are added in one atomic ``add_batch``. Returns
        ``(new topic id, new turn ids in turn order)`` per item."""
        self.drop_namespace(ns)
        if not items:
            return []
        st = self.store
        tes = [it["turn_embeddings"] for it in items]
        kw: dict[str, Any] = {}
        if any(t is not None for t in tes):
            kw["turn_embeddings"] = tes
        if any(it.get("event_time") is not None for it in items):
            kw["event_times"] = [it.get("event_time") for it in items]
        ids = st.add_batch(ns, [it["summary"] for it in items], np.stack([it["embedding"] for it in items]),
                           [it["turns"] for it in items], [it["meta"] for it in items], **kw)
        out = []
        for rid, it in zip(ids, items):
            if it["status"] == "invalidated":
                st.invalidate(int(rid), it["reason"] or "")
            out.append((int(rid), [int(t) for t in st.get(int(rid)).turn_ids]))
        return out

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
        self._path.mkdir(parents=True, exist_ok=True)
        man = self._path / "manifest.json"
        if man.exists():
            m = json.loads(man.read_text())
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
            self._actors.append(self._actor_cls.remote(d, self._dim, self._metric, self._store_options))
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

    def _shard_of_id(self, id: Any, name: str = "id") -> tuple[int, int]:
        from ..store import _check_id

        gid = _check_id(id, name)
        s, local = _split_id(gid)
        if s >= len(self._actors) or s >= self._n and not (self._path / "rebalance.json").exists():
            raise MemkernKeyError(f"{name}: unknown id {gid} (shard {s} of a {self._n}-shard store)")
        return s, local

    def _record(self, shard: int, rec: Any) -> Any:
        return dataclasses.replace(
            rec, id=_to_global(shard, rec.id),
            topic_id=_to_global(shard, rec.topic_id) if rec.topic_id is not None else None,
            turn_ids=tuple(_to_global(shard, t) for t in rec.turn_ids), _store=weakref.ref(self))

    def shard_of(self, namespace: str) -> int:
        """The shard index that holds ``namespace`` now."""
        return shard_of(_check_namespace(namespace), self._n)

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
        return _to_global(s, int(self._call(s, "write", "add", namespace, summary, _np(embedding), turns, meta,
                                            **kwargs)))

    def add_batch(self, namespace: str, summaries: Sequence[str], embeddings: Any,
                  turns: Sequence[list[dict] | None] | None = None, metas: Sequence[dict | None] | None = None,
                  **kwargs: Any) -> np.ndarray:
        """:meth:`memkern.MemoryStore.add_batch` (atomic) on the namespace's shard; global ids int64 ``[n]``."""
        s = self.shard_of(namespace)
        ids = self._call(s, "write", "add_batch", namespace, summaries, _np(embeddings), turns, metas, **kwargs)
        return _ids_to_global(s, ids)

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
        shards = ids >> ID_SHIFT
        for s in np.unique(shards):
            if int(s) >= self._n:
                bad = int(ids[shards == s][0])
                raise MemkernKeyError(f"{name}: unknown id {bad} (shard {int(s)} of a {self._n}-shard store)")
        return {int(s): np.flatnonzero(shards == s) for s in np.unique(shards)}

    def get_batch(self, ids: Iterable[int]) -> list[Any]:
        """Records of global ``ids`` (int64 ``[n]``), in order: one call per shard involved, in parallel."""
        arr = _check_ids(list(ids) if not hasattr(ids, "__array__") and not _is_torch(ids) else ids)
        groups = self._group(arr, "ids")
        res = self._fan("read", {s: ("get_batch", (arr[pos] & _LOCAL_MASK,), {}) for s, pos in groups.items()})
        out: list[Any] = [None] * len(arr)
        for s, pos in groups.items():
            for p, r in zip(pos, res[s]):
                out[p] = self._record(s, r)
        return out

    def embeddings(self, ids: Any) -> np.ndarray:
        """Stored vectors of global ``ids`` as float32 ``[n, d]`` (one call per shard, in parallel)."""
        arr = _check_ids(ids)
        groups = self._group(arr, "ids")
        res = self._fan("read", {s: ("embeddings", (arr[pos] & _LOCAL_MASK,), {}) for s, pos in groups.items()})
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
        return _ids_to_global(s, ids), scores

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
                    out[i] = (_ids_to_global(s, ids), sc)
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
        return _ids_to_global(s, self._call(s, "read", "ids", namespace, include_invalidated, **kwargs))

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
        return {s: [(sid, ns, [_to_global(s, i) for i in ids]) for sid, ns, ids in v] for s, v in got.items()}

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
    def rebalance(self, new_shards: int) -> dict[int, int]:
        """Move whole namespaces so that each lives on ``shard_of(namespace, new_shards)``.

        Explicit and resumable: the plan is written to ``rebalance.json`` (a journal) before
        anything moves, and each namespace advances ``pending -> copied -> done`` with the
        journal rewritten atomically after each step. A copy is one atomic ``add_batch`` on the
        destination (after deleting any partial copy an interrupted run left); the source copy is
        deleted only once the journal says ``copied``. Calling ``rebalance`` again (or reopening
        the store) after a crash resumes from the journal; routing switches to ``new_shards``
        when every move is done.

        Moved records get new ids on their new shard (the id names its shard); the returned dict
        maps old global ids to new ones (topics and turn records) and is also saved as
        ``moved-ids-<k>.npz``. A moved record keeps its summary, embedding, turns (with turn
        records), meta, status and event time; it starts a new version history (version 1).
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
                return {}
            moves = []
            for s in range(self._n):
                for ns in self._call(s, "read", "namespaces"):
                    d = shard_of(ns, new_shards)
                    if d != s:
                        moves.append(dict(ns=ns, src=s, dst=d, state="pending"))
            k = len(list(self._path.glob("moved-ids-*.npz")))
            journal = {"from": self._n, "to": new_shards, "seq": k, "moves": moves}
            _write_json_atomic(jpath, journal)
        self._start_actors(max(journal["from"], journal["to"]))
        idmap_path = self._path / f"moved-ids-{journal['seq']}.npz"
        old_ids: list[int] = []
        new_ids: list[int] = []
        parts = self._path / f"moved-ids-{journal['seq']}.parts"
        parts.mkdir(exist_ok=True)
        for mi, mv in enumerate(journal["moves"]):
            ns, src, dst = mv["ns"], mv["src"], mv["dst"]
            if mv["state"] == "pending":
                items = self._get(self._actors[src].export_namespace.remote(ns), src, True)
                created = self._get(self._actors[dst].import_namespace.remote(ns, items), dst, True)
                if getattr(self, "_crash_after_copy", False):
                    raise RuntimeError("rebalance: simulated crash after a copy (test hook _crash_after_copy)")
                o, n = [], []
                for it, (tid, kids) in zip(items, created):
                    o.append(_to_global(src, it["id"]))
                    n.append(_to_global(dst, tid))
                    for a, b in zip(it["turn_ids"], kids):
                        o.append(_to_global(src, a))
                        n.append(_to_global(dst, b))
                np.save(parts / f"{mi:08d}.npy", np.array([o, n], dtype=np.int64).reshape(2, -1))
                mv["state"] = "copied"
                _write_json_atomic(jpath, journal)
            if mv["state"] == "copied":
                self._get(self._actors[src].drop_namespace.remote(ns), src, True)
                mv["state"] = "done"
                _write_json_atomic(jpath, journal)
                crash = getattr(self, "_crash_after_moves", None)
                if crash is not None and sum(m["state"] == "done" for m in journal["moves"]) >= crash:
                    raise RuntimeError("rebalance: simulated crash (test hook _crash_after_moves)")
        for f in sorted(parts.glob("*.npy")):
            a = np.load(f)
            old_ids.extend(int(x) for x in a[0])
            new_ids.extend(int(x) for x in a[1])
        self._fan("write", {s: ("flush", (), {}) for s in range(len(self._actors))})
        np.savez(idmap_path, old=np.array(old_ids, dtype=np.int64), new=np.array(new_ids, dtype=np.int64))
        self._manifest["shards"] = journal["to"]
        _write_json_atomic(self._path / "manifest.json", self._manifest)
        self._n = journal["to"]
        jpath.unlink()
        for f in parts.glob("*.npy"):
            f.unlink()
        parts.rmdir()
        # shards beyond the new count stay on disk (their local ids are never handed out again)
        for a in self._actors[self._n:]:
            self._ray.get(a.close.remote())
            self._ray.kill(a, no_restart=True)
        self._actors = self._actors[: self._n]
        return dict(zip(old_ids, new_ids))


class _Retry(Exception):
    pass


def _check_store_options(options: dict) -> None:
    """Validate the shards' MemoryStore options in the caller (a bad value raises the store's own
    error naming it, before any manifest or actor exists): open and close a throwaway store."""
    import tempfile

    from ..store import MemoryStore

    for k in ("path", "dim", "metric"):
        if k in options:
            raise bad_arg("store_options", "MemoryStore options other than path/dim/metric", k)
    with tempfile.TemporaryDirectory(prefix="memkern-sharded-check-") as d:
        try:
            MemoryStore(d, dim=1, **options).close()
        except TypeError as e:
            if isinstance(e, MemkernError):
                raise
            raise MemkernTypeError(f"store_options: {e}") from None


def _np(x: Any) -> Any:
    """Torch tensors travel to the actors as numpy arrays (the store accepts both)."""
    if _is_torch(x):
        return x.detach().cpu().numpy()
    return x
