"""Retrospective reflection offline: the online reranker vs the frozen retriever.

Candidates = top-K turns of the frozen retriever; the real :class:`memkern.Reranker` selects
top-M, citations are simulated from the evidence labels (a useful memory cited with
``p_useful``, a useless one with ``p_useless``), rewards +1 / -1 train it online over one stream
of questions; Recall@M is measured on held-back questions it never trained on.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Sequence

import numpy as np

from ..data.schema import Dataset
from ..errors import bad_arg
from .data import dataset_info
from .metrics import mean_std
from .online import (build_candidates, instance_config, make_reranker, preset_config, recall_of, split_rows,
                     train_online)
from .report import ExperimentResult, environment, plus_minus
from .tasks import Experiment, Task, TaskOutput, sum_timings
from .units import CachedEmbedder

__all__ = ["run_reflection", "ReflectionExperiment", "ReflectionResult"]


@dataclass
class ReflectionResult(ExperimentResult):
    """Result of :func:`run_reflection`.

    ``metrics[preset]``: ``frozen_mean/std``, ``after_mean/std``, ``delta_mean/std`` (held-back
    Recall@M over seeds), ``per_seed`` (curves, split sizes, reranker settings) and ``config``.
    """

    experiment: ClassVar[str] = "reflection"

    @classmethod
    def format_metrics(cls, metrics: dict[str, Any], config: dict[str, Any]) -> str:
        lines = [f"{'preset':<10}{'frozen R@5':>14}{'after R@5':>14}{'delta (pts)':>16}{'seeds':>7}"]
        for p, v in metrics.items():
            lines.append(f"{p:<10}{plus_minus(v['frozen_mean'], v['frozen_std'])}"
                         f"{plus_minus(v['after_mean'], v['after_std'])}"
                         f"{plus_minus(100 * v['delta_mean'], 100 * v['delta_std'], pts=True)}{len(v['per_seed']):>7}")
        return "\n".join(lines)

    @classmethod
    def format_aggregate(cls, agg: dict[str, Any]) -> str:
        n = agg["config"].get("aggregated_over", 1)
        lines = [f"{'preset':<10}{'frozen R@5':>18}{'after R@5':>18}{'delta (pts)':>18}   (mean ± std over {n} runs)"]
        for p, v in agg["metrics_mean"].items():
            sd = agg["metrics_std"][p]
            lines.append(f"{p:<10}{v['frozen_mean']:>10.3f} ± {sd['frozen_mean']:.3f}{v['after_mean']:>10.3f} ± "
                         f"{sd['after_mean']:.3f}{100 * v['delta_mean']:>+10.1f} ± {100 * sd['delta_mean']:.1f}")
        return "\n".join(lines)


def run_reflection(ds: Dataset, *, emb: CachedEmbedder | None = None, k: int = 20, top_m: int = 5,
                   presets: Sequence[str] = ("default", "paper"), batch_size: int = 8, passes: float = 1.0,
                   p_useful: float = 0.9, p_useless: float = 0.1, test_frac: float = 0.5, split: str = "question",
                   seeds: Sequence[int] = (0, 1, 2), eval_every: int | None = None, reranker_overrides: dict | None = None,
                   plot: str | os.PathLike | None = None, max_questions: int | None = None,
                   progress: bool = False) -> "ReflectionResult":
    """Online reranker vs frozen retriever on held-back questions (mean and spread over seeds).

    Each seed draws its own train/test split, sampling noise and citations. Reports, per preset,
    held-back Recall@5 of the frozen retriever (its top ``top_m``), of the reranker before
    training (greedy; equal to the frozen retriever for zero-initialised adapters), after one
    online pass, and the learning curves.
    """
    if not (0.0 <= p_useless <= 1.0 and 0.0 <= p_useful <= 1.0):
        raise bad_arg("p_useful/p_useless", "probabilities in [0, 1]", (p_useful, p_useless))
    emb = emb or CachedEmbedder()
    t_start = time.perf_counter()
    cands = build_candidates(ds, emb, k=k, max_questions=max_questions, progress=progress)
    t_cands = time.perf_counter() - t_start
    frozen_idx = np.tile(np.arange(top_m), (len(cands.qtype), 1))
    upper = float(np.mean(np.minimum(cands.useful.sum(1), top_m) / np.maximum(cands.ev_count, 1)))
    res: dict[str, Any] = {}
    for preset in presets:
        per_seed = []
        for sd in seeds:
            train, test = split_rows(cands, test_frac, sd, split)
            rr = make_reranker(cands.q.shape[1], preset, top_m, sd, reranker_overrides)
            frozen = recall_of(frozen_idx[test], cands, test)
            out = train_online(rr, cands, train, test, batch_size=batch_size, passes=passes, p_useful=p_useful,
                               p_useless=p_useless, seed=sd, eval_every=eval_every, progress=progress)
            out |= dict(seed=sd, frozen=frozen, before=out["curve"][0][1], delta=out["final"] - frozen,
                        n_train=int(len(train)), n_test=int(len(test)), reranker=instance_config(rr))
            per_seed.append(out)
        m_f, s_f = mean_std([p["frozen"] for p in per_seed])
        m_a, s_a = mean_std([p["final"] for p in per_seed])
        m_d, s_d = mean_std([p["delta"] for p in per_seed])
        res[preset] = dict(frozen_mean=m_f, frozen_std=s_f, after_mean=m_a, after_std=s_a, delta_mean=m_d,
                           delta_std=s_d, per_seed=per_seed, config=preset_config(preset, top_m, reranker_overrides))
    if plot:
        _plot_curves(res, plot, title=f"held-back Recall@{top_m}, {ds.name}")
    config = dict(experiment="reflection", k=k, top_m=top_m, presets=list(presets), batch_size=batch_size,
                  passes=passes, p_useful=p_useful, p_useless=p_useless, test_frac=test_frac, split=split,
                  seeds=list(seeds), eval_every=eval_every, reranker_overrides=reranker_overrides or {},
                  embedder=emb.model_name, candidates=f"top-{k} turns, exact cosine",
                  oracle_recall_at_m_within_top_k=upper, plot=str(plot) if plot else None)
    return ReflectionResult(config, dataset_info(ds), res, {"candidates": t_cands, "total": time.perf_counter() - t_start},
                            environment())


def _plot_curves(res: dict[str, Any], path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    colors = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple"]
    for i, (preset, r) in enumerate(res.items()):
        for j, ps in enumerate(r["per_seed"]):
            xs = [c[0] for c in ps["curve"]]
            ys = [100 * c[1] for c in ps["curve"]]
            ax.plot(xs, ys, color=colors[i % len(colors)], alpha=0.8, label=preset if j == 0 else None)
        ax.axhline(100 * r["frozen_mean"], color="gray", ls="--", lw=1)
    ax.set_xlabel("online updates")
    ax.set_ylabel("held-back Recall@5 (%)")
    ax.set_title(title + " (dashed: frozen retriever)")
    ax.legend()
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


@dataclass
class ReflectionExperiment(Experiment):
    """The reflection work plan (:mod:`memkern.eval.tasks`): one configuration per reranker
    preset (presets train independently on the same candidates), **not** cut by conversation:
    the reranker is trained online over the stream of every conversation's questions, so the
    state one conversation leaves is the next one's start. ``kwargs``: :func:`run_reflection`'s
    arguments but ``ds``, ``emb``, ``presets``, ``plot`` and ``progress``."""

    name: ClassVar[str] = "reflection"

    presets: tuple[str, ...] = ("default", "paper")
    kwargs: dict[str, Any] | None = None
    plot: str | None = None
    seed: int = 0

    def configurations(self, ds: Dataset) -> list[str]:
        return list(self.presets)

    def run_task(self, ds: Dataset, task: Task, emb: Any) -> "ReflectionResult":
        return run_reflection(ds, emb=emb, presets=[task.config], plot=None, **(self.kwargs or {}))

    def merge(self, ds: Dataset, outputs: Sequence[TaskOutput], emb: Any) -> "ReflectionResult":
        res = {p: v for o in outputs for p, v in o.partial.metrics.items()}
        if self.plot:
            _plot_curves(res, self.plot, title=f"held-back Recall@{outputs[0].partial.config['top_m']}, {ds.name}")
        config = outputs[0].partial.config | dict(presets=list(self.presets), plot=self.plot)
        timings = sum_timings(outputs)
        timings["total"] = timings["tasks"]
        return ReflectionResult(config, outputs[0].partial.dataset, res, timings, environment())
