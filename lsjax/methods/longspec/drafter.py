"""The LongSpec drafter: a one-layer draft grows a beam-search tree depth by depth.

At depth d the draft runs once on the w_d frontier nodes: self-attention over
its ring cache (the last W committed tokens; constant memory) plus the tree
ancestors, merged by LSE; cross-attention over the target's committed
last-layer cache [0, n); MLP; the target's LM head (optionally over a pruned
vocabulary). The global top-w_{d+1} children by cumulative log-probability
form the next level: parents that lose simply get no children — nothing is
moved (LongSpec, Appendix D). The tree depends only on the context, never on
the verification RNG, so verification stays exactly lossless.

At T > 0 (`SamplingConfig.sample_drafts`) the same beam shape is kept but each
node's children are drawn from the draft's processed q without replacement,
with the drafting key; the tree carries q so verification can run recursive
rejection sampling (accepting a child with probability >= 1 - TV(p, q)
instead of p(child) for a top-k child).

Draft checkpoints (load: `lsjax.methods.longspec.checkpoint`; export from a training
run: `lsjax.methods.longspec.export`) hold the params this drafter runs with: a `DraftParams`
(`lsjax.models.draft_params`: weights, pruned vocabulary, gathered head) in `ctx.draft_params`. The draft
runs as the module `LongSpecDraft(config, draft)` bound to `DraftParams.weights` inside the caller's trace;
the vocabulary and its head are arguments of its `logits`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from lsjax.cache import RingCache, ring_write
from lsjax.config import DraftConfig, ModelConfig
from lsjax.engine.types import DraftContext, Drafter, Verdict
from lsjax.methods.longspec.model import LongSpecDraft
from lsjax.models.draft_params import DraftParams, weights_problem
from lsjax.sampling import processed_logprobs, tree_penalty_mask
from lsjax.tree import Tree, TreeConfig


def split_vocab(draft_params):
    """(the weights, vocab_ids or None) of a DraftParams (or a dict in the file layout)."""
    p = DraftParams.of(draft_params)
    return p.weights, p.vocab_ids


@dataclasses.dataclass(frozen=True)
class LongSpecDrafter(Drafter):
    tree: TreeConfig = TreeConfig((4, 16, 16, 16, 16))
    draft: DraftConfig = DraftConfig()

    name = "longspec"

    def check_params(self, draft_params, config: ModelConfig) -> str | None:
        return weights_problem(draft_params, self.model(config).schema(), "longspec")

    def model(self, config: ModelConfig) -> LongSpecDraft:
        """The draft module this drafter runs (its params: `DraftParams.weights`)."""
        return LongSpecDraft(config, self.draft)

    def _bound(self, ctx: DraftContext) -> LongSpecDraft:
        # Bound inside the caller's trace (a Flax scope belongs to the trace it was made in): every call below
        # is `apply` over the same weights.
        return self.model(ctx.config).bind({"params": DraftParams.of(ctx.draft_params).weights})

    @property
    def ring_size(self) -> int:
        """The ring's slots: the window, plus the widest queried frontier with `DraftConfig.frontier_window`
        (whose queries see up to that many older keys)."""
        if not self.draft.frontier_window:
            return self.draft.window
        return self.draft.window + max((1, *self.tree.widths)[: self.tree.depth])

    def init(self, ctx: DraftContext, state) -> RingCache:
        """Fill the ring with the draft K/V of the last W prompt tokens (positions [P - W, P); W the ring's size)."""
        tokens, lengths = ctx.prompt_tokens, ctx.prompt_lengths
        B, P = tokens.shape
        W = self.ring_size
        n = min(W, P)
        start = jnp.maximum(lengths - W, 0)  # [B]
        idx = jnp.clip(start[:, None] + jnp.arange(n)[None], 0, P - 1)  # [B, n]
        toks = jnp.take_along_axis(tokens, idx, axis=1)
        k, v = self._bound(ctx).self_kv(ctx.target_params, toks, idx)
        ring = RingCache.zeros(ctx.config, B, W)
        return ring_write(ring, k, v, start, jnp.minimum(lengths, W))

    def propose(self, ctx: DraftContext, state, draft_state: RingCache, key: jax.Array) -> Tree:
        return self._propose(ctx, state, draft_state, key, root_q=False)[0]

    def propose_with_root_q(self, ctx: DraftContext, state, draft_state: RingCache, key: jax.Array):
        """(the tree `propose` builds, the draft's processed log q [B, V] at the root under `ctx.sampling`'s
        temperature and filters): what a sampled child at depth 1 is drawn from, whether or not this tree
        samples (`auto`'s shadow drafts price a sampled 1-node chain with it at T > 0)."""
        return self._propose(ctx, state, draft_state, key, root_q=True)

    def level_logits(self, ctx: DraftContext, state, draft_state: RingCache) -> list[jax.Array]:
        """The draft's logits [B, w_d, Vd] at each queried level of the greedy tree `propose` builds (root first):
        what parity tests compare with a reference implementation."""
        levels = []
        self._propose(ctx, state, draft_state, jax.random.key(0), root_q=False, record=levels)
        return levels

    def _propose(self, ctx: DraftContext, state, draft_state: RingCache, key: jax.Array, root_q: bool, record=None):
        dp = DraftParams.of(ctx.draft_params)
        vocab_ids = dp.vocab_ids
        net = self._bound(ctx)
        cfg, tp = ctx.config, ctx.target_params
        ring = draft_state
        cache = state.cache
        widths = (1, *self.tree.widths)  # level 0 is the root
        offsets = self.tree.level_offsets()
        T = self.tree.num_nodes
        B = state.root.shape[0]
        n = cache.lengths  # [B]: the root sits at position n
        stochastic = ctx.sampling.sample_drafts

        tokens = jnp.zeros((B, T), jnp.int32).at[:, 0].set(state.root)
        parents = jnp.full((B, T), -1, jnp.int32)
        scores = jnp.zeros((B, T), jnp.float32)  # cumulative draft log-prob
        valid = jnp.ones((B, T), bool)
        anc = jnp.zeros((B, T, T), bool).at[:, 0, 0].set(True)
        k0, v0 = net.self_kv(tp, state.root[:, None], n[:, None])
        tree_k = jnp.zeros((B, T) + k0.shape[2:], k0.dtype).at[:, :1].set(k0)  # [B, T, K, H]
        tree_v = jnp.zeros_like(tree_k).at[:, :1].set(v0)
        logq = jnp.full((B, T, cfg.vocab_size), -jnp.inf, jnp.float32) if stochastic else None
        q_root = None

        for d in range(self.tree.depth):
            lo, w = offsets[d], widths[d]
            q_tokens = tokens[:, lo : lo + w]  # [B, w]
            pos = jnp.broadcast_to((n + d)[:, None], (B, w))
            ring_lo = None
            if self.draft.frontier_window:  # released: query i of w sees keys >= n - W - (w - i) at a tree step
                extra = 0 if d == 0 else w - jnp.arange(w)
                ring_lo = (n, jnp.broadcast_to((n - self.draft.window)[:, None] - extra, (B, w)))
            hidden = net.step(
                tp,
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
                ring_lo=ring_lo,
            )
            logits = net.logits(tp, hidden, vocab_ids, dp.vocab_head)  # [B, w, Vd]
            if record is not None:
                record.append(logits)
            w_next = widths[d + 1]
            if stochastic or (root_q and d == 0):
                # q is the draft's distribution after the target's own penalty/temperature/top-k/top-p/min-p.
                logp = processed_logprobs(logits, ctx.sampling, self._penalized(ctx, state, tokens, anc, lo, w, d))
                full = (
                    logp
                    if vocab_ids is None
                    else jnp.full((B, w, cfg.vocab_size), -jnp.inf).at[..., vocab_ids].set(logp)
                )
                if d == 0:
                    q_root = full[:, 0]
            if stochastic:
                logq = logq.at[:, lo : lo + w].set(full)
                child_parent, child_tok, best, ok = _sample_level(logp, scores[:, lo : lo + w], w_next, key, d)
                child_parent = lo + child_parent
                ok = ok & jnp.take_along_axis(valid, child_parent, axis=1)
            else:
                logp = jax.nn.log_softmax(logits, axis=-1)
                # The global top-w_next over all candidates lies within each node's own top-w_next.
                top_lp, top_ids = jax.lax.top_k(logp, w_next)  # [B, w, w_next]
                cand = (scores[:, lo : lo + w, None] + top_lp).reshape(B, w * w_next)
                best, flat = jax.lax.top_k(cand, w_next)  # [B, w_next]
                child_parent = lo + flat // w_next
                child_tok = jnp.take_along_axis(top_ids.reshape(B, -1), flat, axis=1)
                ok = jnp.ones((B, w_next), bool)
            if vocab_ids is not None:
                child_tok = jnp.take(vocab_ids, child_tok)
            c_lo = offsets[d + 1]
            sl = slice(c_lo, c_lo + w_next)
            tokens = tokens.at[:, sl].set(child_tok.astype(jnp.int32))
            parents = parents.at[:, sl].set(child_parent.astype(jnp.int32))
            scores = scores.at[:, sl].set(best)
            valid = valid.at[:, sl].set(ok)
            rows = jnp.take_along_axis(anc, child_parent[:, :, None], axis=1)  # the parents' ancestor rows
            rows = rows | jax.nn.one_hot(jnp.arange(c_lo, c_lo + w_next), T, dtype=bool)[None]
            anc = anc.at[:, sl].set(rows)
            ck, cv = net.self_kv(tp, tokens[:, sl], jnp.broadcast_to((n + d + 1)[:, None], (B, w_next)))
            tree_k = tree_k.at[:, sl].set(ck)
            tree_v = tree_v.at[:, sl].set(cv)

        depth = jnp.broadcast_to(jnp.asarray(self.tree.node_depths()), (B, T))
        if not stochastic:
            return Tree(tokens, parents, depth, valid, anc), q_root
        anc = anc & valid[:, :, None] & valid[:, None, :]
        sampled = jnp.ones((B, T), bool).at[:, 0].set(False)
        return Tree(tokens, parents, depth, valid, anc, logq, sampled), q_root

    def first_children(
        self, ctx: DraftContext, ring: RingCache, cache, tokens: jax.Array, start: jax.Array, width: int
    ):
        """[B, k, width] token ids: the draft's top-`width` children (best first, as `propose` ranks a greedy
        tree's first level) at each of k consecutive committed roots `tokens` [B, k], root i at position
        start + i, computed in one pass over the k roots (teacher-forced), not k proposals.

        Root i sees what `propose` would have seen there: the draft's own K/V of the positions before it (`ring`,
        filled below `start`, then roots 0 .. i) and the target's committed cache [0, start + i), which `cache`
        must hold. The one difference: the ring is not trimmed to the window per root, so a root late in the
        run sees up to i of the oldest keys more (as a tree node at depth i does). `auto` learns the draft's
        first-depth acceptance from this at every root an AR stretch passed, where a shadow draft sees one."""
        dp = DraftParams.of(ctx.draft_params)
        vocab_ids = dp.vocab_ids
        net = self._bound(ctx)
        cfg, tp = ctx.config, ctx.target_params
        B, k = tokens.shape
        pos = start[:, None] + jnp.arange(k)[None]
        own_k, own_v = net.self_kv(tp, tokens, pos)
        causal = jnp.broadcast_to(jnp.tril(jnp.ones((k, k), bool))[None], (B, k, k))
        # Target keys: [0, start - 1) unmasked, then positions start - 1 + j for key j <= query i; every query
        # sees at least one tail key, so no part is empty.
        layer = cfg.num_layers - 1
        idx = jnp.clip(start[:, None] - 1 + jnp.arange(k)[None], 0, cache.k.shape[3] - 1)  # [B, k]

        def tail(buf):  # [L, B, K, S, H] -> [B, k, K, H]
            return jnp.take_along_axis(buf[layer], idx[:, None, :, None], axis=2).swapaxes(1, 2)

        hidden = net.step(
            tp,
            tokens,
            pos,
            ring,
            own_k,
            own_v,
            causal,
            cache.k,
            cache.v,
            start - 1,
            backend=ctx.backend,
            target_tail=(tail(cache.k), tail(cache.v), causal),
        )
        _, top = jax.lax.top_k(net.logits(tp, hidden, vocab_ids, dp.vocab_head), width)  # [B, k, width]
        return top if vocab_ids is None else jnp.take(vocab_ids, top)

    def _penalized(self, ctx: DraftContext, state, tokens, anc, lo: int, w: int, d: int):
        """The frontier's contextual-penalty windows (over the draft's vocabulary), or None when it is off."""
        s = ctx.sampling
        if not s.penalized:
            return None
        B = tokens.shape[0]
        depth = jnp.broadcast_to(jnp.asarray(self.tree.node_depths()), tokens.shape)
        mask = tree_penalty_mask(
            state.out,
            state.num_out,
            tokens,
            anc[:, lo : lo + w],
            depth,
            s.penalty_window,
            ctx.config.vocab_size,
            self.tree.depth,
            query_depth=jnp.full((B, w), d, jnp.int32),
        )
        vocab_ids = DraftParams.of(ctx.draft_params).vocab_ids
        return mask if vocab_ids is None else mask[..., vocab_ids]

    def update(self, ctx: DraftContext, state, draft_state: RingCache, verdict: Verdict):
        """The root and the accepted nodes are committed: their draft K/V join the window."""
        A = verdict.path.shape[1]
        start = state.cache.lengths - verdict.count  # the old n: the root's position
        toks = verdict.path_tokens  # [B, A]
        k, v = self._bound(ctx).self_kv(ctx.target_params, toks, start[:, None] + jnp.arange(A)[None])
        return ring_write(draft_state, k, v, start, verdict.count)


def _sample_level(logq: jax.Array, scores: jax.Array, w_next: int, key: jax.Array, depth: int):
    """One level of a sampled tree. logq [B, w, Vd] at the frontier, scores [B, w] their cumulative log q.

    How many children each frontier node gets is decided first and without sampling: as many as it has among
    the deterministic global top-w_next by cumulative log q (the beam's shape). Then each node's children are
    drawn from its q without replacement (Gumbel-top-k: perturbed log q in decreasing order is a sequential
    draw without replacement). Returns (parent [B, w_next] frontier index, token, cumulative log q, valid),
    siblings in the order drawn. A child whose q is 0 (support smaller than the allotment) is invalid."""
    B, w, _ = logq.shape
    top_lp, _ = jax.lax.top_k(logq, w_next)  # [B, w, w_next]
    _, flat = jax.lax.top_k((scores[:, :, None] + top_lp).reshape(B, w * w_next), w_next)
    alloc = jnp.sum(jax.nn.one_hot(flat // w_next, w, dtype=jnp.int32), axis=1)  # [B, w] children per node
    gumbel = jax.random.gumbel(jax.random.fold_in(key, depth), logq.shape)
    perturbed, tok = jax.lax.top_k(logq + gumbel, w_next)  # [B, w, w_next] draws in order
    rank = jnp.arange(w_next)[None, None]
    keep = rank < alloc[:, :, None]  # exactly w_next kept per row
    # Kept draws, ordered by (parent, draw rank): smallest sort key first.
    order_key = jnp.where(keep, jnp.arange(w)[None, :, None] * w_next + rank, w * w_next).reshape(B, -1)
    _, pick = jax.lax.top_k(-order_key, w_next)
    parent = (pick // w_next).astype(jnp.int32)
    child_tok = jnp.take_along_axis(tok.reshape(B, -1), pick, axis=1)
    child_lq = jnp.take_along_axis(jnp.take_along_axis(logq, tok, axis=2).reshape(B, -1), pick, axis=1)
    ok = jnp.isfinite(jnp.take_along_axis(perturbed.reshape(B, -1), pick, axis=1))
    best = jnp.take_along_axis(scores, parent, axis=1) + jnp.where(ok, child_lq, -1e30)
    return parent, child_tok, best, ok
