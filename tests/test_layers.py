"""The target's parameter schema (param_specs): init, the loaders' shape checks and the sharding rules derive from
it; the shared layers module."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec

from lsjax import sharding
from lsjax.errors import ShapeMismatchError
from lsjax.models import layers, target
from tests.tiny import tiny_model


@pytest.mark.parametrize("bias,tie", [(False, True), (True, False)])
def test_init_params_follows_the_schema(bias, tie):
    config, _ = tiny_model()
    config = dataclasses.replace(config, qkv_bias=bias, tie_embeddings=tie)
    specs = target.param_specs(config)
    params = target.init_params(config, jax.random.key(0))
    flat = layers.flatten(params)
    assert set(flat) == set(specs) and ("lm_head" in specs) == (not tie) and ("layers/bq" in specs) == bias
    for path, s in specs.items():
        assert flat[path].shape == s.shape and flat[path].dtype == jnp.dtype(s.dtype), path
        assert len(s.logical_axes) == len(s.shape) and (s.logical_axes[0] == "layers") == path.startswith("layers/")
        if s.init == "ones":
            assert np.all(np.asarray(flat[path]) == 1), path
    layers.check_shapes(params, specs)
    assert layers.unflatten(flat).keys() == params.keys()


def test_shape_checks_name_the_tensor():
    config, params = tiny_model()
    specs = target.param_specs(config)
    bad = dict(params, layers=dict(params["layers"], wq=params["layers"]["wq"][:, :, :-1]))
    with pytest.raises(ShapeMismatchError, match="layers/wq: expected shape"):
        layers.check_shapes(bad, specs)
    with pytest.raises(ShapeMismatchError, match="final_norm: missing"):
        layers.check_shapes({k: v for k, v in params.items() if k != "final_norm"}, specs)
    with pytest.raises(ShapeMismatchError, match="lm_head: not a parameter"):
        layers.check_shapes(dict(params, lm_head=params["embed"].T), specs)


def test_loaded_model_matches_the_schema(ours):  # the session's SmolLM2 (conftest)
    layers.check_shapes(ours.params, target.param_specs(ours.config))


def test_sharding_comes_from_the_modules_partitioning_metadata():
    config, params = tiny_model()
    mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:1]).reshape(1, 1), ("data", "fsdp"))
    model = target.Transformer(config)
    from_metadata = layers.flatten(sharding.module_shardings(model, mesh))
    axes = sharding.model_axes(model)
    assert axes == {path: s.logical_axes for path, s in target.param_specs(config).items()}
    by_path = layers.flatten(sharding.tree_shardings(params, mesh, axes))
    assert from_metadata.keys() == by_path.keys()
    for path, s in from_metadata.items():
        assert s.spec == by_path[path].spec, path
    assert from_metadata["layers/wq"].spec == PartitionSpec(None, "fsdp", None, None)
    assert from_metadata["embed"].spec == PartitionSpec(None, "fsdp")
    with pytest.raises(ValueError, match="rank"):
        layers.ParamSpec((2, 3), "float32", ("embed",))


def test_head_logits_equals_the_plain_product():
    rng = np.random.default_rng(0)
    rows = jnp.asarray(rng.standard_normal((50, 16), dtype=np.float32))
    for shape in [(16,), (3, 16), (2, 5, 16)]:
        h = jnp.asarray(rng.standard_normal(shape, dtype=np.float32))
        np.testing.assert_allclose(layers.head_logits(h, rows), h @ rows.T, atol=1e-5, rtol=1e-5)
