"""The speculative engine: draft -> verify -> accept -> commit, jitted end to end with static shapes.

    spec_step(ctx, drafter, gen, state) -> state     one step (any drafter; ARDrafter = plain AR)
    decode(...)                                      jitted `lax.while_loop` of steps, state donated
    run(...)                                         prefill + first token + decode, jittable end to end

One step: the drafter proposes a tree rooted at the pending token; one target
forward scores every node (hybrid tree attention: committed cache unmasked +
tree under its ancestor mask); `accept` walks the tree; the accepted path's K/V
(root included) go into cache slots [n, n + a + 1); the bonus token becomes the
new root. AR and speculative decoding share every line of this loop, so
comparisons between them measure the method, not two code paths.

A drafter with `step_variants` (the adaptive `auto` policy) picks one variant
per step with `lax.switch` (`switched_step`). Only drafting, verification and
the walk run inside the switch, and each branch returns the same small result:
the accepted path's tokens and K/V padded to the deepest variant's depth. The
cache commit, the emit and the drafter's update run once, after the switch: a
big buffer threaded through a conditional's outputs is copied at its boundary
(XLA CPU copied the whole target cache ~8 times per step that way), while one
only read inside the branches is not.

For profiling, `draft_phase`, `verify_phase` and `commit_phase` are the same
step cut in three jittable pieces (`lsjax.generation` times them separately).
Each step's drafting and verification keys are derived from `state.key` by
`step_keys`, so the pieces agree with the fused step and the drafting key is
independent of the verification key (what keeps sampled trees lossless).

A row that is done still rides along in the batch's forwards but commits
nothing: its cache length, draft state and counters stop moving.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from lsjax import decoding
from lsjax.cache import KVCache, commit
from lsjax.config import GenerateConfig
from lsjax.decoding import DecodeState
from lsjax.drafters.base import ARDrafter, DraftContext, Drafter, SwitchExtras, Verdict
from lsjax.errors import LsjaxError
from lsjax.sampling import processed_logprobs, tree_penalty_mask
from lsjax.tree import Tree, chain_parents
from lsjax.verify import accept, gather_path_kv, tapped_tree_forward, tree_forward


class CapacityError(LsjaxError, ValueError):
    """The KV cache cannot hold the prompt, the generation and one step's writes."""


def step_keys(key: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(next state key, drafting key, verification key) for one step."""
    k = jax.random.split(key, 3)
    return k[0], k[1], k[2]


def _levels(drafter: Drafter) -> tuple[int, ...] | None:
    return drafter.tree.level_offsets() if drafter.max_depth > 0 else None


def draft_phase(ctx: DraftContext, drafter: Drafter, state: DecodeState) -> Tree:
    return drafter.propose(ctx, state, state.draft, step_keys(state.key)[1])


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
):
    """`drafter` None: a switched variant, whose drafter updates from the chain verdict; its extras are the
    root's log-probability of the first emitted token where `wanted` ([] bool) says so."""
    if drafter is None or drafter.extra_hidden_layer is None:
        hidden, logits, new_k, new_v = tree_forward(
            ctx.target_params, ctx.config, tree, state.cache, backend=ctx.backend
        )
        extras = () if drafter is None else drafter.verify_extras(ctx, tree, hidden, logits)
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
        verdict = dataclasses.replace(verdict, extras=_root_logp(logits, gen.sampling, penalized, verdict, wanted))
    path_k, path_v = gather_path_kv(new_k, new_v, path)
    # The commit must wait for the walk. An AR path (the root) is known before the forward ends, so XLA
    # scheduled the cache write ahead of the last layers' attention reads of that cache and then copied the
    # whole cache twice per step to keep those reads intact (an optimization_barrier does not survive to
    # copy insertion on CPU). A select on the bonus token, which comes out of the LM head, orders it.
    after = (verdict.bonus >= 0)[None, :, None, None, None]
    return verdict, jnp.where(after, path_k, 0), jnp.where(after, path_v, 0)


def commit_phase(ctx: DraftContext, drafter: Drafter, gen: GenerateConfig, state: DecodeState, verified) -> DecodeState:
    verdict, path_k, path_v = verified
    cache = commit(state.cache, path_k, path_v, verdict.count)  # root + accepted nodes; nothing for done rows
    out, num_out, done, n = decoding.emit(
        state.out,
        state.num_out,
        state.done,
        verdict.emitted(),
        verdict.count,
        gen,
        decoding.stop_ids(ctx.config, gen),
    )
    new_state = DecodeState(
        cache=cache,
        root=verdict.bonus,
        out=out,
        num_out=num_out,
        done=done,
        key=step_keys(state.key)[0],
        steps=state.steps + 1,
        accepted=state.accepted + jnp.sum(n),
        active_steps=state.active_steps + jnp.sum(~state.done).astype(jnp.int32),
        draft=state.draft,
    )
    draft = drafter.update(ctx, new_state, state.draft, verdict)
    return dataclasses.replace(new_state, draft=draft)


def fixed_step(ctx: DraftContext, drafter: Drafter, gen: GenerateConfig, state: DecodeState) -> DecodeState:
    tree = draft_phase(ctx, drafter, state)
    verified = verify_phase(ctx, drafter, gen, state, tree)
    return commit_phase(ctx, drafter, gen, state, verified)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PathResult:
    """One switched variant's outcome, shaped alike for every variant: the accepted path padded to A =
    the deepest variant's depth + 1 (entries past `count` are junk the commit writes past the length)."""

    tokens: jax.Array  # [B, A] the path's tokens, root first
    num_accepted: jax.Array  # [B]
    bonus: jax.Array  # [B]
    count: jax.Array  # [B] tokens to commit (0 for finished rows)
    k: jax.Array  # [L, B, A, K, H] the path's K/V
    v: jax.Array
    root_logp: jax.Array  # [B] (`SwitchExtras.root_logp`)


def _stochastic(tree: Tree, vocab_size: int) -> Tree:
    """A deterministic tree in a sampled tree's layout: no sampled node (so verification runs sample-and-match
    at every node, as for the tree itself) and an unused q."""
    B, T = tree.tokens.shape
    logq = jnp.full((B, T, vocab_size), -jnp.inf, jnp.float32)
    return dataclasses.replace(tree, logq=logq, sampled=jnp.zeros((B, T), bool))


def _group_path(ctx, gen, variants, depth: int, operand) -> PathResult:
    """Variants with the same node count share one verification forward: an inner switch drafts the chosen
    one's tree, one target forward over T nodes verifies it (tokens, depths and the mask are arrays)."""
    state, member, wanted = operand
    trees = [jax.eval_shape(functools.partial(draft_phase, ctx, v), state) for v in variants]
    stochastic = any(t.stochastic for t in trees)

    def draft(v, state):
        tree = draft_phase(ctx, v, state)
        return _stochastic(tree, ctx.config.vocab_size) if stochastic and not tree.stochastic else tree

    if len(variants) == 1:
        tree, max_depth, levels = draft(variants[0], state), variants[0].max_depth, _levels(variants[0])
    else:
        tree = jax.lax.switch(member, [functools.partial(draft, v) for v in variants], state)
        max_depth, levels = max(v.max_depth for v in variants), None  # the walk checks every node's depth
    verdict, path_k, path_v = _verify(ctx, gen, state, tree, max_depth, levels, None, wanted)
    pad = depth - max_depth
    kv_pad = ((0, 0), (0, 0), (0, pad), (0, 0), (0, 0))
    return PathResult(
        jnp.pad(verdict.path_tokens, ((0, 0), (0, pad))),
        verdict.num_accepted,
        verdict.bonus,
        verdict.count,
        jnp.pad(path_k, kv_pad),
        jnp.pad(path_v, kv_pad),
        verdict.extras,
    )


def chain_verdict(path: PathResult, extras=()) -> Verdict:
    """The accepted path as the verdict of a chain tree: what a switched drafter's `update` sees (it reads the
    accepted tokens, never the variant's node indices)."""
    B, A = path.tokens.shape
    idx = jnp.arange(A, dtype=jnp.int32)
    valid = idx[None] <= path.num_accepted[:, None]
    tree = Tree(
        path.tokens,
        jnp.broadcast_to(jnp.asarray(chain_parents(A)), (B, A)),
        jnp.broadcast_to(idx, (B, A)),
        valid,
        (idx[:, None] >= idx[None, :])[None] & valid[:, :, None] & valid[:, None, :],
    )
    return Verdict(tree, jnp.where(valid, idx, 0), path.num_accepted, path.bonus, path.count, extras)


def switched_step(ctx: DraftContext, drafter: Drafter, gen: GenerateConfig, state: DecodeState) -> DecodeState:
    """One step of a drafter with `step_variants`: the chosen variant drafts and verifies inside a `lax.switch`
    (its own static tree: a small tree pays only its own verification; variants with equal node counts share
    one compiled forward); the commit and `drafter.update` (with `chain_verdict(path, SwitchExtras(...))`) run once
    after it (module doc: why the cache stays out)."""
    variants = drafter.step_variants()
    for v in variants:
        if type(v).verify_extras is not Drafter.verify_extras:
            raise TypeError(f"{drafter.name}: a step variant cannot ask for verify_extras ({type(v).__name__})")
    depth = max(v.max_depth for v in variants)
    sizes = list(dict.fromkeys(v.num_nodes for v in variants))  # one group per node count, in first-seen order
    groups = [[i for i, v in enumerate(variants) if v.num_nodes == n] for n in sizes]
    where = np.zeros((len(variants), 2), np.int32)  # variant -> (group, member)
    for g, members in enumerate(groups):
        for m, i in enumerate(members):
            where[i] = (g, m)
    index = drafter.choose(ctx, state)
    at = jnp.asarray(where)[index]
    branches = [functools.partial(_group_path, ctx, gen, [variants[i] for i in members], depth) for members in groups]
    wanted = jnp.asarray(drafter.root_logp_wanted(ctx, state), bool)
    path = jax.lax.switch(at[0], branches, (state, at[1], wanted))
    verdict = chain_verdict(path, SwitchExtras(index, path.root_logp))
    return commit_phase(ctx, drafter, gen, state, (verdict, path.k, path.v))


def spec_step(ctx: DraftContext, drafter: Drafter, gen: GenerateConfig, state: DecodeState) -> DecodeState:
    if drafter.step_variants():
        return switched_step(ctx, drafter, gen, state)
    return fixed_step(ctx, drafter, gen, state)


def context(target_params, draft_params, config, gen: GenerateConfig, capacity: int, backend: str = "auto"):
    return DraftContext(target_params, draft_params, config, backend, capacity=capacity, sampling=gen.sampling)


@functools.partial(jax.jit, static_argnames=("config", "drafter", "gen", "backend"), donate_argnames=("state",))
def decode(
    target_params, draft_params, config, drafter: Drafter, gen: GenerateConfig, state, step_limit, backend="auto"
):
    """Speculative (or AR) steps until every row is done or `state.steps >= step_limit` (an array)."""
    ctx = context(target_params, draft_params, config, gen, state.cache.capacity, backend)
    return decoding.decode_loop(functools.partial(spec_step, ctx, drafter, gen), state, step_limit)


def check_capacity(capacity: int, prompt_len: int, gen: GenerateConfig, drafter: Drafter) -> None:
    """Raises CapacityError unless the cache holds the prompt buffer, the generation and one step's writes
    (a commit writes max_depth + 1 slots past the length; `dynamic_update_slice` would clamp, not fail)."""
    need = prompt_len + gen.max_new_tokens + drafter.max_depth + 1
    if capacity < need:
        raise CapacityError(
            f"capacity: {capacity} cache slots cannot hold a {prompt_len}-token prompt buffer + "
            f"max_new_tokens={gen.max_new_tokens} + one {drafter.name} step ({drafter.max_depth + 1} slots); "
            f"need >= {need} (or leave capacity unset)"
        )


def start(
    target_params,
    draft_params,
    config,
    drafter: Drafter,
    gen: GenerateConfig,
    tokens,
    lengths,
    key,
    *,
    capacity: int,
    chunk: int = decoding.PREFILL_CHUNK,
    backend: str = "auto",
) -> DecodeState:
    """Prefill prompts tokens [B, P] (lengths [B]), emit the first token, initialise the drafter."""
    check_capacity(capacity, tokens.shape[1], gen, drafter)
    cache = KVCache.zeros(config, tokens.shape[0], capacity)
    logits, cache = decoding.prefill(target_params, config, tokens, lengths, cache, chunk=chunk, backend=backend)
    return begin(
        target_params, draft_params, config, drafter, gen, tokens, lengths, key, cache, logits, backend=backend
    )


def begin(
    target_params,
    draft_params,
    config,
    drafter: Drafter,
    gen: GenerateConfig,
    tokens,
    lengths,
    key,
    cache,
    logits,
    *,
    backend: str = "auto",
) -> DecodeState:
    """`start` after its prefill: emit the first token from the prompts' last logits [B, V] and initialise the
    drafter. A bench running several methods on one prompt prefills once and begins each from a copy."""
    state = decoding.init_state(config, gen, cache, logits, key, gen.max_new_tokens)
    ctx = dataclasses.replace(
        context(target_params, draft_params, config, gen, cache.capacity, backend),
        prompt_tokens=tokens,
        prompt_lengths=lengths,
    )
    return dataclasses.replace(state, draft=drafter.init(ctx, state))


def required_capacity(prompt_len: int, gen: GenerateConfig, drafter: Drafter) -> int:
    """Cache slots for the prompt, the generation, and one step's writes past the length."""
    return decoding.cache_capacity(
        prompt_len, gen.max_new_tokens, slack=max(decoding.PREFILL_CHUNK, drafter.max_depth + 1)
    )


def run(
    target_params,
    draft_params,
    config,
    tokens,
    lengths,
    gen: GenerateConfig,
    key,
    drafter: Drafter = ARDrafter(),
    *,
    capacity: int | None = None,
    chunk: int = decoding.PREFILL_CHUNK,
    backend: str = "auto",
) -> DecodeState:
    """Prompts [B, P] -> final DecodeState (`out[:, :num_out]` are the new tokens). Jittable end to end
    with config, gen, drafter, capacity, chunk and backend static."""
    capacity = capacity or required_capacity(tokens.shape[1], gen, drafter)
    state = start(
        target_params,
        draft_params,
        config,
        drafter,
        gen,
        tokens,
        lengths,
        key,
        capacity=capacity,
        chunk=chunk,
        backend=backend,
    )
    ctx = context(target_params, draft_params, config, gen, capacity, backend)
    step = functools.partial(spec_step, ctx, drafter, gen)
    return decoding.decode_loop(step, state, jnp.int32(gen.max_new_tokens))
