"""Masked attention among the speculative tree tokens: T queries over the same T keys.

The tree half of LongSpec's hybrid tree attention (the cache half is `prefix_attention.py`). Query i may
see key j iff `mask[b, i, j]` (a node sees itself and its ancestors), or, for a causal chain (prefill
chunks, AR decode), iff j <= i without a materialised mask. With a mask the keys may number Tk != T
(the draft's frontier queries over every tree node so far).

Layout. q is viewed as [B, N, T, H] and k, v as [B, K, T, H] (transposing the T new tokens is cheap; the
cache is never touched here). The grid is (B, N, T / block_q): one program owns one query head and one
query block, and GQA is an index map (query head n reads kv head n // G). Inside, a flash-attention loop
walks key blocks of block_k with an online softmax; the causal variant stops at the diagonal block.
Rows that see nothing get out = 0 and lse = -inf (the running max is made safe before every exp).

Backends. Written against the Pallas core API (`pl.pallas_call`, `pl.BlockSpec`, a grid) for Mosaic TPU
and for Pallas' Triton lowering on GPU (Mosaic GPU's warpgroup model would need a rewrite); the mask
travels as int32 because boolean refs are not portable. It has only been run with `interpret=True` on
CPU: correctness is tested, lowering on hardware and speed are not verified.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels._common import compiler_params, round_up

NEG_INF = float("-inf")


@dataclasses.dataclass(frozen=True)
class TreeTuning:
    """Static block sizes for `tree_attention` (both multiples of 8; clipped to the padded tree size).

    block_q: queries per program. block_k: keys per inner step.
    """

    block_q: int = 128
    block_k: int = 128

    def __post_init__(self):
        for name in ("block_q", "block_k"):
            val = getattr(self, name)
            if not isinstance(val, int) or val <= 0 or val % 8:
                raise ValueError(f"TreeTuning.{name} must be a positive multiple of 8, got {val!r}")


def _tree_kernel(q_ref, k_ref, v_ref, *rest, sm_scale, block_q, block_k, causal):
    # q_ref [bq, H], k_ref / v_ref [Tkp, H], mask_ref [bq, Tkp] int32 (absent when causal), o_ref [bq, H], lse_ref [bq]
    if causal:
        mask_ref = None
        o_ref, lse_ref = rest
    else:
        mask_ref, o_ref, lse_ref = rest
    qi = pl.program_id(2)
    q = q_ref[...]
    rows, head_dim = q.shape
    num_kb = k_ref.shape[0] // block_k
    # Keys after the last query of this block are never visible in a chain.
    last = jnp.minimum(pl.cdiv((qi + 1) * block_q, block_k), num_kb) if causal else num_kb

    def body(j, carry):
        m, l, acc = carry  # [bq], [bq], [bq, H]
        kb = k_ref[pl.ds(j * block_k, block_k), :]  # [bk, H]
        vb = v_ref[pl.ds(j * block_k, block_k), :]
        s = jax.lax.dot_general(q, kb, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32) * sm_scale
        if causal:
            q_pos = qi * block_q + jax.lax.broadcasted_iota(jnp.int32, (block_q, block_k), 0)
            k_pos = j * block_k + jax.lax.broadcasted_iota(jnp.int32, (block_q, block_k), 1)
            allowed = k_pos <= q_pos
        else:
            allowed = mask_ref[:, pl.ds(j * block_k, block_k)] != 0
        s = jnp.where(allowed, s, NEG_INF)  # [bq, bk]
        # Unlike the prefix, visibility differs per row: a row may have seen nothing yet (m = -inf).
        m_new = jnp.maximum(m, jnp.max(s, axis=-1))
        m_safe = jnp.where(m_new == NEG_INF, 0.0, m_new)
        corr = jnp.exp(m - m_safe)
        p = jnp.exp(s - m_safe[:, None])
        l = l * corr + jnp.sum(p, axis=-1)
        pv = jax.lax.dot_general(p.astype(vb.dtype), vb, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
        return m_new, l, acc * corr[:, None] + pv

    init = (
        jnp.full((rows,), NEG_INF, jnp.float32),
        jnp.zeros((rows,), jnp.float32),
        jnp.zeros((rows, head_dim), jnp.float32),
    )
    m, l, acc = jax.lax.fori_loop(0, last, body, init)
    has_keys = l > 0
    safe_l = jnp.where(has_keys, l, 1.0)
    o_ref[...] = (acc / safe_l[:, None]).astype(o_ref.dtype)
    lse_ref[...] = jnp.where(has_keys, m + jnp.log(safe_l), NEG_INF)


@functools.partial(jax.jit, static_argnames=("causal", "sm_scale", "tuning", "interpret"))
def tree_attention(
    q, k, v, mask=None, *, causal=False, sm_scale=None, tuning: TreeTuning = TreeTuning(), interpret=False
):
    """Attention of q [B, T, N, H] over k, v [B, Tk, K, H] under mask [B, T, Tk] (bool) or causal=True (Tk == T).

    Returns out [B, T, N, H] (q.dtype) and lse [B, T, N] (fp32, natural log); a row that sees no key gets
    out = 0 and lse = -inf. With causal=True any mask passed is ignored.
    """
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
        return jnp.zeros_like(q), jnp.full((B, T, N), NEG_INF, jnp.float32)

    block_q = min(tuning.block_q, round_up(T, 8))
    block_k = min(tuning.block_k, round_up(Tk, 8))
    Tqp, Tkp = round_up(T, block_q), round_up(Tk, block_k)
    qt = jnp.pad(q.transpose(0, 2, 1, 3), ((0, 0), (0, 0), (0, Tqp - T), (0, 0)))  # [B, N, Tqp, H]
    kt = jnp.pad(k.transpose(0, 2, 1, 3), ((0, 0), (0, 0), (0, Tkp - Tk), (0, 0)))  # [B, K, Tkp, H]
    vt = jnp.pad(v.transpose(0, 2, 1, 3), ((0, 0), (0, 0), (0, Tkp - Tk), (0, 0)))
    in_specs = [
        pl.BlockSpec((None, None, block_q, H), lambda b, n, i: (b, n, i, 0)),
        pl.BlockSpec((None, None, Tkp, H), lambda b, n, i: (b, n // G, 0, 0)),
        pl.BlockSpec((None, None, Tkp, H), lambda b, n, i: (b, n // G, 0, 0)),
    ]
    args = [qt, kt, vt]
    if not causal:
        # Padded keys are invisible (False); padded query rows see nothing and are sliced off. A causal chain
        # needs no such care: a real query i only sees keys j <= i < T.
        args.append(jnp.pad(mask.astype(jnp.int32), ((0, 0), (0, Tqp - T), (0, Tkp - Tk))))  # [B, Tqp, Tkp]
        in_specs.append(pl.BlockSpec((None, block_q, Tkp), lambda b, n, i: (b, i, 0)))

    kernel = functools.partial(_tree_kernel, sm_scale=scale, block_q=block_q, block_k=block_k, causal=causal)
    out, lse = pl.pallas_call(
        kernel,
        grid=(B, N, Tqp // block_q),
        in_specs=in_specs,
        out_specs=[
            pl.BlockSpec((None, None, block_q, H), lambda b, n, i: (b, n, i, 0)),
            pl.BlockSpec((None, None, block_q), lambda b, n, i: (b, n, i)),
        ],
        out_shape=[
            jax.ShapeDtypeStruct((B, N, Tqp, H), q.dtype),
            jax.ShapeDtypeStruct((B, N, Tqp), jnp.float32),
        ],
        compiler_params=compiler_params(3, interpret),
        interpret=interpret,
        name="tree_attention",
    )(*args)
    return out[:, :, :T].transpose(0, 2, 1, 3), lse[:, :, :T].transpose(0, 2, 1)


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
