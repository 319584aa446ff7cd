"""Flash-decoding over a committed KV cache: a few new queries, a long cache, no mask.

The prefix half of LongSpec's hybrid tree attention (the tree half is `tree_attention.py`). The T new
queries (T = tree size, 1..128) attend to keys `[window_start, length)` of a heads-major cache
k, v [B, K, S, H] with capacity S (up to 128K). Keys are all in the past, so the only mask is the
per-sequence valid range, which is the same for every query: it is applied on key positions, never as a
`[T, S]` tensor.

Layout. The T queries are folded into the head-group axis: q [B, T, N, H] is viewed as [B, K, T*G, H]
(G = N // K), so one program multiplies the whole [T*G, H] query tile against a key block of one KV head
and each KV head's cache is read once per call, not once per query or per query head. With the cache
heads-major, a key block of one head is a contiguous [block_s, H] tile (no strided DMA, no transpose).

Split-K. The grid is (B, K, S / block_s). Each program walks its block_s keys in block_k steps with an
online softmax and writes a partial (out, lse); the wrapper merges the partials by log-sum-exp. Key blocks
outside `[window_start, length)` are skipped inside the program, so compute scales with the valid length.
The cache is never padded or copied: the last split may run past S and those keys are masked.

Backends. Written against the Pallas core API (`pl.pallas_call`, `pl.BlockSpec`, a grid) for Mosaic TPU
and for Pallas' Triton lowering on GPU (array-at-a-time programs; Mosaic GPU's warpgroup model would need
a rewrite). The only backend-specific pieces are the scalar bounds living in SMEM and the "parallel"
dimension semantics on TPU (see `_common.py`). It has only been run with `interpret=True` on CPU:
correctness is tested, lowering on hardware and speed are not verified. Known cost on hardware: splits
entirely past `max(lengths)` are still DMA'd (skipping them needs scalar prefetch into the index maps).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels._common import compiler_params, round_up, scalar_spec

NEG_INF = float("-inf")


@dataclasses.dataclass(frozen=True)
class PrefixTuning:
    """Static block sizes for `prefix_attention`.

    block_k: keys per inner step (one [T*G, block_k] score tile).
    block_s: keys per program (one split of split-K); a multiple of block_k. Smaller splits give more
      parallel programs for short batches, larger ones fewer partials to merge.
    """

    block_k: int = 128
    block_s: int = 1024

    def __post_init__(self):
        if not isinstance(self.block_k, int) or self.block_k <= 0 or self.block_k % 8:
            raise ValueError(f"PrefixTuning.block_k must be a positive multiple of 8, got {self.block_k!r}")
        if not isinstance(self.block_s, int) or self.block_s <= 0 or self.block_s % self.block_k:
            raise ValueError(
                f"PrefixTuning.block_s must be a positive multiple of block_k={self.block_k}, got {self.block_s!r}"
            )


def _prefix_kernel(lengths_ref, start_ref, q_ref, k_ref, v_ref, o_ref, lse_ref, *, sm_scale, block_k, block_s):
    # q_ref [R, H] (R = T*G padded), k_ref / v_ref [block_s, H], o_ref [R, H], lse_ref [R].
    b, split = pl.program_id(0), pl.program_id(2)
    base = split * block_s
    # Valid keys of this split, relative to its first key; the range is empty when lo >= hi.
    lo = jnp.maximum(start_ref[b], base) - base
    hi = jnp.minimum(lengths_ref[b], base + block_s) - base
    first = lo // block_k
    last = jnp.where(hi > lo, pl.cdiv(hi, block_k), first)

    q = q_ref[...]
    rows, head_dim = q.shape

    def body(i, carry):
        m, l, acc = carry  # [R], [R], [R, H]
        kb = k_ref[pl.ds(i * block_k, block_k), :]  # [bk, H]
        vb = v_ref[pl.ds(i * block_k, block_k), :]
        s = jax.lax.dot_general(q, kb, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32) * sm_scale
        pos = i * block_k + jax.lax.broadcasted_iota(jnp.int32, (1, block_k), 1)
        s = jnp.where((pos >= lo) & (pos < hi), s, NEG_INF)  # [R, bk]
        # Keys past S in the last split are out-of-bounds reads (garbage, possibly NaN): 0 * NaN would leak.
        pos_col = i * block_k + jax.lax.broadcasted_iota(jnp.int32, (block_k, 1), 0)
        vb = jnp.where((pos_col >= lo) & (pos_col < hi), vb, jnp.zeros_like(vb))
        # Every visited block holds at least one valid key and the mask is the same for all rows, so m_new
        # is finite and the -inf initial m only ever appears as exp(-inf) = 0.
        m_new = jnp.maximum(m, jnp.max(s, axis=-1))
        corr = jnp.exp(m - m_new)
        p = jnp.exp(s - m_new[:, None])
        l = l * corr + jnp.sum(p, axis=-1)
        pv = jax.lax.dot_general(p.astype(vb.dtype), vb, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
        return m_new, l, acc * corr[:, None] + pv

    init = (
        jnp.full((rows,), NEG_INF, jnp.float32),
        jnp.zeros((rows,), jnp.float32),
        jnp.zeros((rows, head_dim), jnp.float32),
    )
    m, l, acc = jax.lax.fori_loop(first, last, body, init)
    has_keys = l > 0
    safe_l = jnp.where(has_keys, l, 1.0)
    o_ref[...] = acc / safe_l[:, None]
    lse_ref[...] = jnp.where(has_keys, m + jnp.log(safe_l), NEG_INF)


def _merge_splits(o, lse):
    """Log-sum-exp merge over the split axis. o [B, K, P, R, H] fp32, lse [B, K, P, R] -> [B, K, R, H], [B, K, R]."""
    m = jnp.max(lse, axis=2)
    m_safe = jnp.where(jnp.isfinite(m), m, 0.0)
    w = jnp.exp(lse - m_safe[:, :, None])  # empty splits have lse = -inf -> weight 0
    denom = jnp.sum(w, axis=2)
    safe = jnp.where(denom > 0, denom, 1.0)
    out = jnp.einsum("bkprh,bkpr->bkrh", o, w) / safe[..., None]
    return out, jnp.where(denom > 0, m_safe + jnp.log(safe), NEG_INF)


@functools.partial(jax.jit, static_argnames=("sm_scale", "tuning", "interpret"))
def prefix_attention(
    q, k, v, lengths, window_start=None, *, sm_scale=None, tuning: PrefixTuning = PrefixTuning(), interpret=False
):
    """Attention of q [B, T, N, H] over cache keys `[window_start, lengths)` of k, v [B, K, S, H].

    Returns out [B, T, N, H] (q.dtype) and lse [B, T, N] (fp32, natural log). A row with no valid key gets
    out = 0 and lse = -inf.
    """
    B, T, N, H = q.shape
    K, S = k.shape[1], k.shape[2]
    if N % K:
        raise ValueError(f"query heads N={N} must be a multiple of kv heads K={K}")
    G = N // K
    scale = float(sm_scale) if sm_scale is not None else H**-0.5
    lengths = jnp.clip(lengths.astype(jnp.int32), 0, S)
    start = jnp.zeros_like(lengths) if window_start is None else jnp.clip(window_start.astype(jnp.int32), 0, S)
    if S == 0:
        return jnp.zeros_like(q), jnp.full((B, T, N), NEG_INF, jnp.float32)

    R = T * G
    Rp = round_up(R, 8)  # sublane multiple
    qf = q.reshape(B, T, K, G, H).transpose(0, 2, 1, 3, 4).reshape(B, K, R, H)  # [B, K, T*G, H]
    if Rp != R:
        qf = jnp.pad(qf, ((0, 0), (0, 0), (0, Rp - R), (0, 0)))
    block_k = min(tuning.block_k, round_up(S, 8))
    block_s = min(tuning.block_s, round_up(S, block_k))  # both multiples of block_k
    splits = pl.cdiv(S, block_s)

    kernel = functools.partial(_prefix_kernel, sm_scale=scale, block_k=block_k, block_s=block_s)
    o, lse = pl.pallas_call(
        kernel,
        grid=(B, K, splits),
        in_specs=[
            scalar_spec(interpret),
            scalar_spec(interpret),
            pl.BlockSpec((None, None, Rp, H), lambda b, h, s: (b, h, 0, 0)),
            pl.BlockSpec((None, None, block_s, H), lambda b, h, s: (b, h, s, 0)),
            pl.BlockSpec((None, None, block_s, H), lambda b, h, s: (b, h, s, 0)),
        ],
        out_specs=[
            pl.BlockSpec((None, None, None, Rp, H), lambda b, h, s: (b, h, s, 0, 0)),
            pl.BlockSpec((None, None, None, Rp), lambda b, h, s: (b, h, s, 0)),
        ],
        out_shape=[
            jax.ShapeDtypeStruct((B, K, splits, Rp, H), jnp.float32),
            jax.ShapeDtypeStruct((B, K, splits, Rp), jnp.float32),
        ],
        compiler_params=compiler_params(3, interpret),
        interpret=interpret,
        name="prefix_attention",
    )(lengths, start, qf, k, v)
    out, lse = _merge_splits(o, lse)
    out = out[:, :, :R].reshape(B, K, T, G, H).transpose(0, 2, 1, 3, 4).reshape(B, T, N, H)
    lse = lse[:, :, :R].reshape(B, K, T, G).transpose(0, 2, 1, 3).reshape(B, T, N)
    return out.astype(q.dtype), lse


def prefix_attention_reference(q, k, v, lengths, window_start=None, *, sm_scale=None):
    """Naive prefix attention: repeat kv heads, full [T, S] scores, masked softmax (fp32). k, v [B, K, S, H]."""
    B, T, N, H = q.shape
    K, S = k.shape[1], k.shape[2]
    scale = sm_scale if sm_scale is not None else H**-0.5
    start = jnp.zeros_like(lengths) if window_start is None else window_start
    pos = jnp.arange(S)
    valid = (pos[None, :] < lengths[:, None]) & (pos[None, :] >= start[:, None])  # [B, S]
    kf = jnp.repeat(k.astype(jnp.float32), N // K, axis=1)  # [B, N, S, H]
    vf = jnp.repeat(v.astype(jnp.float32), N // K, axis=1)
    s = jnp.einsum("btnh,bnsh->bnts", q.astype(jnp.float32), kf) * scale
    s = jnp.where(valid[:, None, None, :], s, NEG_INF)
    lse = jax.nn.logsumexp(s, axis=-1)  # [B, N, T]
    lse_safe = jnp.where(jnp.isfinite(lse), lse, 0.0)
    p = jnp.where(jnp.isfinite(lse)[..., None], jnp.exp(s - lse_safe[..., None]), 0.0)
    out = jnp.einsum("bnts,bnsh->btnh", p, vf)
    return out.astype(q.dtype), lse.transpose(0, 2, 1)
