"""Training TokenSwift's heads through lsjax.train from a feature cache of the shared layout (a fake with the
spec's interface, filled by running a tiny target): the loss falls, gradients reach only the heads, the run
resumes exactly, and the export loads on the decode side."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lsjax.artifacts import BF16
from lsjax.config import from_dict, load_yaml, to_dict
from lsjax.methods.tokenswift import model as th
from lsjax.methods.tokenswift.train import HeadsTrainConfig, export_heads, fit_heads, heads_losses
from lsjax.train.features import target_features, target_logits
from lsjax.train.inputs import load_target
from tests.tiny import tiny_model


class FakeCache:
    """The shared feature cache's reader interface (`FeatureCache.open(dir)`), held in memory."""

    def __init__(self, arrays: dict, topk: int = 8):
        self.arrays, self.topk, self.mid_layer = arrays, topk, 0
        self.num_sequences, self.seq_len = arrays["tokens"].shape

    def read(self, indices, fields):
        return {f: self.arrays[f][np.asarray(indices)] for f in fields}


def fake_cache(config, params, S=24, T=48, seed=0):
    """Walks of one fixed permutation of the vocabulary from random starts: token t + 1 + i is a function of
    token t, which the target's hidden state at t carries, so every head can learn it."""
    rng = np.random.RandomState(seed)
    perm = rng.permutation(config.vocab_size)
    tokens = np.zeros((S, T), np.int64)
    tokens[:, 0] = rng.randint(0, config.vocab_size, size=S)
    for t in range(1, T):
        tokens[:, t] = perm[tokens[:, t - 1]]
    pos = jnp.broadcast_to(jnp.arange(T)[None], (S, T))
    feats = jax.jit(lambda t: target_features(params, config, t, pos))(jnp.asarray(tokens, jnp.int32))
    logp = jax.nn.log_softmax(target_logits(params, config, feats["hidden"], None), -1)
    top_lp, top_ids = jax.lax.top_k(logp, 8)
    return FakeCache(
        {
            "tokens": tokens.astype(np.int32),
            "loss_mask": np.ones((S, T), np.uint8),
            "hidden": np.asarray(feats["hidden"], np.float16),
            "topk_ids": np.asarray(top_ids, np.int32),
            "topk_logprobs": np.asarray(top_lp, np.float16),
        }
    )


def tiny_cfg(tmp_path, **over) -> HeadsTrainConfig:
    config, _ = tiny_model()
    raw = {
        "kind": "tokenswift-heads",
        "name": "tiny-heads",
        "run_dir": str(tmp_path / "run"),
        "target": {"random_init": True, "model": to_dict(config)},
        "data": {"sets": ["fake"], "seq_len": 32, "batch_size": 4, "dev_sequences": 4},
        "loss": {"distill_weight": 0.5, "chunk_size": 16},
        "optim": {"lr": 0.1, "warmup_steps": 1, "total_steps": 40, "b2": 0.99},
        "checkpoint": {"every": 10},
        "log": {"every": 100, "eval_every": 20, "plot": False, "tensorboard": False, "progress": False},
    }
    for k, v in over.items():
        raw[k] = {**raw.get(k, {}), **v} if isinstance(v, dict) else v
    return from_dict(HeadsTrainConfig, raw)


def test_the_config_file_parses():
    cfg = load_yaml(HeadsTrainConfig, "configs/train/smollm2-tokenswift.yaml")
    assert cfg.heads.num_heads == 3 and cfg.data.sets == ("chat-1500",) and cfg.loss.distill_weight > 0


def _trained(tmp_path):
    cfg = tiny_cfg(tmp_path)
    config, params, _ = load_target(cfg)
    cache = fake_cache(config, params)
    return cfg, config, cache, fit_heads(cfg, log=lambda *_: None, open_set=lambda d: cache)


def test_tiny_training_lowers_the_loss_and_exports(tmp_path):
    cfg, config, _, out = _trained(tmp_path)
    losses = out["losses"]
    assert np.mean(losses[-5:]) < 0.92 * np.mean(losses[:5]), losses
    assert out["final"]["acc1"] > 0.5 and out["final"]["dev_acc1"] > 0.3  # chance: 1 / 97
    export_heads(cfg, tmp_path / "heads")
    from lsjax.methods.tokenswift.checkpoint import load_heads

    got, hcfg, meta = load_heads(tmp_path / "heads", config)
    stored = np.asarray(out["state"].params["w"], BF16).astype(np.float32)  # exported in bf16
    np.testing.assert_array_equal(got["w"], stored)
    assert meta["training"]["steps"] == 40


@pytest.mark.slow
def test_a_killed_run_resumes_exactly(tmp_path):
    """Killed after 15 steps (last checkpoint at 10), then resumed: steps 11..40 replay exactly."""
    _, _, cache, out = _trained(tmp_path)
    cut = tiny_cfg(tmp_path, run_dir=str(tmp_path / "cut"))
    fit_heads(cut, stop_after=15, log=lambda *_: None, open_set=lambda d: cache)
    again = fit_heads(cut, resume=True, log=lambda *_: None, open_set=lambda d: cache)
    assert again["start"] == 10
    np.testing.assert_allclose(again["losses"], out["losses"][10:], rtol=1e-5)


def test_gradients_reach_only_the_heads():
    config, params = tiny_model()
    cache = fake_cache(config, params, S=2, T=16)
    micro = {k: jnp.asarray(v) for k, v in cache.read(np.arange(2), tuple(cache.arrays)).items()}
    hp = th.init_params(config, th.HeadsConfig(3), params)
    cfg = tiny_cfg(Path("unused"))

    def loss(hp, tp):
        sums = heads_losses(hp, tp, config, micro, cfg.loss, 3)
        return jnp.sum(sums["ce"] + sums["distill"])

    g_heads, g_target = jax.grad(loss, argnums=(0, 1))(hp, params)
    assert all(float(jnp.abs(g_heads["w"][i]).sum()) > 0 for i in range(3))
    assert all(float(jnp.abs(x).max()) == 0 for x in jax.tree.leaves(g_target))


def test_labels_are_shifted_by_one_plus_the_head_index():
    """Head i at t is scored against tokens[t + 1 + i]: a head that outputs exactly that token has zero CE."""
    config, params = tiny_model()
    T = 12
    tokens = jnp.arange(3, 3 + T)[None]
    micro = {"tokens": tokens, "loss_mask": jnp.ones((1, T)), "hidden": jnp.zeros((1, T, config.hidden_size))}
    cfg = dataclasses.replace(tiny_cfg(Path("unused")).loss, distill_weight=0.0)

    def fake_logits(p, tp, c, h):  # one-hot on t + 1 + i, read off a position-coded hidden state
        t = jnp.arange(h.shape[1])[None, :, None]
        want = tokens[0][jnp.clip(t + 1 + jnp.arange(1, 4)[None, None], 0, T - 1)]
        return jnp.where(jax.nn.one_hot(want, config.vocab_size, dtype=bool), 30.0, -30.0)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(th, "heads_logits", fake_logits)
        sums = heads_losses({}, params, config, micro, dataclasses.replace(cfg, chunk_size=T), 3)
    np.testing.assert_allclose(np.asarray(sums["ce"]), 0.0, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(sums["weight"]), [T - 2, T - 3, T - 4])
