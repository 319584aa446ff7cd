"""Where a decode step's time goes, for `decode.py --json` and the benches (`lsjax.bench.profiling` re-exports
`time_split`): it drives a `lsjax.engine.host.Generator` (its params, drafter and compiled programs).

    split = time_split(generator, prompt_ids, gen)
    # one tree per step: {"draft_ms", "verify_ms", "commit_ms", "steps_profiled"}
    # auto:              {"step_ms_by_candidate": {"ar": ..., "pld-4": ..., ...}, "step_ms_source": ...}
"""

from __future__ import annotations

import time
import weakref

import jax
import numpy as np

from lsjax.config import GenerateConfig
from lsjax.engine import step
from lsjax.engine.host import Generator, start_args
from lsjax.engine.types import Drafter, SwitchProfiled

# Per generator and shape signature, like its fused programs: profiling many prompts compiles once per bucket.
_PHASES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _phases(generator: Generator, bucket: int, capacity: int, gen: GenerateConfig, drafter: Drafter):
    cache = _PHASES.setdefault(generator, {})
    sig = (bucket, capacity, gen)
    if sig in cache:
        return cache[sig]
    config, backend = generator.config, generator.backend

    def ctx(tp, dp):
        return step.context(tp, dp, config, gen, capacity, backend)

    draft = jax.jit(lambda tp, dp, st: step.draft_phase(ctx(tp, dp), drafter, st))
    verify = jax.jit(lambda tp, dp, st, tr: step.verify_phase(ctx(tp, dp), drafter, gen, st, tr))
    commit = jax.jit(  # donated, as in the fused step: the cache is updated in place, not copied
        lambda tp, dp, st, v: step.commit_phase(ctx(tp, dp), drafter, gen, st, v),
        donate_argnums=(2,),
    )
    cache[sig] = (draft, verify, commit)
    return cache[sig]


def prefilled(generator: Generator, prompt_ids: list[int], gen: GenerateConfig, seed: int = 0):
    """(gen capped to the context, the prompt bucket, the state after prefill, (start, decode, drafter)): a
    prompt prefilled by the generator's compiled programs, for callers that step the decode themselves."""
    gen, P, buf, key, compiled, _ = generator.programs_for(prompt_ids, gen, seed)
    state = compiled[0](generator.params, generator.draft_params, **start_args(buf, P, key, gen))
    return gen, buf.shape[1], state, compiled


def time_split(
    generator: Generator, prompt_ids: list[int], gen: GenerateConfig, seed: int = 0, steps: int = 16
) -> dict:
    """Mean ms per step spent drafting, verifying (target forward + acceptance) and committing, measured
    by running the step's three phases as separate jitted calls for `steps` steps (the fused step used
    for the real timings runs them in one program, so this split is a profile, not the total).

    A drafter whose steps are variants chosen on device (`auto`) has no single split: it gives its own
    (`SwitchProfiled`), or none."""
    if generator.drafter.step_variants():
        if isinstance(generator.drafter, SwitchProfiled):
            return generator.drafter.switch_split(generator, prompt_ids, gen, seed)
        return {}
    gen, bucket, state, (_, _, drafter) = prefilled(generator, prompt_ids, gen, seed)
    draft, verify, commit = _phases(generator, bucket, state.cache.capacity, gen, drafter)
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
