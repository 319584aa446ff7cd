"""A DeLS-Spec training run (kind local_head | block) -> the directory decode.py loads
(`lsjax.methods.dels.checkpoint`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from lsjax.methods.dels.checkpoint import save_block_draft, save_local_head
from lsjax.methods.longspec.checkpoint import DEFAULT_TARGET, target_key
from lsjax.train.checkpoint import run_draft_params
from lsjax.train.runner import training_summary


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def export_dels(cfg, out_dir, extra: dict | None = None) -> dict:
    """The run's latest checkpoint -> a local-head or block-draft directory; returns the exported params."""
    run_dir = Path(cfg.resolved_run_dir)
    params = run_draft_params(cfg)  # the weights and the run's pruned vocabulary
    target = target_key(cfg.target.path) if cfg.target.path else DEFAULT_TARGET
    meta = {
        "run_dir": str(run_dir),
        "training": training_summary(run_dir) | {"run": _read_json(run_dir / "run.json")},
        **(extra or {}),
    }
    if cfg.kind == "local_head":
        meta |= {"prior": _read_json(run_dir / "prior.json"), "dev": _read_json(run_dir / "dev.json")}
        prior = np.load(run_dir / "unigram_logprior.npy")
        save_local_head(out_dir, params.weights, cfg.local_head, prior, target, vocab_ids=params.vocab_ids, extra=meta)
        return params.weights
    save_block_draft(out_dir, params, cfg.draft, cfg.block, target, extra=meta)
    return params.arrays()


def export_kind(cfg, out_dir, *, config_path: str | None = None, tree: str | None = None) -> dict:
    """`train.py --export` of a block or local-head run -> its directory."""
    return {"tensors": len(export_dels(cfg, out_dir, {"train_config": config_path}))}
