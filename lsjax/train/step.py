"""The optimizer and the two halves of every trainer's step.

    grads, sums = accumulate_grads(loss_fn, state.params, micro_batches, zero_sums)   # summed over micro-batches
    state = apply_grads(state, grads, optimizer)                                      # one optimizer update

A kind's whole step (its loss over a batch's micro-batches, then these two) lives in its method's folder.
Gradients of all micro-batches are summed (each micro-batch's loss is already divided by the step's total loss
weight), then one clipped AdamW update.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax

from lsjax.train.config import OptimConfig


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TrainState:
    step: jax.Array  # int32 scalar: optimizer steps taken
    params: dict  # the draft's (the target is frozen and passed separately)
    opt_state: Any


# ----------------------------------------------------------------------------- optimizer


def lr_schedule(optim: OptimConfig) -> optax.Schedule:
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=optim.lr,
        warmup_steps=optim.warmup_steps,
        decay_steps=optim.total_steps,
        end_value=optim.lr * optim.min_lr_ratio,
    )


def _decay_mask(params):
    # Norm gains (1-D) are not decayed: pulling them towards 0 only fights the normalisation.
    return jax.tree.map(lambda p: p.ndim >= 2, params)


def make_optimizer(optim: OptimConfig) -> optax.GradientTransformation:
    adamw = optax.adamw(
        lr_schedule(optim), b1=optim.b1, b2=optim.b2, eps=optim.eps, weight_decay=optim.weight_decay, mask=_decay_mask
    )
    if optim.clip_norm > 0:
        return optax.chain(optax.clip_by_global_norm(optim.clip_norm), adamw)
    return adamw


def init_state(draft_params: dict, optimizer: optax.GradientTransformation) -> TrainState:
    return TrainState(jnp.zeros((), jnp.int32), draft_params, optimizer.init(draft_params))


def accumulate_grads(loss_fn, params, micro_batches, zero_sums):
    """(grads, sums): the gradients of `loss_fn(params, micro) -> (loss, sums)` w.r.t. `params` and its aux
    `sums`, each summed over the micro-batches (the leading axis of every leaf of `micro_batches`) under
    `lax.scan`, so only one micro-batch's activations are alive at a time. `zero_sums` are the sums' zeros
    (their shapes). Each micro-batch's loss must already be normalised for the whole step."""

    def one(carry, micro):
        grads_acc, sums_acc = carry
        (_, sums), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, micro)
        return (jax.tree.map(jnp.add, grads_acc, grads), jax.tree.map(jnp.add, sums_acc, sums)), None

    (grads, sums), _ = jax.lax.scan(one, (jax.tree.map(jnp.zeros_like, params), zero_sums), micro_batches)
    return grads, sums


def apply_grads(state: TrainState, grads, optimizer: optax.GradientTransformation) -> TrainState:
    """One optimizer update of `state.params` with `grads`; the step count advances."""
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    return TrainState(state.step + 1, optax.apply_updates(state.params, updates), opt_state)
