"""Learnable reranker of retrieved memories (RMM's retrospective reflection), as a torch module.

Math (see :mod:`memkern.ops` for the full derivation)::

    q' = q + Wq q,   r = q' + Wm^T q',   s_i = m_i . r     (== q' . (m_i + Wm m_i))

``Wq`` and ``Wm`` start at zero, so a fresh reranker scores ``s_i = m_i . q``: the retriever's own
order (exactly, with ``greedy=True``). :meth:`Reranker.select` draws ``top_m`` of the ``K``
candidates by Gumbel-top-M at temperature ``tau`` (Plackett-Luce without replacement);
:meth:`Reranker.update` applies one REINFORCE step from per-slot rewards (``+1`` cited, ``-1`` not
cited, or any floats; a bool tensor means cited/not cited).

Learning settings
-----------------
The default is the *stable* setting; ``Reranker.from_preset("paper", dim)`` is the paper's exact
setting (SGD lr 1e-3, fixed baseline 0.5, per-item softmax log-probs, nothing else).

* ``baseline``: a float (fixed, the paper's 0.5), ``"batch_mean"`` (mean reward of the valid slots
  of the batch incl. replayed rows) or ``"running_mean"`` (exponential mean of past rewards,
  momentum ``baseline_momentum``).
* ``normalize_advantages``: divide advantages by their standard deviation over the batch.
* ``clip_grad_norm``: clip the joint gradient norm of ``(Wq, Wm)``.
* ``weight_decay``: decoupled decay of the adapters toward zero (the retriever's order):
  ``W <- W (1 - lr * weight_decay)`` after each step.
* ``max_norm``: after each step the adapters are projected onto ``||(Wq, Wm)||_F <= max_norm``
  (Adam-like optimizers move ~lr per entry whatever the gradient, so decay alone does not bound them).
* ``replay_capacity`` / ``replay_size``: a bounded FIFO buffer of past rows ``(q, candidate
  embeddings [K, d], valid mask, selection, rewards)``; each update also revisits ``replay_size``
  rows drawn (seeded) from it. The buffer is part of ``state_dict``.
* ``guard``: collapse guard. After each step the adapters must be finite with norm
  ``<= guard_max_norm``; every ``guard_window`` updates the reward rate of the window (fraction
  of its selected slots with reward > 0) is compared with ``best``, the highest value so far of an
  exponential mean of the good windows' rates: at least ``best * (1 - guard_tol)`` -> the state is
  saved as the last good one; below ``best * (1 - guard_drop)`` and more than 4 standard errors
  (of a window's rate) below ``best`` -> the adapters and
  optimizer state roll back to the last good state (logged as a warning). After
  ``guard_patience`` consecutive rollbacks the current level is accepted as the new reference (the
  task itself may have become harder).

Example (one online step; ``store.search`` gives ``ids [B, K]`` with ``-1`` padding)::

    rr = memkern.Reranker(384)                                  # stable default; or Reranker.load(path)
    ids, _ = store.search("user-1", q, k=20)                    # q [B, 384]
    sel = rr.select(q, (ids, table))                            # table [N, 384] rows addressed by ids
    # or dense: sel = rr.select(q, cands [B, K, d], mask=ids >= 0)
    chosen = sel.selected_ids                                   # [B, 5] ids (-1 = none)
    stats = rr.update(sel, cited)                               # cited: bool [B, 5] (or +1/-1 floats)
    rr.save(path)                                               # one file per namespace

``select(..., greedy=True)`` ranks without sampling (use it for evaluation). ``update`` returns
``loss``, ``reward_rate``, ``grad_norm``, ``adapter_norm``, ``n_rows``, ``n_replay``, ``baseline``,
``rolled_back`` and ``step``.

Persistence: ``state_dict()`` holds ``Wq``, ``Wm`` and an extra state (settings, counters,
optimizer state, running baseline, replay buffer, guard state); ``save(path)`` /
``Reranker.load(path)`` write/read it atomically, so each namespace can keep its own file.
"""
from __future__ import annotations

import collections
import copy
import logging
import math
import os
import tempfile
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from . import ops
from .errors import MemkernTypeError, bad_arg

__all__ = ["Reranker", "Selection", "PRESETS"]

log = logging.getLogger("memkern")

_FORMAT_VERSION = 1

# The paper's setting, and the stable default (issue 7).
PRESETS: dict[str, dict[str, Any]] = {
    "paper": dict(tau=0.5, lr=1e-3, optimizer="sgd", baseline=0.5, logp="softmax",
                  normalize_advantages=False, clip_grad_norm=None, weight_decay=0.0,
                  replay_capacity=0, replay_size=0, guard=False, max_norm=None),
    "stable": dict(tau=0.5, lr=5e-2, optimizer="sgd", baseline="batch_mean", logp="softmax",
                   normalize_advantages=True, clip_grad_norm=1.0, weight_decay=1e-2,
                   replay_capacity=256, replay_size=None, guard=True, max_norm=20.0),
}


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

    @property
    def selected_ids(self) -> torch.Tensor:
        """Store ids of the selected memories ``[B, M]`` (``-1`` = none); needs ``ids``."""
        if self.ids is None:
            raise bad_arg("selection.ids", "candidates given as (ids, table)", None)
        idx = self.indices if not self.squeezed else self.indices.unsqueeze(0)
        ids = self.ids if self.ids.dim() == 2 else self.ids.unsqueeze(0)
        out = torch.where(idx >= 0, ids.gather(1, idx.clamp_min(0)), torch.full_like(idx, -1))
        return out[0] if self.squeezed else out


def _resolve_optimizer(spec, params, lr):
    if spec is None or spec == "sgd":
        return torch.optim.SGD(params, lr=lr), "sgd"
    if spec == "adam":
        return torch.optim.Adam(params, lr=lr), "adam"
    if spec == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.0), "adamw"
    if isinstance(spec, type) and issubclass(spec, torch.optim.Optimizer):
        return spec(params, lr=lr), spec.__name__
    if callable(spec):
        opt = spec(params)
        if not isinstance(opt, torch.optim.Optimizer):
            raise bad_arg("optimizer", "a callable returning a torch.optim.Optimizer", type(opt).__name__,
                          MemkernTypeError)
        return opt, type(opt).__name__
    raise bad_arg("optimizer", "None, 'sgd', 'adam', 'adamw', an Optimizer class or a callable(params)", spec,
                  MemkernTypeError)


class Reranker(nn.Module):
    """Residual-adapter reranker trained online by REINFORCE from citation rewards.

    Parameters
    ----------
    dim : embedding size ``d``
    top_m : number of memories selected per query ``M``
    tau : sampling temperature
    lr : learning rate of the default optimizer (and of the weight decay)
    baseline : float (fixed), ``"batch_mean"`` or ``"running_mean"``
    logp : ``"softmax"`` (paper) or ``"plackett_luce"`` (exact ordered log-probability)
    optimizer : None/"sgd" (SGD(lr)), "adam", "adamw", an optimizer class (called with
        ``(params, lr=lr)``) or a callable ``params -> Optimizer``
    backend : ``"auto" | "triton" | "torch"`` (see :func:`memkern.ops.resolve_backend`)
    seed : base Philox seed of the draws when ``select`` gets no seed; each such draw advances an
        internal counter by ``B*K`` so successive draws differ and the sequence is reproducible
    normalize_advantages, clip_grad_norm, weight_decay, replay_capacity, replay_size,
    baseline_momentum, guard, guard_window, guard_tol, guard_drop, guard_max_norm,
    guard_patience, max_norm : stable-learning settings (module docstring). ``replay_size=None`` replays as
        many rows as the new batch has.
    """

    def __init__(self, dim: int, top_m: int = 5, tau: float = 0.5, lr: float = PRESETS["stable"]["lr"],
                 baseline: float | str = "batch_mean", logp: str = "softmax", optimizer=None,
                 backend: str = "auto", *, seed: int = 0, normalize_advantages: bool = True,
                 clip_grad_norm: float | None = 1.0, weight_decay: float = PRESETS["stable"]["weight_decay"],
                 replay_capacity: int = 256, replay_size: int | None = None, baseline_momentum: float = 0.99,
                 guard: bool = True, guard_window: int = 50, guard_tol: float = 0.05, guard_drop: float = 0.25,
                 guard_max_norm: float = 50.0, guard_patience: int = 3, max_norm: float | None = 20.0,
                 dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None):
        super().__init__()
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise bad_arg("dim", "a positive int", dim)
        if isinstance(top_m, bool) or not isinstance(top_m, int) or top_m < 1:
            raise bad_arg("top_m", "a positive int", top_m)
        if not isinstance(tau, (int, float)) or not tau > 0:
            raise bad_arg("tau", "a positive float", tau)
        if not isinstance(lr, (int, float)) or not lr > 0:
            raise bad_arg("lr", "a positive float", lr)
        if not (isinstance(baseline, (int, float)) and not isinstance(baseline, bool)) and baseline not in (
                "batch_mean", "running_mean"):
            raise bad_arg("baseline", "a float, 'batch_mean' or 'running_mean'", baseline)
        if logp not in ops.LOGP_MODES:
            raise bad_arg("logp", "'softmax' or 'plackett_luce'", logp)
        if backend not in ("auto", "triton", "torch"):
            raise bad_arg("backend", "'auto', 'triton' or 'torch'", backend)
        if clip_grad_norm is not None and not clip_grad_norm > 0:
            raise bad_arg("clip_grad_norm", "None or a positive float", clip_grad_norm)
        if weight_decay < 0:
            raise bad_arg("weight_decay", "a float >= 0", weight_decay)
        if not isinstance(replay_capacity, int) or replay_capacity < 0:
            raise bad_arg("replay_capacity", "an int >= 0", replay_capacity)
        if replay_size is not None and (not isinstance(replay_size, int) or replay_size < 0):
            raise bad_arg("replay_size", "None or an int >= 0", replay_size)
        if max_norm is not None and not max_norm > 0:
            raise bad_arg("max_norm", "None or a positive float", max_norm)
        if not 0.0 <= baseline_momentum < 1.0:
            raise bad_arg("baseline_momentum", "a float in [0, 1)", baseline_momentum)
        ops._seed_int(seed)
        self.dim = dim
        self.top_m = top_m
        self.tau = float(tau)
        self.lr = float(lr)
        self.baseline = baseline if isinstance(baseline, str) else float(baseline)
        self.logp = logp
        self.backend = backend
        self.seed = seed
        self.normalize_advantages = bool(normalize_advantages)
        self.clip_grad_norm = None if clip_grad_norm is None else float(clip_grad_norm)
        self.weight_decay = float(weight_decay)
        self.replay_capacity = replay_capacity
        self.replay_size = replay_size
        self.baseline_momentum = float(baseline_momentum)
        self.guard = bool(guard)
        self.guard_window = int(guard_window)
        self.guard_tol = float(guard_tol)
        self.guard_drop = float(guard_drop)
        self.guard_max_norm = float(guard_max_norm)
        self.guard_patience = int(guard_patience)
        self.max_norm = None if max_norm is None else float(max_norm)
        self.Wq = nn.Parameter(torch.zeros(dim, dim, dtype=dtype, device=device))
        self.Wm = nn.Parameter(torch.zeros(dim, dim, dtype=dtype, device=device))
        self.optimizer, self.optimizer_name = _resolve_optimizer(optimizer, [self.Wq, self.Wm], self.lr)
        # counters and learning state
        self.steps = 0
        self._offset = 0
        self._running_baseline: float | None = None
        self._replay: collections.deque = collections.deque(maxlen=max(replay_capacity, 1))
        self._replay_draws = 0
        self._window: list[float] = []
        self._best_rate: float | None = None
        self._rate_ema: float | None = None
        self._good_state: dict | None = None
        self._rollbacks = 0
        self._consecutive_rollbacks = 0
        self._updates_since_check = 0

    # ------------------------------------------------------------------ construction helpers
    @classmethod
    def from_preset(cls, name: str, dim: int, **overrides) -> "Reranker":
        """``"paper"``: the paper's exact setting; ``"stable"``: the default. ``overrides`` win."""
        if name not in PRESETS:
            raise bad_arg("name", f"one of {sorted(PRESETS)}", name)
        kw = dict(PRESETS[name])
        kw.update(overrides)
        return cls(dim, **kw)

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, top_m={self.top_m}, tau={self.tau}, lr={self.lr}, baseline={self.baseline!r}, "
                f"logp={self.logp!r}, optimizer={self.optimizer_name!r}, guard={self.guard}, "
                f"replay_capacity={self.replay_capacity}")

    # ------------------------------------------------------------------ selection
    def _split(self, candidates):
        if isinstance(candidates, (tuple, list)):
            if len(candidates) != 2:
                raise bad_arg("candidates", "a tensor [B, K, d] or a pair (ids [B, K], table [N, d])",
                              f"a sequence of length {len(candidates)}")
            ids, table = candidates
            return table, ids
        return candidates, None

    def scores(self, q, candidates, mask=None) -> torch.Tensor:
        """Reranker scores ``[B, K]`` (float32, ``-inf`` = padding) without drawing."""
        cands, ids = self._split(candidates)
        with torch.no_grad():
            return ops.rerank_scores(q, self.Wq.detach(), self.Wm.detach(), cands, ids=ids, mask=mask,
                                     backend=self.backend)

    @torch.no_grad()
    def select(self, q, candidates, mask=None, seed=None, greedy: bool = False, m: int | None = None,
               offset: int | None = None) -> Selection:
        """Select ``m`` (default ``top_m``) of the candidates of each query.

        Parameters
        ----------
        q : ``[B, d]`` or ``[d]`` query embeddings
        candidates : ``[B, K, d]`` (``[K, d]`` for a 1-D ``q``) embeddings, or ``(ids [B, K], table
            [N, d])`` with int64 ids (``-1`` = padding) into an embedding table
        mask : bool ``[B, K]``, False = padding (never selected)
        seed : int or ``torch.Generator``; None uses the reranker's ``seed`` and its advancing counter
        greedy : top-``m`` by score, no sampling (the zero reranker then returns the retriever order)
        m : number to select; rows with fewer valid candidates get ``-1`` in the remaining slots
        offset : Philox counter base (default 0 with an explicit seed, the internal counter otherwise)

        Returns
        -------
        :class:`Selection`
        """
        cands, ids = self._split(candidates)
        m = self.top_m if m is None else m
        fwd = ops.rerank_scores(q, self.Wq.detach(), self.Wm.detach(), cands, ids=ids, mask=mask,
                                backend=self.backend)
        scores = fwd if fwd.dim() == 2 else fwd.unsqueeze(0)
        B, K = scores.shape
        if m > K:
            raise bad_arg("m", f"m <= K = {K} (number of candidates); top_m is {self.top_m}", m)
        if seed is None:
            seed_i = self.seed
            off = self._offset if offset is None else offset
            if not greedy and offset is None:
                self._offset += B * K
        else:
            seed_i = ops._seed_int(seed)
            off = 0 if offset is None else offset
        be = ops.resolve_backend(self.backend, scores.device)
        sel = ops.gumbel_topm(scores, m, self.tau, seed=seed_i, offset=off, logp=self.logp, greedy=greedy,
                              backend=be)
        squeezed = q.dim() == 1
        idx, lp = sel.indices, sel.logp
        if squeezed:
            idx, lp = idx[0], lp[0]
        return Selection(idx, fwd, lp, q.detach(), cands, ids, mask, seed_i, off, greedy, squeezed)

    # ------------------------------------------------------------------ update
    @staticmethod
    def _as_rewards(rewards, indices):
        if not isinstance(rewards, torch.Tensor):
            try:
                rewards = torch.as_tensor(rewards)
            except Exception:
                raise bad_arg("rewards", "a tensor [B, M]", type(rewards).__name__, MemkernTypeError) from None
        if rewards.dtype == torch.bool:
            rewards = rewards.float() * 2.0 - 1.0          # cited -> +1, not cited -> -1
        elif not rewards.is_floating_point():
            rewards = rewards.float()
        if rewards.dim() == 1 and indices.dim() == 2 and indices.shape[0] == 1:
            rewards = rewards.unsqueeze(0)
        if tuple(rewards.shape) != tuple(indices.shape):
            raise bad_arg("rewards", f"the selection's shape {tuple(indices.shape)}", tuple(rewards.shape))
        return rewards.to(indices.device, torch.float32)

    def _rows_of(self, sel: Selection):
        """Dense rows (q [B,d], C [B,K,d], valid [B,K], idx [B,M]) of a selection."""
        q = sel.q if sel.q.dim() == 2 else sel.q.unsqueeze(0)
        idx = sel.indices if sel.indices.dim() == 2 else sel.indices.unsqueeze(0)
        B = q.shape[0]
        if sel.ids is not None:
            ids = sel.ids if sel.ids.dim() == 2 else sel.ids.unsqueeze(0)
            C = sel.candidates[ids.clamp_min(0)]
            valid = ids >= 0
        else:
            C = sel.candidates if sel.candidates.dim() == 3 else sel.candidates.unsqueeze(0)
            valid = torch.ones(C.shape[:2], dtype=torch.bool, device=C.device)
        if sel.mask is not None:
            mk = sel.mask if sel.mask.dim() == 2 else sel.mask.unsqueeze(0)
            valid = valid & mk
        return q, C, valid, idx

    def _draw_replay(self, n_new: int):
        size = n_new if self.replay_size is None else self.replay_size
        size = min(size, len(self._replay))
        if size <= 0:
            return []
        g = torch.Generator().manual_seed((self.seed * 1_000_003 + self._replay_draws) % (2**63))
        self._replay_draws += 1
        pick = torch.randperm(len(self._replay), generator=g)[:size].tolist()
        return [self._replay[i] for i in pick]

    @staticmethod
    def _stack_rows(rows, device):
        Kmax = max(r[1].shape[0] for r in rows)
        Mmax = max(r[3].shape[0] for r in rows)
        d = rows[0][0].shape[0]
        n = len(rows)
        q = torch.stack([r[0] for r in rows]).to(device)
        C = torch.zeros(n, Kmax, d, dtype=rows[0][1].dtype, device=device)
        valid = torch.zeros(n, Kmax, dtype=torch.bool, device=device)
        idx = torch.full((n, Mmax), -1, dtype=torch.int64, device=device)
        R = torch.zeros(n, Mmax, dtype=torch.float32, device=device)
        for i, (qi, Ci, vi, ii, ri) in enumerate(rows):
            C[i, :Ci.shape[0]] = Ci
            valid[i, :vi.shape[0]] = vi
            idx[i, :ii.shape[0]] = ii
            R[i, :ri.shape[0]] = ri
        return q, C, valid, idx, R

    def adapter_norm(self) -> float:
        """``sqrt(||Wq||_F^2 + ||Wm||_F^2)``."""
        return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(self.Wq.detach().float()),
                                                           torch.linalg.vector_norm(self.Wm.detach().float())])))

    def update(self, selection: Selection, rewards) -> dict[str, float]:
        """One REINFORCE step from the rewards of ``selection``'s slots.

        Parameters
        ----------
        selection : a :class:`Selection` from :meth:`select`
        rewards : ``[B, M]`` (``[M]`` for a 1-D query) floats (+1 cited, -1 not cited) or bools
            (cited). Slots with index ``-1`` are ignored.

        Returns
        -------
        dict with ``loss``, ``reward_rate`` (fraction of the new valid slots with reward > 0),
        ``grad_norm`` (before clipping), ``adapter_norm`` (after the step), ``n_rows`` (new +
        replayed), ``n_replay``, ``baseline`` (mean baseline used), ``rolled_back`` (0/1),
        ``step``.
        """
        if not isinstance(selection, Selection):
            raise bad_arg("selection", "a memkern.Selection from Reranker.select", type(selection).__name__,
                          MemkernTypeError)
        idx_new = selection.indices if selection.indices.dim() == 2 else selection.indices.unsqueeze(0)
        R_new = self._as_rewards(rewards, idx_new)
        sel_valid_new = idx_new >= 0
        n_valid_new = int(sel_valid_new.sum())
        reward_rate = float(((R_new > 0) & sel_valid_new).sum()) / max(n_valid_new, 1)
        B_new = idx_new.shape[0]
        replay_rows = self._draw_replay(B_new) if self.replay_capacity > 0 else []
        dev = self.Wq.device

        if replay_rows or self.replay_capacity > 0:
            q, C, valid, idx = self._rows_of(selection)
            new_rows = [(q[i].detach().float().clone(), C[i].detach().float().clone(), valid[i].clone(), idx[i].clone(),
                         R_new[i].clone()) for i in range(B_new)]
        if replay_rows:
            q, C, valid, idx, R = self._stack_rows(new_rows + replay_rows, dev)
            cands, ids, mask = C, None, valid
        else:
            q = selection.q if selection.q.dim() == 2 else selection.q.unsqueeze(0)
            cands, ids, mask = selection.candidates, selection.ids, selection.mask
            if selection.squeezed:
                if ids is not None and ids.dim() == 1:
                    ids = ids.unsqueeze(0)
                if ids is None and cands.dim() == 2:
                    cands = cands.unsqueeze(0)
                if mask is not None and mask.dim() == 1:
                    mask = mask.unsqueeze(0)
            idx, R = idx_new, R_new
        slot = idx >= 0
        n_slot = slot.sum().clamp_min(1)
        # ---- advantages
        if isinstance(self.baseline, float):
            base = torch.full_like(R, self.baseline)
        elif self.baseline == "batch_mean":
            base = torch.full_like(R, float((R * slot).sum() / n_slot))
        else:  # running_mean
            rb = self._running_baseline
            mean_now = float((R * slot).sum() / n_slot)
            base = torch.full_like(R, mean_now if rb is None else rb)
            mom = self.baseline_momentum
            self._running_baseline = mean_now if rb is None else mom * rb + (1 - mom) * mean_now
        adv = torch.where(slot, R - base, torch.zeros_like(R))
        if self.normalize_advantages and int(slot.sum()) > 1:
            mu = (adv * slot).sum() / n_slot
            var = (((adv - mu) * slot) ** 2).sum() / n_slot
            adv = torch.where(slot, adv / (var.sqrt() + 1e-6), adv)
        # ---- gradient (closed form, memkern.ops.reinforce_grad) written into .grad
        out = ops.reinforce_grad(q, self.Wq.detach(), self.Wm.detach(), cands, idx, adv, ids=ids, mask=mask,
                                 tau=self.tau, baseline=0.0, logp=self.logp, backend=self.backend)
        loss = float(out.loss)
        gnorm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(out.dWq),
                                                            torch.linalg.vector_norm(out.dWm)])))
        stepped = math.isfinite(gnorm) and math.isfinite(loss)
        if stepped:
            scale = 1.0
            if self.clip_grad_norm is not None and gnorm > self.clip_grad_norm:
                scale = self.clip_grad_norm / (gnorm + 1e-12)
            gq = out.dWq.to(self.Wq.dtype)
            gm = out.dWm.to(self.Wm.dtype)
            if scale != 1.0:
                gq.mul_(scale)
                gm.mul_(scale)
            self.Wq.grad = gq
            self.Wm.grad = gm
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            if self.weight_decay > 0:
                with torch.no_grad():
                    for grp in self.optimizer.param_groups:
                        f = min(1.0, max(0.0, 1.0 - grp.get("lr", self.lr) * self.weight_decay))
                        for p in grp["params"]:
                            p.mul_(f)
            if self.max_norm is not None:
                # max-norm constraint: project (Wq, Wm) back onto the ball of radius max_norm. Adam-like
                # optimizers take ~lr-sized steps whatever the gradient scale; this bounds where they go.
                n = self.adapter_norm()
                if math.isfinite(n) and n > self.max_norm:
                    with torch.no_grad():
                        self.Wq.mul_(self.max_norm / n)
                        self.Wm.mul_(self.max_norm / n)
        else:
            log.warning("memkern.Reranker.update: non-finite loss/gradient (loss=%s, grad_norm=%s); step skipped",
                        loss, gnorm)
        self.steps += 1
        if self.replay_capacity > 0:
            for row in new_rows:
                self._replay.append(row)
        n_pos = int(((R_new > 0) & sel_valid_new).sum())
        rolled = self._guard_step(n_pos, n_valid_new)
        return {"loss": loss, "reward_rate": reward_rate, "grad_norm": gnorm, "adapter_norm": self.adapter_norm(),
                "n_rows": int(idx.shape[0]), "n_replay": len(replay_rows), "baseline": float(base.mean()),
                "rolled_back": float(rolled), "step": self.steps}

    # ------------------------------------------------------------------ collapse guard
    def _snapshot(self) -> dict:
        return {"Wq": self.Wq.detach().clone(), "Wm": self.Wm.detach().clone(),
                "optimizer": copy.deepcopy(self.optimizer.state_dict())}

    def _restore(self, snap: dict) -> None:
        with torch.no_grad():
            self.Wq.copy_(snap["Wq"])
            self.Wm.copy_(snap["Wm"])
        self.optimizer.load_state_dict(copy.deepcopy(snap["optimizer"]))

    def _rollback(self, why: str) -> None:
        if self._good_state is None:
            self._good_state = {"Wq": torch.zeros_like(self.Wq.detach()), "Wm": torch.zeros_like(self.Wm.detach()),
                                "optimizer": None}
        snap = self._good_state
        with torch.no_grad():
            self.Wq.copy_(snap["Wq"])
            self.Wm.copy_(snap["Wm"])
        if snap["optimizer"] is not None:
            self.optimizer.load_state_dict(copy.deepcopy(snap["optimizer"]))
        else:
            self.optimizer.state.clear()
        self._rollbacks += 1
        self._consecutive_rollbacks += 1
        self._window = []
        log.warning("memkern.Reranker: collapse guard rolled back to the last good state after step %d (%s); "
                    "%d rollbacks so far", self.steps, why, self._rollbacks)

    def _guard_step(self, n_pos: int, n_slots: int) -> bool:
        if not self.guard:
            return False
        norm = self.adapter_norm()
        if not math.isfinite(norm) or norm > self.guard_max_norm:
            self._rollback(f"adapter norm {norm:.4g} > guard_max_norm {self.guard_max_norm}")
            return True
        if self._good_state is None:
            self._good_state = self._snapshot()  # the zero adapters (or the loaded state)
        self._window.append((n_pos, n_slots))
        if len(self._window) < self.guard_window:
            return False
        pos = sum(p for p, _ in self._window)
        slots = sum(n for _, n in self._window)
        self._window = []
        if slots == 0:
            return False
        mean_rate = pos / slots
        # reference = the best value so far of an exponential mean (weight 0.3) of the good windows'
        # rates: smoothing keeps the max from chasing single lucky windows (false rollbacks)
        best = self._best_rate
        if best is None or mean_rate >= best * (1.0 - self.guard_tol):
            ema = mean_rate if self._rate_ema is None else 0.7 * self._rate_ema + 0.3 * mean_rate
            self._rate_ema = ema
            self._best_rate = ema if best is None else max(best, ema)
            self._good_state = self._snapshot()
            self._consecutive_rollbacks = 0
            return False
        # a relative fall of more than guard_drop that is also > 4 standard errors of a window mean
        se = math.sqrt(max(best * (1.0 - best), 1e-12) / slots)
        if mean_rate < best * (1.0 - self.guard_drop) and best - mean_rate > 4.0 * se:
            if self._consecutive_rollbacks >= self.guard_patience:
                log.warning("memkern.Reranker: reward rate stays at %.3f after %d rollbacks; accepting it as the "
                            "new reference", mean_rate, self._consecutive_rollbacks)
                self._best_rate = self._rate_ema = mean_rate
                self._good_state = self._snapshot()
                self._consecutive_rollbacks = 0
                return False
            self._rollback(f"window reward rate {mean_rate:.3f} fell below best {best:.3f} * (1 - {self.guard_drop})")
            return True
        return False

    @property
    def rollbacks(self) -> int:
        """Number of collapse-guard rollbacks so far."""
        return self._rollbacks

    @property
    def replay_len(self) -> int:
        """Rows currently in the replay buffer (``<= replay_capacity``)."""
        return len(self._replay) if self.replay_capacity > 0 else 0

    # ------------------------------------------------------------------ persistence
    def _config(self) -> dict:
        return dict(dim=self.dim, top_m=self.top_m, tau=self.tau, lr=self.lr, baseline=self.baseline,
                    logp=self.logp, optimizer=self.optimizer_name, backend=self.backend, seed=self.seed,
                    normalize_advantages=self.normalize_advantages, clip_grad_norm=self.clip_grad_norm,
                    weight_decay=self.weight_decay, replay_capacity=self.replay_capacity,
                    replay_size=self.replay_size, baseline_momentum=self.baseline_momentum, guard=self.guard,
                    guard_window=self.guard_window, guard_tol=self.guard_tol, guard_drop=self.guard_drop,
                    guard_max_norm=self.guard_max_norm, guard_patience=self.guard_patience,
                    max_norm=self.max_norm)

    def get_extra_state(self) -> dict:
        rows = list(self._replay) if self.replay_capacity > 0 else []
        replay = None
        if rows:
            q, C, valid, idx, R = self._stack_rows(rows, torch.device("cpu"))
            replay = {"q": q, "C": C, "valid": valid, "idx": idx, "R": R,
                      "K": torch.tensor([r[1].shape[0] for r in rows]), "M": torch.tensor([r[3].shape[0] for r in rows])}
        return {"format_version": _FORMAT_VERSION, "config": self._config(), "steps": self.steps,
                "offset": self._offset, "running_baseline": self._running_baseline, "replay": replay,
                "replay_draws": self._replay_draws, "window": list(self._window), "best_rate": self._best_rate,
                "rate_ema": self._rate_ema,
                "good_state": self._good_state, "rollbacks": self._rollbacks,
                "consecutive_rollbacks": self._consecutive_rollbacks,
                "optimizer": self.optimizer.state_dict()}

    def set_extra_state(self, state: dict) -> None:
        if not isinstance(state, dict) or state.get("format_version") != _FORMAT_VERSION:
            raise bad_arg("state_dict['_extra_state']", f"a memkern Reranker state of format {_FORMAT_VERSION}",
                          state.get("format_version") if isinstance(state, dict) else type(state).__name__)
        cfg = state["config"]
        if cfg["dim"] != self.dim:
            raise bad_arg("state_dict", f"a reranker of dim {self.dim}", cfg["dim"])
        self.steps = int(state["steps"])
        self._offset = int(state["offset"])
        self._running_baseline = state["running_baseline"]
        self._replay = collections.deque(maxlen=max(self.replay_capacity, 1))
        rp = state["replay"]
        if rp is not None and self.replay_capacity > 0:
            for i in range(rp["q"].shape[0]):
                k, m = int(rp["K"][i]), int(rp["M"][i])
                self._replay.append((rp["q"][i], rp["C"][i, :k], rp["valid"][i, :k], rp["idx"][i, :m], rp["R"][i, :m]))
        self._replay_draws = int(state["replay_draws"])
        self._window = list(state["window"])
        self._best_rate = state["best_rate"]
        self._rate_ema = state["rate_ema"]
        self._good_state = state["good_state"]
        self._rollbacks = int(state["rollbacks"])
        self._consecutive_rollbacks = int(state["consecutive_rollbacks"])
        try:
            self.optimizer.load_state_dict(state["optimizer"])
        except (ValueError, KeyError) as exc:
            log.warning("memkern.Reranker: optimizer state not restored (%s); starting it fresh", exc)

    def save(self, path: str | os.PathLike) -> None:
        """Write ``state_dict()`` to ``path`` atomically (temp file + rename)."""
        path = os.fspath(path)
        d = os.path.dirname(os.path.abspath(path))
        os.makedirs(d, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".reranker.", dir=d)
        os.close(fd)
        try:
            torch.save(self.state_dict(), tmp)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    @classmethod
    def load(cls, path: str | os.PathLike, map_location=None, **overrides) -> "Reranker":
        """Build a reranker from a file written by :meth:`save` (settings come from the file;
        ``overrides``, e.g. ``optimizer=`` for a custom optimizer, win)."""
        sd = torch.load(os.fspath(path), map_location=map_location or "cpu", weights_only=True)
        return cls.from_state_dict(sd, **overrides)

    @classmethod
    def from_state_dict(cls, sd: dict, **overrides) -> "Reranker":
        """Build a reranker from a ``state_dict()`` (settings are stored in it)."""
        extra = sd.get("_extra_state")
        if not isinstance(extra, dict) or "config" not in extra:
            raise bad_arg("state_dict", "a memkern Reranker state_dict (with '_extra_state')", sorted(sd)[:5])
        cfg = dict(extra["config"])
        opt = cfg.get("optimizer")
        if opt not in ("sgd", "adam", "adamw"):
            opt = getattr(torch.optim, str(opt), None)
            if opt is None:
                raise bad_arg("optimizer", "pass optimizer= to rebuild this custom optimizer", cfg.get("optimizer"))
        cfg["optimizer"] = opt
        cfg.update(overrides)
        dim = cfg.pop("dim")
        r = cls(dim, **cfg)
        r.load_state_dict(sd)
        return r
