"""The statistics of one reranker update (:class:`UpdateStats`), read lazily from device tensors."""
from __future__ import annotations

from collections.abc import Mapping

__all__ = ["UpdateStats"]


class _LazyNorm:
    """The adapters' norm, computed when read (``float()``); for steps that did not compute it."""

    def __init__(self, trainer):
        self.trainer = trainer

    def __float__(self):
        return float(self.trainer._norm())


class UpdateStats(Mapping):
    """Statistics of one update, read lazily: values stay device tensors until a key is read.

    Keys: ``loss``, ``reward_rate`` (fraction of the new valid slots with reward > 0),
    ``grad_norm`` (before clipping), ``adapter_norm`` (after the step; for settings without decay,
    max-norm or guard it is the adapters' norm when read), ``n_rows`` (new +
    replayed), ``n_replay``, ``baseline`` (the baseline used), ``rolled_back`` (0/1; only guard
    check steps can roll back), ``step``. Reading a key returns a Python float (int for ``n_rows``,
    ``n_replay``, ``step``) and synchronises with the device; :attr:`tensors` gives the raw values.
    """

    _KEYS = ("loss", "reward_rate", "grad_norm", "adapter_norm", "n_rows", "n_replay", "baseline", "rolled_back",
             "step")

    def __init__(self, **values):
        self.tensors = values

    def __getitem__(self, key):
        if key not in self._KEYS:
            raise KeyError(key)
        if key == "reward_rate":
            pos, valid = self.tensors["n_pos"], self.tensors["n_valid"]
            if pos is None:
                slot = self.tensors["idx"] >= 0
                pos, valid = (slot & (self.tensors["R"] > 0)).sum(), slot.sum()
            return float(pos) / max(float(valid), 1.0)
        v = self.tensors[key]
        if key in ("n_rows", "n_replay", "step"):
            return int(v)
        return float(v)

    def __iter__(self):
        return iter(self._KEYS)

    def __len__(self):
        return len(self._KEYS)

    def __repr__(self):
        return f"UpdateStats({dict(self)!r})"
