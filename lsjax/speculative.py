"""The speculative engine: draft -> verify -> accept -> commit, jitted end to end with static shapes.

    spec_step(ctx, drafter, gen, state) -> state     one step (any drafter; ARDrafter = plain AR)
    decode(...)                                      jitted `lax.while_loop` of steps, state donated
    generate(...)                                    prefill + first token + decode, jittable end to end

One step: the drafter proposes a tree rooted at the pending token; one target
forward scores every node (hybrid tree attention: committed cache unmasked +
tree under its ancestor mask); `accept` walks the tree; the accepted path's K/V
(root included) go into cache slots [n, n + a + 1); the bonus token becomes the
new root. AR and speculative decoding share every line of this loop, so
comparisons between them measure the method, not two code paths.

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

from lsjax import decoding
from lsjax.cache import KVCache, commit
from lsjax.config import GenerateConfig
from lsjax.decoding import DecodeState
from lsjax.drafters.base import ARDrafter, DraftContext, Drafter, Verdict
from lsjax.errors import LsjaxError
from lsjax.sampling import tree_penalty_mask
from lsjax.tree import Tree
from lsjax.verify import accept, gather_path_kv, tree_forward


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


def penalty_windows(ctx: DraftContext, drafter: Drafter, gen: GenerateConfig, state: DecodeState, tree: Tree):
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
        drafter.max_depth,
    )


def verify_phase(ctx: DraftContext, drafter: Drafter, gen: GenerateConfig, state: DecodeState, tree: Tree):
    """Target forward over the tree + acceptance. Returns (verdict, path_k, path_v) with the path's K/V
    [L, B, max_depth + 1, K, H] for the commit."""
    hidden, logits, new_k, new_v = tree_forward(ctx.target_params, ctx.config, tree, state.cache, backend=ctx.backend)
    penalized = penalty_windows(ctx, drafter, gen, state, tree)
    path, num_accepted, bonus = accept(
        tree, logits, gen.sampling, step_keys(state.key)[2], drafter.max_depth, _levels(drafter), penalized
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
        extras=drafter.verify_extras(ctx, tree, hidden, logits),
    )
    path_k, path_v = gather_path_kv(new_k, new_v, path)
    return verdict, path_k, path_v


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


def spec_step(ctx: DraftContext, drafter: Drafter, gen: GenerateConfig, state: DecodeState) -> DecodeState:
    tree = draft_phase(ctx, drafter, state)
    verified = verify_phase(ctx, drafter, gen, state, tree)
    return commit_phase(ctx, drafter, gen, state, verified)


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
    state = decoding.init_state(config, gen, cache, logits, key, gen.max_new_tokens)
    ctx = dataclasses.replace(
        context(target_params, draft_params, config, gen, capacity, backend),
        prompt_tokens=tokens,
        prompt_lengths=lengths,
    )
    return dataclasses.replace(state, draft=drafter.init(ctx, state))


def required_capacity(prompt_len: int, gen: GenerateConfig, drafter: Drafter) -> int:
    """Cache slots for the prompt, the generation, and one step's writes past the length."""
    return decoding.cache_capacity(
        prompt_len, gen.max_new_tokens, slack=max(decoding.PREFILL_CHUNK, drafter.max_depth + 1)
    )


def generate(
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
