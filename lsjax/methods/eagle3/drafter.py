"""The EAGLE-3 drafter: a dynamic top-k tree under a fixed node budget (EAGLE-2's), drafted by an EAGLE-3 draft
(`lsjax.methods.eagle3.model.Eagle3Draft`, run through its `apply`), verified by the same engine as every other
drafter.

The draft keeps its own K/V cache of every committed position (one layer; position t holds the pair
(h_t, x_{t+1})), so its length is always the target's. After each verification the accepted path's pairs
are run through the draft in one pass (the target's three streams at those nodes come from the verify forward
itself, `Drafter.aux_hidden_layers`), which also leaves the draft's state at the last pair: its logits guess
the root's children.

A tree (`propose`): the root's top-k children by the draft's log-probability form the first frontier; each of
`depth - 1` expansions runs the draft once on the k frontier nodes (each attending to the committed cache and
its own ancestors in the tree, at position n + level - 1) and scores their top-k children by cumulative
log-probability; the k best of those k^2 become the next frontier. Of everything scored, the `nodes` best
become the tree, in the order they were scored (a parent before its children). Shapes are static: k, the
expansions and the node count; which parents the nodes hang from, and so each level's width, are data.

Lossless whatever the draft: the tree is a function of the committed context only, walked greedily at T = 0
and by sample-and-match at T > 0 (`lsjax.engine.verify`).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from lsjax.cache import KVCache, commit
from lsjax.config import ConfigError, ModelConfig
from lsjax.engine.types import DraftContext, Drafter, PrefillHook, Verdict
from lsjax.methods.eagle3 import model as em
from lsjax.models import target
from lsjax.models.layers import shape_problem
from lsjax.tree import Tree, TreeConfig, ancestor_mask

CHUNK = 256  # prompt pairs per pass at `init`


@dataclasses.dataclass(frozen=True)
class Eagle3Tree:
    """The dynamic tree's budget: `nodes` drafted tokens (the root aside), `depth` levels at most, the `top_k`
    children scored per expanded node and the `top_k` nodes expanded per level (EAGLE-2/3's total_token - 1,
    depth + 1 and top_k)."""

    nodes: int = 59
    depth: int = 8
    top_k: int = 10

    def __post_init__(self):
        for name in ("nodes", "depth", "top_k"):
            v = getattr(self, name)
            if not (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
                raise ConfigError(f"eagle3 tree.{name}: must be an integer >= 1, got {v!r}")
        if self.nodes < self.depth:
            raise ConfigError(
                f"eagle3 tree.nodes: {self.nodes} nodes cannot fill {self.depth} levels; give nodes >= depth"
            )
        if self.nodes > self.pool:
            raise ConfigError(
                f"eagle3 tree.nodes: {self.nodes} is more than the {self.pool} candidates a depth-{self.depth}, "
                f"top-{self.top_k} search scores"
            )

    @property
    def pool(self) -> int:
        """Candidates scored: k at the first level, k^2 at each later one."""
        return self.top_k + (self.depth - 1) * self.top_k**2

    def pool_levels(self) -> np.ndarray:
        k = self.top_k
        return np.concatenate([np.ones(k)] + [np.full(k * k, d + 2) for d in range(self.depth - 1)]).astype(np.int32)


# The published defaults (EaModel: total_token 60, depth 7 expansions, top_k 10 for EAGLE-3; 60, 5, 8 for
# EAGLE-2) and smaller trees for devices where verifying 60 nodes is not free.
TREE_PRESETS = {
    "eagle3": Eagle3Tree(59, 8, 10),
    "eagle2": Eagle3Tree(59, 6, 8),
    "small": Eagle3Tree(15, 5, 4),
    "cpu": Eagle3Tree(6, 4, 2),
}


def parse_tree(spec) -> Eagle3Tree:
    """A preset name or NODES,DEPTH,TOP_K."""
    if isinstance(spec, Eagle3Tree):
        return spec
    if spec in TREE_PRESETS:
        return TREE_PRESETS[spec]
    try:
        nodes, depth, top_k = (int(x) for x in str(spec).split(","))
    except ValueError:
        raise ConfigError(
            f"--eagle-tree: {spec!r} is neither a preset ({', '.join(TREE_PRESETS)}) nor NODES,DEPTH,TOP_K"
        ) from None
    return Eagle3Tree(nodes, depth, top_k)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Eagle3State:
    cache: KVCache  # the draft's K/V, one layer: positions [0, n), as long as the target's cache
    out: jax.Array  # [B, D] fp32: the draft's state at the last committed pair (its logits guess the root's child)


@dataclasses.dataclass(frozen=True)
class Eagle3Drafter(Drafter):
    draft: em.Eagle3Config
    budget: Eagle3Tree = Eagle3Tree()

    name = "eagle3"

    @property
    def aux_hidden_layers(self) -> tuple[int, ...]:
        return self.draft.aux_layers

    @property
    def tree(self) -> TreeConfig:
        """The node count and depth verification is shaped for (how wide each level is varies per tree)."""
        b = self.budget
        return TreeConfig((b.nodes - b.depth + 1,) + (1,) * (b.depth - 1))

    def levels(self):
        return None

    def check_params(self, draft_params, config: ModelConfig) -> str | None:
        d = self.draft
        if not isinstance(draft_params, dict):
            got = type(draft_params).__name__
            return f"eagle3 needs its draft's params (lsjax.methods.eagle3.checkpoint.read_draft), got {got}"
        if d.layer.vocab_size != config.vocab_size or d.target_hidden_size != config.hidden_size:
            return (
                f"this EAGLE-3 draft is for a target with vocabulary {d.layer.vocab_size} and hidden size "
                f"{d.target_hidden_size}; {config.name} has {config.vocab_size} and {config.hidden_size}"
            )
        if max(d.aux_layers) >= config.num_layers:
            return f"the draft reads target layers {d.aux_layers}; {config.name} has {config.num_layers} layers"
        if not d.own_embed and d.hidden_size != config.hidden_size:
            return (
                f"the draft has no embedding of its own and its hidden size {d.hidden_size} is not the "
                f"target's {config.hidden_size}"
            )
        return shape_problem(draft_params, em.Eagle3Draft(d).schema())

    # ------------------------------------------------------------------------------------------- contract

    def prefill_hook(self, ctx: DraftContext) -> PrefillHook:
        """The prompt's pairs go through the draft chunk by chunk as the prefill computes the target's streams,
        all but the last one (its next token is the first emitted one, not known yet): the carry keeps the
        draft's cache and the streams at each row's last prompt position for `init`."""
        d = self.draft

        def start(batch: int):
            dcache = KVCache.zeros(d.layer, batch, ctx.capacity)
            return dcache, jnp.zeros((batch, len(d.aux_layers) * d.target_hidden_size), jnp.dtype(ctx.config.dtype))

        def step(carry, streams, start_pos, tokens, lengths):
            dcache, last = carry
            B, C = streams.shape[:2]
            pos = start_pos + jnp.broadcast_to(jnp.arange(C, dtype=jnp.int32), (B, C))
            idx = start_pos + 1 + jnp.arange(C)  # each position's next token (past the buffer: 0, never committed)
            pairs = jnp.take(tokens, idx, axis=1, mode="fill", fill_value=0).astype(jnp.int32)
            count = jnp.clip(lengths - 1 - start_pos, 0, C)  # the pairs whose next token is in the prompt
            _, dcache = self._commit_pairs(ctx, dcache, streams, pairs, pos, count)
            at = jnp.clip(lengths - 1 - start_pos, 0, C - 1)
            here = jnp.take_along_axis(streams, at[:, None, None], axis=1)[:, 0]
            ends_here = (lengths - 1 >= start_pos) & (lengths - 1 < start_pos + C)
            return dcache, jnp.where(ends_here[:, None], here, last)

        return PrefillHook(d.aux_layers, start, step)

    def init(self, ctx: DraftContext, state) -> Eagle3State:
        """The draft over every prompt pair (h_t, x_{t+1}), the last one pairing with the first emitted token.
        After a prefill that ran `prefill_hook` only that last pair is left; otherwise (`engine.begin` after a
        prefill of the caller's) the hook's steps run here, on the target's streams from a second pass of its
        first layers over the prefilled cache."""
        dcache, last = ctx.prefilled if ctx.prefilled is not None else self._replay_prefill(ctx, state.cache)
        lengths = ctx.prompt_lengths.astype(jnp.int32)
        root = state.root[:, None].astype(jnp.int32)
        h, dcache = self._commit_pairs(ctx, dcache, last[:, None], root, (lengths - 1)[:, None], jnp.ones_like(lengths))
        return Eagle3State(dcache, h[:, 0])

    def _replay_prefill(self, ctx: DraftContext, cache: KVCache):
        """`prefill_hook`'s carry after a prefill that did not run it, from the prompt and its prefilled cache."""
        hook = self.prefill_hook(ctx)
        tokens, lengths = ctx.prompt_tokens, ctx.prompt_lengths.astype(jnp.int32)
        B, P = tokens.shape
        C = min(CHUNK, P)
        tokens = jnp.pad(tokens, ((0, 0), (0, -(-P // C) * C - P)))

        def body(carry):
            i, drafted = carry
            start = i * C
            toks = jax.lax.dynamic_slice_in_dim(tokens, start, C, axis=1)
            pos = start + jnp.broadcast_to(jnp.arange(C, dtype=jnp.int32), (B, C))
            before = KVCache(cache.k, cache.v, jnp.full((B,), start, jnp.int32))
            return i + 1, hook.step(drafted, self._streams(ctx, toks, pos, before), start, tokens, lengths)

        num_chunks = (jnp.max(lengths) + C - 1) // C
        return jax.lax.while_loop(lambda c: c[0] < num_chunks, body, (jnp.int32(0), hook.init(B)))[1]

    def propose(self, ctx: DraftContext, state, draft_state: Eagle3State, key=None) -> Tree:
        score, tok, parent, _ = self.grow(ctx, draft_state)
        return self._select(state.root, score, tok, parent)

    def grow(self, ctx: DraftContext, draft_state: Eagle3State):
        """The tree search before the selection: every candidate scored (cumulative log-probability [B, pool],
        target token, parent's pool index or -1 for the root's children), and the draft's logits at each step
        (the root's [B, Vd], then each expansion's [B, k, Vd])."""
        d, b = self.draft, self.budget
        draft = self._draft(ctx)
        k, S = b.top_k, b.depth - 1
        B = draft_state.out.shape[0]
        n = draft_state.cache.lengths
        table = self._target_embed(ctx)

        heads = [draft(draft_state.out, method="logits")]
        logp = jax.nn.log_softmax(heads[0], axis=-1)  # [B, Vd]
        score, ids = jax.lax.top_k(logp, k)  # the first frontier
        tok = draft(ids, method="target_ids")
        pool_score, pool_tok, pool_parent = [score], [tok], [jnp.full((B, k), -1, jnp.int32)]
        front_pool = jnp.broadcast_to(jnp.arange(k, dtype=jnp.int32), (B, k))
        g = jnp.broadcast_to(draft_state.out[:, None], (B, k, d.hidden_size))
        c = d.layer
        buf_k = jnp.zeros((B, max(S, 1) * k, c.num_kv_heads, c.head_dim), jnp.dtype(c.dtype))
        buf_v = jnp.zeros_like(buf_k)
        mask = jax.nn.one_hot(jnp.arange(k), max(S, 1) * k, dtype=bool)[None].repeat(B, 0)  # [B, k, S k]
        base = k
        for i in range(S):
            pos = jnp.broadcast_to((n + i)[:, None], (B, k))
            attend = em.attend_over(
                draft_state.cache.k, draft_state.cache.v, n, backend=ctx.backend, fresh=(buf_k, buf_v, i * k, mask)
            )
            out, nk, nv = draft(tok, g, pos, attend, table, method="expand")
            buf_k = jax.lax.dynamic_update_slice_in_dim(buf_k, nk.astype(buf_k.dtype), i * k, axis=1)
            buf_v = jax.lax.dynamic_update_slice_in_dim(buf_v, nv.astype(buf_v.dtype), i * k, axis=1)
            heads.append(draft(out, method="logits"))
            lp, ids = jax.lax.top_k(jax.nn.log_softmax(heads[-1], axis=-1), k)  # [B, k, k]
            cand = (score[:, :, None] + lp).reshape(B, k * k)
            pool_score.append(cand)
            pool_tok.append(draft(ids, method="target_ids").reshape(B, k * k))
            pool_parent.append(jnp.repeat(front_pool, k, axis=1))
            score, best = jax.lax.top_k(cand, k)  # the next frontier
            parent = best // k
            tok = jnp.take_along_axis(pool_tok[-1], best, axis=1)
            g = jnp.take_along_axis(out, parent[:, :, None], axis=1)
            own = jax.nn.one_hot((i + 1) * k + jnp.arange(k), max(S, 1) * k, dtype=bool)[None]
            mask = jnp.take_along_axis(mask, parent[:, :, None], axis=1) | own
            front_pool = base + best.astype(jnp.int32)
            base += k * k
        cat = functools.partial(jnp.concatenate, axis=1)
        return cat(pool_score), cat(pool_tok), cat(pool_parent), heads

    def verify_extras(self, ctx: DraftContext, tree: Tree, hidden, logits, taps=None):
        return taps  # [B, T, A Dt]: the target's streams at every node

    def update(self, ctx: DraftContext, state, draft_state: Eagle3State, verdict: Verdict) -> Eagle3State:
        """The accepted path's pairs (h at the root and each accepted node, x the token after it) join the
        draft's cache; its state at the last one guesses the next root's children."""
        A = verdict.path.shape[1]
        aux = jnp.take_along_axis(verdict.extras, verdict.path[:, :, None], axis=1)  # [B, A, A Dt]
        start = draft_state.cache.lengths
        pos = start[:, None] + jnp.arange(A, dtype=jnp.int32)[None]
        h, dcache = self._commit_pairs(ctx, draft_state.cache, aux, verdict.emitted(), pos, verdict.count)
        last = jnp.take_along_axis(h, jnp.clip(verdict.count - 1, 0, A - 1)[:, None, None], axis=1)[:, 0]
        return Eagle3State(dcache, jnp.where((verdict.count > 0)[:, None], last, draft_state.out))

    # --------------------------------------------------------------------------------------------- pieces

    def _streams(self, ctx: DraftContext, tokens, positions, cache: KVCache) -> jax.Array:
        """The target's residual streams entering `aux_layers` for a causal run of tokens [B, C] after `cache`:
        [B, C, A Dt] in the model's dtype (only the layers below the deepest one run)."""
        layers = self.draft.aux_layers
        net = target.Transformer(ctx.config)
        *_, streams = net.apply(
            {"params": ctx.target_params},
            tokens,
            positions,
            cache,
            layers,
            backend=ctx.backend,
            upto=max(layers),
            method="streams",
        )
        return streams.astype(jnp.dtype(ctx.config.dtype))

    def _commit_pairs(self, ctx: DraftContext, dcache: KVCache, aux, pairs, positions, count):
        """The draft on consecutive pairs (aux [B, T, A Dt], the next tokens pairs [B, T]) after its cache: (its
        states [B, T, D], the cache with the first `count` [B] pairs' K/V committed)."""
        attend = em.attend_over(dcache.k, dcache.v, dcache.lengths, backend=ctx.backend)
        h, k, v = self._draft(ctx)(aux, pairs, positions, attend, self._target_embed(ctx))
        return h, commit(dcache, k[None], v[None], count)

    def _draft(self, ctx: DraftContext):
        """`Eagle3Draft(draft).apply` over the context's draft params: call it with the method's arguments."""
        return functools.partial(em.Eagle3Draft(self.draft).apply, {"params": ctx.draft_params})

    def _target_embed(self, ctx: DraftContext):
        """The target's embedding table when the draft has none of its own (the draft reads it), else None."""
        return None if self.draft.own_embed else ctx.target_params["embed"]

    def _select(self, root, score, tok, parent_pool) -> Tree:
        """The `nodes` best scored candidates as a tree, in scoring order (parents first)."""
        b = self.budget
        B = root.shape[0]
        _, top = jax.lax.top_k(score, b.nodes)
        sel = jnp.sort(top, axis=1).astype(jnp.int32)  # [B, N] pool indices, ascending
        toks = jnp.take_along_axis(tok, sel, axis=1).astype(jnp.int32)
        ppool = jnp.take_along_axis(parent_pool, sel, axis=1)
        at = jax.vmap(jnp.searchsorted)(sel, ppool).astype(jnp.int32)
        found = jnp.take_along_axis(sel, jnp.clip(at, 0, b.nodes - 1), axis=1) == ppool
        # A parent left out (a tie at the budget's edge) takes its subtree with it.
        parents = jnp.where(ppool < 0, 0, jnp.where(found, at + 1, 0))
        valid = (ppool < 0) | found
        full_valid = jnp.concatenate([jnp.ones((B, 1), bool), valid], axis=1)
        full_parents = jnp.concatenate([jnp.full((B, 1), -1, jnp.int32), parents], axis=1)
        for _ in range(b.depth):
            full_valid = full_valid & jnp.take_along_axis(full_valid, jnp.maximum(full_parents, 0), axis=1)
        depth = jnp.take(jnp.asarray(b.pool_levels()), sel)
        return Tree(
            jnp.concatenate([root[:, None].astype(jnp.int32), toks], axis=1),
            full_parents,
            jnp.concatenate([jnp.zeros((B, 1), jnp.int32), depth], axis=1),
            full_valid,
            ancestor_mask(full_parents, full_valid, b.depth),
        )
