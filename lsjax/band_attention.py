"""Training-mode attention by sequence index: causal, with a lag and an optional window, in query blocks.

The draft's training forward uses it twice: windowed self-attention (the ring cache's window, seen all at
once) and flash-noisy cross-attention on the target's K/V at lag j. Inference never calls it: trees and
caches go through `lsjax.attention` (prefix + tree parts merged by LSE).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

NEG_INF = float("-inf")


def band_attention(
    q,
    k,
    v,
    *,
    shift=0,
    window: int | None = None,
    block_q: int = 512,
    block_k: int | None = None,
    with_lse: bool = False,
):
    """Causal attention with a lag and an optional window, by sequence index.

    q [B, T, N, H]; k, v [B, K, S, H] (heads-major, like the caches), key s for
    sequence index s. Query t sees keys s with `t - window <= s <= t - shift`
    (no lower bound when window is None). `shift` may be a traced int32 scalar.
    A query that sees no key gets exactly zero. Returns [B, T, N, H] in q.dtype
    (fp32 inside); with `with_lse` also the log-sum-exp of each row's scores
    [B, T, N] (fp32, -inf where a row sees no key), for merging with another
    part of the keys (`lsjax.attention.merge_attention`).

    A map over query blocks of `block_q`; each block is rematerialised under
    autodiff, so the backward pass never stores [T, S] probabilities. With a
    window that is short next to S, a block's keys are one static slice of
    window + block_q keys. Otherwise the block runs an online softmax over key
    blocks of `block_k` (default block_q) and skips, with `lax.cond`, the key
    blocks no row of it can see: for the causal lagged cross-attention that
    halves the work at long T.
    """
    B, T, N, H = q.shape
    K, S = k.shape[1], k.shape[2]
    G = N // K
    scale = H**-0.5
    bq = min(block_q, T)
    nb = -(-T // bq)
    Tp = nb * bq
    shift = jnp.asarray(shift, jnp.int32)
    qg = q.astype(jnp.float32).reshape(B, T, K, G, H) * scale
    qg = jnp.pad(qg, ((0, 0), (0, Tp - T), (0, 0), (0, 0), (0, 0)))
    qg = qg.reshape(B, nb, bq, K, G, H).swapaxes(0, 1)  # [nb, B, bq, K, G, H]
    kf, vf = k.astype(jnp.float32), v.astype(jnp.float32)

    def allowed_at(t, s_idx):  # [bq, s] bool
        ok = (s_idx[None, :] >= 0) & (s_idx[None, :] < S) & (s_idx[None, :] <= t[:, None] - shift)
        if window is not None:
            ok &= s_idx[None, :] >= t[:, None] - window
        return ok

    if window is not None and window + bq < S:
        # Left-pad by the window so block i's keys are the static-size slice [i*bq, i*bq + W + bq),
        # i.e. sequence indices [i*bq - W, i*bq + bq); right-pad so the last slice stays in bounds.
        span = window + bq
        right = max(0, Tp - S)
        kf = jnp.pad(kf, ((0, 0), (0, 0), (window, right), (0, 0)))
        vf = jnp.pad(vf, ((0, 0), (0, 0), (window, right), (0, 0)))

        @jax.checkpoint
        def attend(q_blk, i):  # q_blk [B, bq, K, G, H]
            kb = jax.lax.dynamic_slice_in_dim(kf, i * bq, span, axis=2)
            vb = jax.lax.dynamic_slice_in_dim(vf, i * bq, span, axis=2)
            allowed = allowed_at(i * bq + jnp.arange(bq), i * bq - window + jnp.arange(span))
            s = jnp.where(allowed, jnp.einsum("bqkgh,bksh->bkgqs", q_blk, kb), NEG_INF)
            # The softmax does not depend on the max it subtracts: no gradient through it (and no NaN
            # from rows that see nothing, whose max is -inf).
            m = jax.lax.stop_gradient(jnp.max(s, axis=-1, keepdims=True))
            m_safe = jnp.where(jnp.isfinite(m), m, 0.0)
            p = jnp.exp(s - m_safe)
            l = jnp.sum(p, axis=-1, keepdims=True)
            out = jnp.einsum("bkgqs,bksh->bqkgh", p / jnp.where(l > 0, l, 1.0), vb)
            return out, _lse(m_safe[..., 0], l[..., 0])

    else:
        bk = min(block_k or bq, S)
        nk = -(-S // bk)
        kb_all = jnp.pad(kf, ((0, 0), (0, 0), (0, nk * bk - S), (0, 0))).reshape(B, K, nk, bk, H)
        vb_all = jnp.pad(vf, ((0, 0), (0, 0), (0, nk * bk - S), (0, 0))).reshape(B, K, nk, bk, H)
        kb_all, vb_all = jnp.moveaxis(kb_all, 2, 0), jnp.moveaxis(vb_all, 2, 0)  # [nk, B, K, bk, H]

        @jax.checkpoint
        def attend(q_blk, i):
            t = i * bq + jnp.arange(bq)
            hi = i * bq + bq - 1 - shift  # the last key any row of the block may see
            lo = i * bq - window if window is not None else 0

            def update(carry, kb, vb, c):
                m, l, acc = carry  # m, l [B, K, G, bq]; acc [B, K, G, bq, H]
                s = jnp.einsum("bqkgh,bksh->bkgqs", q_blk, kb)
                s = jnp.where(allowed_at(t, c * bk + jnp.arange(bk)), s, NEG_INF)
                # Online softmax; the running max is a constant for autodiff (the result does not depend on it).
                m_new = jax.lax.stop_gradient(jnp.maximum(m, jnp.max(s, axis=-1)))
                m_safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
                p = jnp.exp(s - m_safe[..., None])
                corr = jnp.exp(jnp.where(jnp.isfinite(m), m - m_safe, NEG_INF))
                l = l * corr + jnp.sum(p, axis=-1)
                acc = acc * corr[..., None] + jnp.einsum("bkgqs,bksh->bkgqh", p, vb)
                return m_new, l, acc

            def step(carry, xs):
                kb, vb, c = xs
                needed = (c * bk <= hi) & (c * bk + bk - 1 >= lo)
                return jax.lax.cond(needed, lambda cr: update(cr, kb, vb, c), lambda cr: cr, carry), None

            init = (
                jnp.full((B, K, G, bq), NEG_INF, jnp.float32),
                jnp.zeros((B, K, G, bq), jnp.float32),
                jnp.zeros((B, K, G, bq, H), jnp.float32),
            )
            (m, l, acc), _ = jax.lax.scan(step, init, (kb_all, vb_all, jnp.arange(nk)))
            out = acc / jnp.where(l > 0, l, 1.0)[..., None]
            return out.transpose(0, 3, 1, 2, 4), _lse(jnp.where(jnp.isfinite(m), m, 0.0), l)  # [B, bq, K, G, H]

    out, lse = jax.lax.map(lambda xs: attend(*xs), (qg, jnp.arange(nb)))  # [nb, B, bq, K, G, H], [nb, B, bq, K, G]
    out = out.swapaxes(0, 1).reshape(B, Tp, N, H)[:, :T].astype(q.dtype)
    if not with_lse:
        return out
    return out, lse.swapaxes(0, 1).reshape(B, Tp, N)[:, :T]


def _lse(m, l):
    """log sum exp of a row's scores from its max m and sum l of exp(s - m) [B, K, G, bq] -> [B, bq, K, G]."""
    return jnp.where(l > 0, m + jnp.log(jnp.where(l > 0, l, 1.0)), NEG_INF).transpose(0, 3, 1, 2)
