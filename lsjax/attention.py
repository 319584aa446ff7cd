"""Attention for lsjax: hybrid tree attention = prefix part + tree part, merged by LSE.

Every attention call in lsjax (target prefill, AR decode, tree verification, the
draft's self- and cross-attention) has the same two-part structure:

* the **prefix**: the T new queries attend to a committed KV cache `[0, length)`
  with no mask (keys are all in the past). Optionally keys before
  `window_start` are ignored (the draft's sliding window).
* the **tree**: the T new queries attend to the T new keys under a mask — a
  causal chain for prefill / AR decode, an ancestor mask for a speculative tree.

Each part returns `(out, lse)`; `merge_attention` combines them exactly
(LongSpec, Appendix C). Backends:

* `xla`       blocked jnp, reads only the valid cache blocks; the default on CPU.
* `pallas`    the kernels in `pallas_kernels/`; the default on TPU/GPU. Built for this host: Mosaic on
              a TPU, Triton on a GPU, the Pallas interpreter on a CPU. `pallas:tpu` / `pallas:cuda`
              build for that platform whatever the host (for `jax.export` cross-lowering from a CPU).
* `reference` the naive HF-eager equivalent: concatenate cache and tree keys,
              build the full `[T, S + T]` mask, softmax. For tests and benchmarks.

Shapes: q [B, T, N, H]; cache k/v [B, K, S, H]; tree k/v [B, T, K, H];
lengths [B] int32; window_start [B] int32; tree mask [B, T, T] bool
(mask[b, i, j] = query i may see tree key j).

The cache is heads-major ([B, K, S, H], not [B, S, K, H]) because every read of
it is a [T*G, H] x [H, S] product per KV head: with S contiguous per head the
score matmul needs no transpose (on a CPU about a third of the seq-major
layout's time: docs/design/cpu-verify-cost.md). TPU attention kernels use the
same layout.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings

import jax
import jax.numpy as jnp

from lsjax.band_attention import band_attention

NEG_INF = float("-inf")
# Keys per iteration of `prefix_attention_xla`'s loop. On a CPU each iteration costs tens of
# microseconds besides its data (a dozen small thunks), so small blocks spend most of their time
# on overhead; past ~1K keys the materialised K/V block no longer fits in L2 and a block's copy
# costs more than it saves (the sweep: docs/design/cpu-verify-cost.md).
XLA_BLOCK = 1024
BACKENDS = ("auto", "xla", "pallas", "pallas:tpu", "pallas:cuda", "reference")


def default_backend() -> str:
    return "xla" if jax.default_backend() == "cpu" else "pallas"


def _resolve(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"attention backend must be one of {'|'.join(BACKENDS)}, got {backend!r}")
    return default_backend() if backend == "auto" else backend


def kernel_target(backend: str) -> tuple[str, bool]:
    """(kernel platform, interpret) of a Pallas backend: decided here once, passed to the kernels explicitly.

    `pallas` builds for the host. A CPU host runs the Pallas interpreter on the TPU variant (the GPU one
    interprets the same math; tests run both). `pallas:tpu` / `pallas:cuda` pin the target so a CPU host
    can export-lower exactly what a TPU / GPU host would build (the host's `jax.default_backend()` is never
    consulted then).
    """
    if backend == "pallas:tpu":
        return "tpu", False
    if backend == "pallas:cuda":
        return "gpu", False
    if backend != "pallas":
        raise ValueError(f"not a Pallas backend: {backend!r}")
    host = jax.default_backend()
    if host == "tpu":
        return "tpu", False
    if host in ("gpu", "cuda", "rocm"):
        return "gpu", False
    return "tpu", True


class KernelFallbackWarning(UserWarning):
    """A Pallas kernel cannot take these shapes on this platform; the XLA attention runs instead."""


_WARNED: set = set()


def _kernel_or_xla(backend: str, head_dim: int) -> tuple[str, bool] | None:
    """(platform, interpret) for a Pallas backend, or None where the kernel cannot take `head_dim` and the XLA
    path must run: Triton needs power-of-2 array dims inside a kernel (head_dim 96 fails to compile with
    "Encountered an array of shape (16, 96)"), so a GPU falls back, once warned per head dim."""
    platform, interpret = kernel_target(backend)
    if platform == "gpu" and head_dim & (head_dim - 1):
        if head_dim not in _WARNED:
            _WARNED.add(head_dim)
            warnings.warn(
                f"head_dim {head_dim} is not a power of 2, which the Triton kernels need: attention runs on XLA",
                KernelFallbackWarning,
                stacklevel=3,
            )
        return None
    return platform, interpret


def merge_attention(out_a, lse_a, out_b, lse_b):
    """Exact merge of two partial attentions over disjoint key sets.

    out_* [B, T, N, H], lse_* [B, T, N] (fp32, natural log). A part with no keys
    has lse = -inf and must contribute nothing (and never NaN).
    """
    lse = jnp.logaddexp(lse_a, lse_b)  # [B, T, N]
    safe = jnp.where(jnp.isfinite(lse), lse, 0.0)
    w_a = jnp.where(jnp.isfinite(lse_a), jnp.exp(lse_a - safe), 0.0)
    w_b = jnp.where(jnp.isfinite(lse_b), jnp.exp(lse_b - safe), 0.0)
    out = out_a.astype(jnp.float32) * w_a[..., None] + out_b.astype(jnp.float32) * w_b[..., None]
    return out.astype(out_a.dtype), lse


def _grouped(q, num_kv_heads):
    """[B, T, N, H] -> [B, T, K, G, H] (query heads grouped by their kv head)."""
    B, T, N, H = q.shape
    return q.reshape(B, T, num_kv_heads, N // num_kv_heads, H)


# ---------------------------------------------------------------------------
# XLA backend


def prefix_attention_xla(
    q, k, v, lengths, window_start=None, *, layer=None, block_size: int | None = None, sm_scale=None, out_dtype=None
):
    """Flash-decoding in plain XLA: a while loop over the valid cache blocks only.

    k, v [B, K, S, H], or the whole multi-layer cache [L, B, K, S, H] with a
    `layer` index: blocks are then sliced straight out of it, because slicing a
    layer first makes XLA copy that layer's cache on every call (seen in the
    compiled decode step: 2 x 3.5 MB per layer per token at 4K).
    The trip count depends on `max(lengths)` (an array), so a capacity-8K
    cache holding 1K tokens costs 1K, and nothing recompiles as the cache
    grows. Returns out [B, T, N, H] (q.dtype) and lse [B, T, N] (fp32).
    """
    if layer is None:
        k, v, layer = k[None], v[None], 0
    B, T, N, H = q.shape
    K, S = k.shape[2], k.shape[3]
    G = N // K
    scale = sm_scale if sm_scale is not None else H**-0.5
    if S == 0:  # a zero-capacity cache: nothing to attend to (and no block size to divide by)
        return jnp.zeros(q.shape, out_dtype or q.dtype), jnp.full((B, T, N), NEG_INF, jnp.float32)
    block = min(block_size or XLA_BLOCK, S)
    lengths = lengths.astype(jnp.int32)
    start = jnp.zeros_like(lengths) if window_start is None else window_start.astype(jnp.int32)
    first_block = jnp.min(start) // block
    last_block = (jnp.max(lengths) + block - 1) // block
    # Fold the T queries into the head-group axis so each kv head's block is read once.
    qg = (_grouped(q, K).astype(jnp.float32) * scale).transpose(0, 2, 1, 3, 4).reshape(B, K, T * G, H)

    def body(carry):
        i, m, l, acc = carry  # m, l [B, K, TG]; acc [B, K, TG, H]
        # Block i holds keys [i * block, (i + 1) * block). When the capacity is not a multiple of the block,
        # the last block's slice is shifted back to stay inside the cache (padding would copy the cache)
        # and the keys it shares with block i - 1 are masked out below.
        lo = jnp.minimum(i * block, S - block)
        kb = jax.lax.dynamic_slice(k, (layer, 0, 0, lo, 0), (1, B, K, block, H))[0].astype(jnp.float32)
        vb = jax.lax.dynamic_slice(v, (layer, 0, 0, lo, 0), (1, B, K, block, H))[0].astype(jnp.float32)
        # kb, vb [B, K, blk, H]
        s = jnp.einsum("bkqh,bksh->bkqs", qg, kb)  # [B, K, TG, blk]
        pos = lo + jnp.arange(block)
        lower = jnp.maximum(start, i * block)
        valid = (pos[None, :] < lengths[:, None]) & (pos[None, :] >= lower[:, None])  # [B, blk]
        s = jnp.where(valid[:, None, None, :], s, NEG_INF)
        m_new = jnp.maximum(m, jnp.max(s, axis=-1))
        m_safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
        p = jnp.exp(s - m_safe[..., None])
        corr = jnp.exp(jnp.where(jnp.isfinite(m), m - m_safe, NEG_INF))
        l = l * corr + jnp.sum(p, axis=-1)
        acc = acc * corr[..., None] + jnp.einsum("bkqs,bksh->bkqh", p, vb)
        return i + 1, m_new, l, acc

    init = (
        first_block,
        jnp.full((B, K, T * G), NEG_INF, jnp.float32),
        jnp.zeros((B, K, T * G), jnp.float32),
        jnp.zeros((B, K, T * G, H), jnp.float32),
    )
    _, m, l, acc = jax.lax.while_loop(lambda c: c[0] < last_block, body, init)
    out = acc / jnp.where(l > 0, l, 1.0)[..., None]
    lse = jnp.where(l > 0, m + jnp.log(jnp.where(l > 0, l, 1.0)), NEG_INF)
    out = out.reshape(B, K, T, G, H).transpose(0, 2, 1, 3, 4).reshape(B, T, N, H)
    lse = lse.reshape(B, K, T, G).transpose(0, 2, 1, 3).reshape(B, T, N)
    return out.astype(out_dtype or q.dtype), lse


CAUSAL_BLOCK = 256  # query and key block of long causal chains (tree_attention_xla)


def tree_attention_xla(q, k, v, mask=None, *, causal: bool = False, sm_scale=None, block_q: int = 512, out_dtype=None):
    """Masked attention of the T new queries over the T new keys.

    `mask` [B, T, T] bool, or `causal=True` for a chain without materialising a
    mask. A rectangular mask [B, T, Tk] over Tk keys works too (the draft's
    frontier queries over every tree node so far). Long inputs are processed
    in query blocks so the score tensor stays [B, K, G*block_q, T]; long
    causal chains by `band_attention`.
    """
    B, T, N, H = q.shape
    K = k.shape[2]
    G = N // K
    scale = sm_scale if sm_scale is not None else H**-0.5
    if mask is None and not causal:
        raise ValueError("tree_attention needs a mask or causal=True")
    if causal and mask is None and sm_scale is None and T > CAUSAL_BLOCK * 2:
        # A long causal chain (the target's features for training, the dev loss; prefill runs 256-token chunks):
        # 256x256 blocks that skip the keys a block cannot see, ~5x faster on CPU at T = 2048 than full-width
        # query blocks.
        out, lse = band_attention(
            q, k.swapaxes(1, 2), v.swapaxes(1, 2), block_q=CAUSAL_BLOCK, block_k=CAUSAL_BLOCK, with_lse=True
        )
        return out.astype(out_dtype or q.dtype), lse
    qg = _grouped(q, K).astype(jnp.float32) * scale  # [B, T, K, G, H]
    kf, vf = k.astype(jnp.float32), v.astype(jnp.float32)

    def attend(q_blk, q_pos):  # q_blk [B, t, K, G, H], q_pos [t]
        s = jnp.einsum("btkgh,bskh->bkgts", q_blk, kf)  # [B, K, G, t, T]
        if causal:
            allowed = (jnp.arange(T)[None, :] <= q_pos[:, None])[None]  # [1, t, T]
        else:
            allowed = jnp.take(mask, q_pos, axis=1)  # [B, t, T]
        s = jnp.where(allowed[:, None, None], s, NEG_INF)
        m = jnp.max(s, axis=-1)
        m_safe = jnp.where(jnp.isfinite(m), m, 0.0)
        p = jnp.exp(s - m_safe[..., None])
        l = jnp.sum(p, axis=-1)
        o = jnp.einsum("bkgts,bskh->btkgh", p, vf) / jnp.where(l > 0, l, 1.0).transpose(0, 3, 1, 2)[..., None]
        lse = jnp.where(l > 0, m_safe + jnp.log(jnp.where(l > 0, l, 1.0)), NEG_INF)  # [B, K, G, t]
        return o.reshape(B, -1, N, H), lse.transpose(0, 3, 1, 2).reshape(B, -1, N)

    if block_q >= T:
        out, lse = attend(qg, jnp.arange(T))
    else:
        nb = -(-T // block_q)
        pad = nb * block_q - T
        qp = jnp.pad(qg, ((0, 0), (0, pad), (0, 0), (0, 0), (0, 0))).reshape(B, nb, block_q, K, G, H)
        pos = jnp.minimum(jnp.arange(nb * block_q), T - 1).reshape(nb, block_q)
        outs, lses = jax.lax.map(lambda xs: attend(xs[0], xs[1]), (qp.transpose(1, 0, 2, 3, 4, 5), pos))
        out = outs.transpose(1, 0, 2, 3, 4).reshape(B, nb * block_q, N, H)[:, :T]
        lse = lses.transpose(1, 0, 2, 3).reshape(B, nb * block_q, N)[:, :T]
    return out.astype(out_dtype or q.dtype), lse


# ---------------------------------------------------------------------------
# Reference backend: what HF eager attention computes.


def hybrid_attention_reference(
    q, cache_k, cache_v, lengths, tree_k, tree_v, tree_mask=None, *, causal=False, window_start=None, sm_scale=None
):
    B, T, N, H = q.shape
    K, S = cache_k.shape[1], cache_k.shape[2]
    scale = sm_scale if sm_scale is not None else H**-0.5
    if tree_mask is None:
        if not causal:
            raise ValueError("hybrid attention needs tree_mask or causal=True")
        tree_mask = jnp.broadcast_to(jnp.tril(jnp.ones((T, T), bool)), (B, T, T))
    start = jnp.zeros_like(lengths) if window_start is None else window_start
    pos = jnp.arange(S)
    cache_ok = (pos[None, :] < lengths[:, None]) & (pos[None, :] >= start[:, None])  # [B, S]
    full_mask = jnp.concatenate([jnp.broadcast_to(cache_ok[:, None, :], (B, T, S)), tree_mask], axis=-1)
    keys = jnp.concatenate([cache_k.swapaxes(1, 2), tree_k], axis=1).astype(jnp.float32)  # [B, S+T, K, H]
    vals = jnp.concatenate([cache_v.swapaxes(1, 2), tree_v], axis=1).astype(jnp.float32)
    keys = jnp.repeat(keys, N // K, axis=2)  # [B, S+T, N, H]
    vals = jnp.repeat(vals, N // K, axis=2)
    s = jnp.einsum("btnh,bsnh->bnts", q.astype(jnp.float32), keys) * scale
    s = jnp.where(full_mask[:, None], s, NEG_INF)
    lse = jax.nn.logsumexp(s, axis=-1)  # [B, N, T]
    p = jnp.where(jnp.isfinite(lse)[..., None], jnp.exp(s - jnp.where(jnp.isfinite(lse), lse, 0.0)[..., None]), 0.0)
    out = jnp.einsum("bnts,bsnh->btnh", p, vals)
    return out.astype(q.dtype), lse.transpose(0, 2, 1)


# ---------------------------------------------------------------------------
# Public entry points


# ------------------------------------------------------------------------------------------- on a mesh


def model_mesh():
    """The context mesh when it has a `model` axis and is not already split into per-device pieces, else None."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or "model" not in mesh.axis_names or mesh.manual_axes:
        return None
    return mesh


def head_shards(num_heads: int, num_kv_heads: int, batch: int):
    """(mesh, batch axis) when the context mesh (`jax.sharding.use_abstract_mesh`, entered by the engine for a
    `SpecConfig.mesh`) splits heads over a `model` axis of more than one device; None otherwise.

    Attention is independent per KV head, so each device attends with its own heads and its own slice of the
    cache and nothing crosses devices; the Pallas kernels only run that way (a custom call has no sharding
    rule: XLA would gather the whole cache onto every device first). Heads that do not split evenly (a draft
    narrower than the mesh) stay whole and XLA partitions what it can. Inside the per-device function the
    mesh's axes are manual, so the call below it runs plainly.
    """
    mesh = model_mesh()
    if mesh is None or mesh.shape["model"] == 1:
        return None
    M = mesh.shape["model"]
    if num_heads % M or num_kv_heads % M:
        return None
    D = mesh.shape.get("data", 1)
    return mesh, ("data" if D > 1 and batch % D == 0 else None)


def _per_shard(plan, fn, args: tuple, specs: tuple, out_specs):
    """fn(*args) under shard_map; None args and python ints are closed over (not sharded)."""
    mesh, _ = plan
    static = {i: a for i, a in enumerate(args) if a is None or isinstance(a, int)}
    dyn = [i for i in range(len(args)) if i not in static]

    def body(*xs):
        full = dict(static)
        full.update(zip(dyn, xs))
        return fn(*(full[i] for i in range(len(args))))

    return jax.shard_map(
        body,
        mesh=mesh,
        in_specs=tuple(specs[i] for i in dyn),
        out_specs=out_specs,
        check_vma=False,  # Pallas calls carry no varying-axes annotations
    )(*(args[i] for i in dyn))


@functools.cache
def prefix_tuning(platform: str, interpret: bool):
    """The prefix kernel's tuning for the device this process runs on: 4 Triton pipeline stages on Hopper GPUs
    (compute capability 9.x, where 4 stages ran 15-28% faster than 2 at 32K: docs/design/gpu.md), the
    kernel's default (2) elsewhere, whose shared memory may not hold 4 K/V blocks in flight."""
    from pallas_kernels import prefix_attention as pk

    if platform != "gpu" or interpret:
        return pk.PrefixTuning()
    try:
        major = int(str(getattr(jax.devices()[0], "compute_capability", "0")).split(".")[0])
    except (RuntimeError, ValueError):
        major = 0
    return pk.PrefixTuning(num_stages=4) if major >= 9 else pk.PrefixTuning()


def prefix_attention(
    q, k, v, lengths, window_start=None, *, layer=None, backend: str = "auto", sm_scale=None, out_dtype=None
):
    """Unmasked attention of q over the committed cache k, v [B, K, S, H] in `[window_start, length)`.

    With `layer`, k and v are the whole cache [L, B, K, S, H] and `layer` picks one. The output is in
    `out_dtype` (default q's); the lse is fp32. On a mesh with a `model` axis each device attends with its
    own heads (`head_shards`).
    """
    plan = head_shards(q.shape[2], k.shape[-3], q.shape[0])
    if plan is not None:
        d = plan[1]
        P = jax.sharding.PartitionSpec
        kv = P(None, d, "model", None, None) if k.ndim == 5 else P(d, "model", None, None)

        def one(q, k, v, lengths, window_start, layer):
            return prefix_attention(
                q, k, v, lengths, window_start, layer=layer, backend=backend, sm_scale=sm_scale, out_dtype=out_dtype
            )

        specs = (P(d, None, "model", None), kv, kv, P(d), P(d), P())
        outs = (P(d, None, "model", None), P(d, None, "model"))
        return _per_shard(plan, one, (q, k, v, lengths, window_start, layer), specs, outs)
    backend = _resolve(backend)
    target = _kernel_or_xla(backend, q.shape[-1]) if backend.startswith("pallas") else None
    if target is not None:
        from pallas_kernels import prefix_attention as pk

        platform, interpret = target
        # The whole cache and the layer go into the kernel: its index maps pick the layer's blocks, so no
        # layer is copied out of the cache first.
        return pk.prefix_attention(
            q,
            k,
            v,
            lengths,
            window_start,
            layer,
            sm_scale=sm_scale,
            platform=platform,
            interpret=interpret,
            out_dtype=out_dtype,
            tuning=prefix_tuning(platform, interpret),
        )
    if backend == "reference":
        from pallas_kernels import prefix_attention as pk

        if layer is not None:
            k, v = k[layer], v[layer]
        out, lse = pk.prefix_attention_reference(q, k, v, lengths, window_start, sm_scale=sm_scale)
        return out.astype(out_dtype or q.dtype), lse
    return prefix_attention_xla(q, k, v, lengths, window_start, layer=layer, sm_scale=sm_scale, out_dtype=out_dtype)


def tree_attention(q, k, v, mask=None, *, causal=False, backend: str = "auto", sm_scale=None, out_dtype=None):
    """Attention of the T new queries over the T new keys under a tree/causal mask.

    With a mask the keys may number Tk != T (mask [B, T, Tk]); causal needs Tk == T. Per device on a mesh
    with a `model` axis (`head_shards`).
    """
    plan = head_shards(q.shape[2], k.shape[2], q.shape[0])
    if plan is not None:
        d = plan[1]
        P = jax.sharding.PartitionSpec

        def one(q, k, v, mask):
            return tree_attention(q, k, v, mask, causal=causal, backend=backend, sm_scale=sm_scale, out_dtype=out_dtype)

        specs = (P(d, None, "model", None), P(d, None, "model", None), P(d, None, "model", None), P(d, None, None))
        outs = (P(d, None, "model", None), P(d, None, "model"))
        return _per_shard(plan, one, (q, k, v, mask), specs, outs)
    backend = _resolve(backend)
    target = _kernel_or_xla(backend, q.shape[-1]) if backend.startswith("pallas") else None
    if target is not None:
        from pallas_kernels import tree_attention as tk

        platform, interpret = target
        return tk.tree_attention(
            q,
            k,
            v,
            mask,
            causal=causal,
            sm_scale=sm_scale,
            platform=platform,
            interpret=interpret,
            out_dtype=out_dtype,
        )
    if backend == "reference":
        from pallas_kernels import tree_attention as tk

        out, lse = tk.tree_attention_reference(q, k, v, mask, causal=causal, sm_scale=sm_scale)
        return out.astype(out_dtype or q.dtype), lse
    return tree_attention_xla(q, k, v, mask, causal=causal, sm_scale=sm_scale, out_dtype=out_dtype)


@functools.partial(jax.named_call, name="hybrid_tree_attention")
def hybrid_tree_attention(
    q,
    cache_k,
    cache_v,
    lengths,
    tree_k,
    tree_v,
    tree_mask=None,
    *,
    causal: bool = False,
    window_start=None,
    layer=None,
    backend: str = "auto",
    sm_scale=None,
    out_dtype=None,
):
    """q [B,T,N,H] over cache [0, lengths) (no mask) + tree keys (tree_mask or causal), exact LSE merge.

    With `layer`, cache_k/v are the whole cache [L, B, K, S, H]. `backend="reference"`
    computes the naive masked attention in one softmax instead. Returns out [B, T, N, H] in `out_dtype`
    (default q's). The two parts are merged in fp32: rounding each to bf16 first would make a query's
    output depend on where the cache/tree split falls, which differs between AR and verification.
    """
    backend = _resolve(backend)
    if backend == "reference":
        if layer is not None:
            cache_k, cache_v = cache_k[layer], cache_v[layer]
        out, _ = hybrid_attention_reference(
            q,
            cache_k,
            cache_v,
            lengths,
            tree_k,
            tree_v,
            tree_mask,
            causal=causal,
            window_start=window_start,
            sm_scale=sm_scale,
        )
        return out.astype(out_dtype or q.dtype)
    f32 = jnp.float32
    out_p, lse_p = prefix_attention(
        q, cache_k, cache_v, lengths, window_start, layer=layer, backend=backend, sm_scale=sm_scale, out_dtype=f32
    )
    out_t, lse_t = tree_attention(
        q, tree_k, tree_v, tree_mask, causal=causal, backend=backend, sm_scale=sm_scale, out_dtype=f32
    )
    out, _ = merge_attention(out_p, lse_p, out_t, lse_t)
    return out.astype(out_dtype or q.dtype)


# ------------------------------------------------------------------------------- batch-invariant numerics


def tree_ancestors(tree_mask, depth, max_depth: int):
    """anc [B, T, max_depth + 1]: anc[b, i, d] = the node at depth d on node i's path (i itself at its own
    depth); 0 where the path has no node at d (the caller masks those slots)."""
    at = tree_mask[..., None] & (depth[:, None, :, None] == jnp.arange(max_depth + 1))  # [B, T(i), T(j), D]
    return jnp.argmax(at, axis=2).astype(jnp.int32)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class InvariantPlan:
    """Where each query's keys come from under batch-invariant numerics: one per forward, shared by its layers
    (`invariant_plan`). R queries, W = R window positions each, S cache slots."""

    below: jax.Array  # [B, R, 1, 1, S] bool: cache slot s is in the query's first part (s < pos - R + 1)
    bound: jax.Array  # [B, R] int32: that first part as a range, slots [0, bound) (the kernel's form)
    slot: jax.Array  # [B, R, W] int32: the cache slot of each window position (clipped)
    node: jax.Array  # [B, R, W] int32: the tree node holding each window position at or past the cache length
    in_cache: jax.Array  # [B, R, W, 1, 1] bool: the window position is below the cache length
    valid: jax.Array  # [B, R, 1, 1, W] bool: the window position is >= 0


def invariant_plan(tree_mask, positions, lengths, capacity: int) -> InvariantPlan:
    """The index arrays of `invariant_tree_attention` for tree_mask [B, R, R], positions [B, R] (lengths +
    depth), lengths [B], a cache of `capacity` slots."""
    R = positions.shape[1]
    lengths = lengths.astype(jnp.int32)
    pos = positions.astype(jnp.int32)
    low = pos - (R - 1)  # the window's first position: everything below it is in the cache in any step
    x = low[:, :, None] + jnp.arange(R)  # [B, R, W] absolute positions of the window
    rel = x - lengths[:, None, None]  # < 0: in the cache; else the depth of the path node holding it
    anc = tree_ancestors(tree_mask, pos - lengths[:, None], R - 1)  # [B, R, R]
    return InvariantPlan(
        below=(jnp.arange(capacity)[None, None, :] < low[:, :, None])[:, :, None, None, :],
        bound=jnp.clip(low, 0, capacity),
        slot=jnp.clip(x, 0, capacity - 1),
        node=jnp.take_along_axis(anc, jnp.clip(rel, 0, R - 1), axis=2),
        in_cache=(rel < 0)[..., None, None],
        valid=(x >= 0)[:, :, None, None, :],
    )


INVARIANT_CHUNK = 4096  # cache slots per part under batch-invariant numerics: bounds the [R, N, chunk] scores


def invariant_chunk(capacity: int) -> int:
    """The cache part's chunk for a cache of `capacity` slots: INVARIANT_CHUNK halved until it divides it."""
    chunk = min(INVARIANT_CHUNK, capacity)
    while capacity % chunk:
        chunk //= 2
    return max(chunk, 1)


def _invariant_kernel(backend: str, q, num_kv_heads: int) -> bool | None:
    """Whether the cache part of `invariant_tree_attention` runs as the Pallas kernel, and interpreted; None:
    XLA. The kernel has a Triton variant only (compiled on a GPU, interpreted on a CPU host for tests); a TPU
    and a head dim Triton cannot take (one warning) run XLA, and so does a model mesh (no per-shard call yet)."""
    backend = _resolve(backend)
    if not backend.startswith("pallas") or head_shards(q.shape[2], num_kv_heads, q.shape[0]) is not None:
        return None
    target = _kernel_or_xla(backend, q.shape[-1])
    if target is None or target == ("tpu", False):
        return None
    return target[1]


def invariant_tree_attention(
    q, cache_k, cache_v, tree_k, tree_v, plan: InvariantPlan, *, layer, sm_scale=None, backend: str = "xla"
):
    """Attention whose output for a query depends on its position and the keys at positions [0, pos] only,
    never on where the cache ends or on the other queries: AR (cache [0, pos), the query alone) and a
    verification forward (cache [0, p), the query's ancestors in the tree) give the same bits.

    Why: an attention split into a cache part and a tree part sums each query's keys in another grouping in
    AR than in verification (the cache ends at another place), so the two differ in the last bits; in bf16
    every later rounding can turn that into a bf16-sized difference and a greedy tie can flip. Here every
    query with R = q.shape[1] rows sees fixed parts: the cache keys [0, pos - R + 1), masked, in chunks of
    every S slot at fixed bounds (a tree is at most R - 1 deep, so these are in the cache in any step), then
    the R positions [pos - R + 1, pos] gathered per query from the cache below the length and from the
    query's path in the tree above it, merged by one online softmax in that order (a part a query sees none
    of leaves it exactly as it was). The shapes depend on R and S only, so a forward padded to R rows runs the
    same operations in every step.

    q [B, R, N, H]; cache_k/v [L, B, K, S, H] (read at `layer`); tree_k/v [B, R, K, H]; `plan` from
    `invariant_plan`. Returns fp32 [B, R, N, H]. `backend`: a Pallas backend runs the cache part as one kernel
    (`pallas_kernels.invariant_attention`; `_invariant_kernel` says where), with its own fixed key blocks: the
    bits differ from XLA's, and AR and verification stay equal because every forward of a model takes one path.
    """
    B, R, N, H = q.shape
    K = cache_k.shape[2]
    f32 = jnp.float32
    scale = sm_scale if sm_scale is not None else H**-0.5
    precision = jax.lax.Precision.HIGHEST if q.dtype == f32 else None
    ck, cv = cache_k[layer], cache_v[layer]  # [B, K, S, H]
    qg = _grouped(q, K)  # [B, R, K, G, H]

    def window(cache, tree):  # -> [B, R, W, K, H]
        # One gather from the whole stacked cache: no layer is sliced out first (the kernel path reads none).
        from_cache = cache[layer, jnp.arange(B)[:, None, None], :, plan.slot]  # [B, R, W, K, H]
        from_tree = jax.vmap(lambda t, n: t[n])(tree, plan.node)  # t [R, K, H]
        return jnp.where(plan.in_cache, from_cache, from_tree.astype(cache.dtype))

    hi = jax.lax.Precision.HIGHEST

    def update(carry, s, ok, vals, pv_spec):  # one part of the online softmax, in a fixed order per query
        m, l, acc = carry
        m_new = jnp.maximum(m, jnp.max(jnp.where(ok, s, NEG_INF), axis=-1))
        safe = jnp.where(m_new == NEG_INF, 0.0, m_new)
        # A part with no visible key leaves the statistics exactly as they were (alpha = 1, adds 0).
        alpha = jnp.where(m == NEG_INF, 0.0, jnp.exp(m - safe))
        p = jnp.where(ok, jnp.exp(s - safe[..., None]), 0.0)
        pv = jnp.einsum(pv_spec, p, vals.astype(f32), precision=hi)
        return m_new, alpha * l + jnp.sum(p, axis=-1), alpha[..., None] * acc + pv

    def cache_chunk(carry, start):  # cache slots [start, start + chunk): fixed bounds, whatever the length
        keys = jax.lax.dynamic_slice_in_dim(ck, start, chunk, axis=2)
        vals = jax.lax.dynamic_slice_in_dim(cv, start, chunk, axis=2)
        ok = jax.lax.dynamic_slice_in_dim(plan.below, start, chunk, axis=4)
        s = jnp.einsum("brkgh,bksh->brkgs", qg, keys, precision=precision, preferred_element_type=f32) * scale
        return update(carry, s, ok, vals, "brkgs,bksh->brkgh"), None

    S = ck.shape[2]
    chunk = invariant_chunk(S)
    G = N // K
    interpret = _invariant_kernel(backend, q, K)
    if interpret is not None:
        from pallas_kernels import invariant_attention as ik

        carry = ik.invariant_cache_attention(
            q, cache_k, cache_v, plan.bound, layer, sm_scale=scale, interpret=interpret
        )
    else:
        carry = (jnp.full((B, R, K, G), NEG_INF, f32), jnp.zeros((B, R, K, G), f32), jnp.zeros((B, R, K, G, H), f32))
        starts = list(range(0, S, chunk))
        if len(starts) <= 8:  # unrolled: a GPU step at short context is bound by launches, not a loop's bookkeeping
            for start in starts:
                carry, _ = cache_chunk(carry, start)
        else:
            carry, _ = jax.lax.scan(cache_chunk, carry, jnp.asarray(starts, jnp.int32))
    kw, vw = window(cache_k, tree_k), window(cache_v, tree_v)
    s2 = jnp.einsum("brkgh,brwkh->brkgw", qg, kw, precision=precision, preferred_element_type=f32) * scale
    _, denom, acc = update(carry, s2, plan.valid, vw, "brkgw,brwkh->brkgh")  # every query sees itself: denom > 0
    return (acc / denom[..., None]).reshape(B, R, N, H)
