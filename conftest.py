"""Settings shared by the tests (``tests/``) and the pytest benchmarks (``bench/``): the one source.

pytest loads this file (at the repository root) before any ``tests/`` or ``bench/`` module, so:
threads are pinned (2 shared cores), model hubs are off (everything is offline), and on machines
without CUDA the Triton interpreter is on. TRITON_INTERPRET must be set before any module
defining ``@triton.jit`` kernels is imported, hence here, at collection start. ``tests/conftest.py``
adds what only the tests need (a throw-away data folder).
"""
from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # pragma: no cover
        return False


if not _cuda_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture
def device() -> torch.device:
    """Where kernel and reranker tests put their tensors: CUDA when present, else the CPU (with the
    Triton interpreter, TRITON_INTERPRET=1, set above)."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
