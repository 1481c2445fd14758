"""memkern: fast, correct primitives for long-term memory in LLM agents.

Public names are imported lazily so that ``import memkern`` stays cheap (no torch, no
transformers until a name that needs them is touched).
"""
from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any

from .errors import (
    BackendUnavailableError,
    MemkernError,
    MemkernKeyError,
    MemkernTypeError,
    MemkernValueError,
    MissingDependencyError,
    StoreCorruptedError,
)

from .base.version import __version__

logging.getLogger("memkern").addHandler(logging.NullHandler())

# public name -> module that defines it
_LAZY = {
    "MemoryStore": "memkern.store",
    "Record": "memkern.store",
    "InMemoryStore": "memkern.store.memory",
    "AsyncMemoryStore": "memkern.store.aio",
    "export_store": "memkern.store.transfer",
    "import_store": "memkern.store.transfer",
    "Reranker": "memkern.score.reranker",
    "Selection": "memkern.score.reranker",
    "ReinforceTrainer": "memkern.score.trainer",
    "Embedder": "memkern.models",
    "ChatModel": "memkern.models",
    "OpenAIChatModel": "memkern.models",
    "RMM": "memkern.loops.rmm",
    "RMMConfig": "memkern.loops.rmm",
    "MemReread": "memkern.loops.memreread",
    "ops": "memkern.ops",
    "rerank_scores": "memkern.ops",
    "data": "memkern.data",
    "protocols": "memkern.protocols",
}

__all__ = [
    "BackendUnavailableError",
    "MemkernError",
    "MemkernKeyError",
    "MemkernTypeError",
    "MemkernValueError",
    "MissingDependencyError",
    "StoreCorruptedError",
    "__version__",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'memkern' has no attribute {name!r}")
    module = importlib.import_module(mod)
    value = module if mod == f"memkern.{name}" else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:  # pragma: no cover
    from . import data, ops, protocols
    from .loops.memreread.loop import MemReread
    from .models import ChatModel, Embedder, OpenAIChatModel
    from .score.ops.functional import rerank_scores
    from .score.reranker import Reranker, Selection
    from .score.trainer import ReinforceTrainer
    from .loops.rmm import RMM, RMMConfig
    from .store.engine import MemoryStore, Record
    from .store.memory import InMemoryStore
    from .store.aio import AsyncMemoryStore
    from .store.transfer import export_store, import_store
