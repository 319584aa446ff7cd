"""`Eagle3Draft`, the EAGLE-3 draft as a linen module: what `init` declares, `apply` against the function bodies
bit for bit, both published layouts read into its params, and a bad shape named in one line."""

from __future__ import annotations

import dataclasses

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lsjax.errors import InputError, ShapeMismatchError
from lsjax.methods.eagle3 import model as em
from lsjax.methods.eagle3.checkpoint import random_draft, read_draft, write_draft
from lsjax.models.layers import embed
from lsjax.models.module import logical_axes, variables_problem
from tests.test_eagle3 import small_target


@pytest.fixture(scope="module")
def tiny():
    """(target config, target params, an Eagle3Config for that target)."""
    config, params = small_target()
    return config, params, random_draft(config)[0]


@pytest.mark.parametrize("variant", ["target-embed", "own-embed-qk-norm"])
def test_init_declares_the_schema(tiny, variant):
    config, _, cfg = tiny
    if variant != "target-embed":
        cfg = dataclasses.replace(cfg, own_embed=True, layer=dataclasses.replace(cfg.layer, qk_norm=True))
    draft = em.Eagle3Draft(cfg)
    key = jax.random.key(0)
    variables = draft.init(key, method="weights")
    assert variables_problem(draft, variables["params"]) is None
    assert logical_axes(draft) == {path: spec.logical_axes for path, spec in draft.schema().items()}
    chex.assert_trees_all_equal_shapes_and_dtypes(nn.meta.unbox(variables["params"]), em.init_params(cfg, key))
    # The random init is init_params' (a test's random draft keeps its weights).
    chex.assert_trees_all_equal(draft.random_weights(key), em.init_params(cfg, key))


def test_apply_is_the_function_path_bit_for_bit(tiny):
    """Every method, jitted, against the body functions it runs (what the drafter called before the module)."""
    from lsjax.cache import KVCache

    config, tparams, cfg = tiny
    draft = em.Eagle3Draft(cfg)
    p = draft.random_weights(jax.random.key(1))
    B, T, c = 2, 5, cfg.layer
    ks = jax.random.split(jax.random.key(2), 5)
    aux = jax.random.normal(ks[0], (B, T, len(cfg.aux_layers) * cfg.target_hidden_size)).astype(config.dtype)
    tokens = jax.random.randint(ks[1], (B, T), 0, config.vocab_size)
    g = jax.random.normal(ks[2], (B, T, cfg.hidden_size))
    pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32) + 7, (B, T))
    cache = KVCache.zeros(c, B, 16)
    cache = KVCache(jax.random.normal(ks[3], cache.k.shape), jax.random.normal(ks[4], cache.v.shape), cache.lengths)
    attend = em.attend_over(cache.k, cache.v, jnp.array([7, 3], jnp.int32), backend="auto")
    table = tparams["embed"]

    def apply(*args, method=None):  # jitted over the params; the rest (attend is a function) closed over
        return jax.jit(lambda p: draft.apply({"params": p}, *args, method=method))(p)

    def body(f):
        return jax.jit(f)(p)

    def emb(p, tok):
        return embed({"embed": em.embed_rows(p, tparams)}, tok)

    want = body(lambda p: em.layer(p, cfg, emb(p, tokens), em.fuse(p, aux), pos, attend))
    chex.assert_trees_all_equal(apply(aux, tokens, pos, attend, table), want)
    want = body(lambda p: em.layer(p, cfg, emb(p, tokens), g, pos, attend))
    chex.assert_trees_all_equal(apply(tokens, g, pos, attend, table, method="expand"), want)
    logits = apply(g, method="logits")
    chex.assert_shape(logits, (B, T, cfg.draft_vocab_size))
    chex.assert_trees_all_equal(logits, body(lambda p: em.logits(p, cfg, g)))
    ids = jnp.arange(cfg.draft_vocab_size)[::-1]
    np.testing.assert_array_equal(apply(ids, method="target_ids"), jnp.take(p["draft_to_target"], ids))
    with pytest.raises(InputError, match="no embedding table of its own"):
        draft.apply({"params": p}, tokens, method="embed")


@pytest.mark.parametrize("fmt", ["eagle", "speculators"])
def test_both_published_layouts_read_into_the_module(tiny, tmp_path, fmt):
    config, _, cfg = tiny
    _, dp, _ = random_draft(config, seed=2)
    got_cfg, got, _ = read_draft(write_draft(tmp_path, cfg, dp, fmt), config)
    assert variables_problem(em.Eagle3Draft(got_cfg), got) is None
    chex.assert_trees_all_equal(got, dp)


def test_a_bad_shape_is_one_line_naming_the_variable_and_both_shapes(tiny, tmp_path):
    from safetensors.numpy import load_file, save_file

    config, _, cfg = tiny
    draft = em.Eagle3Draft(cfg)
    p = draft.random_weights(jax.random.key(0))
    bad = dict(p, wq=p["wq"][:, :1])
    assert variables_problem(draft, bad) == (
        f"Eagle3Draft: variable wq has shape {bad['wq'].shape}, the module declares {p['wq'].shape}"
    )
    # In a published file: the tensor by its published name and shape, and the shape lsjax's layout needs
    # (a q_proj whose rows do not make whole heads included).
    _, dp, _ = random_draft(config)
    path = write_draft(tmp_path, cfg, dp, "speculators")
    tensors = load_file(str(path / "model.safetensors"))
    name = "layers.0.self_attn.q_proj.weight"
    rows, cols = tensors[name].shape
    tensors[name] = tensors[name][: rows - 1]
    save_file(tensors, str(path / "model.safetensors"))
    with pytest.raises(ShapeMismatchError) as e:
        read_draft(path, config)
    message = str(e.value)
    assert f"tensor {name} has shape {(rows - 1, cols)}" in message and f"{p['wq'].shape}" in message
    assert "\n" not in message
