"""The collapse guard of :class:`memkern.ReinforceTrainer`: every ``guard_every`` updates one host
read of the adapters' norm (on the fused CPU path, the norm its step returned) and the window's
reward counts; a blown-up norm or a significant fall of the reward rate rolls the adapters and
optimizer back to the last good state (the rules are in the :mod:`memkern.score.reranker` module
docstring)."""
from __future__ import annotations

import copy
import logging
import math

from ..errors import require

require("reranker", "torch", feature="memkern.ReinforceTrainer")  # names the extra when a package is missing
import torch

__all__ = ["CollapseGuardMixin"]

log = logging.getLogger("memkern")


class CollapseGuardMixin:
    """The collapse guard's methods of :class:`memkern.ReinforceTrainer`.

    They read the trainer's settings (``guard_*``) and its guard state, set by its constructor:
    ``_win`` (0-dim device sums of positives, slots and non-finite steps since the last check),
    ``_win_steps``, ``_best_rate``, ``_rate_ema``, ``_good_state``, ``_rollbacks``,
    ``_consecutive_rollbacks``.
    """

    @property
    def rollbacks(self) -> int:
        """Number of collapse-guard rollbacks so far."""
        return self._rollbacks

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

    def _check(self, norm: float | None = None) -> bool:
        """The guard's periodic check: one device-to-host read of (norm, window sums). True = rolled back.

        ``norm``: the adapters' norm as the step that just ended computed it (the fused CPU step
        returns it as a float), instead of reading the adapters again."""
        # the one host read of the step: norm, window sums (ONE transfer, every guard_every updates)
        if norm is None:
            norm, pos, slots, bad = torch.stack([self._norm().float(), *self._win]).tolist()
        else:
            pos, slots, bad = torch.stack(self._win).tolist()
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

