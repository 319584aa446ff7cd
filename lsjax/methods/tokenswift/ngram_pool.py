"""TokenSwift's token reutilization: an on-device pool of the n-grams seen so far, with their frequencies.

Static shapes throughout: per row, the distinct n-grams live in slots [0, size) of a [C, n] array in the
order they first appeared, with their counts beside them. Building from a prompt sorts (one pass); adding
an n-gram scans the C slots (a hit counts up, a miss takes the next free slot; once all C are taken, new
n-grams are dropped and known ones still count). `pool_topk(pool, first, k)` returns the k most frequent
n-grams starting with token `first`, ties broken by first appearance (the earlier one first).

`NgramHistory` feeds the pool from a token history with a lag: an n-gram enters only once it ends at least
`lag` tokens before the end of the history (TokenSwift's official code lags by the penalty window, whose
tokens the contextual penalty makes unlikely to be accepted again soon).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class NgramPool:
    grams: jax.Array  # [B, C, n] int32: distinct n-grams, in order of first appearance
    counts: jax.Array  # [B, C] int32: occurrences (0 for free slots)
    size: jax.Array  # [B] int32: slots in use

    @property
    def capacity(self) -> int:
        return self.grams.shape[1]

    @property
    def n(self) -> int:
        return self.grams.shape[2]


def _windows(tokens: jax.Array, n: int) -> jax.Array:
    """tokens [P] -> [P, n]: the n-gram starting at each position (clipped at the end; callers mask)."""
    P = tokens.shape[0]
    idx = jnp.arange(P)[:, None] + jnp.arange(n)[None]
    return tokens[jnp.clip(idx, 0, P - 1)]


def _build_row(tokens: jax.Array, count: jax.Array, n: int, capacity: int):
    """The pool of the n-grams starting at positions [0, count) of tokens [P] (count may be <= 0)."""
    P = tokens.shape[0]
    idx = jnp.arange(P, dtype=jnp.int32)
    grams = _windows(tokens, n)
    invalid = (idx >= count).astype(jnp.int32)
    out = jax.lax.sort((invalid, *(grams[:, j] for j in range(n)), idx), num_keys=n + 2)
    s_inv, s_grams, s_idx = out[0], jnp.stack(out[1 : n + 1], axis=-1), out[-1]
    differs = jnp.any(s_grams[1:] != s_grams[:-1], axis=-1) | (s_inv[1:] != s_inv[:-1])
    gid = jnp.cumsum(jnp.concatenate([jnp.zeros((1,), bool), differs])).astype(jnp.int32)  # group of each
    valid = s_inv == 0
    counts = jax.ops.segment_sum(valid.astype(jnp.int32), gid, num_segments=P)
    first = jax.ops.segment_min(jnp.where(valid, s_idx, P), gid, num_segments=P)  # P for empty / invalid groups
    rep = jnp.zeros((P, n), jnp.int32).at[gid].set(s_grams)  # every member of a group is the same n-gram
    order = jnp.argsort(jnp.where(counts > 0, first, P + jnp.arange(P)))  # by first appearance, empties last
    keep = order[: min(capacity, P)]
    g, c = rep[keep], jnp.where(counts[keep] > 0, counts[keep], 0)
    if capacity > P:
        g = jnp.concatenate([g, jnp.zeros((capacity - P, n), jnp.int32)])
        c = jnp.concatenate([c, jnp.zeros((capacity - P,), jnp.int32)])
    size = jnp.minimum(jnp.sum(counts > 0), capacity).astype(jnp.int32)
    return g, c, size


def pool_from_tokens(tokens: jax.Array, count: jax.Array, n: int, capacity: int) -> NgramPool:
    """tokens [B, P]; the n-grams starting at positions [0, count[b]) of each row (their tokens must lie
    inside the row's valid part: the caller sets count <= length - n + 1)."""
    g, c, size = jax.vmap(lambda t, k: _build_row(t, k, n, capacity))(tokens, count)
    return NgramPool(g, c, size)


def _insert_row(grams, counts, size, gram, ok):
    C = grams.shape[0]
    eq = jnp.all(grams == gram[None], axis=-1) & (jnp.arange(C) < size)
    hit = jnp.any(eq)
    new = ok & ~hit & (size < C)
    slot = jnp.where(hit, jnp.argmax(eq), jnp.minimum(size, C - 1))
    grams = grams.at[slot].set(jnp.where(new, gram, grams[slot]))
    counts = counts.at[slot].add((ok & (hit | new)).astype(jnp.int32))
    return grams, counts, size + new.astype(jnp.int32)


def pool_insert(pool: NgramPool, grams: jax.Array, ok: jax.Array) -> NgramPool:
    """Adds grams [B, A, n] where ok [B, A], in order."""

    def row(g, c, s, new, mask):
        for a in range(new.shape[0]):
            g, c, s = _insert_row(g, c, s, new[a], mask[a])
        return g, c, s

    g, c, s = jax.vmap(row)(pool.grams, pool.counts, pool.size, grams, ok)
    return NgramPool(g, c, s)


def pool_topk(pool: NgramPool, first: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """The k most frequent n-grams starting with token first [B]: (grams [B, k, n], found [B, k])."""
    C = pool.capacity
    match = (pool.grams[..., 0] == first[:, None]) & (jnp.arange(C)[None] < pool.size[:, None])
    # top_k puts the lower index first among equal scores: ties go to the n-gram that appeared first.
    score, idx = jax.lax.top_k(jnp.where(match, pool.counts, 0), min(k, C))
    grams = jnp.take_along_axis(pool.grams, idx[..., None], axis=1)
    if k > C:
        B, n = first.shape[0], pool.n
        grams = jnp.concatenate([grams, jnp.zeros((B, k - C, n), jnp.int32)], axis=1)
        score = jnp.concatenate([score, jnp.zeros((B, k - C), score.dtype)], axis=1)
    return grams, score > 0


# ------------------------------------------------------------------------------------ fed from a history


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class NgramHistory:
    """The token history (prompt + generated), its n-gram pool, and how many start positions it holds."""

    tokens: jax.Array  # [B, M] int32
    length: jax.Array  # [B] int32
    pool: NgramPool
    added: jax.Array  # [B] int32: the n-grams starting at [0, added) are in the pool


def _ready(length: jax.Array, n: int, lag: int) -> jax.Array:
    """Start positions whose n-gram ends at least `lag` tokens before the end: [0, ready)."""
    return jnp.maximum(length - n - lag + 1, 0).astype(jnp.int32)


def history_init(tokens: jax.Array, length: jax.Array, n: int, lag: int, buffer: int, capacity: int):
    """tokens [B, P] (length [B] valid) -> NgramHistory with a [B, buffer] token buffer and a pool of
    `capacity` slots holding the n-grams old enough (see module doc)."""
    B, P = tokens.shape
    buf = jnp.zeros((B, buffer), jnp.int32).at[:, : min(P, buffer)].set(tokens[:, :buffer])
    ready = jnp.minimum(_ready(length, n, lag), P)
    return NgramHistory(buf, length.astype(jnp.int32), pool_from_tokens(tokens, ready, n, capacity), ready)


def history_append(hist: NgramHistory, new: jax.Array, count: jax.Array, n: int, lag: int) -> NgramHistory:
    """Appends new [B, A] (the first count[b] valid) and adds the n-grams that became old enough (at most A
    per call: the history grows by at most A)."""
    B, M = hist.tokens.shape
    A = new.shape[1]

    def write(buf, toks, at):
        return jax.lax.dynamic_update_slice(buf, toks, (at,))

    # Entries past the count land beyond the new length and are overwritten later.
    buf = jax.vmap(write)(hist.tokens, new, jnp.minimum(hist.length, M - A))
    length = jnp.minimum(hist.length + count, M)
    ready = _ready(length, n, lag)
    starts = hist.added[:, None] + jnp.arange(A)[None]  # [B, A]
    ok = starts < ready[:, None]
    idx = jnp.clip(starts[..., None] + jnp.arange(n)[None, None], 0, M - 1)  # [B, A, n]
    grams = jax.vmap(lambda b, i: b[i])(buf, idx)
    pool = pool_insert(hist.pool, grams, ok)
    return NgramHistory(buf, length, pool, jnp.maximum(hist.added, jnp.minimum(ready, hist.added + A)))
