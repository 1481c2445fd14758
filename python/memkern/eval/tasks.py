"""Units of work of the memory experiments: (seed, configuration, conversations) tasks.

Every experiment of ``memkern eval memory`` is an :class:`Experiment`: a picklable set of
options that

- names its **configurations** (:meth:`Experiment.configurations`: the granularities, the
  turn-in-topic parents, the retrieval row groups, the reranker presets, ...);
- says, per configuration, over how many **conversations** its work may be cut
  (:meth:`Experiment.conversations`; ``None`` when it may not: the work carries state from one
  conversation to the next, e.g. a reranker trained online over the whole stream);
- runs one :class:`Task` (:meth:`Experiment.run_task`: one configuration on a batch of
  conversations, for one seed's dataset) into a *partial* (per-question rows, unit counts);
- **merges** the partials of all its tasks, in plan order, into the result
  (:meth:`Experiment.merge`): rows are concatenated in conversation order and every mean is
  taken once over the concatenated rows, exactly the floating-point reduction the one-loop code
  did, so the result does not depend on how the work was cut.

:func:`plan` lists the tasks (configuration-major, conversations in dataset order, batches of
``conversations_per_task``); :func:`run_experiments` runs them in this process or as Ray tasks
(:func:`memkern.distributed.evaluate.run_jobs`) and merges them the same way. The two paths
share everything but the ``map``, so ``--ray`` gives the local JSON bit for bit.

Embedding cache: every task sees the driver's embedding cache **as it was when the plan
started** (:meth:`memkern.eval.units.CachedEmbedder.fork`), never the vectors another task of the
same run embedded; the vectors a task embeds come back with its partial and are added to the
driver's cache in plan order (:meth:`~memkern.eval.units.CachedEmbedder.absorb`). A task is thus
a pure function of (options, dataset, task, cache snapshot), whichever process runs it and in
whatever order: a batched transformer's float output can depend on the batch a text is
embedded in, and this is what makes the batches identical on both paths. The price: on a cold
cache, texts several configurations share (the turns, the questions) are embedded once per task
that needs them; a warm cache (the default on-disk one, filled by any earlier run) pays nothing.

Task size: a Ray task costs a few milliseconds of scheduling plus its share of unpickling the
dataset (once per task) and the embedder (once per worker process, see ``run_jobs``); a
conversation costs from tens of milliseconds (warm cache, exact cosine) to seconds (cold
cache, or the ``rmm-default`` row's store). ``conversations_per_task`` (CLI
``--task-conversations``, default :data:`DEFAULT_CONVERSATIONS_PER_TASK`) batches conversations so a
task stays well above the overhead; ``0`` keeps every configuration whole (one task per
configuration and seed). Measured on 2 shared cores (local Ray with 2 CPUs, warm workers, a hash
embedder, retrieval without the RMM row plus three granularities on 8 generated dialogues):
32 one-conversation tasks took 2.05 s on Ray against 0.56 s here (~50 ms of overhead per
task), 8 four-conversation tasks 0.64 s against 0.31 s. With MiniLM on a cold cache a
conversation costs seconds, so 4 conversations per task keep the overhead to a few percent.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, ClassVar, Sequence

import numpy as np

from ..errors import bad_arg

__all__ = ["Task", "TaskOutput", "Experiment", "plan", "run_task", "run_local", "run_experiments",
           "DEFAULT_CONVERSATIONS_PER_TASK", "concat_rows", "sum_timings"]

#: conversations per task when not told (see the module doc)
DEFAULT_CONVERSATIONS_PER_TASK = 4


@dataclass(frozen=True)
class Task:
    """One unit of work: ``config`` of ``experiment`` on the conversations at positions
    ``conversations`` (in the experiment's own conversation list) of seed ``seed``'s dataset;
    ``conversations=None``: the configuration is not cut by conversation."""

    experiment: str
    seed: int
    config: str
    conversations: tuple[int, ...] | None


@dataclass
class TaskOutput:
    """What a task returns: its partial, the vectors it embedded (cache key -> float32 ``[d]``),
    and its wall-clock seconds."""

    task: Task
    partial: Any
    embeddings: dict[str, np.ndarray]
    seconds: float


class Experiment:
    """Base class of the experiments' work plans (see the module doc); subclasses are dataclasses
    of plain, picklable options with a ``seed`` field."""

    name: ClassVar[str] = ""
    seed: int = 0

    def configurations(self, ds: Any) -> list[str]:
        """The configuration labels, in result order."""
        raise NotImplementedError

    def conversations(self, ds: Any, config: str) -> int | None:
        """How many conversations ``config``'s work may be cut over (``None``: not cut)."""
        return None

    def run_task(self, ds: Any, task: Task, emb: Any) -> Any:
        """The partial of ``task`` (``emb``: a fork of the run's embedding cache)."""
        raise NotImplementedError

    def merge(self, ds: Any, outputs: Sequence[TaskOutput], emb: Any) -> Any:
        """The result, from every task's output in plan order."""
        raise NotImplementedError


def plan(exp: Experiment, ds: Any, conversations_per_task: int = DEFAULT_CONVERSATIONS_PER_TASK) -> list[Task]:
    """The tasks of ``exp`` on ``ds``: configuration-major, conversations in order, in batches of
    ``conversations_per_task`` (``0``: one task per configuration)."""
    if isinstance(conversations_per_task, bool) or not isinstance(conversations_per_task, (int, np.integer)) \
            or conversations_per_task < 0:
        raise bad_arg("conversations_per_task", "an int >= 0 (0: one task per configuration)", conversations_per_task)
    per = int(conversations_per_task)
    out: list[Task] = []
    for cfg in exp.configurations(ds):
        n = exp.conversations(ds, cfg)
        if n is None or per == 0:
            out.append(Task(exp.name, exp.seed, cfg, None if n is None else tuple(range(n))))
            continue
        for i in range(0, n, per):
            out.append(Task(exp.name, exp.seed, cfg, tuple(range(i, min(n, i + per)))))
    return out


def run_task(exp: Experiment, ds: Any, task: Task, emb: Any, threads: int | None = None) -> TaskOutput:
    """Run one task on a fork of ``emb``'s cache (what the local loop and every Ray task call)."""
    if threads is not None:
        import torch

        torch.set_num_threads(max(1, int(threads)))
    fork = emb.fork()
    t0 = time.perf_counter()
    partial = exp.run_task(ds, task, fork)
    return TaskOutput(task, partial, fork.added(), time.perf_counter() - t0)


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


def run_experiments(runs: Sequence[tuple[Experiment, Any]], emb: Any, *,
                    conversations_per_task: int = DEFAULT_CONVERSATIONS_PER_TASK, use_ray: bool = False,
                    threads: int | None = None, progress: bool = False) -> list[Any]:
    """Plan, run and merge every ``(experiment, dataset)`` of ``runs``; one result per run, in order.

    A run whose task raised gets the exception (the first, in plan order) in its slot instead
    of a result; the other runs are still merged. ``use_ray``: tasks are Ray tasks (the embedder
    goes through the object store once, each dataset once); otherwise they run here, one after
    the other. Both paths merge the same outputs in the same order.
    """
    planned = [(i, t) for i, (exp, ds) in enumerate(runs) for t in plan(exp, ds, conversations_per_task)]
    if use_ray:
        from ..distributed import ensure_ray
        from ..distributed.evaluate import JobFailed, run_jobs

        ray = ensure_ray()
        ds_refs: dict[int, Any] = {}
        for i, (_, ds) in enumerate(runs):
            ds_refs.setdefault(id(ds), ray.put(ds))
        jobs = [(runs[i][0], ds_refs[id(runs[i][1])], t) for i, t in planned]
        got = run_jobs(run_task, jobs, shared={"emb": emb, "threads": threads}, return_exceptions=True,
                       progress=progress)
        outs = [_Failed(g.error) if isinstance(g, JobFailed) else g for g in got]
    else:
        from .data import progress_bar

        outs = []
        for i, t in progress_bar(planned, progress, desc="tasks", unit="task"):
            exp, ds = runs[i]
            try:
                outs.append(run_task(exp, ds, t, emb, threads))
            except Exception as e:  # kept in its run's slot, as a Ray task's error is
                outs.append(_Failed(e))
    by_run: dict[int, list[Any]] = {i: [] for i in range(len(runs))}
    for (i, _), o in zip(planned, outs):
        by_run[i].append(o)
    results: list[Any] = []
    for i, (exp, ds) in enumerate(runs):
        mine = by_run[i]
        failed = next((o for o in mine if isinstance(o, _Failed)), None)
        if failed is not None:
            results.append(failed.error)
            continue
        for o in mine:
            emb.absorb(o.embeddings)
        results.append(exp.merge(ds, mine, emb))
    emb.flush()
    return results


def run_local(exp: Experiment, ds: Any, emb: Any, conversations_per_task: int = DEFAULT_CONVERSATIONS_PER_TASK,
              progress: bool = False) -> Any:
    """Run ``exp`` on ``ds`` in this process through the task plan; raises a task's error."""
    (r,) = run_experiments([(exp, ds)], emb, conversations_per_task=conversations_per_task, progress=progress)
    if isinstance(r, BaseException):
        raise r
    return r


def concat_rows(outputs: Sequence[TaskOutput], key: str = "rows") -> dict[str, list[Any]]:
    """``{name: rows}`` of every output's ``partial[key]``, concatenated in plan order; names in
    order of first appearance."""
    rows: dict[str, list[Any]] = {}
    for o in outputs:
        for name, rs in o.partial[key].items():
            rows.setdefault(name, []).extend(rs)
    return rows


def sum_timings(outputs: Sequence[TaskOutput]) -> dict[str, float]:
    """The tasks' ``partial["timings"]`` summed per key, ``tasks`` = their wall-clock seconds."""
    out: dict[str, float] = {}
    for o in outputs:
        for k, v in (o.partial.get("timings") or {}).items():
            out[k] = out.get(k, 0.0) + float(v)
    out["tasks"] = sum(o.seconds for o in outputs)
    return out
