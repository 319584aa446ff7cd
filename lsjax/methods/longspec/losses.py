"""The draft's training losses: next-token cross-entropy and distillation, LM head in chunks.

Per micro-batch: positions from the batch's offsets (anchor-offset indices, or plain when the offset is 0)
for target and draft alike; the target's last-layer K/V (cached or computed live); the draft's hidden states
at the flash-noisy lag `shift`; the LM-head losses in chunks of positions under `jax.checkpoint`, so neither
the forward nor the backward holds [B, T, V] logits.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lsjax.config import ModelConfig
from lsjax.methods.longspec.model import LongSpecDraft
from lsjax.methods.longspec.train_config import LongSpecTrainConfig
from lsjax.train.feature_cache import rope_keys
from lsjax.train.features import positions_from_offsets, target_features, target_logits
from lsjax.vocab import vocab_index


def lm_losses(
    draft_params: dict,
    target_params: dict,
    config: ModelConfig,
    hidden: jax.Array,
    labels: jax.Array,
    weights: jax.Array,
    *,
    chunk_size: int,
    vocab_ids: jax.Array | None = None,
    distill: str = "none",
    target_hidden: jax.Array | None = None,
    target_labels: jax.Array | None = None,
    distill_weights: jax.Array | None = None,
    model: LongSpecDraft | None = None,
) -> dict:
    """Weighted sums over positions, chunk by chunk: {"ce", "distill", "correct", "weight", "distill_weight"}
    (scalars).

    hidden [B, T, D] (the draft's, before its final norm); labels [B, T] the next tokens; weights [B, T].
    With `vocab_ids` [Vd] the logits cover only those tokens and labels outside them get weight 0.
    distill "argmax": CE on `target_labels` [B, T] (or the argmax of the target's logits from
    `target_hidden`); "kl": KL(target || draft) from `target_hidden` [B, T, D] (over the pruned vocabulary,
    renormalised, when pruned), weighed by `distill_weights` [B, T] (default: `weights`; a data label outside a
    pruned vocabulary does not remove a position from it, a target argmax outside it does). Each chunk's
    [B, C, V] logits are rematerialised in the backward pass. The logits are `model`'s (`logits` of the draft
    module whose params `draft_params` are; default `LongSpecDraft(config)`).
    """
    model = LongSpecDraft(config) if model is None else model
    B, T, D = hidden.shape
    C = min(chunk_size, T)
    n = -(-T // C)
    pad = n * C - T
    index = vocab_index(vocab_ids, config.vocab_size)
    head_ids = None if vocab_ids is None else jnp.asarray(vocab_ids, jnp.int32)

    def chunked(x, fill=0):  # [B, T, ...] -> [n, B, C, ...]
        x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2), constant_values=fill)
        return x.reshape(B, n, C, *x.shape[2:]).swapaxes(0, 1)

    own = distill_weights is not None
    xs = {"h": chunked(hidden), "y": chunked(labels), "w": chunked(weights)}
    if own:
        xs["dw"] = chunked(distill_weights)
    if distill == "kl" or (distill == "argmax" and target_labels is None):
        if target_hidden is None:
            raise ValueError(f"distill={distill!r} needs target_hidden")
        xs["th"] = chunked(target_hidden)
    if distill == "argmax" and target_labels is not None:
        xs["ty"] = chunked(target_labels)

    def to_local(y):  # full-vocab ids -> pruned indices (-1 when outside)
        return y if index is None else index[y]

    def ce(logp, y, w):
        ok = y >= 0
        picked = jnp.take_along_axis(logp, jnp.maximum(y, 0)[..., None], axis=-1)[..., 0]
        w = w * ok
        return -jnp.sum(picked * w), w

    @jax.checkpoint
    def chunk(c):
        logits = model.apply({"params": draft_params}, target_params, c["h"], head_ids, method="logits")  # [B, C, V]
        logp = jax.nn.log_softmax(logits, axis=-1)
        y = to_local(c["y"])
        ce_sum, w = ce(logp, y, c["w"])
        correct = jnp.sum((jnp.argmax(logits, axis=-1) == y) * w)
        dw = c["dw"] if own else c["w"]
        out = {"ce": ce_sum, "correct": correct, "weight": jnp.sum(w), "distill": jnp.zeros(())}
        out["distill_weight"] = jnp.sum(dw) if own else out["weight"]
        if distill == "argmax":
            if "ty" in c:
                ty = to_local(c["ty"])
            else:  # the target's own argmax over the full vocabulary, then mapped into the pruned one
                ty = to_local(jnp.argmax(target_logits(target_params, config, c["th"], None), axis=-1))
            out["distill"], dsum = ce(logp, ty, dw)
            out["distill_weight"] = jnp.sum(dsum)  # an argmax outside the pruned vocabulary teaches nothing
        elif distill == "kl":
            tlogp = jax.nn.log_softmax(target_logits(target_params, config, c["th"], head_ids), axis=-1)
            kl = jnp.sum(jnp.exp(tlogp) * (tlogp - logp), axis=-1)  # [B, C]
            out["distill"] = jnp.sum(kl * dw)
        return out

    per_chunk = jax.lax.map(chunk, xs)
    return jax.tree.map(lambda a: jnp.sum(a, axis=0), per_chunk)


def dense_lm_losses(draft_params, target_params, config, hidden, labels, weights, *, vocab_ids=None) -> dict:
    """Reference for `lm_losses` (CE only) with full [B, T, V] logits: tests compare the two."""
    head_ids = None if vocab_ids is None else jnp.asarray(vocab_ids, jnp.int32)
    logits = LongSpecDraft(config).apply({"params": draft_params}, target_params, hidden, head_ids, method="logits")
    logp = jax.nn.log_softmax(logits, axis=-1)
    if vocab_ids is not None:
        labels = vocab_index(vocab_ids, config.vocab_size)[labels]
    ok = labels >= 0
    picked = jnp.take_along_axis(logp, jnp.maximum(labels, 0)[..., None], axis=-1)[..., 0]
    w = weights * ok
    return {"ce": -jnp.sum(picked * w), "weight": jnp.sum(w)}


def next_token_targets(tokens: jax.Array, loss_mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Position t predicts token t + 1: labels [B, T] and weights [B, T] (the last position has none)."""
    labels = jnp.concatenate([tokens[:, 1:], jnp.zeros_like(tokens[:, :1])], axis=1)
    weights = jnp.concatenate([loss_mask[:, 1:], jnp.zeros_like(loss_mask[:, :1])], axis=1)
    return labels, weights.astype(jnp.float32)


def text_weights(loss_mask: jax.Array) -> jax.Array:
    """[..., T] next-token weights over a row's text: position t weighs 1 when token t + 1 is at or before the
    row's last training target (`LossConfig.distill_on` "text": the prompt too, not the padding after)."""
    text = jnp.flip(jnp.cumsum(jnp.flip(loss_mask > 0, -1), -1), -1) > 0
    return jnp.concatenate([text[..., 1:], jnp.zeros_like(text[..., :1])], axis=-1).astype(jnp.float32)


def micro_losses(
    draft_params: dict,
    target_params: dict,
    config: ModelConfig,
    cfg: LongSpecTrainConfig,
    micro: dict,
    shift: jax.Array,
    vocab_ids: jax.Array | None = None,
) -> dict:
    """Loss sums of one micro-batch (tokens [B, T] ...) at lag `shift`."""
    tokens = micro["tokens"]
    T = tokens.shape[1]
    positions = positions_from_offsets(T, micro["offset"], cfg.positions.num_anchors)
    distill = cfg.loss.distill
    if "target_k_raw" in micro:  # the shared feature cache: pre-RoPE keys, float16
        tk = rope_keys(micro["target_k_raw"], positions, config)
        tv = micro["target_v"].astype(jnp.float32)
        th = micro["target_hidden"].astype(jnp.float32) if "target_hidden" in micro else None
    elif "target_k" in micro:
        tk, tv, th = micro["target_k"], micro["target_v"], micro.get("target_hidden")
    else:
        feats = target_features(target_params, config, tokens, positions)
        tk, tv, th = feats["k"], feats["v"], feats["hidden"]
    target_labels = micro.get("target_argmax")  # cached: position t's argmax is the target's guess for t + 1
    model = LongSpecDraft(config, cfg.draft)
    hidden = model.apply(
        {"params": draft_params}, target_params, tokens, positions, tk, tv, shift, method="forward_train"
    )
    labels, weights = next_token_targets(tokens, micro["loss_mask"])
    return lm_losses(
        draft_params,
        target_params,
        config,
        hidden,
        labels,
        weights,
        chunk_size=cfg.loss.chunk_size,
        vocab_ids=vocab_ids,
        distill=distill,
        target_hidden=None if distill == "none" else th,
        target_labels=target_labels if distill == "argmax" else None,
        distill_weights=text_weights(micro["loss_mask"]) if cfg.loss.distill_on == "text" else None,
        model=model,
    )
