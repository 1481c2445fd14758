"""Evaluation jobs as Ray tasks (``memkern eval memory ... --ray``).

The runner is generic: it maps a top-level function (the local per-job runner, e.g. one
``(experiment, seed)`` of ``memkern eval memory``) over a list of argument tuples, one Ray task
per job, and returns the results in job order. A job computes exactly what the local loop
computes for it (same function, same arguments, same seeds), so the merged results equal the
local run's; only wall-clock fields (timings, timestamps) differ.

Large shared arguments (an embedder with its cache) are put in the object store once and passed
to every task by reference; each worker process deserialises a shared argument once and reuses
it for every later task of the same call (a task must not mutate it: the memory experiments
work on :meth:`memkern.eval.units.CachedEmbedder.fork`). A job argument that is an
``ObjectRef`` (e.g. one dataset shared by many tasks, put once by the caller) is fetched in the
task. :mod:`memkern.eval.tasks` cuts ``memkern eval memory`` into (seed, configuration,
conversations) tasks and runs them through here.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

__all__ = ["run_jobs", "JobFailed"]


class JobFailed:
    """The exception a job raised, kept in its slot when ``return_exceptions=True``."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __repr__(self) -> str:
        return f"JobFailed({self.error!r})"


def run_jobs(fn: Callable[..., Any], jobs: Sequence[tuple], *, shared: dict[str, Any] | None = None,
             num_cpus: float = 1, return_exceptions: bool = False, progress: bool = False) -> list[Any]:
    """Run ``fn(*job, **shared)`` for every job as a Ray task; results in job order.

    Parameters
    ----------
    fn : a picklable (top-level) function
    jobs : list of argument tuples, one per task
    shared : keyword arguments every task receives (put in the object store once)
    num_cpus : CPUs Ray reserves per task (``ray.init(num_cpus=N)`` then runs N at a time)
    return_exceptions : put a :class:`JobFailed` in a failed job's slot instead of raising
        (the original exception, not Ray's wrapper)
    progress : a progress bar over finished jobs
    """
    from . import ensure_ray

    ray = ensure_ray()
    refs_shared = {k: ray.put(v) for k, v in (shared or {}).items()}
    remote = ray.remote(num_cpus=num_cpus, max_retries=0)(_call)
    refs = [remote.remote(fn, tuple(job), refs_shared) for job in jobs]
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(refs), desc="ray jobs", unit="job")
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        if bar is not None:
            bar.update(len(done))
    if bar is not None:
        bar.close()
    out: list[Any] = []
    for r in refs:
        try:
            out.append(ray.get(r))
        except ray.exceptions.RayTaskError as e:
            err = e.cause if isinstance(getattr(e, "cause", None), BaseException) else e
            if not return_exceptions:
                raise err from None
            out.append(JobFailed(err))
    return out


# per worker process: the last call's shared arguments, deserialised (key: their ObjectRefs)
_SHARED: dict[tuple, dict[str, Any]] = {}


def _call(fn: Callable[..., Any], job: tuple, shared: dict[str, Any]) -> Any:
    import ray

    key = tuple((k, v.hex() if isinstance(v, ray.ObjectRef) else repr(v)) for k, v in shared.items())
    kw = _SHARED.get(key)
    if kw is None:
        _SHARED.clear()  # a new call's arguments: drop the previous call's (an embedder is ~100 MB)
        kw = {k: (ray.get(v) if isinstance(v, ray.ObjectRef) else v) for k, v in shared.items()}
        _SHARED[key] = kw
    args = [ray.get(v) if isinstance(v, ray.ObjectRef) else v for v in job]
    return fn(*args, **kw)
