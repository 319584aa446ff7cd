"""Speculative Streaming (lossless mode): the verify forward drafts the next tree, no draft forward at all.

Each step's verification forward also yields the gamma speculative streams (`lsjax.methods.streams.model`'s
module `SpeculativeStreams`, run through its `apply`): the engine hands the drafter the residual stream entering
layer L = N - N_s, the nodes' K/V and the committed cache (`extra_hidden_layer`). With `streams_at="nodes"` (the
paper's layout) `verify_extras` runs the top N_s layers' streams at every node; with "accepted" (default)
`update` runs them at the last accepted node only, over the cache that now holds every key it may see (same
outputs, gamma rows instead of gamma x T).
`update` keeps the top-k tokens of each stream at the last accepted node, and the next `propose` builds its
tree from those alone: stream d's candidates fill depth d (stream d at node t predicts the token
at t + 1 + d, and the next root, the bonus, sits at t + 1). A beam over the product of the streams' top-k
(cumulative stream log-probability) keeps `widths[d]` nodes per depth.

Parallel tree pruning (§2.3), optional: with `prune_to`, the proposed tree goes into the verify forward,
and at layer L the early-exit head (low-rank adapter + LM head on the residual there) scores each parent ->
child transition; a beam over the cumulative early-exit log-probability keeps `prune_to[d]` nodes per depth
(ancestor-closed, static shape) and only those run through the top layers, the streams and the LM head.

Lossless: the tree depends on the context only (never on the verification key), and is deterministic, so
T > 0 verification is sample-and-match (`lsjax.engine.verify`); the main stream is the plain target.

Stream checkpoints (`lsjax.artifacts` kind "streams": bfloat16 `model.safetensors` + `config.json`; the old
`params.npz` + `streams.json` still load) are written by `lsjax.methods.streams.train` and read by
`lsjax.methods.streams.checkpoint`; the one shipped for a target lives in `lsjax/drafts/<target>/streams/`.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from lsjax.config import ConfigError
from lsjax.engine.types import DraftContext, Drafter, Verdict
from lsjax.methods.streams import model as ss
from lsjax.methods.streams.config import NO_MESH
from lsjax.models import target
from lsjax.models.layers import shape_problem
from lsjax.tree import Tree, TreeConfig, make_tree

STREAMS_AT = ("accepted", "nodes")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class StreamTopK:
    """The draft state: each stream's top-k at the last accepted node (constant size)."""

    tokens: jax.Array  # [B, S, k] int32
    logprobs: jax.Array  # [B, S, k] float32


@dataclasses.dataclass(frozen=True)
class StreamsDrafter(Drafter):
    streams: ss.StreamsConfig = ss.StreamsConfig()
    widths: tuple[int, ...] = (2, 2, 2)  # proposed nodes per depth (depth <= gamma)
    prune_to: tuple[int, ...] | None = None  # nodes per depth kept by early-exit pruning (None: no pruning)
    layer: int = 26  # L = N - N_s of the target (`for_target` sets it)
    # Where the streams run: "nodes" = at every verified node inside verification (the paper's layout, free
    # when fused into the target's batched forward on an accelerator); "accepted" = after acceptance, at the
    # last accepted node only, over the committed cache (the same stream outputs: that node's keys are all
    # committed by then; on a CPU, gamma rows instead of gamma x T through the top layers).
    streams_at: str = "accepted"

    name = "streams"
    no_mesh = NO_MESH

    def check_params(self, draft_params, config) -> str | None:
        if not isinstance(draft_params, dict):
            got = type(draft_params).__name__
            return f"streams needs its adapters' params (load_streams or registry.build), got {got}"
        return shape_problem(draft_params, ss.SpeculativeStreams(config, self.streams).schema())

    def __post_init__(self):
        if self.streams_at not in STREAMS_AT:
            raise ConfigError(f"streams_at: must be one of {'|'.join(STREAMS_AT)}, got {self.streams_at!r}")
        TreeConfig(self.widths)
        if len(self.widths) > self.streams.num_streams:
            raise ConfigError(
                f"streams tree: {len(self.widths)} levels need as many streams, got {self.streams.num_streams}"
            )
        if self.prune_to is not None:
            TreeConfig(self.prune_to)
            ok = len(self.prune_to) == len(self.widths) and all(
                p <= w for p, w in zip(self.prune_to, self.widths, strict=True)
            )
            if not ok:
                raise ConfigError(
                    f"streams tree: pruned widths {self.prune_to} must have one width <= each of {self.widths}"
                )

    @classmethod
    def for_target(
        cls, config, streams: ss.StreamsConfig, widths=(2, 2, 2), prune_to=None, streams_at="accepted"
    ) -> StreamsDrafter:
        prune_to = tuple(prune_to) if prune_to else None
        return cls(streams, tuple(widths), prune_to, streams.first_layer(config), streams_at)

    @property
    def extra_hidden_layer(self) -> int:
        return self.layer

    @property
    def proposed(self) -> TreeConfig:
        return TreeConfig(self.widths)

    @property
    def tree(self) -> TreeConfig:  # what verification walks
        return TreeConfig(self.prune_to) if self.prune_to else self.proposed

    @property
    def topk(self) -> int:
        return max(self.widths)

    # ------------------------------------------------------------------ the contract

    def init(self, ctx: DraftContext, state) -> StreamTopK:
        """The streams at the last prompt token (prefill does not run them): the layers below L for that token
        once more, then the streams over the committed prompt."""
        cfg, tp = ctx.config, ctx.target_params
        lengths = ctx.prompt_lengths
        last = jnp.take_along_axis(ctx.prompt_tokens, (lengths - 1)[:, None], axis=1)  # [B, 1]
        pos = (lengths - 1)[:, None]
        below = dataclasses.replace(state.cache, lengths=lengths - 1)  # the token sees the prompt before it
        net = target.Transformer(cfg).bind({"params": tp})
        if self.layer > 0:
            mid, _, _ = net.hidden(last, pos, below, backend=ctx.backend, layers=(0, self.layer))
            mid = mid.astype(jnp.dtype(cfg.dtype))  # the streams' dtype (the target's stream is fp32)
        else:
            mid = net.embed(last).astype(jnp.dtype(cfg.dtype))
        return self._topk(ctx, self._streams_over_cache(ctx, state.cache, mid, pos))

    def _streams_over_cache(self, ctx: DraftContext, cache, mid, pos) -> jax.Array:
        """Streams [B, S, D] of the newest committed token (mid [B, 1, D] entering layer L, pos [B, 1]): every
        key it may see is in the cache, its own included."""

        def main(i):
            return ("cache", cache.k, cache.v, cache.lengths, i)

        return self._streams(ctx)(ctx.target_params, mid, pos, main, backend=ctx.backend)[:, 0]

    def _streams(self, ctx: DraftContext):
        """`SpeculativeStreams(config, streams).apply` over the context's stream params: call it with the
        method's arguments."""
        return functools.partial(ss.SpeculativeStreams(ctx.config, self.streams).apply, {"params": ctx.draft_params})

    def propose(self, ctx: DraftContext, state, draft_state: StreamTopK, key=None) -> Tree:
        tc = self.proposed
        B = state.root.shape[0]
        offsets = tc.level_offsets()
        tokens = [state.root[:, None].astype(jnp.int32)]
        parents = [jnp.full((B, 1), -1, jnp.int32)]
        scores = jnp.zeros((B, 1), jnp.float32)
        for d, w in enumerate(tc.widths):
            # Every node of depth d gets the same candidate children: stream d + 1's top-k.
            lp = draft_state.logprobs[:, d, :w]  # [B, w]: within each parent's top-w lies the global top-w
            cand = (scores[:, :, None] + lp[:, None, :]).reshape(B, -1)
            best, flat = jax.lax.top_k(cand, w)
            tokens.append(jnp.take_along_axis(draft_state.tokens[:, d, :w], flat % w, axis=1))
            parents.append((offsets[d] + flat // w).astype(jnp.int32))
            scores = best
        tokens, parents = jnp.concatenate(tokens, 1), jnp.concatenate(parents, 1)
        return make_tree(tokens, parents, jnp.ones_like(tokens, bool), tc)

    def prune(self, ctx: DraftContext, tree: Tree, mid_hidden: jax.Array):
        if self.prune_to is None:
            return None
        early = self._streams(ctx)(ctx.target_params, mid_hidden, method="exit_logits")
        return prune_tree(tree, self.proposed, self.tree, early)

    def verify_extras(self, ctx: DraftContext, tree: Tree, hidden, logits, taps=None) -> jax.Array:
        """ "nodes": the streams' final residuals [B, T, S, D] at every verified node (the head runs in `update`,
        at the one node that matters); "accepted": the residual entering layer L [B, T, D]."""
        if self.streams_at == "accepted":
            return taps.mid_hidden
        main = ss.tree_main_kv(taps, tree.mask)
        return self._streams(ctx)(ctx.target_params, taps.mid_hidden, taps.positions, main, backend=ctx.backend)

    def update(self, ctx: DraftContext, state, draft_state: StreamTopK, verdict: Verdict) -> StreamTopK:
        last = jnp.take_along_axis(verdict.path, verdict.num_accepted[:, None], axis=1)[:, 0]  # [B]
        if self.streams_at == "accepted":
            mid = jnp.take_along_axis(verdict.extras, last[:, None, None], axis=1)  # [B, 1, D]
            pos = (state.cache.lengths - 1)[:, None]  # the cache now ends with the last accepted node
            s = self._streams_over_cache(ctx, state.cache, mid, pos)
        else:
            s = jnp.take_along_axis(verdict.extras, last[:, None, None, None], axis=1)[:, 0]  # [B, S, D]
        new = self._topk(ctx, s)
        # A finished row keeps its state (its verdict is empty).
        keep = (verdict.count == 0)[:, None, None]
        return StreamTopK(
            jnp.where(keep, draft_state.tokens, new.tokens), jnp.where(keep, draft_state.logprobs, new.logprobs)
        )

    def _topk(self, ctx: DraftContext, s: jax.Array) -> StreamTopK:
        logits = self._streams(ctx)(ctx.target_params, s[:, : len(self.widths)], method="logits")  # [B, depth, V]
        lp, ids = jax.lax.top_k(jax.nn.log_softmax(logits, axis=-1), self.topk)
        return StreamTopK(ids.astype(jnp.int32), lp)


def prune_tree(tree: Tree, full: TreeConfig, kept: TreeConfig, exit_logits: jax.Array):
    """Early-exit pruning: a beam over cumulative early-exit log-probabilities of parent -> child transitions,
    `kept.widths[d]` nodes per depth among the children of the nodes kept at depth d - 1. Returns (the
    pruned tree, idx [B, T'] of its nodes in `tree`): ancestor-closed, root first, level by level."""
    B, T = tree.tokens.shape
    logp = jax.nn.log_softmax(exit_logits, axis=-1)  # [B, T, V]: the next token after each node, early
    trans = logp[jnp.arange(B)[:, None], jnp.maximum(tree.parents, 0), tree.tokens]  # [B, T]: log p(child | parent)
    f_off = full.level_offsets()
    score = jnp.zeros((B, T), jnp.float32)
    alive = jnp.zeros((B, T), bool).at[:, 0].set(True)
    idx = [jnp.zeros((B, 1), jnp.int32)]
    for d, w in enumerate(kept.widths):
        lo, hi = f_off[d + 1], f_off[d + 1] + full.widths[d]
        par = tree.parents[:, lo:hi]
        ok = jnp.take_along_axis(alive, par, axis=1) & tree.valid[:, lo:hi]
        cum = jnp.take_along_axis(score, par, axis=1) + trans[:, lo:hi]
        best, pick = jax.lax.top_k(jnp.where(ok, cum, -jnp.inf), w)
        chosen = lo + pick
        rows = jnp.arange(B)[:, None]
        alive = alive.at[rows, chosen].set(jnp.isfinite(best))
        score = score.at[rows, chosen].set(best)
        idx.append(chosen.astype(jnp.int32))
    idx = jnp.concatenate(idx, axis=1)  # [B, T']
    inv = jnp.zeros((B, T), jnp.int32).at[jnp.arange(B)[:, None], idx].set(jnp.arange(idx.shape[1])[None])
    par = jnp.take_along_axis(tree.parents, idx, axis=1)
    parents = jnp.where(par >= 0, jnp.take_along_axis(inv, jnp.maximum(par, 0), axis=1), -1)
    valid = jnp.take_along_axis(alive, idx, axis=1)
    return make_tree(jnp.take_along_axis(tree.tokens, idx, axis=1), parents, valid, kept), idx


# ----------------------------------------------------------------------------- checkpoints
