"""TokenSwift's dynamic partial KV cache against brute-force references: Eq. 2 importance with GQA groups,
selection (sinks kept), replacement order, the rebuild step, and the draft pass over it."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lsjax.cache import KVCache
from lsjax.methods.tokenswift import partial_cache as pcm
from lsjax.models import target
from lsjax.rope import inverse_frequencies, rope_angles
from tests.tiny import tiny_model


def brute_select(q, k, n, budget, sink):
    """q [N, H], k [K, S, H] numpy -> positions [K, budget] (-1 empty): sinks, then by decreasing
    sum over the group's queries of q . k."""
    K, S, _ = k.shape
    G = q.shape[0] // K
    out = np.full((K, budget), -1)
    for h in range(K):
        score = sum(k[h] @ q[h * G + g] for g in range(G))
        first = [p for p in range(min(sink, n))]
        rest = sorted(range(sink, n), key=lambda p: -score[p])[: budget - sink]
        out[h, : len(first)] = first
        out[h, sink : sink + len(rest)] = rest
    return out


@pytest.mark.parametrize("n", [5, 20, 60])
def test_selection_matches_brute_force(n):
    rng = np.random.RandomState(n)
    B, N, K, S, H, budget, sink = 2, 6, 2, 64, 8, 24, 4
    q = rng.randn(B, N, H).astype(np.float32)
    k = rng.randn(B, K, S, H).astype(np.float32)
    lengths = np.array([n, max(n - 3, 1)])
    pos, filled = pcm.select(pcm.importance(jnp.asarray(q), jnp.asarray(k)), jnp.asarray(lengths), budget, sink)
    for b in range(B):
        want = brute_select(q[b], k[b], lengths[b], budget, sink)
        np.testing.assert_array_equal(np.asarray(pos[b]), want)
        assert int(filled[b]) == min(lengths[b], budget)
        assert np.all(want[:, : min(lengths[b], budget)] >= 0) and np.all(want[:, min(lengths[b], budget) :] < 0)


def _prefilled(prompt_len, capacity=128):
    config, params = tiny_model()
    rng = np.random.RandomState(prompt_len)
    toks = np.zeros((1, 128), np.int32)
    toks[0, :prompt_len] = rng.randint(3, config.vocab_size, size=prompt_len)
    fill = jax.jit(
        lambda t, n: target.forward(params, config, t, jnp.arange(128)[None], KVCache.zeros(config, 1, capacity), n)[1]
    )
    return config, params, fill(jnp.asarray(toks), jnp.asarray([prompt_len])), rng


@pytest.mark.slow
def test_draft_pass_over_a_cache_that_holds_everything_equals_the_full_forward():
    config, params, cache, _ = _prefilled(40)
    root, pos = jnp.asarray([[7]]), jnp.asarray([[40]])
    full, _, _ = jax.jit(lambda: target.forward_hidden(params, config, root, pos, cache))()
    pc = pcm.PartialCache.empty(config, 1, 48)
    fwd = jax.jit(lambda pc: pcm.partial_forward(params, config, pc, cache, root, pos, sink=4))
    h, pc = fwd(pc)  # selects (everything fits), then attends
    np.testing.assert_allclose(np.asarray(h), np.asarray(full), rtol=1e-4, atol=1e-4)
    assert int(pc.length[0]) == 40 and not bool(pc.rebuild[0])
    h2, pc2 = fwd(pc)  # no selection due: the in-place path
    np.testing.assert_allclose(np.asarray(h2), np.asarray(full), rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(np.asarray(pc2.pos), np.asarray(pc.pos))


def _layer0_query(params, config, token, position):
    layer = {k: v[0] for k, v in params["layers"].items()}
    cos, sin = rope_angles(jnp.asarray([[position]]), inverse_frequencies(config))
    h = target.rms_norm(target.embed(params, jnp.asarray([[token]])), layer["attn_norm"], config.rms_norm_eps)
    q, _, _ = target.qkv_projection(layer, config, h, cos, sin)
    return np.asarray(q[0, 0])


@pytest.mark.slow  # ~15 s
def test_replacement_order_rebuild_step_and_contents():
    """Budget 20 with 4 sinks over a 50-token context: the selection, then committed tokens taking the least
    important slots from the last one back, the rebuild due exactly when the 16 replaceable slots are used
    up, and the next draft pass selecting again over the whole context. Memory is the budget's."""
    n0, budget, sink = 50, 20, 4
    config, params, cache, rng = _prefilled(n0)
    pc = pcm.PartialCache.empty(config, 1, budget)
    fwd = jax.jit(lambda pc, cache, root, n: pcm.partial_forward(params, config, pc, cache, root, n, sink=sink))
    _, pc = fwd(pc, cache, jnp.asarray([[9]]), jnp.asarray([[n0]]))
    want = brute_select(_layer0_query(params, config, 9, n0), np.asarray(cache.k[0, 0]), n0, budget, sink)
    np.testing.assert_array_equal(np.asarray(pc.pos[0, 0]), want)
    selected = np.asarray(pc.pos)  # [L, 1, K, S]
    write = jax.jit(lambda pc, cache, start, count: pcm.write_committed(pc, cache, start, count, 5, sink))
    commit = jax.jit(
        lambda cache, toks, n, count: target.forward(params, config, toks, n + jnp.arange(5)[None], cache, count)[1]
    )
    n, written = n0, []
    for step, count in enumerate([3, 5, 4, 2, 3]):  # 17 tokens: the 16th fills the last replaceable slot
        toks = jnp.asarray(rng.randint(3, config.vocab_size, size=(1, 5)))
        cache = commit(cache, toks, n, jnp.asarray([count]))
        pc = write(pc, cache, jnp.asarray([n]), jnp.asarray([count]))
        written += list(range(n, n + count))
        n += count
        expect = selected[..., :budget].copy()
        for j, p in enumerate(written[: budget - sink]):  # token j replaces slot budget - 1 - j
            expect[..., budget - 1 - j] = p
        if len(written) < budget - sink:
            np.testing.assert_array_equal(np.asarray(pc.pos), expect)
            assert not bool(pc.rebuild[0])
        else:
            assert bool(pc.rebuild[0]) and step == 4
    # Contents: every filled slot holds the full cache's K/V at its position.
    pos = np.asarray(pc.pos)
    full_k = np.asarray(cache.k)
    L, _, K, S = pos.shape
    for l in range(L):
        for h in range(K):
            np.testing.assert_array_equal(np.asarray(pc.k[l, 0, h]), full_k[l, 0, h, pos[l, 0, h]])
    _, pc = fwd(pc, cache, jnp.asarray([[11]]), jnp.asarray([[n]]))
    want = brute_select(_layer0_query(params, config, 11, n), np.asarray(cache.k[0, 0]), n, budget, sink)
    np.testing.assert_array_equal(np.asarray(pc.pos[0, 0]), want)
    assert not bool(pc.rebuild[0]) and int(pc.replaced[0]) == 0 and int(pc.length[0]) == budget
    assert pc.nbytes() == pcm.PartialCache.empty(config, 1, budget).nbytes()  # the context never enters it
    big = dataclasses.replace(config, max_position=1 << 16)
    assert pcm.PartialCache.empty(big, 1, budget).nbytes() == pc.nbytes()
