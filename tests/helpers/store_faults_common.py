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
