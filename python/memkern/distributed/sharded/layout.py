"""A sharded store's ids, its routing of namespaces to shards and its atomic file writes
(see :mod:`memkern.distributed.sharded` for the layout on disk)."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from ...base.atomic import atomic_write

__all__ = ["FORMAT", "ID_SHIFT", "MAX_SHARDS", "id_range", "shard_of", "write_json_atomic"]


#: Bits of an id below its home shard's index: shard ``s`` hands out ``[s << ID_SHIFT, (s + 1) << ID_SHIFT)``.
ID_SHIFT = 48
#: Most shards a store may have (ids stay below 2**63).
MAX_SHARDS = 1 << (63 - ID_SHIFT)
#: ``format`` of ``manifest.json``.
FORMAT = 2


def shard_of(namespace: str, shards: int) -> int:
    """The shard (``0..shards-1``) that holds ``namespace``: blake2b-64 of its UTF-8 bytes mod ``shards``."""
    h = hashlib.blake2b(namespace.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(h, "little") % shards


def id_range(shard: int) -> tuple[int, int]:
    """``(first, end)``: the ids the store of ``shard`` hands out (its home range)."""
    return shard << ID_SHIFT, (shard + 1) << ID_SHIFT


def write_json_atomic(path: Path, obj: Any) -> None:
    """``obj`` as JSON into ``path`` by the one atomic durable write (:func:`memkern.base.atomic.atomic_write`)."""
    atomic_write(path, json.dumps(obj).encode("utf-8"))
