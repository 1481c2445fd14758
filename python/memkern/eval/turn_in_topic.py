"""Turn-in-topic experiment: turns scored ``cos(q, turn) + alpha * cos(q, parent unit)``.

The parent is the turn's 4-turn chunk, session, or topic (embedding extractor); ``alpha = 0`` is
plain turn retrieval, the reference every other row is compared with at equal turn budgets.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, ClassVar, Sequence

import numpy as np

from ..data.schema import Dataset
from ..errors import bad_arg
from .data import by_type, dataset_info, mean, questions_by_conversation
from .metrics import recall_at_budget
from .report import ExperimentResult, cell, environment
from .tasks import DEFAULT_CONVERSATIONS_PER_TASK, Experiment, Task, TaskOutput, concat_rows, run_local, sum_timings
from .units import BUDGETS, CachedEmbedder, build_units, make_extractor

__all__ = ["run_turn_in_topic", "turn_in_topic_experiment", "TurnInTopicExperiment", "TurnInTopicResult"]


@dataclass
class TurnInTopicResult(ExperimentResult):
    """Result of :func:`run_turn_in_topic`.

    ``metrics[name]`` for ``name`` = ``"turn"`` or ``"turn+{alpha}*{parent}"``: ``recall@Bturns``,
    ``delta_recall@Bturns`` (vs plain turns), ``questions``, ``by_type``.
    """

    experiment: ClassVar[str] = "turn-in-topic"

    @classmethod
    def format_metrics(cls, metrics: dict[str, Any], config: dict[str, Any]) -> str:
        cols = [c for c in next(iter(metrics.values())) if c.startswith("recall@") or c.startswith("delta_")] + ["questions"]
        lines = [f"{'scoring':<28}" + "".join(f"{c:>22}" for c in cols)]
        for g, v in metrics.items():
            lines.append(f"{g:<28}" + "".join(cell(v.get(c), 22) for c in cols))
        return "\n".join(lines)


@dataclass
class TurnInTopicExperiment(Experiment):
    """The turn-in-topic work plan (:mod:`memkern.eval.tasks`): one configuration per parent
    (every alpha of that parent, and the plain ``turn`` row with the first parent), cut by
    conversation (each conversation is scored on its own)."""

    name: ClassVar[str] = "turn-in-topic"

    alphas: tuple[float, ...] = (0.0, 1.0, 2.0)
    parents: tuple[str, ...] = ("chunk4", "topic-embedding")
    budgets: tuple[int, ...] = BUDGETS
    topic_threshold: float = 0.3
    max_questions: int | None = None
    seed: int = 0

    def configurations(self, ds: Dataset) -> list[str]:
        return list(self.parents)

    def conversations(self, ds: Dataset, config: str) -> int:
        return len(questions_by_conversation(ds, self.max_questions)[0])

    def run_task(self, ds: Dataset, task: Task, emb: Any) -> dict[str, Any]:
        p = task.config
        convs, _ = questions_by_conversation(ds, self.max_questions)
        ex = make_extractor("embedding", emb, threshold=self.topic_threshold) if p == "topic-embedding" else None
        rows: dict[str, list[dict[str, float]]] = {}
        for ci in task.conversations:
            c, questions = convs[ci]
            qe = emb.encode([q.question for q in questions], kind="query")
            turns = build_units(c, "turn", emb)
            tid = [u[0] for u in turns.turn_ids]
            pos = {t: i for i, t in enumerate(tid)}
            st = qe @ turns.emb.T  # [Q, T]
            pu = build_units(c, p, emb, ex, seed=self.seed)
            parent_of = np.full(len(tid), -1, dtype=np.int64)
            for j, ids in enumerate(pu.turn_ids):
                for t in ids:
                    if parent_of[pos[t]] < 0:
                        parent_of[pos[t]] = j
            sp = qe @ pu.emb.T  # [Q, P]
            # a turn no parent covers gets the parent score 0 (cosine of an unrelated text)
            ps = np.where(parent_of[None, :] >= 0, sp[:, np.maximum(parent_of, 0)], 0.0)
            for a in self.alphas:
                if a == 0 and p != self.parents[0]:
                    continue
                name = "turn" if a == 0 else f"turn+{a:g}*{p}"
                s = st + float(a) * ps
                order = np.argsort(-s, axis=1, kind="stable")
                for qi, q in enumerate(questions):
                    ranked = [[tid[j]] for j in order[qi][:max(self.budgets)]]
                    r = {f"recall@{b}turns": recall_at_budget(ranked, q.evidence_turn_ids, b) for b in self.budgets}
                    r["question_type"] = q.question_type
                    rows.setdefault(name, []).append(r)
        return {"rows": rows}

    def merge(self, ds: Dataset, outputs: Sequence[TaskOutput], emb: Any) -> "TurnInTopicResult":
        _, skipped = questions_by_conversation(ds, self.max_questions)
        rows = concat_rows(outputs)
        names = [f"recall@{b}turns" for b in self.budgets]
        metrics = {}
        base = {n: mean([r[n] for r in rows.get("turn", [])]) for n in names}
        for name, rs in rows.items():
            m = {n: mean([r[n] for r in rs]) for n in names}
            m |= {f"delta_{n}": m[n] - base[n] for n in names}
            m["questions"] = len(rs)
            m["by_type"] = by_type(rs, names)
            metrics[name] = m
        config = dict(experiment="turn-in-topic", alphas=list(self.alphas), parents=list(self.parents),
                      budgets=list(self.budgets), topic_threshold=self.topic_threshold, embedder=emb.model_name,
                      seed=self.seed, retrieval="exact cosine (numpy); score = cos(q,turn) + alpha*cos(q,parent)")
        timings = sum_timings(outputs)
        timings["total"] = timings["tasks"]
        return TurnInTopicResult(config, dataset_info(ds) | {"skipped_no_evidence": skipped}, metrics, timings,
                                 environment())


def turn_in_topic_experiment(alphas: Sequence[float] = (0.0, 1.0, 2.0),
                             parents: Sequence[str] = ("chunk4", "topic-embedding"), **kw: Any) -> TurnInTopicExperiment:
    """A checked :class:`TurnInTopicExperiment` (the arguments of :func:`run_turn_in_topic` but
    ``emb``, ``progress`` and ``conversations_per_task``)."""
    for p in parents:
        if p not in ("chunk4", "session", "topic-embedding"):
            raise bad_arg("parents", "names from ('chunk4', 'session', 'topic-embedding')", p)
    if "budgets" in kw:
        kw["budgets"] = tuple(kw["budgets"])
    return TurnInTopicExperiment(alphas=tuple(alphas), parents=tuple(parents), **kw)


def run_turn_in_topic(ds: Dataset, alphas: Sequence[float] = (0.0, 1.0, 2.0), parents: Sequence[str] = ("chunk4", "topic-embedding"),
                      *, emb: CachedEmbedder | None = None, budgets: Sequence[int] = BUDGETS, topic_threshold: float = 0.3,
                      max_questions: int | None = None, progress: bool = False, seed: int = 0,
                      conversations_per_task: int = DEFAULT_CONVERSATIONS_PER_TASK) -> "TurnInTopicResult":
    """Turns ranked by ``cos(q, turn) + alpha * cos(q, parent unit)`` at equal budgets.

    ``alpha = 0`` is plain turn retrieval (the reference). Returns per (parent, alpha) the
    recall at each budget and the difference to plain turns. Runs the tasks of
    :class:`TurnInTopicExperiment` here; the result does not depend on ``conversations_per_task``.
    """
    exp = turn_in_topic_experiment(alphas, parents, budgets=budgets, topic_threshold=topic_threshold,
                                   max_questions=max_questions, seed=seed)
    return run_local(exp, ds, emb or CachedEmbedder(), conversations_per_task, progress=progress)
