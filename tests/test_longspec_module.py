"""The LongSpec draft as a linen module (`LongSpecDraft`): `init` declares the schema (shapes and logical axes),
`apply` runs exactly the functions it wraps (bit for bit, jitted), and the loaders (lsjax's layout and the
released one) name a variable that does not fit, with both shapes."""

from __future__ import annotations

import dataclasses

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lsjax.cache import RingCache, ring_write
from lsjax.config import DraftConfig
from lsjax.errors import MissingTensorError, ShapeMismatchError
from lsjax.methods.longspec import model as draft
from lsjax.methods.longspec.release import RELEASED
from lsjax.models.draft_params import DraftParams
from lsjax.models.module import logical_axes, variables_problem
from tests.tiny import tiny_model

DCFG = DraftConfig(window=6)
B, T, S = 2, 12, 16  # rows, sequence length, target cache slots


def _unboxed(variables):
    return nn.meta.unbox(variables["params"])


def _normal(key, shape, scale=1.0):
    return scale * jax.random.normal(key, shape)


def tiny_inputs():
    """A tiny target, random tokens at plain positions, random target K/V, a ring (one row partly filled)."""
    config, tp = tiny_model()
    keys = jax.random.split(jax.random.key(7), 6)
    K, H = config.num_kv_heads, config.head_dim
    tokens = jax.random.randint(keys[0], (B, T), 0, config.vocab_size)
    pos = jnp.broadcast_to(jnp.arange(T)[None], (B, T))
    tk, tv = _normal(keys[1], (B, K, S, H)), _normal(keys[2], (B, K, S, H))
    ring = ring_write(
        RingCache.zeros(config, B, DCFG.window),
        _normal(keys[3], (B, T, K, H)),
        _normal(keys[4], (B, T, K, H)),
        jnp.zeros((B,), jnp.int32),
        jnp.array([T, 4], jnp.int32),  # row 1: a partly filled ring
    )
    return config, tp, tokens, pos, tk, tv, ring


@pytest.fixture(scope="module")
def tiny():
    return tiny_inputs()


def _draft_weights(config, tp, draft_config=DCFG):
    """The target's last layer with noisy norms (a norm mixed up with another would show)."""
    w = draft.init_draft_params(config, dataclasses.replace(draft_config, init_head_scale=1.0), tp)
    return {k: v + 0.1 * jax.random.normal(jax.random.key(len(k)), v.shape) if "norm" in k else v for k, v in w.items()}


# ---------------------------------------------------------------------------------------------- declaration


@pytest.mark.parametrize("draft_config", [None, DCFG, RELEASED], ids=["own", "window", "released"])
def test_longspec_init_declares_the_schema(draft_config):
    config, _ = tiny_model()
    model = draft.LongSpecDraft(config, draft_config)
    variables = model.init(jax.random.key(0), method="weights")
    assert variables_problem(model, variables["params"]) is None
    specs = draft.param_specs(config, draft_config)
    assert logical_axes(model) == {name: s.logical_axes for name, s in specs.items()}
    params = _unboxed(variables)
    chex.assert_trees_all_equal_shapes(params, {name: jnp.zeros(s.shape) for name, s in specs.items()})
    # random_weights is the existing random init: the same values for the same key.
    key = jax.random.key(3)
    chex.assert_trees_all_equal(model.random_weights(key), draft.random_draft_params(config, key, draft=draft_config))
    rand = draft.init_draft_params(config, draft_config or DraftConfig(), key=key, from_target=False)
    chex.assert_trees_all_equal(rand, model.random_weights(key))


# ---------------------------------------------------------------------------------------------- apply == functions


def test_longspec_apply_equals_the_functions_bit_for_bit(tiny):
    config, tp, tokens, pos, tk, tv, ring = tiny
    w = _draft_weights(config, tp)
    model = draft.LongSpecDraft(config, DCFG)
    ids = jnp.asarray([2, 5, 7, 11, 40, 60], jnp.int32)
    head = draft.with_vocab_head({**w, "vocab_ids": ids}, tp, config).vocab_head

    @jax.jit
    def through_module(w):
        v = {"params": w}
        k, vv = model.apply(v, tp, tokens[:, :3], pos[:, :3] + 20, method="self_kv")
        mask = jnp.broadcast_to(jnp.tril(jnp.ones((3, 3), bool))[None], (B, 3, 3))
        n = jnp.array([9, 14], jnp.int32)
        step = model.apply(v, tp, tokens[:, :3], pos[:, :3] + 20, ring, k, vv, mask, tk, tv, n, method="step")
        lo = (n, jnp.broadcast_to((n - 4)[:, None], (B, 3)))
        windowed = model.apply(
            v, tp, tokens[:, :3], pos[:, :3] + 20, ring, k, vv, mask, tk, tv, n, ring_lo=lo, method="step"
        )
        train = model.apply(v, tp, tokens, pos, tk[:, :, :T], tv[:, :, :T], jnp.int32(2), method="forward_train")
        full = model.apply(v, tp, train, method="logits")
        pruned = model.apply(v, tp, train, ids, method="logits")
        gathered = model.apply(v, tp, train, ids, head, method="logits")
        return k, step, windowed, train, full, pruned, gathered

    @jax.jit
    def through_functions(w):
        k, vv = draft.draft_self_kv(w, tp, config, tokens[:, :3], pos[:, :3] + 20)
        mask = jnp.broadcast_to(jnp.tril(jnp.ones((3, 3), bool))[None], (B, 3, 3))
        n = jnp.array([9, 14], jnp.int32)
        args = (w, tp, config, DCFG, tokens[:, :3], pos[:, :3] + 20, ring, k, vv, mask, tk, tv, n)
        step = draft.draft_step(*args)
        windowed = draft.draft_step(*args, ring_lo=(n, jnp.broadcast_to((n - 4)[:, None], (B, 3))))
        train = draft.draft_forward_train(w, tp, config, DCFG, tokens, pos, tk[:, :, :T], tv[:, :, :T], jnp.int32(2))
        full = draft.draft_logits(w, tp, config, train)
        pruned = draft.draft_logits(w, tp, config, train, ids)
        gathered = draft.draft_logits(DraftParams(w, ids, head), tp, config, train)
        return k, step, windowed, train, full, pruned, gathered

    got, want = through_module(w), through_functions(w)
    for name, a, b in zip(("self_kv", "step", "ring_lo", "forward_train", "logits", "pruned", "head"), got, want):
        chex.assert_shape(a, b.shape)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=name)
    assert np.abs(np.asarray(got[1]) - np.asarray(got[2])).max() > 0  # the ring window mattered


# ---------------------------------------------------------------------------------------------- misfits


def _one_line(e) -> str:
    msg = str(e.value)
    assert "\n" not in msg, msg
    return msg


def test_a_weight_of_another_shape_is_one_line_naming_it_and_both_shapes():
    from lsjax.methods.longspec.checkpoint import check_draft_fits

    config, tp = tiny_model()
    w = {k: np.asarray(v) for k, v in draft.init_draft_params(config, DCFG, tp).items()}
    model = draft.LongSpecDraft(config, DCFG)
    bad = dict(w, cross_wo=w["cross_wo"][:, :, :-1])
    assert variables_problem(model, bad) == (
        "LongSpecDraft: variable cross_wo has shape (6, 8, 47), the module declares (6, 8, 48)"
    )
    with pytest.raises(ShapeMismatchError) as e:
        check_draft_fits(bad, DCFG, config, "d")
    assert "tensor cross_wo has shape (6, 8, 47), this target needs (6, 8, 48)" in _one_line(e)
    # A draft config with biases declares them: a draft without is missing one.
    with pytest.raises(MissingTensorError, match=r"tensor (self|cross)_b[qkv] is missing"):
        check_draft_fits(w, dataclasses.replace(DCFG, qkv_bias=True), config, "d")


def test_released_layout_reads_into_the_module(tmp_path):
    """The released layout's converter gives exactly the module's variables; read for a config that declares a
    final norm (which released drafts do not have), the missing variable is named."""
    from lsjax.methods.longspec.release import read_release, write_release

    config, tp = tiny_model()
    w = draft.random_draft_params(config, jax.random.key(0), draft=RELEASED)
    write_release(tmp_path, config, w)
    dcfg, got = read_release(tmp_path, config)
    assert variables_problem(draft.LongSpecDraft(config, dcfg), got) is None
    chex.assert_trees_all_equal_shapes(got, {k: np.asarray(v) for k, v in w.items()})
    with pytest.raises(MissingTensorError) as e:
        read_release(tmp_path, config, dataclasses.replace(RELEASED, final_norm=True))
    assert "variable final_norm is missing" in _one_line(e)
