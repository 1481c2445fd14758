"""The shard actor of a :class:`~memkern.distributed.sharded.ShardedStore`: one
:class:`memkern.MemoryStore` on one directory, run by Ray."""
from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np

from ...errors import MemkernError
from .layout import id_range

__all__ = ["Shard"]


class Shard:
    """Body of a shard actor: one :class:`memkern.MemoryStore` on one directory."""

    def __init__(self, directory: str, shard: int, dim: int, metric: str, options: dict) -> None:
        from ...store.engine import MemoryStore

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
        from ...store.record import Record

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
        from ...store.transfer import export_records

        ids = np.sort(self._ns_ids(ns))
        return export_records(self.store, ids) if len(ids) else []

    def import_namespace(self, ns: str, records: list[dict]) -> int:
        """Write ``records`` (from :meth:`export_namespace`) into ``ns`` here with their ids and
        histories: one atomic, logged write (:func:`memkern.store.transfer.import_records`). Idempotent:
        when this shard already holds all of them (an interrupted run's write landed) it writes
        nothing; an id deleted here and not compacted away yet (the namespace left this shard
        before) makes it compact once and retry. Returns the records written."""
        from ...errors import MemkernKeyError as _KeyError
        from ...store.transfer import import_records

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
