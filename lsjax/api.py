"""The jittable entry point for research code: one frozen config, arrays in, arrays out.

    cfg = lsjax.SpecConfig(model=model.config, drafter=lsjax.PLDDrafter(), gen=lsjax.GenerateConfig(64))
    out = jax.jit(lsjax.generate)(params, (), prompt_ids, cfg, key)  # cfg is static (no leaves)
    out.tokens[b, : out.num_tokens[b]]

`generate` composes freely with the caller's own `jax.jit`, `vmap`-free batching
(rows of `prompt_ids` are independent sequences) and donation; the step
functions (`engine.spec_step`, `draft_phase`, `verify_phase`, `commit_phase`)
are exported for finer control.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from lsjax import engine
from lsjax.config import ConfigError, ModelConfig
from lsjax.engine.types import SpecConfig
from lsjax.errors import InputError
from lsjax.models import target
from lsjax.models.draft_params import DraftParams

VOCAB = "vocab"  # the Flax collection of a draft's pruned vocabulary ids


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
    max_new_tokens: jax.Array | None = None,
) -> GenerateOutput:
    """`target_params`, `draft_params`: each a params dict (`load_model().params`, `load_draft`'s), Flax
    variables (`{"params": ...}`, boxed or not: what `Transformer(cfg).init` or a caller's own module holds), or a
    bound module (`module.bind(variables)`); `params_of` says how each is read.

    prompt_ids [B, P] int (right-padded; P a multiple of config.chunk: `pad_prompts`), prompt_lengths [B] int
    (default P), max_new_tokens [B] or [] int (default and at most `config.gen.max_new_tokens`, the width of
    `tokens`): new tokens per row as data, so one compiled program serves every count up to that width, as it
    serves every prompt of its width.

    Checked, raising `lsjax.errors.InputError` (or `ConfigError` for the config): shapes and dtypes always (at
    trace time); values (each length in [1, P], every prompt id in [0, vocab), length + max_new_tokens within
    the context window) wherever the arrays are concrete, i.e. called outside `jax.jit` or with them closed
    over. Under the caller's `jax.jit` the values are data: a row with a length outside [1, P] or an id outside
    the vocabulary returns `num_tokens = 0` (no output, never output computed from garbage), and a row whose
    generation would pass the context window stops there (`num_tokens` counts only the tokens inside it).
    """
    target_params = params_of(target_params, config.model)
    draft_params = params_of(draft_params)
    prompt_ids, prompt_lengths = _check_shapes(prompt_ids, prompt_lengths, config)
    max_new_tokens = _check_max_new(max_new_tokens, prompt_ids.shape[0], config)
    engine.check_inputs(target_params, draft_params, key, config)
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
        raise InputError(f"prompt_ids: width {P} must be a multiple of SpecConfig.chunk={config.chunk}; pad it")
    lengths = jnp.full((B,), P, jnp.int32) if prompt_lengths is None else prompt_lengths.astype(jnp.int32)
    _check_values(prompt_ids, lengths, config, max_new_tokens)
    V = config.model.vocab_size
    in_range = (lengths >= 1) & (lengths <= P)
    pos = jnp.arange(P)[None, :]
    in_vocab = (prompt_ids >= 0) & (prompt_ids < V)
    ids_ok = jnp.all((pos >= lengths[:, None]) | in_vocab, axis=1)
    valid = in_range & ids_ok
    # Invalid rows still run (shapes are static) on harmless inputs; their output is dropped below.
    lengths = jnp.clip(lengths, 1, P)
    prompt_ids = jnp.where(in_vocab, prompt_ids, 0).astype(jnp.int32)
    # Inside jit this slices the weights once per call (outside the decode loop), not per token. On a mesh the
    # projections are grouped per shard (a no-op for params `lsjax.mesh.place` already grouped).
    shards = 1 if config.mesh is None else int(config.mesh.shape["model"])
    params = target.group_for_shards(target_params, config.model, shards)
    state = engine.run(params, draft_params, config, prompt_ids, lengths, key, max_new=max_new_tokens)
    room = jnp.maximum(config.model.max_position - lengths, 0)
    num = jnp.where(valid, jnp.minimum(state.num_out, room), 0).astype(jnp.int32)
    return GenerateOutput(state.out, num, state.steps + 1, state.mean_accepted.astype(jnp.float32))


def params_of(x, model: ModelConfig | None = None):
    """The params a Flax form of a model holds: a bound module's, the "params" collection of a variables dict
    (`nn.LogicallyPartitioned` boxes removed; with a "vocab" collection, a draft's `DraftParams` whose
    `vocab_ids` are its "ids"), anything else as it is. A bound target whose config is not
    `model` is an `InputError` naming both (the programs are built from `model`)."""
    if isinstance(x, nn.Module):
        if x.scope is None:
            raise InputError(f"{type(x).__name__}: an unbound module has no weights; pass module.bind(variables)")
        if model is not None and getattr(x, "config", model) != model:
            raise InputError(
                f"target: the module's config ({x.config.name}, {x.config.arch}) is not SpecConfig.model "
                f"({model.name}, {model.arch})"
            )
        x = x.variables
    if isinstance(x, Mapping) and "params" in x and all(isinstance(v, Mapping) for v in x.values()):
        params = nn.meta.unbox(x["params"])
        if VOCAB in x:  # a draft's pruned vocabulary: a collection of its own, never trained
            return DraftParams(params, x[VOCAB]["ids"])
        return params
    return x


def _check_shapes(prompt_ids, prompt_lengths, config: SpecConfig):
    """Trace-time checks: what jit knows (shapes, dtypes) is checked whatever the caller's transforms."""
    if not isinstance(config, SpecConfig):
        raise ConfigError(f"config: expected an lsjax.SpecConfig, got {type(config).__name__}")
    if not hasattr(prompt_ids, "shape") or not hasattr(prompt_ids, "dtype"):
        prompt_ids = jnp.asarray(prompt_ids)
    if prompt_ids.ndim != 2:
        raise InputError(f"prompt_ids: expected shape [batch, width], got {tuple(prompt_ids.shape)}")
    if not jnp.issubdtype(prompt_ids.dtype, jnp.integer):
        raise InputError(f"prompt_ids: expected integer token ids, got dtype {prompt_ids.dtype}")
    if prompt_lengths is not None:
        if not hasattr(prompt_lengths, "shape"):
            prompt_lengths = jnp.asarray(prompt_lengths)
        B = prompt_ids.shape[0]
        if tuple(prompt_lengths.shape) != (B,):
            raise InputError(
                f"prompt_lengths: expected shape ({B},) (one per prompt row), got {tuple(prompt_lengths.shape)}"
            )
        if not jnp.issubdtype(prompt_lengths.dtype, jnp.integer):
            raise InputError(f"prompt_lengths: expected integers, got dtype {prompt_lengths.dtype}")
    return prompt_ids, prompt_lengths


def _check_max_new(max_new, B: int, config: SpecConfig):
    """Trace-time checks of `max_new_tokens` (and its values where concrete): [B] or [] integers in
    [1, config.gen.max_new_tokens]."""
    if max_new is None:
        return None
    if not hasattr(max_new, "shape"):
        max_new = jnp.asarray(max_new)
    if tuple(max_new.shape) not in ((), (B,)):
        raise InputError(f"max_new_tokens: expected shape () or ({B},), got {tuple(max_new.shape)}")
    if not jnp.issubdtype(max_new.dtype, jnp.integer):
        raise InputError(f"max_new_tokens: expected integers, got dtype {max_new.dtype}")
    width = config.gen.max_new_tokens
    if not isinstance(max_new, jax.core.Tracer):
        values = np.asarray(max_new).reshape(-1)
        if values.size and not (values.min() >= 1 and values.max() <= width):
            raise InputError(
                f"max_new_tokens: {values.tolist()} must lie in [1, {width}] (config.gen.max_new_tokens, the "
                "output's width: compile a wider one for more)"
            )
    return max_new


def pad_prompts(prompts, chunk: int | None = None, pad_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(prompt_ids [B, W] int32, prompt_lengths [B] int32) for `generate`: the prompts (lists of ids) right-padded
    to the width `decode.py` uses for the longest, the next of 256, 512, 1024, ... (`engine.loop.PROMPT_BUCKETS`,
    a multiple of `chunk`, default `SpecConfig.chunk`'s), so a jitted `generate` compiles once per width and
    every prompt up to it reuses the program."""
    from lsjax.engine.loop import prompt_bucket
    from lsjax.engine.types import PREFILL_CHUNK

    rows = [list(map(int, p)) for p in prompts]
    if not rows or any(not r for r in rows):
        raise InputError("prompts: expected one or more non-empty lists of token ids")
    width = prompt_bucket(max(map(len, rows)), chunk or PREFILL_CHUNK)
    ids = np.full((len(rows), width), pad_id, np.int32)
    for b, r in enumerate(rows):
        ids[b, : len(r)] = r
    return ids, np.asarray([len(r) for r in rows], np.int32)


def _check_values(prompt_ids, lengths, config: SpecConfig, max_new=None) -> None:
    """Value checks where the arrays are concrete (not traced by the caller's jit)."""
    if isinstance(prompt_ids, jax.core.Tracer) or isinstance(lengths, jax.core.Tracer):
        return
    ids, lens = np.asarray(prompt_ids), np.asarray(lengths)
    news = np.broadcast_to(
        np.asarray(config.gen.max_new_tokens if max_new is None or isinstance(max_new, jax.core.Tracer) else max_new),
        lens.shape,
    )
    P, V = ids.shape[1], config.model.vocab_size
    for b, n in enumerate(lens.tolist()):
        if not 1 <= n <= P:
            raise InputError(f"prompt_lengths[{b}]: {n} is outside [1, {P}] (the prompt width)")
        row = ids[b, :n]
        bad = row[(row < 0) | (row >= V)]
        if bad.size:
            raise InputError(f"prompt_ids[{b}]: token id {int(bad[0])} is outside the vocabulary [0, {V})")
        if n + int(news[b]) > config.model.max_position:
            raise InputError(
                f"prompt_lengths[{b}]: {n} prompt tokens + max_new_tokens {int(news[b])} exceed the "
                f"context window of {config.model.max_position}"
            )
