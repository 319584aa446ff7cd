"""Released LongSpec drafts (sail/longspec-*, the authors' `LlamaGlideDecoderLayer`) on lsjax: read as released,
decoded with the released semantics, matched against the authors' code
(`tests/fixtures/make/longspec_release_fixtures.py`)."""

from __future__ import annotations

import dataclasses
import json
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lsjax.cache import KVCache
from lsjax.config import ModelConfig
from lsjax.engine.types import DraftContext
from lsjax.methods.longspec.drafter import LongSpecDrafter
from lsjax.methods.longspec.release import RELEASED, read_release
from lsjax.models.draft_params import DraftParams
from lsjax.tree import TreeConfig

FIXTURES = Path(__file__).parent / "fixtures" / "longspec_release"


SHAPES = {"llama": dict(V=97, D=64, N=4, K=2, F=96, theta=1e4), "qwen2": dict(V=89, D=96, N=6, K=1, F=80, theta=1e6)}


def fixture_target(arch: str = "llama") -> ModelConfig:
    sh = SHAPES[arch]
    return ModelConfig(
        arch=arch,
        vocab_size=sh["V"],
        hidden_size=sh["D"],
        intermediate_size=sh["F"],
        num_layers=1,
        num_heads=sh["N"],
        num_kv_heads=sh["K"],
        head_dim=sh["D"] // sh["N"],
        max_position=4096,
        rope_theta=sh["theta"],
        rms_norm_eps=1e-5,
        qkv_bias=arch == "qwen2",
        tie_embeddings=False,
        dtype="float32",
        name=f"{arch} fixture target",
    )


def _released_dir(fx, arch: str, tmp_path: Path) -> Path:
    """The fixture layer's state dict as the authors' files have it: torch's names and layout, an HF config."""
    from safetensors.numpy import save_file

    save_file(
        {k[2:]: np.ascontiguousarray(fx[k]) for k in fx.files if k.startswith("w:")},
        str(tmp_path / "model.safetensors"),
    )
    sh = SHAPES[arch]
    hf = {
        "model_type": arch,
        "hidden_size": sh["D"],
        "intermediate_size": sh["F"],
        "num_attention_heads": sh["N"],
        "num_key_value_heads": sh["K"],
        "num_hidden_layers": 1,
        "vocab_size": sh["V"],
    }
    (tmp_path / "config.json").write_text(json.dumps(hf))
    return tmp_path


def _setup(arch: str, tmp_path: Path, **draft):
    fx = np.load(FIXTURES / f"{arch}.npz")
    config = fixture_target(arch)
    dcfg, weights = read_release(_released_dir(fx, arch, tmp_path), config)
    drafter = LongSpecDrafter(TreeConfig(tuple(int(x) for x in fx["shape"])), dataclasses.replace(dcfg, **draft))
    target = {"embed": jnp.asarray(fx["embed"]), "lm_head": jnp.asarray(fx["lm_head"]).T}
    k = jnp.asarray(fx["k"]).transpose(0, 2, 1, 3)[None]  # [1 layer, B, K, S, H]: the target's last layer
    v = jnp.asarray(fx["v"]).transpose(0, 2, 1, 3)[None]
    prompt = jnp.asarray(fx["prompt"], jnp.int32)
    ctx = DraftContext(target, DraftParams(jax.tree.map(jnp.asarray, weights)), config, backend="xla")
    ring = drafter.init(
        dataclasses.replace(ctx, prompt_tokens=prompt, prompt_lengths=jnp.asarray([prompt.shape[1]])), None
    )
    return fx, config, dcfg, weights, drafter, ctx, (k, v), ring


def _state(fx, r: int, kv, n: int):
    root = jnp.asarray([int(fx[f"round{r}_root"][-1])])
    return types.SimpleNamespace(root=root, cache=KVCache(*kv, jnp.asarray([n], jnp.int32)))


@pytest.mark.parametrize("arch", ["llama", pytest.param("qwen2", marks=pytest.mark.slow)])
def test_draft_matches_the_authors_code(arch, tmp_path):
    """Three rounds of the authors' tree decoding (a 600-token prompt, so the 512-token window binds; beam tree
    2,3,3; after each round the root and 1-2 accepted nodes committed): the root's and every tree level's
    log-probabilities within 1e-4, and the same trees."""
    fx, config, dcfg, weights, drafter, ctx, kv, ring = _setup(arch, tmp_path)
    assert dcfg == RELEASED and "final_norm" not in weights and "self_bq" in weights and "cross_bq" in weights
    assert drafter.check_params(ctx.draft_params, config) is None
    n = fx["prompt"].shape[1]
    for r in range(3):
        state = _state(fx, r, kv, n)
        levels = drafter.level_logits(ctx, state, ring)
        assert len(levels) == 3
        for d, got in enumerate(levels):
            want = fx[f"round{r}_level{d}"]
            got = np.asarray(jax.nn.log_softmax(got, axis=-1))[0]
            np.testing.assert_allclose(got.reshape(want.shape), want, atol=1e-4, err_msg=f"round {r} level {d}")
        tree = drafter.propose(ctx, state, ring, jax.random.key(0))
        np.testing.assert_array_equal(np.asarray(tree.tokens)[0], fx[f"round{r}_tokens"])
        np.testing.assert_array_equal(np.asarray(tree.parents)[0, 1:], fx[f"round{r}_parents"][1:])
        committed = jnp.asarray(fx[f"round{r}_committed"], jnp.int32)[None]
        a = committed.shape[1]
        verdict = types.SimpleNamespace(
            path_tokens=committed, path=jnp.zeros((1, a), jnp.int32), count=jnp.asarray([a], jnp.int32)
        )
        n += a
        ring = drafter.update(ctx, _state(fx, r, kv, n), ring, verdict)


def test_the_frontier_window_is_what_the_release_does(tmp_path):
    """With lsjax's own window (every query sees the last 512 keys) the root step still matches, the tree levels do
    not: the fixture tells the two semantics apart."""
    fx, config, dcfg, weights, mine, ctx, kv, ring = _setup("llama", tmp_path, frontier_window=False)
    levels = mine.level_logits(ctx, _state(fx, 0, kv, fx["prompt"].shape[1]), ring)
    root = np.asarray(jax.nn.log_softmax(levels[0], axis=-1))[0]
    np.testing.assert_allclose(root.reshape(fx["round0_level0"].shape), fx["round0_level0"], atol=1e-4)
    deeper = np.asarray(jax.nn.log_softmax(levels[1], axis=-1))[0]
    assert np.abs(deeper - fx["round0_level1"]).max() > 1e-3


def test_training_loss_matches_the_authors_training_forward(tmp_path):
    """lsjax's LongSpec training loss (`micro_losses`: anchor-offset positions, the windowed self-attention, the
    flash noisy cross-attention at the reference's lag) on the fixture row equals the authors' training forward's
    loss within 1e-4 relative: the trainer is checked, not only the loader. The same row at another lag does not."""
    from lsjax.methods.longspec.losses import micro_losses
    from lsjax.methods.longspec.train_config import LongSpecTrainConfig
    from lsjax.train.config import PositionConfig

    fx, config, dcfg, weights, _, ctx, _, _ = _setup("llama", tmp_path)
    tokens = jnp.asarray(fx["train_tokens"], jnp.int32)
    cfg = LongSpecTrainConfig()
    cfg = dataclasses.replace(cfg, draft=dcfg, positions=PositionConfig(num_anchors=int(fx["train_sink"])))
    micro = {
        "tokens": tokens,
        "offset": jnp.asarray(fx["train_offset"], jnp.int32),
        "loss_mask": (tokens != 0).astype(jnp.float32),
        "target_k": jnp.asarray(fx["train_k"]).transpose(0, 2, 1, 3),
        "target_v": jnp.asarray(fx["train_v"]).transpose(0, 2, 1, 3),
    }
    params = jax.tree.map(jnp.asarray, weights)

    def loss(lag):
        out = micro_losses(params, ctx.target_params, config, cfg, micro, jnp.int32(lag))
        return float(out["ce"] / out["weight"])

    want = float(fx["train_loss"])
    assert abs(loss(int(fx["train_lag"])) - want) <= 1e-4 * abs(want)
    assert abs(loss(int(fx["train_lag"]) % 4 + 1) - want) > 3e-4 * abs(want)  # another lag: 7.7e-4 off


@pytest.mark.slow  # a released layout decodes as lsjax's own: longspec equals AR in tests/test_speculative.py
@pytest.mark.parametrize(
    "frontier", [True, pytest.param(False, marks=pytest.mark.slow)], ids=["released-window", "ring-window"]
)
def test_greedy_equals_ar_with_a_released_layout_draft(tmp_path, frontier):
    """A draft written in the released layout (the target's last layer, with the biases and without the final norm
    a released draft has) reads back to the same weights and decodes exactly AR's tokens, with an 8-token window
    so the frontier window binds, in fewer target forwards."""
    from lsjax.config import GenerateConfig
    from lsjax.engine.types import ARDrafter
    from lsjax.methods.longspec.model import init_draft_params
    from lsjax.methods.longspec.release import write_release
    from tests.test_eagle3 import small_target
    from tests.test_speculative import repetitive_prompts, run

    config, params = small_target()
    dcfg = dataclasses.replace(RELEASED, window=8, frontier_window=frontier)
    dp = init_draft_params(config, dcfg, params)
    dp["self_bq"] = dp["self_bq"] + 0.1  # biases that matter
    write_release(tmp_path, config, dp, prefix="glide.")
    got_cfg, got = read_release(tmp_path, config, dcfg)
    assert set(got) == set(dp) and "final_norm" not in got
    for name in dp:
        np.testing.assert_allclose(got[name], np.asarray(dp[name]), rtol=1e-6, err_msg=name)
    drafter = LongSpecDrafter(TreeConfig((2, 2, 1)), got_cfg)
    assert drafter.ring_size == (8 + 2 if frontier else 8)
    gen = GenerateConfig(max_new_tokens=24, ignore_eos=True)
    prompts = repetitive_prompts(config, 3, 40, seed=1) + [np.arange(3, 12)]
    ar = run(params, config, prompts, gen, ARDrafter())
    sp = run(params, config, prompts, gen, drafter, draft_params=DraftParams(jax.tree.map(jnp.asarray, got)))
    np.testing.assert_array_equal(np.asarray(sp.out), np.asarray(ar.out))
    assert int(sp.steps) < int(ar.steps)


def test_bad_released_drafts_are_one_line(tmp_path):
    """Another target's draft names both shapes; a directory of neither layout lists what was expected."""
    from lsjax.errors import MissingTensorError, ShapeMismatchError
    from lsjax.methods.longspec.model import random_draft_params
    from lsjax.methods.longspec.release import write_release

    config = fixture_target()
    dp = random_draft_params(config, jax.random.key(0), draft=RELEASED)
    write_release(tmp_path / "ok", config, dp)
    other = dataclasses.replace(config, hidden_size=128, head_dim=32, name="other")
    with pytest.raises(
        ShapeMismatchError, match=r"hidden size, heads, MLP width \(64, 4, 96\); other has \(128, 4, 96\)"
    ):
        read_release(tmp_path / "ok", other)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text((tmp_path / "ok" / "config.json").read_text())
    from safetensors.numpy import save_file

    save_file({"fc.weight": np.zeros((2, 2), np.float32)}, str(bad / "model.safetensors"))
    with pytest.raises(MissingTensorError, match="not a released LongSpec draft: expected tensors self_attn"):
        read_release(bad, config)
