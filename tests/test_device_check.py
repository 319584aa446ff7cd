"""The device check (`python -m lsjax.bench.device`) in its CPU dry mode: every part runs and reports, a wrong
kernel is caught, and what does not fit the device is a skip line."""

from __future__ import annotations

import dataclasses
import json

import jax.numpy as jnp
import pytest

from lsjax.bench import device, device_kernels, device_model
from pallas_kernels import prefix_attention as pk
from pallas_kernels import tree_attention as tk


@pytest.mark.jax011
def test_dry_run_writes_every_part(tmp_path, capsys):
    assert device.main(["--dry", "--out", str(tmp_path)]) == 0
    md = next(tmp_path.glob("*.md")).read_text()
    data = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert data["env"]["platform"] == "cpu" and data["env"]["versions"]["jax"]
    parts = data["parts"]
    assert set(parts) == set(device.PARTS)
    for name in device.PARTS:
        assert parts[name]["rows"], f"part {name} measured nothing: {parts[name]['skips']}"
    kernels = parts["kernels"]["rows"]
    assert {r["kernel"] for r in kernels} == {"prefix", "tree", "tree-causal", "invariant"}
    assert {r["dtype"] for r in kernels} == {"bfloat16", "float32"} and all(r["ok"] for r in kernels)
    e2e = parts["e2e"]["rows"]  # greedy rows compare outputs; sampled ones time T = 1 and compare nothing
    assert [(r["temperature"], r["identical"]) for r in e2e] == [(0.0, True), (1.0, None)]
    assert e2e[1]["prompts_identical"] == "sampled" and e2e[1]["speedup"] > 0 and e2e[1]["invariant_rows"] == 0
    assert set(parts["step"]["rows"][0]["vs_ar"]) == {"1", "4"}  # JSON keys
    step = parts["step"]["rows"][0]
    assert step["eagle3_vs_ar"] > 0  # EAGLE-3's step at the target's shapes
    assert "eagle3 step (draft + 60-node verification)" in md
    # DFlash's: the draft alone, and with its chain's or its tree's verification, in multiples of an AR step
    assert all(step[f"{k}_vs_ar"] > 0 for k in ("dflash_draft", "dflash", "dflash_tree")), step
    assert not [s for s in parts["step"]["skips"] if "dflash" in s]
    assert "| dflash step (block 16 draft + 16-node chain verification) <= 1.3x a 1-node step at 256 |" in md
    assert "## Goals" in md and "| kernels within" in md
    assert "every T = 0 output identical to AR's; the T > 0 rows are samples, timed and not compared" in md
    assert "[kernels] prefix" in capsys.readouterr().out  # progress as it goes


@pytest.mark.jax011
def test_a_wrong_kernel_fails_the_check(monkeypatch):
    """A prefix kernel 2% off its reference (and no interpreter run: both kernels are stand-ins) is a FAIL row,
    and a correctness failure."""

    def off(q, k, v, lengths, start, layer, **_):
        out, lse = pk.prefix_attention_reference(q, k[layer], v[layer], lengths, start)
        return (out.astype(jnp.float32) * 1.02).astype(q.dtype), lse

    monkeypatch.setattr(pk, "prefix_attention", off)
    monkeypatch.setattr(
        tk, "tree_attention", lambda q, k, v, m, causal, **_: tk.tree_attention_reference(q, k, v, m, causal=causal)
    )
    rep = device.run(device.CheckConfig.for_dry_run(parts=("kernels",), kernel_T=(1,)), log=lambda s: None)
    rows = rep.parts["kernels"]["rows"]
    assert [r["ok"] for r in rows if r["kernel"] == "prefix"] == [False] * 4
    assert all(r["ok"] for r in rows if r["kernel"] != "prefix")
    assert len(rep.failures()) == 4 and "rel err" in rep.failures()[0]


def test_what_does_not_fit_is_a_skip_line(monkeypatch):
    monkeypatch.setattr(device_kernels, "device_memory", lambda: 1 << 20)  # a 1 MiB device
    rep = device.run(device.CheckConfig.for_dry_run(parts=("bandwidth",)), log=lambda s: None)
    assert not rep.parts["bandwidth"]["rows"]
    assert len(rep.parts["bandwidth"]["skips"]) == 2 and "do not fit" in rep.parts["bandwidth"]["skips"][0]
    assert device_model.layers_that_fit(8192) == 0


@pytest.mark.slow  # the report of a finished check is tested in the default run
def test_a_check_cut_short_keeps_the_parts_it_finished(monkeypatch, tmp_path):
    """A lease's timeout ends the check with SIGTERM while a part runs: the report is on disk with every part
    that finished (written after each) and a skip line for the one that was stopped."""
    import os
    import signal

    monkeypatch.setattr(
        tk, "tree_attention", lambda q, k, v, m, causal, **_: tk.tree_attention_reference(q, k, v, m, causal=causal)
    )
    monkeypatch.setattr(device, "check_bandwidth", lambda rep: os.kill(os.getpid(), signal.SIGTERM))
    argv = ["--dry", "--parts", "kernels,bandwidth", "--kernel-T", "1", "--out", str(tmp_path)]
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as stopped:
        device.main(argv)
    assert stopped.value.code == 128 + signal.SIGTERM
    (js,) = tmp_path.glob("*.json")
    parts = json.loads(js.read_text())["parts"]
    assert parts["kernels"]["rows"] and all(r["ok"] for r in parts["kernels"]["rows"])
    assert "elapsed_s" in parts["kernels"] and "elapsed_s" not in parts["bandwidth"]
    assert parts["bandwidth"]["skips"] == [parts["bandwidth"]["skips"][0]]
    assert "stopped" in parts["bandwidth"]["skips"][0] and "during this part" in parts["bandwidth"]["skips"][0]
    assert signal.getsignal(signal.SIGTERM) is before


def test_bad_options_are_one_line(capsys):
    assert device.main(["--dry", "--parts", "kernels,nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["lsjax.bench.device: error: parts: unknown part 'nope'; choose from kernels, e2e, bandwidth, step"]
    assert device.main(["--dry", "--e2e-temperatures", "0,hot"]) == 2
    assert capsys.readouterr().err.strip() == "lsjax.bench.device: error: --e2e-temperatures: comma-separated numbers"
    assert device.main(["--dry", "--e2e-methods", "auto,nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["lsjax.bench.device: error: e2e_methods: unknown method 'nope'; choose from longspec, pld, auto"]
    assert device.main(["--dry", "--e2e-temperatures", "0,-1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "lsjax.bench.device: error: e2e_temperatures: must be numbers in [0, 10], at least one; got (0.0, -1.0)"
    ]


def test_llama_shapes_and_read_bytes():
    """The step's read-time yardstick: Llama-3.1-8B's untied embedding is not read, its LM head is."""
    cfg = device_model.LLAMA_8B
    assert 8.0e9 < cfg.num_params() < 8.1e9
    assert device_model.weight_bytes(cfg) == 2 * (cfg.num_params() - cfg.vocab_size * cfg.hidden_size)
    assert device_model.kv_bytes(cfg, 1) == 2 * 32 * 8 * 128 * 2


@pytest.mark.jax011
def test_e2e_compares_every_prompt_and_names_the_first_difference(monkeypatch):
    """A method whose output leaves AR's on one prompt fails the check with the prompt count and the token."""
    from lsjax.engine import host
    from lsjax.engine.types import ARDrafter

    real_run = host.Generator.run

    def run(self, ids, gen, *a, **kw):
        res = real_run(self, ids, gen, *a, **kw)
        if not isinstance(self.drafter, ARDrafter) and ids[0] == 4:  # the second prompt, speculative only
            res = dataclasses.replace(res, tokens=res.tokens[:3] + [res.tokens[3] + 1] + res.tokens[4:])
        return res

    monkeypatch.setattr(host.Generator, "run", run)
    rep = device.run(device.CheckConfig.for_dry_run(parts=("e2e",)), log=lambda s: None)
    row, sampled = rep.parts["e2e"]["rows"]
    assert (row["identical"], row["prompts_identical"], row["first_difference"]) == (False, "1/2", 3)
    assert sampled["temperature"] == 1 and sampled["identical"] is None  # a sample that differs is no failure
    assert rep.failures() == [
        "pld (float32): output differs from AR's on 1/2 prompts identical, first difference at new token 3"
    ]


def test_first_difference():
    assert device_model.first_difference([1, 2, 3], [1, 2, 3]) is None
    assert device_model.first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert device_model.first_difference([1, 2], [1, 2, 3]) == 2


def test_the_tuning_sweep_times_each_variant():
    cfg = device.CheckConfig.for_dry_run(parts=("bandwidth",), contexts=(256,), sweep=device.SWEEP[:2])
    rep = device.run(cfg, log=lambda s: None)
    sweep = rep.parts["bandwidth"]["sweep"]
    assert [r["tuning"] for r in sweep] == [{}, {"block_k": 128}] and all(r["us"] > 0 for r in sweep)


def test_goals_judge_greedy_rows_and_sampled_auto():
    """The speed-and-identity goals read the T = 0 rows (the first dtype's); a sampled `auto` row is judged
    on speed alone (issue 36's 1.1x)."""
    rep = device.Report(device.CheckConfig.for_dry_run(parts=("e2e",)), log=lambda s: None)

    def row(method, t, speedup, identical, dtype="bfloat16"):
        seen = "sampled" if identical is None else ("2/2" if identical else "1/2")
        return dict(
            method=method, dtype=dtype, temperature=t, speedup=speedup, identical=identical,
            prompts_identical=seen, first_difference=None if identical is not False else 7,
        )  # fmt: skip

    rep.parts["e2e"]["rows"] = [
        row("auto", 0.0, 1.4, True),
        row("longspec", 0.0, 1.2, False),
        row("auto", 0.0, 0.5, True, dtype="float32"),  # a second dtype's row is not the goal's
        row("auto", 1.0, 1.05, None),
    ]
    got = {g: (m, ok) for g, m, ok in device.goals(rep)}
    assert got["`auto` faster than AR, identical output"] == ("1.40x, identical", True)
    assert got["`longspec` faster than AR, identical output"] == ("1.20x, DIFFERENT", False)
    assert got["`auto` sampled at T=1 >= 1.1x AR"] == ("1.05x", False)
    assert rep.failures() == [
        "longspec (bfloat16): output differs from AR's on 1/2 prompts identical, first difference at new token 7"
    ]
