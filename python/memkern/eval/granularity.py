"""Granularity experiment: which unit to retrieve (turn, session, mix, 4-turn chunk, topic).

:func:`run_granularity` scores every unit of the question's conversation by exact cosine
(numpy) and reports Recall@5/@10 and NDCG@5 of evidence turns per unit, Recall at equal budgets
of 5/10/20 turns, and mean turns and tokens per retrieved unit.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, ClassVar, Sequence

import numpy as np

from ..data.schema import Dataset
from ..errors import bad_arg
from .data import by_type, dataset_info, mean, questions_by_conversation
from .metrics import ndcg_at_k, recall_at_budget, recall_at_k
from .report import ExperimentResult, cell, environment
from .tasks import DEFAULT_CONVERSATIONS_PER_TASK, Experiment, Task, TaskOutput, concat_rows, run_local, sum_timings
from .units import BUDGETS, GRANULARITIES, CachedEmbedder, build_units, make_extractor

__all__ = ["run_granularity", "granularity_experiment", "GranularityExperiment", "GranularityResult"]


@dataclass
class GranularityResult(ExperimentResult):
    """Result of :func:`run_granularity`.

    ``metrics[granularity]``: ``recall@K`` (units), ``ndcg@5``, ``recall@Bturns`` (equal turn
    budgets), ``questions``, ``turns_per_unit``, ``tokens_per_unit``, ``units_per_conversation``
    and ``by_type`` (the same per question type); ``<name>@llm-slice`` rows repeat the metrics on
    the slice the LLM extractor saw.
    """

    experiment: ClassVar[str] = "granularity"

    @classmethod
    def format_metrics(cls, metrics: dict[str, Any], config: dict[str, Any]) -> str:
        cols = [c for c in ("recall@5", "recall@10", "ndcg@5", "recall@5turns", "recall@10turns", "recall@20turns",
                            "turns_per_unit", "tokens_per_unit", "questions") if any(c in v for v in metrics.values())]
        lines = [f"{'unit':<26}" + "".join(f"{c:>16}" for c in cols)]
        for g, v in metrics.items():
            lines.append(f"{g:<26}" + "".join(cell(v.get(c), 16) for c in cols))
        return "\n".join(lines)


@dataclass
class GranularityExperiment(Experiment):
    """The granularity experiment's work plan (:mod:`memkern.eval.tasks`): one configuration per
    granularity, cut by conversation (units are built and scored per conversation). ``topic-llm``
    runs on its slice (the first ``llm_conversations`` conversations) as one task: the chat
    model's calls are not cut."""

    name: ClassVar[str] = "granularity"

    granularities: tuple[str, ...] = ("turn", "session", "mix", "chunk4", "topic-embedding")
    ks: tuple[int, ...] = (5, 10)
    budgets: tuple[int, ...] = BUDGETS
    topic_threshold: float = 0.3
    chat_model: Any = None
    llm_conversations: int = 1
    llm_max_new_tokens: int = 160
    max_questions: int | None = None
    seed: int = 0

    def configurations(self, ds: Dataset) -> list[str]:
        return list(self.granularities)

    def conversations(self, ds: Dataset, config: str) -> int | None:
        if config == "topic-llm":
            return None
        return len(questions_by_conversation(ds, self.max_questions)[0])

    def run_task(self, ds: Dataset, task: Task, emb: Any) -> dict[str, Any]:
        g = task.config
        convs, _ = questions_by_conversation(ds, self.max_questions)
        idx = range(min(len(convs), max(0, self.llm_conversations))) if task.conversations is None \
            else task.conversations
        rows: list[dict[str, Any]] = []
        stats: dict[str, list[float]] = {"turns": [], "tokens": [], "units": []}
        timings: dict[str, float] = {}
        ex = None
        if g.startswith("topic-"):
            ex = make_extractor(g.split("-", 1)[1], emb, self.chat_model, self.topic_threshold,
                                self.llm_max_new_tokens)
        for ci in idx:
            c, questions = convs[ci]
            tok_cache: dict[str, int] = {}  # per conversation: turn ids are unique only within one
            turn_text = {t.turn_id: t.content for t in c.turns()}
            qe = emb.encode([q.question for q in questions], kind="query")
            t0 = time.perf_counter()
            units = build_units(c, g, emb, ex, seed=self.seed)
            timings[f"build_{g}"] = timings.get(f"build_{g}", 0.0) + time.perf_counter() - t0
            stats["units"].append(len(units.turn_ids))
            if not units.turn_ids:
                continue
            t0 = time.perf_counter()
            S = qe @ units.emb.T  # [Q, U]
            order = np.argsort(-S, axis=1, kind="stable")
            for qi, q in enumerate(questions):
                ranked = [units.turn_ids[j] for j in order[qi]]
                row = {"question_type": q.question_type, "conversation": c.conversation_id}
                for k in self.ks:
                    row[f"recall@{k}"] = recall_at_k(ranked, q.evidence_turn_ids, k)
                row["ndcg@5"] = ndcg_at_k(ranked, q.evidence_turn_ids, 5, units.turn_ids)
                for b in self.budgets:
                    row[f"recall@{b}turns"] = recall_at_budget(ranked, q.evidence_turn_ids, b)
                rows.append(row)
                for u in ranked[:5]:
                    stats["turns"].append(len(u))
                    key = "\x00".join(u)
                    if key not in tok_cache:
                        tok_cache[key] = emb.count_tokens(" ".join(turn_text[t] for t in u))
                    stats["tokens"].append(tok_cache[key])
            timings[f"score_{g}"] = timings.get(f"score_{g}", 0.0) + time.perf_counter() - t0
        return {"rows": {g: rows}, "stats": {g: stats}, "timings": timings}

    def merge(self, ds: Dataset, outputs: Sequence[TaskOutput], emb: Any) -> "GranularityResult":
        convs, skipped = questions_by_conversation(ds, self.max_questions)
        per_q = concat_rows(outputs)
        unit_stats = {g: {"turns": [], "tokens": [], "units": []} for g in self.granularities}
        for o in outputs:
            for g, st in o.partial["stats"].items():
                for k, v in st.items():
                    unit_stats[g][k].extend(v)
        llm_ids = {c.conversation_id for c, _ in convs[:max(0, self.llm_conversations)]}
        metrics: dict[str, Any] = {}
        metric_names = [f"recall@{k}" for k in self.ks] + ["ndcg@5"] + [f"recall@{b}turns" for b in self.budgets]
        llm_slice_ids = llm_ids if "topic-llm" in self.granularities else set()
        for g in self.granularities:
            rows = per_q.get(g, [])
            m = {n: mean([r[n] for r in rows]) for n in metric_names}
            m["questions"] = len(rows)
            m["turns_per_unit"] = mean(unit_stats[g]["turns"])
            m["tokens_per_unit"] = mean(unit_stats[g]["tokens"])
            m["units_per_conversation"] = mean(unit_stats[g]["units"])
            m["by_type"] = by_type(rows, metric_names)
            metrics[g] = m
            if llm_slice_ids and g != "topic-llm":
                sl = [r for r in rows if r["conversation"] in llm_slice_ids]
                metrics[f"{g}@llm-slice"] = {n: mean([r[n] for r in sl]) for n in metric_names} | {"questions": len(sl)}
        timings = sum_timings(outputs)
        timings["total"] = timings["tasks"]
        config = dict(experiment="granularity", granularities=list(self.granularities), ks=list(self.ks),
                      budgets=list(self.budgets), topic_threshold=self.topic_threshold,
                      llm_conversations=self.llm_conversations, max_questions=self.max_questions,
                      retrieval="exact cosine (numpy) over the conversation's units", embedder=emb.model_name,
                      seed=self.seed)
        return GranularityResult(config, dataset_info(ds) | {"skipped_no_evidence": skipped}, metrics, timings,
                                 environment())


def granularity_experiment(granularities: Sequence[str] = ("turn", "session", "mix", "chunk4", "topic-embedding"),
                           **kw: Any) -> GranularityExperiment:
    """A checked :class:`GranularityExperiment` (the arguments of :func:`run_granularity` but
    ``emb``, ``progress`` and ``conversations_per_task``)."""
    for g in granularities:
        if g not in GRANULARITIES:
            raise bad_arg("granularities", f"names from {GRANULARITIES}", g)
    for k in ("ks", "budgets"):
        if k in kw:
            kw[k] = tuple(kw[k])
    return GranularityExperiment(granularities=tuple(granularities), **kw)


def run_granularity(ds: Dataset, granularities: Sequence[str] = ("turn", "session", "mix", "chunk4", "topic-embedding"),
                    *, emb: CachedEmbedder | None = None, ks: Sequence[int] = (5, 10), budgets: Sequence[int] = BUDGETS,
                    topic_threshold: float = 0.3, chat_model: Any = None, llm_conversations: int = 1,
                    llm_max_new_tokens: int = 160, max_questions: int | None = None, progress: bool = False,
                    seed: int = 0, conversations_per_task: int = DEFAULT_CONVERSATIONS_PER_TASK) -> "GranularityResult":
    """Recall@k, NDCG@5, Recall at equal turn budgets, turns/tokens per unit, per granularity.

    ``topic-llm`` runs on the first ``llm_conversations`` conversations only (CPU: a chat model
    call per session); its rows say how many questions they cover, and the other granularities are
    also reported on that same slice (``<name>@llm-slice``) so the comparison is like for like.
    Runs the tasks of :class:`GranularityExperiment` here (:func:`memkern.eval.tasks.run_local`);
    the result does not depend on ``conversations_per_task``.
    """
    exp = granularity_experiment(granularities, ks=ks, budgets=budgets, topic_threshold=topic_threshold,
                                 chat_model=chat_model, llm_conversations=llm_conversations,
                                 llm_max_new_tokens=llm_max_new_tokens, max_questions=max_questions, seed=seed)
    return run_local(exp, ds, emb or CachedEmbedder(), conversations_per_task, progress=progress)
