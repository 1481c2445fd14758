"""One small local Ray instance shared by the tests/test_distributed*.py modules (started once per
pytest process, 2 CPUs, no dashboard; Ray shuts it down at exit)."""
from __future__ import annotations

import os

import pytest


def local_ray():
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        os.environ.setdefault("RAY_DEDUP_LOGS", "0")
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=300 * 1024 * 1024,
                 configure_logging=False, runtime_env={"env_vars": {"OMP_NUM_THREADS": "1",
                                                                    "TOKENIZERS_PARALLELISM": "false"}})
    return ray
