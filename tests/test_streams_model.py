"""Speculative Streaming's MSA layers: multi-stream attention against a naive reference, the main stream left
untouched, and the decode-time streams (cache + tree) equal to the training-time ones (one causal pass)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lsjax.cache import KVCache
from lsjax.config import ConfigError
from lsjax.engine.verify import tapped_tree_forward
from lsjax.methods.streams import model as ss
from lsjax.models import target
from lsjax.tree import TreeConfig, chain_parents, make_tree
from tests.tiny import tiny_model


def naive_msa(q, cache_k, cache_v, lengths, tree_k, tree_v, mask, stream_k=None, stream_v=None):
    """Loops: stream j of node t, head n, over exactly the keys it may see (numpy, float64)."""
    q, cache_k, cache_v, tree_k, tree_v = (np.asarray(a, np.float64) for a in (q, cache_k, cache_v, tree_k, tree_v))
    B, T, S, N, H = q.shape
    K = tree_k.shape[2]
    out = np.zeros_like(q)
    for b in range(B):
        for t in range(T):
            for j in range(S):
                for n in range(N):
                    kv = n // (N // K)
                    keys = [cache_k[b, kv, : lengths[b]]]
                    vals = [cache_v[b, kv, : lengths[b]]]
                    anc = np.asarray(mask[b, t])
                    keys.append(tree_k[b, anc, kv])
                    vals.append(tree_v[b, anc, kv])
                    if stream_k is not None:
                        keys.append(np.asarray(stream_k, np.float64)[b, t, : j + 1, kv])
                        vals.append(np.asarray(stream_v, np.float64)[b, t, : j + 1, kv])
                    keys, vals = np.concatenate(keys), np.concatenate(vals)
                    s = keys @ q[b, t, j, n] / np.sqrt(H)
                    p = np.exp(s - s.max())
                    out[b, t, j, n] = (p / p.sum()) @ vals
    return out


@pytest.mark.parametrize("with_streams", [False, True], ids=["main-only", "eq2"])
def test_msa_attention_matches_naive(with_streams):
    B, T, S, N, K, H, C = 2, 5, 3, 6, 2, 8, 11
    ks = jax.random.split(jax.random.key(0), 8)
    q = jax.random.normal(ks[0], (B, T, S, N, H))
    cache_k = jax.random.normal(ks[1], (3, B, K, C, H))  # three layers; layer 1 is read
    cache_v = jax.random.normal(ks[2], (3, B, K, C, H))
    tree_k = jax.random.normal(ks[3], (B, T, K, H))
    tree_v = jax.random.normal(ks[4], (B, T, K, H))
    parents = np.array([[-1, 0, 0, 1, 2], [-1, 0, 1, 2, 3]], np.int32)
    tree = make_tree(jnp.zeros((B, T), jnp.int32), jnp.asarray(parents), jnp.ones((B, T), bool), TreeConfig((2, 1, 1)))
    lengths = jnp.array([7, 3], jnp.int32)
    skv = (jax.random.normal(ks[5], (B, T, S, K, H)), jax.random.normal(ks[6], (B, T, S, K, H)))
    extra = skv if with_streams else None
    got = jax.jit(lambda *a: ss.msa_attention(a[0], ("tree", *a[1:4], 1, *a[4:7]), a[7]))(
        q, cache_k, cache_v, lengths, tree_k, tree_v, tree.mask, extra
    )
    want = naive_msa(
        q, cache_k[1], cache_v[1], np.asarray(lengths), tree_k, tree_v, tree.mask, *(skv if with_streams else ())
    )
    np.testing.assert_allclose(np.asarray(got), want, atol=2e-5)
    # The training form (explicit keys under a mask) agrees on a cache-free causal chain.
    chain = make_tree(
        jnp.zeros((B, T), jnp.int32),
        jnp.asarray(np.tile(chain_parents(T), (B, 1))),
        jnp.ones((B, T), bool),
        TreeConfig((1,) * (T - 1)),
    )
    got = jax.jit(lambda q, k, v, m, e: ss.msa_attention(q, ("keys", k, v, m), e))(q, tree_k, tree_v, chain.mask, extra)
    none = np.zeros((B, K, 0, H))
    want = naive_msa(q, none, none, np.zeros(B, int), tree_k, tree_v, chain.mask, *(skv if with_streams else ()))
    np.testing.assert_allclose(np.asarray(got), want, atol=2e-5)


def small_target():
    """tests.tiny's model with 4 layers and a moderate init (logits O(1), so 1e-5 is a strict tolerance)."""
    config, _ = tiny_model()
    config = dataclasses.replace(config, num_layers=4)
    return config, target.init_params(config, jax.random.key(5), scale=0.1)


SCFG = ss.StreamsConfig(num_streams=3, msa_layers=2, rank=4)


def trained_like_params(config, scfg, seed=1):
    """Random stream params with non-zero adapters (zero-init adapters would hide adapter bugs)."""
    p = ss.init_params(config, scfg, jax.random.key(seed), scale=0.3)
    k1, k2 = jax.random.split(jax.random.key(seed + 1))
    p["adapter_up"] = 0.3 * jax.random.normal(k1, p["adapter_up"].shape)
    p["exit_up"] = 0.3 * jax.random.normal(k2, p["exit_up"].shape)
    return p


def _prefix_cache(config, params, toks, n, capacity=32):
    B = toks.shape[0]
    pos = jnp.broadcast_to(jnp.arange(n), (B, n))
    _, cache = target.forward(params, config, toks[:, :n], pos, KVCache.zeros(config, B, capacity))
    return cache


def _training_streams(sp, params, config, scfg, toks):
    """One causal pass: layers below L, the main stream's top layers, the streams at every position."""
    B, T = toks.shape
    L = scfg.first_layer(config)
    pos = jnp.broadcast_to(jnp.arange(T), (B, T))
    mid, _, _ = target.forward_hidden(params, config, toks, pos, KVCache.zeros(config, B, 0), layers=(0, L))
    hidden, k, v = ss.main_top_layers(params, config, scfg, mid, pos)
    s = ss.stream_hidden(sp, params, config, scfg, mid, pos, ss.causal_main_kv(k, v, pos, L))
    return hidden, s


def _decode_streams(sp, params, config, scfg, toks, n):
    """The same tokens as a committed prefix of n plus a chain tree of the rest, through the verify tap."""
    B, T = toks.shape
    cache = _prefix_cache(config, params, toks, n)
    tc = TreeConfig((1,) * (T - n - 1))
    tree = make_tree(toks[:, n:], jnp.asarray(np.tile(chain_parents(T - n), (B, 1))), jnp.ones((B, T - n), bool), tc)
    _, hidden, logits, _, _, taps = tapped_tree_forward(params, config, tree, cache, scfg.first_layer(config))
    s = ss.stream_hidden(sp, params, config, scfg, taps.mid_hidden, taps.positions, ss.tree_main_kv(taps, tree.mask))
    return logits, s


@pytest.mark.slow  # streams equal AR in tests/test_streams_drafter.py
@pytest.mark.parametrize(
    "prepared", [pytest.param(False, marks=pytest.mark.slow, id="stacked"), pytest.param(True, id="decode-layout")]
)
def test_decode_streams_equal_training_streams_and_main_is_untouched(prepared):
    config, params = small_target()
    sp = trained_like_params(config, SCFG)
    toks = jax.random.randint(jax.random.key(2), (2, 12), 3, config.vocab_size)
    n = 7
    hidden, s_train = jax.jit(_training_streams, static_argnums=(2, 3))(sp, params, config, SCFG, toks)
    hidden_lm = jax.jit(target.lm_head, static_argnums=1)(params, config, hidden)
    p = target.prepare_for_decode(params, config) if prepared else params
    logits, s_dec = jax.jit(_decode_streams, static_argnums=(2, 3, 5))(sp, p, config, SCFG, toks, n)
    # Lossless mode: with the streams running, the main stream's logits are the plain target's.
    pos = jnp.broadcast_to(jnp.arange(12), (2, 12))
    plain, _ = jax.jit(target.forward, static_argnums=1)(params, config, toks, pos, KVCache.zeros(config, 2, 16))
    np.testing.assert_allclose(np.asarray(logits), np.asarray(plain[:, n:]), atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.asarray(hidden_lm), np.asarray(plain), atol=1e-5)
    # The streams at decode time (cache + tree ancestors) are the streams training computes.
    np.testing.assert_allclose(np.asarray(s_dec), np.asarray(s_train[:, n:]), atol=2e-5, rtol=0)
    assert float(jnp.abs(s_train[:, :, 0] - s_train[:, :, 1]).max()) > 1e-2  # the streams differ


def test_streams_see_only_main_keys_up_to_their_node():
    """Stream outputs at a node do not move when a non-ancestor node's token or a cache slot past the
    length changes, and do move when an ancestor's token changes."""
    config, params = small_target()
    sp = trained_like_params(config, SCFG)
    L = SCFG.first_layer(config)
    toks = jax.random.randint(jax.random.key(3), (1, 8), 3, config.vocab_size)
    cache = jax.jit(_prefix_cache, static_argnums=(0, 3))(config, params, toks, 8)
    cache = dataclasses.replace(cache, lengths=jnp.array([6], jnp.int32))  # slots 6, 7 hold stale K/V
    tc = TreeConfig((2, 2))
    parents = jnp.asarray([[-1, 0, 0, 1, 2]], jnp.int32)

    @jax.jit
    def streams_of(tree_tokens, cache):
        tree = make_tree(tree_tokens, parents, jnp.ones((1, 5), bool), tc)
        _, _, _, _, _, taps = tapped_tree_forward(params, config, tree, cache, L)
        return ss.stream_hidden(
            sp, params, config, SCFG, taps.mid_hidden, taps.positions, ss.tree_main_kv(taps, tree.mask)
        )

    base_toks = jnp.asarray([[5, 6, 7, 8, 9]], jnp.int32)
    base = np.asarray(streams_of(base_toks, cache))
    other = np.asarray(streams_of(base_toks.at[0, 2].set(40), cache))  # node 2: not an ancestor of 1 or 3
    np.testing.assert_allclose(other[:, [0, 1, 3]], base[:, [0, 1, 3]], atol=1e-6)
    assert np.abs(other[:, [2, 4]] - base[:, [2, 4]]).max() > 1e-3
    stale = dataclasses.replace(cache, k=cache.k.at[:, :, :, 6:].set(9.0), v=cache.v.at[:, :, :, 6:].set(-9.0))
    np.testing.assert_allclose(np.asarray(streams_of(base_toks, stale)), base, atol=1e-6)


def test_streams_config_is_validated():
    with pytest.raises(ConfigError, match="streams.num_streams"):
        ss.StreamsConfig(num_streams=0)
    with pytest.raises(ConfigError, match="streams.rank"):
        ss.StreamsConfig(rank=1.5)
    config, _ = small_target()
    with pytest.raises(ConfigError, match="streams.msa_layers"):
        ss.StreamsConfig(msa_layers=5).first_layer(config)
    assert ss.num_params(config, SCFG) == 3 * 48 + 2 * (48 + 2 * 48 * 4) + 2 * 48 * 4
    with pytest.raises(ConfigError, match="streams.gain"):
        ss.StreamsConfig(gain=0.0)


def test_gain_scales_the_stream_embeddings_and_adapter_outputs():
    # gain g with params p is gain 1 with the stream embeddings and adapter up-projections times g.
    config, params = small_target()
    scaled = dataclasses.replace(SCFG, gain=7.0)
    sp = trained_like_params(config, SCFG)
    sp_g = dict(sp, stream_embed=7.0 * sp["stream_embed"], adapter_up=7.0 * sp["adapter_up"])
    toks = jax.random.randint(jax.random.key(4), (1, 9), 3, config.vocab_size)
    run = jax.jit(_training_streams, static_argnums=(2, 3))
    _, with_gain = run(sp, params, config, scaled, toks)
    _, folded = run(sp_g, params, config, SCFG, toks)
    _, plain = run(sp, params, config, SCFG, toks)
    np.testing.assert_allclose(np.asarray(with_gain), np.asarray(folded), rtol=1e-5, atol=1e-4)
    assert float(jnp.abs(with_gain - plain).max()) > 1e-2
