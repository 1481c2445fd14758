"""Persistence of :class:`memkern.ReinforceTrainer`'s learning state: :meth:`~TrainerStateMixin.state`
for ``Reranker.get_extra_state`` and its inverse :meth:`~TrainerStateMixin.load_state` (format 2,
and format-1 files)."""
from __future__ import annotations

import logging

from ..errors import require

require("reranker", "torch", feature="memkern.ReinforceTrainer")  # names the extra when a package is missing
import torch

__all__ = ["TrainerStateMixin"]

log = logging.getLogger("memkern")


class TrainerStateMixin:
    """Saving and restoring the learning state of :class:`memkern.ReinforceTrainer` (counters,
    running baseline, replay ring, guard state, optimizer state)."""

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
        self._win = list(torch.tensor([float(sum(w[0] for w in window)), float(sum(w[1] for w in window)), 0.0],
                                      dtype=torch.float32, device=dev).unbind())
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

