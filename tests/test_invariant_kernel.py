"""The batch-invariant cache kernel (`pallas_kernels.invariant_attention`, Pallas interpreter on this CPU): it
matches its naive reference, a row's bits depend on that row alone (not on its tile, the other rows or the
cache past its bound), and a model whose invariant forwards take the kernel still gives every verified node
AR's logits bit for bit."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lsjax import attention
from pallas_kernels import invariant_attention as ik
from tests.test_invariant import ar_and_verify_logits

TOL = {jnp.float32: 1e-5, jnp.bfloat16: 1e-2}
SHAPES = {"smollm2": (9, 3, 64), "llama": (32, 8, 128)}  # query heads, kv heads, head dim


def inputs(heads, R, S, dtype, seed=0, B=2, L=3):
    N, K, H = SHAPES[heads]
    keys = jax.random.split(jax.random.key(seed), 4)
    q = jax.random.normal(keys[0], (B, R, N, H), jnp.float32).astype(dtype)
    k = jax.random.normal(keys[1], (L, B, K, S, H), jnp.float32).astype(dtype)
    v = jax.random.normal(keys[2], (L, B, K, S, H), jnp.float32).astype(dtype)
    bounds = jax.random.randint(keys[3], (B, R), 0, S + 1).at[0, 0].set(0).at[-1, -1].set(S)
    return q, k, v, bounds


def poison_past(k, bounds):
    """NaN in every slot past each sequence's largest bound: a read of one would show in every output."""
    top = jnp.max(bounds, axis=1)  # [B]
    past = jnp.arange(k.shape[3]) >= top[:, None]  # [B, S]
    return jnp.where(past[None, :, None, :, None], jnp.nan, k)


slow = pytest.mark.slow
# The default run takes two points (each kind of head, each dtype); `-m slow` the rest of the sweep.
CASES = [
    pytest.param("smollm2", 16, 130, jnp.float32, id="smollm2-16-fp32"),
    pytest.param("llama", 69, 96, jnp.bfloat16, id="llama-69-bf16"),
    pytest.param("smollm2", 1, 200, jnp.float32, id="smollm2-1-fp32", marks=slow),
    pytest.param("smollm2", 1, 200, jnp.bfloat16, id="smollm2-1-bf16", marks=slow),
    pytest.param("smollm2", 16, 130, jnp.bfloat16, id="smollm2-16-bf16", marks=slow),
    pytest.param("llama", 69, 96, jnp.float32, id="llama-69-fp32", marks=slow),
    pytest.param("smollm2", 128, 64, jnp.float32, id="smollm2-128-fp32", marks=slow),
    pytest.param("smollm2", 128, 64, jnp.bfloat16, id="smollm2-128-bf16", marks=slow),
]


@pytest.mark.parametrize("heads, R, S, dtype", CASES)
def test_the_kernel_matches_its_reference(heads, R, S, dtype):
    q, k, v, bounds = inputs(heads, R, S, dtype)
    layer = 2  # not layer 0 of the stacked cache
    poisoned = poison_past(k, bounds), poison_past(v, bounds)
    state = ik.invariant_cache_attention(q, *poisoned, bounds, layer, interpret=True)
    out, lse = ik.output_of(*state)
    want, want_lse = ik.invariant_cache_attention_reference(q, k, v, bounds, layer)
    assert np.isfinite(np.asarray(out)).all()
    scale = float(jnp.max(jnp.abs(want)))
    np.testing.assert_allclose(out, want, rtol=0, atol=TOL[dtype] * scale)
    np.testing.assert_allclose(lse, want_lse, rtol=TOL[dtype], atol=TOL[dtype])
    sees_none = np.asarray(bounds == 0)
    assert np.all(np.asarray(out)[sees_none] == 0) and np.all(np.isneginf(np.asarray(lse)[sees_none]))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["fp32", "bf16"])
def test_a_rows_bits_depend_on_that_row_alone(dtype):
    """The query of row 3 moved to row 100 (another row tile), every other query and bound changed, and the
    cache between its bound and the others' changed: its statistics are the same bits."""
    R, S = 128, 300
    q, k, v, bounds = inputs("smollm2", R, S, dtype, B=1)
    bounds = bounds.at[0, 3].set(130)
    first = ik.invariant_cache_attention(q, k, v, bounds, 1, interpret=True)
    q2, k2, v2, bounds2 = inputs("smollm2", R, S, dtype, seed=1, B=1)
    bounds2 = bounds2.at[0, 100].set(130).at[0, 0].set(S)  # another row reads the cache up to S
    q2 = q2.at[0, 100].set(q[0, 3])
    k2 = k2.at[:, :, :, :130].set(k[:, :, :, :130])  # the same keys below the bound, other ones past it
    v2 = v2.at[:, :, :, :130].set(v[:, :, :, :130])
    second = ik.invariant_cache_attention(q2, k2, v2, bounds2, 1, interpret=True)
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(np.asarray(a)[0, 3], np.asarray(b)[0, 100])


def test_the_bit_check_can_fail():
    """A key block size that follows the tile (what a kernel tuned per shape would do) gives other bits."""
    R, S = 16, 600
    q, k, v, bounds = inputs("smollm2", R, S, jnp.float32, B=1)
    bounds = bounds.at[0, 3].set(S)
    first = ik.invariant_cache_attention(q, k, v, bounds, 1, interpret=True)
    saved = ik.BLOCK_K
    try:
        ik.BLOCK_K = 16
        jax.clear_caches()
        second = ik.invariant_cache_attention(q, k, v, bounds, 1, interpret=True)
    finally:
        ik.BLOCK_K = saved
        jax.clear_caches()
    assert not np.array_equal(np.asarray(first[2])[0, 3], np.asarray(second[2])[0, 3])


@pytest.mark.parametrize("dtype", ["float32", pytest.param("bfloat16", marks=slow)])
def test_verification_through_the_kernel_gives_each_node_ar_logits_bit_for_bit(dtype, monkeypatch):
    traced = []  # the kernel ran (was traced into the forwards), whatever its bits are against XLA's

    def spy(*args, **kwargs):
        traced.append(kwargs.get("interpret"))
        return real(*args, **kwargs)

    real = ik.invariant_cache_attention
    monkeypatch.setattr(ik, "invariant_cache_attention", spy)
    ar, verified = ar_and_verify_logits(dtype, rows=24, backend="pallas")
    np.testing.assert_array_equal(verified, ar)
    assert traced and all(traced)  # interpreted on this CPU host
    traced.clear()
    xla_ar, _ = ar_and_verify_logits(dtype, rows=24)
    assert not traced
    tol = 2e-4 if dtype == "float32" else 5e-2
    # (Its 64-key blocks may round otherwise than XLA's chunks, or not: on the EPYC 9B14 they differed in the
    # last bits; on 2026-12-03's EPYC, whose flags list no AVX-512, they were equal.)
    np.testing.assert_allclose(ar, xla_ar, rtol=0, atol=tol * np.abs(xla_ar).max())


def test_the_kernel_runs_only_where_it_has_a_variant():
    q = jnp.zeros((1, 4, 8, 64), jnp.float32)
    assert attention._invariant_kernel("pallas:cuda", q, 2) is False  # compiled Triton
    assert attention._invariant_kernel("pallas", q, 2) is True  # this CPU: interpreted
    assert attention._invariant_kernel("pallas:tpu", q, 2) is None  # no Mosaic variant: XLA
    assert attention._invariant_kernel("xla", q, 2) is None
    with pytest.warns(attention.KernelFallbackWarning):
        attention._WARNED.discard(96)
        assert attention._invariant_kernel("pallas:cuda", jnp.zeros((1, 4, 8, 96)), 2) is None
