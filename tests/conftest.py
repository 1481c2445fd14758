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
