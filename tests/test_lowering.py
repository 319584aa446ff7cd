"""The Pallas kernels lower for TPU (Mosaic) and CUDA (Pallas Triton), checked from this CPU without hardware.

`jax.export` lowers a function for a platform other than the host's. The Mosaic lowering asks the TPU's
kind and the Triton lowering the GPU's: `lsjax.bench.lowering` names the chip through an abstract mesh (the
kinds below; an H100 for CUDA), which JAX 0.10 and 0.11 both read; for CUDA, export refuses to serialize a
Triton custom call unless told to (that refusal is not a lowering failure). What this proves: the kernels
pass Pallas' lowering rules for each target (Mosaic's block-shape and layout rules at the Pallas level,
Triton's power-of-2 shapes) and the exported module has the shape we want (the kernel custom calls, no copy
of a cache layer in front of them). What it does not: Mosaic's own compiler passes run inside libtpu and
PTX compilation inside XLA's GPU backend, so a kernel can still fail to compile, or be slow, on hardware.

The grid of the issue (B x T x S x dtype x mask/causal x layer) is lowered kernel by kernel: the prefix
kernel does not depend on the tree mask and the tree kernel depends on neither S nor the layer, so the 96
prefix and 32 tree exports per platform cover every point of the 192-point product of `hybrid_tree_attention`
at half the cost. The TPU kind only steers a few lowering rules (rank-1 blocks, bf16 support), so the default
run spreads the four kinds over the grid so that each kind sees every value of every axis;
`-m slow` lowers the whole grid for every kind. Whole hybrid calls and the SmolLM2 verify forward are
exported for every target too.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re

import jax
import jax.numpy as jnp
import pytest

from lsjax import attention
from lsjax.bench.lowering import TPU_KINDS, export_text
from lsjax.cache import KVCache
from lsjax.config import ModelConfig
from lsjax.engine import verify
from lsjax.models import target
from lsjax.tree import Tree
from pallas_kernels import prefix_attention as pk

BATCHES, TREES, CAPACITIES, DTYPES = (1, 4), (1, 16, 32, 69), (8192, 32768, 20000), (jnp.float32, jnp.bfloat16)
N, K, H, L = 32, 8, 128, 4  # Llama-3.1-8B's attention shapes, a 4-layer cache
CUSTOM_CALL = {"tpu": "tpu_custom_call", "cuda": "xla.gpu.triton"}
BACKEND = {"tpu": "pallas:tpu", "cuda": "pallas:cuda"}
sds = jax.ShapeDtypeStruct


def layer_copies(text: str, per_layer_shape: tuple[int, ...]) -> list[str]:
    """Ops of the exported module that produce one whole layer of the cache ([1, B, K, S, H] or [B, K, S, H])
    by slicing or gathering it out of the multi-layer cache: the copy the kernels must not need."""
    dims = "x".join(map(str, per_layer_shape))
    pattern = re.compile(rf"tensor<(1x)?{dims}x")
    found = []
    for line in text.splitlines():
        if any(op in line for op in ("dynamic_slice", "stablehlo.slice", "gather")):
            result = line.rsplit("->", 1)[-1]
            if pattern.search(result):
                found.append(line.strip()[:200])
    return found


def cache_sized_results(text: str, numel: int) -> list[str]:
    """Ops that produce a tensor as large as one layer of the cache (>= numel elements), other than a
    reshape (a bitcast): any slice, pad, transpose or copy of the cache in front of the kernel shows up."""
    found = []
    for line in text.splitlines():
        m = re.match(r"\s*%[\w#:]+ = (\"?[\w.]+)", line)
        if not m or m.group(1) in ("stablehlo.reshape", "call", "func.call"):
            continue
        result = line.rsplit("->", 1)[-1] if "->" in line else line.rsplit(":", 1)[-1]
        for dims in re.findall(r"tensor<((?:\d+x)+)\w+>", result):
            if math.prod(int(d) for d in dims.rstrip("x").split("x")) >= numel:
                found.append(line.strip()[:200])
    return found


def prefix_fn(platform: str, with_layer: bool):
    if with_layer:
        return lambda q, k, v, n, w, i: attention.prefix_attention(q, k, v, n, w, layer=i, backend=BACKEND[platform])
    return lambda q, k, v, n, w: attention.prefix_attention(q, k, v, n, w, backend=BACKEND[platform])


def prefix_args(B, T, S, dtype, with_layer):
    cache = (L, B, K, S, H) if with_layer else (B, K, S, H)
    args = [sds((B, T, N, H), dtype), sds(cache, dtype), sds(cache, dtype), sds((B,), jnp.int32)]
    return args + [sds((B,), jnp.int32)] + ([sds((), jnp.int32)] if with_layer else [])


def tree_fn(platform: str, causal: bool):
    if causal:
        return lambda q, k, v: attention.tree_attention(q, k, v, causal=True, backend=BACKEND[platform])
    return lambda q, k, v, m: attention.tree_attention(q, k, v, m, backend=BACKEND[platform])


def tree_args(B, T, dtype, causal):
    args = [sds((B, T, N, H), dtype), sds((B, T, K, H), dtype), sds((B, T, K, H), dtype)]
    return args if causal else args + [sds((B, T, T), jnp.bool_)]


def prefix_grid():
    """(B, T, S, dtype, with_layer, index of a TPU kind): a Latin-square kind so each sees every axis value."""
    axes = (BATCHES, TREES, CAPACITIES, DTYPES, (False, True))
    for idx in itertools.product(*(range(len(a)) for a in axes)):
        yield (*(a[i] for a, i in zip(axes, idx)), sum(idx) % len(TPU_KINDS))


def tree_grid():
    axes = (BATCHES, TREES, DTYPES, (False, True))
    for idx in itertools.product(*(range(len(a)) for a in axes)):
        yield (*(a[i] for a, i in zip(axes, idx)), sum(idx) % len(TPU_KINDS))


def check_prefix(platform, kind, B, T, S, dtype, with_layer):
    text = export_text(prefix_fn(platform, with_layer), prefix_args(B, T, S, dtype, with_layer), platform, kind)
    calls = [line for line in text.splitlines() if CUSTOM_CALL[platform] in line and "custom_call" in line]
    assert len(calls) == 1, f"expected one {CUSTOM_CALL[platform]} call, found {len(calls)}"
    # The cache goes into the kernel as it is: nothing cache-sized is sliced, padded or copied in front of it.
    copies = cache_sized_results(text, B * K * S * H)
    assert not copies, f"cache-sized copies before the kernel: {copies}"


def check_tree(platform, kind, B, T, dtype, causal):
    text = export_text(tree_fn(platform, causal), tree_args(B, T, dtype, causal), platform, kind)
    assert text.count(CUSTOM_CALL[platform]) >= 1, f"no {CUSTOM_CALL[platform]} call"


def run_grid(platform, kinds_for):
    failures = []
    for B, T, S, dtype, with_layer, k in prefix_grid():
        for kind in kinds_for(k):
            try:
                check_prefix(platform, kind, B, T, S, dtype, with_layer)
            except Exception as e:  # collect every failing case, not only the first
                failures.append(f"prefix {kind} B{B} T{T} S{S} {jnp.dtype(dtype).name} layer={with_layer}: {e}"[:600])
    for B, T, dtype, causal, k in tree_grid():
        for kind in kinds_for(k):
            try:
                check_tree(platform, kind, B, T, dtype, causal)
            except Exception as e:
                failures.append(f"tree {kind} B{B} T{T} {jnp.dtype(dtype).name} causal={causal}: {e}"[:600])
    assert not failures, f"{len(failures)} cases failed to lower:\n" + "\n".join(failures)


@pytest.mark.jax011
@pytest.mark.parametrize("platform", ["tpu", "cuda"])
def test_grid_lowers(platform):
    """Every grid point lowers; on TPU each point under one of the four chip kinds (see the module doc)."""
    run_grid(platform, lambda k: [TPU_KINDS[k] if platform == "tpu" else None])


@pytest.mark.slow
def test_grid_lowers_for_every_tpu_kind():
    run_grid("tpu", lambda k: TPU_KINDS)


HYBRID_CASES = [  # (B, T, S, dtype, causal, with_layer)
    (4, 69, 32768, jnp.bfloat16, False, True),
    (1, 1, 20000, jnp.float32, True, False),
    (1, 256, 32768, jnp.bfloat16, True, True),  # a prefill chunk (decoding.PREFILL_CHUNK): 1024 query rows
]


@pytest.mark.parametrize("case", HYBRID_CASES, ids=lambda c: f"B{c[0]}-T{c[1]}-S{c[2]}-causal{c[4]}-layer{c[5]}")
@pytest.mark.parametrize("platform, kind", [("tpu", kind) for kind in TPU_KINDS] + [("cuda", None)])
def test_hybrid_tree_attention_lowers(platform, kind, case):
    B, T, S, dtype, causal, with_layer = case
    cache = (L, B, K, S, H) if with_layer else (B, K, S, H)
    args = [sds((B, T, N, H), dtype), sds(cache, dtype), sds(cache, dtype), sds((B,), jnp.int32)]
    args += [sds((B, T, K, H), dtype), sds((B, T, K, H), dtype)]
    mask = [] if causal else [sds((B, T, T), jnp.bool_)]
    layer = [sds((), jnp.int32)] if with_layer else []

    def fn(q, ck, cv, n, tk, tv, *rest):
        m = None if causal else rest[0]
        i = rest[-1] if with_layer else None
        return attention.hybrid_tree_attention(
            q, ck, cv, n, tk, tv, m, causal=causal, layer=i, backend=BACKEND[platform]
        )

    text = export_text(fn, args + mask + layer, platform, kind)
    assert text.count(CUSTOM_CALL[platform]) >= 2, "expected the prefix and the tree kernel"
    assert not layer_copies(text, (B, K, S, H))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", [(9, 3, 64), (N, K, H)], ids=["smollm2", "llama"])
def test_invariant_attention_lowers_for_cuda_with_one_kernel(heads, dtype):
    """Batch-invariant attention with a Pallas backend: the cache part is one Triton call per layer reading the
    whole stacked cache (no layer copied out), at 128 rows and an 8K cache."""
    n, k, h = heads
    B, R, S = 1, 128, 8192
    cache = sds((L, B, k, S, h), dtype)
    tree = sds((B, R, k, h), dtype)

    def fn(q, ck, cv, tk, tv, mask, positions, lengths, i):
        plan = attention.invariant_plan(mask, positions, lengths, S)
        return attention.invariant_tree_attention(q, ck, cv, tk, tv, plan, layer=i, backend="pallas:cuda")

    args = [sds((B, R, n, h), dtype), cache, cache, tree, tree, sds((B, R, R), jnp.bool_)]
    args += [sds((B, R), jnp.int32), sds((B,), jnp.int32), sds((), jnp.int32)]
    text = export_text(fn, args, "cuda")
    assert text.count(CUSTOM_CALL["cuda"]) == 1 and "invariant_cache_attention" in text
    assert not layer_copies(text, (B, k, S, h))


def test_layer_copy_detector_can_fail():
    """Slicing the layer before the kernel (what the Pallas path used to do) is caught by both checks."""
    B, T, S, dtype = 4, 16, 8192, jnp.bfloat16
    fn = lambda q, k, v, n, w, i: pk.prefix_attention(q, k[i], v[i], n, w, platform="tpu")  # noqa: E731
    text = export_text(fn, prefix_args(B, T, S, dtype, True), "tpu")
    assert layer_copies(text, (B, K, S, H)), "a whole-layer dynamic_slice went unnoticed"
    assert cache_sized_results(text, B * K * S * H), "a whole-layer copy went unnoticed"


@pytest.mark.parametrize("platform", ["tpu", "cuda"])
def test_verify_forward_lowers_at_smollm2_shapes(platform):
    """The target's verify forward (30 layers in a scan, 69-node tree, 8K bf16 cache) with the Pallas
    backend: both kernels in the scanned layer, and no layer of the cache sliced out for them."""
    config = ModelConfig(dtype="bfloat16")  # the defaults are SmolLM2-135M's shapes
    B, T, S = 1, 69, 8192
    params = jax.eval_shape(lambda: target.init_params(config, jax.random.key(0)))
    kv = (config.num_layers, B, config.num_kv_heads, S, config.head_dim)
    cache = KVCache(sds(kv, jnp.bfloat16), sds(kv, jnp.bfloat16), sds((B,), jnp.int32))
    ints = sds((B, T), jnp.int32)
    tree = Tree(tokens=ints, parents=ints, depth=ints, valid=sds((B, T), jnp.bool_), mask=sds((B, T, T), jnp.bool_))

    def fn(params, tree, cache):
        return verify.tree_forward(params, config, tree, cache, backend=BACKEND[platform])

    text = export_text(fn, (params, tree, cache), platform)
    assert text.count(CUSTOM_CALL[platform]) >= 2, "expected the prefix and the tree kernel"
    assert not layer_copies(text, kv[1:])


@pytest.mark.parametrize("length, start", [(0, 0), (1, 0), (2048, 0), (2049, 0), (20000, 0), (20000, 5000), (9, 9)])
def test_tpu_prefix_fetches_only_blocks_with_valid_keys(length, start):
    """The TPU pipeline copies a K/V block only when its index differs from the previous step's: the clamped
    index map must name each block of `[start, length)` once, and nothing past the length or the capacity."""
    S, block_s = 20000, 2048
    last_block = -(-S // block_s) - 1
    steps = jnp.arange(last_block + 1)
    index = [int(i) for i in pk.kv_block_index(steps, length, start, block_s=block_s, last_block=last_block)]
    fetched = [j for n, j in enumerate(index) if n == 0 or j != index[n - 1]]
    wanted = list(range(start // block_s, -(-length // block_s))) or [start // block_s]
    assert fetched == wanted, f"index map {index}"


@pytest.mark.parametrize("capability, stages", [("9.0", 4), ("8.6", 2)])
def test_prefix_tuning_takes_four_stages_on_hopper_only(monkeypatch, capability, stages):
    """Four K/V blocks in flight need Hopper's shared memory; the interpreter and other GPUs keep the default."""

    class FakeGpu:
        compute_capability = capability

    attention.prefix_tuning.cache_clear()
    monkeypatch.setattr(attention.jax, "devices", lambda *a: [FakeGpu()])
    try:
        assert attention.prefix_tuning("gpu", False).num_stages == stages
        assert attention.prefix_tuning("gpu", True).num_stages == 2
        assert attention.prefix_tuning("tpu", False) == pk.PrefixTuning()
    finally:
        attention.prefix_tuning.cache_clear()


def test_prefix_kernel_with_four_stages_lowers_for_cuda():
    def fn(q, k, v, n, w):
        return pk.prefix_attention(q, k, v, n, w, platform="gpu", tuning=pk.PrefixTuning(num_stages=4))

    text = export_text(fn, prefix_args(1, 69, 32768, jnp.bfloat16, False), "cuda")
    assert text.count(CUSTOM_CALL["cuda"]) == 1


@pytest.mark.parametrize("platform", ["tpu", "cuda"])
def test_eagle3_step_lowers(platform):
    """EAGLE-3's pieces of a step with the Pallas backend, bf16 at Llama-3.1-8B's attention shapes (4 layers, 8K
    cache): the verify forward that also returns the three streams, the dynamic tree search over the draft's own
    cache, and the accepted pairs' pass into it. Each uses the kernels, and no layer of either cache is copied."""
    import types

    from lsjax.engine.types import DraftContext
    from lsjax.methods.eagle3 import model as em
    from lsjax.methods.eagle3.drafter import Eagle3Drafter, Eagle3State, Eagle3Tree

    config = ModelConfig(
        vocab_size=4096, hidden_size=512, intermediate_size=1024, num_layers=4, num_heads=N, num_kv_heads=K,
        head_dim=H, dtype="bfloat16",
    )  # fmt: skip
    dcfg = em.Eagle3Config(
        dataclasses.replace(config, num_layers=1, name="eagle3"), 1024, config.hidden_size, (0, 2, 1)
    )
    drafter = Eagle3Drafter(dcfg, Eagle3Tree(15, 5, 4))
    B, S, T = 1, 8192, drafter.num_nodes
    params = jax.eval_shape(lambda: target.init_params(config, jax.random.key(0)))
    dparams = jax.eval_shape(lambda: em.init_params(dcfg, jax.random.key(1)))
    kv = (config.num_layers, B, K, S, H)
    cache = KVCache(sds(kv, jnp.bfloat16), sds(kv, jnp.bfloat16), sds((B,), jnp.int32))
    dkv = (1, B, K, S, H)
    dcache = KVCache(sds(dkv, jnp.bfloat16), sds(dkv, jnp.bfloat16), sds((B,), jnp.int32))
    ints = sds((B, T), jnp.int32)
    tree = Tree(tokens=ints, parents=ints, depth=ints, valid=sds((B, T), jnp.bool_), mask=sds((B, T, T), jnp.bool_))
    A = drafter.max_depth + 1

    def fn(params, dparams, tree, cache, dcache, out, root, pairs, count):
        ctx = DraftContext(params, dparams, config, BACKEND[platform], capacity=S)
        *_, aux = verify.aux_tree_forward(params, config, tree, cache, drafter.aux_hidden_layers, backend=ctx.backend)
        pos = dcache.lengths[:, None] + jnp.arange(A)[None]
        _, dcache = drafter._commit_pairs(ctx, dcache, aux[:, :A], pairs, pos, count)
        return aux, drafter.propose(ctx, types.SimpleNamespace(root=root), Eagle3State(dcache, out))

    args = (params, dparams, tree, cache, dcache, sds((B, config.hidden_size), jnp.float32), sds((B,), jnp.int32))
    text = export_text(fn, (*args, sds((B, A), jnp.int32), sds((B,), jnp.int32)), platform)
    assert text.count(CUSTOM_CALL[platform]) >= 3, "expected the verify forward's and the draft's kernels"
    assert not layer_copies(text, kv[1:]) and not layer_copies(text, dkv[1:])
