"""memkern past one machine, on Ray (the optional extra ``memkern[ray]``).

- :class:`ShardedStore` (:mod:`memkern.distributed.sharded`): the :class:`memkern.MemoryStore`
  API over N Ray actors, each owning one store directory; namespaces routed by a stable hash.
- :func:`ingest` (:mod:`memkern.distributed.ingest`): a Ray Data pipeline from session files
  (JSONL, LongMemEval, LoCoMo) through embedding and extraction into a ShardedStore, idempotent
  per session id.
- :func:`run_jobs` (:mod:`memkern.distributed.evaluate`): evaluation jobs as Ray tasks
  (``memkern eval memory ... --ray`` runs the (seed, configuration, conversations) tasks of
  :mod:`memkern.eval.tasks` through it).
- :class:`DataParallelTrainer` (:mod:`memkern.distributed.train`): REINFORCE reranker training
  over many workers' feedback with gradients averaged by a gloo all-reduce.

Names are imported lazily: ``import memkern.distributed`` does not import Ray.
"""
from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "ShardedStore": "memkern.distributed.sharded",
    "shard_of": "memkern.distributed.sharded",
    "ShardUnavailableError": "memkern.distributed.sharded",
    "ingest": "memkern.distributed.ingest",
    "IngestReport": "memkern.distributed.ingest",
    "run_jobs": "memkern.distributed.evaluate",
    "DataParallelTrainer": "memkern.distributed.train",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'memkern.distributed' has no attribute {name!r}")
    value = getattr(importlib.import_module(mod), name)
    globals()[name] = value
    return value


def require_ray():
    """Import and return :mod:`ray`, or raise a :class:`memkern.MemkernError` saying how to get it."""
    try:
        import ray
    except ImportError:  # pragma: no cover - the extra is installed in the test environment
        from ..errors import MemkernError

        raise MemkernError("memkern.distributed needs Ray: pip install 'memkern[ray]'") from None
    return ray


def ensure_ray(**init_kwargs: Any):
    """Start a local Ray instance unless one is running (``include_dashboard=False`` by default);
    returns :mod:`ray`."""
    ray = require_ray()
    if not ray.is_initialized():
        kw = dict(include_dashboard=False, ignore_reinit_error=True, log_to_driver=False)
        kw.update(init_kwargs)
        ray.init(**kw)
    return ray
