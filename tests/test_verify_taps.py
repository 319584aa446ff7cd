"""The verify forward's tap (`Drafter.extra_hidden_layer`): a drafter reads the residual stream entering a
middle layer and may prune the tree there; the verified outputs stay the plain forward's."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lsjax.cache import KVCache, commit
from lsjax.config import GenerateConfig
from lsjax.engine.types import ARDrafter, Drafter
from lsjax.engine.verify import tapped_tree_forward, tree_forward
from lsjax.models import target
from lsjax.tree import Tree, TreeConfig, make_tree
from tests.test_speculative import RandomTreeDrafter, repetitive_prompts, run
from tests.tiny import tiny_model

_plain = jax.jit(tree_forward, static_argnums=1)
_tapped = jax.jit(tapped_tree_forward, static_argnums=(1, 4))


def close(got, want):
    """Equal up to fp32 rounding relative to the tensor's scale (the tiny model's activations reach ~20)."""
    want = np.asarray(want)
    np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=1e-6 * max(1.0, float(np.abs(want).max())))


def _cache_with_prefix(config, params, n=13, capacity=64, seed=0):
    toks = jax.random.randint(jax.random.key(seed), (2, n), 3, config.vocab_size)
    pos = jnp.broadcast_to(jnp.arange(n), (2, n))
    _, cache = target.forward(params, config, toks, pos, KVCache.zeros(config, 2, capacity))
    return dataclasses.replace(cache, lengths=jnp.array([n, n - 4], jnp.int32))


def _random_tree(config, widths=(3, 4, 2), seed=1):
    tc = TreeConfig(widths)
    key = jax.random.key(seed)
    offsets = tc.level_offsets()
    parents = [np.full(1, -1)]
    for d, w in enumerate(widths):
        lo, hi = offsets[d], offsets[d] + (1 if d == 0 else widths[d - 1])
        parents.append(np.random.RandomState(seed + d).randint(lo, hi, size=w))
    parents = jnp.broadcast_to(jnp.asarray(np.concatenate(parents), jnp.int32), (2, tc.num_nodes))
    tokens = jax.random.randint(key, (2, tc.num_nodes), 3, config.vocab_size)
    return make_tree(tokens, parents, jnp.ones((2, tc.num_nodes), bool), tc), tc


@pytest.mark.parametrize(
    "prepared,layer",
    [pytest.param(False, 1, marks=pytest.mark.slow, id="stacked-1"), pytest.param(True, 0, id="decode-layout-0")],
)
def test_tapped_forward_equals_plain_forward(prepared, layer):
    config, params = tiny_model()
    cache = _cache_with_prefix(config, params)
    p = target.prepare_for_decode(params, config) if prepared else params
    tree, _ = _random_tree(config)
    hidden, logits, k, v = _plain(p, config, tree, cache)
    t2, hidden2, logits2, k2, v2, taps = _tapped(p, config, tree, cache, layer)
    for a, b in ((hidden, hidden2), (logits, logits2), (k, k2), (v, v2)):
        close(b, a)
    # The tap is the residual entering `layer`: running the layers below it by hand gives the same.
    pos = cache.lengths[:, None] + tree.depth
    mid, _, _ = target.forward_hidden(params, config, tree.tokens, pos, cache, tree.mask, layers=(0, layer))
    if layer == 0:
        mid = target.embed(params, tree.tokens)
    close(taps.mid_hidden, mid)
    np.testing.assert_array_equal(np.asarray(taps.positions), np.asarray(pos))


def _keep_nodes(tree: Tree, parents: np.ndarray, keep: np.ndarray):
    """The subtree of nodes `keep` (ancestor-closed, root first; `parents` the host copy of every row's
    parents) as (tree, idx)."""
    B = tree.tokens.shape[0]
    idx = jnp.broadcast_to(jnp.asarray(keep, jnp.int32), (B, len(keep)))
    inv = np.full(len(parents), -1)
    inv[keep] = np.arange(len(keep))
    par = parents[keep]
    new_par = jnp.broadcast_to(jnp.asarray(np.where(par >= 0, inv[np.maximum(par, 0)], -1), jnp.int32), idx.shape)
    sub = Tree(
        jnp.take_along_axis(tree.tokens, idx, 1),
        new_par,
        jnp.take_along_axis(tree.depth, idx, 1),
        jnp.take_along_axis(tree.valid, idx, 1),
        tree.mask[:, keep][:, :, keep],
    )
    return sub, idx


def test_pruned_forward_equals_forward_of_the_pruned_tree():
    """Pruning between the layers = verifying the pruned tree; its paths commit the K/V of a plain forward."""
    config, params = tiny_model()
    cache = _cache_with_prefix(config, params)
    tree, tc = _random_tree(config, widths=(2, 2, 2), seed=3)
    parents = np.asarray(tree.parents[0])  # every row has the same parents
    keep = [tc.num_nodes - 1]
    while parents[keep[-1]] >= 0:
        keep.append(int(parents[keep[-1]]))
    keep = np.unique(keep + [1, 2])  # the path to the last leaf plus level 1: ancestor-closed
    sub, _ = _keep_nodes(tree, parents, keep)
    got_tree, hidden, logits, k, v, taps = jax.jit(
        lambda p, t, c: tapped_tree_forward(p, config, t, c, 1, lambda t, mid: _keep_nodes(t, parents, keep))
    )(params, tree, cache)
    np.testing.assert_array_equal(np.asarray(got_tree.tokens), np.asarray(sub.tokens))
    np.testing.assert_array_equal(np.asarray(got_tree.mask), np.asarray(sub.mask))
    hidden_r, logits_r, k_r, v_r = _plain(params, config, sub, cache)
    for a, b in ((hidden_r, hidden), (logits_r, logits), (k_r, k), (v_r, v)):
        close(b, a)
    assert taps.mid_hidden.shape[1] == len(keep)
    path = jnp.asarray([[0, 1], [0, 2]], jnp.int32)  # root + a depth-1 node per row
    at = path[None, :, :, None, None]
    got = commit(cache, jnp.take_along_axis(k, at, 2), jnp.take_along_axis(v, at, 2), jnp.array([2, 2]))
    toks = jnp.take_along_axis(sub.tokens, path, 1)
    _, want = target.forward(params, config, toks, cache.lengths[:, None] + jnp.arange(2)[None], cache)
    close(got.k, want.k)
    close(got.v, want.v)


@dataclasses.dataclass(frozen=True)
class TappedRandomTree(Drafter):
    """A random tree verified through the tapped forward; `prune` keeps each level's first `keep` nodes
    whose parents are kept (a pruned tree of static shape)."""

    vocab: int = 8
    layer: int = 1
    keep: tuple[int, ...] | None = None
    full: TreeConfig = TreeConfig((3, 3, 2))
    name = "tapped-random-tree"

    @property
    def extra_hidden_layer(self):
        return self.layer

    @property
    def tree(self) -> TreeConfig:
        return TreeConfig(self.keep) if self.keep else self.full

    def propose(self, ctx, state, draft_state, key):
        return RandomTreeDrafter(self.full, self.vocab).propose(ctx, state, draft_state, key)

    def verify_extras(self, ctx, tree, hidden, logits, taps=None):
        return taps.mid_hidden[:, 0]  # the root's: proves the taps arrive

    def prune(self, ctx, tree, mid_hidden):
        if not self.keep:
            return None
        B = tree.tokens.shape[0]
        full_off, off = self.full.level_offsets(), self.tree.level_offsets()
        kept = jnp.zeros((B, self.full.num_nodes), bool).at[:, 0].set(True)
        idx = [jnp.zeros((B, 1), jnp.int32)]
        for d, w in enumerate(self.keep):
            lo, hi = full_off[d + 1], full_off[d + 1] + self.full.widths[d]
            ok = jnp.take_along_axis(kept, tree.parents[:, lo:hi], 1)
            # The first `w` kept-parent nodes of the level, in order (then any, marked invalid).
            order = jnp.argsort(~ok, axis=1, stable=True)[:, :w] + lo
            kept = kept.at[jnp.arange(B)[:, None], order].set(jnp.take_along_axis(ok, order - lo, 1))
            idx.append(order.astype(jnp.int32))
        idx = jnp.concatenate(idx, 1)
        inv = (
            jnp.full((B, self.full.num_nodes), 0, jnp.int32)
            .at[jnp.arange(B)[:, None], idx]
            .set(jnp.arange(idx.shape[1])[None])
        )
        par = jnp.take_along_axis(tree.parents, idx, 1)
        new_par = jnp.where(par >= 0, jnp.take_along_axis(inv, jnp.maximum(par, 0), 1), -1)
        valid = jnp.take_along_axis(kept, idx, 1)
        del off
        return make_tree(jnp.take_along_axis(tree.tokens, idx, 1), new_par, valid, self.tree), idx


@pytest.mark.slow  # the streams drafter's pruned greedy test covers the default run
def test_pruning_drafter_greedy_equals_ar():
    config, params = tiny_model()
    gen = GenerateConfig(max_new_tokens=20, ignore_eos=True)
    prompts = repetitive_prompts(config, 3, 40, seed=4)
    drafter = TappedRandomTree(vocab=config.vocab_size, keep=(2, 2, 1))
    ar = run(params, config, prompts, gen, ARDrafter())
    sp = run(params, config, prompts, gen, drafter)
    np.testing.assert_array_equal(np.asarray(sp.out), np.asarray(ar.out))
