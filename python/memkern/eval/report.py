"""Shared output of the memory experiments: typed results, tables, JSON, aggregation over seeds.

Every experiment module (:mod:`.granularity`, :mod:`.turn_in_topic`, :mod:`.reflection`,
:mod:`.collapse`, :mod:`.rmm_loop`, :mod:`.retrieval`) returns a subclass of
:class:`ExperimentResult` that knows its own table (:meth:`ExperimentResult.format_metrics`).
:func:`format_table` / :func:`format_aggregate` find the class by the result's
``config["experiment"]`` in :data:`RESULT_TYPES`, so they also format results read back from JSON.
"""
from __future__ import annotations

import importlib
import json
import math
import os
import platform
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Iterator, Sequence

import numpy as np

from ..base.atomic import atomic_write
from ..errors import bad_arg
from .metrics import mean_std

__all__ = ["ExperimentResult", "RESULT_TYPES", "result_type", "environment", "write_result", "format_table",
           "aggregate", "format_aggregate", "cell", "plus_minus"]

# experiment name (config["experiment"]) -> "module:class" of its result type (imported lazily)
RESULT_TYPES: dict[str, str] = {
    "granularity": "memkern.eval.granularity:GranularityResult",
    "turn-in-topic": "memkern.eval.turn_in_topic:TurnInTopicResult",
    "reflection": "memkern.eval.reflection:ReflectionResult",
    "collapse": "memkern.eval.collapse:CollapseResult",
    "rmm": "memkern.eval.rmm_loop:RMMResult",
    "retrieval": "memkern.eval.retrieval:RetrievalResult",
    "learning": "memkern.eval.learning:LearningResult",
}

_FIELDS = ("config", "dataset", "metrics", "timings", "environment")


@dataclass
class ExperimentResult(Mapping):
    """One run of one experiment; a read-only mapping over its five JSON blocks.

    Attributes
    ----------
    config : dict
        The experiment's settings; ``config["experiment"]`` names it.
    dataset : dict
        :func:`memkern.eval.data.dataset_info` (name, content hash, sizes), plus experiment notes.
    metrics : dict
        The measured figures (shape per experiment, documented on each subclass).
    timings : dict[str, float]
        Seconds, ``total`` included.
    environment : dict
        :func:`environment` at the end of the run.
    """

    experiment: ClassVar[str] = ""

    config: dict[str, Any]
    dataset: dict[str, Any]
    metrics: dict[str, Any]
    timings: dict[str, float] = field(default_factory=dict)
    environment: dict[str, Any] | None = None

    # Mapping protocol: result["metrics"] etc., as the experiments' dicts always allowed
    def __getitem__(self, key: str) -> Any:
        if key not in _FIELDS:
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(_FIELDS)

    def __len__(self) -> int:
        return len(_FIELDS)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``config``, ``dataset``, ``metrics``, ``timings``, ``environment``)."""
        return {k: getattr(self, k) for k in _FIELDS}

    @classmethod
    def format_metrics(cls, metrics: dict[str, Any], config: dict[str, Any]) -> str:
        """A plain-text table of ``metrics`` (overridden by every experiment)."""
        raise NotImplementedError

    def format_table(self) -> str:
        return self.format_metrics(self.metrics, self.config)

    @classmethod
    def format_aggregate(cls, agg: dict[str, Any]) -> str:
        """Mean table, then the spread (sample std over seeds) table."""
        n = agg["config"].get("aggregated_over", 1)
        return (f"mean over {n} runs:\n" + cls.format_metrics(agg["metrics_mean"], agg["config"])
                + f"\n\nstd over {n} runs:\n" + cls.format_metrics(agg["metrics_std"], agg["config"]))


def result_type(experiment: str) -> type[ExperimentResult]:
    """The result class of ``experiment`` (a key of :data:`RESULT_TYPES`)."""
    spec = RESULT_TYPES.get(experiment)
    if spec is None:
        raise bad_arg("experiment", f"one of {sorted(RESULT_TYPES)}", experiment)
    mod, cls = spec.split(":")
    return getattr(importlib.import_module(mod), cls)


def _as_dict(result: Mapping[str, Any]) -> dict[str, Any]:
    return result.to_dict() if isinstance(result, ExperimentResult) else dict(result)


def environment() -> dict[str, Any]:
    """Python, machine, CPU count, torch version and threads, UTC time."""
    import torch

    return dict(python=platform.python_version(), machine=platform.machine(), cpus=os.cpu_count(),
                torch=torch.__version__, threads=torch.get_num_threads(),
                time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))


def _clean(x: Any) -> Any:
    if isinstance(x, ExperimentResult):
        return _clean(x.to_dict())
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, (np.floating, np.integer, np.bool_)):
        return _clean(x.item())
    return x


def write_result(result: Mapping[str, Any], path: str | os.PathLike) -> Path:
    """Write ``result`` (a result or an aggregate) as indented JSON (NaN -> null); returns the path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(p, json.dumps(_clean(_as_dict(result)), indent=1, sort_keys=False))
    return p


def format_table(result: Mapping[str, Any]) -> str:
    """A plain-text table of a result's headline metrics (its experiment's own formatter)."""
    cls = result_type(result["config"]["experiment"])
    return cls.format_metrics(result["metrics"], result["config"])


def aggregate(results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Combine results of one experiment over seeds: ``metrics_mean`` / ``metrics_std`` hold the mean
    and sample standard deviation of every numeric leaf of ``metrics`` present in all results
    (lists such as learning curves are left out); ``per_seed`` keeps the full results."""
    if not results:
        raise bad_arg("results", "a non-empty list", results)
    results = [_as_dict(r) for r in results]

    def walk(objs):
        o0 = objs[0]
        if isinstance(o0, dict):
            out_m, out_s = {}, {}
            for k in o0:
                if all(isinstance(o, dict) and k in o for o in objs):
                    m, s = walk([o[k] for o in objs])
                    if m is not None:
                        out_m[k], out_s[k] = m, s
            return (out_m, out_s) if out_m else (None, None)
        if isinstance(o0, (int, float, np.floating, np.integer)) and not isinstance(o0, bool):
            if all(isinstance(o, (int, float, np.floating, np.integer)) and not isinstance(o, bool) for o in objs):
                return mean_std([float(o) for o in objs])
        return None, None

    m, s = walk([r["metrics"] for r in results])
    first = results[0]
    return dict(config=first["config"] | {"aggregated_over": len(results)},
                dataset=[r["dataset"] for r in results], metrics_mean=m or {}, metrics_std=s or {},
                per_seed=results, timings={"total": sum(r["timings"].get("total", 0.0) for r in results)},
                environment=first.get("environment"))


def format_aggregate(agg: dict[str, Any]) -> str:
    """The aggregate's tables (mean, then spread over seeds; per experiment)."""
    return result_type(agg["config"]["experiment"]).format_aggregate(agg)


def cell(v: Any, w: int = 15) -> str:
    """``v`` right-aligned in ``w`` characters (floats with 3 decimals, ``-`` for None)."""
    if v is None:
        return f"{'-':>{w}}"
    if isinstance(v, float):
        return f"{v:>{w}.3f}" if abs(v) < 100 else f"{v:>{w}.1f}"
    return f"{v:>{w}}"


def plus_minus(m: float, s: float, pts: bool = False) -> str:
    """``mean ± std`` (points with a sign when ``pts``)."""
    return f"{m:>+9.1f} ± {s:<4.1f}" if pts else f"{m:>8.3f} ± {s:.3f}"
