"""Prefill, decode state and the on-device generation loop (AR).

Everything here is a pure function of explicit state and runs under `jax.jit`:

* `prefill` walks the prompt in fixed-size chunks inside a `lax.while_loop`
  whose trip count is an array, so a prompt buffer of P tokens compiles once
  whatever the real prompt lengths are (P comes from a small set of buckets).
* `DecodeState` carries the cache, the pending root token (emitted, not yet in
  the cache), the output buffer and counters; it is donated step to step.
* `decode_loop` runs a step function under `lax.while_loop` until every row is
  done or a step limit (an array: streaming callers raise it without
  recompiling) is reached. The step is `lsjax.speculative.spec_step`; AR
  decoding is that step with a drafter that proposes nothing.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

from lsjax.cache import KVCache, commit
from lsjax.config import GenerateConfig, ModelConfig
from lsjax.models import target
from lsjax.sampling import sample

PREFILL_CHUNK = 256
PROMPT_BUCKETS = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)


def prompt_bucket(length: int, chunk: int = PREFILL_CHUNK) -> int:
    """Smallest bucket >= length (a multiple of chunk), so prompt shapes compile a bounded number of times."""
    for b in PROMPT_BUCKETS:
        if b >= length and b % chunk == 0:
            return b
    return -(-length // chunk) * chunk


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
) -> tuple[jax.Array, KVCache]:
    """Commits prompts tokens [B, P] (row b holds lengths[b] real tokens, P % chunk == 0) into an empty cache.

    Returns (logits of each row's last prompt token [B, V], cache). Only the
    chunks that hold real tokens are computed, and only one row of logits per
    sequence goes through the LM head.
    """
    B, P = tokens.shape
    if P % chunk:
        raise ValueError(f"prompt buffer length {P} must be a multiple of the prefill chunk {chunk}")
    lengths = lengths.astype(jnp.int32)
    num_chunks = (jnp.max(lengths) + chunk - 1) // chunk

    def body(carry):
        i, cache, last_hidden = carry
        start = i * chunk
        toks = jax.lax.dynamic_slice_in_dim(tokens, start, chunk, axis=1)  # [B, C]
        pos = start + jnp.broadcast_to(jnp.arange(chunk, dtype=jnp.int32), (B, chunk))
        num_valid = jnp.clip(lengths - start, 0, chunk)
        hidden, new_k, new_v = target.forward_hidden(params, config, toks, pos, cache, backend=backend)
        cache = commit(cache, new_k, new_v, num_valid)
        last = jnp.take_along_axis(hidden, jnp.clip(num_valid - 1, 0, chunk - 1)[:, None, None], axis=1)[:, 0]
        ends_here = (lengths > start) & (lengths <= start + chunk)
        last_hidden = jnp.where(ends_here[:, None], last, last_hidden)
        return i + 1, cache, last_hidden

    D = config.hidden_size
    init = (jnp.int32(0), cache, jnp.zeros((B, D), jnp.dtype(config.dtype)))
    _, cache, last_hidden = jax.lax.while_loop(lambda c: c[0] < num_chunks, body, init)
    return target.lm_head(params, config, last_hidden), cache


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DecodeState:
    cache: KVCache
    root: jax.Array  # [B] last emitted token, not yet in the cache
    out: jax.Array  # [B, M] emitted tokens
    num_out: jax.Array  # [B] int32
    done: jax.Array  # [B] bool
    key: jax.Array
    steps: jax.Array  # [] int32 decode steps run (target forwards after prefill)
    accepted: jax.Array  # [] int32 tokens emitted by decode steps (for tau)
    # [] int32 row-steps of rows still generating: tau = accepted / active_steps (a finished row in a batch
    # rides along in the remaining forwards but neither commits nor counts).
    active_steps: jax.Array
    draft: Any = ()  # the drafter's state (a pytree; () for AR)

    @property
    def mean_accepted(self) -> jax.Array:
        """tau: tokens emitted per active row-step of decoding."""
        return self.accepted / jnp.maximum(self.active_steps, 1)


def stop_ids(config: ModelConfig, gen: GenerateConfig) -> tuple[int, ...]:
    return tuple(gen.stop_token_ids) + (() if gen.ignore_eos else tuple(config.eos_token_ids))


def emit(state_out, num_out, done, tokens, count, gen: GenerateConfig, stops):
    """Appends tokens [B, A] (the first count[b] valid) to the output buffer, stopping rows at a stop token.

    Returns (out, num_out, done, emitted [B]).
    """
    B, A = tokens.shape
    M = state_out.shape[1]
    idx = jnp.arange(A)[None, :]
    valid = (idx < count[:, None]) & ~done[:, None]
    is_stop = jnp.isin(tokens, jnp.asarray(stops, jnp.int32)) if stops else jnp.zeros_like(tokens, bool)
    # A row stops after its first stop token or at max_new_tokens.
    stop_before = jnp.cumsum(is_stop & valid, axis=1) - (is_stop & valid)
    valid = valid & (stop_before == 0) & (num_out[:, None] + idx < gen.max_new_tokens)
    n = jnp.sum(valid, axis=1).astype(jnp.int32)
    pos = jnp.where(valid, num_out[:, None] + idx, M)  # out-of-range writes are dropped
    out = state_out.at[jnp.arange(B)[:, None], pos].set(tokens, mode="drop")
    hit_stop = jnp.any(is_stop & valid, axis=1)
    num_out = num_out + n
    done = done | hit_stop | (num_out >= gen.max_new_tokens)
    return out, num_out, done, n


def init_state(
    config: ModelConfig, gen: GenerateConfig, cache: KVCache, last_logits: jax.Array, key: jax.Array, out_len: int
) -> DecodeState:
    """Samples the first token from the prefill logits and emits it."""
    B = last_logits.shape[0]
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
        gen,
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
    )


def decode_loop(step_fn, state: DecodeState, step_limit: jax.Array) -> DecodeState:
    """Runs `step_fn(state) -> state` until every row is done or `state.steps >= step_limit`."""
    return jax.lax.while_loop(lambda s: (~jnp.all(s.done)) & (s.steps < step_limit), step_fn, state)


@functools.partial(jax.jit, static_argnames=("config", "capacity", "chunk", "backend"))
def prefill_jit(params, config: ModelConfig, tokens, lengths, capacity: int, chunk=PREFILL_CHUNK, backend="auto"):
    cache = KVCache.zeros(config, tokens.shape[0], capacity)
    return prefill(params, config, tokens, lengths, cache, chunk=chunk, backend=backend)
