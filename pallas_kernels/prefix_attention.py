"""Flash-decoding over a committed KV cache: a few new queries, a long cache, no mask.

The prefix half of LongSpec's hybrid tree attention (the tree half is `tree_attention.py`). The T new
queries (T = tree size, 1..128) attend to keys `[window_start, length)` of a heads-major cache
k, v [B, K, S, H] (or the whole model's cache [L, B, K, S, H] plus a layer index) with capacity S (up to
128K). Keys are all in the past, so the only mask is the per-sequence valid range, the same for every query:
it is applied on key positions, never as a `[T, S]` tensor.

Rows. The T queries are folded into the head-group axis: q [B, T, N, H] is viewed as [B*K, T*G, H]
(G = N // K), so one program multiplies a [rows, H] query tile against a key block of one KV head and
each KV head's cache is read once per call, not once per query or per query head.

Two variants of the same online softmax, because the two compilers want different data flows:

* TPU (Mosaic). Grid (B*K, P, steps); the last axis walks blocks of `block_s` keys ("arbitrary") while
  m, l and the accumulator stay in VMEM scratch. The layer index, lengths and window starts are scalar
  prefetch, so the K/V index maps pick the layer out of the full cache (no per-layer copy) and clamp the
  block index into `[window_start, length)`: a block index equal to the previous step's is not fetched
  again, so blocks past the length cost no HBM traffic. Per-row statistics are lane-dense ([rows, 128]).
  P = 1 by default (one TensorCore walks the keys; megacore chips split the B*K axis).
* GPU (Pallas Triton). Grid (B*K, row blocks, P): split-K over P key ranges sized so that B*K*P programs
  fill the SMs (132 on an H100) at batch 1; each program loops over `block_k` keys with masked loads, so
  keys outside `[window_start, length)` are never read and no block past S is touched. Power-of-2 tiles of
  16+ rows (Triton's rule) and fp32 dots at HIGHEST (Triton's fp32 default is TF32).

Either way the P partial (out, lse) are merged by log-sum-exp in the wrapper. Only interpret mode runs on
CPU; tests export-lower both variants for TPU and CUDA. Nothing here has run on real hardware.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels._common import (
    LANES,
    NEG_INF,
    check_platform,
    dot_precision,
    finish,
    fold_queries,
    is_pow2,
    next_pow2,
    online_step,
    pv_mode,
    round_up,
    scores,
    tpu_params,
    triton_params,
    unfold_rows,
)


@dataclasses.dataclass(frozen=True)
class PrefixTuning:
    """Static block sizes for `prefix_attention`; None picks the platform's default.

    block_k: keys per compute step (one [rows, block_k] score tile). TPU 512, GPU 64; a power of 2 on GPU.
    block_s: TPU: keys per grid step (one K and one V DMA), a multiple of block_k, default 2048.
      GPU: keys per split-K program, default sized so that the programs fill `num_sms`.
    splits: TPU only: parallel key ranges (partials merged by LSE), default 1.
    block_rows: GPU only: query rows per program (power of 2, >= 16: Triton's smallest dot).
    num_warps, num_stages: Triton compiler params. num_sms: GPU programs to aim for (H100: 132).
    """

    block_k: int | None = None
    block_s: int | None = None
    splits: int = 1
    block_rows: int = 64
    num_warps: int = 4
    num_stages: int = 2
    num_sms: int = 132

    def __post_init__(self):
        for name in ("block_k", "block_s"):
            val = getattr(self, name)
            if val is not None and (not isinstance(val, int) or val <= 0 or val % 8):
                raise ValueError(f"PrefixTuning.{name} must be None or a positive multiple of 8, got {val!r}")
        if self.block_k is not None and self.block_s is not None and self.block_s % self.block_k:
            raise ValueError(f"PrefixTuning.block_s must be a multiple of block_k={self.block_k}, got {self.block_s!r}")
        for name in ("splits", "num_warps", "num_stages", "num_sms"):
            val = getattr(self, name)
            if not isinstance(val, int) or val <= 0:
                raise ValueError(f"PrefixTuning.{name} must be a positive int, got {val!r}")
        if not is_pow2(self.block_rows) or self.block_rows < 16:
            raise ValueError(f"PrefixTuning.block_rows must be a power of 2 >= 16, got {self.block_rows!r}")


def _tpu_kernel(
    layer_ref,
    len_ref,
    start_ref,
    q_ref,
    k_ref,
    v_ref,
    o_ref,
    lse_ref,
    m_sc,
    l_sc,
    acc_sc,
    *,
    sm_scale,
    block_k,
    block_s,
    steps,
    num_kv,
    precision,
    pv,
):
    # q_ref [R, H]; k_ref / v_ref [block_s, H]; o_ref [R, H]; lse_ref, m_sc, l_sc [R, 128]; acc_sc [R, H].
    del layer_ref  # used by the index maps only
    bh, split, i = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    b = bh // num_kv
    base = (split * steps + i) * block_s  # unclamped: a clamped (repeated) block is skipped below
    lo = jnp.maximum(start_ref[b], base) - base
    hi = jnp.minimum(len_ref[b], base + block_s) - base

    @pl.when(i == 0)
    def _init():
        m_sc[...] = jnp.full(m_sc.shape, NEG_INF, jnp.float32)
        l_sc[...] = jnp.zeros(l_sc.shape, jnp.float32)
        acc_sc[...] = jnp.zeros(acc_sc.shape, jnp.float32)

    def sub_block(c, carry):
        start = pl.multiple_of(c * block_k, block_k)

        @pl.when((start < hi) & (start + block_k > lo))
        def _():
            kb = k_ref[pl.ds(start, block_k), :]
            vb = v_ref[pl.ds(start, block_k), :]
            s = scores(q_ref[...], kb, sm_scale, precision)
            pos = start + jax.lax.broadcasted_iota(jnp.int32, (1, block_k), 1)
            s = jnp.where((pos >= lo) & (pos < hi), s, NEG_INF)
            pos_col = start + jax.lax.broadcasted_iota(jnp.int32, (block_k, 1), 0)
            vb = jnp.where((pos_col >= lo) & (pos_col < hi), vb, jnp.zeros_like(vb))
            m, l, acc = online_step(s, vb, m_sc[...], l_sc[...], acc_sc[...], pv)
            m_sc[...], l_sc[...], acc_sc[...] = m, l, acc

        return carry

    @pl.when(hi > lo)
    def _compute():
        jax.lax.fori_loop(0, block_s // block_k, sub_block, 0)

    @pl.when(i == steps - 1)
    def _store():
        out, lse = finish(m_sc[...], l_sc[...], acc_sc[...])
        o_ref[...] = out
        lse_ref[...] = lse


def _gpu_kernel(
    layer_ref,
    len_ref,
    start_ref,
    q_ref,
    k_ref,
    v_ref,
    o_ref,
    lse_ref,
    *,
    sm_scale,
    block_k,
    split_len,
    num_kv,
    precision,
    pv,
):
    # q_ref [Rb, H]; k_ref / v_ref the whole cache [L, B, K, S, H]; o_ref [Rb, H]; lse_ref [Rb].
    from jax.experimental.pallas import triton as plgpu

    bh, split = pl.program_id(1), pl.program_id(2)
    b, h = bh // num_kv, bh % num_kv
    base = split * split_len
    lo = jnp.maximum(start_ref[b], base)  # absolute key positions of this split's valid range
    hi = jnp.minimum(len_ref[b], base + split_len)
    first = (lo - base) // block_k
    last = jnp.where(hi > lo, pl.cdiv(hi - base, block_k), first)
    layer = layer_ref[0]
    q = q_ref[...]
    rows, head_dim = q.shape

    def body(c, carry):
        m, l, acc = carry
        start = base + c * block_k
        pos = start + jax.lax.broadcasted_iota(jnp.int32, (block_k,), 0)
        ok = (pos >= lo) & (pos < hi)
        # Masked loads: keys outside the valid range (incl. past S in the last block) are never read.
        # The loads address the full cache directly (one indexer: Triton takes no nested views).
        kb = plgpu.load(k_ref.at[layer, b, h, pl.ds(start, block_k), :], mask=ok[:, None], other=0.0)
        vb = plgpu.load(v_ref.at[layer, b, h, pl.ds(start, block_k), :], mask=ok[:, None], other=0.0)
        s = jnp.where(ok[None, :], scores(q, kb, sm_scale, precision), NEG_INF)
        return online_step(s, vb, m, l, acc, pv)

    init = (
        jnp.full((rows, 1), NEG_INF, jnp.float32),
        jnp.zeros((rows, 1), jnp.float32),
        jnp.zeros((rows, head_dim), jnp.float32),
    )
    m, l, acc = jax.lax.fori_loop(first, last, body, init)
    out, lse = finish(m, l, acc)
    o_ref[...] = out
    lse_ref[...] = lse[:, 0]


def _merge_splits(o, lse):
    """Log-sum-exp merge over the split axis. o [BK, P, R, H] fp32, lse [BK, P, R] -> [BK, R, H], [BK, R]."""
    if o.shape[1] == 1:
        return o[:, 0], lse[:, 0]
    m = jnp.max(lse, axis=1)
    m_safe = jnp.where(jnp.isfinite(m), m, 0.0)
    w = jnp.exp(lse - m_safe[:, None])  # empty splits have lse = -inf -> weight 0
    denom = jnp.sum(w, axis=1)
    safe = jnp.where(denom > 0, denom, 1.0)
    out = jnp.einsum("bprh,bpr->brh", o, w) / safe[..., None]
    return out, jnp.where(denom > 0, m_safe + jnp.log(safe), NEG_INF)


def kv_block_index(j, length, start, *, block_s: int, last_block: int):
    """The cache block the TPU pipeline fetches at key step j: j clamped into the blocks holding keys of
    `[start, length)`. Steps outside that range repeat a neighbour's index, and the pipeline does not copy a
    block whose index equals the previous step's: blocks past the length (or before the window) cost no HBM
    traffic. An empty range still names one block (it is fetched once and its compute skipped)."""
    lo = start // block_s
    hi = jnp.maximum(pl.cdiv(length, block_s) - 1, lo)
    return jnp.clip(j, lo, jnp.minimum(hi, last_block))


def _tpu_call(qf, k, v, layer, lengths, start, *, scale, tuning, interpret):
    BK, R, H = qf.shape
    _, B, K, S, _ = k.shape
    block_k = min(tuning.block_k or 512, round_up(S, 8))
    block_s = min(tuning.block_s or max(2048, block_k), round_up(S, block_k))
    block_s = round_up(block_s, block_k)
    splits = min(tuning.splits, pl.cdiv(S, block_s))
    steps = pl.cdiv(pl.cdiv(S, block_s), splits)
    last_block = pl.cdiv(S, block_s) - 1

    def kv_map(bh, p, i, layer_ref, len_ref, start_ref):
        b = bh // K
        j = kv_block_index(p * steps + i, len_ref[b], start_ref[b], block_s=block_s, last_block=last_block)
        return layer_ref[0], b, bh % K, j, 0

    from jax.experimental.pallas import tpu as pltpu

    kernel = functools.partial(
        _tpu_kernel,
        sm_scale=scale,
        block_k=block_k,
        block_s=block_s,
        steps=steps,
        num_kv=K,
        precision=dot_precision(qf.dtype),
        pv="highest",
    )
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=3,
        grid=(BK, splits, steps),
        in_specs=[
            pl.BlockSpec((None, R, H), lambda bh, p, i, *_: (bh, 0, 0)),
            pl.BlockSpec((None, None, None, block_s, H), kv_map),
            pl.BlockSpec((None, None, None, block_s, H), kv_map),
        ],
        out_specs=[
            pl.BlockSpec((None, None, R, H), lambda bh, p, i, *_: (bh, p, 0, 0)),
            pl.BlockSpec((None, None, R, LANES), lambda bh, p, i, *_: (bh, p, 0, 0)),
        ],
        scratch_shapes=[
            pltpu.VMEM((R, LANES), jnp.float32),
            pltpu.VMEM((R, LANES), jnp.float32),
            pltpu.VMEM((R, H), jnp.float32),
        ],
    )
    o, lse = pl.pallas_call(
        kernel,
        grid_spec=grid_spec,
        out_shape=[
            jax.ShapeDtypeStruct((BK, splits, R, H), jnp.float32),
            jax.ShapeDtypeStruct((BK, splits, R, LANES), jnp.float32),
        ],
        # The B*K axis comes first: it always has >= K programs of real work for megacore to split.
        compiler_params=tpu_params(("parallel", "parallel", "arbitrary")),
        interpret=interpret,
        name="prefix_attention",
    )(layer, lengths, start, qf, k, v)
    return o, lse[..., 0]


def _gpu_call(qf, k, v, layer, lengths, start, *, scale, tuning, block_rows, interpret):
    BK, Rp, H = qf.shape
    _, B, K, S, _ = k.shape
    block_k = tuning.block_k or 64
    if not is_pow2(block_k) or block_k < 16:
        raise ValueError(f"PrefixTuning.block_k must be a power of 2 >= 16 on GPU, got {block_k}")
    block_k = min(block_k, max(16, next_pow2(S)))
    if tuning.block_s is None:
        # Enough split-K programs to fill the SMs at batch 1, each at least one key block.
        base_programs = BK * (Rp // block_rows)
        split_len = round_up(pl.cdiv(S, max(1, pl.cdiv(tuning.num_sms, base_programs))), block_k)
    else:
        split_len = round_up(tuning.block_s, block_k)
    splits = pl.cdiv(S, split_len)
    # Triton blocks must have power-of-2 dims: the [B] bounds are padded (the padding is never read).
    Bp = next_pow2(B)
    lengths = jnp.pad(lengths, (0, Bp - B))
    start = jnp.pad(start, (0, Bp - B))
    layer = jnp.pad(layer, (0, 1))  # [2]

    kernel = functools.partial(
        _gpu_kernel,
        sm_scale=scale,
        block_k=block_k,
        split_len=split_len,
        num_kv=K,
        precision=dot_precision(qf.dtype, not interpret),
        pv=pv_mode(not interpret, v.dtype),
    )
    whole = pl.BlockSpec(memory_space=pl.ANY)
    o, lse = pl.pallas_call(
        kernel,
        # Row blocks vary fastest (CUDA's x): the programs of one KV head run together and share its
        # K/V blocks through L2 instead of each pulling them from HBM.
        grid=(Rp // block_rows, BK, splits),
        in_specs=[
            whole,
            whole,
            whole,
            pl.BlockSpec((None, block_rows, H), lambda r, bh, p: (bh, r, 0)),
            whole,
            whole,
        ],
        out_specs=[
            pl.BlockSpec((None, None, block_rows, H), lambda r, bh, p: (bh, p, r, 0)),
            pl.BlockSpec((None, None, block_rows), lambda r, bh, p: (bh, p, r)),
        ],
        out_shape=[
            jax.ShapeDtypeStruct((BK, splits, Rp, H), jnp.float32),
            jax.ShapeDtypeStruct((BK, splits, Rp), jnp.float32),
        ],
        compiler_params=triton_params(tuning.num_warps, tuning.num_stages),
        interpret=interpret,
        name="prefix_attention",
    )(layer, lengths, start, qf, k, v)
    return o, lse


@functools.partial(jax.jit, static_argnames=("sm_scale", "tuning", "platform", "interpret", "out_dtype"))
def prefix_attention(
    q,
    k,
    v,
    lengths,
    window_start=None,
    layer=None,
    *,
    sm_scale=None,
    tuning: PrefixTuning = PrefixTuning(),
    platform: str = "tpu",
    interpret: bool = False,
    out_dtype=None,
):
    """Attention of q [B, T, N, H] over cache keys `[window_start, lengths)`.

    k, v: [B, K, S, H], or the whole cache [L, B, K, S, H] with `layer` (a traced or static int) picking one
    layer inside the kernel (no copy). platform: "tpu" (Mosaic) or "gpu" (Triton), the variant to build;
    interpret: run it with the Pallas interpreter (the only option on a CPU host).
    Returns out [B, T, N, H] (`out_dtype`, default q's) and lse [B, T, N] (fp32, natural log). A row with no
    valid key gets out = 0 and lse = -inf.
    """
    check_platform(platform)
    if layer is None:
        if k.ndim != 4:
            raise ValueError(f"prefix_attention: k must be [B, K, S, H] without a layer, got {k.shape}")
        k, v, layer = k.reshape(1, *k.shape), v.reshape(1, *v.shape), 0  # a bitcast, not a copy
    elif k.ndim != 5:
        raise ValueError(f"prefix_attention: k must be [L, B, K, S, H] with a layer, got {k.shape}")
    B, T, N, H = q.shape
    K, S = k.shape[2], k.shape[3]
    if N % K:
        raise ValueError(f"query heads N={N} must be a multiple of kv heads K={K}")
    G = N // K
    scale = float(sm_scale) if sm_scale is not None else H**-0.5
    if S == 0:
        return jnp.zeros(q.shape, out_dtype or q.dtype), jnp.full((B, T, N), NEG_INF, jnp.float32)
    lengths = jnp.clip(lengths.astype(jnp.int32), 0, S)
    start = jnp.zeros_like(lengths) if window_start is None else jnp.clip(window_start.astype(jnp.int32), 0, S)
    layer = jnp.reshape(jnp.asarray(layer, jnp.int32), (1,))

    R = T * G
    if platform == "tpu":
        block_rows = None
        Rp = round_up(R, 8)  # sublane multiple; the whole row tile is one block
    else:
        block_rows = min(tuning.block_rows, max(16, next_pow2(R)))
        Rp = round_up(R, block_rows)
    qf = fold_queries(q, K, Rp)

    if platform == "tpu":
        o, lse = _tpu_call(qf, k, v, layer, lengths, start, scale=scale, tuning=tuning, interpret=interpret)
    else:
        o, lse = _gpu_call(
            qf, k, v, layer, lengths, start, scale=scale, tuning=tuning, block_rows=block_rows, interpret=interpret
        )
    out, lse = _merge_splits(o, lse)
    out = unfold_rows(out, B, T, G).reshape(B, T, N, H)
    lse = unfold_rows(lse, B, T, G).reshape(B, T, N)
    return out.astype(out_dtype or q.dtype), lse


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
