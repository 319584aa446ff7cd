"""TokenSwift's tree: the heads' Cartesian top-k tree, plus n-gram chains merged in as a trie.

Head tree, `topk = (k_1, .., k_D)`: level d holds k_1 * .. * k_d nodes; node j of level d is a child of node
j // k_d of level d - 1 and holds the (j % k_d)-th best token of logit set d (the heads do not look at the
path, so every parent gets the same k_d candidates: the paper's "[1, 3, 3, 3]" tree).

N-gram chains: K chains of tokens for depths 1 .. Dc below the root. A chain node whose (parent, token)
already exists (a head node, or an earlier chain's) is merged into that node: it is invalid and the rest of
its chain hangs below the existing node. So siblings never share a token, and the verifier's walk (which
follows the first matching child) sees every proposed continuation.

Union layout, level by level: level d holds the head nodes of depth d, then one slot per chain.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from lsjax.tree import Tree, TreeConfig, make_tree


@functools.cache
def head_widths(topk: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(np.prod(topk[: d + 1])) for d in range(len(topk)))


@functools.cache
def union_config(topk: tuple[int, ...], num_chains: int, chain_depth: int) -> TreeConfig:
    hw = head_widths(topk)
    depth = max(len(topk), chain_depth if num_chains else 0)
    return TreeConfig(
        tuple((hw[d] if d < len(hw) else 0) + (num_chains if d < chain_depth else 0) for d in range(depth))
    )


def cartesian_level(cands: jax.Array, level: int, topk: tuple[int, ...]):
    """cands [B, k_d] the best tokens of logit set `level` -> (tokens [B, w_d], parent index within level
    d - 1 [w_d]) of the head tree's level `level` (0-based)."""
    w = head_widths(topk)[level]
    k = topk[level]
    j = np.arange(w)
    return cands[:, j % k], (j // k).astype(np.int32)


def build_tree(
    root: jax.Array,
    head_cands: list[jax.Array],
    topk: tuple[int, ...],
    chains: jax.Array | None = None,
    found: jax.Array | None = None,
    head_ok: list[jax.Array] | None = None,
    level_logq: jax.Array | None = None,
) -> Tree:
    """The union tree. root [B]; head_cands[d] [B, k_d]: the tokens of logit set d (best first, or in the
    order drawn); chains [B, K, Dc] and found [B, K]: the n-gram chains (tokens at depths 1 .. Dc) and which
    exist.

    A sampled tree (T > 0): head_cands[d] were drawn from q_d = exp(level_logq[:, d]) [B, V] without
    replacement (head_ok[d] [B, k_d]: False where q ran out of support), the same draw for every parent on
    the level (each node's children are still a without-replacement sample from its q; the levels' draws
    are independent). Head nodes are then marked sampled, with their children's q; chain nodes stay
    deterministic (sample-and-match covers them)."""
    B = root.shape[0]
    hw = head_widths(topk)
    K, Dc = (0, 0) if chains is None else chains.shape[1:]
    if K and found is None:
        found = jnp.ones((B, K), bool)
    cfg = union_config(topk, K, Dc)
    offsets = cfg.level_offsets()
    T = cfg.num_nodes
    tokens = jnp.zeros((B, T), jnp.int32).at[:, 0].set(root)
    parents = jnp.full((B, T), -1, jnp.int32)
    valid = jnp.ones((B, T), bool)
    canon = jnp.zeros((B, K), jnp.int32)  # each chain's node at the previous level, after merging (root)
    for d in range(cfg.depth):
        lo = offsets[d + 1]
        nh = hw[d] if d < len(topk) else 0
        if nh:
            tok, par = cartesian_level(head_cands[d], d, topk)
            tokens = tokens.at[:, lo : lo + nh].set(tok.astype(jnp.int32))
            parents = parents.at[:, lo : lo + nh].set(jnp.asarray(offsets[d] + par)[None])
            if head_ok is not None:
                ok, _ = cartesian_level(head_ok[d], d, topk)
                valid = valid.at[:, lo : lo + nh].set(ok & valid[:, offsets[d] + par])
        if d >= Dc or K == 0:
            continue
        ctok = chains[:, :, d].astype(jnp.int32)  # [B, K]
        if nh:
            on_head = same(canon, parents[:, lo : lo + nh]) & same(ctok, tokens[:, lo : lo + nh])  # [B, K, nh]
            on_head = on_head & valid[:, None, lo : lo + nh]
        else:
            on_head = jnp.zeros((B, K, 0), bool)
        earlier = jnp.tril(jnp.ones((K, K), bool), -1)[None]  # [1, c, c']: c' < c
        on_chain = same(canon, canon) & same(ctok, ctok) & found[:, None, :] & earlier  # [B, K, K]
        # The first match in layout order: a head node, else the first earlier chain (itself canonical or
        # matching its own canonical node, which then matches here too and comes first).
        head_hit, chain_hit = jnp.any(on_head, -1), jnp.any(on_chain, -1)
        own = lo + nh + jnp.arange(K, dtype=jnp.int32)[None]
        first = jnp.where(
            head_hit,
            lo + jnp.argmax(on_head, -1) if nh else 0,
            jnp.where(chain_hit, lo + nh + jnp.argmax(on_chain, -1), own),
        ).astype(jnp.int32)
        tokens = tokens.at[:, lo + nh : lo + nh + K].set(ctok)
        parents = parents.at[:, lo + nh : lo + nh + K].set(canon)
        valid = valid.at[:, lo + nh : lo + nh + K].set(found & ~head_hit & ~chain_hit)
        canon = first
    if level_logq is None:
        return make_tree(tokens, parents, valid, cfg)
    # Every head node at depth d < len(topk) has the level-(d + 1) candidates as children, drawn from q_{d+1}.
    V = level_logq.shape[-1]
    logq = jnp.full((B, T, V), -jnp.inf, jnp.float32).at[:, 0].set(level_logq[:, 0])
    sampled = jnp.zeros((B, T), bool)
    for d in range(len(topk)):
        lo = offsets[d + 1]
        sampled = sampled.at[:, lo : lo + hw[d]].set(True)
        if d + 1 < len(topk):
            logq = logq.at[:, lo : lo + hw[d]].set(level_logq[:, d + 1][:, None])
    return make_tree(tokens, parents, valid, cfg, logq, sampled & valid)


def same(a: jax.Array, b: jax.Array) -> jax.Array:
    """a [B, K], b [B, X] -> [B, K, X] equality."""
    return a[:, :, None] == b[:, None, :]
