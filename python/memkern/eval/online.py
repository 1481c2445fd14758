"""Online reranker helpers shared by the reflection and collapse experiments.

:func:`build_candidates` freezes the retriever's top-K turns per question; :func:`train_online`
runs the real :class:`memkern.Reranker` online on a stream of them with simulated citations
(:func:`simulate_citations`) and measures held-back Recall@M (:func:`eval_reranker`).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..data.schema import Dataset
from ..errors import bad_arg
from .data import progress_bar, questions_with_evidence
from .units import CachedEmbedder, build_units

__all__ = ["Candidates", "build_candidates", "recall_of", "split_rows", "make_reranker", "eval_reranker",
           "simulate_citations", "train_online", "instance_config", "preset_config"]


@dataclass
class Candidates:
    """Top-K turn candidates of each question from the frozen retriever.

    q: float32 ``[N, d]``; cand: float32 ``[N, K, d]``; mask: bool ``[N, K]``; useful: bool
    ``[N, K]`` (candidate is an evidence turn); ev_count: int ``[N]`` (evidence turns of the
    question, also those outside the top-K); qtype: list of str; conv: list of str.
    """

    q: np.ndarray
    cand: np.ndarray
    mask: np.ndarray
    useful: np.ndarray
    ev_count: np.ndarray
    qtype: list[str]
    conv: list[str]


def build_candidates(ds: Dataset, emb: CachedEmbedder, k: int = 20, granularity: str = "turn",
                     max_questions: int | None = None, progress: bool = False) -> Candidates:
    """Candidates for the reranker experiments: the frozen retriever's top-``k`` turns."""
    if granularity != "turn":
        raise bad_arg("granularity", "'turn' (recall counts evidence turns per candidate)", granularity)
    qs, _ = questions_with_evidence(ds, max_questions)
    by_conv: dict[str, list] = {}
    for c, q in qs:
        by_conv.setdefault(c.conversation_id, []).append(q)
    Q, C, M, U, E, T, V = [], [], [], [], [], [], []
    for c in progress_bar([c for c in ds.conversations if c.conversation_id in by_conv], progress, desc="candidates"):
        questions = by_conv[c.conversation_id]
        qe = emb.encode([q.question for q in questions], kind="query")
        units = build_units(c, granularity, emb)
        S = qe @ units.emb.T
        order = np.argsort(-S, axis=1, kind="stable")[:, :k]
        for qi, q in enumerate(questions):
            ev = set(q.evidence_turn_ids)
            idx = order[qi]
            cand = np.zeros((k, emb.dim), np.float32)
            mask = np.zeros(k, bool)
            useful = np.zeros(k, bool)
            cand[:len(idx)] = units.emb[idx]
            mask[:len(idx)] = True
            for j, u in enumerate(idx):
                useful[j] = any(t in ev for t in units.turn_ids[u])
            Q.append(qe[qi]); C.append(cand); M.append(mask); U.append(useful); E.append(len(ev))
            T.append(q.question_type); V.append(c.conversation_id)
    emb.flush()
    return Candidates(np.stack(Q), np.stack(C), np.stack(M), np.stack(U), np.array(E), T, V)


def recall_of(sel_idx: np.ndarray, cands: Candidates, rows: np.ndarray) -> float:
    """Mean over ``rows`` of (evidence turns among the selected candidates) / (evidence turns)."""
    u = cands.useful[rows]  # [n, K]
    got = np.take_along_axis(u, np.maximum(sel_idx, 0), axis=1) & (sel_idx >= 0)
    return float(np.mean(got.sum(1) / np.maximum(cands.ev_count[rows], 1)))


def split_rows(cands: Candidates, test_frac: float, seed: int, by: str = "question") -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    n = len(cands.qtype)
    if by == "question":
        perm = rng.permutation(n)
        n_test = max(1, int(round(n * test_frac)))
        return np.sort(perm[n_test:]), np.sort(perm[:n_test])
    if by == "conversation":
        convs = sorted(set(cands.conv))
        perm = [convs[i] for i in rng.permutation(len(convs))]
        n_test = max(1, int(round(len(convs) * test_frac)))
        test_c = set(perm[:n_test])
        idx = np.arange(n)
        is_test = np.array([c in test_c for c in cands.conv])
        return idx[~is_test], idx[is_test]
    raise bad_arg("split", "'question' or 'conversation'", by)


def make_reranker(dim: int, preset: str, top_m: int, seed: int, overrides: dict[str, Any] | None = None):
    from ..score.reranker import Reranker

    kw = dict(overrides or {})
    kw.setdefault("seed", seed)
    kw.setdefault("top_m", top_m)
    if preset == "default":
        return Reranker(dim, **kw)
    return Reranker.from_preset(preset, dim, **kw)


def eval_reranker(rr, cands: Candidates, rows: np.ndarray, batch: int = 256) -> float:
    import torch

    got = []
    with torch.no_grad():
        for s in range(0, len(rows), batch):
            r = rows[s:s + batch]
            sel = rr.select(torch.from_numpy(cands.q[r]), torch.from_numpy(cands.cand[r]),
                            mask=torch.from_numpy(cands.mask[r]), greedy=True)
            got.append(sel.indices.cpu().numpy())
    return recall_of(np.concatenate(got), cands, rows)


def simulate_citations(sel_idx: np.ndarray, useful: np.ndarray, rng: np.random.Generator,
                        p_useful: float, p_useless: float) -> np.ndarray:
    """+1 (cited) / -1 (not cited) per selected slot; 0 on ``-1`` slots. ``useful``: ``[B, K]``."""
    u = np.take_along_axis(useful, np.maximum(sel_idx, 0), axis=1)
    p = np.where(u, p_useful, p_useless)
    cited = rng.random(sel_idx.shape) < p
    r = np.where(cited, 1.0, -1.0)
    return np.where(sel_idx >= 0, r, 0.0).astype(np.float32)


def train_online(rr, cands: Candidates, train: np.ndarray, test: np.ndarray, *, batch_size: int = 8, passes: float = 1.0,
                 steps: int | None = None, p_useful: float = 0.9, p_useless: float = 0.1, seed: int = 0,
                 eval_every: int | None = None, progress: bool = False) -> dict[str, Any]:
    """Train ``rr`` online on the ``train`` rows; returns the curve and final held-back Recall@5.

    The stream is the train rows in a seeded random order, repeated ``passes`` times (or cut /
    cycled to exactly ``steps`` updates). Each step: ``select`` (sampled, seeded), simulated
    citations, ``update``. ``eval_every`` > 0 records held-back Recall@5 every that many steps (None: ~20 points).
    """
    import torch

    rng = np.random.default_rng(seed + 7919)
    n_steps = steps if steps is not None else max(1, int(math.ceil(len(train) * passes / batch_size)))
    if eval_every is None:
        eval_every = max(1, n_steps // 20)
    stream: list[int] = []
    while len(stream) < n_steps * batch_size:
        stream.extend(rng.permutation(train).tolist())
    curve = [(0, eval_reranker(rr, cands, test), rr.adapter_norm())]
    rewards_seen = []
    info: dict[str, Any] = {}
    t0 = time.perf_counter()
    for step in progress_bar(range(n_steps), progress, desc="updates", leave=False):
        r = np.asarray(stream[step * batch_size:(step + 1) * batch_size])
        sel = rr.select(torch.from_numpy(cands.q[r]), torch.from_numpy(cands.cand[r]),
                        mask=torch.from_numpy(cands.mask[r]), seed=seed * 1_000_003 + step)
        idx = sel.indices.cpu().numpy()
        rew = simulate_citations(idx, cands.useful[r], rng, p_useful, p_useless)
        info = rr.update(sel, torch.from_numpy(rew))
        rewards_seen.append(float((rew > 0).sum() / max((idx >= 0).sum(), 1)))
        if eval_every and (step + 1) % eval_every == 0 and step + 1 < n_steps:
            curve.append((step + 1, eval_reranker(rr, cands, test), rr.adapter_norm()))
    train_s = time.perf_counter() - t0
    curve.append((n_steps, eval_reranker(rr, cands, test), rr.adapter_norm()))
    return dict(steps=n_steps, curve=curve, final=curve[-1][1], train_seconds=train_s,
                reward_rate=float(np.mean(rewards_seen)) if rewards_seen else math.nan,
                rollbacks=int(getattr(rr, "rollbacks", 0) or 0), last_info={k: _num(v) for k, v in info.items()})


def _num(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return str(v)


def instance_config(rr) -> dict[str, Any]:
    """The settings the reranker actually ran with (:meth:`memkern.Reranker.config`; ``{}`` for a
    reranker without one)."""
    cfg = getattr(rr, "config", None)
    d = cfg() if callable(cfg) else {}
    return {k: (v if isinstance(v, (int, float, str, bool, type(None))) else str(v)) for k, v in d.items()}


def preset_config(preset: str, top_m: int, overrides) -> dict[str, Any]:
    try:
        from ..score.reranker import PRESETS

        base = dict(PRESETS.get("stable" if preset == "default" else preset, {}))
    except Exception:  # pragma: no cover
        base = {}
    base.update(overrides or {})
    base["top_m"] = top_m
    base["preset"] = preset
    return {k: (v if isinstance(v, (int, float, str, bool, type(None))) else str(v)) for k, v in base.items()}
