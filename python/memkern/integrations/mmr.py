"""Maximal marginal relevance (Carbonell & Goldstein, 1998) over a store's candidates, shared by the
LangChain and LlamaIndex adapters.

Given a query ``q`` and candidates ``x_1..x_n`` (the store's best ``fetch_k`` for ``q``), MMR picks
``k`` of them greedily; each step takes the unpicked candidate ``i`` with the highest

    lambda * cos(q, x_i) - (1 - lambda) * max_{j picked} cos(x_i, x_j)

(the first pick: the candidate most similar to the query; ties go to the earlier candidate, i.e. the
store's better one). ``lambda = 1`` is plain similarity order, ``lambda = 0`` maximal diversity.
This is LangChain's ``maximal_marginal_relevance`` (``lambda_mult``) exactly, and LlamaIndex's MMR
(``mmr_threshold``) with the redundancy taken against every picked candidate (LlamaIndex's own
``get_top_k_mmr_embeddings`` compares with the latest pick only). Cosine similarity as both
frameworks define it: a zero vector has similarity 0 with everything.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import MemkernTypeError, bad_arg

__all__ = ["mmr", "check_lambda"]


def check_lambda(value: Any, name: str) -> float:
    """``value`` as a float in [0, 1], else an error naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise bad_arg(name, "a number in [0, 1]", type(value).__name__, MemkernTypeError)
    v = float(value)
    if not 0.0 <= v <= 1.0:
        raise bad_arg(name, "a number in [0, 1]", value)
    return v


def _unit(x: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(x, axis=-1, keepdims=True)
    return np.divide(x, n, out=np.zeros_like(x), where=n > 0)


def mmr(query: np.ndarray, candidates: np.ndarray, k: int, lambda_mult: float) -> tuple[np.ndarray, np.ndarray]:
    """Pick ``min(k, n)`` candidates by maximal marginal relevance.

    Parameters
    ----------
    query : float ``[d]``
    candidates : float ``[n, d]`` (the store's candidates, best first)
    k : int >= 1
    lambda_mult : float in [0, 1] (weight of the similarity to the query)

    Returns
    -------
    picks : int64 ``[m]``, indices into ``candidates`` in the order picked (``m = min(k, n)``)
    scores : float64 ``[m]``, each pick's MMR score when it was picked (the first:
        ``lambda_mult * cos(q, x)``)
    """
    c = _unit(np.asarray(candidates, dtype=np.float64))
    n = c.shape[0]
    m = min(int(k), n)
    picks = np.zeros(m, dtype=np.int64)
    scores = np.zeros(m, dtype=np.float64)
    if m == 0:
        return picks, scores
    sim_q = c @ _unit(np.asarray(query, dtype=np.float64))     # [n]
    gram = c @ c.T                                             # [n, n]; n is fetch_k, small
    redundancy = np.full(n, -np.inf)
    taken = np.zeros(n, dtype=bool)
    lam = float(lambda_mult)
    for s in range(m):
        if s == 0:
            i = int(np.argmax(sim_q))
            score = lam * sim_q[i]
        else:
            mmr_score = lam * sim_q - (1.0 - lam) * redundancy
            mmr_score[taken] = -np.inf
            i = int(np.argmax(mmr_score))
            score = mmr_score[i]
        picks[s], scores[s] = i, score
        taken[i] = True
        redundancy = np.maximum(redundancy, gram[:, i])
    return picks, scores
