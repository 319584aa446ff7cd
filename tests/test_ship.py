"""Shipping a trained EAGLE-3 draft (`tools/ship_draft.py`): its files, card and acceptance land under the target's
drafts; `--method eagle3` then runs it without `--draft`, and `auto` runs it on accelerators once dev chose it."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from lsjax.errors import InputError, LsjaxError
from lsjax.methods import registry
from lsjax.methods.eagle3.checkpoint import random_draft, write_draft
from tests.tiny import tiny_model


@pytest.fixture
def shop(tmp_path, monkeypatch):
    """A tiny target filed as "Tiny-Target", the package's drafts in tmp_path, and an EAGLE-3 draft for it."""
    monkeypatch.setattr("lsjax.methods.longspec.checkpoint.DRAFTS_DIR", tmp_path / "drafts")
    config, params = tiny_model()
    model = type("Model", (), {"config": config, "params": params, "path": tmp_path / "Tiny-Target.Q4_1.gguf"})
    cfg, dp, _ = random_draft(config, seed=1)
    src = write_draft(tmp_path / "trained", cfg, dp, "eagle")
    return model, src, tmp_path / "drafts" / "Tiny-Target"


def report(suite: str, draft, first: float, sampled: float = 0.3) -> dict:
    """What `draft_accept --json` writes: two prompts at T = 0 and T = 1."""
    rows = []
    for i, prompt in enumerate(("a/1K-2K/00", "b/1K-2K/00")):
        rows.append({"prompt": prompt, "draft": str(draft), "T": 0.0, "first": first + 0.1 * i, "top2": 0.9})
        rows.append({"prompt": prompt, "draft": str(draft), "T": 1.0, "sampled": sampled, "match": 0.1})
    return {"suite": suite, "new_tokens": 96, "rows": rows}


def on_an_accelerator(monkeypatch):
    """auto's default as on a GPU or TPU: a draft unless `--draft none` (on a CPU it leaves the draft out)."""
    monkeypatch.setattr(
        "lsjax.methods.auto.config.without_draft",
        lambda o: o.eagle3 is None and o.dflash is None and o.draft == "none",
    )


def test_a_shipped_draft_runs_without_draft_and_auto_runs_it_once_chosen(shop, monkeypatch):
    from tools.ship_draft import ship

    model, src, target_dir = shop
    with pytest.raises(InputError, match="no EAGLE-3 draft ships for this target"):
        registry.build("eagle3", model)
    (target_dir).mkdir(parents=True)
    # The LongSpec draft auto runs now: its dev first-level acceptance is what a new choice must beat.
    (target_dir / "accept.json").write_text(json.dumps({"dev": {"summary": {"first": 0.45}}}))
    out = ship(model, "eagle3", src, report("dev", src, 0.5), report("heldout", src, 0.4), auto=True)

    assert out == target_dir / "eagle3"
    assert sorted(p.name for p in out.iterdir()) == ["MODEL_CARD.md", "accept.json", "config.json", "model.safetensors"]
    acc = json.loads((out / "accept.json").read_text())
    assert acc["dev"]["summary"] == {"prompts": 2, "first": 0.55, "top2": 0.9, "sampled": 0.3}
    assert acc["heldout"]["summary"]["first"] == 0.45 and len(acc["heldout"]["rows"]) == 4
    card = (out / "MODEL_CARD.md").read_text()
    assert "# EAGLE-3 draft for Tiny-Target" in card and "| dev (chooses) | 2 | 0.550 | 0.900 | 0.300 |" in card
    assert json.loads((target_dir / "auto.json").read_text()) == {"draft": "eagle3"}

    drafter, dp = registry.build("eagle3", model)  # no --draft: the shipped one, the very weights given
    _, want, _ = random_draft(model.config, seed=1)
    np.testing.assert_allclose(np.asarray(dp["fc"]), np.asarray(want["fc"]), rtol=1e-6)

    auto, adp = registry.build("auto", model)
    assert auto.eagle3 is None, "on a CPU auto leaves the draft out unless one is given"
    on_an_accelerator(monkeypatch)
    auto, adp = registry.build("auto", model)
    assert auto.eagle3 is not None and auto.longspec is None
    np.testing.assert_allclose(np.asarray(adp["eagle3"]["fc"]), np.asarray(want["fc"]), rtol=1e-6)
    assert registry.build("auto", model, draft="none")[0].eagle3 is None
    assert jax.tree.leaves(adp)


def test_shipping_refuses_in_one_line(shop, monkeypatch, tmp_path):
    from lsjax.config import ConfigError
    from lsjax.methods.auto.config import shipped_choice
    from tools.ship_draft import ship

    model, src, target_dir = shop
    dev, held = report("dev", src, 0.5), report("heldout", src, 0.4)
    with pytest.raises(InputError, match="a draft_accept report of the dev suite is needed, this one is of 'heldout'"):
        ship(model, "eagle3", src, held, held)
    with pytest.raises(InputError, match="one of eagle3, dflash ships this way"):
        ship(model, "longspec", src, dev, held)
    with pytest.raises(InputError, match="no rows of draft"):
        two = report("dev", src, 0.5)
        two["rows"] += [dict(r, draft="other") for r in two["rows"]]
        ship(model, "eagle3", f"{src}/.", two, held)
    big_config, _ = tiny_model(vocab=131)
    other = write_draft(tmp_path / "other-target", *random_draft(big_config)[:2], "eagle")
    with pytest.raises(LsjaxError):  # a draft of another target is refused before anything is copied
        ship(model, "eagle3", other, report("dev", other, 0.9), report("heldout", other, 0.9))
    assert not (target_dir / "eagle3").exists()

    ship(model, "eagle3", src, dev, held, auto=True)
    with pytest.raises(InputError, match=r"dev first-level acceptance 0\.550 is not above 0\.550, the eagle3 draft's"):
        ship(model, "eagle3", src, dev, held, auto=True)
    ship(model, "eagle3", src, dev, held, auto=True, force=True)

    (target_dir / "auto.json").write_text(json.dumps({"draft": "medusa"}))
    with pytest.raises(ConfigError, match="draft must be one of longspec, eagle3, dflash, got 'medusa'"):
        shipped_choice(model.path)
    (target_dir / "auto.json").write_text(json.dumps({"draft": "dflash"}))
    with pytest.raises(LsjaxError, match="names the dflash draft, but .* holds none"):
        shipped_choice(model.path)


def test_the_command_line_names_a_missing_report(tmp_path, capsys):
    from tools.ship_draft import main

    with pytest.raises(SystemExit) as e:
        main(["--method", "eagle3", "--draft", str(tmp_path), "--dev", str(tmp_path / "no.json"), "--heldout", "x"])
    assert e.value.code == 2
    assert "--dev " in capsys.readouterr().err.strip().splitlines()[-1]
