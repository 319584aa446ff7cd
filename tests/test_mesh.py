"""Decoding on a mesh (lsjax.mesh): the grouped tensor-parallel layout, its errors, and mesh output against
one-device output token for token (fake CPU devices in a fresh process: tests/mesh_run.py)."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lsjax import mesh as mesh_lib
from lsjax.cache import KVCache
from lsjax.config import ConfigError, GenerateConfig, SamplingConfig
from lsjax.engine.types import SpecConfig
from lsjax.models import target
from tests.tiny import tiny_model

ROOT = Path(__file__).resolve().parents[1]


def smol_shaped():
    """tests.tiny's model with SmolLM2's head shape: 9 query heads over 3 KV heads."""
    config, _ = tiny_model()
    shape = dict(num_heads=9, num_kv_heads=3, hidden_size=36, intermediate_size=48, vocab_size=99)
    config = dataclasses.replace(config, **shape)
    return config, target.init_params(config, jax.random.key(5), scale=0.3)


@functools.partial(jax.jit, static_argnames="config")
def _logits(params, config, tokens):
    pos = jnp.broadcast_to(jnp.arange(tokens.shape[1])[None], tokens.shape)
    return target.forward(params, config, tokens, pos, KVCache.zeros(config, tokens.shape[0], 32))[0]


@pytest.mark.slow  # the mesh decode test below computes through it
def test_grouped_layout_computes_the_flat_one():
    """Each shard's block of the fused projections holds its own heads and MLP columns: the grouped layout's
    forward equals the flat one (one device). A plain reshape of the flat matrix into M blocks, the tempting
    layout, hands shard 0 only query heads and computes something else; the same check catches it."""
    config, params = smol_shaped()
    tokens = jnp.asarray(np.random.RandomState(0).randint(0, config.vocab_size, (2, 12)), jnp.int32)
    flat = target.prepare_for_decode(params, config)
    ref = _logits(flat, config, tokens)
    grouped = target.group_for_shards(params, config, 3)
    assert grouped["layers"][0]["w_qkv"].shape == (36, 3, (3 + 2) * 8)
    np.testing.assert_allclose(_logits(grouped, config, tokens), ref, rtol=1e-5, atol=1e-5)
    assert target.group_for_shards(grouped, config, 3) is not None  # idempotent on a grouped layout

    def naive(layer):
        F = config.intermediate_size
        return {
            **layer,
            "w_qkv": layer["w_qkv"].reshape(36, 3, -1),
            "w_gate_up": layer["w_gate_up"].reshape(36, 3, 2 * F // 3),
        }

    in_major = target.prepare_for_decode(params, config, layout="in")  # the copy `naive` reshapes is the one used
    wrong = {**in_major, "layers": tuple(naive(layer) for layer in in_major["layers"])}
    assert float(jnp.max(jnp.abs(_logits(wrong, config, tokens) - ref))) > 1e-2


def test_mesh_shapes_and_their_errors():
    assert mesh_lib.MeshShape.parse("model=3,data=2") == mesh_lib.MeshShape(model=3, data=2)
    assert mesh_lib.MeshShape.parse("model=4") == mesh_lib.MeshShape(model=4)
    bad_shapes = [("model=0", "model"), ("tp=2", "AXIS=SIZE"), ("model=x", "AXIS=SIZE"), ("model=2,model=2", "twice")]
    for bad, says in bad_shapes:
        with pytest.raises(mesh_lib.MeshError, match=says) as e:
            mesh_lib.MeshShape.parse(bad)
        assert "\n" not in str(e.value)
    n = jax.device_count()
    with pytest.raises(mesh_lib.MeshError, match=rf"needs {n + 1} devices, {n} cpu devices? here.*one of \[1"):
        mesh_lib.make(f"model={n + 1}")
    config, _ = smol_shaped()
    mesh = mesh_lib.make("model=1")
    mesh_lib.check(config, mesh, batch=3)
    fake = jax.sharding.AbstractMesh((1, 2), ("data", "model"))
    with pytest.raises(mesh_lib.MeshError, match=r"3 KV heads.*model must be one of \[1, 3\]"):
        mesh_lib.check(config, fake)
    fake = jax.sharding.AbstractMesh((2, 1), ("data", "model"))
    with pytest.raises(mesh_lib.MeshError, match=r"data=2: the batch of 3 .* \(one of \[1, 3\]\)"):
        mesh_lib.check(config, fake, batch=3)
    with pytest.raises(ConfigError, match="SpecConfig.mesh"):
        SpecConfig(config, GenerateConfig(8), mesh="model=3")


@pytest.mark.slow  # test_mesh_equals_one_device_deep_accepts covers a mesh in the default run
def test_one_device_mesh_decodes_like_no_mesh():
    """A 1x1 mesh runs the whole mesh path (placement, scope, cache constraint) on this process's device."""
    from lsjax import engine
    from lsjax.methods.pld.drafter import PLDDrafter

    config, params = smol_shaped()
    tokens = jnp.asarray(np.tile(np.arange(3, 35, dtype=np.int32), (1, 2)))
    lengths = jnp.array([60], jnp.int32)
    gen = GenerateConfig(max_new_tokens=24, ignore_eos=True)
    run = jax.jit(engine.run, static_argnames="config")
    key = jax.random.key(0)
    flat = target.prepare_for_decode(params, config)
    plain = run(flat, (), SpecConfig(config, gen, PLDDrafter(), chunk=64), tokens, lengths, key)
    mesh = mesh_lib.make("model=1")
    mp, _ = mesh_lib.place(params, (), config, mesh)
    on_mesh = run(mp, (), SpecConfig(config, gen, PLDDrafter(), chunk=64, mesh=mesh), tokens, lengths, key)
    np.testing.assert_array_equal(np.asarray(plain.out), np.asarray(on_mesh.out))


def _mesh_run(*args, env=None, timeout=900):
    out = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "mesh_run.py"), *map(str, args)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        timeout=timeout,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def _assert_lossless(rows, methods):
    assert [r["method"] for r in rows] == methods
    for r in rows:
        assert r["equal_one_device"] and r["equal_ar_on_mesh"], r
        # The cache stayed split by KV head (and by row on a data axis of size > 1): never gathered.
        assert r["cache_spec"] in ("P(None, 'data', 'model')", "P(None, None, 'model')"), r
        assert r["split_params"] > 0, r


def test_mesh_equals_one_device_deep_accepts():
    """SmolLM2's head shape on model=3 x data=2 (6 fake devices): a drafter that proposes the target's own
    continuation (with corrupted levels) accepts 0-5 tokens a step; every token equals the one-device run."""
    rows = _mesh_run("greedy", 6, "smollm2", "model=3,data=2", "oracle")
    _assert_lossless(rows, ["oracle"])
    assert rows[0]["tau"] > 2.0


@pytest.mark.slow  # ~40 s; Qwen3 on a mesh also runs in tests/test_decode_matrix.py's slow qwen3 matrix
def test_mesh_equals_one_device_qwen3():
    """A Qwen3-shaped target (per-head q/k RMSNorm) split four ways: every token equals the one-device run."""
    _assert_lossless(_mesh_run("greedy", 4, "qwen3", "model=4", "oracle"), ["oracle"])


@pytest.mark.slow  # ~35 s; the default run's decode matrix decodes eagle3 on a mesh through decode.py too
def test_mesh_equals_one_device_eagle3():
    """An EAGLE-3 draft on SmolLM2's head shape over model=3 x data=2: the target's three streams come out of the
    split verification forward and the draft's own cache rides along; every token equals the one-device run and
    AR's on the mesh."""
    _assert_lossless(_mesh_run("greedy", 6, "smollm2", "model=3,data=2", "eagle3"), ["eagle3"])


@pytest.mark.slow  # ~25 s: weights, caches and the draft in bf16, Qwen3's head norms split four ways
def test_mesh_equals_one_device_eagle3_bf16_qwen3():
    rows = _mesh_run("greedy", 4, "qwen3", "model=4", "eagle3", env={"MESH_DTYPE": "bfloat16"})
    _assert_lossless(rows, ["eagle3"])


@pytest.mark.slow  # ~40 s: the deeper blocks' stacked weights split with the heads; fp32, then bf16
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_mesh_equals_one_device_deeper_longspec_draft(dtype):
    rows = _mesh_run("greedy", 6, "smollm2", "model=3,data=2", "longspec-deep", env={"MESH_DTYPE": dtype})
    _assert_lossless(rows, ["longspec-deep"])


@pytest.mark.slow  # ~100 s: four methods, each compiled for one device and the mesh
def test_mesh_equals_one_device_every_method_smollm2_shape():
    methods = ["ar", "pld", "longspec", "auto"]
    _assert_lossless(_mesh_run("greedy", 6, "smollm2", "model=3,data=2", ",".join(methods)), methods)


@pytest.mark.slow  # ~150 s: Llama-3.1-8B's head shape (32 query over 8 KV heads) on model=8
def test_mesh_equals_one_device_every_method_llama_shape():
    methods = ["ar", "pld", "longspec", "auto", "oracle"]
    _assert_lossless(_mesh_run("greedy", 8, "llama8b", "model=8", ",".join(methods)), methods)


@pytest.mark.slow  # the Pallas kernels in interpret mode, each device with its own heads under shard_map
def test_pallas_kernels_per_device_on_a_mesh():
    rows = _mesh_run("greedy", 6, "smollm2", "model=3,data=2", "oracle", env={"MESH_BACKEND": "pallas"})
    _assert_lossless(rows, ["oracle"])


@pytest.mark.slow  # ~35 s
def test_bf16_on_a_mesh():
    """bf16 weights and K/V cache on model=3,data=2: speculative output equals AR's on the mesh (the lossless
    claim) and the one-device output (fp32 residual stream and matmul results keep the tiny model's margins)."""
    methods = ["oracle", "pld"]
    rows = _mesh_run("greedy", 6, "smollm2", "model=3,data=2", ",".join(methods), env={"MESH_DTYPE": "bfloat16"})
    _assert_lossless(rows, methods)


@pytest.mark.slow  # ~60 s: 100K sampled rows on model=2 x data=2
def test_sampling_on_a_mesh_keeps_the_target_distribution(tmp_path):
    """T=1 LongSpec trees verified on a mesh: the first K tokens' joint law is the target's (the test and its
    power are tests/test_verify_sampling.py's)."""
    from tests.mesh_run import sampling_model
    from tests.test_verify_sampling import PROMPT, distribution_pvalue, exact_joint

    samples_path = tmp_path / "samples.npy"
    (row,) = _mesh_run("sampled", 4, "model=2,data=2", 100_000, env={"MESH_SAMPLES": str(samples_path)})
    assert row["cache_spec"] == "P(None, 'data', 'model')"
    assert row["tau"] > 1.2, row  # the trees are accepted past their root often enough to matter
    config, params = sampling_model()
    probs = exact_joint(params, config, PROMPT, SamplingConfig(temperature=1.0))
    p = distribution_pvalue(np.load(samples_path), probs)
    assert p > 1e-4, f"samples on the mesh deviate from the target distribution (p={p:.2e})"


def test_a_method_that_cannot_decode_on_a_mesh_is_refused_by_its_spec():
    from lsjax.methods.streams.drafter import StreamsDrafter

    config, _ = tiny_model()
    mesh = mesh_lib.make("model=1")
    with pytest.raises(ConfigError, match=r"^SpecConfig.mesh: streams cannot decode on a mesh \(its streams run"):
        SpecConfig(config, GenerateConfig(8), StreamsDrafter(), mesh=mesh)
    SpecConfig(config, GenerateConfig(8), StreamsDrafter())  # on one device it is a valid spec
