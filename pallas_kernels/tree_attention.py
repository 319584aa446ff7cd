"""Masked attention among the speculative tree tokens: T queries over Tk keys (usually the same T tokens).

The tree half of LongSpec's hybrid tree attention (the cache half is `prefix_attention.py`). Query i may
see key j iff `mask[b, i, j]` (a node sees itself and its ancestors), or, for a causal chain (prefill
chunks, AR decode), iff j <= i without a materialised mask. With a mask the keys may number Tk != T
(the draft's frontier queries over every tree node so far).

Rows. As in the prefix kernel, the G query heads of each KV head are folded into rows: q [B, T, N, H] is
viewed as [B*K, T*G, H] with row r holding query r // G, so one program runs [rows, H] x [H, Tk] matmuls
for a whole head group instead of G programs with G-times-smaller tiles. The mask is expanded to rows
(`[B, T*G, Tk]`, int8: a few KB, shared by the K heads); the causal test needs no mask at all:
key j is visible to row r iff j * G <= r.

Grid (B*K, row blocks) on TPU (Mosaic; the row tile is one block up to 256 rows, stats lane-dense
[rows, 128]); (row blocks, B*K) on GPU (Pallas Triton; power-of-2 tiles of 16+ rows and keys, fp32 dots at
HIGHEST). Each program keeps the whole (small) key set in one block and walks it in `block_k` steps with an
online softmax; the causal variant stops after the diagonal block. Rows that see nothing get out = 0 and
lse = -inf. Only interpret mode runs on CPU; tests export-lower both variants. Nothing here has run on
real hardware.
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
class TreeTuning:
    """Static block sizes for `tree_attention`; None picks the platform's default.

    block_rows: query rows (query x head-group) per program. TPU 256 (a multiple of 32: int8 mask tiles),
      GPU 64 (a power of 2 >= 16).
    block_k: keys per inner step. TPU 128 (a multiple of 8), GPU 32 (a power of 2 >= 16).
    num_warps, num_stages: Triton compiler params.
    """

    block_rows: int | None = None
    block_k: int | None = None
    num_warps: int = 4
    num_stages: int = 2

    def __post_init__(self):
        for name in ("block_rows", "block_k"):
            val = getattr(self, name)
            if val is not None and (not isinstance(val, int) or val <= 0 or val % 8):
                raise ValueError(f"TreeTuning.{name} must be None or a positive multiple of 8, got {val!r}")
        for name in ("num_warps", "num_stages"):
            val = getattr(self, name)
            if not isinstance(val, int) or val <= 0:
                raise ValueError(f"TreeTuning.{name} must be a positive int, got {val!r}")


def _attend(q_ref, k_ref, v_ref, mask_ref, row0, m, l, acc, *, sm_scale, block_k, num_kb, group, causal, precision, pv):
    """Online softmax of the row tile q_ref [R, H] over k_ref / v_ref [Tkp, H]; rows start at `row0`."""
    q = q_ref[...]
    rows = q.shape[0]
    if causal:
        # The last row of the tile sees keys up to (row0 + rows - 1) // G: later key blocks are all invisible.
        last = jnp.minimum(((row0 + rows - 1) // group) // block_k + 1, num_kb)
    else:
        last = num_kb

    def body(j, carry):
        start = pl.multiple_of(j * block_k, block_k)
        kb = k_ref[pl.ds(start, block_k), :]
        vb = v_ref[pl.ds(start, block_k), :]
        s = scores(q, kb, sm_scale, precision)
        if causal:
            r = row0 + jax.lax.broadcasted_iota(jnp.int32, (rows, block_k), 0)
            kpos = start + jax.lax.broadcasted_iota(jnp.int32, (rows, block_k), 1)
            allowed = kpos * group <= r
        else:
            allowed = mask_ref[:, pl.ds(start, block_k)].astype(jnp.int32) != 0
        return online_step(jnp.where(allowed, s, NEG_INF), vb, *carry, pv)

    return jax.lax.fori_loop(0, last, body, (m, l, acc))


def _tpu_kernel(q_ref, k_ref, v_ref, *rest, causal, **kw):
    # q_ref [Rb, H]; k_ref / v_ref [Tkp, H]; mask_ref [Rb, Tkp] int8 (absent when causal); o_ref [Rb, H];
    # lse_ref [Rb, 128].
    mask_ref, (o_ref, lse_ref) = (None, rest) if causal else (rest[0], rest[1:])
    rows, head_dim = q_ref.shape
    init = (
        jnp.full((rows, LANES), NEG_INF, jnp.float32),
        jnp.zeros((rows, LANES), jnp.float32),
        jnp.zeros((rows, head_dim), jnp.float32),
    )
    m, l, acc = _attend(q_ref, k_ref, v_ref, mask_ref, pl.program_id(1) * rows, *init, causal=causal, **kw)
    out, lse = finish(m, l, acc)
    o_ref[...] = out.astype(o_ref.dtype)
    lse_ref[...] = lse


def _gpu_kernel(q_ref, k_ref, v_ref, *rest, causal, **kw):
    # As _tpu_kernel, with lse_ref [Rb] and 1-column statistics; the row block is grid axis 0.
    mask_ref, (o_ref, lse_ref) = (None, rest) if causal else (rest[0], rest[1:])
    rows, head_dim = q_ref.shape
    init = (
        jnp.full((rows, 1), NEG_INF, jnp.float32),
        jnp.zeros((rows, 1), jnp.float32),
        jnp.zeros((rows, head_dim), jnp.float32),
    )
    m, l, acc = _attend(q_ref, k_ref, v_ref, mask_ref, pl.program_id(0) * rows, *init, causal=causal, **kw)
    out, lse = finish(m, l, acc)
    o_ref[...] = out.astype(o_ref.dtype)
    lse_ref[...] = lse[:, 0]


@functools.partial(jax.jit, static_argnames=("causal", "sm_scale", "tuning", "platform", "interpret", "out_dtype"))
def tree_attention(
    q,
    k,
    v,
    mask=None,
    *,
    causal=False,
    sm_scale=None,
    tuning: TreeTuning = TreeTuning(),
    platform: str = "tpu",
    interpret: bool = False,
    out_dtype=None,
):
    """Attention of q [B, T, N, H] over k, v [B, Tk, K, H] under mask [B, T, Tk] (bool) or causal=True (Tk == T).

    platform: "tpu" (Mosaic) or "gpu" (Triton), the variant to build; interpret: run it with the Pallas
    interpreter (the only option on a CPU host). Returns out [B, T, N, H] (`out_dtype`, default q's) and lse [B, T, N]
    (fp32, natural log); a row that sees no key gets out = 0 and lse = -inf. With causal=True any mask
    passed is ignored.
    """
    check_platform(platform)
    B, T, N, H = q.shape
    Tk, K = k.shape[1], k.shape[2]
    if N % K:
        raise ValueError(f"query heads N={N} must be a multiple of kv heads K={K}")
    if mask is None and not causal:
        raise ValueError("tree_attention needs a mask or causal=True")
    if causal and Tk != T:
        raise ValueError(f"causal tree_attention needs as many keys as queries, got T={T}, Tk={Tk}")
    G = N // K
    scale = float(sm_scale) if sm_scale is not None else H**-0.5
    if T == 0 or Tk == 0:
        return jnp.zeros(q.shape, out_dtype or q.dtype), jnp.full((B, T, N), NEG_INF, jnp.float32)

    R = T * G
    if platform == "tpu":
        block_k = min(tuning.block_k or 128, round_up(Tk, 8))
        Tkp = round_up(Tk, block_k)
        block_rows = min(tuning.block_rows or 256, round_up(R, 32))
        if block_rows % 32:
            raise ValueError(f"TreeTuning.block_rows must be a multiple of 32 on TPU, got {block_rows}")
    else:
        block_k = tuning.block_k or 32
        block_rows = tuning.block_rows or 64
        if not (is_pow2(block_k) and block_k >= 16):
            raise ValueError(f"TreeTuning.block_k must be a power of 2 >= 16 on GPU, got {block_k}")
        if not (is_pow2(block_rows) and block_rows >= 16):
            raise ValueError(f"TreeTuning.block_rows must be a power of 2 >= 16 on GPU, got {block_rows}")
        Tkp = max(next_pow2(Tk), 16)  # the key tile is one block: a power of 2 for Triton
        block_k = min(block_k, Tkp)
        block_rows = min(block_rows, max(16, next_pow2(R)))
    Rp = round_up(R, block_rows)
    nrb = Rp // block_rows

    qf = fold_queries(q, K, Rp)
    # Padded keys are zero (not garbage), so they need no masking in the PV product.
    kf = jnp.pad(k.transpose(0, 2, 1, 3).reshape(B * K, Tk, H), ((0, 0), (0, Tkp - Tk), (0, 0)))
    vf = jnp.pad(v.transpose(0, 2, 1, 3).reshape(B * K, Tk, H), ((0, 0), (0, Tkp - Tk), (0, 0)))
    args = [qf, kf, vf]
    kw = dict(
        sm_scale=scale,
        block_k=block_k,
        num_kb=Tkp // block_k,
        group=G,
        causal=causal,
        # Fast fp32 dots only where Triton compiles them (the TPU kernel and the interpreter keep HIGHEST).
        precision=dot_precision(q.dtype, platform == "gpu" and not interpret),
        pv=pv_mode(platform == "gpu" and not interpret, v.dtype),
    )
    if platform == "tpu":
        grid = (B * K, nrb)
        idx = lambda bh, r: (bh, r)  # noqa: E731
    else:
        grid = (nrb, B * K)  # row blocks fastest: the programs of one head group run together
        idx = lambda r, bh: (bh, r)  # noqa: E731
    in_specs = [
        pl.BlockSpec((None, block_rows, H), lambda *g: (*idx(*g), 0)),
        pl.BlockSpec((None, Tkp, H), lambda *g: (idx(*g)[0], 0, 0)),
        pl.BlockSpec((None, Tkp, H), lambda *g: (idx(*g)[0], 0, 0)),
    ]
    if not causal:
        # Padded keys are invisible (False); padded rows see nothing and are sliced off.
        mrows = jnp.repeat(mask.astype(jnp.int8), G, axis=1)  # [B, R, Tk]: row r is query r // G
        args.append(jnp.pad(mrows, ((0, 0), (0, Rp - R), (0, Tkp - Tk))))
        in_specs.append(pl.BlockSpec((None, block_rows, Tkp), lambda *g: (idx(*g)[0] // K, idx(*g)[1], 0)))

    if platform == "tpu":
        lse_shape, lse_spec = (B * K, Rp, LANES), pl.BlockSpec((None, block_rows, LANES), lambda *g: (*idx(*g), 0))
        kernel, params = _tpu_kernel, tpu_params(("parallel", "parallel"))
    else:
        lse_shape, lse_spec = (B * K, Rp), pl.BlockSpec((None, block_rows), lambda *g: idx(*g))
        kernel, params = _gpu_kernel, triton_params(tuning.num_warps, tuning.num_stages)
    out, lse = pl.pallas_call(
        functools.partial(kernel, **kw),
        grid=grid,
        in_specs=in_specs,
        out_specs=[pl.BlockSpec((None, block_rows, H), lambda *g: (*idx(*g), 0)), lse_spec],
        out_shape=[
            jax.ShapeDtypeStruct((B * K, Rp, H), out_dtype or q.dtype),
            jax.ShapeDtypeStruct(lse_shape, jnp.float32),
        ],
        compiler_params=params,
        interpret=interpret,
        name="tree_attention",
    )(*args)
    if platform == "tpu":
        lse = lse[..., 0]
    out = unfold_rows(out, B, T, G).reshape(B, T, N, H)
    lse = unfold_rows(lse, B, T, G).reshape(B, T, N)
    return out, lse


def tree_attention_reference(q, k, v, mask=None, *, causal=False, sm_scale=None):
    """Naive masked attention: repeat kv heads, full [T, Tk] scores, masked softmax (fp32)."""
    B, T, N, H = q.shape
    K = k.shape[2]
    scale = sm_scale if sm_scale is not None else H**-0.5
    if causal:
        mask = jnp.broadcast_to(jnp.tril(jnp.ones((T, T), bool)), (B, T, T))
    elif mask is None:
        raise ValueError("tree_attention needs a mask or causal=True")
    kf = jnp.repeat(k.astype(jnp.float32), N // K, axis=2)  # [B, Tk, N, H]
    vf = jnp.repeat(v.astype(jnp.float32), N // K, axis=2)
    s = jnp.einsum("btnh,bsnh->bnts", q.astype(jnp.float32), kf) * scale
    s = jnp.where(mask[:, None], s, NEG_INF)
    lse = jax.nn.logsumexp(s, axis=-1)  # [B, N, T]
    lse_safe = jnp.where(jnp.isfinite(lse), lse, 0.0)
    p = jnp.where(jnp.isfinite(lse)[..., None], jnp.exp(s - lse_safe[..., None]), 0.0)
    out = jnp.einsum("bnts,bsnh->btnh", p, vf)
    return out.astype(q.dtype), lse.transpose(0, 2, 1)
