"""Verification: one target forward over a tree, then the accepted path.

Acceptance is exactly lossless for any tree built without looking at the verification randomness. Let p be
the target's *processed* distribution at a node (`processed_logprobs`, the one AR sampling uses).

* T = 0: walk from the root while some child holds the target's argmax at its parent; the argmax at the last
  accepted node is the bonus token. The guarantee is "exactly the target's greedy choice as computed by the
  verification forward": AR computes the same logits with other matmul shapes (differences ~1e-6), so the
  two agree token for token except where two logits tie to that precision. With batch-invariant numerics
  (`ModelConfig.invariant_rows`) they are the same bits, and the outputs equal in every dtype.
* T > 0, deterministic children (beam trees, prompt lookup; `tree.logq is None`): draw x ~ p at the node and
  move to the child holding x, else emit x and stop (sample-and-match). Each emitted token is a fresh draw
  from p given exactly the tokens before it. A child is accepted with probability p(child).
* T > 0, sampled children (`tree.sampled`): the node's sampled children c_1..c_k were drawn from the
  draft's q without replacement, k fixed before the draws. Recursive rejection sampling: with residual
  r_1 = p and q_1 = q, accept c_i with probability min(1, r_i(c_i) / q_i(c_i)); on rejection set
  r_{i+1} = norm(max(r_i - q_i, 0)) and q_{i+1} = q_i without c_i, renormalised. If all are rejected, draw
  x ~ r_{k+1} and move to a child holding x if there is one (a deterministic sibling, say), else emit x.

  Why the emitted token is distributed as p, by induction on k (k = 0 is a plain draw from p): given that c_1
  is rejected, c_2..c_k are a without-replacement sample from q_2 whatever c_1 was, so by induction the rest
  of the procedure emits a draw from r_2, which does not depend on c_1. Step 1 is then standard speculative
  sampling with proposal q_1 and, on rejection, a draw from norm(max(r_1 - q_1, 0)): it emits r_1 = p
  exactly (Leviathan et al., Thm. 1). A child is accepted with probability 1 - TV(p, q) at least, which
  is what makes sampled trees accept far more than top-k trees at T > 0 (SpecInfer, Sequoia, Recursive
  Speculative Decoding use the same scheme).

  The subtree below the chosen child was drawn with draft randomness only, so the next level sees children
  that are again a without-replacement sample from q at that node: the induction extends down the tree.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

from lsjax.cache import KVCache
from lsjax.config import GenerateConfig, ModelConfig, SamplingConfig
from lsjax.engine.types import DecodeState, DraftContext, Drafter, Verdict, step_keys
from lsjax.models import target
from lsjax.sampling import categorical, draw, processed_logprobs, sample, tree_penalty_mask
from lsjax.tree import Tree


def tree_forward(params: dict, config: ModelConfig, tree: Tree, cache: KVCache, *, backend: str = "auto"):
    """Target hidden states [B, T, D] (the model's dtype, for drafters), logits [B, T, V] (fp32, from the fp32
    hidden states) at every node, and the nodes' K/V [L, B, T, K, H] (not committed)."""
    positions = cache.lengths[:, None] + tree.depth
    rows = config.invariant_rows
    net = _target(params, config)
    hidden, new_k, new_v = net.hidden(tree.tokens, positions, cache, tree.mask, backend=backend, pad_to=rows)
    return _for_drafter(hidden, config), net.logits(hidden, rows), new_k, new_v


def _target(params: dict, config: ModelConfig) -> target.Transformer:
    """The target module bound to `params` (any of its layouts) inside the caller's trace: Flax's functional API,
    so the step stays a pure function of the params pytree it was given."""
    return target.Transformer(config).bind({"params": params})


def _for_drafter(x: jax.Array, config: ModelConfig) -> jax.Array:
    """The target's fp32 residual stream in the model's dtype: what drafters were trained on and carry."""
    return x.astype(jnp.dtype(config.dtype))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ForwardTaps:
    """What a drafter that sets `extra_hidden_layer` receives from the verify forward (`verify_extras`'s
    `taps`), every node in the verified tree's order."""

    mid_hidden: jax.Array  # [B, T, D] the residual stream entering layer `extra_hidden_layer`
    positions: jax.Array  # [B, T] the nodes' positions (cache length + depth)
    cache: KVCache  # the committed cache the nodes attended to (the tree is not in it)
    tree_k: jax.Array  # [L, B, T, K, H] the nodes' K (RoPE applied) and V at every layer, not committed
    tree_v: jax.Array


def _take_nodes(x: jax.Array, idx: jax.Array, axis: int) -> jax.Array:
    """x with node axis `axis` (batch on the axis before it) gathered at idx [B, T']."""
    shape = [1] * x.ndim
    shape[axis - 1], shape[axis] = idx.shape
    return jnp.take_along_axis(x, idx.reshape(shape), axis=axis)


def tapped_tree_forward(
    params: dict,
    config: ModelConfig,
    tree: Tree,
    cache: KVCache,
    layer: int,
    select: Callable[[Tree, jax.Array], tuple[Tree, jax.Array] | None] | None = None,
    *,
    backend: str = "auto",
):
    """`tree_forward` cut before layer `layer`: returns (tree, hidden, logits, new_k, new_v, ForwardTaps).

    `select(tree, mid_hidden)` may return (a smaller tree, idx [B, T'] of its nodes in `tree`): layers
    [layer, L) and the LM head then run on those T' nodes only (early-exit tree pruning). The kept nodes must
    be closed under ancestors, so their lower-layer states are what a forward of the smaller tree computes;
    the returned tree is the one to verify. Without `select` (or when it returns None) the outputs are
    `tree_forward`'s up to float rounding.
    """
    positions = cache.lengths[:, None] + tree.depth
    rows = config.invariant_rows
    net = _target(params, config)
    fwd = functools.partial(net.hidden, cache=cache, backend=backend, pad_to=rows)
    if layer > 0:
        x, k_lo, v_lo = fwd(tree.tokens, positions, tree_mask=tree.mask, layers=(0, layer))
    else:
        x = net.embed(tree.tokens).astype(jnp.float32)
        k_lo = v_lo = None
    picked = select(tree, _for_drafter(x, config)) if select is not None else None
    if picked is not None:
        tree, idx = picked
        x = _take_nodes(x, idx, 1)
        positions = cache.lengths[:, None] + tree.depth
        if k_lo is not None:
            k_lo, v_lo = _take_nodes(k_lo, idx, 2), _take_nodes(v_lo, idx, 2)
    hidden, k_hi, v_hi = fwd(tree.tokens, positions, tree_mask=tree.mask, layers=(layer, config.num_layers), x=x)
    new_k = k_hi if k_lo is None else jnp.concatenate([k_lo, k_hi], axis=0)
    new_v = v_hi if v_lo is None else jnp.concatenate([v_lo, v_hi], axis=0)
    taps = ForwardTaps(_for_drafter(x, config), positions, cache, new_k, new_v)
    return tree, _for_drafter(hidden, config), net.logits(hidden, rows), new_k, new_v, taps


def aux_tree_forward(
    params: dict, config: ModelConfig, tree: Tree, cache: KVCache, layers: tuple[int, ...], *, backend: str = "auto"
):
    """`tree_forward` that also returns the residual streams entering `layers` at every node, concatenated in
    that order: (hidden, logits, new_k, new_v, aux [B, T, len(layers) * D] in the model's dtype)."""
    positions = cache.lengths[:, None] + tree.depth
    rows = config.invariant_rows
    net = _target(params, config)
    x, new_k, new_v, aux = net.streams(tree.tokens, positions, cache, layers, tree.mask, backend=backend, pad_to=rows)
    return _for_drafter(x, config), net.logits(x, rows), new_k, new_v, _for_drafter(aux, config)


def _take(x: jax.Array, idx: jax.Array) -> jax.Array:
    """x [B, T, ...], idx [B] -> x[b, idx[b]]."""
    return jnp.take_along_axis(x, idx.reshape((-1,) + (1,) * (x.ndim - 1)), axis=1)[:, 0]


def accept(
    tree: Tree,
    logits: jax.Array,
    sampling: SamplingConfig,
    key: jax.Array,
    max_depth: int,
    level_offsets: tuple[int, ...] | None = None,
    penalized: jax.Array | None = None,
):
    """Walks the tree. Returns (path [B, max_depth + 1] node indices, path[:, 0] = root;
    num_accepted [B] tree nodes accepted beyond the root; bonus [B] the token after the path).

    `level_offsets` (the TreeConfig's) lets the walk visit only the nodes of each level; without it every
    node is scanned at every depth (same result, more work). `penalized` [B, T, V]: each node's contextual
    penalty window (`lsjax.sampling.tree_penalty_mask`; needed iff the sampling config has the penalty on)."""
    if tree.stochastic and not sampling.greedy:
        return _accept_sampled(tree, logits, sampling, key, max_depth, level_offsets, penalized)
    B, T = tree.tokens.shape
    draws = sample(key, logits, sampling, penalized)  # [B, T]: the target's token at every node
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


def _normalise(x: jax.Array, fallback: jax.Array) -> jax.Array:
    total = jnp.sum(x, axis=-1, keepdims=True)
    # A residual can only vanish when r == q, where every candidate is accepted: the fallback is never drawn.
    return jnp.where(total > 1e-30, x / jnp.maximum(total, 1e-30), fallback)


def _accept_sampled(tree: Tree, logits, sampling: SamplingConfig, key, max_depth: int, level_offsets, penalized):
    """Recursive rejection sampling over sampled children, sample-and-match over the others (module doc)."""
    B, T = tree.tokens.shape
    logp = processed_logprobs(logits, sampling, penalized)  # [B, T, V]
    rows = jnp.arange(B)
    cur = jnp.zeros((B,), jnp.int32)
    alive = jnp.ones((B,), bool)
    path = jnp.zeros((B, max_depth + 1), jnp.int32)
    bonus = jnp.zeros((B,), jnp.int32)
    sampled = tree.sampled & tree.valid
    for d in range(1, max_depth + 1):
        k_d = jax.random.fold_in(key, d)
        if level_offsets is not None:
            lo, hi = level_offsets[d], (level_offsets[d + 1] if d + 1 < len(level_offsets) else T)
        else:
            lo, hi = 1, T
        r = jnp.exp(_take(logp, cur))  # [B, V] residual target distribution
        # log q without the rejected candidates (unnormalised). In log space: after a confident draft's first
        # child is rejected, the rest of q can lie below fp32's range (q ~ e^-150) while its renormalised
        # share, which the later children were drawn from, is O(1); a linear q read those children as q = 0.
        lq_rem = _take(tree.logq, cur)
        taken = jnp.zeros((B,), bool)
        child = jnp.zeros((B,), jnp.int32)
        for j in range(lo, hi):
            cand = alive & ~taken & sampled[:, j] & (tree.parents[:, j] == cur) & (tree.depth[:, j] == d)
            tok = tree.tokens[:, j]
            lq_sum = jax.nn.logsumexp(lq_rem, axis=-1)
            lq_tok = lq_rem[rows, tok]
            r_tok = r[rows, tok]
            u = jax.random.uniform(jax.random.fold_in(k_d, j), (B,))
            # u < min(1, r/q_j), q_j = q_rem / sum(q_rem): log u + log q_j(tok) < log r(tok).
            ok = cand & jnp.isfinite(lq_tok) & (jnp.log(u) + (lq_tok - lq_sum) < jnp.log(r_tok))
            taken = taken | ok
            child = jnp.where(ok, j, child)
            rejected = cand & ~ok
            q_j = jnp.exp(lq_rem - jnp.where(jnp.isfinite(lq_sum), lq_sum, 0.0)[:, None])
            r = jnp.where(rejected[:, None], _normalise(jnp.maximum(r - q_j, 0.0), r), r)
            lq_rem = jnp.where(rejected[:, None], lq_rem.at[rows, tok].set(-jnp.inf), lq_rem)
        # Nothing accepted: a draw from the residual, matched against every child (sampled or not).
        x = draw(jax.random.fold_in(k_d, T), r)
        match = (tree.parents == cur[:, None]) & tree.valid & (tree.tokens == x[:, None]) & (tree.depth == d)
        matched = jnp.any(match, axis=1)
        child = jnp.where(taken, child, jnp.argmax(match, axis=1).astype(jnp.int32))
        found = alive & (taken | matched)
        stops = alive & ~found
        bonus = jnp.where(stops, x, bonus)
        cur = jnp.where(found, child, cur)
        path = path.at[:, d].set(jnp.where(found, child, 0))
        alive = found
    # Rows that walked to the deepest level: the bonus is a fresh draw from p there.
    last = categorical(jax.random.fold_in(key, max_depth + 1), _take(logp, cur))
    bonus = jnp.where(alive, last, bonus)
    num_accepted = jnp.sum(path[:, 1:] > 0, axis=1).astype(jnp.int32)
    return path, num_accepted, bonus


def gather_path_kv(new_k: jax.Array, new_v: jax.Array, path: jax.Array):
    """[L, B, T, K, H] node K/V -> [L, B, A, K, H] along the accepted path (root first)."""
    idx = path[None, :, :, None, None]
    return jnp.take_along_axis(new_k, idx, axis=2), jnp.take_along_axis(new_v, idx, axis=2)


def _levels(drafter: Drafter) -> tuple[int, ...] | None:
    return drafter.levels()


def penalty_windows(ctx: DraftContext, max_depth: int, gen: GenerateConfig, state: DecodeState, tree: Tree):
    """Each node's contextual-penalty window [B, T, V] (None when the penalty is off): the generated tokens
    (`state.out`, the root last) then the node's own path, as AR would have them after that path."""
    s = gen.sampling
    if not s.penalized:
        return None
    return tree_penalty_mask(
        state.out,
        state.num_out,
        tree.tokens,
        tree.mask,
        tree.depth,
        s.penalty_window,
        ctx.config.vocab_size,
        max_depth,
    )


def _root_logp(logits, sampling, penalized, verdict: Verdict, wanted) -> jax.Array:
    """[B] the target's processed log-probability at the root of the first token the step emitted; 0 at
    T = 0 and where the drafter did not want it (`Drafter.root_logp_wanted`: with top-k/top-p it costs a sort
    of the vocabulary, a few % of a decode step)."""
    zeros = jnp.zeros(logits.shape[:1], jnp.float32)
    if sampling.greedy:
        return zeros

    def compute(_):
        lp = processed_logprobs(logits[:, 0], sampling, None if penalized is None else penalized[:, 0])
        return jnp.take_along_axis(lp, verdict.emitted()[:, :1], axis=1)[:, 0]

    return jax.lax.cond(wanted, compute, lambda _: zeros, None)


def verify_phase(ctx: DraftContext, drafter: Drafter, gen: GenerateConfig, state: DecodeState, tree: Tree):
    """Target forward over the tree + acceptance. Returns (verdict, path_k, path_v) with the path's K/V
    [L, B, max_depth + 1, K, H] for the commit."""
    return _verify(ctx, gen, state, tree, drafter.max_depth, _levels(drafter), drafter)


def _verify(
    ctx: DraftContext,
    gen: GenerateConfig,
    state: DecodeState,
    tree: Tree,
    max_depth: int,
    levels,
    drafter,
    wanted=False,
    aux_layers: tuple[int, ...] = (),
):
    """`drafter` None: a switched variant, whose drafter updates from the chain verdict; its extras are (the
    root's log-probability of the first emitted token where `wanted` ([] bool) says so, the streams entering
    `aux_layers` at every node [B, T, X] or None without them)."""
    if drafter is None and aux_layers:
        hidden, logits, new_k, new_v, aux = aux_tree_forward(
            ctx.target_params, ctx.config, tree, state.cache, aux_layers, backend=ctx.backend
        )
        extras = aux
    elif drafter is not None and drafter.aux_hidden_layers:
        hidden, logits, new_k, new_v, aux = aux_tree_forward(
            ctx.target_params, ctx.config, tree, state.cache, drafter.aux_hidden_layers, backend=ctx.backend
        )
        extras = drafter.verify_extras(ctx, tree, hidden, logits, aux)
    elif drafter is None or drafter.extra_hidden_layer is None:
        hidden, logits, new_k, new_v = tree_forward(
            ctx.target_params, ctx.config, tree, state.cache, backend=ctx.backend
        )
        extras = None if drafter is None else drafter.verify_extras(ctx, tree, hidden, logits)
    else:  # the drafter reads the forward at a middle layer (and may prune the tree there)
        prune = functools.partial(drafter.prune, ctx)
        tree, hidden, logits, new_k, new_v, taps = tapped_tree_forward(
            ctx.target_params, ctx.config, tree, state.cache, drafter.extra_hidden_layer, prune, backend=ctx.backend
        )
        extras = drafter.verify_extras(ctx, tree, hidden, logits, taps)
    penalized = penalty_windows(ctx, max_depth, gen, state, tree)
    path, num_accepted, bonus = accept(
        tree, logits, gen.sampling, step_keys(state.key)[2], max_depth, levels, penalized
    )
    active = ~state.done
    num_accepted = jnp.where(active, num_accepted, 0)
    path = jnp.where(active[:, None], path, 0)
    verdict = Verdict(
        tree=tree,
        path=path,
        num_accepted=num_accepted,
        bonus=jnp.where(active, bonus, state.root),
        count=jnp.where(active, num_accepted + 1, 0),
        extras=extras,
    )
    if drafter is None:  # a switched variant: the switching drafter may score the root's first token
        root_logp = _root_logp(logits, gen.sampling, penalized, verdict, wanted)
        verdict = dataclasses.replace(verdict, extras=(root_logp, extras))
    path_k, path_v = gather_path_kv(new_k, new_v, path)
    # The commit must wait for the walk. An AR path (the root) is known before the forward ends, so XLA
    # scheduled the cache write ahead of the last layers' attention reads of that cache and then copied the
    # whole cache twice per step to keep those reads intact (an optimization_barrier does not survive to
    # copy insertion on CPU). A select on the bonus token, which comes out of the LM head, orders it.
    after = (verdict.bonus >= 0)[None, :, None, None, None]
    return verdict, jnp.where(after, path_k, 0), jnp.where(after, path_v, 0)
