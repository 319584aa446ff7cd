"""A method is one folder: `tests/external_method/` (outside the lsjax package, nothing else edited) named in
$LSJAX_METHODS gets its own decode.py flag, decodes losslessly through decode.py, and trains and exports
through train.py on the shared step loop."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from lsjax.methods import registry
from tests.test_registry import ByteTokenizer
from tests.tiny import fake_loading, tiny_model

FOLDER = Path(__file__).resolve().parent / "external_method"


@pytest.fixture
def echo(tmp_path, monkeypatch):
    folder = tmp_path / "echo_method"
    shutil.copytree(FOLDER, folder)
    monkeypatch.setenv(registry.ENV, str(folder))
    yield folder
    registry.unregister("echo")
    registry.unregister_kind("echo-bias")
    for name in [m for m in sys.modules if m.split(".")[0] == folder.name]:
        del sys.modules[name]


def test_the_folder_brings_its_flag_and_its_kind(echo):
    from lsjax.cli import decode

    assert "echo" in registry.names() and "echo-bias" in registry.kind_names()
    parser, dests = decode.build_parser()
    assert "echo_depth" in dests and parser.parse_args(["--echo-depth", "2"]).echo_depth == 2
    assert decode.ignored_flags(parser.parse_args(["--echo-depth", "2"]), "pld") == ["--echo-depth"]
    with pytest.raises(registry.ConfigError, match="echo_depth: must be an integer in"):
        registry.get("echo").make_options(echo_depth=9)


def test_the_folder_decodes_through_decode_py(echo, monkeypatch, capsys, tmp_path):
    import lsjax.loading
    from lsjax.cli import decode
    from lsjax.loading import LoadedModel

    config, params = tiny_model()
    model = LoadedModel(config, params, ByteTokenizer(), tmp_path / "toy.gguf")
    for name, fn in fake_loading(model).items():
        monkeypatch.setattr(lsjax.loading, name, fn)
    argv = ["--prompt", "aaaa bbbb aaaa", "--method", "echo", "--echo-depth", "2", "--max-new-tokens", "10"]
    assert decode.main([*argv, "--ignore-eos", "--compare", "ar"]) == 0
    err = capsys.readouterr().err
    assert "method echo" in err and "outputs identical" in err
    with pytest.raises(SystemExit) as e:
        decode.main(["--method", "echo", "--echo-depth", "0", "--prompt", "x"])
    assert e.value.code == 2 and "--echo-depth: must be an integer in [1, 8]" in capsys.readouterr().err


def test_the_folder_trains_and_exports_through_train_py(echo, tmp_path, capsys):
    import train

    cfg = tmp_path / "echo.yaml"
    cfg.write_text(f"kind: echo-bias\nrun_dir: {tmp_path / 'run'}\n")
    assert train.main(["--config", str(cfg), "--no-progress"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["steps"] == 4 and summary["loss"] < 2.77  # below log(16): it learned the 4 tokens' share
    assert train.main(["--config", str(cfg), "--export", str(tmp_path / "out")]) == 0
    bias = json.loads((tmp_path / "out" / "bias.json").read_text())
    assert min(bias[:4]) > max(bias[4:])
