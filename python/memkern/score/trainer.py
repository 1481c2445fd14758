"""Online REINFORCE trainer of a :class:`memkern.Reranker` (learning kept apart from the module).

:class:`ReinforceTrainer` owns everything that is learning state: the optimizer, the baseline,
advantage normalisation, gradient-norm clipping, decoupled weight decay, the max-norm projection,
the replay buffer and the collapse guard, and their persistence. The reranker keeps the
parameters (``Wq``, ``Wm``) and scoring/selection. ``Reranker.update`` calls :meth:`step`.

The step is sync-free in steady state: every quantity above is a tensor op on the adapters'
device, no ``.item()``/``.tolist()``/Python branch reads a tensor value, and the number of
dispatched ops does not depend on the batch size. The one exception is the collapse guard, which
reads four scalars in one transfer every ``guard_every`` steps. Statistics are returned as an
:class:`UpdateStats` mapping of device tensors that converts to floats only when read.

Per step (``B`` new rows, ``R`` rewards ``[B, M]``, ``slot`` = selected slots with index ``>= 0``)::

    rows    = new rows  (+ replay_size rows drawn without replacement from the replay ring)
    base    = baseline (fixed) | mean_slot(R) (batch_mean) | running mean (running_mean)
    A       = (R - base) on slots, 0 elsewhere
    A       = A / (sqrt(sum_slot (A - mean_slot A)^2 / n) + 1e-6)   if normalize_advantages and n > 1
                                                                    (population variance, divisor n)
    g       = closed-form REINFORCE gradient of (Wq, Wm)  (memkern.ops.reinforce_grad, baseline 0)
              of the policy the rows were drawn from: for a selection drawn with a prior
              (Reranker.select(prior=)) its scores are prior + (q'.m' - q.m), so the constant
              prior - q.m enters the probabilities; replayed rows keep theirs in the ring
    |g|     = sqrt(|dWq|^2 + |dWm|^2);  g <- g * min(1, clip / |g|);  g <- 0 if loss or |g| non-finite
    optimizer.step()
    W       <- W * f,   f = (1 - lr * weight_decay) * min(1, max_norm / ((1 - lr wd) |W|))
              (decoupled decay toward the retriever's order, then projection onto |W| <= max_norm;
               f = 1 on a skipped step)

Presets (``TRAINER_PRESETS``): ``"paper"`` = SGD lr 1e-3, fixed baseline 0.5, nothing else;
``"stable"`` (the default) = SGD lr 5e-2, batch-mean baseline, normalised advantages, clip 1.0,
decay 1e-2, max-norm 20, a 256-row replay ring, the collapse guard.
"""
from __future__ import annotations

import copy
import logging
import math
from typing import Any

from ..errors import require

require("reranker", "torch", feature="memkern.ReinforceTrainer")  # names the extra when a package is missing
import torch

from .ops import torch_path
from .ops.backend import forward_pass, resolve_backend, triton_kernels
from .ops.checks import prepare_inputs
from ..errors import MemkernTypeError, bad_arg
from ..base.validate import check_float, check_int
from .selection import Selection, _as_rewards, _forward_key
from .stats import UpdateStats, _LazyNorm


__all__ = ["ReinforceTrainer", "UpdateStats", "TRAINER_PRESETS"]

log = logging.getLogger("memkern")

# the trainer half of memkern.score.reranker.PRESETS (tau and logp belong to the module)
TRAINER_PRESETS: dict[str, dict[str, Any]] = {
    "paper": dict(lr=1e-3, optimizer="sgd", baseline=0.5, normalize_advantages=False, clip_grad_norm=None,
                  weight_decay=0.0, replay_capacity=0, replay_size=0, guard=False, max_norm=None),
    "stable": dict(lr=5e-2, optimizer="sgd", baseline="batch_mean", normalize_advantages=True,
                   clip_grad_norm=1.0, weight_decay=1e-2, replay_capacity=256, replay_size=None, guard=True,
                   max_norm=20.0),
    "rmm": dict(lr=0.2, optimizer="sgd", baseline="batch_mean", normalize_advantages=True, clip_grad_norm=1.0,
                weight_decay=1e-2, replay_capacity=0, replay_size=0, guard=True, max_norm=1.0),
}

TRAINER_KEYS = ("lr", "optimizer", "baseline", "normalize_advantages", "clip_grad_norm", "weight_decay",
                "replay_capacity", "replay_size", "baseline_momentum", "guard", "guard_window", "guard_tol",
                "guard_drop", "guard_max_norm", "guard_patience", "guard_every", "max_norm")


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


class ReinforceTrainer:
    """Online REINFORCE loop for a :class:`memkern.Reranker` (see the module docstring for the math).

    Parameters
    ----------
    reranker : the :class:`memkern.Reranker` whose ``Wq``/``Wm`` are trained (its ``tau``, ``logp``,
        ``backend`` and ``seed`` are used)
    lr : learning rate of the default optimizer (and of the weight decay)
    optimizer : None/"sgd", "adam", "adamw", an optimizer class (called with ``(params, lr=lr)``) or a
        callable ``params -> Optimizer``
    baseline : float (fixed), ``"batch_mean"`` or ``"running_mean"`` (momentum ``baseline_momentum``)
    normalize_advantages : divide advantages by their population standard deviation over the slots
    clip_grad_norm : None or the bound of the joint gradient norm of ``(Wq, Wm)``
    weight_decay : decoupled decay ``W <- W (1 - lr weight_decay)`` toward zero after each step
    max_norm : None or the radius of the ball ``||(Wq, Wm)||_F <= max_norm`` the adapters are projected on
    replay_capacity, replay_size : size of the replay ring (0 = off) and rows replayed per update
        (None = as many as the new batch)
    guard, guard_window, guard_tol, guard_drop, guard_max_norm, guard_patience : the collapse guard
        (``memkern.score.reranker`` module docstring); ``guard_every``: its check period in updates (the only
        host synchronisation of a steady-state step; windows are evaluated at the first check after
        ``guard_window`` updates)
    """

    def __init__(self, reranker, *, lr: float = 5e-2, optimizer=None, baseline: float | str = "batch_mean",
                 normalize_advantages: bool = True, clip_grad_norm: float | None = 1.0, weight_decay: float = 1e-2,
                 replay_capacity: int = 256, replay_size: int | None = None, baseline_momentum: float = 0.99,
                 guard: bool = True, guard_window: int = 50, guard_tol: float = 0.05, guard_drop: float = 0.25,
                 guard_max_norm: float = 50.0, guard_patience: int = 3, guard_every: int = 10,
                 max_norm: float | None = 20.0):
        check_float("lr", lr, 0, low_open=True, expected="a positive float")
        if not (isinstance(baseline, (int, float)) and not isinstance(baseline, bool)) and baseline not in (
                "batch_mean", "running_mean"):
            raise bad_arg("baseline", "a float, 'batch_mean' or 'running_mean'", baseline)
        check_float("clip_grad_norm", clip_grad_norm, 0, low_open=True, expected="None or a positive float", none_ok=True)
        check_float("weight_decay", weight_decay, 0, expected="a float >= 0")
        check_int("replay_capacity", replay_capacity, 0)
        check_int("replay_size", replay_size, 0, expected="None or an int >= 0", none_ok=True)
        check_float("max_norm", max_norm, 0, low_open=True, expected="None or a positive float", none_ok=True)
        check_float("baseline_momentum", baseline_momentum, 0, 1, high_open=True, expected="a float in [0, 1)")
        check_int("guard_every", guard_every, 1, expected="a positive int")
        check_int("guard_window", guard_window, 1, expected="a positive int")
        self.reranker = reranker
        self.lr = float(lr)
        self.baseline = baseline if isinstance(baseline, str) else float(baseline)
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
        self.guard_every = int(guard_every)
        self.max_norm = None if max_norm is None else float(max_norm)
        self.optimizer, self.optimizer_name = _resolve_optimizer(optimizer, [reranker.Wq, reranker.Wm], self.lr)
        self.steps = 0
        self._prior_seen = False                       # a selection with a prior was trained on
        # device state (allocated lazily on the adapters' device)
        self._rb: torch.Tensor | None = None          # running baseline (0-dim); None before the first update
        self._ring: dict[str, torch.Tensor] | None = None   # replay ring: q [C,d], C [C,K,d], valid [C,K], idx, R [C,M]
        self._rlen = 0                                 # rows in the ring
        self._rpos = 0                                 # next write position
        self._replay_draws = 0
        # capturable mode (Reranker(capture=True)): the step reads its changing scalars (ring write
        # position, replay-draw counter) from these device tensors, never from the host ints above
        # (which it still advances, as mirrors: both depend only on the batch sizes)
        self._capturable = False
        self._rpos_t: torch.Tensor | None = None
        self._draws_t: torch.Tensor | None = None
        self._win: list[torch.Tensor] | None = None    # 0-dim (pos, slots, non-finite steps) since the last check
        self._win_steps = 0
        self._since_check = 0
        # host guard state
        self._best_rate: float | None = None
        self._rate_ema: float | None = None
        self._good_state: dict | None = None
        self._rollbacks = 0
        self._consecutive_rollbacks = 0
        # data-parallel training (memkern.distributed.train): None, or a callable that sums a list
        # of tensors over every worker (an all-reduce) and returns the sums; the batch statistics
        # (baseline, advantage normalisation) and the gradient then cover all workers' rows
        self.reducer = None

    @classmethod
    def from_preset(cls, name: str, reranker, **overrides) -> "ReinforceTrainer":
        """``"paper"`` or ``"stable"`` (``TRAINER_PRESETS``); ``overrides`` win."""
        if name not in TRAINER_PRESETS:
            raise bad_arg("name", f"one of {sorted(TRAINER_PRESETS)}", name)
        kw = dict(TRAINER_PRESETS[name])
        kw.update(overrides)
        return cls(reranker, **kw)

    def config(self) -> dict:
        """The constructor arguments (optimizer by name)."""
        return dict(lr=self.lr, optimizer=self.optimizer_name, baseline=self.baseline,
                    normalize_advantages=self.normalize_advantages, clip_grad_norm=self.clip_grad_norm,
                    weight_decay=self.weight_decay, replay_capacity=self.replay_capacity,
                    replay_size=self.replay_size, baseline_momentum=self.baseline_momentum, guard=self.guard,
                    guard_window=self.guard_window, guard_tol=self.guard_tol, guard_drop=self.guard_drop,
                    guard_max_norm=self.guard_max_norm, guard_patience=self.guard_patience,
                    guard_every=self.guard_every, max_norm=self.max_norm)

    # ------------------------------------------------------------------ helpers
    @property
    def _params(self):
        return [self.reranker.Wq, self.reranker.Wm]

    def _norm(self) -> torch.Tensor:
        """``sqrt(|Wq|^2 + |Wm|^2)`` as a 0-dim tensor (no sync)."""
        with torch.no_grad():
            return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(self._params)))

    def _consts(self, device):
        """Cached 0-dim ``(0., 1.)`` on ``device`` (torch.where with them is one op, no scalar wrap)."""
        c = self.__dict__.get("_const")
        if c is None or c[0].device != device:
            c = self._const = (torch.zeros((), device=device), torch.ones((), device=device))
        return c

    def _grad_buffers(self, W):
        buf = self.__dict__.get("_gbuf")
        if buf is None or buf[0].device != W.device or buf[0].shape != W.shape:
            buf = self._gbuf = [torch.empty(W.shape, dtype=torch.float32, device=W.device) for _ in range(2)]
        return buf

    def _plain_sgd(self) -> bool:
        """The optimizer is torch.optim.SGD without momentum/decay/maximize: its step is ``p -= lr g``,
        done here as one foreach op (the optimizer's own step adds profiler and per-param ops)."""
        opt = self.optimizer
        if type(opt) is not torch.optim.SGD or len(opt.param_groups) != 1:
            return False
        g = opt.param_groups[0]
        return (g.get("momentum", 0) == 0 and g.get("weight_decay", 0) == 0 and not g.get("maximize", False)
                and not g.get("nesterov", False) and isinstance(g.get("lr"), float) and len(g["params"]) == 2)

    @property
    def rollbacks(self) -> int:
        """Number of collapse-guard rollbacks so far."""
        return self._rollbacks

    @property
    def replay_len(self) -> int:
        """Rows currently in the replay ring (``<= replay_capacity``)."""
        return self._rlen if self.replay_capacity > 0 else 0

    def replay_rows(self) -> dict[str, torch.Tensor]:
        """The replay ring in FIFO order (oldest first): ``q [n, d]``, ``C [n, K, d]``, ``valid [n, K]``,
        ``idx [n, M]``, ``R [n, M]`` (rows shorter than the ring's ``K``/``M`` are padded invalid / -1)."""
        if self._ring is None or self._rlen == 0:
            return {}
        cap = self._ring["q"].shape[0]
        order = (torch.arange(self._rlen, device=self._ring["q"].device) + (self._rpos - self._rlen)) % cap
        return {k: v.index_select(0, order) for k, v in self._ring.items()}

    # ------------------------------------------------------------------ replay ring
    def _alloc_ring(self, d, K, M, device):
        cap = self.replay_capacity
        return {"q": torch.zeros(cap, d, device=device), "C": torch.zeros(cap, K, d, device=device),
                "valid": torch.zeros(cap, K, dtype=torch.bool, device=device),
                "idx": torch.full((cap, M), -1, dtype=torch.int64, device=device),
                "R": torch.zeros(cap, M, device=device), "P": torch.zeros(cap, K, device=device)}

    def _fit_ring(self, d, K, M, device):
        """Allocate the ring, or grow its K/M (copying the rows) when a batch has more candidates/slots."""
        if self._ring is None:
            self._ring = self._alloc_ring(d, K, M, device)
            return
        r = self._ring
        K0, M0 = r["C"].shape[1], r["idx"].shape[1]
        if r["q"].device != device:
            r = {k: v.to(device) for k, v in r.items()}
        if K > K0 or M > M0:
            new = self._alloc_ring(d, max(K, K0), max(M, M0), device)
            new["q"].copy_(r["q"])
            new["C"][:, :K0].copy_(r["C"])
            new["valid"][:, :K0].copy_(r["valid"])
            new["P"][:, :K0].copy_(r["P"])
            new["idx"][:, :M0].copy_(r["idx"])
            new["R"][:, :M0].copy_(r["R"])
            r = new
        self._ring = r

    @staticmethod
    def _pad(t, n, dim, value):
        if t.shape[dim] == n:
            return t
        pad = [0, 0] * (t.dim() - 1 - dim) + [0, n - t.shape[dim]]
        return torch.nn.functional.pad(t, pad, value=value)

    def _sync_counters(self) -> None:
        """(Re)build the device counters of the capturable mode from the host values (or drop them)."""
        if not self._capturable:
            self._rpos_t = self._draws_t = None
            return
        dev = self.reranker.Wq.device
        self._rpos_t = torch.tensor(self._rpos, dtype=torch.int64, device=dev)
        self._draws_t = torch.tensor(self._replay_draws, dtype=torch.int64, device=dev)

    def _counter(self, name: str, device):
        """The host int (eager) or the device tensor (capturable) of ``_rpos``/``_replay_draws``."""
        if not self._capturable:
            return getattr(self, name)
        t = self._rpos_t if name == "_rpos" else self._draws_t
        if t is None or t.device != device:
            self._sync_counters()
            t = self._rpos_t if name == "_rpos" else self._draws_t
        return t

    def _write_ring(self, q, C, valid, idx, R, P=None):
        cap = self.replay_capacity
        n = q.shape[0]
        rpos = self._counter("_rpos", q.device)
        if n > cap:                                   # only the newest cap rows survive (FIFO)
            q, C, valid, idx, R = q[-cap:], C[-cap:], valid[-cap:], idx[-cap:], R[-cap:]
            P = None if P is None else P[-cap:]
            if isinstance(rpos, torch.Tensor):
                rpos.add_(n - cap).remainder_(cap)
            else:
                rpos = (rpos + n - cap) % cap
            self._rpos = (self._rpos + n - cap) % cap
            n = cap
        pos = torch.arange(n, device=q.device).add_(rpos).remainder_(cap)
        for key, t in (("q", q), ("C", C), ("valid", valid), ("idx", idx), ("R", R), ("P", P)):
            if t is not None:                         # P None: no row had a prior yet, the ring's stay 0
                self._ring[key].index_copy_(0, pos, t)
        if isinstance(rpos, torch.Tensor):
            rpos.add_(n).remainder_(cap)
        self._rpos = (self._rpos + n) % cap
        self._rlen = min(cap, self._rlen + n)

    def _draw(self, size, device):
        """``size`` distinct ring rows, uniformly: the rows of the ``size`` largest keys
        ``splitmix64(seed' + (draws * capacity + row) * golden)`` over the filled rows
        (:func:`_replay_keys`). The draw counter is a host int, or a device tensor in the capturable
        mode (the same values, so the same rows); the fill count is a shape, known on the host (it
        depends only on the batch sizes)."""
        cap = self.replay_capacity
        draws = self._counter("_replay_draws", device)
        keys = _replay_keys(self.reranker.seed, draws, cap, device)
        if self._rlen < cap:
            keys = keys[:self._rlen]
        if isinstance(draws, torch.Tensor):
            draws.add_(1)
        self._replay_draws += 1
        return torch.topk(keys, size).indices

    # ------------------------------------------------------------------ the step
    @torch.no_grad()
    def step(self, selection, rewards, _defer_host: bool = False) -> UpdateStats:
        """One REINFORCE update from the rewards of ``selection``'s slots (see ``Reranker.update``).

        ``_defer_host=True`` (internal, CUDA-graph capture) stops before :meth:`_finish`."""
        rr = self.reranker
        if not isinstance(selection, Selection):
            raise bad_arg("selection", "a memkern.Selection from Reranker.select", type(selection).__name__,
                          MemkernTypeError)
        dev = rr.Wq.device
        idx_new = selection.indices if selection.indices.dim() == 2 else selection.indices.unsqueeze(0)
        R_new = _as_rewards(rewards, idx_new)
        B_new = idx_new.shape[0]
        if self.guard and self._good_state is None:
            self._good_state = self._snapshot()       # the initial adapters (zero, or the loaded state)
        zero, one = self._consts(dev)

        n_replay = 0
        reuse = None
        if self.replay_capacity > 0:
            q, C, valid = _dense_rows(selection)
            K, M = C.shape[1], idx_new.shape[1]
            self._fit_ring(q.shape[1], K, M, q.device)
            Kr, Mr = self._ring["C"].shape[1], self._ring["idx"].shape[1]
            q = q.float()
            P_new = _prior_offset(selection, q, C, valid)
            C = self._pad(C.float(), Kr, 1, 0.0)
            valid = self._pad(valid, Kr, 1, False)
            idx_p = self._pad(idx_new, Mr, 1, -1)
            R_p = self._pad(R_new, Mr, 1, 0.0)
            # rows keep their prior offsets in the ring once any row had a prior (before that the ring's
            # offsets are all 0 and the step skips them)
            self._prior_seen = self._prior_seen or P_new is not None
            P_p = None
            if self._prior_seen:
                P_p = self._pad(torch.zeros(valid.shape, device=q.device) if P_new is None else P_new, Kr, 1, 0.0)
            size = min(B_new if self.replay_size is None else self.replay_size, self._rlen)
            if size > 0:
                pick = self._draw(size, q.device)
                ring = self._ring
                q_r, C_r, valid_r = (ring[k].index_select(0, pick) for k in ("q", "C", "valid"))
                idx = torch.cat([idx_p, ring["idx"].index_select(0, pick)])
                R = torch.cat([R_p, ring["R"].index_select(0, pick)])
                P = None if P_p is None else torch.cat([P_p, ring["P"].index_select(0, pick)])
                n_replay = size
                cached = selection.__dict__.get("_forward")
                if (cached is not None and K == Kr
                        and cached[0] == _forward_key(rr.Wq, rr.Wm, selection.q, selection.candidates,
                                                      selection.ids, selection.mask)):
                    # select() scored the new rows at these adapters: only the replayed rows need a forward
                    reuse = (q, C, cached[1], cached[2])
                    q_all, C_all, valid_all = q_r, C_r, valid_r
                else:
                    q_all, C_all, valid_all = (torch.cat(p) for p in ((q, q_r), (C, C_r), (valid, valid_r)))
            else:
                q_all, C_all, valid_all, idx, R, P = q, C, valid, idx_p, R_p, P_p
            cands, ids, mask = C_all, None, valid_all
        else:
            q_all = selection.q if selection.q.dim() == 2 else selection.q.unsqueeze(0)
            cands, ids, mask = selection.candidates, selection.ids, selection.mask
            if selection.squeezed:
                if ids is not None and ids.dim() == 1:
                    ids = ids.unsqueeze(0)
                if ids is None and cands.dim() == 2:
                    cands = cands.unsqueeze(0)
                if mask is not None and mask.dim() == 1:
                    mask = mask.unsqueeze(0)
            idx, R = idx_new, R_new
            P = None if selection.prior is None else _prior_offset(selection, *_dense_rows(selection))

        # ---- advantages (tensor ops; no branch on values). Rewards of -1 slots are ignored, even NaN.
        red = self.reducer
        slot = idx >= 0
        n_slot = slot.sum()
        Rm = torch.where(slot, R, zero)
        r_sum = Rm.sum()
        if red is not None:   # data-parallel: statistics over every worker's rows
            n_slot, r_sum = red([n_slot.to(Rm.dtype), r_sum])
        n_slot1 = n_slot.clamp_min(1)
        if isinstance(self.baseline, float):
            base = base_stat = self.baseline
        else:
            mean_now = r_sum / n_slot1
            if self.baseline == "batch_mean":
                base = mean_now
            else:   # running_mean: the first batch uses its own mean
                base = mean_now if self._rb is None else self._rb
                mom = self.baseline_momentum
                if self._rb is None:
                    self._rb = mean_now.clone()
                elif self._capturable:   # updated in place: a captured graph keeps reading this storage
                    base = self._rb.clone()
                    self._rb.copy_(self._rb * mom + mean_now * (1.0 - mom))
                else:
                    self._rb = self._rb * mom + mean_now * (1.0 - mom)
            base_stat = base
        adv = torch.where(slot, Rm - base, zero)
        if self.normalize_advantages:
            # population variance (divisor n) of the slots' advantages; no scaling when n <= 1
            a_sum = adv.sum()
            if red is not None:
                (a_sum,) = red([a_sum])
            mu = a_sum / n_slot1
            sq = torch.where(slot, adv - mu, zero).square().sum()
            if red is not None:
                (sq,) = red([sq])
            var = sq / n_slot1
            adv = adv * torch.where(n_slot > 1, (var.sqrt() + 1e-6).reciprocal(), one)
        # ---- closed-form gradient (memkern.ops.reinforce_grad's core; adv is already masked)
        Wq, Wm = rr.Wq, rr.Wm
        q2, _, dense, ids2, table, valid2 = prepare_inputs(q_all, Wq, Wm, cands, ids, mask, False)
        be = resolve_backend(rr.backend, q2.device)
        tau = float(rr.tau)
        cached = selection.__dict__.get("_forward") if self.replay_capacity == 0 else None
        if reuse is not None:
            # new rows from select() (q', scores at these adapters) + a forward of the replayed rows
            qn, Cn, qp_n, s_n = reuse
            qf_r, qp_r, _, Cf_r, s_r = forward_pass(be, q2, Wq, Wm, dense, ids2, table, valid2)
            if P is not None:                                   # the policy's scores: prior offset + adapters'
                s_n, s_r = s_n + P[:B_new], s_r + P[B_new:]
            qf, qp, scores = torch.cat([qn, qf_r]), torch.cat([qp_n, qp_r]), torch.cat([s_n, s_r])
            Bn = qf.shape[0]
            if be == "torch":
                g, loss = torch_path.score_grad(scores, idx, adv, tau, rr.logp, Bn)
                U = torch.cat([torch.bmm(g[:B_new].unsqueeze(1), Cn).squeeze(1),
                               torch.bmm(g[B_new:].unsqueeze(1), Cf_r).squeeze(1)])
            else:
                k = triton_kernels()
                _, l_n, U_n = k.reinforce_u(s_n, idx[:B_new], adv[:B_new], Cn, None, None, tau, rr.logp, Bn)
                _, l_r, U_r = k.reinforce_u(s_r, idx[B_new:], adv[B_new:], dense, None, None, tau, rr.logp, Bn)
                loss, U = l_n + l_r, torch.cat([U_n, U_r])
        else:
            if cached is not None and cached[0] == _forward_key(Wq, Wm, selection.q, selection.candidates,
                                                                selection.ids, selection.mask):
                # select() computed q' and the scores at these very adapters and inputs: reuse them
                qf, qp, scores = q2.float(), cached[1], cached[2]
                Cf = torch_path.gather_candidates(dense, ids2, table) if be == "torch" else None
            else:
                qf, qp, _, Cf, scores = forward_pass(be, q2, Wq, Wm, dense, ids2, table, valid2)
            if P is not None:
                scores = scores + P                                   # the policy's scores (prior offset)
            Bn = q2.shape[0]
            if be == "torch":
                g, loss = torch_path.score_grad(scores, idx, adv, tau, rr.logp, Bn)
                U = torch.bmm(g.unsqueeze(1), Cf).squeeze(1)              # u_b = sum_i g_bi m_bi
            else:
                _, loss, U = triton_kernels().reinforce_u(scores, idx, adv, dense, ids2, table, tau, rr.logp, Bn)
        # dWm = Q'^T U, dWq = V^T Q with V = U + U Wm^T. Non-finite inputs are caught on the small
        # factors ([B, d]): a non-finite loss or factor zeroes them all, so the step moves nothing
        # (and no d x d pass is spent on masking). The products go into persistent buffers.
        V = torch.addmm(U, U, Wm.t().to(U.dtype))
        small = torch.cat([U, V, qp, qf])
        finite = (small.sum() + loss).mul(0.0).eq(0.0)    # False iff something is inf/NaN
        U, V, qp, qf = torch.where(finite, small, zero).split(Bn)
        grads = self._grad_buffers(Wq)
        torch.mm(qp.t(), U, out=grads[1])
        torch.mm(V.t(), qf, out=grads[0])
        if red is not None:
            # data-parallel: each worker's gradient and loss are means over its Bn rows, so the
            # full batch's are sum_w(Bn_w g_w) / sum_w Bn_w; a non-finite step anywhere skips everywhere
            w = torch.tensor(float(Bn), dtype=grads[0].dtype, device=grads[0].device)
            g0, g1, l_sum, bad, total = red([grads[0] * w, grads[1] * w, loss.detach() * w,
                                             (~finite).to(grads[0].dtype), w])
            finite = bad.eq(0)
            grads[0].copy_(torch.where(finite, g0 / total, zero))
            grads[1].copy_(torch.where(finite, g1 / total, zero))
            loss = l_sum / total
        gnorm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
        coef = None
        if self.clip_grad_norm is not None:
            coef = (self.clip_grad_norm / (gnorm + 1e-12)).clamp_max(1.0)
        params = self._params
        if self._plain_sgd() and params[0].dtype == torch.float32 and params[1].dtype == torch.float32:
            lr_now = self.optimizer.param_groups[0]["lr"]
            if coef is None:
                torch._foreach_add_(params, grads, alpha=-lr_now)
            else:                                      # W -= lr * min(1, clip / |g|) * g, one pass
                torch._foreach_addcmul_(params, grads, [coef, coef], value=-lr_now)
        else:
            if coef is not None:
                torch._foreach_mul_(grads, coef)
            for p, gb in zip(params, grads):
                p.grad = gb.to(p.dtype)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            lr_now = self.optimizer.param_groups[0].get("lr", self.lr)
        # ---- decay and max-norm projection: one multiply of both adapters
        f = min(1.0, max(0.0, 1.0 - float(lr_now) * self.weight_decay))
        if self.max_norm is not None or self.weight_decay > 0:
            n = self._norm()
            if self.max_norm is not None:
                # min(1, max_norm / |f W|); a non-finite norm leaves the projection to the guard
                factor = (self.max_norm / (n * f + 1e-30)).clamp_max(1.0).nan_to_num(1.0).mul(f)
            else:
                factor = torch.full_like(n, f)
            factor = torch.where(finite, factor, one)
            torch._foreach_mul_(params, factor)
            adapter_norm = n * factor
        else:
            adapter_norm = None
        if self.replay_capacity > 0:
            self._write_ring(q, C, valid, idx_p, R_p, P_p)
        n_pos_new = n_valid_new = None
        if self.guard:
            slot_new = idx_new >= 0
            n_valid_new = slot_new.sum()
            n_pos_new = (slot_new & (R_new > 0)).sum()
            if self._win is None:
                self._win = [torch.zeros((), device=dev) for _ in range(3)]   # positives, slots, bad steps
            self._win[0].add_(n_pos_new)
            self._win[1].add_(n_valid_new)
            self._win[2].add_(~finite)
        if adapter_norm is None:       # not computed by the step: read from the adapters when asked for
            adapter_norm = _LazyNorm(self)
        stats = UpdateStats(loss=loss, n_pos=n_pos_new, n_valid=n_valid_new, idx=idx_new, R=R_new, grad_norm=gnorm,
                            adapter_norm=adapter_norm, n_rows=int(idx.shape[0]), n_replay=n_replay,
                            baseline=base_stat, rolled_back=0.0, step=None)
        return stats if _defer_host else self._finish(stats)

    def _advance_host(self, n_new: int, n_replay: int) -> None:
        """The host values a step advances (ring position and fill, replay-draw counter), for a step
        whose tensor part ran as a CUDA-graph replay (they depend only on the batch sizes)."""
        cap = self.replay_capacity
        if cap > 0:
            if n_replay > 0:
                self._replay_draws += 1
            self._rpos = (self._rpos + n_new) % cap
            self._rlen = min(cap, self._rlen + n_new)

    def _finish(self, stats: UpdateStats) -> UpdateStats:
        """The host part that ends a step (counters and the collapse guard's periodic check); kept
        apart so that a CUDA-graph replay of the tensor part runs it after each replay."""
        self.steps += 1
        stats.tensors["step"] = self.steps
        if self.guard:
            self._win_steps += 1
            self._since_check += 1
            if self._since_check >= self.guard_every:
                self._since_check = 0
                if self._check():
                    stats.tensors["rolled_back"] = 1.0
                    stats.tensors["adapter_norm"] = _LazyNorm(self)
        return stats

    # ------------------------------------------------------------------ collapse guard
    def _snapshot(self) -> dict:
        return {"Wq": self.reranker.Wq.detach().clone(), "Wm": self.reranker.Wm.detach().clone(),
                "optimizer": copy.deepcopy(self.optimizer.state_dict())}

    def _rollback(self, why: str) -> None:
        rr = self.reranker
        if self._good_state is None:
            self._good_state = {"Wq": torch.zeros_like(rr.Wq.detach()), "Wm": torch.zeros_like(rr.Wm.detach()),
                                "optimizer": None}
        snap = self._good_state
        with torch.no_grad():
            rr.Wq.copy_(snap["Wq"])
            rr.Wm.copy_(snap["Wm"])
        if snap["optimizer"] is not None:
            self.optimizer.load_state_dict(copy.deepcopy(snap["optimizer"]))
        else:
            self.optimizer.state.clear()
        self._rollbacks += 1
        self._consecutive_rollbacks += 1
        self._reset_window()
        log.warning("memkern.Reranker: collapse guard rolled back to the last good state after step %d (%s); "
                    "%d rollbacks so far", self.steps, why, self._rollbacks)

    def _reset_window(self) -> None:
        if self._win is not None:
            torch._foreach_zero_(self._win)
        self._win_steps = 0

    def _check(self) -> bool:
        """The guard's periodic check: one device-to-host read of (norm, window sums). True = rolled back."""
        # the one host read of the step: norm, window sums (ONE transfer, every guard_every updates)
        norm, pos, slots, bad = torch.stack([self._norm().float(), *self._win]).tolist()
        if bad > 0:
            self._win[2].zero_()
            log.warning("memkern.Reranker.update: %d of the last %d steps had a non-finite loss/gradient and "
                        "moved nothing", int(bad), self.guard_every)
        if not math.isfinite(norm) or norm > self.guard_max_norm:
            self._rollback(f"adapter norm {norm:.4g} > guard_max_norm {self.guard_max_norm}")
            return True
        if self._win_steps < self.guard_window:
            return False
        self._reset_window()
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

    # ------------------------------------------------------------------ persistence
    def state(self) -> dict:
        """Learning state for ``Reranker.get_extra_state`` (CPU tensors and Python values)."""
        # the ring as stored (physical order, rows 0..len-1 filled) + its write position, so that a
        # loaded trainer draws the same replay rows as the saved one would have
        rows = ({k: v[:self._rlen] for k, v in self._ring.items()}
                if self.replay_capacity > 0 and self._ring is not None and self._rlen else {})
        replay = None
        if rows:
            n = rows["q"].shape[0]
            replay = {k: v.cpu() for k, v in rows.items()}
            replay["K"] = torch.full((n,), rows["C"].shape[1], dtype=torch.int64)
            replay["M"] = torch.full((n,), rows["idx"].shape[1], dtype=torch.int64)
        win = torch.stack(self._win).tolist() if self._win is not None else [0.0, 0.0, 0.0]
        return {"steps": self.steps, "prior_seen": self._prior_seen, "running_baseline": None if self._rb is None else float(self._rb),
                "replay": replay, "replay_pos": self._rpos, "replay_draws": self._replay_draws,
                "window": [(win[0], win[1])], "window_steps": self._win_steps, "since_check": self._since_check,
                "best_rate": self._best_rate, "rate_ema": self._rate_ema, "good_state": self._good_state,
                "rollbacks": self._rollbacks, "consecutive_rollbacks": self._consecutive_rollbacks,
                "optimizer": self.optimizer.state_dict()}

    def load_state(self, state: dict) -> None:
        """Inverse of :meth:`state`; also reads format-1 files (replay rows of varying K/M, a window list
        of per-step ``(n_pos, n_slots)``)."""
        dev = self.reranker.Wq.device
        self.steps = int(state["steps"])
        self._prior_seen = bool(state.get("prior_seen", False))
        rb = state["running_baseline"]
        self._rb = None if rb is None else torch.tensor(float(rb), device=dev)
        self._ring, self._rlen, self._rpos = None, 0, 0
        self._rpos_t = self._draws_t = None           # rebuilt from the loaded values below
        rp = state["replay"]
        if rp is not None and self.replay_capacity > 0 and rp["q"].shape[0] > 0:
            q, C, valid, idx, R = (rp[k] for k in ("q", "C", "valid", "idx", "R"))
            P = rp["P"] if "P" in rp else torch.zeros(C.shape[:2])     # rows saved before priors: none
            n = q.shape[0]
            Ks, Ms = rp["K"], rp["M"]
            # rows were stored padded to the longest; positions past a row's own K/M are padding
            kmask = torch.arange(C.shape[1])[None, :] < Ks[:, None]
            mmask = torch.arange(idx.shape[1])[None, :] < Ms[:, None]
            valid = valid & kmask
            P = torch.where(valid, P.float(), torch.zeros((), dtype=torch.float32))
            idx = torch.where(mmask, idx, torch.full_like(idx, -1))
            R = torch.where(mmask, R, torch.zeros_like(R))
            self._fit_ring(q.shape[1], C.shape[1], idx.shape[1], dev)
            if "replay_pos" in state and n <= self.replay_capacity:   # format 2: the ring as it was
                for key, t in (("q", q), ("C", C), ("valid", valid), ("idx", idx), ("R", R), ("P", P)):
                    self._ring[key][:n].copy_(t.to(dev))
                self._rlen, self._rpos = n, int(state["replay_pos"]) % self.replay_capacity
            else:                                                     # format 1: rows oldest first
                self._write_ring(q.to(dev).float(), C.to(dev).float(), valid.to(dev), idx.to(dev),
                                 R.to(dev).float(), P.to(dev))
        self._replay_draws = int(state["replay_draws"])
        self._sync_counters()
        window = list(state["window"])
        self._win = [torch.tensor(float(v), device=dev)
                     for v in (sum(w[0] for w in window), sum(w[1] for w in window), 0.0)]
        self._win_steps = int(state.get("window_steps", len(window)))
        self._since_check = int(state.get("since_check", 0))
        self._best_rate = state["best_rate"]
        self._rate_ema = state["rate_ema"]
        gs = state["good_state"]
        if gs is not None:
            gs = dict(gs, Wq=gs["Wq"].to(dev), Wm=gs["Wm"].to(dev))
        self._good_state = gs
        self._rollbacks = int(state["rollbacks"])
        self._consecutive_rollbacks = int(state["consecutive_rollbacks"])
        try:
            self.optimizer.load_state_dict(state["optimizer"])
        except (ValueError, KeyError) as exc:
            log.warning("memkern.Reranker: optimizer state not restored (%s); starting it fresh", exc)


_GOLDEN, _MIX1, _MIX2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_KEYS_NP: dict = {}
_KEYS_T: dict = {}


def _i64(c: int) -> int:
    """An unsigned 64-bit constant as the signed int64 with the same bits."""
    return c - (1 << 64) if c >= (1 << 63) else c


def _replay_keys(seed: int, draws, cap: int, device) -> torch.Tensor:
    """Random int64 keys ``[cap]`` in ``[0, 2**63)`` of one replay draw (its counter ``draws``).

    ``z = seed' + (draws * cap + i) * golden`` (mod 2**64), then the splitmix64 finaliser
    ``z ^= z >> 30; z *= C1; z ^= z >> 27; z *= C2; z ^= z >> 31`` (logical shifts), and the top 63
    bits. With a host int counter on the CPU it runs in numpy (no aten ops, a few microseconds);
    otherwise as int64 torch ops (wrapping multiplies, masked arithmetic shifts), which read a device
    counter without a host read and give the same bits.
    """
    seed_u = (seed * 1_000_003 + 7) % (1 << 64)
    if not isinstance(draws, torch.Tensor) and torch.device(device).type == "cpu":
        import numpy as np

        i = _KEYS_NP.get(cap)
        if i is None:
            i = _KEYS_NP[cap] = np.arange(cap, dtype=np.uint64)
        z = (i + np.uint64(draws * cap)) * np.uint64(_GOLDEN) + np.uint64(seed_u)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(_MIX1)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(_MIX2)
        z = z ^ (z >> np.uint64(31))
        return torch.from_numpy((z >> np.uint64(1)).astype(np.int64))
    key = (cap, torch.device(device))
    ar = _KEYS_T.get(key)
    if ar is None:
        if len(_KEYS_T) > 16:
            _KEYS_T.clear()
        ar = _KEYS_T[key] = torch.arange(cap, dtype=torch.int64, device=device)
    z = (ar + draws * cap) * _i64(_GOLDEN) + _i64(seed_u)
    z = z ^ (torch.bitwise_right_shift(z, 30) & ((1 << 34) - 1))
    z = z * _i64(_MIX1)
    z = z ^ (torch.bitwise_right_shift(z, 27) & ((1 << 37) - 1))
    z = z * _i64(_MIX2)
    z = z ^ (torch.bitwise_right_shift(z, 31) & ((1 << 33) - 1))
    return torch.bitwise_right_shift(z, 1) & ((1 << 63) - 1)


def _prior_offset(sel, q, C, valid):
    """The part of the policy's scores that is not the adapters': ``prior - q . m`` (float32 ``[B, K]``,
    0 on padding), so that ``prior + (q' . m' - q . m)`` (what :meth:`memkern.Reranker.select` drew
    from) is ``that + q' . m'``; None when ``sel`` was drawn without a prior. ``q [B, d]``, ``C [B, K, d]``,
    ``valid [B, K]``: the selection's dense rows (:func:`_dense_rows`)."""
    p = sel.prior
    if p is None:
        return None
    p = p if p.dim() == 2 else p.unsqueeze(0)
    qm = torch.bmm(C.float(), q.float().unsqueeze(2)).squeeze(2)
    return torch.where(valid, p.to(qm.device, torch.float32) - qm, torch.zeros((), device=qm.device))


def _dense_rows(sel):
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
