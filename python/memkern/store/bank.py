"""A namespace's memory bank, without models: list its records, count them, delete it.

:class:`memkern.RMM` (``rmm.inspect()``, ``rmm.stats()``) and the CLI (``memkern inspect``,
``memkern forget``, ``memkern demo``) use this one module, so printing or deleting a bank needs
no chat model, embedder or reranker.

>>> bank = Bank(store, "alice")
>>> bank.inspect()      # one dict per topic record, ordered by id
>>> bank.stats()        # {"namespace", "records", "by_status"}
>>> bank.reset()        # delete every record and the reranker files; returns the count
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..base.atomic import temp_files
from ..base.paths import RERANKER_SUFFIXES, check_namespace, reranker_file
from ..protocols import Store

__all__ = ["Bank", "namespace_ids", "reset_namespace"]


def namespace_ids(store: Store, namespace: str, include_invalidated: bool = True) -> list[int]:
    """All topic-record ids of ``namespace``, sorted (``store.ids``; turn records excluded).

    Parameters
    ----------
    store : memkern.protocols.Store
    namespace : str
    include_invalidated : bool
        Also list invalidated records (default True).

    Returns
    -------
    list[int]
        Ascending ids.
    """
    return sorted(int(i) for i in np.asarray(store.ids(namespace, include_invalidated=include_invalidated)).reshape(-1))


def reset_namespace(store: Store, namespace: str, compact: bool = True) -> int:
    """Delete every record of ``namespace`` (all versions, turns) and its reranker files, then
    compact the store so the deleted data leaves its files; returns the records deleted.

    ``namespace`` is checked (:func:`memkern.base.paths.check_namespace`) and every reranker file path
    built (inside the store folder) before anything is deleted.
    """
    check_namespace(namespace)
    files = [reranker_file(store.path, namespace, sfx) for sfx in RERANKER_SUFFIXES] \
        if getattr(store, "path", None) else []
    files += [t for f in files for t in temp_files(f)]  # left by a killed write
    ids = namespace_ids(store, namespace)
    for i in ids:
        store.delete(int(i))
    if ids and compact and hasattr(store, "compact"):
        store.compact()
    store.flush()
    for f in files:
        if f.is_file():
            f.unlink()
    return len(ids)


class Bank:
    """The memory bank of one namespace of ``store``.

    Parameters
    ----------
    store : memkern.protocols.Store
    namespace : str
        Checked with :func:`memkern.base.paths.check_namespace`.
    """

    def __init__(self, store: Store, namespace: str):
        check_namespace(namespace)
        self.store = store
        self.namespace = namespace

    def ids(self, include_invalidated: bool = True) -> list[int]:
        """Topic-record ids of the namespace, ascending (:func:`namespace_ids`)."""
        return namespace_ids(self.store, self.namespace, include_invalidated)

    def inspect(self, include_invalidated: bool = True) -> list[dict[str, Any]]:
        """The namespace's memory bank: one dict per record, ordered by id.

        Keys: ``id``, ``summary``, ``version``, ``status``, ``turns`` (count), ``turn_records``
        (count of its turn records, two-level memory), ``sessions`` (session ids of its turns),
        ``meta``.
        """
        out = []
        for i in self.ids(include_invalidated):  # Store.ids honours include_invalidated
            r = self.store.get(i)
            sessions = []
            for t in r.turns or []:
                s = t.get("session_id")
                if s is not None and s not in sessions:
                    sessions.append(s)
            out.append({
                "id": int(r.id), "summary": r.summary, "version": int(r.version),
                "status": str(r.status), "turns": len(r.turns or []),
                "turn_records": len(getattr(r, "turn_ids", ()) or ()), "sessions": sessions, "meta": dict(r.meta or {}),
            })
        return out

    def stats(self) -> dict[str, Any]:
        """``{"namespace", "records", "by_status"}``: record counts, all and by status."""
        bank = self.inspect()
        by_status: dict[str, int] = {}
        for r in bank:
            by_status[r["status"]] = by_status.get(r["status"], 0) + 1
        return {"namespace": self.namespace, "records": len(bank), "by_status": by_status}

    def reset(self, compact: bool = True) -> int:
        """Delete the whole namespace (:func:`reset_namespace`); returns the records deleted."""
        return reset_namespace(self.store, self.namespace, compact)
