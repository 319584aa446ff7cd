"""Training DeLS-Spec's parts through train.py's `fit`: the local head (no target) and the block drafter (from
the shared feature cache). Tiny random targets, synthetic data, a few steps each."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from lsjax.config import from_dict, to_dict
from lsjax.train.config import TrainConfig
from lsjax.train.local_head import split_blocks
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
    return from_dict(TrainConfig, raw)


def test_split_blocks_cuts_consecutive_blocks_at_the_phase():
    tokens = jnp.arange(2 * 20).reshape(2, 20)
    blocks, mask = split_blocks(tokens, tokens % 3, jnp.array([0, 3]), 4)
    assert blocks.shape == (2 * 4, 4)  # nb = 20 // 4 - 1
    np.testing.assert_array_equal(np.asarray(blocks[0]), [0, 1, 2, 3])
    np.testing.assert_array_equal(np.asarray(blocks[4]), [23, 24, 25, 26])
    np.testing.assert_array_equal(np.asarray(blocks[7]), [35, 36, 37, 38])
    np.testing.assert_array_equal(np.asarray(mask), np.asarray(blocks) % 3)


@pytest.mark.parametrize("kind", ["markov", "gru"])
def test_local_head_trains_exports_and_loads(tmp_path, kind):
    """The synthetic stream is mostly t -> 5t + 3 (mod V): one token of context predicts the next. Through a
    48-wide random embedding the rank-16 Markov head learns that map slowly, the GRU quickly. The export holds
    float16 params and the prior, and loads back."""
    from lsjax.drafters.block_checkpoints import load_local_head
    from lsjax.train import fit
    from lsjax.train.export import export_run

    cfg = local_head_cfg(tmp_path, kind)
    out = fit(cfg, log=lambda *_: None)
    losses = out["losses"]
    assert np.mean(losses[-5:]) < {"gru": 0.8, "markov": 0.92}[kind] * np.mean(losses[:3]), losses
    assert out["dev"]["dev_acc"] > {"gru": 0.3, "markov": 0.15}[kind]
    export_run(cfg, tmp_path / "head")
    tiny, _ = tiny_model()
    params, hcfg, prior, vocab_ids, meta = load_local_head(tmp_path / "head", tiny)
    assert hcfg == cfg.local_head and vocab_ids is None
    assert prior.shape == (tiny.vocab_size,) and abs(np.exp(prior).sum() - 1) < 1e-4
    with np.load(tmp_path / "head" / "local_head.npz") as z:
        assert z["w_out"].dtype == np.float16
    np.testing.assert_allclose(params["w_out"], np.asarray(out["state"].params["w_out"]), rtol=1e-2, atol=1e-3)
    assert meta["training"]["steps"] == cfg.num_steps


def test_local_head_pruned_vocab_and_resume(tmp_path):
    """A pruned loss vocabulary travels with the export; a run killed after 4 steps resumes to the same
    params as an uninterrupted one."""
    from lsjax.drafters.block_checkpoints import load_local_head
    from lsjax.train import fit
    from lsjax.train.export import export_run

    over = {"local_head": {"vocab_size": 40}, "checkpoint": {"every": 4}}
    full = fit(local_head_cfg(tmp_path / "a", "gru", steps=8, **over), log=lambda *_: None)
    cfg = local_head_cfg(tmp_path / "b", "gru", steps=8, **over)
    fit(cfg, stop_after=4, log=lambda *_: None)
    resumed = fit(cfg, resume=True, log=lambda *_: None)
    assert resumed["start"] == 4
    for name, leaf in full["state"].params.items():
        np.testing.assert_allclose(np.asarray(resumed["state"].params[name]), np.asarray(leaf), rtol=1e-5, atol=1e-6)
    export_run(cfg, tmp_path / "head")
    _, _, _, vocab_ids, _ = load_local_head(tmp_path / "head")
    assert vocab_ids.shape == (40,)
