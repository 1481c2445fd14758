"""Test-only settings. The settings the tests share with the benchmarks (pinned threads, offline
model hubs, the Triton interpreter without CUDA, the ``device`` fixture) are in the repository's
root ``conftest.py``, which pytest loads first.
"""
from __future__ import annotations

import os
import tempfile

# Tests never write to the user's data folder (the default store lives there): a store opened
# without a path during the tests goes to a throw-away folder. The model cache is kept.
os.environ["XDG_DATA_HOME"] = tempfile.mkdtemp(prefix="memkern-tests-data-")
os.environ.pop("MEMKERN_STORE", None)


import pytest  # noqa: E402


# ----------------------------------------------------------------------------- the store suite
#: The two modes of the store engine the shared store tests run on: on disk
#: (:class:`memkern.MemoryStore`, "native") and with persistence off (:class:`memkern.InMemoryStore`).
STORE_KINDS = ("native", "inmemory")
#: MemoryStore options that only concern persistence (an InMemoryStore has none).
_PERSISTENCE_OPTIONS = ("fsync", "fsync_interval", "snapshot_every")


@pytest.fixture(params=STORE_KINDS)
def store_kind(request) -> str:
    return request.param


@pytest.fixture
def make_store(store_kind, tmp_path):
    """``make_store(dim, metric=None, name="s", **kw)``: a new store of the parametrized kind
    (disk stores under ``tmp_path/name``; ``kw`` is passed on, to the in-memory store without the
    persistence options). Every store made is closed at the end."""
    from memkern.store.memory import InMemoryStore
    from memkern.store import MemoryStore

    opened = []

    def make(dim: int, metric: str | None = None, name: str = "s", **kw):
        if store_kind == "native":
            s = MemoryStore(tmp_path / name, dim=dim, metric=metric, **kw)
        else:
            s = InMemoryStore(dim, metric or "ip", **{k: v for k, v in kw.items() if k not in _PERSISTENCE_OPTIONS})
        opened.append(s)
        return s

    yield make
    for s in opened:
        s.close()
