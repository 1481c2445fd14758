"""What :meth:`memkern.Reranker.select` draws (:class:`Selection`) and the helpers the reranker, its
trainer and the CUDA graphs share: the prior and residual of a draw, the rewards' checks and the
forward-cache key."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import MemkernTypeError, bad_arg, require

require("reranker", "torch", feature="memkern.score.selection")  # names the extra when a package is missing
import torch  # noqa: E402

__all__ = ["Selection", "prior_offset", "dense_rows"]


@dataclass
class Selection:
    """What :meth:`Reranker.select` drew, with everything :meth:`Reranker.update` needs.

    Attributes
    ----------
    indices : int64 ``[B, M]`` positions into the candidate list (``-1`` = no item: the row had
        fewer than ``M`` valid candidates)
    scores : float32 ``[B, K]`` reranker scores (``-inf`` for padding)
    logp : float32 ``[B, M]`` log-probabilities of the drawn slots (``0`` on ``-1`` slots)
    q : ``[B, d]`` the queries
    candidates : dense ``[B, K, d]`` candidates, or the table ``[N, d]`` when ``ids`` is set
    ids : int64 ``[B, K]`` or None
    mask : bool ``[B, K]`` or None
    seed, offset : the Philox key and counter base of the draw (reproduce it with ops.gumbel_topm)
    greedy : whether the draw was noise-free (top-M by score)
    squeezed : the query was 1-D (``indices`` etc. are then ``[M]``/``[K]``)
    prior : float32 ``[B, K]`` (``[K]`` when squeezed) the per-candidate prior :meth:`Reranker.select`
        was given, or None; ``scores`` then hold ``prior + (q' . m' - q . m)``
    """

    indices: torch.Tensor
    scores: torch.Tensor
    logp: torch.Tensor
    q: torch.Tensor
    candidates: torch.Tensor
    ids: torch.Tensor | None
    mask: torch.Tensor | None
    seed: int
    offset: int
    greedy: bool = False
    squeezed: bool = False
    prior: torch.Tensor | None = None

    @property
    def selected_ids(self) -> torch.Tensor:
        """Store ids of the selected memories ``[B, M]`` (``-1`` = none); needs ``ids``."""
        if self.ids is None:
            raise bad_arg("selection.ids", "candidates given as (ids, table)", None)
        idx = self.indices if not self.squeezed else self.indices.unsqueeze(0)
        ids = self.ids if self.ids.dim() == 2 else self.ids.unsqueeze(0)
        out = torch.where(idx >= 0, ids.gather(1, idx.clamp_min(0)), torch.full_like(idx, -1))
        return out[0] if self.squeezed else out


def _as_prior(prior, B: int, K: int, squeezed: bool, device) -> torch.Tensor:
    """``prior`` as a float32 ``[B, K]`` tensor on ``device`` (see :meth:`Reranker.select`)."""
    on_host = not (isinstance(prior, torch.Tensor) and prior.device.type != "cpu")
    if isinstance(prior, torch.Tensor):
        if not (prior.is_floating_point() or prior.dtype in (torch.int32, torch.int64)):
            raise bad_arg("prior", "a float tensor [B, K]", prior.dtype, MemkernTypeError)
        t = prior.detach()
    else:
        try:
            arr = np.asarray(prior, dtype=np.float64)
        except (TypeError, ValueError):
            raise bad_arg("prior", "a float array [B, K]", type(prior).__name__, MemkernTypeError) from None
        t = torch.from_numpy(arr)
    if squeezed and t.dim() == 1:
        t = t.unsqueeze(0)
    if tuple(t.shape) != (B, K):
        raise bad_arg("prior", f"shape [B, K] = [{B}, {K}]" + (" (or [K] for a 1-D q)" if squeezed else ""),
                      tuple(prior.shape) if hasattr(prior, "shape") else tuple(t.shape))
    if on_host and not bool(torch.isfinite(t).all()):
        raise bad_arg("prior", "finite values", "a NaN/inf")
    return t.to(device=device, dtype=torch.float32)


def _residual(q, r, cands, ids, scores) -> torch.Tensor:
    """``q' . m' - q . m`` per candidate, float32 ``[B, K]``, computed as ``m . (r - q)`` (exactly 0
    for zero adapters, where ``r == q``); ``-inf`` where ``scores`` is (padding)."""
    q2 = q.unsqueeze(0) if q.dim() == 1 else q
    dq = r.float() - q2.float()                                      # [B, d]
    if ids is None:
        C = cands.unsqueeze(0) if cands.dim() == 2 else cands        # [B, K, d]
    else:
        ii = ids.unsqueeze(0) if ids.dim() == 1 else ids
        C = cands[ii.clamp_min(0)]                                   # [B, K, d]
    delta = torch.bmm(C.float(), dq.unsqueeze(-1)).squeeze(-1)          # [B, K]
    return torch.where(torch.isfinite(scores), delta, scores)


def _forward_key(*tensors):
    """Identity and in-place version of each tensor (None entries skipped); None if unavailable."""
    try:
        return tuple((id(t), t._version) for t in tensors if t is not None)
    except RuntimeError:             # inference-mode tensors have no version counter
        return None


def _as_rewards(rewards, indices):
    """Rewards as float32 ``[B, M]`` on the selection's device, from a tensor (any device), a numpy
    array or a (nested) list; bools map cited -> +1, not cited -> -1."""
    if not isinstance(rewards, torch.Tensor):
        try:
            rewards = torch.as_tensor(rewards)
        except Exception:
            raise bad_arg("rewards", "a tensor, numpy array or list [B, M]", type(rewards).__name__,
                          MemkernTypeError) from None
    if rewards.dim() == 1 and indices.dim() == 2 and indices.shape[0] == 1:
        rewards = rewards.unsqueeze(0)
    if tuple(rewards.shape) != tuple(indices.shape):
        raise bad_arg("rewards", f"the selection's shape {tuple(indices.shape)}", tuple(rewards.shape))
    if rewards.dtype == torch.bool:
        rewards = rewards.to(indices.device, non_blocking=True).float() * 2.0 - 1.0   # cited -> +1, else -1
    elif not (rewards.is_floating_point() or rewards.dtype in (torch.int8, torch.int16, torch.int32, torch.int64,
                                                               torch.uint8)):
        raise bad_arg("rewards", "float, int or bool values", rewards.dtype, MemkernTypeError)
    return rewards.to(indices.device, torch.float32, non_blocking=True)


def prior_offset(sel, q, C, valid):
    """The part of the policy's scores that is not the adapters': ``prior - q . m`` (float32 ``[B, K]``,
    0 on padding), so that ``prior + (q' . m' - q . m)`` (what :meth:`memkern.Reranker.select` drew
    from) is ``that + q' . m'``; None when ``sel`` was drawn without a prior. ``q [B, d]``, ``C [B, K, d]``,
    ``valid [B, K]``: the selection's dense rows (:func:`dense_rows`)."""
    p = sel.prior
    if p is None:
        return None
    p = p if p.dim() == 2 else p.unsqueeze(0)
    qm = torch.bmm(C.float(), q.float().unsqueeze(2)).squeeze(2)
    return torch.where(valid, p.to(qm.device, torch.float32) - qm, torch.zeros((), device=qm.device))


def dense_rows(sel):
    """Dense rows (q [B,d], C [B,K,d], valid [B,K]) of a selection."""
    q = sel.q if sel.q.dim() == 2 else sel.q.unsqueeze(0)
    if sel.ids is not None:
        ids = sel.ids if sel.ids.dim() == 2 else sel.ids.unsqueeze(0)
        C = sel.candidates[ids.clamp_min(0)]
        valid = ids >= 0
    else:
        C = sel.candidates if sel.candidates.dim() == 3 else sel.candidates.unsqueeze(0)
        valid = None
    if sel.mask is not None:
        mk = sel.mask if sel.mask.dim() == 2 else sel.mask.unsqueeze(0)
        valid = mk if valid is None else valid & mk
    if valid is None:
        valid = _ones(C.shape[:2], C.device)
    return q, C, valid


_ONES: dict = {}


def _ones(shape, device):
    """A cached all-True bool tensor (read only) of ``shape``."""
    key = (tuple(shape), device)
    t = _ONES.get(key)
    if t is None:
        if len(_ONES) > 16:
            _ONES.clear()
        t = _ONES[key] = torch.ones(key[0], dtype=torch.bool, device=device)
    return t
