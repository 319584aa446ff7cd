"""Turning logits into tokens: temperature, top-k, top-p, min-p; greedy at temperature 0.

`processed_logprobs` is the single definition of "the target's distribution"
used by AR sampling and by speculative verification alike, which is what makes
speculative sampling match AR sampling exactly.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lsjax.config import SamplingConfig


def processed_logprobs(logits: jax.Array, cfg: SamplingConfig) -> jax.Array:
    """logits [..., V] -> log-probabilities [..., V] after temperature, top-k, top-p, min-p (fp32).

    Filtered tokens get -inf. At temperature 0 this is a one-hot on the argmax.
    """
    logits = logits.astype(jnp.float32)
    if cfg.greedy:
        return jnp.where(jax.nn.one_hot(jnp.argmax(logits, -1), logits.shape[-1], dtype=bool), 0.0, -jnp.inf)
    logits = logits / cfg.temperature
    if cfg.top_k > 0 and cfg.top_k < logits.shape[-1]:
        kth = jax.lax.top_k(logits, cfg.top_k)[0][..., -1:]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    if cfg.top_p < 1.0:
        logp = jax.nn.log_softmax(logits, -1)
        sorted_logp = jnp.sort(logp, axis=-1)[..., ::-1]
        # Keep the smallest prefix whose mass reaches top_p: a token stays if the mass before it is < top_p.
        mass_before = jnp.cumsum(jnp.exp(sorted_logp), axis=-1) - jnp.exp(sorted_logp)
        keep_sorted = mass_before < cfg.top_p
        cutoff = jnp.min(jnp.where(keep_sorted, sorted_logp, jnp.inf), axis=-1, keepdims=True)
        logits = jnp.where(logp < cutoff, -jnp.inf, logits)
    if cfg.min_p > 0.0:
        logp = jax.nn.log_softmax(logits, -1)
        threshold = jnp.max(logp, -1, keepdims=True) + jnp.log(cfg.min_p)
        logits = jnp.where(logp < threshold, -jnp.inf, logits)
    return jax.nn.log_softmax(logits, -1)


def sample(key: jax.Array, logits: jax.Array, cfg: SamplingConfig) -> jax.Array:
    """logits [..., V] -> tokens [...] int32 (argmax at temperature 0)."""
    if cfg.greedy:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    return jax.random.categorical(key, processed_logprobs(logits, cfg), axis=-1).astype(jnp.int32)
