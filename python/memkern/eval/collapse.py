"""Collapse experiment: many online updates per optimizer and learning rate.

A run *collapses* when its held-back Recall@M at any checkpoint falls more than
``collapse_points`` points below the frozen retriever, or its adapters become non-finite.
"""
from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Sequence

import numpy as np

from ..data.schema import Dataset
from .data import dataset_info
from .online import build_candidates, instance_config, make_reranker, recall_of, split_rows, train_online
from .report import ExperimentResult, environment
from .tasks import Experiment, Task, TaskOutput, sum_timings

__all__ = ["run_collapse", "CollapseExperiment", "CollapseResult"]

log = logging.getLogger("memkern")


@dataclass
class CollapseResult(ExperimentResult):
    """Result of :func:`run_collapse`: ``metrics["runs"]`` (one dict per preset, optimizer, lr,
    seed: frozen/final/worst recall, max adapter norm, rollbacks, curve, ``collapsed``),
    ``collapsed`` and ``total_runs`` counts."""

    experiment: ClassVar[str] = "collapse"

    @classmethod
    def format_metrics(cls, metrics: dict[str, Any], config: dict[str, Any]) -> str:
        lines = [f"{'preset':<9}{'opt':<6}{'lr':>8}{'seed':>5}{'frozen':>9}{'final':>9}{'worst':>9}{'max|W|':>9}"
                 f"{'rollb':>6}  collapsed"]
        for r in metrics["runs"]:
            lines.append(f"{r['preset']:<9}{r['optimizer']:<6}{r['lr']:>8g}{r['seed']:>5}{r['frozen']:>9.3f}"
                         f"{r['final']:>9.3f}{r['worst']:>9.3f}{r['max_norm']:>9.2f}{r['rollbacks']:>6}  {r['collapsed']}")
        return "\n".join(lines)

    @classmethod
    def format_aggregate(cls, agg: dict[str, Any]) -> str:
        return "\n\n".join(cls.format_metrics(r["metrics"], r["config"]) for r in agg["per_seed"])


def run_collapse(ds: Dataset, *, emb: CachedEmbedder | None = None, optimizers: Sequence[str] = ("adam", "sgd"),
                 lrs: Sequence[float] = (1e-4, 1e-3, 1e-2), presets: Sequence[str] = ("default",), steps: int = 10_000,
                 k: int = 20, top_m: int = 5, batch_size: int = 8, p_useful: float = 0.9, p_useless: float = 0.1,
                 test_frac: float = 0.5, seeds: Sequence[int] = (0,), eval_every: int | None = None,
                 collapse_points: float = 5.0, plot: str | os.PathLike | None = None,
                 max_questions: int | None = None, progress: bool = False) -> "CollapseResult":
    """``steps`` online updates per (preset, optimizer, lr, seed), cycling the train stream.

    A run *collapses* when its held-back Recall@5 at any checkpoint falls more than
    ``collapse_points`` points below the frozen retriever, or its adapters become non-finite.
    """
    emb = emb or CachedEmbedder()
    t_start = time.perf_counter()
    cands = build_candidates(ds, emb, k=k, max_questions=max_questions, progress=progress)
    frozen_idx = np.tile(np.arange(top_m), (len(cands.qtype), 1))
    runs = []
    for preset in presets:
        for opt in optimizers:
            for lr in lrs:
                for sd in seeds:
                    train, test = split_rows(cands, test_frac, sd)
                    rr = make_reranker(cands.q.shape[1], preset, top_m, sd, {"optimizer": opt, "lr": float(lr)})
                    frozen = recall_of(frozen_idx[test], cands, test)
                    out = train_online(rr, cands, train, test, batch_size=batch_size, steps=steps, p_useful=p_useful,
                                       p_useless=p_useless, seed=sd, eval_every=eval_every, progress=progress)
                    worst = min(c[1] for c in out["curve"])
                    finite = all(math.isfinite(c[2]) for c in out["curve"])
                    collapsed = (not finite) or (worst < frozen - collapse_points / 100.0)
                    runs.append(dict(preset=preset, optimizer=opt, lr=float(lr), seed=sd, frozen=frozen,
                                     final=out["final"], worst=worst, delta_final=out["final"] - frozen,
                                     max_norm=max(c[2] for c in out["curve"]), collapsed=bool(collapsed),
                                     rollbacks=out["rollbacks"], curve=out["curve"], seconds=out["train_seconds"],
                                     reranker=instance_config(rr)))
                    log.info("collapse run %s %s lr=%g seed=%d: final %.3f (frozen %.3f) worst %.3f norm %.2f",
                             preset, opt, lr, sd, out["final"], frozen, worst, runs[-1]["max_norm"])
    if plot:
        _plot_collapse(runs, plot)
    config = dict(experiment="collapse", optimizers=list(optimizers), lrs=list(lrs), presets=list(presets), steps=steps,
                  k=k, top_m=top_m, batch_size=batch_size, p_useful=p_useful, p_useless=p_useless,
                  test_frac=test_frac, seeds=list(seeds), eval_every=eval_every, collapse_points=collapse_points,
                  embedder=emb.model_name, plot=str(plot) if plot else None)
    return CollapseResult(config, dataset_info(ds), {"runs": runs, "collapsed": sum(r["collapsed"] for r in runs),
                          "total_runs": len(runs)}, {"total": time.perf_counter() - t_start}, environment())


def _plot_collapse(runs, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.0, 4.2))
    for r in runs:
        xs = [c[0] for c in r["curve"]]
        ys = [100 * (c[1] - r["frozen"]) for c in r["curve"]]
        ax.plot(xs, ys, alpha=0.8, label=f"{r['preset']} {r['optimizer']} {r['lr']:g} s{r['seed']}")
    ax.axhline(0, color="gray", ls="--", lw=1)
    ax.set_xlabel("online updates")
    ax.set_ylabel("held-back Recall@5 minus frozen (points)")
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


@dataclass
class CollapseExperiment(Experiment):
    """The collapse work plan (:mod:`memkern.eval.tasks`): one configuration per (preset,
    optimizer, learning rate), **not** cut by conversation (each run trains one reranker online
    over every conversation's questions). ``kwargs``: :func:`run_collapse`'s arguments but
    ``ds``, ``emb``, ``presets``, ``optimizers``, ``lrs``, ``plot`` and ``progress``."""

    name: ClassVar[str] = "collapse"

    presets: tuple[str, ...] = ("default",)
    optimizers: tuple[str, ...] = ("adam", "sgd")
    lrs: tuple[float, ...] = (1e-4, 1e-3, 1e-2)
    kwargs: dict[str, Any] | None = None
    plot: str | None = None
    seed: int = 0

    def configurations(self, ds: Dataset) -> list[str]:
        return [f"{p}|{o}|{i}" for p in self.presets for o in self.optimizers for i in range(len(self.lrs))]

    def run_task(self, ds: Dataset, task: Task, emb: Any) -> "CollapseResult":
        p, o, i = task.config.split("|")
        return run_collapse(ds, emb=emb, presets=[p], optimizers=[o], lrs=[self.lrs[int(i)]], plot=None,
                            **(self.kwargs or {}))

    def merge(self, ds: Dataset, outputs: Sequence[TaskOutput], emb: Any) -> "CollapseResult":
        runs = [r for o in outputs for r in o.partial.metrics["runs"]]
        if self.plot:
            _plot_collapse(runs, self.plot)
        config = outputs[0].partial.config | dict(presets=list(self.presets), optimizers=list(self.optimizers),
                                                  lrs=list(self.lrs), plot=self.plot)
        timings = sum_timings(outputs)
        timings["total"] = timings["tasks"]
        return CollapseResult(config, outputs[0].partial.dataset, {"runs": runs,
                              "collapsed": sum(r["collapsed"] for r in runs), "total_runs": len(runs)},
                              timings, environment())
