"""Rotary position embeddings: inverse frequencies (default, linear, llama3) and their application.

Positions are arrays (never static), so anchor-offset indices, tree depths and
cache offsets all flow through the same code without recompiling.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from lsjax.config import ModelConfig


def inverse_frequencies(config: ModelConfig) -> np.ndarray:
    """[H // 2] float32 inverse frequencies, computed in float32 as HF does."""
    H = config.head_dim
    exponents = np.arange(0, H, 2, dtype=np.int64).astype(np.float32) / np.float32(H)
    inv_freq = (np.float32(1.0) / (np.float32(config.rope_theta) ** exponents)).astype(np.float32)
    rs = config.rope_scaling
    if rs.kind == "linear":
        inv_freq = inv_freq / np.float32(rs.factor)
    elif rs.kind == "llama3":
        # Long wavelengths are slowed by `factor`, short ones kept, the band between interpolated.
        low_wavelen = rs.original_max_position / rs.low_freq_factor
        high_wavelen = rs.original_max_position / rs.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = np.where(wavelen > low_wavelen, inv_freq / rs.factor, inv_freq)
        smooth = (rs.original_max_position / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor)
        smoothed = (1 - smooth) * scaled / rs.factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        inv_freq = np.where(medium, smoothed, scaled).astype(np.float32)
    return inv_freq


def rope_angles(positions: jax.Array, inv_freq: np.ndarray) -> tuple[jax.Array, jax.Array]:
    """positions [B, T] int -> (cos, sin) [B, T, H] in float32 (HF's cat(freqs, freqs) layout)."""
    freqs = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)  # [B, T, H/2]
    emb = jnp.concatenate([freqs, freqs], axis=-1)  # [B, T, H]
    return jnp.cos(emb), jnp.sin(emb)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x [B, T, N, H] rotated by (cos, sin) [B, T, H] with the rotate-half convention."""
    half = x.shape[-1] // 2
    xf = x.astype(jnp.float32)
    rotated = jnp.concatenate([-xf[..., half:], xf[..., :half]], axis=-1)
    out = xf * cos[:, :, None, :] + rotated * sin[:, :, None, :]
    return out.astype(x.dtype)


def anchor_offset_positions(seq_len: int, offset: jax.Array, num_anchors: int = 4) -> jax.Array:
    """LongSpec's anchor-offset indices: [0..3] stay, later positions shift by `offset` ([B] or scalar)."""
    base = jnp.arange(seq_len, dtype=jnp.int32)
    offset = jnp.asarray(offset, jnp.int32)
    shift = jnp.where(base >= num_anchors, offset[..., None], 0)  # [T] or [B, T]
    return base + shift
