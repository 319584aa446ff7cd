"""Prefill, decode state and the on-device generation loop (AR).

Everything here is a pure function of explicit state and runs under `jax.jit`:

* `prefill` walks the prompt in fixed-size chunks inside a `lax.while_loop`
  whose trip count is an array, so a prompt buffer of P tokens compiles once
  whatever the real prompt lengths are (P comes from a small set of buckets).
* `DecodeState` carries the cache, the pending root token (emitted, not yet in
  the cache), the output buffer and counters; it is donated step to step.
* `decode_loop` runs a step function under `lax.while_loop` until every row is
  done or a step limit (an array: streaming callers raise it without
  recompiling) is reached. The step is `lsjax.engine.step.spec_step`; AR
  decoding is that step with a drafter that proposes nothing.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from lsjax import mesh as mesh_lib
from lsjax.cache import KVCache, commit
from lsjax.config import GenerateConfig, ModelConfig
from lsjax.engine.step import context, emit, group_loop, spec_step, stop_ids
from lsjax.engine.types import PREFILL_CHUNK, ARDrafter, DecodeState, Drafter, SpecConfig
from lsjax.errors import InputError, LsjaxError
from lsjax.models import target
from lsjax.sampling import sample

PROMPT_BUCKETS = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)


def prompt_bucket(length: int, chunk: int = PREFILL_CHUNK) -> int:
    """Smallest bucket >= length (a multiple of chunk), so prompt shapes compile a bounded number of times."""
    for b in PROMPT_BUCKETS:
        if b >= length and b % chunk == 0:
            return b
    return -(-length // chunk) * chunk


NEW_TOKENS_MIN = 256  # the smallest output width a host-driven run compiles for


def new_tokens_bucket(max_new_tokens: int, max_position: int) -> int:
    """The output width (`GenerateConfig.max_new_tokens`, static) a run of `max_new_tokens` new tokens compiles
    for: the next power of 2 >= max(it, 256), below the context window. The run's own count is data (`start`'s
    `max_new`), so every length up to the width shares one program, and the cache (prompt bucket + width) takes
    few sizes: 256, 512, 1024, ..."""
    width = max(NEW_TOKENS_MIN, 1 << (max(max_new_tokens, 1) - 1).bit_length())
    return max(max_new_tokens, min(width, max_position - 1))


def cache_capacity(prompt_bucket_len: int, max_new_tokens: int, slack: int = PREFILL_CHUNK) -> int:
    """Static cache size: prompt bucket + generation + room for one chunk/tree written past the length."""
    need = prompt_bucket_len + max_new_tokens + slack
    return -(-need // 256) * 256


def prefill(
    params: dict,
    config: ModelConfig,
    tokens: jax.Array,
    lengths: jax.Array,
    cache: KVCache,
    *,
    chunk: int = PREFILL_CHUNK,
    backend: str = "auto",
    hook=None,
    scan_layers: bool | None = None,
):
    """Commits prompts tokens [B, P] (row b holds lengths[b] real tokens, P % chunk == 0) into an empty cache.

    Returns (logits of each row's last prompt token [B, V], cache). Only the
    chunks that hold real tokens are computed, and only one row of logits per
    sequence goes through the LM head. With a drafter's `hook` (`PrefillHook`) each chunk's forward also yields
    the streams it asks for and its step runs on them: then (logits, cache, the hook's last carry).
    `scan_layers` (default: on a CPU) runs the layers under `lax.scan` (`target.stack_layers`: a program
    that compiles ~4x faster for the same prefill, at the price of a copy of the projections while it runs,
    which an accelerator's memory is kept from paying for).
    """
    B, P = tokens.shape
    if scan_layers is None:
        scan_layers = jax.default_backend() == "cpu"
    if scan_layers:
        params = target.stack_layers(params, B * chunk)
    if P % chunk:
        raise ValueError(f"prompt buffer length {P} must be a multiple of the prefill chunk {chunk}")
    lengths = lengths.astype(jnp.int32)
    num_chunks = (jnp.max(lengths) + chunk - 1) // chunk

    def body(carry):
        i, cache, last_hidden, drafted = carry
        start = i * chunk
        toks = jax.lax.dynamic_slice_in_dim(tokens, start, chunk, axis=1)  # [B, C]
        pos = start + jnp.broadcast_to(jnp.arange(chunk, dtype=jnp.int32), (B, chunk))
        num_valid = jnp.clip(lengths - start, 0, chunk)
        # Bound inside the loop's body: a Flax scope belongs to the trace it was made in.
        net = target.Transformer(config).bind({"params": params})
        if hook is None:
            hidden, new_k, new_v = net.hidden(toks, pos, cache, backend=backend)
        else:
            hidden, new_k, new_v, streams = net.streams(toks, pos, cache, hook.layers, backend=backend)
            drafted = hook.step(drafted, streams.astype(jnp.dtype(config.dtype)), start, tokens, lengths)
        cache = commit(cache, new_k, new_v, num_valid)
        last = jnp.take_along_axis(hidden, jnp.clip(num_valid - 1, 0, chunk - 1)[:, None, None], axis=1)[:, 0]
        ends_here = (lengths > start) & (lengths <= start + chunk)
        last_hidden = jnp.where(ends_here[:, None], last, last_hidden)
        return i + 1, cache, last_hidden, drafted

    D = config.hidden_size
    drafted = () if hook is None else hook.init(B)
    init = (jnp.int32(0), cache, jnp.zeros((B, D), jnp.float32), drafted)  # the fp32 residual stream
    _, cache, last_hidden, drafted = jax.lax.while_loop(lambda c: c[0] < num_chunks, body, init)
    logits = target.Transformer(config).apply({"params": params}, last_hidden, method="logits")
    return (logits, cache) if hook is None else (logits, cache, drafted)


def init_state(
    config: ModelConfig,
    gen: GenerateConfig,
    cache: KVCache,
    last_logits: jax.Array,
    key: jax.Array,
    out_len: int,
    max_new: jax.Array | None = None,
) -> DecodeState:
    """Samples the first token from the prefill logits and emits it. `max_new` ([B] or [] int): the new tokens
    each row may emit, capped at `out_len` (default `out_len`)."""
    B = last_logits.shape[0]
    limit = jnp.full((B,), out_len, jnp.int32)
    if max_new is not None:
        limit = jnp.clip(jnp.broadcast_to(jnp.asarray(max_new, jnp.int32), (B,)), 1, out_len)
    key, sub = jax.random.split(key)
    # The first generated token has no generated tokens before it: an empty penalty window.
    first = sample(sub, last_logits, gen.sampling, jnp.zeros(last_logits.shape, bool))
    out = jnp.zeros((B, out_len), jnp.int32)
    out, num_out, done, _ = emit(
        out,
        jnp.zeros((B,), jnp.int32),
        jnp.zeros((B,), bool),
        first[:, None],
        jnp.ones((B,), jnp.int32),
        limit,
        stop_ids(config, gen),
    )
    return DecodeState(
        cache=cache,
        root=first,
        out=out,
        num_out=num_out,
        done=done,
        key=key,
        # Separate zeros: one traced value returned thrice would come back as one buffer, donated thrice.
        steps=jnp.zeros((), jnp.int32),
        accepted=jnp.zeros((), jnp.int32),
        active_steps=jnp.zeros((), jnp.int32),
        limit=limit,
    )


def decode_loop(step_fn, state: DecodeState, step_limit: jax.Array) -> DecodeState:
    """Runs `step_fn(state) -> state` until every row is done or `state.steps >= step_limit`."""
    return jax.lax.while_loop(lambda s: (~jnp.all(s.done)) & (s.steps < step_limit), step_fn, state)


@functools.partial(jax.jit, static_argnames=("config", "capacity", "chunk", "backend"))
def prefill_jit(params, config: ModelConfig, tokens, lengths, capacity: int, chunk=PREFILL_CHUNK, backend="auto"):
    cache = KVCache.zeros(config, tokens.shape[0], capacity)
    return prefill(params, config, tokens, lengths, cache, chunk=chunk, backend=backend)


class CapacityError(LsjaxError, ValueError):
    """The KV cache cannot hold the prompt, the generation and one step's writes."""


# ---------------------------------------------------------------------------------------- entry points
# Each takes (target_params, draft_params, spec, ...arrays) with `spec` a SpecConfig. The parameters keep the
# names and places of the loose form that came before SpecConfig (a ModelConfig in `config`, then the drafter
# and the GenerateConfig, capacity/chunk/backend as keywords), so code written against it, `jax.jit` static
# names included, runs as it did; both forms build the same SpecConfig (tests/test_engine_spec.py).


def _spec(config, slots: dict, arrays: tuple[str, ...], where: str, **static):
    """(SpecConfig, the values of `arrays`) from an entry point's parameters.

    `slots`: the parameters after `config`, in order. With a SpecConfig in `config`, the arrays come in order
    from the leading filled slots (positional arguments land there), then from their own slots (keywords).
    Otherwise `config` is a ModelConfig and every slot is what it is named."""
    if not isinstance(config, SpecConfig):
        spec = SpecConfig(config, slots["gen"], slots["drafter"], **static)
        return spec, tuple(slots[n] for n in arrays)
    given = [k for k, v in static.items() if v is not None and k != "chunk" and (k != "backend" or v != "auto")]
    if given:
        raise TypeError(f"{where}: {', '.join(given)} belong in the SpecConfig, not beside it")
    values = list(slots.values())
    lead = 0
    while lead < len(values) and values[lead] is not None:
        lead += 1
    out = dict(zip(arrays, values[:lead]))
    if len(out) < lead:
        raise TypeError(f"{where}: too many arguments after the SpecConfig (takes {', '.join(arrays)})")
    for n in arrays[len(out) :]:
        if slots.get(n) is None:
            raise TypeError(f"{where}: missing {n!r} after the SpecConfig (takes {', '.join(arrays)})")
        out[n] = slots[n]
    return config, tuple(out[n] for n in arrays)


def _decode(target_params, draft_params, spec: SpecConfig, state, step_limit):
    with mesh_lib.scope(spec.mesh):
        ctx = context(target_params, draft_params, spec.model, spec.gen, state.cache.capacity, spec.backend)
        return decode_loop(functools.partial(spec_step, ctx, spec.drafter, spec.gen), state, step_limit)


decode_jit = jax.jit(_decode, static_argnames=("spec",), donate_argnames=("state",))
decode_jit.__doc__ = """`decode` compiled: spec static, the state donated."""


def decode_pinned(state_shardings):
    """`decode_jit` whose returned state keeps `state_shardings` (the state's pytree of shardings). On a mesh
    the host lowers the decode loop for the state `start` returns, with its shardings (not shapes alone, which
    leave XLA free to pick another layout for the draft's own cache than the one `start` gives it), and pins
    the output to the same, so the state goes from call to call (streaming, auto's profile) unchanged."""
    return jax.jit(_decode, static_argnames=("spec",), donate_argnames=("state",), out_shardings=state_shardings)


@functools.partial(jax.jit, static_argnames=("spec", "group"), donate_argnames=("state",))
def group_decode_jit(target_params, draft_params, spec: SpecConfig, state, nxt, fresh, step_limit, group: int):
    """One node-count group's share of a switched drafter's decode loop (`step.group_loop`): a program as small
    as one method's, so the host loads the groups one by one and switches between them
    (`lsjax.runtime.split.SplitDecode`).
    Returns (state, [nxt, fresh, every row done, steps, wanted, tokens left] int32, rates [V] float32): what the
    host needs. `wanted`: the variant the drafter would choose now with every group loaded (-1 for a drafter
    whose choice cannot be restricted), so that the host loads the group the drafter asks for next; `tokens
    left`: the most any live row may still emit; `rates`: `Drafter.choice_rates` with every group loaded (ones
    where the drafter has none), so that the host can price a load against what it would save."""
    drafter = spec.drafter
    V = len(drafter.step_variants())
    with mesh_lib.scope(spec.mesh):
        ctx = context(target_params, draft_params, spec.model, spec.gen, state.cache.capacity, spec.backend)
        state, nxt, fresh = group_loop(ctx, drafter, spec.gen, state, nxt, fresh, step_limit, group)
        every = drafter.ready_params(draft_params, np.ones(V, bool))
        rates = None
        if every is None:
            wanted = jnp.int32(-1)
        else:
            unrestricted = context(target_params, every, spec.model, spec.gen, state.cache.capacity, spec.backend)
            wanted = drafter.choose(unrestricted, state).astype(jnp.int32)
            rates = drafter.choice_rates(unrestricted, state)
        rates = jnp.ones((V,), jnp.float32) if rates is None else jnp.asarray(rates, jnp.float32)
        left = jnp.max(jnp.where(state.done, 0, state.limit - state.num_out)).astype(jnp.int32)
        done = jnp.all(state.done).astype(jnp.int32)
        info = jnp.stack([nxt, fresh.astype(jnp.int32), done, state.steps, wanted, left])
        return state, info, rates


def decode(target_params, draft_params, config, drafter=None, gen=None, state=None, step_limit=None, backend="auto"):
    """decode(target_params, draft_params, spec, state, step_limit): speculative (or AR) steps until every row
    is done or `state.steps >= step_limit` (an array, so raising it never recompiles); jitted with the state
    donated (`decode_jit`). Loose form: decode(..., config, drafter, gen, state, step_limit, backend)."""
    slots = dict(drafter=drafter, gen=gen, state=state, step_limit=step_limit)
    spec, (state, step_limit) = _spec(config, slots, ("state", "step_limit"), "decode", backend=backend)
    return decode_jit(target_params, draft_params, spec, state, step_limit)


decode._cache_size = decode_jit._cache_size  # its compiled programs: a test counts them (no recompile per step)


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


def check_inputs(target_params, draft_params, key, spec: SpecConfig) -> None:
    """Raises `InputError` naming what would otherwise fail deep inside the step (a missing tensor as a
    KeyError, a wrong shape as an einsum error, `()` for a draft as an AttributeError): target params against
    the model config, draft params against the drafter, the key. Shapes and types only, so free under jit;
    `start`, `begin` and `lsjax.generate` call it."""
    if problem := target.check_params(target_params, spec.model):
        raise InputError(f"target_params: {problem}")
    if problem := spec.drafter.check_params(draft_params, spec.model):
        raise InputError(f"draft_params: {problem}")
    if not (hasattr(key, "shape") and hasattr(key, "dtype")):
        raise InputError(f"key: expected a PRNG key (jax.random.key(seed)), got {type(key).__name__}")
    if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        if key.shape != ():
            raise InputError(f"key: expected one PRNG key (shape ()), got a batch of shape {tuple(key.shape)}")
    elif key.dtype != jnp.uint32 or key.ndim != 1:
        raise InputError(
            f"key: expected a PRNG key (jax.random.key(seed)), got a {key.dtype} array of shape {tuple(key.shape)}"
        )


def start(
    target_params,
    draft_params,
    config,
    drafter=None,
    gen=None,
    tokens=None,
    lengths=None,
    key=None,
    *,
    capacity=None,
    chunk=PREFILL_CHUNK,
    backend="auto",
    max_new=None,
) -> DecodeState:
    """start(target_params, draft_params, spec, tokens, lengths, key): prefill prompts tokens [B, P] (lengths
    [B]), emit the first token, initialise the drafter. Capacity: `spec.capacity`, else what the prompt
    buffer, the generation and one step need (`required_capacity`). `max_new` ([B] or [] int array, default
    `spec.gen.max_new_tokens`): new tokens per row, at most `spec.gen.max_new_tokens`, as data: one compiled
    program serves every length up to it. Loose form: start(..., config, drafter, gen, tokens, lengths, key,
    capacity=, chunk=, backend=)."""
    slots = dict(drafter=drafter, gen=gen, tokens=tokens, lengths=lengths, key=key)
    static = dict(capacity=capacity, chunk=chunk, backend=backend)
    spec, (tokens, lengths, key) = _spec(config, slots, ("tokens", "lengths", "key"), "start", **static)
    check_inputs(target_params, draft_params, key, spec)
    capacity = spec.capacity or required_capacity(tokens.shape[1], spec.gen, spec.drafter)
    check_capacity(capacity, tokens.shape[1], spec.gen, spec.drafter)
    if spec.mesh is not None:
        mesh_lib.check(spec.model, spec.mesh, tokens.shape[0])
    with mesh_lib.scope(spec.mesh):
        cache = mesh_lib.constrain_cache(KVCache.zeros(spec.model, tokens.shape[0], capacity))
        ctx = context(target_params, draft_params, spec.model, spec.gen, capacity, spec.backend)
        hook = spec.drafter.prefill_hook(ctx)
        out = prefill(
            target_params, spec.model, tokens, lengths, cache, chunk=spec.chunk, backend=spec.backend, hook=hook
        )
        logits, cache, prefilled = out if hook is not None else (*out, None)
        return begin(
            target_params, draft_params, spec, tokens, lengths, key, cache, logits, max_new=max_new, prefilled=prefilled
        )


def begin(
    target_params,
    draft_params,
    config,
    drafter=None,
    gen=None,
    tokens=None,
    lengths=None,
    key=None,
    cache=None,
    logits=None,
    *,
    backend="auto",
    max_new=None,
    prefilled=None,
) -> DecodeState:
    """begin(target_params, draft_params, spec, tokens, lengths, key, cache, logits): `start` after its
    prefill: emit the first token from the prompts' last logits [B, V] and initialise the drafter. A bench
    running several methods on one prompt prefills once and begins each from a copy. `max_new`: as `start`;
    `prefilled`: what the drafter's `prefill_hook` left, when the prefill ran it (`start`)."""
    slots = dict(drafter=drafter, gen=gen, tokens=tokens, lengths=lengths, key=key, cache=cache, logits=logits)
    names = ("tokens", "lengths", "key", "cache", "logits")
    spec, (tokens, lengths, key, cache, logits) = _spec(config, slots, names, "begin", backend=backend)
    check_inputs(target_params, draft_params, key, spec)
    gen = spec.gen
    with mesh_lib.scope(spec.mesh):
        state = init_state(spec.model, gen, cache, logits, key, gen.max_new_tokens, max_new)
        ctx = dataclasses.replace(
            context(target_params, draft_params, spec.model, gen, cache.capacity, spec.backend),
            prompt_tokens=tokens,
            prompt_lengths=lengths,
            prefilled=prefilled,
        )
        return dataclasses.replace(state, draft=spec.drafter.init(ctx, state))


def required_capacity(prompt_len: int, gen: GenerateConfig, drafter: Drafter) -> int:
    """Cache slots for the prompt, the generation, and one step's writes past the length."""
    return cache_capacity(prompt_len, gen.max_new_tokens, slack=max(PREFILL_CHUNK, drafter.max_depth + 1))


def run(
    target_params,
    draft_params,
    config,
    tokens=None,
    lengths=None,
    gen=None,
    key=None,
    drafter=ARDrafter(),
    *,
    capacity=None,
    chunk=PREFILL_CHUNK,
    backend="auto",
    max_new=None,
) -> DecodeState:
    """run(target_params, draft_params, spec, tokens, lengths, key): prompts [B, P] -> final DecodeState
    (`out[:, :num_out]` are the new tokens). Jittable end to end with spec static; `max_new` as `start`.
    Loose form: run(..., config, tokens, lengths, gen, key, drafter, capacity=, chunk=, backend=)."""
    if isinstance(config, SpecConfig):
        if drafter != ARDrafter():
            raise TypeError("run: the drafter belongs in the SpecConfig, not beside it")
        slots = dict(tokens=tokens, lengths=lengths, gen=gen, key=key)
        spec, (tokens, lengths, key) = _spec(config, slots, ("tokens", "lengths", "key"), "run", capacity=capacity)
    else:
        spec = SpecConfig(config, gen, drafter, capacity=capacity, chunk=chunk, backend=backend)
    capacity = spec.capacity or required_capacity(tokens.shape[1], spec.gen, spec.drafter)
    spec = dataclasses.replace(spec, capacity=capacity)
    state = start(target_params, draft_params, spec, tokens, lengths, key, max_new=max_new)
    with mesh_lib.scope(spec.mesh):
        ctx = context(target_params, draft_params, spec.model, spec.gen, capacity, spec.backend)
        step = functools.partial(spec_step, ctx, spec.drafter, spec.gen)
        return decode_loop(step, state, jnp.int32(spec.gen.max_new_tokens))
