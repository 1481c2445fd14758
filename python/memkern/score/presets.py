"""The named learning settings of the reranker: :data:`PRESETS` (``Reranker.from_preset``) and their
trainer half :data:`TRAINER_PRESETS` (``ReinforceTrainer.from_preset``), with the trainer's
setting names :data:`TRAINER_KEYS`."""
from __future__ import annotations

from typing import Any

__all__ = ["PRESETS", "TRAINER_PRESETS", "TRAINER_KEYS"]

#: The paper's setting, the stable default and RMM's fresh reranker (``Reranker.from_preset``).
PRESETS: dict[str, dict[str, Any]] = {
    "paper": dict(tau=0.5, lr=1e-3, optimizer="sgd", baseline=0.5, logp="softmax",
                  normalize_advantages=False, clip_grad_norm=None, weight_decay=0.0,
                  replay_capacity=0, replay_size=0, guard=False, max_norm=None),
    "stable": dict(tau=0.5, lr=5e-2, optimizer="sgd", baseline="batch_mean", logp="softmax",
                   normalize_advantages=True, clip_grad_norm=1.0, weight_decay=1e-2,
                   replay_capacity=256, replay_size=None, guard=True, max_norm=20.0),
    # RMM's fresh reranker (memkern.loops.rmm.feedback.default_reranker): a few citations per namespace, each
    # question asked about once; measured on LoCoMo (bench/RESULTS.md, learning section)
    "rmm": dict(tau=0.5, lr=0.2, optimizer="sgd", baseline="batch_mean", logp="softmax",
                normalize_advantages=True, clip_grad_norm=1.0, weight_decay=1e-2,
                replay_capacity=0, replay_size=0, guard=True, max_norm=1.0),
}

# the trainer half of memkern.score.reranker.PRESETS (tau and logp belong to the module)
TRAINER_PRESETS: dict[str, dict[str, Any]] = {
    "paper": dict(lr=1e-3, optimizer="sgd", baseline=0.5, normalize_advantages=False, clip_grad_norm=None,
                  weight_decay=0.0, replay_capacity=0, replay_size=0, guard=False, max_norm=None),
    "stable": dict(lr=5e-2, optimizer="sgd", baseline="batch_mean", normalize_advantages=True,
                   clip_grad_norm=1.0, weight_decay=1e-2, replay_capacity=256, replay_size=None, guard=True,
                   max_norm=20.0),
    "rmm": dict(lr=0.2, optimizer="sgd", baseline="batch_mean", normalize_advantages=True, clip_grad_norm=1.0,
                weight_decay=1e-2, replay_capacity=0, replay_size=0, guard=True, max_norm=1.0),
}

TRAINER_KEYS = ("lr", "optimizer", "baseline", "normalize_advantages", "clip_grad_norm", "weight_decay",
                "replay_capacity", "replay_size", "baseline_momentum", "guard", "guard_window", "guard_tol",
                "guard_drop", "guard_max_norm", "guard_patience", "guard_every", "max_norm")
