"""KV caches with static capacity; lengths live in arrays so nothing recompiles as they grow.

The target cache holds every layer: k, v [L, B, K, S, H] (heads-major; see
`lsjax.attention` for why). A forward pass never
writes it: it returns the new tokens' K/V ([L, B, T, K, H]) and the caller
commits the accepted ones with `commit`, which is what lets a speculative tree's
K/V stay out of the cache until verification accepts a path.

The draft's self-attention cache is a `RingCache` of the window size (one layer,
constant memory whatever the context), written with `ring_write`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from lsjax.config import ModelConfig


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KVCache:
    k: jax.Array  # [L, B, K, S, H]
    v: jax.Array  # [L, B, K, S, H]
    lengths: jax.Array  # [B] int32: slots [0, length) are committed

    @property
    def capacity(self) -> int:
        return self.k.shape[3]

    @property
    def batch_size(self) -> int:
        return self.k.shape[1]

    @classmethod
    def zeros(cls, config: ModelConfig, batch_size: int, capacity: int, dtype=None) -> KVCache:
        dtype = dtype or jnp.dtype(config.dtype)
        shape = (config.num_layers, batch_size, config.num_kv_heads, capacity, config.head_dim)
        return cls(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype), jnp.zeros((batch_size,), jnp.int32))

    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes


def commit(cache: KVCache, new_k: jax.Array, new_v: jax.Array, num_new: jax.Array) -> KVCache:
    """Writes new_k/new_v [L, B, T, K, H] at slots [length, length + T) and advances lengths by num_new [B].

    All T entries are written (the ones past num_new are garbage beyond the new
    length and get overwritten later); callers keep capacity >= length + T so
    dynamic_update_slice never clamps the start.
    """

    def write(buf, new, start):  # buf [L, K, S, H], new [L, T, K, H]
        return jax.lax.dynamic_update_slice(buf, new.swapaxes(1, 2).astype(buf.dtype), (0, 0, start, 0))

    k = jax.vmap(write, in_axes=(1, 1, 0), out_axes=1)(cache.k, new_k, cache.lengths)
    v = jax.vmap(write, in_axes=(1, 1, 0), out_axes=1)(cache.v, new_v, cache.lengths)
    return KVCache(k, v, cache.lengths + num_new.astype(jnp.int32))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RingCache:
    """The LongSpec draft's self-attention cache: a ring of the window size W, one layer.

    The token at absolute position p lives in slot p % W, so the buffer holds the
    last W committed positions and its size never depends on the context length
    (the official LongSpec code keeps a full-length draft cache and masks it).
    Slots [0, lengths) are filled; once W positions have been written every slot
    is. Attention over it needs no mask and no order: softmax is permutation
    invariant and RoPE already sits in the keys.
    """

    k: jax.Array  # [B, K, W, H] (heads-major, like KVCache)
    v: jax.Array  # [B, K, W, H]
    lengths: jax.Array  # [B] int32: min(committed, W)

    @property
    def window(self) -> int:
        return self.k.shape[2]

    @property
    def batch_size(self) -> int:
        return self.k.shape[0]

    @classmethod
    def zeros(cls, config: ModelConfig, batch_size: int, window: int, dtype=None) -> RingCache:
        dtype = dtype or jnp.dtype(config.dtype)
        shape = (batch_size, config.num_kv_heads, window, config.head_dim)
        return cls(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype), jnp.zeros((batch_size,), jnp.int32))

    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes + self.lengths.nbytes


def ring_write(ring: RingCache, k: jax.Array, v: jax.Array, start_pos: jax.Array, count: jax.Array) -> RingCache:
    """Writes k, v [B, T, K, H] for positions start_pos + [0, count) (per row) into their slots p % W.

    Entries past count[b] are not written. T may exceed W (a prefill): only the
    last W written positions can survive, so earlier ones are dropped rather
    than written and overwritten (a scatter with colliding indices has no
    defined winner). Positions must be written in order, without gaps.
    """
    W = ring.window
    T = k.shape[1]
    start_pos = start_pos.astype(jnp.int32)
    count = jnp.minimum(count.astype(jnp.int32), T)
    i = jnp.arange(T, dtype=jnp.int32)
    keep = (i[None, :] < count[:, None]) & (i[None, :] >= count[:, None] - W)  # [B, T]
    # Out-of-range slot W + mode="drop" skips the entries not kept.
    slots = jnp.where(keep, (start_pos[:, None] + i[None, :]) % W, W)

    def write(buf, new, slot):  # buf [K, W, H], new [T, K, H], slot [T]
        return buf.at[:, slot].set(new.swapaxes(0, 1).astype(buf.dtype), mode="drop")

    new_k = jax.vmap(write)(ring.k, k, slots)
    new_v = jax.vmap(write)(ring.v, v, slots)
    filled = jnp.where(count > 0, jnp.minimum(jnp.maximum(ring.lengths, start_pos + count), W), ring.lengths)
    return RingCache(new_k, new_v, filled.astype(jnp.int32))
