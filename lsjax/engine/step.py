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
only read inside the branches is not. The same steps can also run one
node-count group per program (`group_loop`), the host switching between them
(`lsjax.runtime.split.SplitDecode`).

For profiling, `draft_phase`, `verify_phase` and `commit_phase` are the same
step cut in three jittable pieces (`lsjax.engine.host` times them separately).
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

from lsjax.cache import commit
from lsjax.config import GenerateConfig, ModelConfig
from lsjax.engine.types import DecodeState, DraftContext, Drafter, SwitchExtras, Verdict, step_keys
from lsjax.engine.verify import _levels, _verify, verify_phase
from lsjax.tree import Tree, chain_parents


def draft_phase(ctx: DraftContext, drafter: Drafter, state: DecodeState) -> Tree:
    return drafter.propose(ctx, state, state.draft, step_keys(state.key)[1])


def stop_ids(config: ModelConfig, gen: GenerateConfig) -> tuple[int, ...]:
    return tuple(gen.stop_token_ids) + (() if gen.ignore_eos else tuple(config.eos_token_ids))


def emit(state_out, num_out, done, tokens, count, limit, stops):
    """Appends tokens [B, A] (the first count[b] valid) to the output buffer, stopping rows at a stop token or
    at `limit` [B] new tokens.

    Returns (out, num_out, done, emitted [B]).
    """
    B, A = tokens.shape
    M = state_out.shape[1]
    idx = jnp.arange(A)[None, :]
    valid = (idx < count[:, None]) & ~done[:, None]
    is_stop = jnp.isin(tokens, jnp.asarray(stops, jnp.int32)) if stops else jnp.zeros_like(tokens, bool)
    # A row stops after its first stop token or at its limit.
    stop_before = jnp.cumsum(is_stop & valid, axis=1) - (is_stop & valid)
    valid = valid & (stop_before == 0) & (num_out[:, None] + idx < limit[:, None])
    n = jnp.sum(valid, axis=1).astype(jnp.int32)
    pos = jnp.where(valid, num_out[:, None] + idx, M)  # out-of-range writes are dropped
    out = state_out.at[jnp.arange(B)[:, None], pos].set(tokens, mode="drop")
    hit_stop = jnp.any(is_stop & valid, axis=1)
    num_out = num_out + n
    done = done | hit_stop | (num_out >= limit)
    return out, num_out, done, n


def commit_phase(ctx: DraftContext, drafter: Drafter, gen: GenerateConfig, state: DecodeState, verified) -> DecodeState:
    verdict, path_k, path_v = verified
    cache = commit(state.cache, path_k, path_v, verdict.count)  # root + accepted nodes; nothing for done rows
    out, num_out, done, n = emit(
        state.out,
        state.num_out,
        state.done,
        verdict.emitted(),
        verdict.count,
        state.limit,
        stop_ids(ctx.config, gen),
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
        limit=state.limit,
    )
    if drafter is None:  # the caller updates the draft state (`run_variant` with a traced `update`)
        return new_state
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
    aux: jax.Array | None = None  # [B, A, X] the switching drafter's aux streams along the path (`SwitchExtras.aux`)


def _stochastic(tree: Tree, vocab_size: int) -> Tree:
    """A deterministic tree in a sampled tree's layout: no sampled node (so verification runs sample-and-match
    at every node, as for the tree itself) and an unused q."""
    B, T = tree.tokens.shape
    logq = jnp.full((B, T, vocab_size), -jnp.inf, jnp.float32)
    return dataclasses.replace(tree, logq=logq, sampled=jnp.zeros((B, T), bool))


def _group_path(ctx, gen, variants, depth: int, aux_layers: tuple[int, ...], operand) -> PathResult:
    """Variants with the same node count share one verification forward: an inner switch drafts the chosen
    one's tree, one target forward over T nodes verifies it (tokens, depths and the mask are arrays). With
    `aux_layers` (the switching drafter's) the forward also returns those streams, kept along the path."""
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
    verdict, path_k, path_v = _verify(ctx, gen, state, tree, max_depth, levels, None, wanted, aux_layers)
    pad = depth - max_depth
    kv_pad = ((0, 0), (0, 0), (0, pad), (0, 0), (0, 0))
    root_logp, aux = verdict.extras
    if aux is not None:
        aux = jnp.pad(jnp.take_along_axis(aux, verdict.path[:, :, None], axis=1), ((0, 0), (0, pad), (0, 0)))
    return PathResult(
        jnp.pad(verdict.path_tokens, ((0, 0), (0, pad))),
        verdict.num_accepted,
        verdict.bonus,
        verdict.count,
        jnp.pad(path_k, kv_pad),
        jnp.pad(path_v, kv_pad),
        root_logp,
        aux,
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


def ar_index(drafter: Drafter) -> int:
    """The variant a stretch's AR steps run (with no draft update): the first group's only member, one node."""
    variants = drafter.step_variants()
    first = variant_groups(drafter)[0]
    if len(first) != 1 or variants[first[0]].num_nodes != 1:
        raise TypeError(f"{drafter.name}: a drafter that stretches needs AR (one node) alone in its first group")
    return first[0]


def ar_stretch(
    ctx: DraftContext, drafter: Drafter, gen: GenerateConfig, state: DecodeState, n, own=False
) -> DecodeState:
    """Up to n [] AR steps (AR's switched step with no draft update: no choosing, no bookkeeping), then one
    `drafter.catch_up` over the tokens they committed, as a chain verdict. `own` ([] bool, n = 0 with it): AR's
    own switched step instead, with its update, in the same loop: `group_loop`'s first program then holds one
    target forward for both (two forwards made it much larger and slower to load: docs/design/cpu-startup.md).

    Why: a switched step that runs AR still pays for choosing and every sub-drafter's update (3-4% of an AR
    step on a CPU for auto); a stretch pays that once. At most the drafter's `stretch_limit` steps: the chain
    it catches up with has static length."""
    limit = drafter.stretch_limit
    start, steps0, since = state, state.steps, state.num_out
    n = jnp.minimum(n, limit)

    def planned(_):
        return drafter.stretch_plan(ctx, start)

    # Most switched steps run no stretch (n = 0): the plan is only worked out for one that does.
    blank = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), jax.eval_shape(planned, None))
    plan = jax.lax.cond(n > 0, planned, lambda _: blank, None)

    def more(m):
        s, pending = m
        # The last token is left to the step after the stretch, which runs anyway: ending the run inside the
        # stretch would make that step a forward over finished rows.
        last = jnp.any(~s.done & (s.num_out >= s.limit - 1))
        stop = jnp.asarray(drafter.stretch_stop(ctx, start, plan, s), bool)
        return pending | ((s.steps - steps0 < n) & ~jnp.all(s.done) & ~last & ~stop)

    def step(m):
        s, pending = m
        update = False if own is False else pending
        return run_variant(ctx, drafter, gen, s, ar_index(drafter), 0, update=update), jnp.bool_(False)

    state = jax.lax.while_loop(more, step, (state, jnp.asarray(own, bool)))[0]
    ran = jnp.where(own, 0, state.steps - steps0)

    def catch_up(state):
        B = state.root.shape[0]
        # Committed: the roots of the stretch's steps, out[since - 1 ...] (the root of its first step was the
        # last token emitted before it); emitted: out[since ...], the last of them now the pending root.
        idx = jnp.clip(since[:, None] - 1 + jnp.arange(limit + 1)[None], 0, state.out.shape[1] - 1)
        committed = jnp.take_along_axis(state.out, idx, axis=1)
        count = (state.num_out - since).astype(jnp.int32)  # tokens each row committed (and emitted)
        path = PathResult(
            committed, jnp.maximum(count - 1, 0), state.root, count, None, None, jnp.zeros((B,), jnp.float32)
        )
        return drafter.catch_up(ctx, state, state.draft, chain_verdict(path), ran)

    draft = jax.lax.cond(ran > 0, catch_up, lambda state: state.draft, state)
    return dataclasses.replace(state, draft=draft)


def variant_groups(drafter: Drafter) -> list[list[int]]:
    """A switched drafter's variants grouped by node count (first-seen order): each group shares one target
    forward, and is one program when the host switches between groups (`group_loop`)."""
    variants = drafter.step_variants()
    sizes = list(dict.fromkeys(v.num_nodes for v in variants))
    return [[i for i, v in enumerate(variants) if v.num_nodes == n] for n in sizes]


def run_variant(
    ctx: DraftContext,
    drafter: Drafter,
    gen: GenerateConfig,
    state: DecodeState,
    index,
    group: int | None = None,
    update=True,
) -> DecodeState:
    """Variant `index` [] of a switched drafter drafts, verifies (inside a `lax.switch` over the node-count
    groups, or only `group`'s when given: `index` must then be one of its members) and commits. `update`: whether
    the drafter updates its state from the step (False: a stretch's AR step; a [] bool: decided at run time)."""
    variants = drafter.step_variants()
    for v in variants:
        if type(v).verify_extras is not Drafter.verify_extras:
            raise TypeError(f"{drafter.name}: a step variant cannot ask for verify_extras ({type(v).__name__})")
    depth = max(v.max_depth for v in variants)
    groups = variant_groups(drafter)
    where = np.zeros((len(variants), 2), np.int32)  # variant -> (group, member)
    for g, members in enumerate(groups):
        for m, i in enumerate(members):
            where[i] = (g, m)
    at = jnp.asarray(where)[index]
    aux = drafter.aux_hidden_layers
    branches = [
        functools.partial(_group_path, ctx, gen, [variants[i] for i in members], depth, aux) for members in groups
    ]
    wanted = jnp.asarray(drafter.root_logp_wanted(ctx, state), bool)
    if group is None:
        path = jax.lax.switch(at[0], branches, (state, at[1], wanted))
    else:
        path = branches[group]((state, at[1], wanted))
    verdict = chain_verdict(path, SwitchExtras(index, path.root_logp, path.aux))
    if update is True:
        return commit_phase(ctx, drafter, gen, state, (verdict, path.k, path.v))
    new_state = commit_phase(ctx, None, gen, state, (verdict, path.k, path.v))
    if update is False:
        return new_state

    def updated(c):  # a `while_loop` of 0 or 1 trips, not a `cond`: its carry (the cache too) stays in place
        s, _ = c
        return dataclasses.replace(s, draft=drafter.update(ctx, s, s.draft, verdict)), jnp.bool_(False)

    return jax.lax.while_loop(lambda c: c[1], updated, (new_state, jnp.asarray(update, bool)))[0]


def switched_step(ctx: DraftContext, drafter: Drafter, gen: GenerateConfig, state: DecodeState) -> DecodeState:
    """One step of a drafter with `step_variants`: the chosen variant drafts and verifies inside a `lax.switch`
    (its own static tree: a small tree pays only its own verification; variants with equal node counts share
    one compiled forward); the commit and `drafter.update` (with `chain_verdict(path, SwitchExtras(...))`) run once
    after it (module doc: why the cache stays out)."""
    stretch = drafter.ar_stretch(ctx, state)
    if stretch is not None:
        state = ar_stretch(ctx, drafter, gen, state, stretch)
    return run_variant(ctx, drafter, gen, state, drafter.choose(ctx, state))


# `group_loop`'s next unit, besides a variant's index: an AR stretch (then the choice, in the same step), or
# nothing known yet (the first call: the unit is planned before anything runs).
STRETCH = -1
PLAN = -2


def next_unit(ctx: DraftContext, drafter: Drafter, state: DecodeState, choice=None) -> jax.Array:
    """[] int32: what `switched_step` would run next from `state`: STRETCH, or the variant it chooses
    (`choice`, when the caller has it already)."""
    stretch = drafter.ar_stretch(ctx, state)
    choice = drafter.choose(ctx, state).astype(jnp.int32) if choice is None else choice
    return choice if stretch is None else jnp.where(stretch > 0, STRETCH, choice)


def group_loop(ctx: DraftContext, drafter: Drafter, gen: GenerateConfig, state: DecodeState, nxt, fresh, limit, group):
    """`switched_step`s, cut so that a program holds one node-count group's forward (`variant_groups`): runs
    units while the next one (`nxt`: a variant, STRETCH or PLAN) is this group's, the run is not over and
    `state.steps < limit`; returns (state, nxt, fresh) for the program of the group that runs next. The first
    group (AR's, one node) also runs stretches and plans. `fresh` False: `nxt` was chosen after a stretch
    and belongs to the step the stretch began, which runs whatever the limit (as inside `switched_step`).
    The steps, choices and state are those of `switched_step` in a loop (tests/test_split_decode.py)."""
    members = jnp.asarray(variant_groups(drafter)[group], jnp.int32)
    first = group == 0
    stretches = drafter.ar_stretch(ctx, state) is not None  # (static: whether the drafter ever stretches)

    def cond(c):
        state, nxt, fresh = c
        mine = jnp.any(nxt == members) | (first & (nxt == STRETCH))
        return mine & (~fresh | (~jnp.all(state.done) & (state.steps < limit)))

    # No `lax.cond` or `switch` carries the state: XLA:CPU copies a buffer that passes through a conditional's
    # outputs (the whole target cache, every step: 13% of the decode's time). A unit that may not run is a
    # `while_loop` of 0 or 1 trips instead, whose carry stays in place.
    def body(c):
        state, unit, _ = c
        is_stretch = unit == STRETCH
        if first and stretches:  # a stretch, or AR's own step: one loop, one target forward (`ar_stretch`)
            n = jnp.where(is_stretch, drafter.ar_stretch(ctx, state), 0)
            state = ar_stretch(ctx, drafter, gen, state, n, own=~is_stretch)
        else:

            def one_step(s):
                return run_variant(ctx, drafter, gen, s[0], unit, group), jnp.bool_(True)

            state = jax.lax.while_loop(lambda s: ~s[1], one_step, (state, is_stretch))[0]
        # After a stretch: the choice of the step it began (runs next, whatever the limit); else the next unit.
        chosen = drafter.choose(ctx, state).astype(jnp.int32)
        return state, jnp.where(is_stretch, chosen, next_unit(ctx, drafter, state, chosen)), ~is_stretch

    nxt = jnp.asarray(nxt, jnp.int32)
    if first:  # the first call plans its first unit
        nxt = jnp.where(nxt == PLAN, next_unit(ctx, drafter, state), nxt)
    return jax.lax.while_loop(cond, body, (state, nxt, jnp.asarray(fresh, bool)))


def spec_step(ctx: DraftContext, drafter: Drafter, gen: GenerateConfig, state: DecodeState) -> DecodeState:
    if drafter.step_variants():
        return switched_step(ctx, drafter, gen, state)
    return fixed_step(ctx, drafter, gen, state)


def context(target_params, draft_params, config, gen: GenerateConfig, capacity: int, backend: str = "auto"):
    return DraftContext(target_params, draft_params, config, backend, capacity=capacity, sampling=gen.sampling)
