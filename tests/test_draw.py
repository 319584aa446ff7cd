"""`lsjax.sampling.draw`: the two-level inverse-CDF draw every T > 0 path uses (AR sampling, the target's draw
at each tree node, the residual and bonus draws of rejection sampling) samples exactly the given distribution
across block boundaries, never draws a zero-weight token, and the test rejects a slightly wrong sampler."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from lsjax.sampling import categorical, draw, draw_at

V = 700  # three blocks of 256, the last one partial
N = 200_000
CHUNK = 25_000


def weights() -> np.ndarray:
    """Mass in every block, a whole empty block-sized run, zeros between and at both block edges."""
    rng = np.random.default_rng(0)
    w = rng.gamma(0.3, size=V)
    w[rng.random(V) < 0.4] = 0.0
    w[300:560] = 0.0  # a zero run longer than a block
    w[[0, 255, 256, 511, 512, V - 1]] = [0.0, 2.0, 0.0, 0.0, 1.5, 0.7]
    return w / w.sum()


@functools.partial(jax.jit, static_argnames=("n", "block"))
def _draws(key, w, n: int, block: int):
    return draw(key, jnp.broadcast_to(w, (n, w.shape[-1])), block)


def sample_counts(w: np.ndarray, n: int = N, block: int = 256, seed: int = 0) -> np.ndarray:
    counts = np.zeros(len(w), np.int64)
    for i in range(n // CHUNK):
        toks = _draws(jax.random.key(seed * 1000 + i), jnp.asarray(w, jnp.float32), CHUNK, block)
        counts += np.bincount(np.asarray(toks), minlength=len(w))
    return counts


def pvalue(counts: np.ndarray, p: np.ndarray) -> float:
    """Chi-square over the cells with expected count >= 5 (the rest pooled); a sampled zero cell fails."""
    assert counts[p == 0].sum() == 0, "a zero-weight token was drawn"
    exp = p * counts.sum()
    big = exp >= 5
    obs = np.append(counts[big], counts[~big].sum())
    ex = np.append(exp[big], exp[~big].sum())
    return stats.chisquare(obs, ex * obs.sum() / ex.sum()).pvalue


@pytest.mark.parametrize("block", [256, 64, 7])
def test_draw_matches_the_distribution(block):
    w = weights()
    assert pvalue(sample_counts(w, block=block), w) > 1e-4


def test_the_test_rejects_a_slightly_wrong_sampler():
    w = weights()
    counts = sample_counts(w)
    # The same draws judged against a law with 10% of token 255's mass moved to token 512: rejected.
    shifted = w.copy()
    shifted[255] -= 0.1 * w[255]
    shifted[512] += 0.1 * w[255]
    assert pvalue(counts, shifted) < 1e-4


def test_unnormalised_weights_and_leading_dims():
    w = jnp.asarray(weights(), jnp.float32)
    keys = jax.random.split(jax.random.key(1), 4)
    a = jax.vmap(lambda k: draw(k, jnp.broadcast_to(w, (2, 3, V))))(keys)
    b = jax.vmap(lambda k: draw(k, 1e-20 * jnp.broadcast_to(w, (2, 3, V))))(keys)
    assert a.shape == (4, 2, 3) and a.dtype == jnp.int32
    np.testing.assert_array_equal(a, b)  # scale-free: only the ratios matter


@pytest.mark.parametrize("token", [0, 1, 255, 256, 511, 512, V - 1])
def test_a_point_mass_is_always_drawn(token):
    w = np.zeros(V, np.float32)
    w[token] = 1.0
    toks = _draws(jax.random.key(token), jnp.asarray(w), 4096, 256)
    assert np.all(np.asarray(toks) == token)


def test_tiny_masses_next_to_zeros_are_never_rounded_onto_a_zero():
    # Weights that rounding in a cumulative sum would lose: the draw must still land on a positive one.
    w = np.zeros(V, np.float32)
    w[[3, 200, 256 + 100]] = [1.0, 1e-30, 1e-38]
    toks = np.asarray(_draws(jax.random.key(5), jnp.asarray(w), 20_000, 256))
    assert set(np.unique(toks)) <= {3, 200, 356}


def test_categorical_takes_log_probabilities_with_minus_inf():
    p = weights()
    logp = np.where(p > 0, np.log(np.maximum(p, 1e-300)), -np.inf).astype(np.float32)
    toks = jax.jit(lambda k: categorical(k, jnp.broadcast_to(jnp.asarray(logp), (CHUNK, V))))(jax.random.key(9))
    counts = np.bincount(np.asarray(toks), minlength=V)
    assert pvalue(counts, p) > 1e-4


@pytest.mark.parametrize("u", [0.0, 1.0 - 2.0**-24])
def test_the_ends_of_the_uniform_range_land_on_positive_weights(u):
    # Mass only in the middle block, a total that is not a power of two: u * total can round up to the total.
    w = np.zeros(V, np.float32)
    w[[256, 300, 400]] = [0.0, 0.3, 0.7]
    w[[257, 511]] = [1.0 / 3.0, 0.0]
    tok = int(draw_at(jnp.float32(u), jnp.asarray(w)))
    assert w[tok] > 0
    assert tok == (257 if u == 0.0 else 400)
