"""A deeper LongSpec draft (`DraftConfig.depth`): blocks 2.. of cross-attention + MLP, stacked as `deep_*`.

Growth keeps the function; training mode equals inference mode with every block live; a dense reference with the
blocks written out; decoding stays AR's tokens; a checkpoint round trip; the layouts and drafts that cannot hold
more than one block say so in one line. Tiny configs built here."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lsjax.config import ConfigError, DraftConfig, GenerateConfig
from lsjax.engine.types import ARDrafter
from lsjax.methods.longspec import model as draft
from lsjax.methods.longspec.drafter import LongSpecDrafter
from lsjax.models import target
from lsjax.tree import TreeConfig
from tests import test_draft
from tests.test_draft import DCFG, TINY, W, dense_attention
from tests.test_draft import T as LEN
from tests.test_speculative import repetitive_prompts, run
from tests.tiny import tiny_model

DEEP2 = dataclasses.replace(DCFG, depth=2)
setup = test_draft.setup  # the tiny target, a random one-block draft, tokens and the target's K/V
forward_train = jax.jit(draft.draft_forward_train, static_argnums=(2, 3))


def deep_params(s, depth=2, seed=7):
    """The fixture's draft grown to `depth`, then every deep weight made random (norms 1 + noise): all blocks live."""
    grown = draft.grow_depth(s["dp"], depth)
    rng = np.random.default_rng(seed)
    out = dict(grown)
    for name, w in grown.items():
        if name.startswith(draft.DEEP):
            base = 1.0 if "norm" in name else 0.0
            out[name] = jnp.asarray(base + 0.2 * rng.standard_normal(w.shape), jnp.float32)
    return out


def test_depth_is_validated_in_one_line():
    for bad in (0, 9, 1.5, True):
        with pytest.raises(ConfigError, match=r"^depth: must be an integer in \[1, 8\]"):
            DraftConfig(depth=bad)


def test_schema_stacks_the_deeper_blocks():
    specs = draft.param_specs(TINY, dataclasses.replace(DCFG, depth=3))
    assert specs["deep_cross_wq"].shape == (2, *specs["cross_wq"].shape)
    assert specs["deep_w_down"].logical_axes == ("layers", "mlp", "embed")
    assert {n for n in specs if n.startswith("deep_")} == {"deep_" + n for n in draft.BLOCK if n in specs}
    assert set(draft.param_specs(TINY, DCFG)) == {n for n in specs if not n.startswith("deep_")}


def test_growth_keeps_the_function(setup):
    """A one-block draft grown to 3 blocks gives the same hidden states, in training and at decode."""
    s = setup
    grown = draft.grow_depth(s["dp"], 3)
    assert len(draft.blocks(grown)) == 3
    args = (s["tp"], TINY)
    rest = (s["tokens"], s["pos"], s["tk"], s["tv"], jnp.int32(2))
    one = forward_train(s["dp"], *args, DCFG, *rest)
    three = forward_train(grown, *args, dataclasses.replace(DCFG, depth=3), *rest)
    np.testing.assert_array_equal(np.asarray(one), np.asarray(three))
    with pytest.raises(ValueError, match="more than depth 2"):
        draft.grow_depth(grown, 2)


def reference_forward(s, p, j):
    """The deep draft written out densely: full [T, T] masks, block 2 from its own slice of every deep weight."""
    config, tp = TINY, s["tp"]
    cos, sin = draft._rope(config, s["pos"])
    x = target.embed(tp, s["tokens"])
    q, k, v = draft._self_qkv(p, config, x, cos, sin)
    t, u = np.arange(LEN)[:, None], np.arange(LEN)[None, :]
    o = dense_attention(q, k.swapaxes(1, 2), v.swapaxes(1, 2), jnp.asarray((u <= t) & (u >= t - W)))
    x = x + jnp.einsum("btnh,nhd->btd", o, p["self_wo"])
    second = {name: p["deep_" + name][0] for name in draft.BLOCK if "deep_" + name in p}
    for b in (p, second):
        qc = draft._query(b, config, x, cos, sin, "cross")
        oc = dense_attention(qc, s["tk"], s["tv"], jnp.asarray(u <= t - j))
        x = x + jnp.einsum("btnh,nhd->btd", oc, b["cross_wo"])
        x = x + target.mlp(b, target.rms_norm(x, b["mlp_norm"], config.rms_norm_eps))
    return x


@pytest.mark.parametrize("j", [1, 3])
def test_deep_train_equals_dense_reference_and_decode_step(setup, j):
    """Training mode equals the dense reference, and the decode step (ring = the window before t, target cache
    [0, t - j + 1)) equals training mode at t, with both blocks live."""
    from lsjax.cache import RingCache, ring_write

    s = setup
    p = deep_params(s)
    hidden = forward_train(p, s["tp"], TINY, DEEP2, s["tokens"], s["pos"], s["tk"], s["tv"], jnp.int32(j))
    np.testing.assert_allclose(hidden, reference_forward(s, p, j), atol=2e-5, rtol=1e-5)
    k_all, v_all = draft.draft_self_kv(p, s["tp"], TINY, s["tokens"], s["pos"])
    one_block = forward_train(s["dp"], s["tp"], TINY, DCFG, s["tokens"], s["pos"], s["tk"], s["tv"], jnp.int32(j))
    assert float(jnp.abs(hidden - one_block).max()) > 0.1  # the second block changes the output

    @jax.jit
    def step_at(t):
        ring = ring_write(RingCache.zeros(TINY, 2, W), k_all, v_all, jnp.zeros(2, jnp.int32), jnp.full(2, t))
        tok = jax.lax.dynamic_slice_in_dim(s["tokens"], t, 1, axis=1)
        pos = jax.lax.dynamic_slice_in_dim(s["pos"], t, 1, axis=1)
        tree_k, tree_v = draft.draft_self_kv(p, s["tp"], TINY, tok, pos)
        target_len = jnp.full((2,), jnp.maximum(t - j + 1, 0), jnp.int32)
        mask = jnp.ones((2, 1, 1), bool)
        return draft.draft_step(
            p, s["tp"], TINY, DEEP2, tok, pos, ring, tree_k, tree_v, mask, s["tk"], s["tv"], target_len
        )[:, 0]

    for t in (0, j, W, W + 1, LEN - 1):
        np.testing.assert_allclose(step_at(jnp.int32(t)), hidden[:, t], atol=2e-5, rtol=1e-5, err_msg=f"t={t}")


def test_deep_draft_decodes_the_targets_tokens():
    """Greedy decoding with a live two-block draft (its deep weights random) writes AR's tokens exactly."""
    config, params = tiny_model()
    dcfg = DraftConfig(window=8, depth=2)
    drafter = LongSpecDrafter(TreeConfig((3, 2, 2)), dcfg)
    dp = draft.init_draft_params(config, dataclasses.replace(dcfg, zero_init_outputs=False), params)
    rng = np.random.default_rng(3)
    for name in ("deep_cross_wo", "deep_w_down"):
        dp[name] = jnp.asarray(0.05 * rng.standard_normal(dp[name].shape), dp[name].dtype)
    gen = GenerateConfig(max_new_tokens=24, ignore_eos=True)
    prompts = repetitive_prompts(config, 3, 40, seed=4)
    ar = run(params, config, prompts, gen, ARDrafter())
    sp = run(params, config, prompts, gen, drafter, draft_params=dp)
    np.testing.assert_array_equal(np.asarray(sp.num_out), np.asarray(ar.num_out))
    np.testing.assert_array_equal(np.asarray(sp.out), np.asarray(ar.out))


def test_checkpoint_round_trip_and_shape_checks(tmp_path, setup):
    from lsjax.errors import MissingTensorError
    from lsjax.methods.longspec.checkpoint import check_draft_fits, load_draft
    from lsjax.methods.longspec.export import save_draft

    p = deep_params(setup)
    save_draft(tmp_path / "d", p, DEEP2, "tiny")
    arrays, dcfg, _ = load_draft(tmp_path / "d")
    assert dcfg.depth == 2
    check_draft_fits(arrays, dcfg, TINY, "d")
    np.testing.assert_allclose(arrays["deep_w_up"], np.asarray(p["deep_w_up"]), rtol=1e-2, atol=1e-2)  # bf16 file
    shallow = {n: a for n, a in arrays.items() if not n.startswith("deep_")}
    with pytest.raises(MissingTensorError, match="tensor deep_"):
        check_draft_fits(shallow, dcfg, TINY, "d")


def test_one_block_layouts_refuse_a_deeper_draft(tmp_path, setup):
    from lsjax.methods.dels import model as block_model
    from lsjax.methods.longspec.release import write_release

    with pytest.raises(ConfigError, match=r"^draft\.depth: 2 blocks cannot be expressed in the released layout"):
        write_release(tmp_path / "r", TINY, deep_params(setup))
    with pytest.raises(ConfigError, match=r"^draft\.depth: the block draft \(dels, block\) has one block"):
        block_model.param_specs(TINY, DEEP2)


@pytest.mark.slow  # ~17 s; growth keeping the function is checked above in the default run
def test_trainer_grows_an_init_from_draft(tmp_path):
    """`train.py` with draft.depth 2 and init_from a one-block export: the run starts from the grown draft (the
    same function) and trains every block; a deeper init_from than the config is one line."""
    from lsjax.config import to_dict
    from lsjax.methods.longspec import train as ls_train
    from lsjax.methods.longspec.export import save_draft
    from tests.test_train import TINY as TRAIN_TINY
    from tests.test_train import tiny_cfg

    one = draft.random_draft_params(TRAIN_TINY, jax.random.key(0), draft=DraftConfig())
    save_draft(tmp_path / "one", one, DraftConfig(), "tiny")
    cfg = tiny_cfg(tmp_path / "run", steps=4, checkpoint__init_from=str(tmp_path / "one"), draft__depth=2)
    out = ls_train.fit(cfg, log=lambda *_: None)
    assert np.isfinite(out["losses"]).all()
    from lsjax.train.checkpoint import load_draft_params

    trained = load_draft_params(tmp_path / "run")
    assert trained["deep_w_down"].shape[0] == 1 and np.abs(trained["deep_w_down"]).max() > 0  # it trained
    deep = dataclasses.replace(DraftConfig(), depth=2)
    two = draft.grow_depth(one, 2)
    save_draft(tmp_path / "two", two, deep, "tiny")
    bad = tiny_cfg(tmp_path / "run2", steps=1, checkpoint__init_from=str(tmp_path / "two"))
    with pytest.raises(ConfigError, match=r"^draft\.depth: the init_from draft has 2 blocks, more than 1$"):
        ls_train.fit(bad, log=lambda *_: None)
    assert to_dict(deep)["depth"] == 2
