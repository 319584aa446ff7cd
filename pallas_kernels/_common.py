"""Helpers shared by the Pallas kernels: the target platform and its knobs, kept out of the kernel bodies.

Every kernel wrapper takes `platform` ("tpu" = Mosaic TPU, "gpu" = Pallas Triton) and `interpret`
explicitly. Nothing here reads `jax.default_backend()`: a CPU host export-lowering for a TPU must build
exactly what a TPU host would (the caller, `lsjax.attention`, decides both once).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

PLATFORMS = ("tpu", "gpu")
NEG_INF = float("-inf")
LANES = 128  # TPU vreg lane count: per-row statistics are stored broadcast over one lane tile


def round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def next_pow2(x: int) -> int:
    return 1 << max(0, int(x) - 1).bit_length()


def is_pow2(x: int) -> bool:
    return x > 0 and x & (x - 1) == 0


def fold_queries(q: jax.Array, K: int, rows_to: int) -> jax.Array:
    """q [B, T, N, H] -> [B*K, rows_to, H]: each kv head's G = N/K query heads folded into its rows
    (row t*G + g), zero rows past T*G. One program then reads a key block once for all its query heads."""
    B, T, N, H = q.shape
    G = N // K
    qf = q.reshape(B, T, K, G, H).transpose(0, 2, 1, 3, 4).reshape(B * K, T * G, H)
    return jnp.pad(qf, ((0, 0), (0, rows_to - T * G), (0, 0))) if rows_to != T * G else qf


def unfold_rows(x: jax.Array, B: int, T: int, G: int) -> jax.Array:
    """[B*K, >= T*G, ...] -> [B, T, K, G, ...]: `fold_queries` undone (padding rows dropped)."""
    K = x.shape[0] // B
    x = x[:, : T * G].reshape(B, K, T, G, *x.shape[2:])
    return jnp.moveaxis(x, 2, 1)


def check_platform(platform: str) -> str:
    if platform not in PLATFORMS:
        raise ValueError(f"kernel platform must be one of {'|'.join(PLATFORMS)}, got {platform!r}")
    return platform


def dot_precision(dtype, fast_fp32=None):
    """fp32 dots at full precision: Triton's fp32 default is TF32 (10-bit mantissa), far outside 1e-5. bf16
    dots take the default (bf16 products are exact in the fp32 accumulator)."""
    return f32_precision(fast_fp32) if jnp.dtype(dtype) == jnp.float32 else None


def f32_precision(fast: bool | None):
    """How an fp32 x fp32 dot runs inside a kernel. HIGHEST is IEEE fp32 in Triton: scalar FMAs, no tensor
    cores; with the softmax weights in fp32 it made a 32-node verification at 8K context 7x an AR step on an
    H200 (docs/hardware). A compiled GPU kernel (`fast`) uses three TF32 tensor-core passes instead (about
    fp32's accuracy: the operand split into a TF32 high part and a TF32 remainder); TPU and the interpreter
    keep HIGHEST."""
    return jax.lax.DotAlgorithmPreset.TF32_TF32_F32_X3 if fast else jax.lax.Precision.HIGHEST


PV_MODES = ("highest", "tf32x3", "native")


def pv_mode(compiled_gpu: bool, v_dtype) -> str:
    """How the softmax weights p meet V. A compiled GPU kernel over a bf16/fp16 cache rounds p to V's dtype:
    one tensor-core pass, as FlashAttention does (the H100 run measured a 69-node verification at 1.09x an AR
    step this way, 3.98x on the H200 with p in fp32 as TF32x3). The rounding makes a query's output depend on
    how its keys are split into blocks and cache/tree parts by ~1e-3, so greedy bf16 output can leave AR's at
    a near tie: exactness in bf16 is batch-invariant numerics' job (`ModelConfig.invariant_rows`), which does
    not use these kernels. fp32 on a GPU: TF32x3; TPU and the interpreter: fp32 p at HIGHEST."""
    if not compiled_gpu:
        return "highest"
    return "tf32x3" if jnp.dtype(v_dtype) == jnp.float32 else "native"


def tpu_params(semantics: tuple[str, ...]):
    from jax.experimental.pallas import tpu as pltpu

    return pltpu.CompilerParams(dimension_semantics=semantics)


def triton_params(num_warps: int, num_stages: int):
    # Explicit Triton params also pin the GPU lowering: without them jax 0.10.2 routes a GPU pallas_call to
    # Mosaic GPU, whose warpgroup model these array-at-a-time kernels are not written for.
    from jax.experimental.pallas import triton as pltriton

    return pltriton.CompilerParams(num_warps=num_warps, num_stages=num_stages)


def online_step(s, vb, m, l, acc, pv: str = "highest"):
    """One key block of the online softmax. s [R, bk] fp32 scores, -inf where invisible; vb [bk, H] with
    invisible keys zeroed (they may be out-of-bounds garbage: 0 * NaN would leak). m, l [R, C] hold the
    row statistics broadcast over C columns (C = 128 lanes on TPU, 1 on GPU); acc [R, H] fp32."""
    m_new = jnp.maximum(m, jnp.max(s, axis=1, keepdims=True))
    # A row may not have seen a key yet (m = -inf): make the max safe before every exp.
    m_safe = jnp.where(m_new == NEG_INF, 0.0, m_new)
    corr = jnp.exp(m - m_safe)
    p = jnp.exp(s - m_safe[:, :1])
    l_new = corr * l + jnp.sum(p, axis=1, keepdims=True)
    # `pv`: `pv_mode` says which and why.
    dims = (((1,), (0,)), ((), ()))
    if pv == "native":
        pv = jax.lax.dot_general(p.astype(vb.dtype), vb, dims, preferred_element_type=jnp.float32)
    else:
        precision = f32_precision(pv == "tf32x3")
        pv = jax.lax.dot_general(
            p, vb.astype(jnp.float32), dims, precision=precision, preferred_element_type=jnp.float32
        )
    return m_new, l_new, acc * corr[:, :1] + pv


def scores(q, kb, sm_scale, precision):
    return (
        jax.lax.dot_general(q, kb, (((1,), (1,)), ((), ())), precision=precision, preferred_element_type=jnp.float32)
        * sm_scale
    )


def finish(m, l, acc):
    """(out [R, H], lse [R, C]) from the running statistics; a row without keys gets 0 and -inf."""
    has_keys = l > 0
    safe_l = jnp.where(has_keys, l, 1.0)
    return acc / safe_l[:, :1], jnp.where(has_keys, m + jnp.log(safe_l), NEG_INF)
