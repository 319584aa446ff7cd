"""DeLS-Spec's local head and unigram prior (lsjax.methods.dels.local_head) against a float64 numpy reference."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lsjax.config import ConfigError, LocalHeadConfig
from lsjax.methods.dels import local_head as lh

V, D = 53, 12


def setup(kind, seed=0):
    cfg = LocalHeadConfig(kind=kind, hidden=16, rank=8, block_size=6)
    embed = jax.random.normal(jax.random.key(seed), (V, D)) * 0.5
    params = lh.init_params(cfg, D, jax.random.key(seed + 1), embed_rms=0.5)
    params["w_out"] = params["w_out"] * 20  # peakier logits: a wrong gate or index shows up clearly
    return cfg, embed, params


@pytest.mark.parametrize("kind", ["gru", "markov"])
def test_head_matches_numpy_reference(kind):
    cfg, embed, params = setup(kind)
    blocks = jax.random.randint(jax.random.key(5), (3, cfg.block_size), 0, V)
    got = np.asarray(lh.logits(params, embed, lh.block_states(params, cfg, embed, blocks)))
    for b in range(3):
        ref = lh.reference_block_logits(params, cfg, np.asarray(embed), np.asarray(blocks[b]))
        np.testing.assert_allclose(got[b], ref, rtol=1e-4, atol=1e-4)
    assert np.abs(got).max() > 1.0  # not a trivially small output


@pytest.mark.parametrize("kind", ["gru", "markov"])
def test_step_by_step_equals_block_and_vocab_table(kind):
    """The drafting path (one token at a time, from a zero state; the folded [V, rank] table, pruned rows)
    equals the training path."""
    cfg, embed, params = setup(kind, seed=2)
    blocks = jax.random.randint(jax.random.key(6), (2, cfg.block_size), 0, V)
    r_block = lh.block_states(params, cfg, embed, blocks)
    state = lh.init_state(cfg, (2,))
    rows = jnp.asarray([0, 7, 9, 30, 52])
    table = lh.vocab_table(params, embed, rows)
    for j in range(cfg.block_size):
        state, r = lh.step(params, cfg, embed, state, blocks[:, j])
        np.testing.assert_allclose(np.asarray(r), np.asarray(r_block[:, j]), rtol=1e-5, atol=1e-6)
        full = lh.logits(params, embed, r)
        np.testing.assert_allclose(np.asarray(r @ table.T), np.asarray(full[:, rows]), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(np.asarray(lh.logits(params, embed, r, rows)), np.asarray(full[:, rows]), atol=1e-5)


@pytest.mark.parametrize("kind", ["gru", "markov"])
def test_head_never_sees_tokens_before_the_block_start(kind):
    """Two sequences that differ only before a block start give that block the same outputs; a change
    inside the block changes the outputs from that position on only."""
    cfg, embed, params = setup(kind, seed=3)
    s = cfg.block_size
    seq = np.asarray(jax.random.randint(jax.random.key(7), (4 * s,), 0, V))
    other = seq.copy()
    other[: 2 * s] = (other[: 2 * s] + 11) % V  # everything before block 2
    r1 = lh.block_states(params, cfg, embed, jnp.asarray(seq.reshape(4, s)))
    r2 = lh.block_states(params, cfg, embed, jnp.asarray(other.reshape(4, s)))
    np.testing.assert_array_equal(np.asarray(r1[2:]), np.asarray(r2[2:]))
    assert not np.allclose(np.asarray(r1[:2]), np.asarray(r2[:2]))
    inside = seq.copy()
    inside[2 * s + 3] = (inside[2 * s + 3] + 1) % V
    r3 = lh.block_states(params, cfg, embed, jnp.asarray(inside.reshape(4, s)))
    np.testing.assert_array_equal(np.asarray(r3[2, :3]), np.asarray(r1[2, :3]))
    assert not np.allclose(np.asarray(r3[2, 3]), np.asarray(r1[2, 3]))


def test_unigram_prior_is_add_lambda_over_loss_tokens():
    tokens = np.array([[1, 1, 2, 4], [4, 4, 0, 3]])
    mask = np.array([[1, 1, 0, 1], [1, 0, 1, 0]])
    got = lh.unigram_logprior(tokens, mask, 6, lam=1.0)
    counts = np.array([1, 2, 0, 0, 2, 0])  # tokens 1, 1, 4, 4, 0 carry loss
    np.testing.assert_allclose(got, np.log((counts + 1) / (counts.sum() + 6)), rtol=1e-6)
    np.testing.assert_allclose(np.exp(got).sum(), 1.0, rtol=1e-6)
    half = lh.unigram_logprior(tokens, None, 6, lam=0.5)
    counts = np.bincount(tokens.ravel(), minlength=6)
    np.testing.assert_allclose(half, np.log((counts + 0.5) / (counts.sum() + 3)), rtol=1e-6)


def test_config_and_param_checks():
    with pytest.raises(ConfigError, match="local_head.kind"):
        LocalHeadConfig(kind="lstm")
    with pytest.raises(ConfigError, match="local_head.block_size"):
        LocalHeadConfig(block_size=1)
    cfg, _, params = setup("gru")
    assert lh.check_params(params, cfg, D) is None
    assert "w_hh" in lh.check_params({k: v for k, v in params.items() if k != "w_hh"}, cfg, D)
    assert "shape" in lh.check_params(params, cfg, D + 1)
