"""python -m studies.ablation.ablation end to end on a tiny random target and the synthetic source: three arms
trained a few steps, the loss by position on dev sequences, tau of each exported draft, and the outputs."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import yaml

from lsjax.config import to_dict
from studies.ablation import ablation
from tests.test_train import TINY as TRAIN_TINY

TINY = dataclasses.replace(TRAIN_TINY, max_position=512)  # eval sequences longer than training ones


@pytest.mark.slow  # ~20 s on two cores: the default run stays under 15 min
def test_ablation_end_to_end(tmp_path, capsys):
    base = {
        "name": "tiny-ablation",
        "target": {"random_init": True, "model": to_dict(TINY)},
        "draft": {"window": 16, "draft_vocab_size": 64},
        "data": {"sources": ["synthetic"], "seq_len": 16, "batch_size": 4, "synthetic_tokens": 4096},
        "positions": {"anchor_offset": True, "max_len": 256},
        "loss": {"chunk_size": 8, "distill": "argmax", "distill_weight": 1.0},
        "optim": {"lr": 1e-2, "warmup_steps": 1, "total_steps": 3},
        "checkpoint": {"every": 3, "keep": 1},
        "features": {"enabled": True, "batch_size": 8, "dir": str(tmp_path / "features" / "abl")},
        "log": {"progress": False, "plot": False, "tensorboard": False},
    }
    config = tmp_path / "base.yaml"
    config.write_text(yaml.safe_dump(base))
    out = tmp_path / "out"
    args = ["--config", str(config), "--set", f"run_dir={tmp_path / 'runs'}", "--out", str(out)]
    args += ["--eval-len", "64", "--eval-seqs", "2", "--buckets", "16", "32", "999"]
    args += ["--tree", "2,2", "--tau-prompts", "1", "--tau-len", "40", "--max-new-tokens", "8"]
    assert ablation.main(args) == 0

    result = json.loads((out / "ablation.json").read_text())
    arms = result["arms"]
    assert list(arms) == ["anchor", "plain", "no-noisy"]
    # The resolved configs differ from the base in exactly the arm's factor (and name, run dir, feature cache).
    flags = {
        a: (r["config"]["positions"]["anchor_offset"], r["config"]["loss"]["flash_noisy"]) for a, r in arms.items()
    }
    assert flags == {"anchor": (True, True), "plain": (False, True), "no-noisy": (True, False)}
    assert {a: r["config"]["run_dir"] for a, r in arms.items()} == {a: str(tmp_path / "runs" / a) for a in arms}
    assert arms["anchor"]["config"]["features"]["dir"] == arms["no-noisy"]["config"]["features"]["dir"]
    assert arms["plain"]["config"]["features"]["dir"] != arms["anchor"]["config"]["features"]["dir"]
    assert sorted(p.name for p in (tmp_path / "features").iterdir()) == ["abl-anchor", "abl-plain"]
    for r in arms.values():
        for section in ("data", "draft", "optim", "target"):
            assert r["config"][section] == arms["anchor"]["config"][section]

    assert result["meta"]["eval"]["edges"] == [0, 16, 32, 64]
    for name, r in arms.items():
        assert r["train"]["steps"] == 3 and math.isfinite(r["train"]["final_loss"])
        p = r["position"]
        assert [(b["lo"], b["hi"]) for b in p["buckets"]] == [(0, 16), (16, 32), (32, 64)]
        assert sum(b["tokens"] for b in p["buckets"]) == p["overall"]["tokens"] == 2 * 63
        for row in (p["overall"], *p["buckets"]):
            assert all(math.isfinite(row[k]) for k in ("ce", "acc", "target_ce", "target_acc", "coverage"))
            assert 0 <= row["target_acc"] <= 1 and 0 < row["coverage"] <= 1
        t = r["tau"]
        assert t["tau"] >= 1 and t["tokens_per_s"] > 0 and len(t["prompts"]) == 1
        assert t["prompts"][0]["prompt_tokens"] == 40 and t["prompts"][0]["new_tokens"] == 8
        assert (tmp_path / "runs" / name / "draft" / "model.safetensors").is_file()

    md = (out / "ablation.md").read_text()
    assert md in capsys.readouterr().out
    assert all(f"| {a} |" in md for a in arms) and "[32, 64)" in md
    assert (out / "ablation.png").stat().st_size > 5000


@pytest.mark.slow  # ~12 s; the ablation harness, not decoding
def test_position_eval_matches_the_dev_eval():
    """Summed over buckets, the loss by position equals the trainer's eval step at plain positions and lag 1."""
    import dataclasses

    import jax
    import jax.numpy as jnp
    import numpy as np

    from lsjax import train as tr
    from lsjax.config import DraftConfig
    from lsjax.methods.longspec import model as draft_lib
    from lsjax.methods.longspec import step as ls_step
    from lsjax.methods.longspec.train_config import LongSpecTrainConfig
    from lsjax.models import target as target_lib

    tp = target_lib.init_params(TINY, jax.random.PRNGKey(0), scale=0.3)
    dcfg = DraftConfig(window=8)
    dp = draft_lib.init_draft_params(TINY, dcfg, tp)
    vocab = jnp.arange(0, TINY.vocab_size, 2, dtype=jnp.int32)  # a pruned vocabulary: odd tokens fall outside
    tokens = jax.random.randint(jax.random.PRNGKey(1), (1, 40), 0, TINY.vocab_size)
    mask = jnp.ones((1, 40), jnp.float32)
    f = tr.target_features(tp, TINY, tokens, jnp.arange(40)[None])
    seq = {"tokens": tokens, "loss_mask": mask, "target_k": f["k"], "target_v": f["v"], "target_argmax": tokens}
    edges = (0, 8, 24, 40)
    sums = ablation.make_position_eval(TINY, dcfg, edges, chunk_size=16)(dp, tp, vocab, seq)
    assert sums["tokens"].shape == (3,) and float(sums["tokens"].sum()) == 39

    cfg = LongSpecTrainConfig(draft=dcfg, loss=dataclasses.replace(LongSpecTrainConfig().loss, chunk_size=16))
    batch = {"tokens": tokens[None], "loss_mask": mask[None], "offset": jnp.zeros((1, 1), jnp.int32)}
    ref = ls_step.make_eval_step(TINY, cfg, vocab)(dp, tp, batch, jnp.int32(1))
    np.testing.assert_allclose(float(sums["ce"].sum()), float(ref["ce"]), rtol=1e-5)
    assert float(sums["correct"].sum()) == float(ref["correct"])
    assert float(sums["ce_tokens"].sum()) == float(ref["weight"])
