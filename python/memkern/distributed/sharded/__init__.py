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

Modules: :mod:`~memkern.distributed.sharded.layout` (ids, routing, the atomic file writes),
:mod:`~memkern.distributed.sharded.actor` (the shard actor), :mod:`~memkern.distributed.sharded.proxy`
(:class:`ShardedStore`), :mod:`~memkern.distributed.sharded.rebalance` (moving namespaces between shards).
"""
from __future__ import annotations

from .layout import ID_SHIFT, MAX_SHARDS, id_range, shard_of
from .proxy import ShardedStore, ShardUnavailableError

__all__ = ["ShardedStore", "ShardUnavailableError", "shard_of", "ID_SHIFT", "MAX_SHARDS"]
