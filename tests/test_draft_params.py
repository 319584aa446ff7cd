"""DraftParams (weights, pruned vocabulary, derived head as one typed pytree) and the drafts' parameter schemas
(param_specs of the LongSpec and block drafts): jit round trips, the shipped drafts load to the same arrays as
their files and write them back unchanged, init / shape checks / sharding derive from the schema."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec
from safetensors.numpy import load_file

from lsjax import sharding
from lsjax.artifacts import BF16
from lsjax.config import DraftConfig
from lsjax.errors import MissingTensorError, ShapeMismatchError
from lsjax.methods.dels import model as block_draft
from lsjax.methods.longspec import model as draft
from lsjax.models import layers
from lsjax.models.draft_params import DraftParams
from tests.tiny import tiny_model


def _tiny_draft_params(pruned: bool) -> DraftParams:
    config, tp = tiny_model()
    weights = draft.random_draft_params(config, jax.random.key(1))
    ids = jnp.asarray([2, 5, 7, 11, 40], jnp.int32) if pruned else None
    return DraftParams(weights, ids).with_vocab_head(tp, config)


# ---------------------------------------------------------------------------------------------- DraftParams


@pytest.mark.parametrize("pruned", [False, True])
def test_draft_params_is_a_pytree_that_round_trips_through_jit(pruned):
    p = _tiny_draft_params(pruned)
    assert (p.vocab_head is not None) == pruned
    leaves, treedef = jax.tree.flatten(p)
    assert len(leaves) == len(p.weights) + 2 * pruned
    assert jax.tree.unflatten(treedef, leaves) == p
    out = jax.jit(lambda x: x)(p)
    assert isinstance(out, DraftParams) and out.weights.keys() == p.weights.keys()
    for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(p)):
        np.testing.assert_array_equal(a, b)
    # A jitted function reads the fields by name and maps over the whole structure.
    doubled = jax.jit(lambda x: jax.tree.map(lambda a: a * 2, x))(p)
    np.testing.assert_array_equal(doubled.weights["self_wq"], 2 * p.weights["self_wq"])
    assert (doubled.vocab_ids is None) == (not pruned)


@pytest.mark.parametrize("tied", [True, False])
def test_the_head_rows_gathered_on_the_host_equal_the_device_gather(tied):
    """A host (numpy) target's head rows are gathered there (no device copy of the whole table first): the
    same rows as the device gather, for a tied embedding and a separate LM head."""
    from lsjax.models.draft_params import vocab_head_rows

    config, tp = tiny_model()
    config = dataclasses.replace(config, tie_embeddings=tied)
    V, D = config.vocab_size, config.hidden_size
    tp = {**tp, "lm_head": jax.random.normal(jax.random.key(5), (D, V))} if not tied else tp
    ids = np.asarray([2, 5, 7, 11, 40], np.int32)
    host = {k: np.asarray(v) for k, v in tp.items() if k in ("embed", "lm_head")}
    on_host = vocab_head_rows(host, config, ids)
    assert isinstance(on_host, jax.Array) and on_host.shape == (len(ids), D)
    np.testing.assert_array_equal(on_host, vocab_head_rows(tp, config, jnp.asarray(ids)))
    table = host["embed"] if tied else host["lm_head"].T
    np.testing.assert_array_equal(on_host, table[ids])


def test_file_layout_round_trip():
    p = _tiny_draft_params(True)
    arrays = p.arrays()
    assert set(arrays) == set(p.weights) | {"vocab_ids"}  # the derived head is never part of the file
    back = DraftParams.from_arrays(arrays)
    assert back.vocab_head is None and back.weights.keys() == p.weights.keys()
    np.testing.assert_array_equal(back.vocab_ids, p.vocab_ids)
    assert DraftParams.of(back) is back
    assert DraftParams.of(p.weights).vocab_ids is None and "vocab_ids" not in DraftParams(p.weights).arrays()
    # A dict from before the type existed (weights, vocab_ids, vocab_head in one) splits into the three parts.
    legacy = DraftParams.of({**arrays, "vocab_head": p.vocab_head})
    np.testing.assert_array_equal(legacy.vocab_head, p.vocab_head)
    assert legacy.weights.keys() == p.weights.keys()


def test_draft_logits_with_the_gathered_head_equal_the_gather_per_call():
    config, tp = tiny_model()
    p = _tiny_draft_params(True)
    h = jax.random.normal(jax.random.key(4), (2, 3, config.hidden_size))
    per_call = draft.draft_logits(p.weights, tp, config, h, p.vocab_ids)
    np.testing.assert_allclose(draft.draft_logits(p, tp, config, h), per_call, atol=1e-6)
    full = draft.draft_logits(DraftParams(p.weights), tp, config, h)
    np.testing.assert_allclose(per_call, full[..., np.asarray(p.vocab_ids)], atol=1e-6)


def test_shipped_draft_loads_to_the_arrays_of_its_file(ours):
    """The shipped LongSpec draft: the weights and vocabulary the drafter runs with are the file's arrays bit for
    bit (what the dict held before), the head is the target's rows at the vocabulary, and writing the params
    back gives the same file contents."""
    from lsjax.methods.longspec.checkpoint import DRAFTS_DIR, load_longspec
    from lsjax.methods.longspec.export import save_draft

    path = DRAFTS_DIR / "SmolLM2-135M-Instruct"
    raw = load_file(path / "model.safetensors")  # as stored: bf16 weights, int32 vocab_ids
    file_arrays = {k: v.astype(np.float32) if v.dtype == BF16 else v for k, v in raw.items()}
    _, p = load_longspec(ours, None, None)
    assert isinstance(p, DraftParams)
    assert set(p.weights) == set(file_arrays) - {"vocab_ids"}
    for k, v in p.weights.items():
        assert np.asarray(v).dtype == file_arrays[k].dtype and np.array_equal(np.asarray(v), file_arrays[k]), k
    np.testing.assert_array_equal(p.vocab_ids, file_arrays["vocab_ids"])
    embed = np.asarray(ours.params["embed"])
    np.testing.assert_array_equal(np.asarray(p.vocab_head), embed[file_arrays["vocab_ids"]])

    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        save_draft(tmp, p, DraftConfig(), "SmolLM2-135M-Instruct")
        again = load_file(f"{tmp}/model.safetensors")
    assert again.keys() == raw.keys()
    for k, v in raw.items():
        assert again[k].dtype == v.dtype and np.array_equal(again[k], v), k


def test_shipped_block_draft_loads_to_the_arrays_of_its_file(ours):
    from lsjax.methods.dels.checkpoint import DRAFTS_DIR, load_block

    path = DRAFTS_DIR / "SmolLM2-135M-Instruct" / "block-s8"
    file_arrays = {
        k: v.astype(np.float32) if v.dtype == BF16 else v for k, v in load_file(path / "model.safetensors").items()
    }
    p, _, bcfg = load_block(ours, None, 8)
    assert isinstance(p, DraftParams) and bcfg.block_size == 8
    assert set(p.weights) == set(file_arrays) - {"vocab_ids"} and "mask_embed" in p.weights
    for k, v in p.weights.items():
        assert np.array_equal(np.asarray(v), file_arrays[k]), k
    if "vocab_ids" in file_arrays:
        np.testing.assert_array_equal(p.vocab_ids, file_arrays["vocab_ids"])
        np.testing.assert_array_equal(
            np.asarray(p.vocab_head), np.asarray(ours.params["embed"])[file_arrays["vocab_ids"]]
        )


# ---------------------------------------------------------------------------------------------- param_specs


@pytest.mark.parametrize("bias", [False, True])
def test_draft_init_follows_the_schema(bias):
    config, tp = tiny_model()
    config = dataclasses.replace(config, qkv_bias=bias)
    if bias:  # a target with biases to copy them from
        tp = {**tp, "layers": {**tp["layers"], **_biases(config)}}
    specs = draft.param_specs(config)
    assert ("self_bq" in specs) == bias and ("cross_bq" in specs) == bias
    for params in (
        draft.random_draft_params(config, jax.random.key(0)),
        draft.init_draft_params(config, DraftConfig(), tp),
    ):
        assert set(params) == set(specs)
        for name, s in specs.items():
            assert params[name].shape == s.shape and params[name].dtype == jnp.dtype(s.dtype), name
            assert len(s.logical_axes) == len(s.shape)
        layers.check_shapes(params, specs)
    block_specs = block_draft.param_specs(config)
    assert set(block_specs) == set(specs) | {"mask_embed"} and block_specs["mask_embed"].shape == (config.hidden_size,)
    layers.check_shapes(block_draft.init_block_params(config, DraftConfig(), tp), block_specs)


def _biases(config):
    L, N, K, H = config.num_layers, config.num_heads, config.num_kv_heads, config.head_dim
    r = np.random.default_rng(0)
    return {n: jnp.asarray(r.standard_normal(s), jnp.float32) for n, s in
            {"bq": (L, N, H), "bk": (L, K, H), "bv": (L, K, H)}.items()}  # fmt: skip


def test_random_draft_params_keep_their_values():
    """Derived from the schema, random init still draws the same numbers (tests' tiny drafts keep their
    weights): one key per matrix, in the order self_wq, self_wk, self_wv, self_wo, cross_wq, cross_wo,
    w_gate, w_up, w_down; ones for the norms."""
    config, _ = tiny_model()
    key = jax.random.key(5)
    got = draft.random_draft_params(config, key, scale=0.3)
    names = ("self_wq", "self_wk", "self_wv", "self_wo", "cross_wq", "cross_wo", "w_gate", "w_up", "w_down")
    for name, k in zip(names, jax.random.split(key, len(names))):
        want = (0.3 * jax.random.normal(k, got[name].shape)).astype(jnp.dtype(config.dtype))
        np.testing.assert_array_equal(got[name], want, err_msg=name)
    for name in ("self_norm", "cross_norm", "mlp_norm", "final_norm"):
        assert np.all(np.asarray(got[name]) == 1), name


def test_draft_shape_checks_derive_from_the_schema():
    from lsjax.methods.dels.checkpoint import check_block_fits
    from lsjax.methods.longspec.checkpoint import check_draft_fits

    config, tp = tiny_model()
    arrays = {k: np.asarray(v) for k, v in block_draft.init_block_params(config, DraftConfig(), tp).items()}
    check_draft_fits(arrays, DraftConfig(), config, "here")
    check_block_fits(arrays, DraftConfig(), config, "here")
    with pytest.raises(MissingTensorError, match="mask_embed"):
        check_block_fits({k: v for k, v in arrays.items() if k != "mask_embed"}, DraftConfig(), config, "here")
    with pytest.raises(ShapeMismatchError, match="w_up"):
        check_draft_fits(dict(arrays, w_up=arrays["w_up"][:, :-1]), DraftConfig(), config, "here")


def test_draft_sharding_from_the_module_metadata():
    """The block draft's shardings come from the logical axes its module declares: its declared variables and a
    params tree of the same names get the same specs (the width FSDP-sharded, heads and norms whole)."""
    config, tp = tiny_model()
    mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:1]).reshape(1, 1), ("data", "fsdp"))
    model = block_draft.BlockDraft(config, DraftConfig())
    params = block_draft.init_block_params(config, DraftConfig(), tp)
    from_module = sharding.module_shardings(model, mesh)
    by_tree = sharding.tree_shardings(params, mesh, sharding.model_axes(model))
    assert from_module.keys() == by_tree.keys() == block_draft.param_specs(config).keys()
    for name, s in from_module.items():
        assert s.spec == by_tree[name].spec, name
    assert from_module["self_wq"].spec == PartitionSpec("fsdp", None, None)
    assert from_module["w_down"].spec == PartitionSpec(None, "fsdp")
