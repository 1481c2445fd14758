"""What a read returns: :class:`Record`, one version of a memory record, built from the native
engine's records."""
from __future__ import annotations

import json
import weakref
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

from ..errors import MemkernValueError, StoreCorruptedError, bad_arg
from .checks import check_ids, is_torch
from .native import native_module

__all__ = ["Record", "record_from", "loads", "turns_with_topics"]


@dataclass(frozen=True)
class Record:
    """One version of a memory record (what :meth:`MemoryStore.get` and ``history`` return).

    Attributes
    ----------
    id : int
        Record id (int64, unique in the store; never reused).
    namespace : str
        The user / agent key the record belongs to.
    summary : str
        Topic summary (for a turn record: its text, what lexical search matches: the
        ``turn_texts`` entry it was written with, else the turn's ``content``).
    turns : list[dict]
        The raw dialogue turns (``role``, ``content`` and any extra keys, as given).
    meta : dict
        Free JSON-compatible metadata.
    version : int
        1 for a new record, +1 for each ``merge`` / ``update``.
    status : str
        ``"active"`` or ``"invalidated"`` (the record's current status, also on older versions).
    created_at, updated_at : float
        Unix times (seconds) of the first version and of this version.
    event_time : float or None
        The conversation's own time of the record (unix seconds, e.g. the session date), as given
        to ``add(..., event_time=)``; ``None`` when none was given. Turn records carry their
        topic's. ``search(time_field="event")`` falls back to ``created_at`` where it is ``None``.
    invalidated_reason : str or None
        The reason given to :meth:`MemoryStore.invalidate`.
    level : str
        ``"topic"`` or ``"turn"``.
    topic_id : int or None
        For a turn record, the topic it belongs to.
    turn_ids : tuple[int, ...]
        For a topic, the ids of its turn records (two-level memory), oldest first.
    embedding : np.ndarray
        float32 ``[d]``: this record's own copy of the vector as it was when the record was read
        (a later ``update`` / ``merge`` of the id does not change it).
    """

    id: int
    namespace: str
    summary: str
    turns: list
    meta: dict
    version: int
    status: str
    created_at: float
    updated_at: float
    invalidated_reason: str | None = None
    level: str = "topic"
    topic_id: int | None = None
    turn_ids: tuple = ()
    event_time: float | None = None
    _embedding: Any = field(default=None, repr=False, compare=False)
    _store: Any = field(default=None, repr=False, compare=False)

    @property
    def embedding(self) -> np.ndarray:
        if self._embedding is None:
            store = self._store() if self._store is not None else None
            if store is None:
                raise MemkernValueError(f"Record {self.id}: its store is gone; embedding unavailable")
            object.__setattr__(self, "_embedding", store.embeddings([self.id])[0])
        return self._embedding

    @property
    def turn(self) -> dict | None:
        """For a turn record, its turn dict (``None`` for topics)."""
        return self.turns[0] if self.level == "turn" and self.turns else None


def loads(text: str, rid: Any, what: str) -> Any:
    """A record's stored JSON field ``what`` (``"turns"`` / ``"meta"``); unreadable JSON is
    :class:`~memkern.StoreCorruptedError` naming the record."""
    try:
        return json.loads(text)
    except ValueError:
        raise StoreCorruptedError(f"record {rid}: stored {what} is not valid JSON") from None


_ENUM_NAMES: Any = None  # ({Level: name}, {Status: name}) once the native module is loaded


def _enum_names() -> Any:
    global _ENUM_NAMES
    if _ENUM_NAMES is None:
        nat = native_module()
        _ENUM_NAMES = ({e: e.name for e in nat.Level.__members__.values()},
                       {e: e.name for e in nat.Status.__members__.values()})
    return _ENUM_NAMES


def record_from(r: Any, store: Any, v: Any = None) -> Record:
    """The public :class:`Record` of a native ``StoredRecord`` ``r``; with ``v`` (one of its
    ``StoredVersion``s from ``history``), that version's fields over the record's current ones."""
    level_names, status_names = _ENUM_NAMES or _enum_names()
    src = r if v is None else v
    rid = r.id
    status = status_names[r.status]
    parent = r.parent
    return Record(
        id=rid,
        namespace=r.namespace,
        summary=src.summary,
        turns=loads(src.turns_json, rid, "turns"),
        meta=loads(src.meta_json, rid, "meta"),
        version=src.version,
        status=status,
        created_at=r.created_at,
        updated_at=src.updated_at,
        invalidated_reason=r.reason if status == "invalidated" else None,
        level=level_names[r.level],
        topic_id=parent if parent >= 0 else None,
        turn_ids=tuple(r.children),
        event_time=r.event_time,
        _embedding=src.embedding,
        _store=weakref.ref(store),
    )

def turns_with_topics(store: Any, ids: Iterable[int]) -> list[tuple[Record, Record]]:
    """``(turn record, its topic record)`` pairs for turn record ids (``-1`` padding skipped), read
    through ``store.get_batch`` (two batched reads): what :meth:`MemoryStore.turns_with_topics`
    and the sharded store return. A topic id raises :class:`MemkernValueError` naming ``ids``."""
    if is_torch(ids):
        ids = ids.detach().cpu().numpy()
    flat = np.asarray(ids if hasattr(ids, "__len__") else list(ids)).ravel()
    arr = check_ids(flat[flat >= 0] if flat.size else np.zeros(0, dtype=np.int64))
    turns_ = store.get_batch(arr)
    for t in turns_:
        if t.level != "turn":
            raise bad_arg("ids", "turn record ids", f"topic id {t.id}")
    topics = {r.id: r for r in store.get_batch(sorted({t.topic_id for t in turns_}))}
    return [(t, topics[t.topic_id]) for t in turns_]
