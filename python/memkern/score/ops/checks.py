"""Checks of the reranker ops' arguments: shapes, dtypes and devices of the tensors (no host syncs
unless ``check=True``), the sampling settings, seeds and the advantages of a selection's rewards.
Each raises through :func:`memkern.errors.bad_arg` naming the argument."""
from __future__ import annotations

from ...errors import require

require("reranker", "torch", feature="memkern.ops")  # names the extra when a package is missing
import torch

from ...errors import MemkernTypeError, bad_arg
from ...base.validate import check_float, check_int, is_int

__all__ = ["LOGP_MODES", "FLOAT_DTYPES", "is_float", "prepare_inputs", "check_m", "check_tau", "check_logp",
           "check_offset", "check_indices", "seed_int", "advantages"]

#: The log-probability modes of a draw (``logp=``).
LOGP_MODES = ("softmax", "plackett_luce")
#: The float dtypes the ops accept.
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def is_float(t: torch.Tensor) -> bool:
    """``t`` has one of :data:`FLOAT_DTYPES`."""
    return t.dtype in FLOAT_DTYPES


def prepare_inputs(q, Wq, Wm, candidates, ids, mask, check, combine=True):
    """Validate and normalise. Returns ``(q2 [B,d], squeezed, dense_or_None, ids_or_None,
    table_or_None, valid_or_None)``; ``combine=False`` returns the normalised ``mask`` [B, K] (or
    None) in place of ``valid`` (not and-ed with ``ids >= 0``: no tensor op)."""
    for name, t in (("q", q), ("Wq", Wq), ("Wm", Wm), ("candidates", candidates)):
        if not isinstance(t, torch.Tensor):
            raise bad_arg(name, "a torch.Tensor", type(t).__name__, MemkernTypeError)
        if not is_float(t):
            raise bad_arg(name, "a float32/float16/bfloat16/float64 tensor", t.dtype, MemkernTypeError)
    squeezed = q.dim() == 1
    q2 = q.unsqueeze(0) if squeezed else q
    if q2.dim() != 2:
        raise bad_arg("q", "shape [d] or [B, d]", tuple(q.shape))
    B, d = q2.shape
    for name, W in (("Wq", Wq), ("Wm", Wm)):
        if tuple(W.shape) != (d, d):
            raise bad_arg(name, f"shape [d, d] = [{d}, {d}] (d from q)", tuple(W.shape))
    dev = q2.device
    for name, t in (("Wq", Wq), ("Wm", Wm), ("candidates", candidates)):
        if t.device != dev:
            raise bad_arg(name, f"a tensor on q's device {dev}", t.device)
    dense = table = None
    if ids is None:
        if candidates.dim() == 2 and squeezed:
            candidates = candidates.unsqueeze(0)
        if candidates.dim() != 3 or candidates.shape[0] != B or candidates.shape[2] != d:
            raise bad_arg("candidates", f"shape [B, K, d] = [{B}, K, {d}] (or a table [N, d] with ids)",
                          tuple(candidates.shape))
        dense = candidates
        K = candidates.shape[1]
    else:
        if not isinstance(ids, torch.Tensor):
            raise bad_arg("ids", "an int64 torch.Tensor", type(ids).__name__, MemkernTypeError)
        if ids.dtype != torch.int64:
            raise bad_arg("ids", "dtype torch.int64", ids.dtype, MemkernTypeError)
        if ids.dim() == 1 and squeezed:
            ids = ids.unsqueeze(0)
        if ids.dim() != 2 or ids.shape[0] != B:
            raise bad_arg("ids", f"shape [B, K] with B = {B}", tuple(ids.shape))
        if ids.device != dev:
            raise bad_arg("ids", f"a tensor on q's device {dev}", ids.device)
        if candidates.dim() != 2 or candidates.shape[1] != d:
            raise bad_arg("candidates", f"an embedding table [N, {d}] when ids are given", tuple(candidates.shape))
        table = candidates
        K = ids.shape[1]
    if K < 1:
        raise bad_arg("candidates", "at least one candidate (K >= 1)", K)
    valid = None
    if mask is not None:
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            raise bad_arg("mask", "a bool torch.Tensor [B, K]", getattr(mask, "dtype", type(mask).__name__),
                          MemkernTypeError)
        if mask.dim() == 1 and squeezed:
            mask = mask.unsqueeze(0)
        if tuple(mask.shape) != (B, K):
            raise bad_arg("mask", f"shape [B, K] = [{B}, {K}]", tuple(mask.shape))
        if mask.device != dev:
            raise bad_arg("mask", f"a tensor on q's device {dev}", mask.device)
        valid = mask
    if ids is not None and combine:
        valid = (ids >= 0) if valid is None else (valid & (ids >= 0))
    if check:
        for name, t in (("q", q2), ("Wq", Wq), ("Wm", Wm), ("candidates", candidates)):
            if not bool(torch.isfinite(t).all()):
                raise bad_arg(name, "finite values (check=True)", "NaN or inf entries")
        if ids is not None and ids.numel():
            lo, hi = int(ids.min()), int(ids.max())
            if lo < -1 or hi >= table.shape[0]:
                raise bad_arg("ids", f"values in [-1, {table.shape[0]}) (table rows)", (lo, hi))
    return q2, squeezed, dense, ids, table, valid


def check_m(m, K):
    """Check that ``m`` is an int in ``[1, K]``."""
    if not is_int(m):
        raise bad_arg("m", "an int", m, MemkernTypeError)
    check_int("m", m, 1, expected="m >= 1")
    if m > K:
        raise bad_arg("m", f"m <= K = {K} (number of candidates)", m)


def check_tau(tau):
    """Check that the temperature ``tau`` is a positive float."""
    check_float("tau", tau, 0, low_open=True, expected="a positive float")


def check_logp(logp):
    """Check that ``logp`` is one of :data:`LOGP_MODES`."""
    if logp not in LOGP_MODES:
        raise bad_arg("logp", "'softmax' or 'plackett_luce'", logp)


def check_offset(offset, device):
    """Check a Philox counter base: an int >= 0, or a 0-dim int64 tensor on ``device``."""
    if isinstance(offset, torch.Tensor):
        if offset.dtype != torch.int64 or offset.dim() != 0 or offset.device != device:
            raise bad_arg("offset", f"an int >= 0 or a 0-dim int64 tensor on {device}",
                          f"{offset.dtype} tensor of shape {tuple(offset.shape)} on {offset.device}")
        return
    check_int("offset", offset, 0)


def advantages(rewards, indices, baseline, name="rewards"):
    """Advantages ``rewards - baseline`` (float32 ``[B, M]``, 0 on ``-1`` slots) after checking
    ``rewards`` against the selection ``indices``."""
    if not isinstance(rewards, torch.Tensor):
        raise bad_arg(name, "a torch.Tensor [B, M]", type(rewards).__name__, MemkernTypeError)
    if tuple(rewards.shape) != tuple(indices.shape):
        raise bad_arg(name, f"shape of the selection {tuple(indices.shape)}", tuple(rewards.shape))
    if rewards.device != indices.device:
        raise bad_arg(name, f"a tensor on the selection's device {indices.device}", rewards.device)
    adv = rewards.float() - (baseline.float() if isinstance(baseline, torch.Tensor) else float(baseline))
    return torch.where(indices >= 0, adv, torch.zeros_like(adv))


def check_indices(indices, B, K):
    """Check a selection: int64 ``[B, M]`` with ``1 <= M <= K``."""
    if not isinstance(indices, torch.Tensor) or indices.dtype != torch.int64:
        raise bad_arg("indices", "an int64 tensor [B, M]", getattr(indices, "dtype", type(indices).__name__),
                      MemkernTypeError)
    if indices.dim() != 2 or indices.shape[0] != B or not 1 <= indices.shape[1] <= K:
        raise bad_arg("indices", f"shape [B, M] with B = {B}, 1 <= M <= K = {K}", tuple(indices.shape))


def seed_int(seed: int | torch.Generator | None, name: str = "seed") -> int:
    """The Philox seed as an int in ``[0, 2**63)`` (None: 0; a ``torch.Generator``: one int drawn
    from it)."""
    if seed is None:
        return 0
    if isinstance(seed, torch.Generator):
        return int(torch.randint(0, 2**62, (1,), generator=seed, device=seed.device).item())
    if not is_int(seed):
        raise bad_arg(name, "an int in [0, 2**63) or a torch.Generator", seed, MemkernTypeError)
    return check_int(name, seed, 0, 2**63 - 1, expected="an int in [0, 2**63)")
