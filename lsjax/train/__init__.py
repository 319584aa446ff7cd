"""Training drafts against a frozen target (`python train.py --config configs/train/X.yaml`).

    config.py     the sections every kind's config may share: RunConfig (the run, optim, checkpoint, log),
                  target, data, positions, features
    inputs.py     the frozen target, the batch readers every trainer hands the loop (resumable position)
    features.py   the frozen target's features: live in the step, or cached once on disk (npy memmaps)
    feature_cache.py  the target-feature cache shared by several trainers: the build pass and its CLI
    feature_sets.py   reading it (one set, several sets as one, one field lazily)
    step.py       the optimizer (optax AdamW, warmup-cosine, clipping), gradient accumulation over
                  micro-batches and the update every trainer's step ends with
    checkpoint.py orbax checkpoints: params, optimizer state, step, RNG and data-iterator state
    runner.py     the step loop every trainer shares: resume, checkpoints, metrics, dev eval, limits, plots

It picks no trainer: each method folder registers the kinds it trains (`lsjax.methods.registry.register_kind`),
and `train.py` resolves the config's `kind:` there. Decoding never imports this package (optax, orbax and grain
stay unloaded). The names below are loaded on first use, so `import lsjax.train.config` stays light.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "TrainState": "step",
    "init_state": "step",
    "lr_schedule": "step",
    "make_optimizer": "step",
    "accumulate_grads": "step",
    "apply_grads": "step",
    "build_feature_cache": "features",
    "positions_from_offsets": "features",
    "target_features": "features",
    "target_logits": "features",
    "TrainingDiverged": "runner",
    "run_steps": "runner",
    "plot_losses": "runner",
    "training_summary": "runner",
    "load_target": "inputs",
    "eos_id": "inputs",
    "RunConfig": "config",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"lsjax.train.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'lsjax.train' has no attribute {name!r}")
