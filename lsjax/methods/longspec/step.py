"""The LongSpec draft's pure training step (on the shared optimizer and gradient halves, `lsjax.train.step`).

    step = make_train_step(model_cfg, train_cfg, vocab_ids)      # pure: (state, target_params, batch, key)
    state, metrics = jax.jit(step, donate_argnums=0)(state, target_params, batch, key)

A batch is what `lsjax.train.data.batches` yields ([A, B, T] for A micro-batches), optionally with cached
target features ("target_k", "target_v" [A, B, K, T, H], "target_argmax" [A, B, T], "target_hidden"
[A, B, T, D]); without them the frozen target runs once per micro-batch inside the step. The flash-noisy
lag j ~ U[1, gamma) is an array (no retrace). Gradients of all micro-batches are summed (each micro-batch's
loss is already divided by the step's total loss weight), then one clipped AdamW update.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from lsjax.config import ModelConfig
from lsjax.methods.longspec.losses import micro_losses, text_weights
from lsjax.methods.longspec.train_config import LongSpecTrainConfig
from lsjax.train.step import TrainState, accumulate_grads, apply_grads, lr_schedule, make_optimizer


def draw_shift(key: jax.Array, cfg: LongSpecTrainConfig) -> jax.Array:
    """Flash-noisy lag j ~ U{1, ..., gamma - 1} as an int32 array; 0 (no lag) when flash noisy training is off."""
    if not cfg.loss.flash_noisy:
        return jnp.zeros((), jnp.int32)
    return jax.random.randint(key, (), 1, cfg.loss.gamma, dtype=jnp.int32)


def _objective(sums: dict, cfg: LongSpecTrainConfig, total_weight: jax.Array, distill_total: jax.Array) -> jax.Array:
    loss = cfg.loss.ce_weight * sums["ce"] / total_weight
    if cfg.loss.distill != "none":
        loss = loss + cfg.loss.distill_weight * sums["distill"] / distill_total
    return loss


def _distill_total(cfg: LongSpecTrainConfig, loss_mask: jax.Array, total_w: jax.Array) -> jax.Array:
    """The distillation term's normaliser: the CE term's unless it weighs the whole text (`distill_on`). An
    upper bound under "text" with argmax (positions whose argmax is outside a pruned vocabulary count)."""
    if cfg.loss.distill_on == "text":
        return jnp.maximum(jnp.sum(text_weights(loss_mask)), 1.0)
    return total_w


def make_train_step(config: ModelConfig, cfg: LongSpecTrainConfig, vocab_ids=None, optimizer=None):
    """The pure step `(state, target_params, batch, key) -> (state, metrics)`; jit it (see sharding.py)."""
    optimizer = optimizer or make_optimizer(cfg.optim)
    schedule = lr_schedule(cfg.optim)
    vocab_ids = None if vocab_ids is None else jnp.asarray(vocab_ids, jnp.int32)

    def step(state: TrainState, target_params: dict, batch: dict, key: jax.Array):
        A = batch["tokens"].shape[0]
        keys = jax.random.split(key, A)
        # The normaliser is known before any forward: sum over micro-batches of next-token weights.
        total_w = jnp.maximum(jnp.sum(batch["loss_mask"][:, :, 1:]), 1.0)
        total_d = _distill_total(cfg, batch["loss_mask"], total_w)

        def loss_fn(p, xs):
            micro, k = xs
            shift = draw_shift(k, cfg)
            sums = micro_losses(p, target_params, config, cfg, micro, shift, vocab_ids)
            return _objective(sums, cfg, total_w, total_d), {**sums, "shift": shift.astype(jnp.float32)}

        keys_s = ("ce", "distill", "correct", "weight", "distill_weight", "shift")
        zeros_s = {k: jnp.zeros((), jnp.float32) for k in keys_s}
        grads, sums = accumulate_grads(loss_fn, state.params, (batch, keys), zeros_s)
        new_state = apply_grads(state, grads, optimizer)
        w = jnp.maximum(sums["weight"], 1.0)
        metrics = {
            "loss": _objective(sums, cfg, total_w, total_d),
            "ce": sums["ce"] / w,
            "distill": sums["distill"] / jnp.maximum(sums["distill_weight"], 1.0),
            "acc": sums["correct"] / w,
            "loss_tokens": sums["weight"],
            "grad_norm": optax.tree.norm(grads),
            "lr": schedule(state.step),
            "shift": sums["shift"] / A,
        }
        return new_state, metrics

    return step


def make_eval_step(config: ModelConfig, cfg: LongSpecTrainConfig, vocab_ids=None):
    """`(draft_params, target_params, batch, shift) -> sums` over every micro-batch (no update)."""
    vocab_ids = None if vocab_ids is None else jnp.asarray(vocab_ids, jnp.int32)

    def evaluate(draft_params, target_params, batch, shift):
        def one(carry, micro):
            sums = micro_losses(draft_params, target_params, config, cfg, micro, shift, vocab_ids)
            return jax.tree.map(jnp.add, carry, sums), None

        zeros = {k: jnp.zeros((), jnp.float32) for k in ("ce", "distill", "correct", "weight", "distill_weight")}
        return jax.lax.scan(one, zeros, batch)[0]

    return evaluate
