"""LongSpec's draft tree and a prompt-lookup chain, verified together as one tree.

The two proposers fail in different places: prompt lookup (PLD) is free and long when the output copies the
context (code, quotes, repeated identifiers) and silent otherwise; the draft model guesses every step but
rarely far. Their union costs one verification. Level d of the union holds the PLD node of depth d first (when
d <= pld.num_tokens), then LongSpec's level-d nodes, so the greedy walk, which takes the first matching child,
prefers the PLD branch when both propose the same token. A step without an n-gram match leaves the PLD nodes
invalid: the tree is then LongSpec's alone.

    widths = [(d <= P) + w_d for d in 1 .. max(P, D)]     P = pld.num_tokens, (w_1..w_D) = LongSpec's widths

Both drafters see the combined tree and accepted path in `update`: each only reads the accepted tokens.
Lossless like any drafter: neither proposal looks at the verification key.
"""

from __future__ import annotations

import dataclasses
import functools

import jax.numpy as jnp
import numpy as np

from lsjax.engine.types import DraftContext, Drafter, Verdict
from lsjax.methods.longspec.drafter import LongSpecDrafter
from lsjax.methods.pld.drafter import PLDDrafter
from lsjax.tree import Tree, TreeConfig, make_tree


@functools.cache
def union_layout(pld_len: int, widths: tuple[int, ...]) -> tuple[TreeConfig, np.ndarray, np.ndarray, np.ndarray]:
    """(the union's TreeConfig, pld_at [P] = union index of the PLD node of depth d = 1..P,
    ls_at [1 + sum(widths)] = union index of each LongSpec node (root -> 0), pld_parent [P])."""
    depth = max(pld_len, len(widths))
    union = TreeConfig(tuple(int(d < pld_len) + (widths[d] if d < len(widths) else 0) for d in range(depth)))
    offsets = union.level_offsets()
    ls_offsets = TreeConfig(widths).level_offsets()
    pld_at = np.asarray([offsets[d + 1] for d in range(pld_len)], np.int32)
    ls_at = np.zeros(1 + sum(widths), np.int32)
    for d, w in enumerate(widths):
        first = offsets[d + 1] + int(d < pld_len)
        ls_at[ls_offsets[d + 1] : ls_offsets[d + 1] + w] = first + np.arange(w)
    pld_parent = np.concatenate([[0], pld_at[:-1]]).astype(np.int32)
    return union, pld_at, ls_at, pld_parent


@dataclasses.dataclass(frozen=True)
class HybridDrafter(Drafter):
    longspec: LongSpecDrafter = LongSpecDrafter(tree=TreeConfig((1, 1, 1, 1)))
    pld: PLDDrafter = PLDDrafter(num_tokens=6)

    name = "hybrid"

    def check_params(self, draft_params, config) -> str | None:
        return self.longspec.check_params(draft_params, config)  # the chain is prompt lookup: no weights

    @property
    def tree(self) -> TreeConfig:
        return union_layout(self.pld.num_tokens, self.longspec.tree.widths)[0]

    def init(self, ctx: DraftContext, state):
        return (self.pld.init(ctx, state), self.longspec.init(ctx, state))

    def propose(self, ctx: DraftContext, state, draft_state, key) -> Tree:
        pld_state, ls_state = draft_state
        chain = self.pld.propose(ctx, state, pld_state, key)  # [B, 1 + P]
        beams = self.longspec.propose(ctx, state, ls_state, key)  # [B, 1 + sum(w)]
        union, pld_at, ls_at, pld_parent = union_layout(self.pld.num_tokens, self.longspec.tree.widths)
        B, T = state.root.shape[0], union.num_nodes
        ls_at_j = jnp.asarray(ls_at)
        tokens = jnp.zeros((B, T), jnp.int32).at[:, 0].set(state.root)
        tokens = tokens.at[:, pld_at].set(chain.tokens[:, 1:]).at[:, ls_at[1:]].set(beams.tokens[:, 1:])
        valid = jnp.ones((B, T), bool).at[:, pld_at].set(chain.valid[:, 1:]).at[:, ls_at[1:]].set(beams.valid[:, 1:])
        parents = jnp.full((B, T), -1, jnp.int32).at[:, pld_at].set(jnp.asarray(pld_parent)[None])
        parents = parents.at[:, ls_at[1:]].set(ls_at_j[beams.parents[:, 1:]])
        logq = sampled = None
        if beams.stochastic:  # the chain's nodes are deterministic children: sample-and-match covers them
            V = beams.logq.shape[-1]
            logq = jnp.full((B, T, V), -jnp.inf, beams.logq.dtype).at[:, ls_at].set(beams.logq)
            sampled = jnp.zeros((B, T), bool).at[:, ls_at[1:]].set(beams.sampled[:, 1:])
        return make_tree(tokens, parents, valid, union, logq, sampled)

    def update(self, ctx: DraftContext, state, draft_state, verdict: Verdict):
        # Both read only the accepted tokens (verdict.emitted / path_tokens), never node indices.
        pld_state, ls_state = draft_state
        return (
            self.pld.update(ctx, state, pld_state, verdict),
            self.longspec.update(ctx, state, ls_state, verdict),
        )
