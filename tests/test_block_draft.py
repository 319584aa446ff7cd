"""The block-parallel draft model (lsjax.methods.dels.model): one forward == s separate reference forwards,
and training == drafting at the same anchor."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lsjax.cache import RingCache, ring_write
from lsjax.config import DraftConfig
from lsjax.methods.dels import model as bd
from lsjax.methods.longspec.model import draft_self_kv
from lsjax.train.features import target_features
from tests.tiny import tiny_model

hidden = jax.jit(bd.block_hidden, static_argnames=("config", "block_size", "backend"))
write = jax.jit(ring_write)


def block_params(config, params, seed=0):
    p = bd.init_block_params(config, DraftConfig(window=8, init_head_scale=1.0), params)
    p["mask_embed"] = jax.random.normal(jax.random.key(seed), p["mask_embed"].shape) * 0.3
    return p


@pytest.mark.parametrize("s", [pytest.param(8, marks=pytest.mark.slow), 3])
def test_block_logits_equal_separate_reference_forwards(s):
    """Each of the s outputs of the one block forward equals position j computed on its own (numpy float64)
    over the filled ring slots, the whole block and the target's committed keys [0, n)."""
    config, params = tiny_model()
    dp = block_params(config, params)
    B, K, H, S, W = 2, config.num_kv_heads, config.head_dim, 40, 8
    keys = jax.random.split(jax.random.key(1), 4)
    n = jnp.array([17, 5], jnp.int32)
    tk = jax.random.normal(keys[0], (B, K, S, H))
    tv = jax.random.normal(keys[1], (B, K, S, H))
    ring = RingCache.zeros(config, B, W)
    ring = write(
        ring,
        jax.random.normal(keys[2], (B, W, K, H)),
        jax.random.normal(keys[3], (B, W, K, H)),
        jnp.zeros((B,), jnp.int32),
        jnp.array([W, 5], jnp.int32),  # row 1: a partly filled ring
    )
    root = jnp.array([11, 42], jnp.int32)
    got = np.asarray(hidden(dp, params, config, s, root, n, ring, tk, tv, n, backend="xla"))
    assert got.shape == (B, s, config.hidden_size)
    for b in range(B):
        filled = int(ring.lengths[b])
        for j in range(1, s + 1):
            ref = bd.reference_position(
                dp,
                params,
                config,
                int(root[b]),
                int(n[b]),
                j,
                ring.k[b, :, :filled],
                ring.v[b, :, :filled],
                tk[b, :, : int(n[b])],
                tv[b, :, : int(n[b])],
                s,
            )
            np.testing.assert_allclose(got[b, j - 1], ref, rtol=2e-4, atol=2e-4)


def test_training_forward_equals_drafting_at_the_anchor():
    """block_hidden_train's block at anchor a == block_hidden at n = a with the ring holding the draft K/V of
    tokens [a - W, a) and the target cache holding the target's keys of tokens [0, a)."""
    config, params = tiny_model()
    dp = block_params(config, params, seed=2)
    dcfg = DraftConfig(window=8)
    s, T = 4, 40
    tokens = jax.random.randint(jax.random.key(3), (2, T), 0, config.vocab_size)
    anchors = jnp.array([[3, 20, 30], [9, 12, 35]], jnp.int32)
    pos = jnp.broadcast_to(jnp.arange(T)[None], (2, T))
    feats = target_features(params, config, tokens, pos)  # k RoPE'd at 0..T-1, [B, K, T, H]
    train = np.asarray(bd.block_hidden_train(dp, params, config, dcfg, s, tokens, anchors, feats["k"], feats["v"]))
    assert train.shape == (2, 3, s, config.hidden_size)
    k_all, v_all = draft_self_kv(dp, params, config, tokens, pos)
    for b in range(2):
        for i in range(3):
            a = int(anchors[b, i])
            # Writing positions [0, a) keeps the last W of them: the ring drafting at n = a holds.
            ring = write(
                RingCache.zeros(config, 1, dcfg.window), k_all[b : b + 1], v_all[b : b + 1], jnp.zeros(1, jnp.int32),
                jnp.array([a]),
            )  # fmt: skip
            got = hidden(
                dp, params, config, s, tokens[b : b + 1, a], jnp.array([a]), ring,
                feats["k"][b : b + 1], feats["v"][b : b + 1], jnp.array([a]), backend="xla",
            )  # fmt: skip
            np.testing.assert_allclose(train[b, i], np.asarray(got[0]), rtol=2e-4, atol=2e-4)
