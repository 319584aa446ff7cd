"""train.py's one path through the training kinds the method folders register (lsjax.methods.registry): a
config's `kind:` picks the config class, trainer and export; no `kind:` is the default kind, the LongSpec draft;
an unknown kind or an option that does not apply to the kind is one line and exit status 2."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import yaml

from lsjax.config import ConfigError, from_dict, load_yaml, to_dict
from lsjax.methods import registry
from tests.test_train import tiny_dict

ROOT = Path(__file__).resolve().parents[1]


def _train_main():
    spec = importlib.util.spec_from_file_location("train_cli", ROOT / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def _run(capsys, *args) -> tuple[int, str, str]:
    code = _train_main()(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_registry_names_every_trainer():
    assert registry.kind_names() == (
        "longspec",
        "block",
        "local_head",
        "streams",
        "tokenswift-heads",
        "eagle3",
        "dflash",
    )
    assert registry.kind_of({}) == registry.kind_of({"kind": None}) == registry.default_kind() == "longspec"
    assert registry.kind_of({"kind": "block"}) == "block"
    with pytest.raises(ConfigError, match="^kind: unknown kind 'nope'; known kinds: longspec, block"):
        registry.get_kind("nope")
    with pytest.raises(ConfigError, match="^kind: unknown kind"):
        registry.get_kind(["longspec"])
    from lsjax.cli import train as cli

    help_text = " ".join(cli.__doc__.split())
    assert all(name in help_text for name in registry.kind_names()), "train.py --help names every kind"


def test_one_kind_at_most_is_the_default():
    """The default is the method folder's word (`register_kind(..., default=True)`), and only one folder's."""
    second = registry.Kind("second", "", "x:C", "x:fit", "x:export", default=True)
    with pytest.raises(ConfigError, match="^training kind: 'second' cannot be the default, 'longspec' is$"):
        registry.register_kind(second)
    assert "second" not in registry.kind_names()


@pytest.mark.parametrize("name", registry.kind_names())
def test_each_registered_kind_parses_its_config(name):
    kind = registry.get_kind(name)
    cfg = from_dict(kind.config_class, {"kind": name})
    assert cfg.kind == name
    assert from_dict(kind.config_class, to_dict(cfg)) == cfg
    assert callable(registry.load(kind.trainer)) and callable(registry.load(kind.exporter))


@pytest.mark.parametrize("path", sorted((ROOT / "configs" / "train").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_config_resolves_to_a_kind(path):
    raw = yaml.safe_load(path.read_text()) or {}
    kind = registry.get_kind(registry.kind_of(raw))
    assert load_yaml(kind.config_class, path).kind == kind.name


def test_unknown_kind_is_one_line_and_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: nope\nname: x\n")
    code, out, err = _run(capsys, "--config", str(bad))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "unknown kind 'nope'" in err
    assert all(name in err for name in registry.kind_names())
    # --set reaches the kind too
    code, _, err = _run(capsys, "--config", str(ROOT / "configs/train/smollm2-smoke.yaml"), "--set", "kind=nope")
    assert code == 2 and err.count("\n") == 1 and "unknown kind" in err


def test_an_option_that_does_not_apply_is_one_line_and_exit_2(tmp_path, capsys):
    for config in ("smollm2-block.yaml", "smollm2-localhead.yaml", "smollm2-tokenswift.yaml", "smollm2-streams.yaml"):
        code, _, err = _run(capsys, "--config", str(ROOT / "configs/train" / config), "--export", "x", "--tree", "2,1")
        assert code == 2 and err.count("\n") == 1 and "--tree: does not apply to kind" in err, (config, err)
    smoke = str(ROOT / "configs/train/smollm2-smoke.yaml")
    code, _, err = _run(capsys, "--config", smoke, "--tree", "2,1")  # longspec, but not exporting
    assert code == 2 and err.count("\n") == 1 and "only with --export" in err
    for bad in ("0,x", "cpu=1;xpu=2", "cpu=1;cpu=2", "cpu=0"):
        code, _, err = _run(capsys, "--config", smoke, "--export", str(tmp_path / "d"), "--tree", bad)
        assert code == 2 and err.count("\n") == 1 and err.startswith("error: --tree:"), (bad, err)
    assert not (tmp_path / "d").exists()


@pytest.mark.slow  # ~17 s
def test_an_old_config_without_kind_trains(tmp_path, capsys):
    """A config written before kinds existed (no `kind:`) trains the LongSpec draft through train.py's path."""
    raw = tiny_dict(tmp_path / "run", steps=2, checkpoint={"every": 2}, log={"progress": False, "plot": False})
    assert "kind" not in raw
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(raw))
    code, out, err = _run(capsys, "--config", str(path), "--no-progress")
    assert code == 0, err
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["steps"] == 2 and summary["loss"] > 0 and summary["last_checkpoint"] == 2
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["kind"] == "longspec"
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 2
