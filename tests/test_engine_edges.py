"""The engine's edges: cache capacity, finished rows in a batch, tau over active rows, batched stop tokens,
beam-shaped trees that accept deep, and greedy equality in bf16."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lsjax
from lsjax import engine
from lsjax.config import DraftConfig, GenerateConfig
from lsjax.engine.types import ARDrafter, Drafter
from lsjax.methods.hybrid.drafter import HybridDrafter
from lsjax.methods.longspec.drafter import LongSpecDrafter
from lsjax.methods.pld.drafter import PLDDrafter
from lsjax.tree import TreeConfig, make_tree
from tests.test_speculative import repetitive_prompts, run
from tests.tiny import tiny_model


def test_too_small_capacity_is_a_named_error():
    """Today's silent failure: dynamic_update_slice clamps, overwriting committed K/V."""
    config, params = tiny_model()
    gen = GenerateConfig(max_new_tokens=40, ignore_eos=True)
    prompts = repetitive_prompts(config, 1, 40, seed=1)
    with pytest.raises(engine.CapacityError, match="capacity: 96 cache slots"):
        run(params, config, prompts, gen, PLDDrafter(num_tokens=8), capacity=96)  # 64 + 40 + 9 > 96
    cfg = lsjax.SpecConfig(model=config, gen=gen, drafter=PLDDrafter(num_tokens=8), chunk=64, capacity=100)
    with pytest.raises(engine.CapacityError):
        lsjax.generate(params, (), jnp.zeros((1, 64), jnp.int32), cfg, jax.random.key(0))
    run(params, config, prompts, gen, PLDDrafter(num_tokens=8), capacity=113)  # exactly enough is fine


def _step_lengths(params, config, drafter, prompts, gen, steps, dp=()):
    B = len(prompts)
    buf = np.zeros((B, 64), np.int32)
    for b, p in enumerate(prompts):
        buf[b, : len(p)] = p
    lengths = jnp.asarray([len(p) for p in prompts], jnp.int32)
    state = engine.start(
        params, dp, config, drafter, gen, jnp.asarray(buf), lengths, jax.random.key(0), capacity=256, chunk=32
    )
    history = []
    for s in range(1, steps + 1):
        state = engine.decode(params, dp, config, drafter, gen, state, jnp.int32(s))
        history.append((np.asarray(state.cache.lengths), np.asarray(state.done), np.asarray(state.draft.length)))
    return state, history


def test_finished_rows_stop_committing_and_tau_counts_active_rows():
    config, params = tiny_model()
    drafter = PLDDrafter(num_tokens=4)
    looping = list(np.resize([5, 9, 14, 20], 40))
    prompts = [looping, list(np.arange(3, 40))]
    gen = GenerateConfig(max_new_tokens=40, ignore_eos=True)
    short = dataclasses.replace(gen, max_new_tokens=6)
    # Row 0 finishes early when its own limit is small: emulate by a stop token it emits soon.
    free = run(params, config, [prompts[0]], gen, ARDrafter())
    stop = int(np.asarray(free.out[0])[3])
    gen_stop = dataclasses.replace(gen, stop_token_ids=(stop,))
    state, history = _step_lengths(params, config, drafter, prompts, gen_stop, 12)
    done_at = next(i for i, (_, done, _) in enumerate(history) if done[0])
    assert not history[done_at][1][1], "row 1 must still be running when row 0 stops"
    frozen = [(lengths[0], hist_len[0]) for lengths, _, hist_len in history[done_at:]]
    assert len(set(frozen)) == 1, f"a finished row kept committing: {frozen}"
    assert history[-1][0][1] > history[done_at][0][1]  # the other row went on
    # tau over active row-steps equals the per-row runs pooled.
    batched = run(params, config, prompts, short, drafter)
    singles = [run(params, config, [p], short, drafter) for p in prompts]
    tokens = sum(int(s.num_out[0]) - 1 for s in singles)
    row_steps = sum(int(s.steps) for s in singles)
    assert int(batched.active_steps) == row_steps
    np.testing.assert_allclose(float(batched.mean_accepted), tokens / row_steps, rtol=1e-6)


@pytest.mark.parametrize(
    "drafter",
    [
        # The engine's row handling is shared; the default run keeps one drafter (~12 s each).
        pytest.param(PLDDrafter(num_tokens=5, ngram_max=3), marks=pytest.mark.slow),
        LongSpecDrafter(TreeConfig((2, 2, 2)), DraftConfig(window=8)),
        pytest.param(
            HybridDrafter(LongSpecDrafter(TreeConfig((2, 1)), DraftConfig(window=8)), PLDDrafter(num_tokens=4)),
            marks=pytest.mark.slow,
        ),
    ],
    ids=lambda d: d.name,
)
def test_batched_rows_with_stop_tokens_equal_their_own_ar_runs(drafter):
    """Rows of different prompt lengths that stop at different steps: each equals its own B=1 AR run."""
    config, params = tiny_model()
    prompts = [p[: 20 + 9 * i] for i, p in enumerate(repetitive_prompts(config, 4, 60, seed=5))]
    free = [
        np.asarray(run(params, config, [p], GenerateConfig(30, ignore_eos=True), ARDrafter()).out[0]) for p in prompts
    ]
    stops = (int(free[0][5]), int(free[2][12]))  # two rows stop early, the others (probably) run to the limit
    gen = GenerateConfig(max_new_tokens=30, stop_token_ids=stops, ignore_eos=True)
    sp = run(params, config, prompts, gen, drafter)
    n_out = np.asarray(sp.num_out)
    assert len(set(n_out.tolist())) > 1, "the rows should stop at different lengths"
    for b, p in enumerate(prompts):
        ar = run(params, config, [p], gen, ARDrafter())
        n = int(ar.num_out[0])
        assert n_out[b] == n, f"row {b}"
        np.testing.assert_array_equal(np.asarray(sp.out[b, :n]), np.asarray(ar.out[0, :n]))


@pytest.mark.parametrize("dtype", [pytest.param("float32", marks=pytest.mark.slow), "bfloat16"])
def test_beam_shaped_trees_accept_deep(dtype):
    """A beam-shaped tree (3, 4, 4) with the target's greedy path hidden at a random slot of each level and
    random siblings: every step accepts three nodes and the output is AR's, in fp32 and in bf16 (the
    accelerators' weights and cache: deep commits of bf16 K/V)."""
    config, params = tiny_model()
    config = dataclasses.replace(config, dtype=dtype)
    params = jax.tree.map(lambda x: x.astype(dtype), params)
    prompt = repetitive_prompts(config, 1, 40, seed=4)[0]
    gen = GenerateConfig(max_new_tokens=33, ignore_eos=True)
    greedy = np.asarray(run(params, config, [prompt], gen, ARDrafter()).out[0]).tolist()
    shape = TreeConfig((3, 4, 4))

    @dataclasses.dataclass(frozen=True)
    class HiddenPath(Drafter):
        tree: TreeConfig = shape
        name = "hidden-path"

        def propose(self, ctx, state, draft_state, key):
            B, T = state.root.shape[0], shape.num_nodes
            offsets = shape.level_offsets()
            future = jax.lax.dynamic_slice_in_dim(jnp.asarray(greedy + [0] * T), state.num_out[0], shape.depth)
            tokens = jax.random.randint(key, (T,), 3, config.vocab_size).at[0].set(state.root[0])
            parents = [-1 * jnp.ones((1,), jnp.int32)]
            on_path = 0
            for d, w in enumerate(shape.widths):
                k = jax.random.fold_in(key, d)
                slot = jax.random.randint(k, (), 0, w)
                lo = offsets[d]
                par = jax.random.randint(
                    jax.random.fold_in(k, 1), (w,), lo, lo + (1 if d == 0 else shape.widths[d - 1])
                )
                par = par.at[slot].set(on_path)
                on_path = offsets[d + 1] + slot
                tokens = tokens.at[on_path].set(future[d])
                parents.append(par.astype(jnp.int32))
            parents = jnp.concatenate(parents)[None]
            return make_tree(tokens[None], parents, jnp.ones((B, T), bool), shape)

    sp = run(params, config, [prompt], gen, HiddenPath())
    assert np.asarray(sp.out[0]).tolist() == greedy
    assert int(sp.steps) == 8  # 32 tokens after the first, 4 per step


@pytest.mark.slow  # ~19 s; deep beam-tree acceptance is test_beam_shaped_trees_accept_deep
def test_longspec_beam_tree_accepts_something():
    """The untrained LongSpec draft's beam tree still gets nodes accepted on looping text (greedy)."""
    config, params = tiny_model()
    looping = [list(np.resize([5, 9, 14, 20, 7], 50))]
    gen = GenerateConfig(max_new_tokens=24, ignore_eos=True)
    sp = run(params, config, looping, gen, LongSpecDrafter(TreeConfig((3, 4, 4)), DraftConfig(window=16)))
    assert float(sp.mean_accepted) > 1.0


@pytest.mark.slow  # bf16 equality: tests/test_invariant.py
def test_bf16_greedy_speculative_equals_ar():
    """Where accelerators run: bf16 weights and cache. Verification and AR compute logits with different
    matmul shapes, so equality holds up to argmax ties at bf16 precision; on this model there are none."""
    config, params = tiny_model()
    config = dataclasses.replace(config, dtype="bfloat16")
    params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
    gen = GenerateConfig(max_new_tokens=16, ignore_eos=True)
    prompts = repetitive_prompts(config, 2, 40, seed=1) + [np.resize([5, 9, 14, 20], 40)]
    ar = run(params, config, prompts, gen, ARDrafter())
    sp = run(params, config, prompts, gen, PLDDrafter(num_tokens=4))
    np.testing.assert_array_equal(np.asarray(sp.out), np.asarray(ar.out))
    assert int(sp.steps) < int(ar.steps)
