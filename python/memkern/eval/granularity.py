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
from .data import by_type, dataset_info, mean, progress_bar, questions_with_evidence
from .metrics import ndcg_at_k, recall_at_budget, recall_at_k
from .report import ExperimentResult, cell, environment
from .units import BUDGETS, GRANULARITIES, CachedEmbedder, build_units, make_extractor

__all__ = ["run_granularity", "GranularityResult"]


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


def run_granularity(ds: Dataset, granularities: Sequence[str] = ("turn", "session", "mix", "chunk4", "topic-embedding"),
                    *, emb: CachedEmbedder | None = None, ks: Sequence[int] = (5, 10), budgets: Sequence[int] = BUDGETS,
                    topic_threshold: float = 0.3, chat_model: Any = None, llm_conversations: int = 1,
                    llm_max_new_tokens: int = 160, max_questions: int | None = None, progress: bool = False,
                    seed: int = 0) -> "GranularityResult":
    """Recall@k, NDCG@5, Recall at equal turn budgets, turns/tokens per unit, per granularity.

    ``topic-llm`` runs on the first ``llm_conversations`` conversations only (CPU: a chat model
    call per session); its rows say how many questions they cover, and the other granularities are
    also reported on that same slice (``<name>@llm-slice``) so the comparison is like for like.
    """
    for g in granularities:
        if g not in GRANULARITIES:
            raise bad_arg("granularities", f"names from {GRANULARITIES}", g)
    emb = emb or CachedEmbedder()
    t_start = time.perf_counter()
    qs, skipped = questions_with_evidence(ds, max_questions)
    timings: dict[str, float] = {}
    per_q: dict[str, list[dict[str, float]]] = {g: [] for g in granularities}
    unit_stats: dict[str, dict[str, list[float]]] = {g: {"turns": [], "tokens": [], "units": []} for g in granularities}
    by_conv: dict[str, list] = {}
    for c, q in qs:
        by_conv.setdefault(c.conversation_id, []).append(q)
    convs = [c for c in ds.conversations if c.conversation_id in by_conv]
    extractors: dict[str, Any] = {}
    llm_ids = {c.conversation_id for c in convs[:max(0, llm_conversations)]}
    tok_cache: dict[str, int] = {}
    turn_text = {}
    for c in convs:
        for t in c.turns():
            turn_text[(c.conversation_id, t.turn_id)] = t.content
    for c in progress_bar(convs, progress, desc="granularity", unit="conv"):
        questions = by_conv[c.conversation_id]
        qe = emb.encode([q.question for q in questions], kind="query")
        for g in granularities:
            if g == "topic-llm" and c.conversation_id not in llm_ids:
                continue
            t0 = time.perf_counter()
            ex = None
            if g.startswith("topic-"):
                kind = g.split("-", 1)[1]
                if kind not in extractors:
                    extractors[kind] = make_extractor(kind, emb, chat_model, topic_threshold, llm_max_new_tokens)
                ex = extractors[kind]
            units = build_units(c, g, emb, ex, seed=seed)
            timings[f"build_{g}"] = timings.get(f"build_{g}", 0.0) + time.perf_counter() - t0
            unit_stats[g]["units"].append(len(units.turn_ids))
            if not units.turn_ids:
                continue
            t0 = time.perf_counter()
            S = qe @ units.emb.T  # [Q, U]
            order = np.argsort(-S, axis=1, kind="stable")
            for qi, q in enumerate(questions):
                ranked = [units.turn_ids[j] for j in order[qi]]
                row = {"question_type": q.question_type, "conversation": c.conversation_id}
                for k in ks:
                    row[f"recall@{k}"] = recall_at_k(ranked, q.evidence_turn_ids, k)
                row["ndcg@5"] = ndcg_at_k(ranked, q.evidence_turn_ids, 5, units.turn_ids)
                for b in budgets:
                    row[f"recall@{b}turns"] = recall_at_budget(ranked, q.evidence_turn_ids, b)
                per_q[g].append(row)
                for u in ranked[:5]:
                    unit_stats[g]["turns"].append(len(u))
                    key = "\x00".join(u)
                    if key not in tok_cache:
                        tok_cache[key] = emb.count_tokens(" ".join(turn_text[(c.conversation_id, t)] for t in u))
                    unit_stats[g]["tokens"].append(tok_cache[key])
            timings[f"score_{g}"] = timings.get(f"score_{g}", 0.0) + time.perf_counter() - t0
    emb.flush()
    metrics: dict[str, Any] = {}
    metric_names = [f"recall@{k}" for k in ks] + ["ndcg@5"] + [f"recall@{b}turns" for b in budgets]
    llm_slice_ids = llm_ids if "topic-llm" in granularities else set()
    for g in granularities:
        rows = per_q[g]
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
    timings["total"] = time.perf_counter() - t_start
    config = dict(experiment="granularity", granularities=list(granularities), ks=list(ks), budgets=list(budgets),
                  topic_threshold=topic_threshold, llm_conversations=llm_conversations,
                  max_questions=max_questions, retrieval="exact cosine (numpy) over the conversation's units",
                  embedder=emb.model_name, seed=seed)
    return GranularityResult(config, dataset_info(ds) | {"skipped_no_evidence": skipped}, metrics, timings, environment())
