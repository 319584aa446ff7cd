"""Training the streams from the shared feature cache: only stream params learn, the loss falls, runs resume
exactly, and the exported checkpoint decodes losslessly."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lsjax.config import ConfigError, GenerateConfig, ModelConfig, from_dict, to_dict
from lsjax.engine.types import ARDrafter
from lsjax.methods.streams.checkpoint import load_streams_drafter
from lsjax.methods.streams.train import StreamsTrainConfig, fit_streams, sample_positions
from lsjax.models import target as target_lib
from lsjax.train import feature_cache as fcm

CFG = ModelConfig(
    vocab_size=61, hidden_size=32, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=8, intermediate_size=64
)


def _motifs(S, T, seed=0):
    """Sequences of repeated short motifs: what follows is predictable from the context."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(S):
        motif = rng.integers(3, CFG.vocab_size, size=rng.integers(3, 6))
        rows.append(np.resize(motif, T))
    return np.stack(rows).astype(np.int32)


def _cfg(tmp_path, cache_dir, **over) -> StreamsTrainConfig:
    raw = {
        "name": "tiny-streams",
        "run_dir": str(tmp_path / "run"),
        "target": {"random_init": True, "model": to_dict(CFG)},
        "streams": {"num_streams": 2, "msa_layers": 2, "rank": 8},
        "data": {"set": str(cache_dir), "seq_len": 48, "batch_size": 2, "grad_accum": 2, "positions": 40},
        "optim": {"lr": 2e-2, "warmup_steps": 2, "total_steps": 60, "weight_decay": 0.0},
        "checkpoint": {"every": 10},
        "log": {"progress": False, "plot": False, "every": 100},
        "tree": "2,2",
    }
    for k, v in over.items():
        raw[k] = raw.get(k, {}) | v if isinstance(v, dict) else v
    return from_dict(StreamsTrainConfig, raw)


def tiny_target():
    """A random target with peaky logits (the default init's 0.02 leaves them near uniform)."""
    return CFG, target_lib.init_params(CFG, jax.random.PRNGKey(3), scale=0.3), None


@pytest.fixture(scope="module")
def feature_set(tmp_path_factory):
    d = tmp_path_factory.mktemp("features") / "motifs"
    config, params, _ = tiny_target()
    toks = _motifs(16, 48)
    fcm.build(
        d,
        toks,
        np.ones_like(toks, np.uint8),
        params,
        config,
        spec=fcm.FeatureSpec(2, 4),
        shard_size=8,
        batch_size=4,
        progress=False,
    )
    return d


@pytest.fixture(scope="module")
def trained(tmp_path_factory, feature_set):
    cfg = _cfg(tmp_path_factory.mktemp("trained"), feature_set)
    return cfg, fit_streams(cfg, log=lambda *_: None, target=tiny_target())


def test_training_lowers_the_loss_and_only_trains_stream_params(trained):
    cfg, out = trained
    config, target_params, _ = tiny_target()
    losses = out["losses"]
    assert np.mean(losses[-10:]) < 0.85 * np.mean(losses[:10]), losses
    # The optimizer holds the stream params and nothing else, and every one of them moved. (The target is an
    # argument of the step that is never differentiated: it cannot change.)
    from lsjax.methods.streams import model as ss

    params = out["state"].params
    assert set(params) == set(ss.param_specs(config, cfg.streams))
    assert jax.tree.structure(out["state"].opt_state[1][0].mu) == jax.tree.structure(params)
    init = ss.init_params(config, cfg.streams, jax.random.PRNGKey(cfg.seed))
    for name in params:
        assert float(jnp.abs(params[name] - init[name]).max()) > 0, name


@pytest.mark.slow
def test_trained_streams_decode_losslessly_and_get_accepted(trained, tmp_path):
    cfg, out = trained
    config, target_params, _ = tiny_target()
    model = type("M", (), {"config": config, "params": target_params, "path": tmp_path / "tiny"})()
    drafter, sp = load_streams_drafter(model, out["export"])
    assert drafter.widths == (2, 2)
    from tests.test_speculative import run

    prompts = [list(p[:30]) for p in _motifs(3, 30, seed=9)]
    gen = GenerateConfig(max_new_tokens=16, ignore_eos=True)
    ar = run(target_params, config, prompts, gen, ARDrafter())
    st = run(target_params, config, prompts, gen, drafter, draft_params=jax.tree.map(jnp.asarray, sp))
    np.testing.assert_array_equal(np.asarray(st.out), np.asarray(ar.out))
    assert int(st.active_steps) < int(ar.active_steps)


@pytest.mark.slow
def test_resume_is_exact(tmp_path, feature_set):
    cfg = _cfg(tmp_path, feature_set, optim={"total_steps": 6}, checkpoint={"every": 3})
    whole = fit_streams(cfg, log=lambda *_: None, target=tiny_target())
    cfg2 = _cfg(
        tmp_path, feature_set, run_dir=str(tmp_path / "run2"), optim={"total_steps": 6}, checkpoint={"every": 3}
    )
    fit_streams(cfg2, stop_after=3, log=lambda *_: None, target=tiny_target())
    resumed = fit_streams(cfg2, resume=True, log=lambda *_: None, target=tiny_target())
    assert resumed["start"] == 3
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6),
        whole["state"].params,
        resumed["state"].params,
    )


def test_config_and_positions(tmp_path, feature_set):
    with pytest.raises(ConfigError, match="loss.alphas"):
        _cfg(tmp_path, feature_set, loss={"alphas": [1.0]})
    with pytest.raises(ConfigError, match="msa_layers"):  # the set stores layer 2's input, not layer 1's
        fit_streams(_cfg(tmp_path, feature_set, streams={"msa_layers": 3}), log=lambda *_: None, target=tiny_target())
    mask = jnp.zeros((2, 40), jnp.uint8).at[:, 10:20].set(1)
    q = np.asarray(sample_positions(jax.random.key(0), mask, 6))
    assert q.shape == (2, 6) and len(set(q[0])) == 6 and np.all((q + 2 >= 10) & (q + 2 < 20))


@pytest.mark.slow
def test_init_from_continues_a_previous_run(trained, tmp_path, feature_set):
    """A continuation starts from the exported params (its first loss is the trained run's level, not the
    random start's), and a checkpoint trained with other streams settings is refused by field."""
    cfg, out = trained
    cont = _cfg(
        tmp_path,
        feature_set,
        optim={"total_steps": 2, "lr": 1e-9, "warmup_steps": 1},
        checkpoint={"init_from": out["export"]},
    )
    again = fit_streams(cont, log=lambda *_: None, target=tiny_target())
    assert np.mean(again["losses"]) < 0.9 * np.mean(out["losses"][:5]), (again["losses"], out["losses"][:5])
    other = _cfg(tmp_path, feature_set, streams={"rank": 4}, checkpoint={"init_from": out["export"]})
    with pytest.raises(ConfigError, match="checkpoint.init_from"):
        fit_streams(other, log=lambda *_: None, target=tiny_target())
