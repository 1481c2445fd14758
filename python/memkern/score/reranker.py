"""Learnable reranker of retrieved memories (RMM's retrospective reflection), as a torch module.

Math (see :mod:`memkern.ops` for the full derivation)::

    q' = q + Wq q,   r = q' + Wm^T q',   s_i = m_i . r     (== q' . (m_i + Wm m_i))

``Wq`` and ``Wm`` start at zero, so a fresh reranker scores ``s_i = m_i . q``: the retriever's own
order (exactly, with ``greedy=True``). :meth:`Reranker.select` draws ``top_m`` of the ``K``
candidates by Gumbel-top-M at temperature ``tau`` (Plackett-Luce without replacement);
:meth:`Reranker.update` applies one REINFORCE step from per-slot rewards (``+1`` cited, ``-1`` not
cited, or any floats; a bool tensor means cited/not cited).

Learning lives in :class:`memkern.ReinforceTrainer` (``memkern.score.trainer``): the reranker keeps the
parameters and scoring (``forward(q, candidates) -> scores`` is differentiable, so any loss can
train it), ``rr.trainer`` runs the online REINFORCE loop and ``update`` delegates to it. The step is
sync-free in steady state (tensor ops only; the collapse guard reads the device once every
``guard_every`` updates) and the returned statistics are read lazily.

Learning settings (trainer configurations)
------------------------------------------
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
* ``guard``: collapse guard, checked every ``guard_every`` updates (default 10): the adapters must be
  finite with norm ``<= guard_max_norm``; at the first check after ``guard_window`` updates the reward rate of the window (fraction
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
an :class:`memkern.score.trainer.UpdateStats` mapping with ``loss``, ``reward_rate``, ``grad_norm``,
``adapter_norm``, ``n_rows``, ``n_replay``, ``baseline``, ``rolled_back`` and ``step`` (values are
device tensors until read; reading one synchronises).

Any loss can train the module instead (``forward`` is differentiable)::

    loss = torch.nn.functional.cross_entropy(rr(q, cands), gold_position)    # supervised warm start
    loss.backward(); opt.step()

Capture mode (``Reranker(dim, capture=True)`` or ``set_capture()``): the draw counter, the replay
ring's write position and the replay-draw counter are read on the device, so that on CUDA
``select``/``update`` run as CUDA-graph replays for fixed shapes (:mod:`memkern.graphs`); results
equal the eager mode's.

Persistence: ``state_dict()`` holds ``Wq``, ``Wm`` and an extra state (settings, counters,
optimizer state, running baseline, replay ring, guard state; format 2, format-1 files still load);
``save(path)`` / ``Reranker.load(path)`` write/read it atomically, so each namespace can keep its
own file.
"""
from __future__ import annotations

import logging
import math
import os
from typing import Any

from ..errors import require

require("reranker", "torch", feature="memkern.Reranker")  # names the extra when a package is missing
import torch
from torch import nn

from ..base.atomic import atomic_write
from ..errors import MemkernError, MemkernValueError, StoreCorruptedError, bad_arg
from ..base.validate import check_choice, check_float, check_int, is_int
from ..base.telemetry import traced
from .ops.backend import resolve_backend
from .ops import native
from .ops.checks import LOGP_MODES, check_m, check_offset, prepare_inputs, seed_int
from .ops.functional import gumbel_topm, rerank_scores
from .presets import PRESETS, TRAINER_KEYS
from .selection import Selection, _as_prior, _as_rewards, _forward_key, _residual
from .state_checks import check_buffer_item, check_state_dict, load_bytes
from .stats import UpdateStats  # noqa: F401  (re-exported: the type update() returns)
from .trainer import ReinforceTrainer

__all__ = ["Reranker", "Selection", "PRESETS", "read_state_bytes", "read_buffer_bytes"]

log = logging.getLogger("memkern")

_FORMAT_VERSION = 2           # 2: replay ring + aggregated guard window; files of format 1 still load
_READABLE_FORMATS = (1, 2)
# trainer attributes readable on the reranker (rr.lr, rr.rollbacks, ...)
_TRAINER_ATTRS = frozenset(TRAINER_KEYS) | {"optimizer_name", "steps", "rollbacks", "replay_len", "_good_state"}


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
    backend : ``"auto" | "triton" | "torch" | "native"``: ``"auto"`` runs ``select``/``update`` on CPU
        float32 batches of up to 64 rows through the fused C++ path (:mod:`memkern.score.ops.native`),
        other inputs on :func:`memkern.ops.resolve_backend`'s choice; ``"native"`` asks for the fused
        path (other inputs fall back to the torch path), ``"torch"`` and ``"triton"`` never take it
    seed : base Philox seed of the draws when ``select`` gets no seed; each such draw advances an
        internal counter by ``B*K`` so successive draws differ and the sequence is reproducible
    normalize_advantages, clip_grad_norm, weight_decay, replay_capacity, replay_size,
    baseline_momentum, guard, guard_window, guard_tol, guard_drop, guard_max_norm,
    guard_patience, guard_every, max_norm : stable-learning settings (module docstring), passed to
        the :class:`memkern.ReinforceTrainer` at ``self.trainer``. ``replay_size=None`` replays as
        many rows as the new batch has.
    dtype, device : of the adapters
    """

    def __init__(self, dim: int, top_m: int = 5, tau: float = 0.5, lr: float = PRESETS["stable"]["lr"],
                 baseline: float | str = "batch_mean", logp: str = "softmax", optimizer=None,
                 backend: str = "auto", *, seed: int = 0, normalize_advantages: bool = True,
                 clip_grad_norm: float | None = 1.0, weight_decay: float = PRESETS["stable"]["weight_decay"],
                 replay_capacity: int = 256, replay_size: int | None = None, baseline_momentum: float = 0.99,
                 guard: bool = True, guard_window: int = 50, guard_tol: float = 0.05, guard_drop: float = 0.25,
                 guard_max_norm: float = 50.0, guard_patience: int = 3, max_norm: float | None = 20.0,
                 guard_every: int = 10, capture: bool = False, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None):
        super().__init__()
        dim = check_int("dim", dim, 1, expected="a positive int")
        top_m = check_int("top_m", top_m, 1, expected="a positive int")
        check_float("tau", tau, 0, low_open=True, expected="a positive float")
        check_choice("logp", logp, LOGP_MODES, expected="'softmax' or 'plackett_luce'")
        check_choice("backend", backend, ("auto", "triton", "torch", "native"))
        seed_int(seed)
        self.dim = dim
        self.top_m = top_m
        self.tau = float(tau)
        self.logp = logp
        self.backend = backend
        self.seed = seed
        self.Wq = nn.Parameter(torch.zeros(dim, dim, dtype=dtype, device=device))
        self.Wm = nn.Parameter(torch.zeros(dim, dim, dtype=dtype, device=device))
        self._offset = 0
        self.trainer = ReinforceTrainer(
            self, lr=lr, optimizer=optimizer, baseline=baseline, normalize_advantages=normalize_advantages,
            clip_grad_norm=clip_grad_norm, weight_decay=weight_decay, replay_capacity=replay_capacity,
            replay_size=replay_size, baseline_momentum=baseline_momentum, guard=guard, guard_window=guard_window,
            guard_tol=guard_tol, guard_drop=guard_drop, guard_max_norm=guard_max_norm,
            guard_patience=guard_patience, guard_every=guard_every, max_norm=max_norm)
        self._offset_t: torch.Tensor | None = None    # the draw counter on the device (capture mode)
        self._graphs = None
        self.capture = False
        if capture:
            self.set_capture(True)

    def set_capture(self, on: bool = True) -> "Reranker":
        """Switch the capturable mode on or off (also ``Reranker(..., capture=True)``).

        In this mode every scalar that changes from step to step is read on the device: the Philox
        counter of ``select``'s draws (a 0-dim int64 tensor the sampling kernel reads), the replay
        ring's write position and the replay-draw counter. No host value of the state enters the
        computation, so for fixed shapes ``select`` and ``update`` can be captured in CUDA graphs: on
        CUDA tensors they are (memkern.graphs), and replayed while the shapes, dtypes and devices
        stay the same (other calls run eagerly; the reason is logged once). On other devices the same
        capturable path runs eagerly. Draws, replay picks and adapters equal those of the eager mode.
        Call it after moving the module to its device (the graphs are set up for the adapters'
        device at this call).
        """
        self.capture = bool(on)
        self.trainer._capturable = self.capture
        self._offset_t = None
        self.trainer._sync_counters()
        self._graphs = None
        if self.capture and self.Wq.is_cuda:
            from .graphs import GraphRunner

            self._graphs = GraphRunner(self)
        return self

    def _offset_tensor(self) -> torch.Tensor:
        t = self._offset_t
        if t is None or t.device != self.Wq.device:
            t = self._offset_t = torch.tensor(self._offset, dtype=torch.int64, device=self.Wq.device)
        return t

    def __getattr__(self, name):
        # learning settings and counters live on the trainer; read them through the module too
        if name in _TRAINER_ATTRS:
            trainer = self.__dict__.get("trainer")
            if trainer is not None:
                return getattr(trainer, name)
        return super().__getattr__(name)

    @property
    def _ops_backend(self) -> str:
        """The backend of the functional ops (``"native"`` is the reranker's own fused path)."""
        return "auto" if self.backend == "native" else self.backend

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The trainer's optimizer."""
        return self.trainer.optimizer

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
        t = self.trainer
        return (f"dim={self.dim}, top_m={self.top_m}, tau={self.tau}, lr={t.lr}, baseline={t.baseline!r}, "
                f"logp={self.logp!r}, optimizer={t.optimizer_name!r}, guard={t.guard}, "
                f"replay_capacity={t.replay_capacity}")

    # ------------------------------------------------------------------ selection
    def _split(self, candidates):
        if isinstance(candidates, (tuple, list)):
            if len(candidates) != 2:
                raise bad_arg("candidates", "a tensor [B, K, d] or a pair (ids [B, K], table [N, d])",
                              f"a sequence of length {len(candidates)}")
            ids, table = candidates
            return table, ids
        return candidates, None

    def forward(self, q, candidates, mask=None) -> torch.Tensor:
        """Differentiable scores ``[B, K]`` (``[K]`` for a 1-D ``q``; ``-inf`` = padding).

        ``candidates`` as in :meth:`select` (dense ``[B, K, d]`` or ``(ids, table)``). Gradients flow
        to ``Wq``, ``Wm``, ``q`` and the candidates through :class:`memkern.ops.RerankScores`, so the
        module trains with any loss and optimizer (e.g. a supervised warm start).
        """
        cands, ids = self._split(candidates)
        return rerank_scores(q, self.Wq, self.Wm, cands, ids=ids, mask=mask, backend=self._ops_backend)

    def scores(self, q, candidates, mask=None) -> torch.Tensor:
        """Reranker scores ``[B, K]`` (float32, ``-inf`` = padding) without drawing."""
        cands, ids = self._split(candidates)
        with torch.no_grad():
            return rerank_scores(q, self.Wq.detach(), self.Wm.detach(), cands, ids=ids, mask=mask,
                                     backend=self._ops_backend)

    @torch.no_grad()
    @traced("memkern.reranker.select", args=("q", "m", "greedy"))
    def select(self, q, candidates, mask=None, seed=None, greedy: bool = False, m: int | None = None,
               offset: int | None = None, prior=None) -> Selection:
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
        prior : optional float ``[B, K]`` (``[K]`` for a 1-D ``q``): a first-stage score per candidate
            (e.g. the store's fused retrieval score). The score drawn from is then
            ``prior + (q' . m' - q . m)``: the adapters learn a residual over the first stage, exactly
            ``prior`` for a fresh (zero) reranker, so its greedy order is the first stage's order
            whatever the candidates' embeddings. ``q . m`` does not depend on ``Wq`` / ``Wm``, so the
            REINFORCE gradient of :meth:`update` is that of the adapters' scores (it reads the
            selection's ``indices``, not these scores). Padding slots ignore it. A host-side prior
            (numpy, list, CPU tensor) must be finite on the valid slots; a device tensor is not checked
            (no host sync).

        Returns
        -------
        :class:`Selection`
        """
        cands, ids = self._split(candidates)
        m = self.top_m if m is None else m
        if prior is not None:
            return self._select(q, cands, ids, mask, seed, greedy, m, offset, prior)
        if self._graphs is not None:
            out = self._graphs.select(q, cands, ids, mask, seed, greedy, m, offset)
            if out is not None:
                return out
        return self._select(q, cands, ids, mask, seed, greedy, m, offset)

    def _draw_counter(self, n: int, seed, greedy: bool, offset) -> tuple[int, Any]:
        """``(seed, Philox counter base)`` of a draw of ``n`` uniforms: an explicit seed starts at 0
        (or ``offset``); otherwise the reranker's seed at its counter, which an unseeded non-greedy
        draw at the default offset advances by ``n``."""
        if seed is not None:
            return seed_int(seed), 0 if offset is None else offset
        off = self._offset if offset is None else offset
        if not greedy and offset is None:
            self.__dict__["_offset"] = self._offset + n     # a plain int: no Module.__setattr__
        return self.seed, off

    def _select(self, q, cands, ids, mask, seed, greedy, m, offset, prior=None) -> Selection:
        if self.backend in ("auto", "native"):
            out = self._select_native(q, cands, ids, mask, seed, greedy, m, offset, prior)
            if out is not None:
                return out
        inter = rerank_scores(q, self.Wq, self.Wm, cands, ids=ids, mask=mask, backend=self._ops_backend,
                                  return_intermediates=True)
        scores = inter.scores                       # [B, K] (also for a 1-D query)
        B, K = scores.shape
        if m > K:
            raise bad_arg("m", f"m <= K = {K} (number of candidates); top_m is {self.top_m}", m)
        prior_t = None
        if prior is not None:
            prior_t = _as_prior(prior, B, K, q.dim() == 1, scores.device)
            scores = prior_t + _residual(q, inter.r, cands, ids, scores)
        off_t = None
        if seed is None and offset is None and not greedy and self.capture:
            off_t = self._offset_tensor()           # read (and advanced) on the device; the host value kept equal
        seed_i, off = self._draw_counter(B * K, seed, greedy, offset)
        be = resolve_backend(self._ops_backend, scores.device)
        sel = gumbel_topm(scores, m, self.tau, seed=seed_i, offset=off if off_t is None else off_t,
                              logp=self.logp, greedy=greedy, backend=be)
        if off_t is not None:
            off_t.add_(B * K)
        squeezed = q.dim() == 1
        idx, lp = sel.indices, sel.logp
        if squeezed:
            idx, lp = idx[0], lp[0]
        qd = q.detach() if q.requires_grad else q
        out = Selection(idx, scores[0] if squeezed else scores, lp, qd, cands, ids, mask, seed_i, off, greedy,
                        squeezed, None if prior_t is None else (prior_t[0] if squeezed else prior_t))
        # the forward intermediates, reused by update() while nothing they depend on has changed (checked
        # by the tensors' in-place version counters); not a dataclass field, so copies/concatenations of
        # the selection (e.g. RMM's reward buffer) never carry a stale one
        key = _forward_key(self.Wq, self.Wm, qd, cands, ids, mask)
        if key is not None:
            out.__dict__["_forward"] = (key, inter.qp, inter.scores)
        return out

    def _select_native(self, q, cands, ids, mask, seed, greedy, m, offset, prior) -> Selection | None:
        """:meth:`_select` as one fused C++ call (:mod:`memkern.score.ops.native`); None when the
        inputs do not fit it (the caller then runs the torch path)."""
        params = self._parameters          # (attribute reads of parameters go through Module.__getattr__)
        Wq, Wm = params["Wq"], params["Wm"]
        q2, squeezed, dense, ids2, table, mask2 = prepare_inputs(q, Wq, Wm, cands, ids, mask, False, combine=False)
        B = q2.shape[0]
        K = dense.shape[1] if dense is not None else ids2.shape[1]
        why = native.misfit(q2, Wq, Wm, cands, ids2, mask2)
        if why is None:
            if self.capture:
                why = "capture mode"
            elif B > native.MAX_B:
                why = f"B > {native.MAX_B}"
            elif q.requires_grad or cands.requires_grad:
                why = "inputs that require grad"
        if not native.use_native(self.backend, "select", why):
            return None
        if is_int(m) and m > K:
            raise bad_arg("m", f"m <= K = {K} (number of candidates); top_m is {self.top_m}", m)
        check_m(m, K)
        prior_t = None if prior is None else _as_prior(prior, B, K, squeezed, q2.device).contiguous()
        if offset is not None:
            check_offset(offset, q2.device)
        seed_i, off = self._draw_counter(B * K, seed, greedy, offset)
        if isinstance(off, torch.Tensor):                 # a device counter: the torch path reads it
            return None
        arr, keep = native.arr, self.__dict__.setdefault("_native_views", {})
        a_q, a_dense, a_table, a_ids, a_mask = arr(q2), arr(dense), arr(table), arr(ids2), arr(mask2)
        *res, w_sq = native.module().rerank_select(
            a_q, native.view(keep, "Wq", Wq), native.view(keep, "Wm", Wm), a_dense, a_table, a_ids, a_mask,
            arr(prior_t), K, m, self.tau, seed_i, off, greedy, self.logp == "plackett_luce")
        idx, lp, s, qp, drawn = (None if x is None else torch.from_numpy(x) for x in res)
        scores = s if drawn is None else drawn
        if squeezed:
            idx, lp, scores = idx[0], lp[0], scores[0]
        qd = q.detach() if q.requires_grad else q
        out = Selection(idx, scores, lp, qd, cands, ids, mask, seed_i, off, greedy, squeezed,
                        None if prior_t is None else (prior_t[0] if squeezed else prior_t))
        key = _forward_key(Wq, Wm, qd, cands, ids, mask)
        if key is not None:
            # with the checked inputs and their numpy views, which update() reuses under the same key
            out.__dict__["_forward"] = (key, qp, s, w_sq,
                                        (q2, dense, ids2, table, mask2, a_q, a_dense, a_table, a_ids, a_mask))
        return out

    # ------------------------------------------------------------------ update
    _as_rewards = staticmethod(_as_rewards)

    def adapter_norm(self) -> float:
        """``sqrt(||Wq||_F^2 + ||Wm||_F^2)`` (a host read)."""
        return float(self.trainer._norm())

    @traced("memkern.reranker.update")
    def update(self, selection: Selection, rewards) -> UpdateStats:
        """One REINFORCE step from the rewards of ``selection``'s slots (``self.trainer.step``).

        Parameters
        ----------
        selection : a :class:`Selection` from :meth:`select`
        rewards : ``[B, M]`` (``[M]`` for a 1-D query) floats (+1 cited, -1 not cited) or bools
            (cited), as a tensor on any device, a numpy array or a list. Slots with index ``-1`` are
            ignored.

        Returns
        -------
        :class:`memkern.score.trainer.UpdateStats`, a mapping with ``loss``, ``reward_rate`` (fraction of
        the new valid slots with reward > 0), ``grad_norm`` (before clipping), ``adapter_norm``
        (after the step), ``n_rows`` (new + replayed), ``n_replay``, ``baseline`` (mean baseline
        used), ``rolled_back`` (0/1), ``step``; values are read (and synchronised) lazily.
        """
        if self._graphs is not None:
            out = self._graphs.update(selection, rewards)
            if out is not None:
                return out
        return self.trainer.step(selection, rewards)

    # ------------------------------------------------------------------ persistence
    def config(self) -> dict:
        """The settings this reranker runs with: its own (``dim``, ``top_m``, ``tau``, ``logp``,
        ``backend``, ``seed``) and its trainer's (:meth:`memkern.score.trainer.ReinforceTrainer.config`)."""
        return dict(dim=self.dim, top_m=self.top_m, tau=self.tau, logp=self.logp, backend=self.backend,
                    seed=self.seed, **self.trainer.config())

    def get_extra_state(self) -> dict:
        return {"format_version": _FORMAT_VERSION, "config": self.config(), "offset": self._offset,
                **self.trainer.state()}

    def set_extra_state(self, state: dict) -> None:
        if not isinstance(state, dict) or state.get("format_version") not in _READABLE_FORMATS:
            raise bad_arg("state_dict['_extra_state']", f"a memkern Reranker state of format {_READABLE_FORMATS}",
                          state.get("format_version") if isinstance(state, dict) else type(state).__name__)
        cfg = state["config"]
        if cfg["dim"] != self.dim:
            raise bad_arg("state_dict", f"a reranker of dim {self.dim}", cfg["dim"])
        self._offset = int(state["offset"])
        self._offset_t = None
        self.trainer.load_state(state)

    def save(self, path: str | os.PathLike) -> None:
        """Write ``state_dict()`` to ``path`` atomically and durably
        (:func:`memkern.base.atomic.atomic_write`: temporary file, fsync, rename, folder fsync; mode
        0600): a crash leaves the previous state or the new one, never a torn file."""
        path = os.fspath(path)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        sd = self.state_dict()
        atomic_write(path, lambda f: torch.save(sd, f))

    @classmethod
    def load_checked(cls, path: str | os.PathLike, dim: int) -> "Reranker":
        """:meth:`load` of a file that must hold a valid reranker of ``dim`` (:func:`read_state_bytes`:
        every key, shape, dtype and value checked).

        Raises
        ------
        StoreCorruptedError
            The file is not such a reranker (unreadable, another dim, damaged values); the
            message names the file. ``OSError`` when it cannot be read at all.
        """
        with open(os.fspath(path), "rb") as f:
            data = f.read()
        try:
            return read_state_bytes(data, dim, "reranker")
        except MemkernValueError as e:
            raise StoreCorruptedError(f"reranker file {os.fspath(path)}: {e}") from None

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


# ----------------------------------------------------------------------------------- checked reading
def read_state_bytes(data: bytes, dim: int | None, name: str = "reranker") -> "Reranker":
    """The :class:`Reranker` saved in ``data`` (the bytes of :meth:`Reranker.save`), checked fully
    before it is used: loaded with ``weights_only=True`` (no code runs), exactly the keys ``Wq``,
    ``Wm``, ``_extra_state``, floating ``[dim, dim]`` weights, every tensor finite, a replay ring
    within bounds, rebuilt into a ``Reranker`` (its own argument checks), and finite scores on a
    probe.

    Parameters
    ----------
    data : bytes
    dim : int or None
        The embedding dimension the reranker must have (``None``: any).
    name : str
        Named in errors.

    Raises
    ------
    MemkernValueError
        Naming ``name`` and what is wrong.
    """
    what = "a memkern Reranker state (Reranker.save)"
    sd = load_bytes(data, name, what)
    d = check_state_dict(sd, dim, name, what)
    try:
        r = Reranker.from_state_dict(sd)
        q = torch.ones(1, d) / math.sqrt(d)
        C = torch.eye(min(d, 4), d)[None]
        ok = bool(torch.isfinite(r.scores(q, C)).all())
    except MemkernError as e:
        raise bad_arg(name, what, str(e)) from None
    except Exception as e:  # noqa: BLE001 - a state that passes the checks above but does not load
        raise bad_arg(name, what, f"a state that does not load ({type(e).__name__}: {' '.join(str(e).split())[:120]})") from None
    if not ok:
        raise bad_arg(name, "weights with finite scores", "NaN or inf scores")
    return r


def read_buffer_bytes(data: bytes, dim: int, name: str = "reranker buffer") -> list:
    """The pending reward buffer saved in ``data`` (``[(Selection fields, rewards float32 [M])]``)
    as ``[(Selection, numpy rewards)]``, checked: loaded with ``weights_only=True``, every item a
    Selection of ``dim``-d queries with finite values and rewards in [-1, 1] of its shape, the same
    trailing shapes in every item (they are concatenated), and each item accepted by
    :meth:`Reranker.update` of a fresh reranker.

    Raises
    ------
    MemkernValueError
        Naming ``name`` and what is wrong.
    """
    import numpy as np

    what = "a memkern reward buffer (a list of (selection, rewards))"
    items = load_bytes(data, name, what)
    if not isinstance(items, list):
        raise bad_arg(name, what, type(items).__name__)
    out, shapes = [], None
    for i, item in enumerate(items):
        where = f"{name}[{i}]"
        sel, r, sig = check_buffer_item(item, dim, where)
        if shapes is None:
            shapes = sig
        elif sig != shapes:
            raise bad_arg(where, "the shapes of the buffer's first item", sig)
        try:
            Reranker(dim, replay_capacity=0, guard=False).update(sel, r)
        except Exception as e:  # noqa: BLE001
            raise bad_arg(where, "a selection Reranker.update accepts", f"{type(e).__name__}: {str(e)[:120]}") from None
        out.append((sel, np.asarray(r, np.float32)))
    return out
