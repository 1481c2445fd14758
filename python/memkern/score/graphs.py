"""CUDA-graph capture and replay of ``Reranker.select`` / ``Reranker.update`` (capture mode).

Used by ``Reranker(..., capture=True)`` (or ``set_capture(True)``) when the adapters are on CUDA.
The reranker's capturable path keeps every changing scalar on the device (``memkern.score.reranker``),
so a step's kernels can be recorded once and replayed:

* ``select`` with the reranker's own seed and counter (no ``seed``/``offset``, not greedy), a 2-D
  query and CUDA tensors: the first ``WARMUP`` calls of a given signature (shapes, dtypes, devices,
  the table's storage) run eagerly on a side stream (lazy initialisation, Triton autotuning), the
  next one captures ``Reranker._select`` on copies of the inputs (static buffers; an ``(ids, table)``
  table is read in place, keyed by its storage) and every later call copies its inputs in and
  replays. The returned :class:`~memkern.score.reranker.Selection` holds copies of the outputs and the
  caller's own inputs.
* ``update`` of the selection the last ``select`` replay returned, with the adapters untouched
  since, plain SGD on float32 adapters and a full replay ring (the number of replayed rows is a
  shape): the same warm-up, then ``ReinforceTrainer.step`` is captured on the static buffers of the
  select graph plus a static reward buffer; the host part of the step (counters, the collapse
  guard's periodic check) runs after each replay.

Anything else runs the eager path (the reason is logged once on ``logging.getLogger("memkern")``).
A state change the graphs cannot see (new storages: a loaded state, a reallocated ring, replaced
parameters; another learning rate) changes the signature and leads to a new warm-up and capture.
Graph replays do not bump the adapters' version counters, so they are bumped by hand after each
update replay (the forward caches of other selections key on them).
"""
from __future__ import annotations

import logging

from ..errors import require

require("reranker", "torch", feature="memkern.graphs")  # names the extra when a package is missing
import torch

from .selection import Selection, _as_rewards, _forward_key
from .stats import UpdateStats

__all__ = ["GraphRunner"]

log = logging.getLogger("memkern")

WARMUP = 2


def _sig(t):
    return None if t is None else (tuple(t.shape), t.dtype, t.device)


class _Captured:
    """One captured graph, its signature and its static buffers."""

    def __init__(self, key):
        self.key = key
        self.graph = torch.cuda.CUDAGraph()


class GraphRunner:
    """Captures and replays a reranker's select and update (see the module docstring)."""

    def __init__(self, reranker):
        self.rr = reranker
        self.sel_g: _Captured | None = None
        self.upd_g: _Captured | None = None
        self.seen: dict = {}
        self.last = None            # (selection, adapter version key, select graph) of the last replay
        self.stream = torch.cuda.Stream(device=reranker.Wq.device)
        self._logged: set = set()

    def _eager(self, what: str, why: str):
        if (what, why) not in self._logged:
            self._logged.add((what, why))
            log.info("memkern.Reranker(capture=True): %s runs eagerly (%s)", what, why)
        return None

    def _warm(self, key) -> bool:
        """True while ``key`` still has warm-up calls to run (counts this one)."""
        if len(self.seen) > 64:
            self.seen.clear()
        n = self.seen.get(key, 0)
        self.seen[key] = n + 1
        return n < WARMUP

    def _side(self, fn):
        """Run ``fn`` on the side stream, ordered after (and before) the current stream's work."""
        cur = torch.cuda.current_stream(self.stream.device)
        self.stream.wait_stream(cur)
        with torch.cuda.stream(self.stream):
            out = fn()
        cur.wait_stream(self.stream)
        return out

    @staticmethod
    def _record(graph, fn):
        """Capture ``fn``'s kernels into ``graph`` (they run at its first replay); ``fn``'s outputs are
        the graph's static outputs."""
        with torch.cuda.graph(graph):
            return fn()

    # ------------------------------------------------------------------ select
    def select(self, q, cands, ids, mask, seed, greedy, m, offset):
        rr = self.rr
        self.last = None
        dev = rr.Wq.device
        if seed is not None or offset is not None or greedy:
            return self._eager("select", "an explicit seed/offset or greedy=True")
        if not isinstance(q, torch.Tensor) or q.dim() != 2 or q.requires_grad:
            return self._eager("select", "a 1-D query or one that requires grad")
        ts = [t for t in (q, cands, ids, mask) if t is not None]
        if any(not isinstance(t, torch.Tensor) or t.device != dev for t in ts):
            return self._eager("select", "inputs not on the adapters' CUDA device")
        table_ptr = cands.data_ptr() if ids is not None else None
        off_t = rr._offset_tensor()                # exists before any capture (no host copy inside)
        key = ("select", _sig(q), _sig(cands), _sig(ids), _sig(mask), table_ptr, m, rr.Wq.data_ptr(),
               rr.Wm.data_ptr(), off_t.data_ptr(), rr.tau, rr.logp, rr.backend, rr.seed)
        g = self.sel_g
        B, K = q.shape[0], (ids.shape[1] if ids is not None else cands.shape[1])
        off = rr._offset
        if g is None or g.key != key:
            if g is not None:
                self._eager("select", "the inputs differ from the captured graph's (shapes, dtypes, devices or "
                                      "table storage): warming up and capturing again")
            if self._warm(key):
                return self._side(lambda: rr._select(q, cands, ids, mask, None, False, m, None))
            g = self.sel_g = self._capture_select(key, q, cands, ids, mask, m)   # runs once as well
            self.upd_g = None
        else:
            self._copy_inputs(g, q, cands, ids, mask)
            g.graph.replay()
            rr._offset += B * K                    # the host value (the device one advanced in the graph)
        out = Selection(g.sel.indices.clone(), g.sel.scores.clone(), g.sel.logp.clone(), q, cands, ids, mask,
                        rr.seed, off, False, False)
        self.last = (out, _forward_key(rr.Wq, rr.Wm), g)
        return out

    @staticmethod
    def _copy_inputs(g, q, cands, ids, mask):
        g.q.copy_(q)
        if ids is None:
            g.cands.copy_(cands)
        else:
            g.ids.copy_(ids)
        if mask is not None:
            g.mask.copy_(mask)

    def _capture_select(self, key, q, cands, ids, mask, m):
        rr = self.rr
        g = _Captured(key)
        g.q = q.clone()
        g.cands = cands.clone() if ids is None else cands      # a table is read in place
        g.ids = None if ids is None else ids.clone()
        g.mask = None if mask is None else mask.clone()
        torch.cuda.synchronize(q.device)
        g.sel = self._record(g.graph, lambda: rr._select(g.q, g.cands, g.ids, g.mask, None, False, m, None))
        fw = g.sel.__dict__.get("_forward")
        g.qp = None if fw is None else fw[1]                   # q' of the selection (update reuses it)
        g.graph.replay()
        return g

    # ------------------------------------------------------------------ update
    def update(self, selection, rewards):
        rr, tr = self.rr, self.rr.trainer
        last, self.last = self.last, None
        if last is None or selection is not last[0]:
            return self._eager("update", "the selection is not the last replayed select's")
        if _forward_key(rr.Wq, rr.Wm) != last[1]:
            return self._eager("update", "the adapters changed since the select")
        if not (tr._plain_sgd() and rr.Wq.dtype == torch.float32 and rr.Wm.dtype == torch.float32):
            return self._eager("update", "only plain SGD on float32 adapters is captured")
        if tr.replay_capacity > 0 and tr._rlen < tr.replay_capacity:
            return self._eager("update", "the replay ring is not full yet (replayed rows are a shape)")
        sg = last[2]
        if sg.qp is None:
            return self._eager("update", "the select graph kept no forward intermediates (inference mode)")
        if tr.steps == 0 or (tr.guard and (tr._good_state is None or tr._win is None)) or (
                tr.baseline == "running_mean" and tr._rb is None):
            return self._eager("update", "the trainer's state is created by its first eager step")
        R = _as_rewards(rewards, selection.indices)
        state = [rr.Wq, rr.Wm, tr._rb, tr._rpos_t, tr._draws_t, rr._offset_t,
                 *(tr._win or ()), *(tr.__dict__.get("_gbuf") or ()), *((tr._ring or {}).values())]
        key = ("update", sg.key, id(sg), tr.optimizer.param_groups[0]["lr"], tr._rlen,
               tuple(None if t is None else t.data_ptr() for t in state))
        B = selection.indices.shape[0]
        n_replay = min(B if tr.replay_size is None else tr.replay_size, tr._rlen) if tr.replay_capacity else 0
        # the select graph's buffers hold this selection's inputs and outputs, at these adapters
        sg.sel.__dict__["_forward"] = (_forward_key(rr.Wq, rr.Wm, sg.q, sg.cands, sg.ids, sg.mask), sg.qp,
                                       sg.sel.scores)
        g = self.upd_g
        if g is None or g.key != key:
            if g is not None:
                self._eager("update", "the signature differs from the captured graph's (shapes, learning rate "
                                      "or state storages): warming up and capturing again")
            if self._warm(key):
                stats = self._side(lambda: tr.step(sg.sel, R, _defer_host=True))
                return tr._finish(self._own(stats, selection, R))
            g = self.upd_g = _Captured(key)
            g.R = R.clone()
            torch.cuda.synchronize(R.device)
            g.stats = self._record(g.graph, lambda: tr.step(sg.sel, g.R, _defer_host=True))
        else:
            g.R.copy_(R)
            tr._advance_host(B, n_replay)          # the host values the step's Python advanced at capture
        g.graph.replay()
        torch.autograd.graph.increment_version(rr.Wq)
        torch.autograd.graph.increment_version(rr.Wm)
        return tr._finish(self._own(g.stats, selection, R))

    @staticmethod
    def _own(stats: UpdateStats, selection, R) -> UpdateStats:
        """Stats the next replay does not overwrite (copies of the graph's 0-dim outputs)."""
        vals = {k: (v.clone() if isinstance(v, torch.Tensor) and k not in ("idx", "R") else v)
                for k, v in stats.tensors.items()}
        vals["idx"] = selection.indices
        vals["R"] = R
        return UpdateStats(**vals)
