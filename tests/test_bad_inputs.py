"""Damaged or mismatched inputs give a named error with a one-line message, and exit status 2 from the CLIs:
a truncated GGUF file, a corrupt safetensors file, a draft made for another target, a truncated draft,
a `--set` override of the wrong type, and train.py's config and flag misuses (a directory, a YAML syntax error,
--resume with --overwrite, ...). The bad files are made here, small, in tmp_path."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import types

import jax
import pytest

from lsjax import artifacts
from lsjax.config import ConfigError, DraftConfig, from_dict, to_dict
from lsjax.errors import CorruptFileError, LsjaxError, ShapeMismatchError
from lsjax.loading import default_model_path, load_hf, load_model
from lsjax.methods import registry
from lsjax.methods.longspec import model as draft_lib
from lsjax.methods.longspec.checkpoint import load_draft
from lsjax.methods.longspec.train_config import LongSpecTrainConfig
from tests.test_decode_cli import ROOT, decode, one_error_line
from tests.tiny import tiny_model


def _head(src, dst, nbytes: int):
    with open(src, "rb") as f:
        dst.write_bytes(f.read(nbytes))
    return dst


def _one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert isinstance(e.value, LsjaxError) and "\n" not in msg
    return msg


def test_truncated_gguf(tmp_path):
    # Cut in the header, in the tokenizer's metadata, and in the tensor data.
    for n in (10, 4096, 3_000_000):
        path = _head(default_model_path(), tmp_path / f"cut{n}.gguf", n)
        with pytest.raises(CorruptFileError) as e:
            load_model(path)
        assert _one_line(e).startswith(f"{path}: truncated or corrupt GGUF file")
    line = one_error_line(decode("--model", str(tmp_path / "cut4096.gguf"), "--prompt", "hi"))
    assert "truncated or corrupt GGUF file" in line


def test_corrupt_safetensors(tmp_path):
    from tests.test_loading import _tiny_hf_model

    good = tmp_path / "good"
    _tiny_hf_model("llama", False).save_pretrained(good)
    weights = (good / "model.safetensors").read_bytes()
    cases = {
        "tiny": weights[:3],  # not even the 8-byte header length
        "garbage-header": weights[:8] + b"\xff" * 64 + weights[72:],
        "truncated-data": weights[: len(weights) * 2 // 3],
    }
    for name, raw in cases.items():
        d = tmp_path / name
        d.mkdir()
        (d / "config.json").write_bytes((good / "config.json").read_bytes())
        (d / "model.safetensors").write_bytes(raw)
        with pytest.raises(CorruptFileError) as e:
            load_hf(d)
        assert "truncated or corrupt HF checkpoint" in _one_line(e), name


@pytest.fixture(scope="module")
def tiny_draft(tmp_path_factory):
    """A valid draft directory for the tiny target, written by hand in the format `lsjax.methods.longspec.export` writes
    (test_train checks that round trip; importing the trainer here would only cost time)."""
    config, _ = tiny_model()
    path = tmp_path_factory.mktemp("draft") / "tiny-draft"
    path.mkdir()
    params = draft_lib.random_draft_params(config, jax.random.key(1))
    meta = {"target": "tiny", "draft_config": to_dict(DraftConfig(window=16)), "tree": None}
    artifacts.save_weights(path, params, meta, kind="longspec")
    return config, path


def test_draft_for_another_target(tiny_draft):
    config, path = tiny_draft
    same = types.SimpleNamespace(config=config, params=None, path=None)
    drafter, _ = registry.build("longspec", same, draft=str(path), tree="2,1")
    assert drafter.draft.window == 16
    other = types.SimpleNamespace(config=dataclasses.replace(config, hidden_size=64), params=None, path=None)
    with pytest.raises(ShapeMismatchError) as e:
        registry.build("longspec", other, draft=str(path), tree="2,1")
    msg = _one_line(e)
    assert "does not fit target" in msg and "this target needs" in msg and "made for tiny" in msg
    # decode.py on the real SmolLM2 with the tiny target's draft: one line, before anything compiles.
    line = one_error_line(decode("--method", "longspec", "--draft", str(path), "--prompt", "hi"))
    assert "does not fit target" in line


def test_truncated_draft_weights(tiny_draft, tmp_path):
    _, good = tiny_draft
    bad = tmp_path / "bad-draft"
    bad.mkdir()
    (bad / "config.json").write_bytes((good / "config.json").read_bytes())
    raw = (good / "model.safetensors").read_bytes()
    for n in (0, 100, len(raw) // 2, len(raw) - 10):
        (bad / "model.safetensors").write_bytes(raw[:n])
        with pytest.raises(CorruptFileError) as e:
            load_draft(bad)
        assert "model.safetensors: truncated or corrupt LongSpec draft" in _one_line(e), n
    (bad / "model.safetensors").write_bytes(raw)
    (bad / "config.json").write_text("{not json")
    with pytest.raises(CorruptFileError, match="config.json: not a LongSpec draft description"):
        load_draft(bad)
    (bad / "config.json").write_text(json.dumps({"format": artifacts.FORMAT, "kind": "longspec", "target": "tiny"}))
    with pytest.raises(CorruptFileError, match=r"config.json: not a LongSpec draft description \(missing"):
        load_draft(bad)


@pytest.mark.parametrize(
    "override, message",
    [
        ({"optim": {"lr": "abc"}}, "optim.lr: expected a number, got 'abc'"),
        ({"steps": 1.5}, "steps: expected an integer, got 1.5"),
        ({"log": {"plot": "yes"}}, "log.plot: expected true or false, got 'yes'"),
        ({"data": {"sources": ["stdlib", 3]}}, "data.sources: expected a list of strings"),
        ({"target": {"path": 7}}, "target.path: expected a string, got 7"),
    ],
)
def test_override_types_are_checked(override, message):
    with pytest.raises(ConfigError) as e:
        from_dict(LongSpecTrainConfig, override)
    assert _one_line(e).startswith(message)


def test_numbers_that_yaml_reads_as_strings_still_parse():
    assert from_dict(LongSpecTrainConfig, {"optim": {"lr": "5e-4"}}).optim.lr == 5e-4


def test_train_cli_bad_override_type(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), "--config", str(ROOT / "configs/train/smollm2-smoke.yaml")]
        + ["--set", "optim.lr=abc"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "optim.lr: expected a number, got 'abc'" in proc.stderr
    assert "Traceback" not in proc.stderr


def _train_cli(*args, cwd):
    return subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *args], capture_output=True, text=True, cwd=cwd, timeout=120
    )


# train.py's config and flag misuses: case -> (arguments, the start of the one stderr line)
_TRAIN_CLI_CASES = {
    "dir": (["--config", "."], "error: --config: . is a directory, not a YAML file"),
    "missing": (["--config", "nope.yaml"], "error: --config: nope.yaml: no such file"),
    "syntax": (
        ["--config", "bad.yaml"],
        "error: config bad.yaml: YAML syntax error at line 4, column 14: mapping values are not allowed here",
    ),
    "list": (["--config", "list.yaml"], "error: config list.yaml: expected a mapping of config sections"),
    "set": (["--config", "SMOKE", "--set", "data.sources=[stdlib"], "error: --set data.sources=[stdlib: not a"),
    "both": (["--config", "SMOKE", "--resume", "--overwrite"], "error: --resume and --overwrite: pass one"),
    "overwrite-export": (["--config", "SMOKE", "--overwrite", "--export", "d"], "error: --overwrite: only when"),
    "export-untrained": (["--config", "SMOKE", "--export", "d"], "error: no checkpoint to export in "),
}


@pytest.mark.parametrize("case", list(_TRAIN_CLI_CASES))
def test_train_cli_bad_config_and_flags(tmp_path, case):
    """A directory, a missing file, a YAML syntax error (with its line and column), a YAML list, a bad --set
    value and flags that do not go together: one line each, exit status 2, no traceback."""
    (tmp_path / "bad.yaml").write_text("name: x\ndata:\n  seq_len: 32\n   batch_size: 2\n")
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    args, message = _TRAIN_CLI_CASES[case]
    args = [str(ROOT / "configs/train/smollm2-smoke.yaml") if a == "SMOKE" else a for a in args]
    if case == "export-untrained":
        args += ["--set", f"run_dir={tmp_path / 'never-trained'}"]
    proc = _train_cli(*args, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(message) and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "d").exists()
