"""The DeLS block draft and local head as linen modules (`BlockDraft`, `LocalHead`): `init` declares their schemas
(shapes and logical axes), `apply` runs exactly the functions they wrap (bit for bit, jitted), and their loaders
name a variable that does not fit, with both shapes."""

from __future__ import annotations

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lsjax.config import LocalHeadConfig
from lsjax.errors import ShapeMismatchError
from lsjax.methods.dels import local_head as lh
from lsjax.methods.dels import model as bd
from lsjax.methods.longspec import model as draft
from lsjax.models.module import logical_axes, variables_problem
from tests.test_longspec_module import DCFG, T, _one_line, _unboxed, tiny_inputs
from tests.tiny import tiny_model


@pytest.fixture(scope="module")
def tiny():
    return tiny_inputs()


# ---------------------------------------------------------------------------------------------- declaration


def test_block_draft_and_local_head_init_declare_their_schemas():
    config, _ = tiny_model()
    block = bd.BlockDraft(config, DCFG, 4)
    variables = block.init(jax.random.key(0), method="weights")
    assert variables_problem(block, variables["params"]) is None
    specs = bd.param_specs(config, DCFG)
    assert logical_axes(block) == {name: s.logical_axes for name, s in specs.items()}
    assert logical_axes(block)["mask_embed"] == ("embed",)
    # The LongSpec draft's random weights for the same key, plus the mask embedding.
    key = jax.random.key(2)
    rand = block.random_weights(key)
    chex.assert_trees_all_equal(
        {k: v for k, v in rand.items() if k != "mask_embed"}, draft.random_draft_params(config, key)
    )
    chex.assert_shape(rand["mask_embed"], (config.hidden_size,))

    for cfg in (LocalHeadConfig(hidden=16, rank=8), LocalHeadConfig(kind="markov", rank=8)):
        head = lh.LocalHead(cfg, config.hidden_size, embed_rms=0.5)
        variables = head.init(jax.random.key(0), method="weights")
        assert variables_problem(head, variables["params"]) is None
        want = lh.param_specs(cfg, config.hidden_size)
        assert logical_axes(head) == {name: s.logical_axes for name, s in want.items()}
        chex.assert_trees_all_equal_shapes(
            _unboxed(variables), {n: jnp.zeros(s) for n, s in lh.param_shapes(cfg, 48).items()}
        )
        key = jax.random.key(4)
        chex.assert_trees_all_equal(head.random_weights(key), lh.init_params(cfg, config.hidden_size, key, 0.5))
        assert lh.config_of(head.random_weights(key)) == cfg


# ---------------------------------------------------------------------------------------------- apply == functions


def test_block_draft_apply_equals_the_functions_bit_for_bit(tiny):
    config, tp, tokens, pos, tk, tv, ring = tiny
    w = bd.init_block_params(config, dataclasses.replace(DCFG, init_head_scale=1.0), tp)
    w["mask_embed"] = 0.3 * jax.random.normal(jax.random.key(1), w["mask_embed"].shape)
    s = 3
    model = bd.BlockDraft(config, DCFG, s)
    root, n = tokens[:, 5], jnp.array([9, 14], jnp.int32)
    anchors = jnp.array([[2, 6], [1, 7]], jnp.int32)

    @jax.jit
    def through_module(w):
        v = {"params": w}
        h = model.apply(v, tp, root, n, ring, tk, tv, n, backend="xla", method="hidden")
        train = model.apply(v, tp, tokens, anchors, tk[:, :, :T], tv[:, :, :T], method="hidden_train")
        return h, train, model.apply(v, tp, h, method="logits")

    @jax.jit
    def through_functions(w):
        h = bd.block_hidden(w, tp, config, s, root, n, ring, tk, tv, n, backend="xla")
        train = bd.block_hidden_train(w, tp, config, DCFG, s, tokens, anchors, tk[:, :, :T], tv[:, :, :T])
        return h, train, draft.draft_logits(w, tp, config, h)

    for name, a, b in zip(("hidden", "hidden_train", "logits"), through_module(w), through_functions(w)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=name)


@pytest.mark.parametrize("kind", ["gru", "markov"])
def test_local_head_apply_equals_the_functions_bit_for_bit(kind):
    config, tp = tiny_model()
    cfg = LocalHeadConfig(kind=kind, hidden=16, rank=8, block_size=4)
    params = lh.init_params(cfg, config.hidden_size, jax.random.key(1), embed_rms=0.3)
    head = lh.LocalHead(cfg, config.hidden_size)
    embed = tp["embed"]
    blocks = jax.random.randint(jax.random.key(2), (3, 4), 0, config.vocab_size)
    rows = jnp.asarray([1, 4, 9, 30], jnp.int32)

    @jax.jit
    def through_module(p):
        v = {"params": p}
        state, r = head.apply(v, embed, lh.init_state(cfg, (3,)), blocks[:, 0], method="step")
        states = head.apply(v, embed, blocks, method="block_states")
        return (
            state,
            r,
            states,
            head.apply(v, embed, states, rows, method="logits"),
            head.apply(v, embed, rows, method="vocab_table"),
        )

    @jax.jit
    def through_functions(p):
        state, r = lh.step(p, cfg, embed, lh.init_state(cfg, (3,)), blocks[:, 0])
        states = lh.block_states(p, cfg, embed, blocks)
        return state, r, states, lh.logits(p, embed, states, rows), lh.vocab_table(p, embed, rows)

    for name, a, b in zip(
        ("state", "r", "block_states", "logits", "table"), through_module(params), through_functions(params)
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=name)


# ---------------------------------------------------------------------------------------------- misfits


def test_a_weight_of_another_shape_is_one_line_naming_it_and_both_shapes(tmp_path):
    from lsjax.methods.dels.checkpoint import check_block_fits, load_local_head, save_local_head

    config, tp = tiny_model()
    w = {k: np.asarray(v) for k, v in bd.init_block_params(config, DCFG, tp).items()}
    # The block draft's module: the LongSpec draft's variables and its mask embedding.
    check_block_fits(w, DCFG, config, "b")
    with pytest.raises(ShapeMismatchError) as e:
        check_block_fits(dict(w, mask_embed=np.zeros(47, np.float32)), DCFG, config, "b")
    assert "tensor mask_embed has shape (47,), this target needs (48,)" in _one_line(e)

    # The local head's loader checks its file against LocalHead(cfg, D).
    cfg = LocalHeadConfig(hidden=16, rank=8)
    params = lh.init_params(cfg, config.hidden_size, jax.random.key(0))
    prior = np.zeros(config.vocab_size, np.float32)
    save_local_head(tmp_path / "ok", params, cfg, prior, "tiny")
    load_local_head(tmp_path / "ok", config)
    save_local_head(tmp_path / "bad", dict(params, w_rank=params["w_rank"][:, :7]), cfg, prior, "tiny")
    with pytest.raises(ShapeMismatchError) as e:
        load_local_head(tmp_path / "bad", config)
    assert _one_line(e) == (
        f"local head {tmp_path / 'bad'} does not fit target {config.name}: variable w_rank has shape (16, 7), "
        "the module declares (16, 8)"
    )
