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
from lsjax.drafters.base import ARDrafter, DraftContext, Drafter
from lsjax.tree import Tree
from lsjax.verify import accept, gather_path_kv, tree_forward


def draft_phase(ctx: DraftContext, drafter: Drafter, state: DecodeState) -> Tree:
    return drafter.propose(ctx, state)


def verify_phase(ctx: DraftContext, drafter: Drafter, gen: GenerateConfig, state: DecodeState, tree: Tree):
    """Target forward over the tree + acceptance. Returns (path, num_accepted, bonus, path_k, path_v, key)."""
    logits, new_k, new_v = tree_forward(ctx.target_params, ctx.config, tree, state.cache, backend=ctx.backend)
    key, sub = jax.random.split(state.key)
    path, num_accepted, bonus = accept(tree, logits, gen.sampling, sub, drafter.max_depth)
    path_k, path_v = gather_path_kv(new_k, new_v, path)
    return path, num_accepted, bonus, path_k, path_v, key


def commit_phase(
    ctx: DraftContext, drafter: Drafter, gen: GenerateConfig, state: DecodeState, tree: Tree, verified
) -> DecodeState:
    path, num_accepted, bonus, path_k, path_v, key = verified
    cache = commit(state.cache, path_k, path_v, num_accepted + 1)  # root + accepted nodes
    B, A = path.shape
    # Emitted this step: the accepted nodes' tokens, then the bonus.
    path_tokens = jnp.take_along_axis(tree.tokens, path, axis=1)  # [B, A]; [:, 0] is the root
    emitted = jnp.concatenate([path_tokens[:, 1:], jnp.zeros((B, 1), jnp.int32)], axis=1)
    emitted = emitted.at[jnp.arange(B), num_accepted].set(bonus)
    out, num_out, done, n = decoding.emit(
        state.out, state.num_out, state.done, emitted, num_accepted + 1, gen, decoding.stop_ids(ctx.config, gen)
    )
    new_state = DecodeState(
        cache, bonus, out, num_out, done, key, state.steps + 1, state.accepted + jnp.sum(n), state.draft
    )
    draft = drafter.update(ctx, new_state, state.draft, tree, path, num_accepted, bonus)
    return dataclasses.replace(new_state, draft=draft)


def spec_step(ctx: DraftContext, drafter: Drafter, gen: GenerateConfig, state: DecodeState) -> DecodeState:
    tree = draft_phase(ctx, drafter, state)
    verified = verify_phase(ctx, drafter, gen, state, tree)
    return commit_phase(ctx, drafter, gen, state, tree, verified)


@functools.partial(jax.jit, static_argnames=("config", "drafter", "gen", "backend"), donate_argnames=("state",))
def decode(
    target_params, draft_params, config, drafter: Drafter, gen: GenerateConfig, state, step_limit, backend="auto"
):
    """Speculative (or AR) steps until every row is done or `state.steps >= step_limit` (an array)."""
    ctx = DraftContext(target_params, draft_params, config, backend)
    return decoding.decode_loop(functools.partial(spec_step, ctx, drafter, gen), state, step_limit)


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
    cache = KVCache.zeros(config, tokens.shape[0], capacity)
    logits, cache = decoding.prefill(target_params, config, tokens, lengths, cache, chunk=chunk, backend=backend)
    state = decoding.init_state(config, gen, cache, logits, key, gen.max_new_tokens)
    ctx = DraftContext(target_params, draft_params, config, backend, tokens, lengths)
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
    ctx = DraftContext(target_params, draft_params, config, backend)
    step = functools.partial(spec_step, ctx, drafter, gen)
    return decoding.decode_loop(step, state, jnp.int32(gen.max_new_tokens))
