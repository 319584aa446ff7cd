"""Precision: the dtype a model runs in (bf16 on TPU/GPU, fp32 on a CPU), and losslessness in bf16.

AR and verification run in the same dtype, so the T=0 equality and the T>0 distribution hold per dtype; the
bf16 cases here are the accelerator setting run on this CPU (slowly: bf16 dots are ~10x fp32 here)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lsjax
from lsjax import attention
from lsjax.cache import KVCache
from lsjax.config import ConfigError, DraftConfig, GenerateConfig, SamplingConfig, default_dtype, resolve_dtype
from lsjax.engine.types import ARDrafter
from lsjax.methods.longspec.drafter import LongSpecDrafter
from lsjax.models import target
from lsjax.tree import TreeConfig
from tests.test_speculative import DRAFTERS as GREEDY_DRAFTERS
from tests.test_speculative import repetitive_prompts, run
from tests.test_verify_sampling import DRAFTERS as SAMPLING_DRAFTERS
from tests.test_verify_sampling import (
    N_DEEP,
    PROMPT,
    N,
    distribution_pvalue,
    draft_params_for,
    exact_joint,
    sample_joint,
)
from tests.test_verify_sampling import model as sampling_model
from tests.tiny import tiny_model

ROOT = Path(__file__).resolve().parents[1]


def as_bf16(config, params):
    return dataclasses.replace(config, dtype="bfloat16"), jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)


def test_dtype_names_and_platform_defaults():
    assert default_dtype("cpu") == "float32"
    assert default_dtype("gpu") == default_dtype("tpu") == "bfloat16"
    assert resolve_dtype("bf16") == "bfloat16" and resolve_dtype("fp32") == "float32"
    assert resolve_dtype("auto", "gpu") == "bfloat16" and resolve_dtype("auto") == "float32"  # this CPU
    with pytest.raises(ConfigError, match=r"^dtype: must be one of auto\|bf16\|fp32 .*got 'int8'$"):
        resolve_dtype("int8")


def test_decode_cli_rejects_a_bad_dtype_in_one_line():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "decode.py"), "--dtype", "fp8"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == ["decode.py: error: --dtype must be bf16, fp32 or auto, got 'fp8'"]


def test_generate_names_a_dtype_mismatch():
    """Params in one dtype and a config in another would run in neither: a named error at trace time."""
    config, params = tiny_model()
    cfg = lsjax.SpecConfig(model=dataclasses.replace(config, dtype="bfloat16"), gen=GenerateConfig(4))
    prompt = jnp.ones((1, 64), jnp.int32)
    with pytest.raises(ConfigError, match="SpecConfig.model.dtype is bfloat16 but the target params are float32"):
        jax.jit(lsjax.generate, static_argnames="config")(params, (), prompt, cfg, jax.random.key(0))


def test_a_head_dim_triton_cannot_take_falls_back_to_xla_with_one_warning():
    """Triton needs power-of-2 dims: head_dim 96 on a GPU runs the XLA attention, warned once, and lowers for
    CUDA without a Triton call."""
    attention._WARNED.discard(96)
    B, T, N, K, H, S = 1, 4, 4, 2, 96, 256
    sds = jax.ShapeDtypeStruct
    args = (sds((B, T, N, H), jnp.bfloat16), sds((B, K, S, H), jnp.bfloat16), sds((B, K, S, H), jnp.bfloat16))
    fn = lambda q, k, v, n: attention.prefix_attention(q, k, v, n, backend="pallas:cuda")  # noqa: E731
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        text = jax.export.export(jax.jit(fn), platforms=("cuda",))(*args, sds((B,), jnp.int32)).mlir_module()
        attention.prefix_attention(jnp.zeros((B, T, N, H)), *(jnp.zeros((B, K, S, H)),) * 2, jnp.array([3]))
    fallbacks = [w for w in seen if issubclass(w.category, attention.KernelFallbackWarning)]
    assert len(fallbacks) == 1 and "head_dim 96 is not a power of 2" in str(fallbacks[0].message)
    assert "xla.gpu.triton" not in text
    assert attention._kernel_or_xla("pallas:cuda", 128) == ("gpu", False)


def test_bf16_weights_give_fp32_logits_and_residual_stream():
    """bf16 weights, fp32 activations: logits rounded to bf16 step by 0.125 near 16 and tie exactly, so AR and
    verification broke ties differently (layers.dense). Almost no logit may sit on the bf16 grid."""
    config, params = as_bf16(*tiny_model())
    params = target.prepare_for_decode(params, config)
    tokens = jnp.arange(3, 19, dtype=jnp.int32)[None]
    hidden, k, _ = target.forward_hidden(params, config, tokens, jnp.arange(16)[None], KVCache.zeros(config, 1, 32))
    logits = target.lm_head(params, config, hidden)
    assert hidden.dtype == logits.dtype == jnp.float32 and k.dtype == jnp.bfloat16  # the cache stays bf16
    on_grid = logits == logits.astype(jnp.bfloat16).astype(jnp.float32)
    assert float(on_grid.mean()) < 0.05


@pytest.mark.parametrize("backend", ["xla", "pallas"])
def test_bf16_attention_does_not_depend_on_the_cache_tree_split(backend):
    """AR reads a token's predecessors from the cache; verification reads the drafted ones from the tree. The
    two splits of one softmax agree to fp32 rounding because the partials merge in fp32; rounding each partial
    to bf16 first (as before) makes them differ ~1e-3, which this test also checks it would catch."""
    B, N, K, H, S = 1, 4, 2, 16, 40
    bf16 = jnp.bfloat16
    kq, kk, kv = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(kq, (B, N, H)).astype(bf16)
    keys = jax.random.normal(kk, (B, K, S, H)).astype(bf16)
    vals = jax.random.normal(kv, (B, K, S, H)).astype(bf16)

    def attend(n: int, rounded: bool = False):
        """q as the last of S - n tree nodes (a chain) over a cache holding the first n keys."""
        zero = jnp.zeros_like(keys)
        cache_k, cache_v = zero.at[:, :, :n].set(keys[:, :, :n]), zero.at[:, :, :n].set(vals[:, :, :n])
        tree_k, tree_v = keys[:, :, n:].swapaxes(1, 2), vals[:, :, n:].swapaxes(1, 2)
        qt = jnp.zeros((B, S - n, N, H), bf16).at[:, -1].set(q)
        lengths = jnp.array([n], jnp.int32)
        if not rounded:
            out = attention.hybrid_tree_attention(
                qt, cache_k, cache_v, lengths, tree_k, tree_v, causal=True, backend=backend, out_dtype=jnp.float32
            )
            return np.asarray(out[:, -1])
        out_p, lse_p = attention.prefix_attention(qt, cache_k, cache_v, lengths, backend=backend, out_dtype=bf16)
        out_t, lse_t = attention.tree_attention(qt, tree_k, tree_v, causal=True, backend=backend, out_dtype=bf16)
        return np.asarray(attention.merge_attention(out_p, lse_p, out_t, lse_t)[0][:, -1].astype(jnp.float32))

    ar_like, verify_like = attend(S - 1), attend(S - 6)
    scale = np.abs(ar_like).max()
    assert np.abs(ar_like - verify_like).max() / scale < 1e-5
    assert np.abs(attend(S - 1, True) - attend(S - 6, True)).max() / scale > 1e-4  # the old merge: caught


@pytest.mark.slow
@pytest.mark.parametrize("method", ["pld", "longspec"])
def test_bf16_greedy_on_smollm2_equals_ar(method):
    """The real model in bf16 on the bundled prompt, 128 tokens: pld's output left AR's at token 55 while
    logits were rounded to bf16 (an exact tie at 16.75) — on an H100 and on this CPU."""
    from lsjax.engine.host import Generator
    from lsjax.loading import load_model
    from lsjax.methods import registry

    model = load_model(None, "bf16")
    text = (ROOT / "lsjax" / "assets" / "default_prompt.txt").read_text()
    chat = model.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
    ids = model.tokenizer.encode(chat, add_special_tokens=False)
    gen = GenerateConfig(max_new_tokens=128)
    ar = Generator(model.config, model.params).run(ids, gen)
    drafter, draft_params = registry.build(method, model, cost_profile="prior")
    sp = Generator(model.config, model.params, drafter, draft_params).run(ids, gen)
    assert sp.tokens == ar.tokens
    assert sp.mean_accepted > 1.2


@pytest.mark.slow
@pytest.mark.parametrize("drafter", GREEDY_DRAFTERS, ids=lambda d: f"{d.name}-{d.tree.widths}")
def test_bf16_greedy_speculative_equals_ar_every_drafter(drafter):
    """tests/test_speculative.py's greedy equality, in bf16 (the slow set: bf16 is ~10x fp32 on a CPU)."""
    config, params = as_bf16(*tiny_model())
    gen = GenerateConfig(max_new_tokens=24, ignore_eos=True)
    prompts = repetitive_prompts(config, 4, 40, seed=1) + [np.arange(3, 20)]
    ar = run(params, config, prompts, gen, ARDrafter())
    sp = run(params, config, prompts, gen, drafter)
    np.testing.assert_array_equal(np.asarray(sp.num_out), np.asarray(ar.num_out))
    np.testing.assert_array_equal(np.asarray(sp.out), np.asarray(ar.out))


@pytest.mark.slow  # bf16 equality is in the default run: test_engine_edges (deep beam trees, PLD chains)
def test_bf16_longspec_tree_equals_ar():
    """A beam tree of the (untrained) LongSpec draft in bf16, draft and target both bf16: verification's argmax
    equals AR's. (Deep acceptance in bf16: tests/test_engine_edges.py::test_beam_shaped_trees_accept_deep.)"""
    config, params = as_bf16(*tiny_model())
    gen = GenerateConfig(max_new_tokens=24, ignore_eos=True)
    prompts = [np.resize([5, 9, 14, 20, 7], 50).tolist()]  # looping text: the draft gets some nodes accepted
    ar = run(params, config, prompts, gen, ARDrafter())
    sp = run(params, config, prompts, gen, LongSpecDrafter(TreeConfig((3, 4, 4)), DraftConfig(window=16)))
    np.testing.assert_array_equal(np.asarray(sp.out), np.asarray(ar.out))
    assert float(sp.mean_accepted) > 1.0


@pytest.mark.parametrize(
    "name, n",
    [("longspec", N)]
    + [pytest.param(name, N_DEEP, marks=pytest.mark.slow, id=f"{name}-deep") for name in sorted(SAMPLING_DRAFTERS)],
)
def test_bf16_speculative_sampling_is_exact_at_depth(name, n):
    """The T=1 joint law of 4 tokens under speculative sampling, bf16 weights and cache, equals the bf16 target's
    (enumerated with the same bf16 model): the LongSpec drafter's sampled trees by default, every drafter of
    tests/test_verify_sampling.py in the slow set. Power as there."""
    config, params = as_bf16(*sampling_model())
    drafter, sampling = SAMPLING_DRAFTERS[name], SamplingConfig(temperature=1.0)
    probs = exact_joint(params, config, PROMPT, sampling)
    dp = draft_params_for(params, config, drafter)
    samples, hist = sample_joint(params, config, drafter, sampling, dp, n=n)
    if name not in ("pld", "auto-shadows"):  # as in test_verify_sampling: these may accept little at step 1
        assert hist[1:].sum() >= 0.2 * n, f"accepted-depth histogram {hist.tolist()}"
    p = distribution_pvalue(samples, probs)
    assert p > 1e-4, f"bf16 speculative samples deviate from the target distribution (p={p:.2e})"
