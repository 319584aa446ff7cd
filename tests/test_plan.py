"""lsjax.bench.plan: per-chip bytes against a hand count, the verify step lowering for TPU and CUDA on a
model=M mesh, the train step's optimizer bytes, and one-line errors for bad input.

The plan runs as a command (`python -m lsjax.bench.plan`), which re-executes itself with fake CPU devices;
the model is Llama-3.1-8B's head shape (32 query / 8 KV heads) with small widths and 2 layers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lsjax.bench import plan

ROOT = Path(__file__).resolve().parents[1]
SMALL = dict(
    arch="llama",
    name="llama-shaped",
    vocab_size=1024,
    hidden_size=256,
    intermediate_size=512,
    num_layers=2,
    num_heads=32,
    num_kv_heads=8,
    head_dim=16,
    max_position=8192,
    rope_theta=500000.0,
    tie_embeddings=False,
    dtype="bfloat16",
)


@pytest.fixture(scope="module")
def small_yaml(tmp_path_factory):
    path = tmp_path_factory.mktemp("plan") / "small.yaml"
    path.write_text(yaml.safe_dump(SMALL))
    return path


def _plan(*args, timeout=240):
    out = subprocess.run(
        [sys.executable, "-m", "lsjax.bench.plan", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=timeout,
    )
    return out


def hand_weight_bytes(c: dict, M: int) -> int:
    """Per-chip bytes of the target split M ways, counted from the architecture: attention and MLP matrices
    and the vocabulary rows split, norms whole."""
    D, F, V, L = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["num_layers"]
    N, K, H = c["num_heads"], c["num_kv_heads"], c["head_dim"]
    per_layer = (D * (N + 2 * K) * H + N * H * D + 3 * D * F) // M + 2 * D
    return 2 * (L * per_layer + 2 * V * D // M + D)  # bf16; embed and LM head; final norm


@pytest.fixture(scope="module")
def tpu_plan(small_yaml):
    out = _plan("--model", small_yaml, "--mesh", "model=4", "--context", 4096, "--platform", "tpu-v5e", "--json")
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)["plans"][0]


def test_weight_and_cache_bytes_equal_the_hand_count(tpu_plan):
    ex = tpu_plan["exact"]
    assert ex["weights"] == hand_weight_bytes(SMALL, 4)
    L, K, H = SMALL["num_layers"], SMALL["num_kv_heads"], SMALL["head_dim"]
    assert ex["kv_cache"] == 2 * L * 1 * (K // 4) * tpu_plan["capacity"] * H * 2
    # The compiler's per-device arguments are those weights and that cache, plus the tree's few bytes.
    args = tpu_plan["steps"]["verify"]["compiler"]["arguments"]
    assert 0 <= args - (ex["weights"] + ex["kv_cache"]) < 64 * 1024


def test_verify_step_lowers_for_tpu_and_cuda_on_a_model_mesh(tpu_plan, small_yaml):
    assert tpu_plan["compiler"].startswith("XLA CPU") and tpu_plan["devices"] == 4
    for step in ("verify", "ar"):
        exp = tpu_plan["steps"][step]["export"]
        assert exp["ok"] and exp["devices"] == 4 and exp["kernel_calls"] > 0, exp
    assert tpu_plan["steps"]["verify"]["nodes"] == 69
    out = _plan("--model", small_yaml, "--mesh", "model=2", "--context", 2048, "--platform", "gpu-h100", "--tree", 16,
                "--json")  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    gpu = json.loads(out.stdout)["plans"][0]
    exp = gpu["steps"]["verify"]["export"]
    assert exp["ok"] and exp["devices"] == 2 and exp["kernel_calls"] > 0, exp
    assert gpu["steps"]["verify"]["nodes"] == 16
    assert gpu["exact"]["weights"] == hand_weight_bytes(SMALL, 2)


def test_fit_verdict_follows_the_chip_memory(tpu_plan):
    peak = tpu_plan["steps"]["ar"]["compiler"]["peak_with_draft"]
    assert tpu_plan["fits"] == (max(peak, tpu_plan["exact"]["total"]) <= plan.CHIPS["tpu-v5e"].memory)
    assert tpu_plan["fits"]  # a 2-layer toy fits a v5e
    text = plan.render([tpu_plan], plan.CHIPS["tpu-v5e"])
    assert "FITS in 16.00 GB" in text
    small_chip = plan.Chip("tiny", "tpu", "TPU v5 lite", 1e9, 1e12, 1e6)
    tight = {**tpu_plan, "fits": False}
    assert "DOES NOT FIT in 0.00 GB" in plan.render([tight], small_chip)


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--mesh", "model=3"], "model=3"),  # 8 KV heads: model must be one of [1, 2, 4, 8]
        (["--mesh", "model=16"], "[1, 2, 4, 8]"),
        (["--model", "llama-9b"], "--model"),
        (["--platform", "tpu-v9"], "tpu-v5e, tpu-v5p, gpu-h100"),
        (["--mesh", "tp=2"], "AXIS=SIZE"),
        (["--tree", "x,y"], "--tree"),
        (["--tree", "1"], "--tree"),
        (["--layers", "0"], "--layers"),
        (["--context", "999999"], "--context"),
        (["--bogus"], "unrecognized"),
        (["--no-decode"], "--train"),
        (["--train", "configs/train/llama3.1-8b-stage1-v5e16.yaml", "--train-mesh", "data=3,fsdp=1"], "[1, 2, 4, 8"),
        (["--train", "configs/train/nope.yaml"], "--train"),
    ],
)
def test_bad_input_is_one_line_and_status_2(argv, says, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert plan.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("plan: ") and says in err, err
    assert "Traceback" not in err


def test_bad_mesh_from_the_command_line_is_one_line():
    out = _plan("--mesh", "model=3", timeout=60)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "model must be one of [1, 2, 4, 8]" in out.stderr


@pytest.mark.slow  # ~25 s: a 2-device train step compile on the small model
def test_train_step_plan_counts_optimizer_state(small_yaml, tmp_path):
    cfg = {
        "name": "small-train",
        "target": {"preset": str(small_yaml), "dtype": "bfloat16"},
        "draft": {"window": 16},
        "data": {"seq_len": 64, "batch_size": 4, "grad_accum": 2},
        "loss": {"chunk_size": 32},
        "mesh": {"data": 1, "fsdp": 2},
    }
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = _plan("--no-decode", "--train", path, "--platform", "tpu-v5p", "--json")
    assert out.returncode == 0, out.stderr[-3000:]
    p = json.loads(out.stdout)["plans"][0]
    ex = p["exact"]
    # AdamW: two moments per draft weight (the draft's dtype), plus scalar counts.
    assert 0 <= ex["optimizer"] - 2 * ex["draft"] < 1024
    assert p["step"]["export"]["ok"], p["step"]["export"]
    assert p["step"]["compiler"]["arguments"] >= ex["target_weights"] + ex["draft"] + ex["optimizer"]
