"""Philox4x32-10 uniforms, bit-identical to ``triton.language.rand`` (counter = offset, key = seed):
:func:`philox_uniform` on torch tensors (any device; numpy on the CPU)."""
from __future__ import annotations

from ...errors import require

require("reranker", "torch", feature="memkern.ops")  # names the extra when a package is missing
import torch

__all__ = ["philox_uniform"]

_M32 = 0xFFFFFFFF
_PHILOX_KEY_A = 0x9E3779B9
_PHILOX_KEY_B = 0xBB67AE85
_PHILOX_ROUND_A = 0xD2511F53
_PHILOX_ROUND_B = 0xCD9E8D57


def _mulhilo32_wrap(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # the int64 product wraps modulo 2^64 (two's complement), which keeps all 64 bits of a*b
    p = a * b
    return torch.bitwise_right_shift(p, 32) & _M32, p & _M32


def _mulhilo32_split(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # 32x32 -> 64-bit product without overflowing int64: split b into 16-bit halves.
    b_lo = b & 0xFFFF
    b_hi = torch.bitwise_right_shift(b, 16)
    p_lo = a * b_lo                      # < 2^48
    p_hi = a * b_hi                      # < 2^48
    hi = torch.bitwise_right_shift(p_hi + torch.bitwise_right_shift(p_lo, 16), 16)
    lo = ((p_hi & 0xFFFF) * 65536 + p_lo) & _M32
    return hi, lo


def _wrap_ok() -> bool:
    # torch's int64 multiply wraps on every platform we know of; check it (scalar and vector kernels)
    b = torch.arange(2**32 - 4099, 2**32, 7, dtype=torch.int64)
    return all(torch.equal(x, y) for x, y in zip(_mulhilo32_wrap(_PHILOX_ROUND_A, b),
                                                 _mulhilo32_split(_PHILOX_ROUND_A, b)))


_mulhilo32 = _mulhilo32_wrap if _wrap_ok() else _mulhilo32_split


def philox_uniform(seed: int, offsets: torch.Tensor) -> torch.Tensor:
    """Uniforms in ``[0, 1)`` (float32) for integer ``offsets`` under ``seed``, like ``tl.rand``.

    Counter-based: the value at an offset depends only on ``(seed, offset)``. Implements
    Philox4x32 with 10 rounds (counter ``(offset_lo, offset_hi, 0, 0)``, key
    ``(seed_lo, seed_hi)``) and Triton's int-to-float conversion, so it reproduces
    ``triton.language.rand(seed, offsets)`` bit for bit.

    Parameters
    ----------
    seed : int, ``0 <= seed < 2**63``
    offsets : int64 tensor of any shape, values ``>= 0``
    """
    if offsets.device.type == "cpu" and not _FORCE_TORCH_PHILOX:
        return torch.from_numpy(_philox_uniform_numpy(seed, offsets.to(torch.int64).numpy()))
    off = offsets.to(torch.int64)
    c0 = off & _M32
    c1 = torch.bitwise_right_shift(off, 32) & _M32  # (the >> operator is ~10x slower on CPU)
    c2 = torch.zeros_like(c0)
    c3 = torch.zeros_like(c0)
    k0 = seed & _M32
    k1 = (seed >> 32) & _M32
    for _ in range(10):
        hi_b, lo_b = _mulhilo32(_PHILOX_ROUND_B, c2)
        hi_a, lo_a = _mulhilo32(_PHILOX_ROUND_A, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0 = (k0 + _PHILOX_KEY_A) & _M32
        k1 = (k1 + _PHILOX_KEY_B) & _M32
    x = torch.where(c0 >= 2**31, c0 - 2**32, c0)       # bitcast to int32
    x = torch.where(x < 0, -x - 1, x)                  # ~x for negatives
    # a Python scalar (multiplied in float32), not a tensor built from host memory: capturable in a CUDA graph
    return x.to(torch.float32) * 4.6566127342e-10


_FORCE_TORCH_PHILOX = False  # tests flip it to compare the two implementations


def _philox_uniform_numpy(seed: int, off):
    """The same Philox4x32-10 in numpy uint64 (defined wrap-around, ~5x fewer microseconds per op
    than torch on small CPU arrays)."""
    import numpy as np

    m32 = np.uint64(_M32)
    s32 = np.uint64(32)
    off = off.astype(np.uint64)
    c0 = off & m32
    c1 = off >> s32
    c2 = np.zeros_like(c0)
    c3 = np.zeros_like(c0)
    k0 = seed & _M32
    k1 = (seed >> 32) & _M32
    A = np.uint64(_PHILOX_ROUND_A)
    Bc = np.uint64(_PHILOX_ROUND_B)
    for _ in range(10):
        pb = Bc * c2
        pa = A * c0
        c0, c1, c2, c3 = (pb >> s32) ^ c1 ^ np.uint64(k0), pb & m32, (pa >> s32) ^ c3 ^ np.uint64(k1), pa & m32
        k0 = (k0 + _PHILOX_KEY_A) & _M32
        k1 = (k1 + _PHILOX_KEY_B) & _M32
    x = c0.astype(np.uint32).view(np.int32)          # bitcast to int32
    x = np.where(x < 0, ~x, x)
    return x.astype(np.float32) * np.float32(4.6566127342e-10)
