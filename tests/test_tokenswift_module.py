"""`TokenSwiftHeads`, the heads as a linen module: what `init` declares, `apply` (and its gradient) against the
function bodies bit for bit, and a heads directory of the wrong shape named in one line."""

from __future__ import annotations

import dataclasses

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from lsjax.errors import ShapeMismatchError
from lsjax.methods.tokenswift import model as th
from lsjax.models.module import logical_axes, variables_problem
from tests.tiny import tiny_model


@pytest.mark.parametrize("num_heads", [1, 3])
def test_init_declares_the_schema(num_heads):
    config, params = tiny_model()
    heads = th.TokenSwiftHeads(config, th.HeadsConfig(num_heads))
    key = jax.random.key(0)
    variables = heads.init(key, method="weights")
    assert variables_problem(heads, variables["params"]) is None
    assert logical_axes(heads) == {path: spec.logical_axes for path, spec in heads.schema().items()}
    chex.assert_trees_all_equal_shapes_and_dtypes(nn.meta.unbox(variables["params"]), heads.random_weights(key))
    chex.assert_trees_all_equal(heads.random_weights(key), th.init_params(config, heads.heads, key=key))
    untrained = heads.untrained_weights(params["final_norm"])
    chex.assert_trees_all_equal(untrained, th.init_params(config, heads.heads, params))
    assert float(jnp.abs(untrained["w"]).max()) == 0


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_apply_is_the_function_path_bit_for_bit(tied):
    config, tparams = tiny_model()
    if not tied:
        config = dataclasses.replace(config, tie_embeddings=False)
        tparams = dict(tparams, lm_head=0.3 * jax.random.normal(jax.random.key(4), tparams["embed"].T.shape))
    heads = th.TokenSwiftHeads(config, th.HeadsConfig(3))
    p = heads.random_weights(jax.random.key(1))
    h0 = jax.random.normal(jax.random.key(2), (2, 5, config.hidden_size))

    def apply(method=None):
        return jax.jit(lambda p, tp, h: heads.apply({"params": p}, h, tp, method=method))(p, tparams, h0)

    want = jax.jit(lambda p, tp, h: th.heads_logits(p, tp, config, h))(p, tparams, h0)
    chex.assert_shape(want, (2, 5, 3, config.vocab_size))
    chex.assert_trees_all_equal(apply(), want)
    chex.assert_trees_all_equal(
        apply("all_logits"), jax.jit(lambda p, tp, h: th.all_logits(p, tp, config, h))(p, tparams, h0)
    )
    got = jax.jit(lambda p, h: heads.apply({"params": p}, h, method="states"))(p, h0)
    chex.assert_trees_all_equal(got, jax.jit(lambda p, h: th.head_states(p, config, h))(p, h0))

    # The trainer differentiates through `apply`: the same gradient as through the functions.
    def loss(logits):
        return jnp.sum(jax.nn.log_softmax(logits)[..., 7])

    grad = jax.jit(jax.grad(lambda p: loss(heads.apply({"params": p}, h0, tparams))))(p)
    chex.assert_trees_all_equal(grad, jax.jit(jax.grad(lambda p: loss(th.heads_logits(p, tparams, config, h0))))(p))


def test_a_bad_shape_is_one_line_naming_the_variable_and_both_shapes(tmp_path):
    from lsjax.methods.tokenswift.checkpoint import load_heads, save_heads

    config, params = tiny_model()
    hp = th.init_params(config, th.HeadsConfig(3), params, key=jax.random.key(0))
    save_heads(tmp_path, dict(hp, in_norm=hp["in_norm"][:, :40]), th.HeadsConfig(3), "tiny")
    with pytest.raises(ShapeMismatchError) as e:
        load_heads(tmp_path, config)
    message = str(e.value)
    assert f"heads {tmp_path}: variable in_norm has shape (3, 40), the module declares (3, 48)" in message
    assert "do not fit target" in message and "\n" not in message
