"""The reranker's fused CPU path: one C++ call (``memkern._store.rerank_select`` /
``rerank_step``, csrc/score/rerank.cpp) for :meth:`memkern.Reranker.select` and one for the
trainer's step, at batches of up to :data:`MAX_B` rows of CPU float32 tensors.

It computes what the torch path computes (same Philox uniforms, so the same draws; scores,
log-probabilities and gradients to float32 rounding) without dispatching the many small torch ops
that dominate at small batches. :func:`use_native` decides per call: ``backend="auto"`` or
``"native"`` on inputs that fit (CPU, float32, C-contiguous, no ``requires_grad`` inputs, ``B <=
MAX_B``, eager mode); anything else runs the torch path. Each choice is logged once on
``logging.getLogger("memkern")``, as :func:`memkern.score.ops.backend.resolve_backend` logs its own.
"""
from __future__ import annotations

import logging

from ...errors import require

require("reranker", "torch", feature="memkern.ops")  # names the extra when a package is missing
import torch

from ...errors import BackendUnavailableError

__all__ = ["MAX_B", "available", "use_native", "arr", "view", "module", "misfit"]

log = logging.getLogger("memkern")

#: The largest batch the fused path takes (larger batches are GEMM-bound: the torch path's BLAS wins).
MAX_B = 64

_STATUS: tuple[object, str] | None = None
_LOGGED: set = set()


def _status() -> tuple[object, str]:
    global _STATUS
    if _STATUS is None:
        try:
            from ... import _store

            if hasattr(_store, "rerank_step"):
                _STATUS = (_store, f"fused C++ kernels, {_store.rerank_kernel()}")
            else:
                _STATUS = (None, "memkern._store has no rerank kernels (an older build)")
        except Exception as exc:  # pragma: no cover - depends on the build
            _STATUS = (None, f"memkern._store is not importable ({type(exc).__name__}: {exc})")
    return _STATUS


def module():
    """The native module (``memkern._store``) with the kernels; call after :func:`use_native`."""
    return _status()[0]


def available() -> bool:
    """Whether the extension has the fused kernels."""
    return _status()[0] is not None


def _log_once(key, msg, *args) -> None:
    if key not in _LOGGED:
        _LOGGED.add(key)
        log.info(msg, *args)


def use_native(backend: str, what: str, why_not: str | None) -> bool:
    """Whether ``what`` (``"select"`` or ``"update"``) runs the fused native path.

    Parameters
    ----------
    backend : the reranker's backend; ``"torch"`` and ``"triton"`` never run it, ``"auto"`` and
        ``"native"`` do when the kernels are built and the inputs fit
    what : named in the log
    why_not : None when the inputs fit, else why not (a short category, e.g. ``"cuda tensors"``);
        the call then runs the torch path

    Raises
    ------
    BackendUnavailableError
        ``backend="native"`` with an extension built without the kernels.
    """
    if backend not in ("auto", "native"):
        return False
    mod, why = _status()
    if mod is None:
        if backend == "native":
            raise BackendUnavailableError(f"backend='native' refused: {why}")
        _log_once(("none", backend), "memkern.Reranker: backend=%r runs the torch path (%s)", backend, why)
        return False
    if why_not is not None:
        _log_once(("torch", backend, what, why_not),
                  "memkern.Reranker.%s: backend=%r runs the torch path for these inputs (%s)", what, backend, why_not)
        return False
    _log_once(("native", backend, what), "memkern.Reranker.%s: backend=%r chose 'native' for cpu tensors (%s, B <= %d)",
              what, backend, why, MAX_B)
    return True


def arr(t: torch.Tensor | None):
    """The numpy view of a CPU tensor (None stays None); the native calls read and write through it."""
    if t is None:
        return None
    return (t.detach() if t.requires_grad else t).numpy()


def view(cache: dict, key, t: torch.Tensor):
    """:func:`arr` of a long-lived tensor (adapters, buffers, the replay ring), kept in ``cache`` under
    ``key`` while it is the same tensor with the same storage (a numpy view costs a dispatched op)."""
    e = cache.get(key)
    if e is not None and e[0] is t and e[1] == t.data_ptr() and e[2].shape == tuple(t.shape):
        return e[2]
    a = arr(t)
    cache[key] = (t, t.data_ptr(), a)
    return a


def misfit(*tensors) -> str | None:
    """Why tensors do not fit the fused path (None: they do): a device other than the CPU, a float
    dtype other than float32, a non-contiguous layout (int64 ids and bool masks are taken as they are)."""
    f32 = torch.float32
    for t in tensors:
        if t is None:
            continue
        if not t.is_cpu:
            return f"{t.device.type} tensors"
        dt = t.dtype
        if dt is not f32 and dt.is_floating_point:
            return f"{dt} tensors"
        if not t.is_contiguous():
            return "non-contiguous tensors"
    return None
