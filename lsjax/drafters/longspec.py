"""The LongSpec drafter: a one-layer draft grows a beam-search tree depth by depth.

At depth d the draft runs once on the w_d frontier nodes: self-attention over
its ring cache (the last W committed tokens; constant memory) plus the tree
ancestors, merged by LSE; cross-attention over the target's committed
last-layer cache [0, n); MLP; the target's LM head (optionally over a pruned
vocabulary). The global top-w_{d+1} children by cumulative log-probability
form the next level: parents that lose simply get no children — nothing is
moved (LongSpec, Appendix D). The tree depends only on the context, never on
the verification RNG, so verification stays exactly lossless.

Draft checkpoints (load: `lsjax.drafters.checkpoints`; export from a training
run: `lsjax.train.export`) hold the params this drafter runs with.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from lsjax.cache import RingCache, ring_write
from lsjax.config import DraftConfig
from lsjax.drafters.base import DraftContext, Drafter
from lsjax.models.draft import draft_logits, draft_self_kv, draft_step
from lsjax.tree import Tree, TreeConfig


def split_vocab(draft_params: dict):
    """(params without `vocab_ids`, vocab_ids or None)."""
    params = {k: v for k, v in draft_params.items() if k != "vocab_ids"}
    return params, draft_params.get("vocab_ids")


@dataclasses.dataclass(frozen=True)
class LongSpecDrafter(Drafter):
    tree: TreeConfig = TreeConfig((4, 16, 16, 16, 16))
    draft: DraftConfig = DraftConfig()

    name = "longspec"

    def init(self, ctx: DraftContext, state) -> RingCache:
        """Fill the ring with the draft K/V of the last W prompt tokens (positions [P - W, P))."""
        params, _ = split_vocab(ctx.draft_params)
        tokens, lengths = ctx.prompt_tokens, ctx.prompt_lengths
        B, P = tokens.shape
        W = self.draft.window
        n = min(W, P)
        start = jnp.maximum(lengths - W, 0)  # [B]
        idx = jnp.clip(start[:, None] + jnp.arange(n)[None], 0, P - 1)  # [B, n]
        toks = jnp.take_along_axis(tokens, idx, axis=1)
        k, v = draft_self_kv(params, ctx.target_params, ctx.config, toks, idx)
        ring = RingCache.zeros(ctx.config, B, W)
        return ring_write(ring, k, v, start, jnp.minimum(lengths, W))

    def propose(self, ctx: DraftContext, state) -> Tree:
        params, vocab_ids = split_vocab(ctx.draft_params)
        cfg, tp = ctx.config, ctx.target_params
        ring: RingCache = state.draft
        cache = state.cache
        widths = (1, *self.tree.widths)  # level 0 is the root
        offsets = self.tree.level_offsets()
        T = self.tree.num_nodes
        B = state.root.shape[0]
        n = cache.lengths  # [B]: the root sits at position n

        tokens = jnp.zeros((B, T), jnp.int32).at[:, 0].set(state.root)
        parents = jnp.full((B, T), -1, jnp.int32)
        scores = jnp.zeros((B, T), jnp.float32)  # cumulative draft log-prob
        anc = jnp.zeros((B, T, T), bool).at[:, 0, 0].set(True)
        k0, v0 = draft_self_kv(params, tp, cfg, state.root[:, None], n[:, None])
        tree_k = jnp.zeros((B, T) + k0.shape[2:], k0.dtype).at[:, :1].set(k0)  # [B, T, K, H]
        tree_v = jnp.zeros_like(tree_k).at[:, :1].set(v0)

        for d in range(self.tree.depth):
            lo, w = offsets[d], widths[d]
            q_tokens = tokens[:, lo : lo + w]  # [B, w]
            pos = jnp.broadcast_to((n + d)[:, None], (B, w))
            hidden = draft_step(
                params,
                tp,
                cfg,
                self.draft,
                q_tokens,
                pos,
                ring,
                tree_k,
                tree_v,
                anc[:, lo : lo + w],
                cache.k,
                cache.v,
                cache.lengths,
                backend=ctx.backend,
            )
            logp = jax.nn.log_softmax(draft_logits(params, tp, cfg, hidden, vocab_ids), axis=-1)  # [B, w, Vd]
            w_next = widths[d + 1]
            # The global top-w_next over all candidates lies within each node's own top-w_next.
            top_lp, top_ids = jax.lax.top_k(logp, w_next)  # [B, w, w_next]
            cand = (scores[:, lo : lo + w, None] + top_lp).reshape(B, w * w_next)
            best, flat = jax.lax.top_k(cand, w_next)  # [B, w_next]
            child_parent = lo + flat // w_next
            child_tok = jnp.take_along_axis(top_ids.reshape(B, -1), flat, axis=1)
            if vocab_ids is not None:
                child_tok = jnp.take(vocab_ids, child_tok)
            c_lo = offsets[d + 1]
            sl = slice(c_lo, c_lo + w_next)
            tokens = tokens.at[:, sl].set(child_tok.astype(jnp.int32))
            parents = parents.at[:, sl].set(child_parent.astype(jnp.int32))
            scores = scores.at[:, sl].set(best)
            rows = jnp.take_along_axis(anc, child_parent[:, :, None], axis=1)  # the parents' ancestor rows
            rows = rows | jax.nn.one_hot(jnp.arange(c_lo, c_lo + w_next), T, dtype=bool)[None]
            anc = anc.at[:, sl].set(rows)
            ck, cv = draft_self_kv(params, tp, cfg, tokens[:, sl], jnp.broadcast_to((n + d + 1)[:, None], (B, w_next)))
            tree_k = tree_k.at[:, sl].set(ck)
            tree_v = tree_v.at[:, sl].set(cv)

        depth = jnp.broadcast_to(jnp.asarray(self.tree.node_depths()), (B, T))
        return Tree(tokens, parents, depth, jnp.ones((B, T), bool), anc)

    def update(self, ctx: DraftContext, state, draft_state: RingCache, tree, path, num_accepted, bonus):
        """The root and the accepted nodes are committed: their draft K/V join the window."""
        params, _ = split_vocab(ctx.draft_params)
        A = path.shape[1]
        count = num_accepted + 1
        start = state.cache.lengths - count  # the old n: the root's position
        toks = jnp.take_along_axis(tree.tokens, path, axis=1)  # [B, A]
        k, v = draft_self_kv(params, ctx.target_params, ctx.config, toks, start[:, None] + jnp.arange(A)[None])
        return ring_write(draft_state, k, v, start, count)
