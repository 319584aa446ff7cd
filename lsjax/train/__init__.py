"""Training drafts against a frozen target (`python train.py --config configs/train/X.yaml`).

    config.py     TrainConfig and its sections (target, data, positions, loss, optim, checkpoint, features, log)
    features.py   the frozen target's features: live in the step, or cached once on disk (npy memmaps)
    losses.py     chunked LM-head cross-entropy and distillation; one micro-batch's loss sums
    step.py       the optimizer (optax AdamW, warmup-cosine, clipping) and the pure train / eval steps
    checkpoint.py orbax checkpoints: params, optimizer state, step, RNG and data-iterator state
    loop.py       `fit`: one run (a stage) with resume, dev eval, metrics, plots
    export.py     a run's latest checkpoint -> a draft directory decode.py loads

Decoding never imports this package (optax, orbax and grain stay unloaded). The names below are loaded
on first use, so `import lsjax.train.config` stays light.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "TrainState": "step",
    "init_state": "step",
    "lr_schedule": "step",
    "make_eval_step": "step",
    "make_optimizer": "step",
    "make_train_step": "step",
    "draw_shift": "step",
    "lm_losses": "losses",
    "dense_lm_losses": "losses",
    "micro_losses": "losses",
    "next_token_targets": "losses",
    "build_feature_cache": "features",
    "positions_from_offsets": "features",
    "target_features": "features",
    "target_logits": "features",
    "TrainingDiverged": "loop",
    "fit": "loop",
    "load_target": "loop",
    "eos_id": "loop",
    "plot_losses": "loop",
    "training_summary": "loop",
    "export_run": "export",
    "save_draft": "export",
    "TrainConfig": "config",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"lsjax.train.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'lsjax.train' has no attribute {name!r}")
