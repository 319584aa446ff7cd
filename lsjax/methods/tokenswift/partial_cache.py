"""TokenSwift's dynamic partial KV cache: the draft pass attends to a fixed budget of the target's K/V.

Layout per layer, batch row and KV head (each KV head keeps its own positions, as the official code does):

    slots [0, sink)        the first `sink` positions of the context (attention sinks), never replaced
    slots [sink, budget)   the most important other positions, in decreasing importance

Importance (paper Eq. 2): the score of position p for KV head k is sum_g q_{k,g} . K_k[p] over the G query
heads of k's group, with the current token's (post-RoPE) queries at that layer: the query is partitioned
per group rather than K repeated (SnapKV's way). Selection happens inside the draft pass, layer by layer,
where those queries are at hand.

As tokens are committed their K/V (the target's own, from the full cache: verification computes them with
full attention) take free slots first, then replace the least important entries, from slot budget - 1
towards slot `sink`. Once every replaceable slot holds a token written since the last selection, the
importance is recomputed over the whole context at the next draft pass and the cache rebuilt. Attention is
permutation invariant and RoPE already sits in the keys, so slot order never matters to the draft.

Static shapes: the budget is a config value, so the draft's memory is the budget's, whatever the context.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from lsjax import attention
from lsjax.cache import KVCache
from lsjax.config import ModelConfig
from lsjax.models import target
from lsjax.models.layers import embed
from lsjax.rope import inverse_frequencies, rope_angles


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PartialCache:
    k: jax.Array  # [L, B, K, S, H] (S = budget; heads-major like KVCache)
    v: jax.Array  # [L, B, K, S, H]
    pos: jax.Array  # [L, B, K, S] int32: the context position each slot holds (-1 = empty)
    length: jax.Array  # [B] int32: slots [0, length) are filled
    replaced: jax.Array  # [B] int32: tokens written over selected entries since the last selection
    rebuild: jax.Array  # [B] bool: select again at the next draft pass

    @property
    def budget(self) -> int:
        return self.k.shape[3]

    @classmethod
    def empty(cls, config: ModelConfig, batch_size: int, budget: int) -> PartialCache:
        """An empty cache due for a selection (the first draft pass selects from the prompt)."""
        L, K, H = config.num_layers, config.num_kv_heads, config.head_dim
        kv = jnp.zeros((L, batch_size, K, budget, H), jnp.dtype(config.dtype))
        return cls(
            kv,
            kv,
            jnp.full((L, batch_size, K, budget), -1, jnp.int32),
            jnp.zeros((batch_size,), jnp.int32),
            jnp.zeros((batch_size,), jnp.int32),
            jnp.ones((batch_size,), bool),
        )

    def nbytes(self) -> int:
        return sum(x.nbytes for x in (self.k, self.v, self.pos, self.length, self.replaced, self.rebuild))


def importance(q: jax.Array, k: jax.Array) -> jax.Array:
    """Eq. 2: q [B, N, H] (one token's queries), k [B, K, S, H] -> scores [B, K, S] = sum over each KV
    head's group of its queries' dot products with that head's keys."""
    B, N, H = q.shape
    K = k.shape[1]
    qg = q.reshape(B, K, N // K, H).astype(jnp.float32)
    return jnp.einsum("bkgh,bksh->bks", qg, k.astype(jnp.float32))


def select(scores: jax.Array, n: jax.Array, budget: int, sink: int) -> tuple[jax.Array, jax.Array]:
    """scores [B, K, S] over context positions, n [B] committed -> (positions [B, K, budget], -1 for empty
    slots; filled slots [B] = min(n, budget), always a prefix). The first `sink` positions, then the other
    positions below n by decreasing score."""
    B, K, S = scores.shape
    p = jnp.arange(S)
    first = jnp.broadcast_to(jnp.arange(sink, dtype=jnp.int32), (B, K, sink))
    first = jnp.where(first < n[:, None, None], first, -1)
    ok = (p[None] >= sink) & (p[None] < n[:, None])  # [B, S]
    masked = jnp.where(ok[:, None, :], scores, -jnp.inf)
    top, idx = jax.lax.top_k(masked, budget - sink)  # invalid (-inf) positions sort last
    rest = jnp.where(jnp.isfinite(top), idx, -1).astype(jnp.int32)
    return jnp.concatenate([first, rest], axis=-1), jnp.minimum(n, budget).astype(jnp.int32)


def gather_positions(cache_k: jax.Array, layer: int, positions: jax.Array) -> jax.Array:
    """The full cache's layer `layer` [L, B, K, S, H] at positions [B, K, P] -> [B, K, P, H] (zeros at -1)."""
    got = jnp.take_along_axis(cache_k[layer], jnp.maximum(positions, 0)[..., None], axis=2)
    return jnp.where((positions >= 0)[..., None], got, 0).astype(cache_k.dtype)


def rebuild_layer(pc: PartialCache, layer: int, q: jax.Array, cache: KVCache, sink: int):
    """Selection for one layer from that layer's queries q [B, N, H]; rows without `pc.rebuild` keep theirs.
    Returns the layer's (k, v [B, K, S, H], pos [B, K, S])."""
    pos, _ = select(importance(q, cache.k[layer]), cache.lengths, pc.budget, sink)
    k, v = gather_positions(cache.k, layer, pos), gather_positions(cache.v, layer, pos)
    keep = ~pc.rebuild
    return (
        jnp.where(keep[:, None, None, None], pc.k[layer], k),
        jnp.where(keep[:, None, None, None], pc.v[layer], v),
        jnp.where(keep[:, None, None], pc.pos[layer], pos),
    )


def after_rebuild(pc: PartialCache, k, v, pos, n: jax.Array) -> PartialCache:
    """The cache with every layer's selection (k, v [L, B, K, S, H], pos [L, B, K, S]) and the counters reset
    for the rows that were due."""
    due = pc.rebuild
    return PartialCache(
        k,
        v,
        pos,
        jnp.where(due, jnp.minimum(n, pc.budget), pc.length).astype(jnp.int32),
        jnp.where(due, 0, pc.replaced),
        jnp.zeros_like(due),
    )


def write_committed(pc: PartialCache, cache: KVCache, start: jax.Array, count: jax.Array, A: int, sink: int):
    """Puts the K/V of the newly committed positions [start, start + count) (count <= A, static A; the full
    `cache` already holds them) into free slots, then over the least important entries, last slot first.
    When the replaceable slots run out the rows are marked for a rebuild (their extra tokens are not
    written: the rebuild selects from the whole context anyway)."""
    S = pc.budget
    i = jnp.arange(A)[None]  # [1, A]
    free = (S - pc.length)[:, None]
    r = pc.replaced[:, None] + (i - free)  # replacement rank of token i (when it does not fit a free slot)
    slot = jnp.where(i < free, pc.length[:, None] + i, S - 1 - r)
    ok = (i < count[:, None]) & ((i < free) | (r < S - sink))
    slot = jnp.where(ok, slot, S)  # S: dropped
    positions = start[:, None] + i  # [B, A]
    B = start.shape[0]
    L, K = pc.k.shape[0], pc.k.shape[2]
    pidx = jnp.broadcast_to(jnp.clip(positions, 0, cache.capacity - 1)[:, None, :], (B, K, A))
    new_k = jnp.take_along_axis(cache.k, pidx[None, ..., None], axis=3)  # [L, B, K, A, H]
    new_v = jnp.take_along_axis(cache.v, pidx[None, ..., None], axis=3)
    b = jnp.arange(B)[:, None, None]
    kk = jnp.arange(K)[None, :, None]
    s = jnp.broadcast_to(slot[:, None, :], (B, K, A))
    k = pc.k.at[:, b, kk, s].set(new_k, mode="drop")
    v = pc.v.at[:, b, kk, s].set(new_v, mode="drop")
    pos = pc.pos.at[:, b, kk, s].set(jnp.broadcast_to(positions[:, None, :], (L, B, K, A)), mode="drop")
    length = jnp.minimum(pc.length + count, S).astype(jnp.int32)
    replaced = pc.replaced + jnp.maximum(count - (S - pc.length), 0)
    return PartialCache(k, v, pos, length, replaced.astype(jnp.int32), pc.rebuild | (replaced >= S - sink))


# ----------------------------------------------------------------------------------- the draft pass


def partial_forward(
    params: dict,
    config: ModelConfig,
    pc: PartialCache,
    cache: KVCache,
    tokens: jax.Array,
    positions: jax.Array,
    sink: int,
    *,
    backend: str = "auto",
) -> tuple[jax.Array, PartialCache]:
    """The target's layers on tokens [B, T] at positions [B, T] (a causal chain after the context) over the
    partial cache instead of the full one. Rows due for a rebuild select their entries first, layer by layer,
    with the first token's queries. Returns (hidden [B, T, D] before the final norm, the partial cache).

    Two programs behind one `lax.cond`: the common one reads the partial cache in place (whole array plus a
    layer index, as the verify forward reads the full cache); the rebuilding one assembles the new selection
    layer by layer, which copies the partial cache once.
    """
    params = target.prepare_for_decode(params, config)  # a no-op for params already in the decode layout
    cos, sin = rope_angles(positions, inverse_frequencies(config))
    x0 = embed(params, tokens).astype(jnp.dtype(config.dtype))

    def attend(q, k, v, cache_k, cache_v, lengths, layer):
        return attention.hybrid_tree_attention(
            q, cache_k, cache_v, lengths, k, v, causal=True, layer=layer, backend=backend
        )

    def plain(_):
        x = x0
        for i, layer in enumerate(params["layers"]):
            x, _, _ = target._prepared_layer(
                layer, config, x, cos, sin, lambda q, k, v, i=i: attend(q, k, v, pc.k, pc.v, pc.length, i)
            )
        return x, pc

    def rebuilding(_):
        x = x0
        lengths = jnp.where(pc.rebuild, jnp.minimum(cache.lengths, pc.budget), pc.length)
        ks, vs, ps = [], [], []

        def attend_rebuilt(q, k, v, i):
            lk, lv, lp = rebuild_layer(pc, i, q[:, 0], cache, sink)
            ks.append(lk)
            vs.append(lv)
            ps.append(lp)
            return attend(q, k, v, lk, lv, lengths, None)

        for i, layer in enumerate(params["layers"]):
            x, _, _ = target._prepared_layer(
                layer, config, x, cos, sin, lambda q, k, v, i=i: attend_rebuilt(q, k, v, i)
            )
        return x, after_rebuild(pc, jnp.stack(ks), jnp.stack(vs), jnp.stack(ps), cache.lengths)

    return jax.lax.cond(jnp.any(pc.rebuild), rebuilding, plain, None)
