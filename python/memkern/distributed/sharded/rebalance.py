"""The rebalance of a :class:`~memkern.distributed.sharded.ShardedStore`: whole namespaces moved to
the shards of a new shard count, resumable from its journal."""
from __future__ import annotations

import json

import numpy as np

from ...errors import bad_arg
from ...base.atomic import atomic_write
from .layout import ID_SHIFT, MAX_SHARDS, shard_of, write_json_atomic

__all__ = ["RebalanceMixin"]


class RebalanceMixin:
    """:meth:`rebalance` of :class:`~memkern.distributed.sharded.ShardedStore` (it uses the store's
    actors, journal files and routing table)."""

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
            write_json_atomic(jpath, journal)
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
                atomic_write(parts / f"{mi:08d}.npy", lambda f: np.save(f, ids))
                mv["state"] = "copied"
                write_json_atomic(jpath, journal)
            if mv["state"] == "copied":
                self._get(self._actors[src].drop_namespace.remote(ns), src, True)
                mv["state"] = "done"
                write_json_atomic(jpath, journal)
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
        atomic_write(self._path / "locations.npz", lambda f: np.savez(f, ids=order, shards=dests))
        self._manifest["shards"] = journal["to"]
        write_json_atomic(self._path / "manifest.json", self._manifest)
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
