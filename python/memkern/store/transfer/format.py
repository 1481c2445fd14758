"""The export format's names (see :mod:`memkern.store.transfer` for the file format) and the
store's native layer that export and import use."""
from __future__ import annotations

from ..engine import MemoryStore

__all__ = ["FORMAT", "FORMAT_VERSION", "OPS", "RERANKER_FILES", "native"]

FORMAT = "memkern-export"
FORMAT_VERSION = 1
#: A version's ``op`` -> the native ``Op`` value.
OPS = {"add": 0, "merge": 1, "update": 2}
#: A reranker line's ``file`` -> the suffix of its file (:func:`memkern.base.paths.reranker_file`).
RERANKER_FILES = {"state": ".pt", "buffer": ".buffer.pt"}


def native(store: MemoryStore):
    # The store's native layer (MemoryStore.native): the export needs each version's op, the import
    # needs to add turn records under an existing topic and to write a version with a given op,
    # which the public API does not.
    return store.native
