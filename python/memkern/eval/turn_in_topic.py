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
from .data import by_type, dataset_info, mean, progress_bar, questions_with_evidence
from .metrics import recall_at_budget
from .report import ExperimentResult, cell, environment
from .units import BUDGETS, CachedEmbedder, build_units, make_extractor

__all__ = ["run_turn_in_topic", "TurnInTopicResult"]


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


def run_turn_in_topic(ds: Dataset, alphas: Sequence[float] = (0.0, 1.0, 2.0), parents: Sequence[str] = ("chunk4", "topic-embedding"),
                      *, emb: CachedEmbedder | None = None, budgets: Sequence[int] = BUDGETS, topic_threshold: float = 0.3,
                      max_questions: int | None = None, progress: bool = False, seed: int = 0) -> "TurnInTopicResult":
    """Turns ranked by ``cos(q, turn) + alpha * cos(q, parent unit)`` at equal budgets.

    ``alpha = 0`` is plain turn retrieval (the reference). Returns per (parent, alpha) the
    recall at each budget and the difference to plain turns.
    """
    for p in parents:
        if p not in ("chunk4", "session", "topic-embedding"):
            raise bad_arg("parents", "names from ('chunk4', 'session', 'topic-embedding')", p)
    emb = emb or CachedEmbedder()
    t_start = time.perf_counter()
    qs, skipped = questions_with_evidence(ds, max_questions)
    by_conv: dict[str, list] = {}
    for c, q in qs:
        by_conv.setdefault(c.conversation_id, []).append(q)
    ex = make_extractor("embedding", emb, threshold=topic_threshold) if "topic-embedding" in parents else None
    rows: dict[str, list[dict[str, float]]] = {}
    for c in progress_bar([c for c in ds.conversations if c.conversation_id in by_conv], progress, desc="turn-in-topic"):
        questions = by_conv[c.conversation_id]
        qe = emb.encode([q.question for q in questions], kind="query")
        turns = build_units(c, "turn", emb)
        tid = [u[0] for u in turns.turn_ids]
        pos = {t: i for i, t in enumerate(tid)}
        st = qe @ turns.emb.T  # [Q, T]
        for p in parents:
            pu = build_units(c, p, emb, ex, seed=seed)
            parent_of = np.full(len(tid), -1, dtype=np.int64)
            for j, ids in enumerate(pu.turn_ids):
                for t in ids:
                    if parent_of[pos[t]] < 0:
                        parent_of[pos[t]] = j
            sp = qe @ pu.emb.T  # [Q, P]
            # a turn no parent covers gets the parent score 0 (cosine of an unrelated text)
            ps = np.where(parent_of[None, :] >= 0, sp[:, np.maximum(parent_of, 0)], 0.0)
            for a in alphas:
                if a == 0 and p != parents[0]:
                    continue
                name = "turn" if a == 0 else f"turn+{a:g}*{p}"
                s = st + float(a) * ps
                order = np.argsort(-s, axis=1, kind="stable")
                for qi, q in enumerate(questions):
                    ranked = [[tid[j]] for j in order[qi][:max(budgets)]]
                    r = {f"recall@{b}turns": recall_at_budget(ranked, q.evidence_turn_ids, b) for b in budgets}
                    r["question_type"] = q.question_type
                    rows.setdefault(name, []).append(r)
    emb.flush()
    names = [f"recall@{b}turns" for b in budgets]
    metrics = {}
    base = {n: mean([r[n] for r in rows.get("turn", [])]) for n in names}
    for name, rs in rows.items():
        m = {n: mean([r[n] for r in rs]) for n in names}
        m |= {f"delta_{n}": m[n] - base[n] for n in names}
        m["questions"] = len(rs)
        m["by_type"] = by_type(rs, names)
        metrics[name] = m
    config = dict(experiment="turn-in-topic", alphas=list(alphas), parents=list(parents), budgets=list(budgets),
                  topic_threshold=topic_threshold, embedder=emb.model_name, seed=seed,
                  retrieval="exact cosine (numpy); score = cos(q,turn) + alpha*cos(q,parent)")
    return TurnInTopicResult(config, dataset_info(ds) | {"skipped_no_evidence": skipped}, metrics,
                             {"total": time.perf_counter() - t_start}, environment())
