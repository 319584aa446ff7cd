"""The jittable entry point for research code: one frozen config, arrays in, arrays out.

    cfg = lsjax.SpecConfig(model=model.config, drafter=lsjax.PLDDrafter(), gen=lsjax.GenerateConfig(64))
    out = jax.jit(lsjax.generate, static_argnames="config")(params, (), prompt_ids, cfg, key)
    out.tokens[b, : out.num_tokens[b]]

`generate` composes freely with the caller's own `jax.jit`, `vmap`-free batching
(rows of `prompt_ids` are independent sequences) and donation; the step
functions (`speculative.spec_step`, `draft_phase`, `verify_phase`, `commit_phase`)
are exported for finer control.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from lsjax import decoding, speculative
from lsjax.config import ConfigError, GenerateConfig, ModelConfig
from lsjax.drafters.base import ARDrafter, Drafter
from lsjax.models import target


@dataclasses.dataclass(frozen=True)
class SpecConfig:
    """Everything static about a generation call (hashable: a `jax.jit` static argument)."""

    model: ModelConfig
    gen: GenerateConfig = GenerateConfig()
    drafter: Drafter = ARDrafter()
    # Cache slots; default: prompt buffer + max_new_tokens + one step of slack. Too small raises CapacityError.
    capacity: int | None = None
    chunk: int = decoding.PREFILL_CHUNK  # prefill chunk; the prompt buffer length must be a multiple of it
    backend: str = "auto"
    # The weights' and K/V cache's dtype is `model.dtype` (fp32 on a CPU, bf16 on TPU/GPU:
    # `lsjax.config.default_dtype`); `generate` checks the target params carry it.


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class GenerateOutput:
    tokens: jax.Array  # [B, max_new_tokens] generated ids (valid up to num_tokens)
    num_tokens: jax.Array  # [B] int32
    target_forwards: jax.Array  # [] int32, prefill included
    mean_accepted: jax.Array  # [] float32: tokens emitted per decode step of a row still generating (tau)


def generate(
    target_params,
    draft_params,
    prompt_ids: jax.Array,
    config: SpecConfig,
    key: jax.Array,
    prompt_lengths: jax.Array | None = None,
) -> GenerateOutput:
    """prompt_ids [B, P] (right-padded; P a multiple of config.chunk), prompt_lengths [B] (default P)."""
    B, P = prompt_ids.shape
    weights_dtype = jnp.asarray(target_params["embed"]).dtype if isinstance(target_params, dict) else None
    if weights_dtype is not None and weights_dtype != jnp.dtype(config.model.dtype):
        # A mismatch would run (JAX promotes) but in neither dtype: the cache would be config.model.dtype and
        # the dots the params', so AR in one program and speculation in another could disagree at ties.
        raise ConfigError(
            f"SpecConfig.model.dtype is {config.model.dtype} but the target params are {weights_dtype}; load "
            f"them with load_model(dtype=...) or set model=dataclasses.replace(config, dtype=...)"
        )
    if P % config.chunk:
        raise ValueError(f"prompt_ids length {P} must be a multiple of config.chunk={config.chunk}; pad it")
    lengths = jnp.full((B,), P, jnp.int32) if prompt_lengths is None else prompt_lengths.astype(jnp.int32)
    state = speculative.run(
        # Inside jit this slices the weights once per call (outside the decode loop), not per token.
        target.prepare_for_decode(target_params, config.model),
        draft_params,
        config.model,
        prompt_ids,
        lengths,
        config.gen,
        key,
        config.drafter,
        capacity=config.capacity,
        chunk=config.chunk,
        backend=config.backend,
    )
    return GenerateOutput(state.out, state.num_out, state.steps + 1, state.mean_accepted.astype(jnp.float32))
