"""Training DeLS-Spec's parts through train.py's `fit`: the local head (no target) and the block drafter (from
the shared feature cache). Tiny random targets, synthetic data, a few steps each."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lsjax.config import from_dict, to_dict
from lsjax.methods.dels.train_config import DelsTrainConfig
from lsjax.methods.dels.train_local_head import split_blocks
from tests.tiny import tiny_model

QUIET = {"progress": False, "plot": False, "tensorboard": False}


def local_head_cfg(tmp_path, kind, steps=30, **over):
    tiny, _ = tiny_model()
    raw = {
        "name": f"lh-{kind}",
        "kind": "local_head",
        "run_dir": str(tmp_path / f"run-{kind}"),
        "target": {"random_init": True, "model": to_dict(tiny)},
        "local_head": {"kind": kind, "hidden": 32, "rank": 16, "block_size": 8},
        "data": {"sources": ["synthetic"], "seq_len": 64, "batch_size": 4, "synthetic_tokens": 16384},
        "loss": {"chunk_size": 64},
        "optim": {"lr": 0.1, "warmup_steps": 2, "total_steps": steps},
        "checkpoint": {"every": steps},
        "log": {**QUIET, "eval_batches": 1},
    }
    for k, v in over.items():
        raw[k] = {**raw.get(k, {}), **v} if isinstance(v, dict) else v
    return from_dict(DelsTrainConfig, raw)


def test_split_blocks_cuts_consecutive_blocks_at_the_phase():
    tokens = jnp.arange(2 * 20).reshape(2, 20)
    blocks, mask = split_blocks(tokens, tokens % 3, jnp.array([0, 3]), 4)
    assert blocks.shape == (2 * 4, 4)  # nb = 20 // 4 - 1
    np.testing.assert_array_equal(np.asarray(blocks[0]), [0, 1, 2, 3])
    np.testing.assert_array_equal(np.asarray(blocks[4]), [23, 24, 25, 26])
    np.testing.assert_array_equal(np.asarray(blocks[7]), [35, 36, 37, 38])
    np.testing.assert_array_equal(np.asarray(mask), np.asarray(blocks) % 3)


@pytest.mark.parametrize("kind", [pytest.param(k, marks=pytest.mark.slow) for k in ("markov", "gru")])  # ~8 s each
def test_local_head_trains_exports_and_loads(tmp_path, kind):
    """The synthetic stream is mostly t -> 5t + 3 (mod V): one token of context predicts the next. Through a
    48-wide random embedding the rank-16 Markov head learns that map slowly, the GRU quickly. The export holds
    float16 params and the prior, and loads back."""
    from safetensors import safe_open

    from lsjax.methods.dels.checkpoint import load_local_head
    from lsjax.methods.dels.export import export_dels
    from lsjax.methods.registry import fit_kind as fit

    cfg = local_head_cfg(tmp_path, kind)
    out = fit(cfg, log=lambda *_: None)
    losses = out["losses"]
    assert np.mean(losses[-5:]) < {"gru": 0.8, "markov": 0.92}[kind] * np.mean(losses[:3]), losses
    assert out["dev"]["dev_acc"] > {"gru": 0.3, "markov": 0.15}[kind]
    export_dels(cfg, tmp_path / "head")
    tiny, _ = tiny_model()
    params, hcfg, prior, vocab_ids, meta = load_local_head(tmp_path / "head", tiny)
    assert hcfg == cfg.local_head and vocab_ids is None
    assert prior.shape == (tiny.vocab_size,) and abs(np.exp(prior).sum() - 1) < 1e-4
    with safe_open(tmp_path / "head" / "model.safetensors", framework="np") as f:
        assert f.get_tensor("w_out").dtype == np.float16 and f.get_tensor("unigram_logprior").dtype == np.float32
    np.testing.assert_allclose(params["w_out"], np.asarray(out["state"].params["w_out"]), rtol=1e-2, atol=1e-3)
    assert meta["training"]["steps"] == cfg.num_steps


@pytest.mark.slow
def test_local_head_pruned_vocab_and_resume(tmp_path):
    """A pruned loss vocabulary travels with the export; a run killed after 4 steps resumes to the same
    params as an uninterrupted one."""
    from lsjax.methods.dels.checkpoint import load_local_head
    from lsjax.methods.dels.export import export_dels
    from lsjax.methods.registry import fit_kind as fit

    over = {"local_head": {"vocab_size": 40}, "checkpoint": {"every": 4}}
    full = fit(local_head_cfg(tmp_path / "a", "gru", steps=8, **over), log=lambda *_: None)
    cfg = local_head_cfg(tmp_path / "b", "gru", steps=8, **over)
    fit(cfg, stop_after=4, log=lambda *_: None)
    resumed = fit(cfg, resume=True, log=lambda *_: None)
    assert resumed["start"] == 4
    for name, leaf in full["state"].params.items():
        np.testing.assert_allclose(np.asarray(resumed["state"].params[name]), np.asarray(leaf), rtol=1e-5, atol=1e-6)
    export_dels(cfg, tmp_path / "head")
    _, _, _, vocab_ids, _ = load_local_head(tmp_path / "head")
    assert vocab_ids.shape == (40,)


def block_cfg(tmp_path, feature_set, steps=30, **over):
    tiny, _ = tiny_model()
    raw = {
        "name": "block",
        "kind": "block",
        "run_dir": str(tmp_path / "run-block"),
        "target": {"random_init": True, "model": to_dict(tiny)},
        "draft": {"window": 8, "draft_vocab_size": 48},
        "block": {"block_size": 4},
        "features": {"set": str(feature_set)},
        "data": {"seq_len": 64, "batch_size": 2, "grad_accum": 2},
        "dels": {"num_anchors": 6, "decay_gamma": 7.0},
        "loss": {"chunk_size": 32, "distill": "argmax", "distill_weight": 1.0},
        "optim": {"lr": 1e-2, "warmup_steps": 2, "total_steps": steps},
        "checkpoint": {"every": steps},
        "log": QUIET,
    }
    for k, v in over.items():
        raw[k] = {**raw.get(k, {}), **v} if isinstance(v, dict) else v
    return from_dict(DelsTrainConfig, raw)


def tiny_feature_set(tmp_path):
    """A shared-feature-cache set of the tiny random target over the synthetic stream (the lead's builder)."""
    from lsjax.train import feature_cache as fcm
    from lsjax.train.inputs import load_target

    cfg = block_cfg(tmp_path, tmp_path / "fs")
    config, params, _ = load_target(cfg)
    rng = np.random.default_rng(0)
    cycle = rng.permutation(np.arange(3, config.vocab_size))[:10]
    stream = cycle[np.arange(16 * 64) % 10]  # a block is predictable from its root ...
    noise = rng.random(stream.shape) < 0.05
    stream = np.where(noise, rng.integers(3, config.vocab_size, stream.shape), stream)  # ... mostly
    tokens = stream.reshape(16, 64).astype(np.int32)
    mask = np.ones_like(tokens, np.uint8)
    mask[:, :10] = 0  # a "user turn": never a target
    spec = fcm.FeatureSpec(mid_layer=1, topk=4)
    fcm.build(tmp_path / "fs", tokens, mask, params, config, spec=spec, shard_size=4, batch_size=4, progress=False)
    return tmp_path / "fs"


def test_block_anchors_and_targets():
    from lsjax.methods.dels.train import block_targets, draw_anchors

    mask = jnp.ones((2, 40)).at[0, :30].set(0)
    a = np.asarray(draw_anchors(jax.random.key(0), mask, 5, 4))
    assert a.shape == (2, 5) and all(len(set(r)) == 5 for r in a.tolist())
    assert (a >= 1).all() and (a < 36).all()
    assert (a[0] >= 29).all()  # row 0: only anchors whose next token carries loss (29..35)
    tokens = jnp.arange(80).reshape(2, 40)
    labels, distill, w = block_targets(tokens, mask, tokens + 1000, jnp.asarray(a), 4, 7.0)
    np.testing.assert_array_equal(np.asarray(labels[1, 0]), a[1, 0] + 40 + np.arange(1, 5))
    np.testing.assert_array_equal(np.asarray(distill[1, 0]), a[1, 0] + 1040 + np.arange(0, 4))
    np.testing.assert_allclose(np.asarray(w[1, 0]), np.exp(-np.arange(4) / 7.0), rtol=1e-6)


@pytest.mark.slow
def test_block_drafter_trains_from_the_feature_cache_and_loads(tmp_path):
    """A tiny smoke run from a built feature-cache set: on fixed sequences and anchors the trained block draft
    beats its initialisation (CE and accuracy); its export loads as a block draft."""
    from lsjax.methods.dels.checkpoint import load_block_draft
    from lsjax.methods.dels.export import export_dels
    from lsjax.methods.dels.train import initial_params, micro_block_losses
    from lsjax.methods.registry import fit_kind as fit
    from lsjax.train import feature_cache as fcm
    from lsjax.train.inputs import load_target

    feature_set = tiny_feature_set(tmp_path)
    cfg = block_cfg(tmp_path, feature_set, steps=40, optim={"lr": 3e-2})
    out = fit(cfg, log=lambda *_: None)
    config, tp, _ = load_target(cfg)
    rows = fcm.FeatureCache.open(feature_set).read(np.arange(4), ("tokens", "loss_mask", "k", "v", "topk_ids"))
    micro = {
        "tokens": jnp.asarray(rows["tokens"]),
        "loss_mask": jnp.asarray(rows["loss_mask"], jnp.float32),
        "target_k_raw": jnp.asarray(rows["k"]),
        "target_v": jnp.asarray(rows["v"]),
        "target_argmax": jnp.asarray(rows["topk_ids"][..., 0]),
    }
    counts = np.bincount(rows["tokens"].ravel(), minlength=config.vocab_size)
    init, vocab_ids = initial_params(cfg, config, tp, counts, log=lambda *_: None)
    vocab_ids = jnp.asarray(np.load(tmp_path / "run-block" / "vocab_ids.npy"))

    def evaluate(p):
        sums = micro_block_losses(p, tp, config, cfg, micro, jax.random.key(9), vocab_ids)
        return float(sums["ce"] / sums["weight"]), float(sums["correct"] / sums["weight"])

    (ce0, acc0), (ce1, acc1) = evaluate(init), evaluate(out["state"].params)
    assert ce1 < ce0 - 0.1 and acc1 > acc0 + 0.2, (ce0, acc0, ce1, acc1)
    export_dels(cfg, tmp_path / "block")
    tiny, _ = tiny_model()
    params, dcfg, bcfg, meta = load_block_draft(tmp_path / "block", tiny)
    assert bcfg.block_size == 4 and dcfg.window == 8 and params["vocab_ids"].shape == (48,)
    assert "mask_embed" in params and meta["training"]["steps"] == 40
    from lsjax.config import ConfigError

    with pytest.raises(ConfigError, match="loss.distill_on"):  # LongSpec's whole-text distillation is not DeLS's
        fit(block_cfg(tmp_path, feature_set, loss={"distill_on": "text"}), log=lambda *_: None)
