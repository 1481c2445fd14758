"""Test-wide settings: pinned threads, Triton interpreter on machines without CUDA.

TRITON_INTERPRET must be set before any module defining ``@triton.jit`` kernels is imported,
so it is set here, at collection start.
"""
from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Tests never write to the user's data folder (the default store lives there): a store opened
# without a path during the tests goes to a throw-away folder. The model cache is kept.
import tempfile  # noqa: E402

os.environ["XDG_DATA_HOME"] = tempfile.mkdtemp(prefix="memkern-tests-data-")
os.environ.pop("MEMKERN_STORE", None)


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # pragma: no cover
        return False


if not _cuda_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

torch.set_num_threads(1)


import pytest  # noqa: E402


@pytest.fixture
def device() -> torch.device:
    """Where kernel and reranker tests put their tensors: CUDA when present, else the CPU (with the
    Triton interpreter, TRITON_INTERPRET=1, set above)."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


# ----------------------------------------------------------------------------- the store suite
#: The store implementations the shared store tests run on (issue 12: the same suite on both):
#: the native :class:`memkern.MemoryStore` and the pure-Python :class:`memkern.InMemoryStore`.
STORE_KINDS = ("native", "inmemory")


@pytest.fixture(params=STORE_KINDS)
def store_kind(request) -> str:
    return request.param


@pytest.fixture
def make_store(store_kind, tmp_path):
    """``make_store(dim, metric=None, name="s", **kw)``: a new store of the parametrized kind
    (native stores under ``tmp_path/name``, with ``kw`` passed on; the in-memory store takes
    ``dim``, ``metric`` and ``ef_search`` only). Every store made is closed at the end."""
    from memkern.inmemory import InMemoryStore
    from memkern.store import MemoryStore

    opened = []

    def make(dim: int, metric: str | None = None, name: str = "s", **kw):
        if store_kind == "native":
            s = MemoryStore(tmp_path / name, dim=dim, metric=metric, **kw)
        else:
            s = InMemoryStore(dim, metric or "ip", **{k: v for k, v in kw.items() if k == "ef_search"})
        opened.append(s)
        return s

    yield make
    for s in opened:
        s.close()
