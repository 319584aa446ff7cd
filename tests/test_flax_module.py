"""The target as a Flax module: `init` declares its variables with logical axes, `apply` is the same computation
as the params functions in every layout, a user's module can hold it, and variables are checked where they enter."""

from __future__ import annotations

import dataclasses

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lsjax.cache import KVCache
from lsjax.errors import InputError, ShapeMismatchError
from lsjax.models import module, target
from lsjax.models.layers import flatten
from tests.tiny import tiny_model


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral"])
def test_init_declares_the_schema_with_its_logical_axes(arch):
    config, _ = tiny_model(arch=arch)
    if arch == "qwen2":
        config = dataclasses.replace(config, qkv_bias=True)
    model = target.Transformer(config)
    variables = model.init(jax.random.key(0), method="weights")
    specs = target.param_specs(config)
    boxed = flatten(dict(variables["params"]))
    assert boxed.keys() == specs.keys()
    for path, spec in specs.items():
        assert isinstance(boxed[path], nn.LogicallyPartitioned), path
        assert tuple(boxed[path].names) == spec.logical_axes, path
        chex.assert_shape(boxed[path].value, spec.shape)
    assert module.logical_axes(model) == {p: s.logical_axes for p, s in specs.items()}
    # Flax's own tools read the metadata
    partition = flatten(dict(nn.get_partition_spec(variables)["params"]))
    assert partition["layers/wq"] == jax.sharding.PartitionSpec("layers", "embed", "heads", "head_dim")
    # the same random values as the params function, for the same key order
    chex.assert_trees_all_equal(nn.unbox(variables)["params"], target.init_params(config, module_key(model)))
    assert module.variables_problem(model, variables["params"]) is None


def module_key(model):
    """The key `init` hands the module's declaration: Flax's per-module stream of the root key."""
    captured = {}

    class Spy(target.Transformer):
        def random_weights(self, key):
            captured["key"] = key
            return super().random_weights(key)

    Spy(model.config).init(jax.random.key(0), method="weights")
    return captured["key"]


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_apply_is_the_params_functions_in_every_layout(arch):
    config, params = tiny_model(arch=arch)
    model = target.Transformer(config)
    tokens = jnp.asarray([[5, 9, 11, 3, 7, 2]], jnp.int32)
    positions = jnp.arange(6)[None]
    cache = KVCache.zeros(config, 1, 16)
    for layout in (params, target.prepare_for_decode(params, config, layout="in")):
        want = jax.jit(lambda p, t: target.forward(p, config, t, positions, cache)[0])(layout, tokens)
        got = jax.jit(lambda p, t: model.apply({"params": p}, t, positions, cache)[0])(layout, tokens)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))  # the same program
        hidden, k, v = model.apply({"params": layout}, tokens, positions, cache, method="hidden")
        chex.assert_shape(hidden, (1, 6, config.hidden_size))
        chex.assert_shape(k, (config.num_layers, 1, 6, config.num_kv_heads, config.head_dim))
        logits = model.apply({"params": layout}, hidden, method="logits")
        np.testing.assert_allclose(np.asarray(logits), np.asarray(want), rtol=1e-5, atol=1e-5)  # eager vs jit


def test_a_users_module_holds_the_target_as_a_submodule():
    config, params = tiny_model()

    class WithProbe(nn.Module):
        config: object

        def setup(self):
            self.backbone = target.Transformer(self.config)
            self.probe = nn.Dense(3)

        def __call__(self, tokens, positions, cache):
            hidden, _, _ = self.backbone.hidden(tokens, positions, cache)
            return self.probe(hidden)

    tokens, positions = jnp.asarray([[4, 8, 15]], jnp.int32), jnp.arange(3)[None]
    cache = KVCache.zeros(config, 1, 4)
    user = WithProbe(config)
    variables = nn.unbox(user.init(jax.random.key(1), tokens, positions, cache))
    chex.assert_trees_all_equal_shapes(variables["params"]["backbone"], params)
    variables["params"]["backbone"] = params  # lsjax weights by module path
    out = user.apply(variables, tokens, positions, cache)
    hidden = target.forward_hidden(params, config, tokens, positions, cache)[0]
    want = hidden @ variables["params"]["probe"]["kernel"] + variables["params"]["probe"]["bias"]
    np.testing.assert_allclose(np.asarray(out), np.asarray(want), rtol=1e-5, atol=1e-5)


def test_variables_that_do_not_fit_name_the_path_and_both_shapes():
    config, params = tiny_model()
    model = target.Transformer(config)
    bad = dict(params, layers=dict(params["layers"], wq=params["layers"]["wq"][:, :, :-1]))
    problem = module.variables_problem(model, bad)
    assert problem == "Transformer: variable layers/wq has shape (2, 48, 5, 8), the module declares (2, 48, 6, 8)"
    assert "variable final_norm is missing" in module.variables_problem(
        model, {k: v for k, v in params.items() if k != "final_norm"}
    )
    with pytest.raises(ShapeMismatchError, match="lm_head"):
        module.check_variables(model, dict(params, lm_head=params["embed"].T))


def test_load_variables_checks_family_and_shapes_before_reading_weights(ours):
    from lsjax import load_variables

    variables = load_variables(ours.module)
    chex.assert_trees_all_equal_shapes(variables["params"], ours.params)
    qwen = target.Transformer(dataclasses.replace(ours.config, arch="qwen2", qkv_bias=True))
    with pytest.raises(InputError, match="a llama checkpoint, and the module is a qwen2 Transformer"):
        load_variables(qwen)
    wide = target.Transformer(dataclasses.replace(ours.config, intermediate_size=1600))
    with pytest.raises(ShapeMismatchError, match=r"variable layers/w_down has shape \(30, 1536, 576\) in the"):
        load_variables(wide)


def test_generate_takes_variables_and_bound_modules():
    import lsjax

    config, params = tiny_model()
    spec = lsjax.SpecConfig(model=config, gen=lsjax.GenerateConfig(max_new_tokens=6), drafter=lsjax.PLDDrafter())
    ids, lengths = lsjax.pad_prompts([[5, 9, 11, 5, 9]])
    key = jax.random.key(0)
    want = lsjax.generate(params, (), ids, spec, key, lengths).tokens
    boxed = target.Transformer(config).init(jax.random.key(0), method="weights")
    boxed = jax.tree.map(
        lambda box, p: box.replace_boxed(p),
        boxed["params"],
        params,
        is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned),
    )
    for form in ({"params": params}, {"params": boxed}, target.Transformer(config).bind({"params": params})):
        np.testing.assert_array_equal(lsjax.generate(form, (), ids, spec, key, lengths).tokens, want)
    jitted = jax.jit(lsjax.generate)({"params": boxed}, (), ids, spec, key, lengths)  # variables as jit arguments
    np.testing.assert_array_equal(jitted.tokens, want)
    other = target.Transformer(dataclasses.replace(config, name="other")).bind({"params": params})
    with pytest.raises(InputError, match="is not SpecConfig.model"):
        lsjax.generate(other, (), ids, spec, key, lengths)
