"""`SpeculativeStreams`, the stream parameters as a linen module whose forward reads the target's top layers
(an argument): what `init` declares, `apply` (and its gradient) against the function bodies bit for bit, and a
stream checkpoint of the wrong shape named in one line."""

from __future__ import annotations

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from lsjax.cache import KVCache
from lsjax.errors import ShapeMismatchError
from lsjax.methods.streams import model as ss
from lsjax.models import target
from lsjax.models.module import logical_axes, variables_problem
from tests.test_streams_model import SCFG, small_target, trained_like_params


def test_init_declares_the_schema():
    config, _ = small_target()
    streams = ss.SpeculativeStreams(config, SCFG)
    key = jax.random.key(0)
    variables = streams.init(key, method="weights")
    assert variables_problem(streams, variables["params"]) is None
    assert logical_axes(streams) == {path: spec.logical_axes for path, spec in streams.schema().items()}
    chex.assert_trees_all_equal_shapes_and_dtypes(nn.meta.unbox(variables["params"]), streams.random_weights(key))
    chex.assert_trees_all_equal(streams.random_weights(key), ss.init_params(config, SCFG, key))


@pytest.mark.parametrize("prepared", [False, True], ids=["stacked", "decode-layout"])
def test_apply_is_the_function_path_bit_for_bit(prepared):
    """The training-time forward (causal keys), the head and early exit, jitted, with the target's params in
    either layout as the argument; and the gradient the trainer takes through `apply`."""
    config, params = small_target()
    streams = ss.SpeculativeStreams(config, SCFG)
    sp = trained_like_params(config, SCFG)
    B, T = 2, 9
    L = SCFG.first_layer(config)
    toks = jax.random.randint(jax.random.key(2), (B, T), 3, config.vocab_size)
    pos = jnp.broadcast_to(jnp.arange(T), (B, T))
    mid, _, _ = target.forward_hidden(params, config, toks, pos, KVCache.zeros(config, B, 0), layers=(0, L))
    mid = mid.astype(jnp.dtype(config.dtype))
    _, k, v = ss.main_top_layers(params, config, SCFG, mid, pos)
    main = ss.causal_main_kv(k, v, pos, L)
    tp = target.prepare_for_decode(params, config) if prepared else params

    def apply(*args, method=None):  # jitted over both params; main_kv (a function) closed over
        return jax.jit(lambda p, tp: streams.apply({"params": p}, tp, *args, method=method))(sp, tp)

    s = apply(mid, pos, main)
    chex.assert_shape(s, (B, T, SCFG.num_streams, config.hidden_size))
    chex.assert_trees_all_equal(s, jax.jit(lambda p, tp: ss.stream_hidden(p, tp, config, SCFG, mid, pos, main))(sp, tp))
    chex.assert_trees_all_equal(apply(s, method="logits"), jax.jit(lambda tp: ss.stream_logits(tp, config, s))(tp))
    chex.assert_trees_all_equal(
        apply(mid, method="exit_logits"), jax.jit(lambda p, tp: ss.exit_logits(p, tp, config, mid))(sp, tp)
    )
    exit_h = jax.jit(lambda p: streams.apply({"params": p}, mid, method="exit_hidden"))(sp)
    chex.assert_trees_all_equal(exit_h, jax.jit(lambda p: ss.exit_hidden(p, mid))(sp))

    def loss(s):
        return jnp.sum(jnp.tanh(s))

    grad = jax.jit(jax.grad(lambda p: loss(streams.apply({"params": p}, tp, mid, pos, main))))(sp)
    want = jax.jit(jax.grad(lambda p: loss(ss.stream_hidden(p, tp, config, SCFG, mid, pos, main))))(sp)
    chex.assert_trees_all_equal(grad, want)


def test_a_bad_shape_is_one_line_naming_the_variable_and_both_shapes(tmp_path):
    from lsjax.methods.streams.checkpoint import check_streams_fit

    config, _ = small_target()
    sp = trained_like_params(config, SCFG)
    bad = dict(sp, adapter_down=sp["adapter_down"][:, :, :3])
    with pytest.raises(ShapeMismatchError) as e:
        check_streams_fit(bad, config, SCFG, str(tmp_path))
    message = str(e.value)
    assert message == (
        f"streams {tmp_path}: variable adapter_down has shape (2, 48, 3), the module declares (2, 48, 4); "
        f"it does not fit target {config.name}"
    )
    with pytest.raises(ShapeMismatchError, match="variable exit_up is missing"):
        check_streams_fit({k: v for k, v in sp.items() if k != "exit_up"}, config, SCFG, "x")
