"""Helpers shared by the store tests that inject I/O faults (test_store_faults, test_store_filters,
test_store_lexical): the native module, a fixture that clears any armed fault around each test,
and deterministic test vectors."""
from __future__ import annotations

import numpy as np
import pytest

D = 8


def native():
    """The native module (its test-only fault injector ``_test_set_fault``)."""
    from memkern import _store

    return _store


@pytest.fixture(autouse=True)
def _no_fault():
    native()._test_set_fault("")
    yield
    native()._test_set_fault("")


def emb(j: int, d: int = D) -> np.ndarray:
    """A float32 ``[d]`` vector, the same for the same ``j``."""
    return np.random.default_rng(j).standard_normal(d).astype(np.float32)


def bench_crash():
    """``bench/bench_crash.py`` loaded as a module (its campaigns' short versions run in the tests)."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "bench" / "bench_crash.py"
    spec = importlib.util.spec_from_file_location("bench_crash", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_crash"] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod
