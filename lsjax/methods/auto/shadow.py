"""`auto`'s shadow drafts: exploring the draft's candidates without verifying them.

A probe (running a draft candidate to learn its acceptance) that accepts nothing costs a whole tree verification
for one token: 1.3-2.3x an AR step on a CPU (docs/design/auto-policy.md), so a few failed probes per 64 tokens were
most of what `auto` lost to AR on held-out prompts. A shadow draft runs only the draft: after a step commits, the
draft's own tree (and the prompt-lookup chain the hybrid would add) is proposed at the new root and put aside; once
the tokens that follow are committed — by whatever candidates ran, and they are always the target's own — the
proposal is walked against them exactly as verification would walk it. That costs one draft pass (~0.2 AR steps)
and observes, for free afterwards:

    ls-tree   the depth the tree reaches (a node is accepted iff its parent is and it equals the token)
    ls-chain  the greedy chain inside the beam tree: each level's best node while its parent is the chain's
              (the beam's best child of the chain node is that node's argmax), so the chain is known only as
              deep as that holds
    hybrid    the better of the tree and the prompt-lookup chain (a lower bound where the two share nodes)

At T = 0 these are exactly what verification would accept. At T > 0 the shadow tree is the deterministic
(top-k) tree and a match with the emitted token (a draw from the target) is what sample-and-match accepts;
recursive rejection sampling of a sampled tree accepts at least as often on average, so the shadow errs
towards AR there, except at the chain's first depth: with sampled drafts the shadow keeps the draft's q at
its root, and the next step reports the target's p of the token it emitted there (`SwitchExtras`), so
min(1, q(x) / p(x)) is an unbiased, low-variance estimate of how often a sampled 1-node chain is accepted.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from lsjax.tree import Tree


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DraftShadow:
    tokens: jax.Array  # [B, T] the shadow tree (node 0: the root it was drafted at)
    parents: jax.Array  # [B, T]
    depth: jax.Array  # [B, T]
    valid: jax.Array  # [B, T]
    chain: jax.Array  # [B, H] the prompt-lookup chain the hybrid would add at that root
    n: jax.Array  # [B] the n-gram of that chain's match (0: none)
    avail: jax.Array  # [B] tokens available after the match
    base: jax.Array  # [B] history index of the root's first child
    pending: jax.Array  # [B] bool: a shadow is waiting for its tokens
    # Sampled drafts (T > 0) only, else [B, 0] / unused: the draft's log q at the root [B, V]; once the next
    # step has emitted the root's first token x ~ p, first_accept [B] = min(1, q(x) / p(x)), whose mean over
    # x ~ p is sum_x min(p(x), q(x)): exactly how often a sampled 1-node chain is accepted there (rejection
    # sampling), where the match of the greedy token says only p(argmax q), far less on a flat q.
    logq: jax.Array
    first_accept: jax.Array  # [B] f32
    fresh: jax.Array  # [B] bool: recorded, first_accept not yet known

    @staticmethod
    def empty(batch: int, num_nodes: int, chain: int, vocab: int = 0) -> DraftShadow:
        zi = jnp.zeros((batch, num_nodes), jnp.int32)
        zb = jnp.zeros((batch,), jnp.int32)
        no = jnp.zeros((batch,), bool)
        return DraftShadow(
            zi,
            zi,
            zi,
            zi > 0,
            jnp.zeros((batch, chain), jnp.int32),
            zb,
            zb,
            zb,
            no,
            jnp.zeros((batch, vocab), jnp.float32),
            jnp.zeros((batch,), jnp.float32),
            no,
        )

    @staticmethod
    def record(tree: Tree, chain, n, avail, base, logq=None) -> DraftShadow:
        """`logq` [B, V] the draft's log q at the root (sampled drafts), else None or [B, 0]."""
        pending = jnp.ones(tree.tokens.shape[:1], bool)
        logq = jnp.zeros(pending.shape + (0,), jnp.float32) if logq is None else logq
        first = jnp.zeros(pending.shape, jnp.float32)
        args = (tree.tokens, tree.parents, tree.depth, tree.valid, chain, n, avail, base, pending)
        return DraftShadow(*args, logq, first, pending & (logq.shape[1] > 0))

    def score_first(self, first: jax.Array, root_logp: jax.Array, live: jax.Array) -> DraftShadow:
        """The step after `record` emitted `first` [B] at the shadow's root with target log-probability
        `root_logp` [B] (`SwitchExtras`): first_accept of the rows `live` [B] that were waiting for it."""
        if self.logq.shape[1] == 0:
            return self
        lq = jnp.take_along_axis(self.logq, first[:, None], axis=1)[:, 0]
        ratio = jnp.where(jnp.isfinite(lq), jnp.exp(jnp.minimum(lq - root_logp, 0.0)), 0.0)  # q(x) = 0: 0
        now = self.fresh & live
        return dataclasses.replace(self, first_accept=jnp.where(now, ratio, self.first_accept), fresh=self.fresh & ~now)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LookupShadow:
    """Prompt-lookup proposals put aside, one per step in a ring of slots, each checked depth by depth as the
    tokens after its root are committed (free: nothing is drafted). An AR step emits one token, so checking
    only the step's own emitted tokens sees depth 1 alone; with one proposal put aside per step and each
    checked again at every later step, depth d of a proposal is observed d steps after it was put aside:
    the deeper depths are observed about as often as the first, and a copy that starts is trusted within a few
    steps (waiting for all D tokens before checking any depth kept AR running through the first ~8 steps of a
    copy: dev dialogue 1K-2K, tau 3.97 vs 6.68 for PLD alone). Once a depth fails, or every depth the proposal
    can be tried at has been checked, its slot is free again."""

    tokens: jax.Array  # [B, R, D] the proposals
    n: jax.Array  # [B, R] the n-gram of each one's match (0: none)
    avail: jax.Array  # [B, R] tokens available after the match
    base: jax.Array  # [B, R] history index of the root's first child
    pending: jax.Array  # [B, R] bool
    seen: jax.Array  # [B, R] int32 depths already observed (a prompt-lookup step observes its own)

    @staticmethod
    def empty(batch: int, slots: int, depth: int) -> LookupShadow:
        z = jnp.zeros((batch, slots), jnp.int32)
        return LookupShadow(jnp.zeros((batch, slots, depth), jnp.int32), z, z, z, jnp.zeros((batch, slots), bool), z)


@dataclasses.dataclass(frozen=True)
class ShadowAccepts:
    """What each candidate family would have accepted at the shadow's root ([B] int32 each)."""

    tree: jax.Array  # accepted depth of the tree
    chain: jax.Array  # accepted depth of the greedy chain ...
    chain_known: jax.Array  # ... within the depths where the chain's token is known
    hybrid: jax.Array  # accepted depth of the tree + prompt-lookup union ...
    hybrid_limit: jax.Array  # ... and its depth (0 where there was no match: that row's hybrid was the tree)
    chain_first: jax.Array | None = None  # [B] f32 a sampled 1-node chain's acceptance probability (T > 0)


def accepts(shadow: DraftShadow, following: jax.Array, level_offsets: tuple[int, ...]) -> ShadowAccepts:
    """Walks the shadow's proposals against `following` [B, D] (the tokens committed after its root, D >= the
    tree's depth and the chain's length). `level_offsets`: the tree layout (`TreeConfig.level_offsets`)."""
    B, T = shadow.tokens.shape
    depth_max = len(level_offsets) - 1
    want = jnp.take_along_axis(following, jnp.clip(shadow.depth - 1, 0, following.shape[1] - 1), axis=1)
    hit = shadow.valid & (shadow.tokens == want)
    acc = jnp.zeros((B, T), bool).at[:, 0].set(True)
    for d in range(1, depth_max + 1):  # parents sit on the level above: one pass per level
        up = jnp.take_along_axis(acc, jnp.maximum(shadow.parents, 0), axis=1)
        acc = acc | (hit & up & (shadow.depth == d))
    tree = jnp.max(jnp.where(acc, shadow.depth, 0), axis=1)

    # The chain: level d's first (best) node while its parent is level d - 1's first node.
    known = jnp.ones((B,), bool)
    chain_known = jnp.zeros((B,), jnp.int32)
    chain = jnp.zeros((B,), jnp.int32)
    matching = jnp.ones((B,), bool)
    for d in range(1, depth_max + 1):
        i = level_offsets[d]
        on_chain = shadow.valid[:, i] & (d == 1 or shadow.parents[:, i] == level_offsets[d - 1])
        known = known & on_chain
        chain_known = chain_known + known.astype(jnp.int32)
        matching = matching & known & hit[:, i]
        chain = chain + matching.astype(jnp.int32)

    H = shadow.chain.shape[1]
    j = jnp.arange(1, H + 1)[None]
    same = (shadow.chain == following[:, :H]) & (j <= shadow.avail[:, None])
    lookup = jnp.sum(jnp.cumprod(same, axis=1), axis=1)
    matched = (shadow.n > 0) & (H > 0)
    hybrid = jnp.where(matched, jnp.maximum(tree, lookup), 0)
    limit = jnp.where(matched, jnp.maximum(depth_max, jnp.minimum(H, shadow.avail)), 0)
    first = shadow.first_accept if shadow.logq.shape[1] else None
    return ShadowAccepts(
        tree.astype(jnp.int32), chain, chain_known, hybrid.astype(jnp.int32), limit.astype(jnp.int32), first
    )
