"""studies.dels_sweep: the sweep on a tiny random target (one program, AR's output at every cell), and --merge:
scans of disjoint cells join into one grid, and only comparable ones do."""

import json
import types

import numpy as np
import pytest

from lsjax.config import GenerateConfig
from lsjax.engine.host import Generator
from studies.dels_sweep import dels_sweep
from studies.dels_sweep.dels_sweep import markdown, sweep
from tests.test_block_drafter import drafters
from tests.test_speculative import repetitive_prompts
from tests.tiny import tiny_model

ARGS = {"suite": "dev", "per_cell": 1, "limit": 0, "block_draft": None, "block_size": None, "local_head": None}


def record(cells: dict, temperature=0.0, **over):
    return {"args": {**ARGS, "temperature": temperature, "max_new_tokens": 64, **over}, "tau": cells}


def test_disjoint_scans_join_into_one_grid():
    tau, alphas, betas = dels_sweep.merge(
        [record({"0.0,0.0": 1.2, "0.0,1.0": 1.3}), record({"1.0,0.0": 1.4, "1.0,1.0": 1.5})]
    )
    assert alphas == [0.0, 1.0] and betas == [0.0, 1.0]
    assert tau[(1.0, 1.0)] == 1.5 and tau[(0.0, 1.0)] == 1.3


def test_scans_of_different_runs_do_not_merge():
    with pytest.raises(ValueError, match="local_head"):
        dels_sweep.merge([record({"0.0,0.0": 1.2}), record({"1.0,0.0": 1.4}, local_head="markov")])
    # At T = 0 τ is deterministic: one cell with two values means the runs were not the same.
    with pytest.raises(ValueError, match="twice"):
        dels_sweep.merge([record({"0.0,0.0": 1.2}), record({"0.0,0.0": 1.25})])


def test_merge_cli_writes_the_grid_and_a_heatmap(tmp_path, capsys):
    files = []
    for i, cells in enumerate(({"0.0,0.0": 1.2, "0.0,0.5": 1.3}, {"0.5,0.0": 1.4, "0.5,0.5": 1.5})):
        files.append(tmp_path / f"{i}.json")
        files[-1].write_text(json.dumps(record(cells)))
    assert dels_sweep.main(["--merge", *map(str, files), "--out", str(tmp_path / "grid")]) == 0
    assert (tmp_path / "grid" / "dels-sweep-dev-T0.png").stat().st_size > 1000
    assert "| 0.5 | 1.400 | 1.500 |" in (tmp_path / "grid" / "dels-sweep-dev-T0.md").read_text()
    # A grid with holes is one line on stderr and exit 2.
    files[1].write_text(json.dumps(record({"0.5,0.0": 1.4})))
    assert dels_sweep.main(["--merge", *map(str, files), "--out", str(tmp_path / "g3")]) == 2
    assert capsys.readouterr().err.strip().count("\n") == 0


@pytest.mark.slow
def test_alpha_beta_sweep_reuses_one_program_and_starts_from_the_block_drafter():
    """Every (α, β) reproduces AR at T = 0; α = β = 0 has the block drafter's τ."""
    config, params = tiny_model()
    block, bp, dels, dp, _ = drafters(config, params, s=4)
    model = types.SimpleNamespace(config=config, params=params)
    prompts = {f"p{i}": list(map(int, p)) for i, p in enumerate(repetitive_prompts(config, 2, 40, seed=5))}
    gen = GenerateConfig(max_new_tokens=20, ignore_eos=True)
    result = sweep(model, dels, dp, prompts, (0.0, 0.5), (0.0, 1.0), gen, log=lambda *_: None)
    plain = Generator(config, params, block, bp)
    tau_block = np.mean([plain.run(ids, gen).mean_accepted for ids in prompts.values()])
    assert result["tau"][(0.0, 0.0)] == pytest.approx(tau_block)
    assert len(result["tau"]) == 4
    assert "Row-wise gain" in markdown(result, (0.0, 0.5), (0.0, 1.0), "t")
