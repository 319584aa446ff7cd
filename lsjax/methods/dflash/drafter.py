"""The DFlash drafter: one forward of a DFlash draft (`lsjax.methods.dflash.model.DFlashDraft`) proposes a
block, verified as a chain or as a tree by the same engine as every other drafter.

The draft keeps its own K/V cache of the context: per layer, one entry per committed position, made from the
target's streams at that position (`DFlashConfig.taps`), so its length is always the target's. The prompt's
entries come from the prefill (`prefill_hook`); after each verification the accepted path's (the root and the
accepted nodes: the tokens just committed) come from the streams the verify forward computed at every node
(`aux_hidden_layers`). The block's own K/V are never kept: the next block is a new one.

Proposal (`propose`): the block [root, MASK, ..., MASK] at positions n .. n + s - 1 (n the cache length) through
the draft, then the target's LM head at block positions 1 .. D (D = s - 1, or the tree's depth): per-position
logits [B, D, V], independent of one another given the context.

The verified tree has a static shape (`TreeShape`): every node's depth, parent and rank are fixed before
drafting. A node of rank r at depth d holds, at T = 0 (and with deterministic drafts at T > 0), the r-th most
likely token of block position d; the chain is the tree whose every node has rank 0, DFlash's own proposal.
At T > 0 with sampled drafts, each node's c children are instead a draw of c tokens without replacement from
q_{d+1} (the processed distribution at the next block position; Gumbel-top-c with noise of the node's own),
ranks being draw order; every node's q is in `Tree.logq`, so recursive rejection sampling
(`lsjax.engine.verify`) keeps the output exactly the target's distribution. How many children each node has is
fixed by the shape, before any draw, as that proof needs.

A tree budget (`DFlashTree`: NODES, TOP_K and DEPTH) becomes a shape by keeping the top-ranked chain to DEPTH
and then adding, best first, the nodes of highest assumed path probability, each rank r child weighing
`RANK_WEIGHT[r]` of its parent (a prior: rank 0 is accepted far more often than rank 1, and so on).
"""

from __future__ import annotations

import dataclasses
import functools
import heapq

import jax
import jax.numpy as jnp
import numpy as np

from lsjax.cache import KVCache, commit
from lsjax.config import ConfigError, ModelConfig
from lsjax.engine.types import DraftContext, Drafter, PrefillHook, Verdict
from lsjax.methods.dflash import model as dm
from lsjax.models import target
from lsjax.models.layers import rms_norm
from lsjax.models.module import variables_problem
from lsjax.sampling import processed_logprobs
from lsjax.tree import Tree, TreeConfig, make_tree

CHUNK = 256  # prompt positions per pass when `init` recomputes the prompt's context
RANK_WEIGHT = 0.7 * 0.2 ** np.arange(64)  # the assumed share of a parent's probability its rank-r child keeps


@dataclasses.dataclass(frozen=True)
class DFlashTree:
    """A tree budget: `nodes` drafted tokens (the root aside), children among the `top_k` best of each block
    position, `depth` levels (None: the block's s - 1 positions)."""

    nodes: int
    top_k: int
    depth: int | None = None

    def __post_init__(self):
        for name in ("nodes", "top_k", "depth"):
            v = getattr(self, name)
            if v is None and name == "depth":
                continue
            if not (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
                raise ConfigError(f"dflash tree.{name}: must be an integer >= 1, got {v!r}")
        if self.top_k > len(RANK_WEIGHT):
            raise ConfigError(f"dflash tree.top_k: at most {len(RANK_WEIGHT)}, got {self.top_k}")

    def spec(self) -> str:
        return f"{self.nodes},{self.top_k}" + (f",{self.depth}" if self.depth is not None else "")


# For a GPU (and TPU) verifying 16-32 nodes costs about one token; a CPU pays per node, so there the tree is
# small and shallow (docs/design/cpu-verify-cost.md).
TREE_PRESETS = {
    "gpu": DFlashTree(32, 4),
    "small": DFlashTree(16, 2),
    "cpu": DFlashTree(8, 2, 4),
}


def parse_tree(spec, block_size: int) -> DFlashTree | None:
    """None (the chain), a preset name or NODES,TOP_K[,DEPTH]. A preset deeper than the block is cut to it; a
    depth given explicitly must fit it."""
    if spec is None or isinstance(spec, DFlashTree):
        return spec
    if spec in TREE_PRESETS:
        t = TREE_PRESETS[spec]
        depth = min(t.depth or block_size - 1, block_size - 1)
        return DFlashTree(max(t.nodes, depth), t.top_k, depth)
    try:
        parts = [int(x) for x in str(spec).split(",")]
        if len(parts) not in (2, 3):
            raise ValueError
    except ValueError:
        raise ConfigError(
            f"--dflash-tree {spec!r}: neither a preset ({', '.join(TREE_PRESETS)}) nor NODES,TOP_K[,DEPTH]"
        ) from None
    return DFlashTree(*parts)


@dataclasses.dataclass(frozen=True)
class TreeShape:
    """A static tree, level by level (`lsjax.tree`'s layout): each drafted node's parent (node index, the root
    0) and rank among its siblings; `widths` the nodes per depth."""

    parents: tuple[int, ...]  # [T]: -1 for the root
    ranks: tuple[int, ...]  # [T]: 0 for the root
    widths: tuple[int, ...]

    @property
    def depths(self) -> np.ndarray:
        return TreeConfig(self.widths).node_depths()

    @property
    def fanout(self) -> np.ndarray:
        """[T] children per node."""
        return np.bincount(np.asarray(self.parents[1:]), minlength=len(self.parents))

    @classmethod
    def chain(cls, depth: int) -> TreeShape:
        return cls(tuple(range(-1, depth)), (0,) * (depth + 1), (1,) * depth)

    @classmethod
    def grow(cls, budget: DFlashTree, block_size: int) -> TreeShape:
        """The shape of `budget` for a block of `block_size` tokens (module doc); ConfigError naming both when
        the budget cannot hold the block's chain or is deeper than the block."""
        positions = block_size - 1
        depth = positions if budget.depth is None else budget.depth
        if depth > positions:
            raise ConfigError(
                f"--dflash-tree {budget.spec()}: {depth} levels, but a block of {block_size} tokens drafts "
                f"{positions}; give DEPTH <= {positions}"
            )
        if budget.nodes < depth:
            raise ConfigError(
                f"--dflash-tree {budget.spec()}: {budget.nodes} nodes cannot hold the block's {depth}-token chain "
                f"(block size {block_size}); give NODES >= {depth} or DEPTH <= {budget.nodes}"
            )
        # Nodes as (depth, parent id, rank) with ids in insertion order; the chain first.
        nodes = [(0, -1, 0)] + [(d, d - 1, 0) for d in range(1, depth + 1)]
        value = [1.0] + list(np.cumprod(np.full(depth, RANK_WEIGHT[0])))
        kids = [1] * depth + [0]
        heap: list = []

        def offer(parent: int):
            d, r = nodes[parent][0] + 1, kids[parent]
            if d <= depth and r < budget.top_k:
                heapq.heappush(heap, (-value[parent] * RANK_WEIGHT[r], len(nodes) + len(heap), parent, r))

        for i in range(len(nodes)):
            offer(i)
        while len(nodes) - 1 < budget.nodes and heap:
            neg, _, parent, r = heapq.heappop(heap)
            if r != kids[parent]:  # a stale offer: that rank was taken
                continue
            nodes.append((nodes[parent][0] + 1, parent, r))
            value.append(-neg)
            kids.append(0)
            kids[parent] += 1
            offer(parent)
            offer(len(nodes) - 1)
        # Level-major order, a parent's children in rank order, parents before children.
        new = {0: 0}
        order = [0]
        for d in range(1, depth + 1):
            level = sorted((new[p], r, i) for i, (dd, p, r) in enumerate(nodes) if dd == d)
            for _, _, i in level:
                new[i] = len(order)
                order.append(i)
        parents = tuple(-1 if i == 0 else new[nodes[i][1]] for i in order)
        ranks = tuple(nodes[i][2] for i in order)
        widths = tuple(sum(1 for dd, _, _ in nodes if dd == d) for d in range(1, depth + 1))
        return cls(parents, ranks, widths)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DFlashState:
    cache: KVCache  # the draft's context K/V, every draft layer: positions [0, n), as long as the target's cache


@dataclasses.dataclass(frozen=True)
class DFlashDrafter(Drafter):
    draft: dm.DFlashConfig
    budget: DFlashTree | None = None  # None: the block's chain

    name = "dflash"

    def __post_init__(self):
        if not isinstance(self.draft, dm.DFlashConfig):
            raise ConfigError(f"dflash: draft must be a DFlashConfig, got {type(self.draft).__name__}")
        _ = self.shape  # a budget the block cannot hold fails here, before anything is traced

    @functools.cached_property
    def shape(self) -> TreeShape:
        if self.budget is None:
            return TreeShape.chain(self.draft.block_size - 1)
        return TreeShape.grow(self.budget, self.draft.block_size)

    @property
    def tree(self) -> TreeConfig:
        return TreeConfig(self.shape.widths)

    @property
    def aux_hidden_layers(self) -> tuple[int, ...]:
        return self.draft.taps

    def check_params(self, draft_params, config: ModelConfig) -> str | None:
        d = self.draft
        if not isinstance(draft_params, dict):
            got = type(draft_params).__name__
            return f"dflash needs its draft's params (lsjax.methods.dflash.checkpoint.read_draft), got {got}"
        if d.layer.vocab_size != config.vocab_size:
            return (
                f"this DFlash draft is for a target with vocabulary {d.layer.vocab_size}; {config.name} has "
                f"{config.vocab_size}"
            )
        if d.hidden_size != config.hidden_size or d.target_hidden_size != config.hidden_size:
            return (
                f"this DFlash draft is for a target of hidden size {d.target_hidden_size} (its own {d.hidden_size}); "
                f"{config.name} has {config.hidden_size}"
            )
        if max(d.target_layer_ids) >= config.num_layers:
            return (
                f"the draft reads target layers {list(d.target_layer_ids)} (target_layer_ids); {config.name} has "
                f"{config.num_layers} layers (0 .. {config.num_layers - 1})"
            )
        if not 0 <= d.mask_token_id < config.vocab_size:
            return (
                f"the draft's mask token {d.mask_token_id} is outside {config.name}'s vocabulary of {config.vocab_size}"
            )
        return variables_problem(dm.DFlashDraft(d), draft_params, "DFlash draft")

    # ------------------------------------------------------------------------------------------- contract

    def prefill_hook(self, ctx: DraftContext) -> PrefillHook:
        """The prompt's context K/V join the draft's cache chunk by chunk as the prefill computes the target's
        streams."""

        def start(batch: int):
            return KVCache.zeros(self.draft.layer, batch, ctx.capacity)

        def step(dcache, streams, start_pos, tokens, lengths):
            B, C = streams.shape[:2]
            pos = start_pos + jnp.broadcast_to(jnp.arange(C, dtype=jnp.int32), (B, C))
            return self._commit(ctx, dcache, streams, pos, jnp.clip(lengths - start_pos, 0, C))

        return PrefillHook(self.draft.taps, start, step)

    def init(self, ctx: DraftContext, state) -> DFlashState:
        """The prompt's context in the draft's cache: what the prefill hook left, else recomputed from the
        prefilled target cache (`engine.begin` after a prefill of the caller's)."""
        return DFlashState(ctx.prefilled if ctx.prefilled is not None else self._replay_prefill(ctx, state.cache))

    def _replay_prefill(self, ctx: DraftContext, cache: KVCache) -> KVCache:
        hook = self.prefill_hook(ctx)
        tokens, lengths = ctx.prompt_tokens, ctx.prompt_lengths.astype(jnp.int32)
        B, P = tokens.shape
        C = min(CHUNK, P)
        tokens = jnp.pad(tokens, ((0, 0), (0, -(-P // C) * C - P)))
        taps = self.draft.taps

        def body(carry):
            i, dcache = carry
            start = i * C
            toks = jax.lax.dynamic_slice_in_dim(tokens, start, C, axis=1)
            pos = start + jnp.broadcast_to(jnp.arange(C, dtype=jnp.int32), (B, C))
            before = KVCache(cache.k, cache.v, jnp.full((B,), start, jnp.int32))
            net = target.Transformer(ctx.config).bind({"params": ctx.target_params})
            *_, streams = net.streams(toks, pos, before, taps, backend=ctx.backend, upto=max(taps))
            return i + 1, hook.step(dcache, streams.astype(jnp.dtype(ctx.config.dtype)), start, tokens, lengths)

        num_chunks = (jnp.max(lengths) + C - 1) // C
        return jax.lax.while_loop(lambda c: c[0] < num_chunks, body, (jnp.int32(0), hook.init(B)))[1]

    def block_logits(self, ctx: DraftContext, state, draft_state: DFlashState) -> jax.Array:
        """One draft forward: the target head's logits [B, D, V] at block positions 1 .. D (D the tree's depth)."""
        d = self.draft
        s = d.block_size
        B = state.root.shape[0]
        n = draft_state.cache.lengths
        block = jnp.concatenate(
            [state.root[:, None].astype(jnp.int32), jnp.full((B, s - 1), d.mask_token_id, jnp.int32)], axis=1
        )
        pos = n[:, None] + jnp.arange(s, dtype=jnp.int32)[None]
        draft = self._draft(ctx)
        noise = draft(block, ctx.target_params["embed"], method="noise")
        hidden = draft(noise, pos, draft_state.cache, backend=ctx.backend)
        lm_head = ctx.target_params.get("lm_head") if not ctx.config.tie_embeddings else None
        return draft(hidden[:, 1 : 1 + self.tree.depth], lm_head, ctx.target_params["embed"], method="logits")

    def propose(self, ctx: DraftContext, state, draft_state: DFlashState, key=None) -> Tree:
        logits = self.block_logits(ctx, state, draft_state)  # [B, D, V]
        shape = self.shape
        B, D, V = logits.shape
        T = len(shape.parents)
        depth = shape.depths
        parents = jnp.broadcast_to(jnp.asarray(shape.parents, jnp.int32)[None], (B, T))
        ranks = np.asarray(shape.ranks)
        k = max(shape.ranks) + 1
        if not ctx.sampling.sample_drafts:
            top = jax.lax.top_k(logits, k)[1]  # [B, D, k]
            toks = top[:, np.maximum(depth[1:] - 1, 0), ranks[1:]]  # [B, T - 1]
            tokens = jnp.concatenate([state.root[:, None], toks], axis=1).astype(jnp.int32)
            return make_tree(tokens, parents, jnp.ones((B, T), bool), self.tree)
        # Each node with children draws them from q at the next block position, with noise of its own.
        # q may be any distribution: the filters, not the contextual penalty (its window is each node's own path).
        logq = processed_logprobs(logits, dataclasses.replace(ctx.sampling, penalty=1.0))  # [B, D, V]
        fan = shape.fanout
        inner = np.flatnonzero(fan > 0)  # nodes with children; node depth < D
        g = jax.random.gumbel(key, (B, len(inner), V))
        perturbed, drawn = jax.lax.top_k(logq[:, depth[inner]] + g, k)  # [B, P, k]: draw order
        slot = np.zeros(T, np.int64)
        slot[inner] = np.arange(len(inner))
        par = np.asarray(shape.parents[1:])
        toks = drawn[:, slot[par], ranks[1:]]
        ok = jnp.isfinite(perturbed[:, slot[par], ranks[1:]])  # fewer tokens than children survive the filters
        tokens = jnp.concatenate([state.root[:, None], toks], axis=1).astype(jnp.int32)
        valid = jnp.concatenate([jnp.ones((B, 1), bool), ok], axis=1)
        for _ in range(D - 1):  # an invalid node's descendants are invalid
            valid = valid & jnp.take_along_axis(valid, jnp.maximum(parents, 0), axis=1)
        below = jnp.concatenate([logq, jnp.full((B, 1, V), -jnp.inf, logq.dtype)], axis=1)  # leaves: no children
        node_logq = below[:, np.minimum(depth, D)]  # [B, T, V]: q of each node's children
        sampled = valid & (jnp.arange(T) > 0)[None]
        return make_tree(tokens, parents, valid, self.tree, node_logq, sampled)

    def verify_extras(self, ctx: DraftContext, tree: Tree, hidden, logits, taps=None):
        return taps  # [B, T, A Dt]: the target's streams at every node

    def update(self, ctx: DraftContext, state, draft_state: DFlashState, verdict: Verdict) -> DFlashState:
        """The committed tokens (the root and the accepted nodes) join the draft's context."""
        A = verdict.path.shape[1]
        aux = jnp.take_along_axis(verdict.extras, verdict.path[:, :, None], axis=1)  # [B, A, A Dt]
        start = draft_state.cache.lengths
        pos = start[:, None] + jnp.arange(A, dtype=jnp.int32)[None]
        return DFlashState(self._commit(ctx, draft_state.cache, aux, pos, verdict.count))

    # --------------------------------------------------------------------------------------------- pieces

    def _commit(self, ctx: DraftContext, dcache: KVCache, streams, positions, count) -> KVCache:
        """The context K/V of the target's streams [B, T, A Dt] at positions [B, T], the first `count` [B]
        committed to the draft's cache."""
        k, v = self._draft(ctx)(self._hf_streams(ctx, streams), positions, method="context_kv")
        return commit(dcache, k, v, count)

    def _hf_streams(self, ctx: DraftContext, streams):
        return hf_streams(streams, self.draft.taps, ctx.config, ctx.target_params)

    def _draft(self, ctx: DraftContext):
        """`DFlashDraft(draft).apply` over the context's draft params: call it with the method's arguments."""
        return functools.partial(dm.DFlashDraft(self.draft).apply, {"params": ctx.draft_params})


def hf_streams(streams, taps: tuple[int, ...], config: ModelConfig, target_params):
    """The target's streams entering layers `taps` [..., len(taps) Dt] as HF's hidden_states[i + 1] has them: the
    one after the last layer is final-normed."""
    L = config.num_layers
    if L not in taps:
        return streams
    parts = jnp.split(streams, len(taps), axis=-1)
    norm, eps = target_params["final_norm"], config.rms_norm_eps
    parts = [rms_norm(p, norm, eps).astype(p.dtype) if t == L else p for p, t in zip(parts, taps)]
    return jnp.concatenate(parts, axis=-1)


def teacher_forced_blocks(target_params, config: ModelConfig, draft_params, draft: dm.DFlashConfig, tokens, first, new):
    """What the drafter proposes at each of `new` roots of a known sequence tokens [1, T] (the roots at positions
    first .. first + new - 1, each root's context every position before it, as decoding keeps them): the target's
    head's logits [new, s - 1, V] at each root's block positions 1 .. s - 1, and the target's final hidden states
    [1, T, D] (fp32). One target pass and one context pass; then one block forward per root."""
    from lsjax.models.layers import ACT_DTYPE

    T = tokens.shape[1]
    s = draft.block_size
    pos = jnp.arange(T)[None]
    tnet = target.Transformer(config).bind({"params": target_params})
    x, _, _, streams = tnet.streams(tokens, pos, KVCache.zeros(config, 1, 0), draft.taps)
    streams = hf_streams(streams.astype(jnp.dtype(config.dtype)), draft.taps, config, target_params)
    net = dm.DFlashDraft(draft).bind({"params": draft_params})
    k, v = net.context_kv(streams, pos)
    full = commit(KVCache.zeros(draft.layer, 1, T), k, v, jnp.array([T], jnp.int32))
    lm_head = target_params.get("lm_head") if not config.tie_embeddings else None
    masks = jnp.full((s - 1,), draft.mask_token_id, jnp.int32)

    def one(r):
        block = jnp.concatenate([jax.lax.dynamic_slice_in_dim(tokens[0], r, 1), masks])[None]
        cache = KVCache(full.k, full.v, jnp.reshape(r, (1,)).astype(jnp.int32))
        hidden = net(net.noise(block, target_params["embed"]), r + jnp.arange(s)[None], cache)
        return net.logits(hidden[0, 1:].astype(ACT_DTYPE), lm_head, target_params["embed"])

    return jax.lax.map(one, first + jnp.arange(new)), x
