"""`lsjax.bench.repeat`: its report compares auto and its variants with the best *fixed* method; the FLOP count
behind the methods' cost table is one decode step, lowered (nothing runs)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from lsjax.bench import repeat
from lsjax.config import ModelConfig
from lsjax.engine.types import ARDrafter
from lsjax.methods.pld.drafter import PLDDrafter
from lsjax.models import target


def _rows():
    speed = {"ar": (1.0, 1.0), "auto": (1.10, 0.95), "auto-free": (1.20, 0.80), "pld": (1.05, 0.60)}
    rows = []
    for i, pid in enumerate(("a", "b")):
        for m, s in speed.items():
            rows.append(
                {
                    "prompt": pid,
                    "T": 0.0,
                    "method": m,
                    "speedup": s[i],
                    "cpu_speedup": s[i],
                    "tau": 1.0 if m == "ar" else 1.5,
                    "tok_s": 10.0 * s[i],
                    "equal_to_ar": True,
                }
            )
    return rows


def test_report_compares_auto_variants_with_fixed_methods_only(capsys):
    repeat.report(_rows(), ["ar", "auto", "pld", "auto-free"], [0.0])
    out = capsys.readouterr().out
    # pld is the only fixed method (mean 0.825x): auto's variant must not be taken as the "best fixed".
    assert "auto = 124.2% of the best fixed method (pld); worst prompt b 0.95x" in out
    assert "auto-free = 121.2% of the best fixed method (pld); worst prompt b 0.80x" in out
    # Each method's means (the paper's Table 2 columns): tau, tok/s, speed over AR.
    assert "| ar | 1.00 | 10.0 | 1.00x |" in out and "| pld | 1.50 | 8.2 | 0.82x |" in out


def test_bad_variant_is_one_line_exit_2(capsys):
    with pytest.raises(SystemExit) as e:
        repeat.main(["--variant", "no-equals-sign"])
    assert e.value.code == 2
    assert "--variant 'no-equals-sign'" in capsys.readouterr().err


def test_report_reprints_saved_runs_without_decoding(tmp_path, capsys):
    import json

    path = tmp_path / "run.json"
    path.write_text(json.dumps({"command": ["lsjax/bench/repeat.py", "--suite", "dev"], "rows": _rows()}))
    assert repeat.main(["--report", str(path)]) == 0
    out = capsys.readouterr().out
    assert "run: lsjax/bench/repeat.py --suite dev" in out
    assert "| a | 0 | 1.10x (1.10-1.10), tau 1.50 |" in out  # per prompt: speed over AR and tau
    assert "auto = 124.2% of the best fixed method (pld)" in out


def test_report_of_a_file_that_is_not_a_run_is_exit_2(tmp_path, capsys):
    bad = tmp_path / "notes.json"
    bad.write_text("[1, 2]")
    with pytest.raises(SystemExit) as e:
        repeat.main(["--report", str(bad)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--report" in err and "not a file written by --out" in err.strip().splitlines()[-1]


def test_saved_command_names_the_module_and_no_path_of_this_machine():
    """Saved rows go into docs/: the command they carry is the one a user types, whatever the paths here."""
    args = ["--suite", "dev", "--out", "/some/where/runs/dev.json", "--methods", "auto"]
    got = repeat.portable_command(args)
    assert got == ["python", "-m", "lsjax.bench.repeat", "--suite", "dev", "--out", "dev.json", "--methods", "auto"]
    assert not any("/" in a for a in got)


CFG = ModelConfig(
    vocab_size=97, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=128
)


def test_a_step_costs_more_with_more_verified_nodes():
    params = target.prepare_for_decode(target.init_params(CFG, jax.random.PRNGKey(0)), CFG)
    params = jax.tree.map(jnp.asarray, params)
    ar = repeat.step_flops(params, (), CFG, ARDrafter())
    chain4 = repeat.step_flops(params, (), CFG, PLDDrafter(num_tokens=4))
    chain8 = repeat.step_flops(params, (), CFG, PLDDrafter(num_tokens=8))
    # The layers' matmuls alone (2 * params per token) bound each count from below.
    per_token = 2 * 2 * CFG.num_layers * CFG.hidden_size * (CFG.hidden_size * 2 + CFG.intermediate_size * 3 // 2)
    assert ar > per_token
    assert ar < chain4 < chain8
    assert repeat.extra_params(()) == 0
    assert repeat.extra_params({"w": jnp.zeros((3, 4)), "b": jnp.zeros(5)}) == 17
