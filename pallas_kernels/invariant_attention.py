"""The cache part of batch-invariant attention as one kernel: each query over the cache keys below its own bound.

Batch-invariant numerics (`lsjax.attention.invariant_tree_attention`) need a query's bits to depend on its own
position and keys only, never on where the cache ends, on its row in the forward or on the other rows, so that
AR (the query alone) and a verification forward (the query among tree nodes) compute the same bits. The plain
XLA version is ~20 small operations a layer; on a GPU, where a 135M model's step is bound by launches, that
made an invariant AR step 3.3x a plain one (docs/hardware). This kernel does the long part, the cache keys
`[0, bound)` of each query row, in one call; the short window of the last R positions stays in XLA.

How the bits stay invariant:
* Keys go in blocks of `BLOCK_K` at fixed bounds from slot 0, in order, through one online softmax per row.
  A block in which a row sees no key leaves its statistics exactly as they were (m unchanged, the rescale
  exp(0) = 1, p = 0 adds +0), so the loop may run to the tile's largest bound: a row's result is the same
  whatever other rows share its tile, and whatever the cache length.
* The products are per row: one row of a [rows, H] x [H, BLOCK_K] dot does not depend on the other rows.
* `BLOCK_K` and `BLOCK_ROWS` are constants of the numerics, not tuned per shape or card: another block size
  would be another (equally exact) rounding, and AR and verification must share one.

Rows. As in `prefix_attention`, the R queries are folded into the head-group axis: q [B, R, N, H] is viewed as
[B*K, R*G, H], one program per (row tile, b * K + kv head), each KV head's cache read once per row tile.

GPU (Pallas Triton) only, compiled or interpreted; a TPU runs the XLA version (a Mosaic variant would take the
prefix kernel's clamped block index maps with a per-row bound; not built). Returns the online softmax's state
(m, l, acc), which the window part continues. Nothing here has run on a GPU yet.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels._common import (
    NEG_INF,
    dot_precision,
    fold_queries,
    is_pow2,
    online_step,
    pv_mode,
    round_up,
    scores,
    triton_params,
    unfold_rows,
)

BLOCK_K = 64  # cache keys per step: part of the numerics (module docstring)
BLOCK_ROWS = 64  # query rows per program: Triton's dots want power-of-2 tiles of 16+ rows


def _kernel(layer_ref, bound_ref, q_ref, k_ref, v_ref, m_ref, l_ref, acc_ref, *, sm_scale, num_kv, precision, pv):
    # q_ref [Rb, H]; bound_ref [Rb]: row i sees cache slots [0, bound[i]); k_ref / v_ref the whole cache.
    from jax.experimental.pallas import triton as plgpu

    bh = pl.program_id(1)
    b, h = bh // num_kv, bh % num_kv
    layer = layer_ref[0]
    q = q_ref[...]
    bound = bound_ref[...]
    top = jnp.max(bound)  # the tile's last key: past it no row sees anything
    rows, head_dim = q.shape

    def body(c, carry):
        m, l, acc = carry
        start = c * BLOCK_K
        pos = start + jax.lax.broadcasted_iota(jnp.int32, (BLOCK_K,), 0)
        # Nothing at or past the tile's bound is read: those slots may hold another step's keys or garbage.
        load = pos < top
        kb = plgpu.load(k_ref.at[layer, b, h, pl.ds(start, BLOCK_K), :], mask=load[:, None], other=0.0)
        vb = plgpu.load(v_ref.at[layer, b, h, pl.ds(start, BLOCK_K), :], mask=load[:, None], other=0.0)
        sees = pos[None, :] < bound[:, None]
        s = jnp.where(sees, scores(q, kb, sm_scale, precision), NEG_INF)
        return online_step(s, vb, m, l, acc, pv)

    init = (
        jnp.full((rows, 1), NEG_INF, jnp.float32),
        jnp.zeros((rows, 1), jnp.float32),
        jnp.zeros((rows, head_dim), jnp.float32),
    )
    m, l, acc = jax.lax.fori_loop(0, pl.cdiv(top, BLOCK_K), body, init)
    m_ref[...] = m[:, 0]
    l_ref[...] = l[:, 0]
    acc_ref[...] = acc


@functools.partial(jax.jit, static_argnames=("sm_scale", "interpret", "num_warps", "num_stages"))
def invariant_cache_attention(
    q, k, v, bounds, layer, *, sm_scale=None, interpret: bool = False, num_warps: int = 4, num_stages: int = 2
):
    """The online softmax state of each query of q [B, R, N, H] over the cache slots `[0, bounds[b, r])` of
    layer `layer` (an int, traced or static) of the whole cache k, v [L, B, K, S, H].

    Returns (m, l, acc) fp32: m, l [B, R, K, G] the running max and sum of exp(score - m), acc [B, R, K, G, H]
    the sum of exp(score - m) * v; a query that sees no slot has m = -inf, l = 0, acc = 0. The output over
    those keys alone is acc / l. `interpret`: the Pallas interpreter (a CPU host); else Triton (a GPU)."""
    if k.ndim != 5:
        raise ValueError(f"invariant_cache_attention: k must be the whole cache [L, B, K, S, H], got {k.shape}")
    B, R, N, H = q.shape
    _, _, K, S, _ = k.shape
    if N % K:
        raise ValueError(f"query heads N={N} must be a multiple of kv heads K={K}")
    if not is_pow2(H):
        raise ValueError(f"invariant_cache_attention: Triton needs a power-of-2 head_dim, got {H}")
    G = N // K
    scale = float(sm_scale) if sm_scale is not None else H**-0.5
    rows = R * G
    Rp = round_up(rows, BLOCK_ROWS)
    qf = fold_queries(q, K, Rp)
    # Per folded row (query r, head g): the query's bound; padding rows see nothing.
    bound = jnp.repeat(jnp.clip(bounds.astype(jnp.int32), 0, S), G, axis=1)
    bound = jnp.pad(bound, ((0, 0), (0, Rp - rows)))  # [B, Rp]
    layer = jnp.pad(jnp.reshape(jnp.asarray(layer, jnp.int32), (1,)), (0, 1))  # Triton blocks: power-of-2 dims

    kernel = functools.partial(
        _kernel,
        sm_scale=scale,
        num_kv=K,
        precision=dot_precision(q.dtype, not interpret),
        pv=pv_mode(not interpret, v.dtype),
    )
    whole = pl.BlockSpec(memory_space=pl.ANY)
    m, l, acc = pl.pallas_call(
        kernel,
        # Row tiles vary fastest: the programs of one KV head run together and share its blocks through L2.
        grid=(Rp // BLOCK_ROWS, B * K),
        in_specs=[
            whole,
            pl.BlockSpec((None, BLOCK_ROWS), lambda r, bh: (bh // K, r)),
            pl.BlockSpec((None, BLOCK_ROWS, H), lambda r, bh: (bh, r, 0)),
            whole,
            whole,
        ],
        out_specs=[
            pl.BlockSpec((None, BLOCK_ROWS), lambda r, bh: (bh, r)),
            pl.BlockSpec((None, BLOCK_ROWS), lambda r, bh: (bh, r)),
            pl.BlockSpec((None, BLOCK_ROWS, H), lambda r, bh: (bh, r, 0)),
        ],
        out_shape=[
            jax.ShapeDtypeStruct((B * K, Rp), jnp.float32),
            jax.ShapeDtypeStruct((B * K, Rp), jnp.float32),
            jax.ShapeDtypeStruct((B * K, Rp, H), jnp.float32),
        ],
        compiler_params=triton_params(num_warps, num_stages),
        interpret=interpret,
        name="invariant_cache_attention",
    )(layer, bound, qf, k, v)

    return unfold_rows(m, B, R, G), unfold_rows(l, B, R, G), unfold_rows(acc, B, R, G)


def invariant_cache_attention_reference(q, k, v, bounds, layer, *, sm_scale=None):
    """Naive: every query over cache slots [0, bound) of one layer, full scores, masked softmax (fp32).
    Returns (out [B, R, N, H], lse [B, R, N]); a query without keys gets 0 and -inf."""
    B, R, N, H = q.shape
    kl, vl = k[layer], v[layer]  # [B, K, S, H]
    K, S = kl.shape[1], kl.shape[2]
    scale = sm_scale if sm_scale is not None else H**-0.5
    kf = jnp.repeat(kl.astype(jnp.float32), N // K, axis=1)  # [B, N, S, H]
    vf = jnp.repeat(vl.astype(jnp.float32), N // K, axis=1)
    hi = jax.lax.Precision.HIGHEST
    s = jnp.einsum("brnh,bnsh->brns", q.astype(jnp.float32), kf, precision=hi) * scale
    s = jnp.where(jnp.arange(S) < bounds[:, :, None, None], s, NEG_INF)
    lse = jax.nn.logsumexp(s, axis=-1)
    safe = jnp.where(jnp.isfinite(lse), lse, 0.0)
    p = jnp.where(jnp.isfinite(lse)[..., None], jnp.exp(s - safe[..., None]), 0.0)
    return jnp.einsum("brns,bnsh->brnh", p, vf, precision=hi), lse


def output_of(m, l, acc):
    """(out [B, R, N, H], lse [B, R, N]) of the keys the state (m, l, acc) has seen; 0 and -inf for none."""
    B, R, K, G, H = acc.shape
    seen = l > 0
    safe = jnp.where(seen, l, 1.0)
    out = jnp.where(seen[..., None], acc / safe[..., None], 0.0)
    lse = jnp.where(seen, m + jnp.log(safe), NEG_INF)
    return out.reshape(B, R, K * G, H), lse.reshape(B, R, K * G)
