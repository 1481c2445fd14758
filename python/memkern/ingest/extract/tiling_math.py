"""The TextTiling maths on turn embeddings: the similarity across each gap between turns, the depth
of each gap, and the topic boundaries placed at the deepest gaps within size bounds.
"""
from __future__ import annotations

import numpy as np

__all__ = ["gap_similarities", "depth_scores", "tile_boundaries"]


def _unit_rows(e: np.ndarray) -> np.ndarray:
    return e / np.maximum(np.linalg.norm(e, axis=-1, keepdims=True), 1e-12)


def gap_similarities(e: np.ndarray, window: int) -> np.ndarray:
    """Cosine similarity across each gap between neighbouring turns (TextTiling's block comparison).

    Parameters
    ----------
    e : float32 [n, d]
        Turn embeddings (any scale).
    window : int
        Turns on each side of a gap (fewer at the session's ends).

    Returns
    -------
    float32 [n - 1]
        ``sim[g - 1] = cos(sum(e[g - window:g]), sum(e[g:g + window]))`` for the gap before turn ``g``.
    """
    n = e.shape[0]
    if n < 2:
        return np.zeros(0, np.float32)
    u = _unit_rows(np.asarray(e, np.float32))
    c = np.concatenate([np.zeros((1, u.shape[1]), np.float32), np.cumsum(u, 0, dtype=np.float64).astype(np.float32)])
    g = np.arange(1, n)
    left = c[g] - c[np.maximum(g - window, 0)]
    right = c[np.minimum(g + window, n)] - c[g]
    return np.sum(_unit_rows(left) * _unit_rows(right), axis=1).astype(np.float32)


def depth_scores(sim: np.ndarray) -> np.ndarray:
    """TextTiling depth of each gap: ``(left peak - sim) + (right peak - sim)``, where a peak is the
    highest similarity reached climbing away from the gap while similarity rises. float32 ``[n - 1]``."""
    sim = np.asarray(sim, np.float32)
    m = len(sim)
    depth = np.zeros(m, np.float32)
    for g in range(m):  # m = turns of one session - 1 (tens): not a hot path
        lp = sim[g]
        j = g - 1
        while j >= 0 and sim[j] >= lp:
            lp = sim[j]
            j -= 1
        rp = sim[g]
        j = g + 1
        while j < m and sim[j] >= rp:
            rp = sim[j]
            j += 1
        depth[g] = (lp - sim[g]) + (rp - sim[g])
    return depth


def tile_boundaries(depth: np.ndarray, n: int, target_turns: float, min_turns: int, max_turns: int) -> list[int]:
    """Segment starts (sorted, first 0) for ``n`` turns from gap depths.

    ``round(n / target_turns) - 1`` cuts are placed at the deepest gaps (ties: earlier gap first)
    such that every segment keeps at least ``min_turns`` turns; then any segment longer than
    ``max_turns`` is cut at its deepest admissible gap until none is (evenly when no gap is
    admissible; among equally deep gaps the one nearest the segment's middle).
    """
    if n <= 0:
        return []
    want = max(0, int(round(n / float(target_turns))) - 1)
    cuts: list[int] = []
    order = np.argsort(-np.asarray(depth, np.float64), kind="stable")  # gap index j = cut before turn j + 1
    for j in order:
        if len(cuts) >= want:
            break
        b = int(j) + 1
        edges = [0] + sorted(cuts) + [n]
        k = int(np.searchsorted(edges, b))
        if b - edges[k - 1] >= min_turns and edges[k] - b >= min_turns:
            cuts.append(b)
    cuts.sort()
    changed = True
    while changed:
        changed = False
        edges = [0] + cuts + [n]
        for a, z in zip(edges[:-1], edges[1:]):
            if z - a <= max_turns:
                continue
            lo, hi = a + min_turns, z - min_turns  # admissible cut positions b in [lo, hi]
            if lo <= hi:
                # deepest admissible gap; among equal depths the one nearest the middle
                cand = np.arange(lo, hi + 1)
                score = np.asarray(depth, np.float64)[cand - 1] - 1e-9 * np.abs(cand - (a + z) / 2.0)
                b = int(cand[int(np.argmax(score))])
            else:
                b = a + (z - a) // 2
            cuts = sorted(cuts + [b])
            changed = True
            break
    return [0] + cuts
