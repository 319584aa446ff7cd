"""Verification: one target forward over a tree, then the accepted path.

Acceptance is exactly lossless for any tree built without looking at the
verification randomness:

* T = 0: walk from the root while some child holds the target's argmax at its
  parent; the argmax at the last accepted node is the bonus token.
* T > 0: draw one token from the target's *processed* distribution at every
  node (the same `processed_logprobs` AR sampling uses), independently. Walk
  from the root: if a child holds the draw at the current node, move to it;
  otherwise emit the draw and stop. Every emitted token is a fresh draw from the
  target conditional on exactly the tokens before it, so the output is
  distributed as AR sampling's. (Ratio tests on children that were not sampled
  from the draft — as the official LongSpec/TokenSwift stochastic paths do on
  top-k trees — are not used: they are not lossless there.)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lsjax.cache import KVCache
from lsjax.config import ModelConfig, SamplingConfig
from lsjax.models import target
from lsjax.sampling import sample
from lsjax.tree import Tree


def tree_forward(params: dict, config: ModelConfig, tree: Tree, cache: KVCache, *, backend: str = "auto"):
    """Target logits [B, T, V] at every node and the nodes' K/V [L, B, T, K, H] (not committed)."""
    positions = cache.lengths[:, None] + tree.depth
    hidden, new_k, new_v = target.forward_hidden(
        params, config, tree.tokens, positions, cache, tree_mask=tree.mask, backend=backend
    )
    return target.lm_head(params, config, hidden), new_k, new_v


def accept(tree: Tree, logits: jax.Array, sampling: SamplingConfig, key: jax.Array, max_depth: int):
    """Walks the tree. Returns (path [B, max_depth + 1] node indices, path[:, 0] = root;
    num_accepted [B] tree nodes accepted beyond the root; bonus [B] the token after the path)."""
    B, T = tree.tokens.shape
    draws = sample(key, logits, sampling)  # [B, T]: the target's token at every node
    cur = jnp.zeros((B,), jnp.int32)
    alive = jnp.ones((B,), bool)
    path = jnp.zeros((B, max_depth + 1), jnp.int32)
    for d in range(1, max_depth + 1):
        want = jnp.take_along_axis(draws, cur[:, None], axis=1)  # [B, 1]
        match = (tree.parents == cur[:, None]) & tree.valid & (tree.tokens == want) & (tree.depth == d)
        found = alive & jnp.any(match, axis=1)
        child = jnp.argmax(match, axis=1).astype(jnp.int32)  # first matching child
        cur = jnp.where(found, child, cur)
        path = path.at[:, d].set(jnp.where(found, child, 0))
        alive = found
    num_accepted = jnp.sum(path[:, 1:] > 0, axis=1).astype(jnp.int32)
    bonus = jnp.take_along_axis(draws, cur[:, None], axis=1)[:, 0]
    return path, num_accepted, bonus


def gather_path_kv(new_k: jax.Array, new_v: jax.Array, path: jax.Array):
    """[L, B, T, K, H] node K/V -> [L, B, A, K, H] along the accepted path (root first)."""
    idx = path[None, :, :, None, None]
    return jnp.take_along_axis(new_k, idx, axis=2), jnp.take_along_axis(new_v, idx, axis=2)
