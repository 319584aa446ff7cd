"""studies.trees.trees: the tree sweep on a tiny random target (every tree's output equals AR's, pooled rows)."""

from __future__ import annotations

import dataclasses
import types

import jax
import numpy as np
import pytest

from lsjax.config import DraftConfig
from lsjax.methods.longspec import model as draft_lib
from lsjax.methods.longspec.drafter import LongSpecDrafter
from studies.trees import trees
from tests.tiny import tiny_model


@pytest.mark.slow  # ~20 s on two cores: the default run stays under 15 min
def test_sweep_pools_per_tree_and_checks_equality():
    config, params = tiny_model()
    dcfg = DraftConfig(window=16)
    dp = draft_lib.random_draft_params(config, jax.random.key(1), scale=0.3)
    model = types.SimpleNamespace(config=config, params=params)
    rng = np.random.default_rng(0)
    prompts = {
        "a": rng.integers(3, config.vocab_size, 40).tolist(),
        "b": rng.integers(3, config.vocab_size, 70).tolist(),
    }
    base = LongSpecDrafter(draft=dcfg)
    out = trees.sweep(model, lambda t: dataclasses.replace(base, tree=t), dp, prompts, ["chain4", "2,1"], 12, log=print)
    assert set(out) == {"ar", "chain4", "2,1"}
    assert out["ar"]["tau"] == pytest.approx(1.0) and out["ar"]["speedup_vs_ar"] == pytest.approx(1.0)
    for name, depth in (("chain4", 4), ("2,1", 2)):
        r = out[name]
        assert len(r["prompts"]) == 2 and all(p["emitted"] == 11 for p in r["prompts"])
        assert 1.0 <= r["tau"] <= depth + 1 and r["tokens_per_s"] > 0


def test_cli_bad_tree_is_one_line(capsys, tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("def f():\n")
    assert trees.main(["--prompt-file", str(f), "--trees", "chain4", "1,x"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "1,x" in err
