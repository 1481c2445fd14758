"""The replay ring of :class:`memkern.ReinforceTrainer`: a bounded FIFO of past rows (queries,
candidate embeddings, valid mask, selection, rewards, prior offsets) on the adapters' device, and
the seeded uniform draw of the rows an update revisits (splitmix64 keys, the same on the host and
on the device)."""
from __future__ import annotations

from ..errors import require

require("reranker", "torch", feature="memkern.ReinforceTrainer")  # names the extra when a package is missing
import torch

__all__ = ["ReplayRingMixin"]


class ReplayRingMixin:
    """The replay ring's methods of :class:`memkern.ReinforceTrainer`.

    They read and write the trainer's ring state, set by its constructor: ``replay_capacity``,
    ``_ring`` (``q [C, d]``, ``C [C, K, d]``, ``valid [C, K]``, ``idx``/``R [C, M]``, ``P [C, K]``),
    ``_rlen``, ``_rpos``, ``_replay_draws``, and in the capturable mode ``_rpos_t`` / ``_draws_t``.
    """

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

    def _advance_host(self, n_new: int, n_replay: int) -> None:
        """The host values a step advances (ring position and fill, replay-draw counter), for a step
        whose tensor part ran as a CUDA-graph replay (they depend only on the batch sizes)."""
        cap = self.replay_capacity
        if cap > 0:
            if n_replay > 0:
                self._replay_draws += 1
            self._rpos = (self._rpos + n_new) % cap
            self._rlen = min(cap, self._rlen + n_new)


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

