"""Backend choice and dispatch of the reranker ops: :func:`resolve_backend` picks ``"triton"`` or
``"torch"`` for a device (and logs what ``"auto"`` chose), :func:`triton_kernels` imports the Triton
launchers, :func:`forward_pass` and :func:`reinforce_core` run the forward pass and the REINFORCE
gradient on the chosen backend."""
from __future__ import annotations

import logging
import os

from ...errors import require

require("reranker", "torch", feature="memkern.ops")  # names the extra when a package is missing
import torch

from ...errors import BackendUnavailableError
from ...base.validate import check_choice
from . import torch_path

__all__ = ["resolve_backend", "triton_kernels", "forward_pass", "reinforce_core"]

log = logging.getLogger("memkern")

_TRITON_STATUS: tuple[bool, str] | None = None
_LOGGED: set[tuple[str, str]] = set()


def _triton_status() -> tuple[bool, str]:
    global _TRITON_STATUS
    if _TRITON_STATUS is None:
        try:
            import triton  # noqa: F401

            _TRITON_STATUS = (True, f"triton {triton.__version__} importable")
        except Exception as exc:  # pragma: no cover - depends on the environment
            _TRITON_STATUS = (False, f"triton is not importable ({type(exc).__name__}: {exc})")
    return _TRITON_STATUS


def _interpret() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def resolve_backend(backend: str, device: torch.device) -> str:
    """Return ``"triton"`` or ``"torch"`` for tensors on ``device``.

    ``"triton"`` raises :class:`BackendUnavailableError` (saying why) when Triton cannot run
    there: Triton missing, or a non-CUDA device without ``TRITON_INTERPRET=1``. ``"auto"`` picks
    Triton only for CUDA tensors with Triton importable and logs its choice once per device type.
    """
    check_choice("backend", backend, ("auto", "triton", "torch"))
    if backend == "torch":
        return "torch"
    if backend == "auto" and device.type != "cuda":   # decided without importing triton
        key = ("torch", device.type)
        if key not in _LOGGED:
            _LOGGED.add(key)
            log.info("memkern.ops: backend='auto' chose 'torch' for %s tensors (tensors are not on CUDA)",
                     device.type)
        return "torch"
    ok, why = _triton_status()
    if backend == "triton":
        if not ok:
            raise BackendUnavailableError(f"backend='triton' refused: {why}")
        if device.type != "cuda" and not _interpret():
            raise BackendUnavailableError(
                f"backend='triton' refused: tensors are on {device.type!r}, Triton kernels need CUDA "
                "tensors (or TRITON_INTERPRET=1 set before import to run them, slowly, on CPU); "
                "use backend='torch' or 'auto'")
        return "triton"
    choice = "triton" if ok else "torch"
    key = (choice, device.type)
    if key not in _LOGGED:
        _LOGGED.add(key)
        reason = why
        log.info("memkern.ops: backend='auto' chose %r for %s tensors (%s)", choice, device.type, reason)
    return choice


def triton_kernels():
    """The Triton launchers (:mod:`memkern.kernels.rerank`); imports Triton, so only on the triton path."""
    from memkern.kernels import rerank as k  # imports triton; only on the triton path

    return k


def forward_pass(backend, q2, Wq, Wm, dense, ids, table, valid, dt=torch.float32):
    """Forward pass on a resolved ``backend``: ``(q [B, d], q' [B, d], r [B, d], C, scores [B, K])``
    with ``C`` the gathered candidates ``[B, K, d]`` on the torch path (None on the Triton path)."""
    if backend == "torch":
        q, qp, r = torch_path.adapt(q2, Wq, Wm, dt)
        C = torch_path.gather_candidates(dense, ids, table, dt)
        return q, qp, r, C, torch_path.candidate_scores(r, C, valid)
    k = triton_kernels()
    q, qp, r = k.adapt(q2, Wq, Wm)
    scores = k.scores(r, dense, ids, table, valid)
    return q, qp, r, None, scores


def reinforce_core(be, q, qp, Wm, C, dense, ids, table, scores, indices, adv, tau, logp, B):
    """REINFORCE loss and closed-form gradients on a resolved backend ``be``: ``(loss, dWq [d, d],
    dWm [d, d], g [B, K])`` from the forward intermediates and masked advantages ``adv [B, M]``."""
    if be == "torch":
        g, loss = torch_path.score_grad(scores, indices, adv, tau, logp, B)
        dWq, dWm = torch_path.adapter_grads(q, qp, Wm, C, g)
        return loss, dWq, dWm, g
    k = triton_kernels()
    g, loss, U = k.reinforce_u(scores, indices, adv, dense, ids, table, tau, logp, B)
    dWq, dWm = k.adapter_grads(q, qp, Wm, U)
    return loss, dWq, dWm, g
