"""Data-parallel REINFORCE training of a :class:`memkern.Reranker` on Ray actors.

Each of ``workers`` Ray actors holds a replica of the reranker (same initial adapters, same
settings) and its :class:`memkern.ReinforceTrainer`; the replicas join one
``torch.distributed`` process group (gloo, CPU) and the trainer's ``reducer`` hook all-reduces:

* the batch statistics: the reward sum and slot count (``batch_mean`` / ``running_mean``
  baselines), then the advantage sum and squared deviations (advantage normalisation);
* the gradient: each worker's ``(dWq, dWm)`` and loss are means over its ``B_w`` rows, so the
  all-reduce sums ``B_w * g_w`` and divides by ``sum_w B_w`` -- the mean over all rows, i.e. the
  single-process gradient of the concatenated batch; a non-finite step on any worker is skipped
  on all of them.

Clipping, the optimizer, weight decay and the max-norm projection then act on identical
gradients, so the replicas stay identical and equal (to float rounding of the sums) to one
trainer stepping on the concatenated batch. Not supported (refused): the replay ring (each replica
would replay different rows) and the collapse guard (its rollbacks are per replica).
"""
from __future__ import annotations

import os
import socket
from datetime import timedelta
from typing import Any, Sequence

from ..errors import require

require("ray", "ray", "torch", feature="memkern.distributed.DataParallelTrainer")  # names the extra when a package is missing
import torch

from ..errors import MemkernTypeError, MemkernValueError, bad_arg

__all__ = ["DataParallelTrainer", "split_selection"]

_ROW_FIELDS = ("indices", "scores", "logp", "q", "candidates", "ids", "mask")


def split_selection(selection: Any, parts: int) -> list[Any]:
    """Split a batched :class:`memkern.Selection` into ``parts`` row blocks (as even as possible;
    rows ``[B]`` in order). With ``ids`` set, ``candidates`` is the shared table and is not split."""
    from ..score.reranker import Selection

    if not isinstance(selection, Selection):
        raise bad_arg("selection", "a memkern.Selection", type(selection).__name__, MemkernTypeError)
    if selection.squeezed:
        raise bad_arg("selection", "a batched selection (2-D queries)", "a squeezed one")
    B = selection.indices.shape[0]
    if isinstance(parts, bool) or not isinstance(parts, int) or not 1 <= parts <= B:
        raise bad_arg("parts", f"an int in 1..{B} (the selection's rows)", parts)
    bounds = [round(i * B / parts) for i in range(parts + 1)]
    out = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        kw = {}
        for f in _ROW_FIELDS:
            v = getattr(selection, f)
            if v is None or (f == "candidates" and selection.ids is not None):
                kw[f] = v
            else:
                kw[f] = v[a:b]
        out.append(Selection(seed=selection.seed, offset=selection.offset, greedy=selection.greedy,
                             squeezed=False, **kw))
    return out


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Worker:
    """One replica: a reranker whose trainer all-reduces through a gloo process group."""

    def __init__(self, rank: int, world: int, port: int, reranker_kwargs: dict, state: dict, threads: int) -> None:
        import torch.distributed as dist

        from ..score.reranker import Reranker

        torch.set_num_threads(threads)
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=120))
        self.dist = dist
        self.rank = rank
        self.rr = Reranker(**reranker_kwargs)
        with torch.no_grad():
            self.rr.Wq.copy_(state["Wq"])
            self.rr.Wm.copy_(state["Wm"])
        self.rr.trainer.reducer = self._allsum

    def ready(self) -> int:
        return self.rank

    def _allsum(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        # one all-reduce of the flattened tensors (fp64 sums: the result does not depend on the
        # order in which gloo adds the workers' parts beyond fp64 rounding)
        flat = torch.cat([t.reshape(-1).to(torch.float64) for t in tensors])
        self.dist.all_reduce(flat, op=self.dist.ReduceOp.SUM)
        out, pos = [], 0
        for t in tensors:
            n = t.numel()
            out.append(flat[pos:pos + n].reshape(t.shape).to(t.dtype if t.is_floating_point() else torch.float32))
            pos += n
        return out

    def step(self, selection: Any, rewards: Any) -> dict[str, float]:
        stats = self.rr.update(selection, rewards)
        return {k: float(stats[k]) for k in ("loss", "grad_norm")}

    def weights(self) -> dict[str, torch.Tensor]:
        return {"Wq": self.rr.Wq.detach().clone(), "Wm": self.rr.Wm.detach().clone()}

    def shutdown(self) -> None:
        self.dist.destroy_process_group()


class DataParallelTrainer:
    """REINFORCE training of ``reranker`` over ``workers`` Ray actors with averaged gradients.

    Parameters
    ----------
    reranker : memkern.Reranker
        The model: its settings (``Reranker(**reranker_kwargs)``) and current adapters seed every
        replica; :meth:`sync_to` copies the trained adapters back.
    workers : int
        Replicas (Ray actors, one gloo rank each).
    reranker_kwargs : dict
        The keyword arguments ``reranker`` was built with (``dim`` required); ``replay_capacity``
        must be 0 and ``guard`` False (see the module docstring).
    threads : int
        torch threads per replica (default 1).
    """

    def __init__(self, reranker: Any, workers: int, reranker_kwargs: dict, *, threads: int = 1) -> None:
        from . import ensure_ray

        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise bad_arg("workers", "an int >= 1", workers)
        if not isinstance(reranker_kwargs, dict) or "dim" not in reranker_kwargs:
            raise bad_arg("reranker_kwargs", "a dict with at least 'dim'", reranker_kwargs)
        if reranker_kwargs.get("replay_capacity", 256) != 0:
            raise bad_arg("reranker_kwargs['replay_capacity']", "0 (each replica would replay different rows)",
                          reranker_kwargs.get("replay_capacity", 256))
        if reranker_kwargs.get("guard", True):
            raise bad_arg("reranker_kwargs['guard']", "False (rollbacks are per replica)",
                          reranker_kwargs.get("guard", True))
        if reranker.Wq.device.type != "cpu":
            raise MemkernValueError("DataParallelTrainer: expected a CPU reranker (gloo all-reduce), "
                                    f"got adapters on {reranker.Wq.device}")
        ray = ensure_ray()
        self._ray = ray
        self.workers = workers
        self.reranker = reranker
        port = _free_port()
        state = {"Wq": reranker.Wq.detach().clone(), "Wm": reranker.Wm.detach().clone()}
        cls = ray.remote(num_cpus=0)(_Worker)
        self._actors = [cls.remote(r, workers, port, dict(reranker_kwargs), state, threads) for r in range(workers)]
        ray.get([a.ready.remote() for a in self._actors])

    def step(self, selections: Sequence[Any], rewards: Sequence[Any]) -> dict[str, float]:
        """One synchronous update: worker ``w`` steps on ``selections[w]`` with ``rewards[w]``
        (``[B_w, M]``); returns the global ``loss`` and ``grad_norm``."""
        if len(selections) != self.workers or len(rewards) != self.workers:
            raise bad_arg("selections/rewards", f"{self.workers} of each (one per worker)",
                          (len(selections), len(rewards)))
        out = self._ray.get([a.step.remote(s, r) for a, s, r in zip(self._actors, selections, rewards)])
        return out[0]

    def weights(self, worker: int = 0) -> dict[str, torch.Tensor]:
        """The adapters ``{"Wq", "Wm"}`` of replica ``worker``."""
        return self._ray.get(self._actors[worker].weights.remote())

    def sync_to(self, reranker: Any = None) -> Any:
        """Copy replica 0's adapters into ``reranker`` (default: the one given at construction)."""
        rr = reranker if reranker is not None else self.reranker
        w = self.weights(0)
        with torch.no_grad():
            rr.Wq.copy_(w["Wq"])
            rr.Wm.copy_(w["Wm"])
        return rr

    def close(self) -> None:
        if self._actors:
            try:
                self._ray.get([a.shutdown.remote() for a in self._actors])
            finally:
                for a in self._actors:
                    self._ray.kill(a)
                self._actors = []

    def __enter__(self) -> "DataParallelTrainer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
