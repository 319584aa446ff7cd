"""KV caches with static capacity; lengths live in arrays so nothing recompiles as they grow.

The target cache holds every layer: k, v [L, B, K, S, H] (heads-major; see
`lsjax.attention` for why). A forward pass never
writes it: it returns the new tokens' K/V ([L, B, T, K, H]) and the caller
commits the accepted ones with `commit`, which is what lets a speculative tree's
K/V stay out of the cache until verification accepts a path.
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
