"""decode.py: bad input gives one clear line and exit status 2; a short real run produces JSON."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def decode(*args, timeout=600):
    return subprocess.run(
        [sys.executable, str(ROOT / "decode.py"), *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )


def one_error_line(proc) -> str:
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.strip().splitlines() if "error" in line.lower()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def test_missing_prompt_file(tmp_path):
    assert "prompt file not found" in one_error_line(decode("--prompt-file", str(tmp_path / "nope.txt")))


def test_empty_prompt(tmp_path):
    f = tmp_path / "empty.txt"
    f.write_text("   \n")
    assert "empty" in one_error_line(decode("--prompt-file", str(f)))


def test_missing_model(tmp_path):
    assert "not found" in one_error_line(decode("--model", str(tmp_path / "m.gguf"), "--prompt", "hi"))


def test_bad_flag_values():
    assert "temperature" in one_error_line(decode("--prompt", "hi", "--temperature", "-1"))
    assert "top_p" in one_error_line(decode("--prompt", "hi", "--top-p", "0"))
    assert "tree" in one_error_line(
        decode("--prompt", "hi", "--method", "longspec", "--draft", "random", "--tree", "wide")
    )
    assert "--pld-tokens" in one_error_line(decode("--prompt", "hi", "--method", "hybrid", "--pld-tokens", "0"))


def test_prompt_longer_than_context(tmp_path):
    f = tmp_path / "long.txt"
    f.write_text("word " * 9000)  # > 8192 tokens
    line = one_error_line(decode("--prompt-file", str(f)))
    assert "context window is 8192" in line


@pytest.mark.slow
@pytest.mark.parametrize("method", ["pld", "hybrid", "auto"])
def test_json_run_matches_ar(method):
    draft = ["--draft", "random", "--tree", "2,1"] if method == "hybrid" else []
    draft += ["--cost-profile", "prior"] if method == "auto" else []
    proc = decode(
        "--prompt",
        "def fibonacci(n):",
        "--max-new-tokens",
        "8",
        "--method",
        method,
        "--compare",
        "ar",
        "--json",
        *draft,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    for key in (
        "new_tokens",
        "prefill_s",
        "decode_s",
        "tokens_per_s",
        "target_forwards",
        "text",
        "mean_accepted",
        "speedup_vs_ar",
        "identical_to_ar",
    ):
        assert key in out
    assert out["new_tokens"] == 8 and out["identical_to_ar"] is True


@pytest.mark.slow
@pytest.mark.parametrize("tree", [[], ["--tree", "2,1,1"]], ids=["cpu-default", "2,1,1"])
def test_shipped_draft_on_the_real_model_matches_ar_and_accepts(tree):
    """The default draft (lsjax/drafts/) with the real target: greedy output equal to AR's, and it is a trained
    draft (a random one accepts ~nothing: mean_accepted ~1.0)."""
    prompt = "Explain what a Python dictionary is and show how to count words in a sentence with one."
    args = ("--prompt", prompt, "--chat", "--method", "longspec", "--max-new-tokens", "48", "--ignore-eos")
    proc = decode(*args, *tree, "--compare", "ar", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["identical_to_ar"] is True and out["new_tokens"] == 48
    assert out["mean_accepted"] > 1.15, out["mean_accepted"]


@pytest.mark.slow
def test_an_instruct_model_ending_at_once_suggests_chat():
    """SmolLM2-Instruct answers a bare sentence with EOS: the run says why nothing was written."""
    args = ("--prompt", "Write a short poem about the sea.", "--method", "ar", "--max-new-tokens", "8", "--json")
    proc = decode(*args)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["stop_reason"] == "eos" and out["text"].strip() == ""
    assert "add --chat" in proc.stderr
    chat = decode(*args, "--chat")
    assert json.loads(chat.stdout.strip().splitlines()[-1])["text"].strip() and "add --chat" not in chat.stderr


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["eagle", "speculators"])
def test_eagle3_random_draft_in_each_published_layout_matches_ar(tmp_path, fmt):
    """An EAGLE-3 draft for SmolLM2 (random weights) written in a published layout: decode.py reads it as it is,
    says which layout it read, and its greedy output is AR's on the bundled prompt."""
    from lsjax.loading import load_model
    from lsjax.methods.eagle3.checkpoint import random_draft, write_draft

    cfg, params, _ = random_draft(load_model().config)
    draft = write_draft(tmp_path / fmt, cfg, params, fmt)
    proc = decode(
        "--method", "eagle3", "--draft", str(draft), "--eagle-tree", "cpu", "--max-new-tokens", "24",
        "--ignore-eos", "--compare", "ar", "--json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["draft"] == {"dir": str(draft), "format": fmt}
    assert out["identical_to_ar"] is True and out["new_tokens"] == 24


@pytest.mark.slow
def test_a_released_layout_longspec_draft_matches_ar(tmp_path):
    """A LongSpec draft for SmolLM2 in the authors' released layout (random weights from the target's last layer,
    with the biases and without the final norm the released drafts have): decode.py reads it as it is, runs the
    released semantics, says so in --json, and its greedy output is AR's on the bundled prompt."""
    import jax

    from lsjax.loading import load_model
    from lsjax.methods.longspec.model import init_draft_params
    from lsjax.methods.longspec.release import RELEASED, write_release

    model = load_model()
    dp = init_draft_params(model.config, RELEASED, jax.tree.map(jax.numpy.asarray, model.params))
    draft = write_release(tmp_path / "released", model.config, dp)
    proc = decode(
        "--method", "longspec", "--draft", str(draft), "--tree", "2,2", "--max-new-tokens", "24", "--ignore-eos",
        "--compare", "ar", "--json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["draft"] == {"dir": str(draft), "format": "released"}
    assert out["identical_to_ar"] is True and out["new_tokens"] == 24


@pytest.mark.slow
def test_released_tokenswift_heads_match_ar(tmp_path):
    """TokenSwift heads for SmolLM2 (random, from its own head) written as the authors release them (the
    `model.medusa_layers.*` of a full-model checkpoint): decode.py reads them, names the layout, and its greedy
    output is AR's on the bundled prompt."""
    import jax

    from lsjax.loading import load_model
    from lsjax.methods.tokenswift import model as th
    from lsjax.methods.tokenswift.checkpoint import write_released

    model = load_model()
    params = jax.tree.map(jax.numpy.asarray, model.params)
    hp = th.init_params(model.config, th.HeadsConfig(), params, key=jax.random.key(2))
    draft = write_released(tmp_path / "release", hp, model.config.hidden_size, model.config.vocab_size)
    proc = decode(
        "--method", "tokenswift", "--draft", str(draft), "--max-new-tokens", "24", "--ignore-eos", "--compare", "ar",
        "--json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["draft"] == {"dir": str(draft), "format": "tokenswift-release"}
    assert out["identical_to_ar"] is True and out["new_tokens"] == 24


@pytest.mark.slow
def test_auto_with_an_eagle3_draft_matches_ar(tmp_path):
    """`--draft DIR` of an EAGLE-3 draft with the default method: auto's candidates are the draft's chains and
    tree beside AR and prompt lookup, and the output is AR's."""
    from lsjax.loading import load_model
    from lsjax.methods.eagle3.checkpoint import random_draft, write_draft

    cfg, params, _ = random_draft(load_model().config)
    draft = write_draft(tmp_path / "e3", cfg, params, "eagle")
    proc = decode(
        "--draft", str(draft), "--max-new-tokens", "24", "--ignore-eos", "--compare", "ar", "--json",
        "--cost-profile", "prior",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["identical_to_ar"] is True and out["new_tokens"] == 24
    assert "e3-tree" in out["first_depth_rates"] or "e3-tree" in str(out), out


def test_eagle3_without_a_draft_is_one_line():
    assert "--method eagle3 needs --draft DIR" in one_error_line(decode("--prompt", "hi", "--method", "eagle3"))


def test_presets_expand_into_the_authors_flags_and_given_flags_win():
    sys.path.insert(0, str(ROOT))
    from lsjax.cli import decode as cli

    args = cli.parse_args(["--preset", "tokenswift-paper", "--penalty", "1.1"])
    assert (args.method, args.ts_preset, args.temperature, args.min_p) == ("tokenswift", "paper", 1.0, 0.1)
    assert (args.penalty, args.penalty_window) == (1.1, 1024)
    args = cli.parse_args(["--preset=longspec-paper", "--prompt", "hi"])
    assert (args.method, args.tree, args.prompt) == ("longspec", "paper", "hi")
    assert cli.parse_args(["--preset", "eagle3-paper"]).eagle_tree == "eagle3"
    assert "--preset fast: not one of longspec-paper" in one_error_line(decode("--preset", "fast"))


def test_the_process_ends_when_its_output_is_out():
    """decode.py's process ends with the status its main returned, its output flushed, without waiting for a
    background thread Python's exit would join (a split program still loading: `exit_now`)."""
    code = (
        "import sys, threading, time; from lsjax.cli import decode; "
        "threading.Thread(target=time.sleep, args=(120,)).start(); "
        "print('{\"out\": 1}'); sys.stderr.write('said\\n'); decode.exit_now(3)"
    )
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=100)
    assert time.perf_counter() - t < 60  # no join of the 120 s thread
    assert (out.returncode, json.loads(out.stdout), out.stderr) == (3, {"out": 1}, "said\n")
