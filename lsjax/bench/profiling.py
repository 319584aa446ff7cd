"""Profiling helpers for the benches (and `decode.py --json`): where a decode step's time goes, and how many
bytes the decode state holds. They drive a `lsjax.generation.Generator` (its params, drafter and compile
cache) but are not part of generating text.
"""

from __future__ import annotations

import dataclasses
import functools
import time
import weakref

import jax
import jax.numpy as jnp
import numpy as np

from lsjax import decoding, speculative
from lsjax.config import GenerateConfig
from lsjax.drafters.base import Drafter
from lsjax.generation import Generator

# Per generator and shape signature, like its fused programs: profiling many prompts compiles once per bucket.
_PHASES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _phases(generator: Generator, bucket: int, capacity: int, gen: GenerateConfig, drafter: Drafter):
    cache = _PHASES.setdefault(generator, {})
    sig = (bucket, capacity, gen)
    if sig in cache:
        return cache[sig]
    config, backend = generator.config, generator.backend

    def ctx(tp, dp):
        return speculative.context(tp, dp, config, gen, capacity, backend)

    draft = jax.jit(lambda tp, dp, st: speculative.draft_phase(ctx(tp, dp), drafter, st))
    verify = jax.jit(lambda tp, dp, st, tr: speculative.verify_phase(ctx(tp, dp), drafter, gen, st, tr))
    commit = jax.jit(  # donated, as in the fused step: the cache is updated in place, not copied
        lambda tp, dp, st, v: speculative.commit_phase(ctx(tp, dp), drafter, gen, st, v),
        donate_argnums=(2,),
    )
    cache[sig] = (draft, verify, commit)
    return cache[sig]


def state_nbytes(generator: Generator, prompt_len: int, gen: GenerateConfig) -> dict[str, int]:
    """Bytes of the decode state for a prompt of this length: the target's KV cache and the drafter's own
    state (ring cache, token history; 0 for AR). Shapes are static, so this is also their peak."""
    gen = dataclasses.replace(gen, max_new_tokens=min(gen.max_new_tokens, generator.config.max_position - prompt_len))
    bucket = decoding.prompt_bucket(prompt_len)
    capacity = speculative.required_capacity(bucket, gen, generator.drafter)
    shape = jax.eval_shape(
        functools.partial(
            speculative.start,
            config=generator.config,
            drafter=generator.drafter,
            gen=gen,
            capacity=capacity,
            backend=generator.backend,
        ),
        generator.params,
        generator.draft_params,
        tokens=jax.ShapeDtypeStruct((1, bucket), jnp.int32),
        lengths=jax.ShapeDtypeStruct((1,), jnp.int32),
        key=jax.random.key(0),
    )

    def nbytes(tree) -> int:
        return int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree)))

    return {"kv_cache": nbytes(shape.cache), "draft": nbytes(shape.draft)}


def time_split(
    generator: Generator, prompt_ids: list[int], gen: GenerateConfig, seed: int = 0, steps: int = 16
) -> dict:
    """Mean ms per step spent drafting, verifying (target forward + acceptance) and committing, measured
    by running the step's three phases as separate jitted calls for `steps` steps (the fused step used
    for the real timings runs them in one program, so this split is a profile, not the total)."""
    if generator.drafter.step_variants():
        return {}  # each step is one of several shapes chosen on device: there is no single split
    gen, P, buf, key, (start, _, drafter), _ = generator._prepare(prompt_ids, gen, seed)
    state = start(
        generator.params, generator.draft_params, tokens=jnp.asarray(buf), lengths=jnp.array([P], jnp.int32), key=key
    )
    bucket = buf.shape[1]
    draft, verify, commit = _phases(
        generator, bucket, speculative.required_capacity(bucket, gen, generator.drafter), gen, drafter
    )
    totals = np.zeros(3)
    counted = 0
    for i in range(steps + 1):  # step 0 compiles and is not counted
        if bool(state.done[0]):
            break
        t0 = time.perf_counter()
        tree = jax.block_until_ready(draft(generator.params, generator.draft_params, state))
        t1 = time.perf_counter()
        verified = jax.block_until_ready(verify(generator.params, generator.draft_params, state, tree))
        t2 = time.perf_counter()
        state = jax.block_until_ready(commit(generator.params, generator.draft_params, state, verified))
        t3 = time.perf_counter()
        if i > 0:
            totals += (t1 - t0, t2 - t1, t3 - t2)
            counted += 1
    ms = totals / max(counted, 1) * 1e3
    return {
        "draft_ms": round(ms[0], 3),
        "verify_ms": round(ms[1], 3),
        "commit_ms": round(ms[2], 3),
        "steps_profiled": counted,
    }
