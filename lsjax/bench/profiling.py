"""Profiling helpers for the benches: where a decode step's time goes (`time_split`, which lives in
`lsjax.engine.profiling` since `decode.py --json` reports it too; re-exported here), and how many bytes the decode
state holds. They drive a `lsjax.engine.host.Generator` (its params, drafter and compile cache) but are not
part of generating text.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from lsjax import engine
from lsjax.config import GenerateConfig
from lsjax.engine.host import Generator
from lsjax.engine.profiling import _phases, time_split  # noqa: F401  (re-exported: the benches' imports)


def state_nbytes(generator: Generator, prompt_len: int, gen: GenerateConfig) -> dict[str, int]:
    """Bytes of the decode state for a prompt of this length: the target's KV cache and the drafter's own
    state (ring cache, token history; 0 for AR). Shapes are static, so this is also their peak."""
    gen = dataclasses.replace(gen, max_new_tokens=min(gen.max_new_tokens, generator.config.max_position - prompt_len))
    bucket = engine.prompt_bucket(prompt_len)
    capacity = engine.required_capacity(bucket, gen, generator.drafter)
    shape = jax.eval_shape(
        functools.partial(
            engine.start,
            config=engine.SpecConfig(
                generator.config, gen, generator.drafter, capacity=capacity, backend=generator.backend
            ),
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
