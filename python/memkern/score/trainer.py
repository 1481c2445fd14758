"""Online REINFORCE trainer of a :class:`memkern.Reranker` (learning kept apart from the module).

:class:`ReinforceTrainer` owns everything that is learning state: the optimizer, the baseline,
advantage normalisation, gradient-norm clipping, decoupled weight decay, the max-norm projection,
the replay buffer and the collapse guard, and their persistence. The reranker keeps the
parameters (``Wq``, ``Wm``) and scoring/selection. ``Reranker.update`` calls :meth:`step`. The replay
ring, the collapse guard and the saving of the learning state are the mixins
:class:`~memkern.score.replay.ReplayRingMixin`, :class:`~memkern.score.guard.CollapseGuardMixin` and
:class:`~memkern.score.trainer_state.TrainerStateMixin`.

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

from ..errors import require

require("reranker", "torch", feature="memkern.ReinforceTrainer")  # names the extra when a package is missing
import torch

from ..errors import MemkernTypeError, bad_arg
from ..base.validate import check_float, check_int
from .guard import CollapseGuardMixin
from .ops import native, torch_path
from .ops.backend import forward_pass, resolve_backend, triton_kernels
from .ops.checks import prepare_inputs
from .presets import TRAINER_PRESETS
from .replay import ReplayRingMixin
from .selection import Selection, _as_rewards, _forward_key, dense_rows, prior_offset
from .stats import UpdateStats, _LazyNorm
from .trainer_state import TrainerStateMixin


__all__ = ["ReinforceTrainer", "UpdateStats", "TRAINER_PRESETS"]

#: The replay ring's tensors, in the order the fused step takes them.
_RING_KEYS = ("q", "C", "valid", "idx", "R", "P")


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

class ReinforceTrainer(ReplayRingMixin, CollapseGuardMixin, TrainerStateMixin):
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
    def _apply_grads(self, grads, gnorm, finite, one):
        """The optimizer step from the gradient buffers ``grads`` (clipped to ``clip_grad_norm`` by their
        joint norm ``gnorm``), then the decay and max-norm projection; returns the adapters' norm after
        it (a 0-dim tensor) or None when neither applies. ``finite``: False skips the step's move."""
        params = self._params
        coef = None
        if self.clip_grad_norm is not None:
            coef = (self.clip_grad_norm / (gnorm + 1e-12)).clamp_max(1.0)
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
        return adapter_norm

    def _window_buffer(self, dev):
        """The guard window sums as one float32 [3] tensor whose views are ``self._win`` (rebuilt as
        such when they are separate tensors, e.g. after loading a state)."""
        win = self._win
        if win is None:
            self._win = list(torch.zeros(3, device=dev).unbind())
            return self._win[0]._base
        ok = self.__dict__.get("_win_ok")
        if ok is not None and ok[0] is win:          # checked below when this list was last seen
            return ok[1]
        base = win[0]._base
        if (base is None or base.shape != (3,) or base.dtype != torch.float32 or not base.is_contiguous()
                or any(w._base is not base or w.storage_offset() != i for i, w in enumerate(win))):
            base = torch.stack([w.float() for w in win])
            self._win = list(base.unbind())
        self.__dict__["_win_ok"] = (self._win, base)
        return base

    def _native_step(self, selection, idx_new, R_new, one) -> UpdateStats | None:
        """:meth:`step` as one fused C++ call (:mod:`memkern.score.ops.native`: replay rows, forward of
        the rows select() did not score, advantages, the closed-form gradient, plain SGD with clipping,
        decay and projection, the ring write, the guard's window sums); other optimizers take the
        native gradient and run :meth:`_apply_grads`. None when the inputs do not fit (the torch path
        runs instead)."""
        rr = self.reranker
        Wq, Wm = rr._parameters["Wq"], rr._parameters["Wm"]
        cands, ids, mask = selection.candidates, selection.ids, selection.mask
        # select() scored these rows at these adapters (same tensors, unchanged since): its forward
        # and its checked inputs are reused
        cached = selection.__dict__.get("_forward")
        fresh = cached is not None and cached[0] == _forward_key(Wq, Wm, selection.q, cands, ids, mask)
        nin = cached[4] if fresh and len(cached) > 4 else None       # select()'s native call filled it
        prior = selection.prior
        if prior is not None and prior.dim() == 1:
            prior = prior.unsqueeze(0)
        if nin is not None:
            q2, dense, ids2, table, mask2 = nin[:5]
            views = nin[5:]
            why = native.misfit(idx_new, R_new, prior)
        else:
            q = selection.q if selection.q.dim() == 2 else selection.q.unsqueeze(0)
            q2, _, dense, ids2, table, mask2 = prepare_inputs(q, Wq, Wm, cands, ids, mask, False, combine=False)
            views = None
            why = native.misfit(q2, Wq, Wm, cands, ids2, mask2, idx_new, R_new, prior)
        B_new, M = idx_new.shape
        K = dense.shape[1] if dense is not None else ids2.shape[1]
        if why is None:
            ring = self._ring
            if self._capturable:
                why = "capture mode"
            elif self.reducer is not None:
                why = "data-parallel training"
            elif B_new > native.MAX_B:
                why = f"B > {native.MAX_B}"
            elif q2.requires_grad or cands.requires_grad:
                why = "inputs that require grad"
            elif idx_new.dtype != torch.int64 or tuple(idx_new.shape) != (q2.shape[0], M) or M > K:
                why = "a selection of another shape"
            elif self.replay_capacity > 0 and (B_new > self.replay_capacity or (ring is not None and (
                    ring["C"].shape[1] != K or ring["idx"].shape[1] != M or ring["q"].device != q2.device))):
                why = "a replay ring of other K / M"
        if not native.use_native(rr.backend, "update", why):
            return None
        arr, keep = native.arr, self.__dict__.setdefault("_native_views", {})
        d = q2.shape[1]
        ring_np = None
        size = 0
        if self.replay_capacity > 0:
            self._fit_ring(d, K, M, q2.device)
            size = min(B_new if self.replay_size is None else self.replay_size, self._rlen)
            self._prior_seen = self._prior_seen or prior is not None
            use_P = self._prior_seen
            r = self._ring
            key = tuple(id(r[k]) for k in _RING_KEYS)
            cached_ring = keep.get("ring")
            if cached_ring is not None and cached_ring[0] == key:
                ring_np = cached_ring[1]
            else:                                     # views of the ring's (long-lived) tensors
                ring_np = tuple(native.arr(r[k]) for k in _RING_KEYS)
                keep["ring"] = (key, ring_np)
        else:
            use_P = prior is not None
        qp_c = s_c = None
        w_sq = -1.0
        if fresh:
            if native.misfit(cached[1], cached[2]) is None:
                qp_c, s_c = cached[1], cached[2]     # select() scored these rows at these adapters
                w_sq = cached[3] if len(cached) > 3 else -1.0
        running, first, mode, bval = None, False, 0, 0.0
        if isinstance(self.baseline, float):
            bval = self.baseline
        elif self.baseline == "batch_mean":
            mode = 1
        else:
            mode, first = 2, self._rb is None
            self._rb = torch.zeros(()) if first else self._rb.clone()    # updated by the call
            running = arr(self._rb)
        apply = self._plain_sgd()
        lr_now = float(self.optimizer.param_groups[0]["lr"]) if apply else 0.0
        grads = self._grad_buffers(Wq)
        win = native.view(keep, "win", self._window_buffer(q2.device)) if self.guard else None
        gnorm, adapter_norm, base, n_pos, n_valid, finite, _, loss = native.module().rerank_step(
            native.view(keep, "Wq", Wq), native.view(keep, "Wm", Wm),
            *(views or (arr(q2), arr(dense), arr(table), arr(ids2), arr(mask2))), arr(idx_new), arr(R_new),
            arr(prior), arr(qp_c), arr(s_c), w_sq, None, size, self._rlen,
            rr.seed, self._replay_draws, ring_np, use_P, ring_np is not None, self._rpos, mode, bval, running, first,
            self.baseline_momentum, self.normalize_advantages, float(rr.tau), rr.logp == "plackett_luce",
            native.view(keep, "g0", grads[0]), native.view(keep, "g1", grads[1]), apply,
            0.0 if self.clip_grad_norm is None else self.clip_grad_norm, lr_now,
            min(1.0, max(0.0, 1.0 - lr_now * self.weight_decay)), 0.0 if self.max_norm is None else self.max_norm,
            self.max_norm is not None or self.weight_decay > 0, win)
        if ring_np is not None:
            cap = self.replay_capacity
            if size > 0:
                self._replay_draws += 1
            self._rpos = (self._rpos + B_new) % cap
            self._rlen = min(cap, self._rlen + B_new)
        if apply:
            torch.autograd.graph.increment_version([Wq, Wm])    # changed in place: select()'s caches go stale
            if not (self.max_norm is not None or self.weight_decay > 0):
                adapter_norm = _LazyNorm(self)
        else:
            adapter_norm = self._apply_grads(grads, torch.tensor(gnorm), torch.tensor(finite), one)
            if adapter_norm is None:
                adapter_norm = _LazyNorm(self)
        return UpdateStats(loss=loss, n_pos=n_pos, n_valid=n_valid, idx=idx_new, R=R_new, grad_norm=gnorm,
                           adapter_norm=adapter_norm, n_rows=B_new + size, n_replay=size,
                           baseline=bval if mode == 0 else base, rolled_back=0.0, step=None)

    # ------------------------------------------------------------------ the step
    @torch.no_grad()
    def step(self, selection, rewards, _defer_host: bool = False) -> UpdateStats:
        """One REINFORCE update from the rewards of ``selection``'s slots (see ``Reranker.update``).

        ``_defer_host=True`` (internal, CUDA-graph capture) stops before :meth:`_finish`."""
        rr = self.reranker
        if not isinstance(selection, Selection):
            raise bad_arg("selection", "a memkern.Selection from Reranker.select", type(selection).__name__,
                          MemkernTypeError)
        dev = rr._parameters["Wq"].device
        idx_new = selection.indices if selection.indices.dim() == 2 else selection.indices.unsqueeze(0)
        R_new = _as_rewards(rewards, idx_new)
        B_new = idx_new.shape[0]
        if self.guard and self._good_state is None:
            self._good_state = self._snapshot()       # the initial adapters (zero, or the loaded state)
        zero, one = self._consts(dev)
        if rr.backend in ("auto", "native") and not _defer_host:
            stats = self._native_step(selection, idx_new, R_new, one)
            if stats is not None:
                return self._finish(stats)

        n_replay = 0
        reuse = None
        if self.replay_capacity > 0:
            q, C, valid = dense_rows(selection)
            K, M = C.shape[1], idx_new.shape[1]
            self._fit_ring(q.shape[1], K, M, q.device)
            Kr, Mr = self._ring["C"].shape[1], self._ring["idx"].shape[1]
            q = q.float()
            P_new = prior_offset(selection, q, C, valid)
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
            P = None if selection.prior is None else prior_offset(selection, *dense_rows(selection))

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
        be = resolve_backend(rr._ops_backend, q2.device)
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
        adapter_norm = self._apply_grads(grads, gnorm, finite, one)
        if self.replay_capacity > 0:
            self._write_ring(q, C, valid, idx_p, R_p, P_p)
        n_pos_new = n_valid_new = None
        if self.guard:
            slot_new = idx_new >= 0
            n_valid_new = slot_new.sum()
            n_pos_new = (slot_new & (R_new > 0)).sum()
            if self._win is None:
                self._win = list(torch.zeros(3, device=dev).unbind())   # positives, slots, bad steps
            self._win[0].add_(n_pos_new)
            self._win[1].add_(n_valid_new)
            self._win[2].add_(~finite)
        if adapter_norm is None:       # not computed by the step: read from the adapters when asked for
            adapter_norm = _LazyNorm(self)
        stats = UpdateStats(loss=loss, n_pos=n_pos_new, n_valid=n_valid_new, idx=idx_new, R=R_new, grad_norm=gnorm,
                            adapter_norm=adapter_norm, n_rows=int(idx.shape[0]), n_replay=n_replay,
                            baseline=base_stat, rolled_back=0.0, step=None)
        return stats if _defer_host else self._finish(stats)
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
                norm = stats.tensors.get("adapter_norm")
                if self._check(norm if type(norm) is float else None):
                    stats.tensors["rolled_back"] = 1.0
                    stats.tensors["adapter_norm"] = _LazyNorm(self)
        return stats
