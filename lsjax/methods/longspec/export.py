"""A training run -> a draft directory `decode.py --draft DIR` (or the shipped one) loads.

The directory format (`lsjax.artifacts`, kind "longspec") is read by `lsjax.methods.longspec.checkpoint.load_draft`:
`model.safetensors` (the draft's tensors in bfloat16, plus `vocab_ids` when the vocabulary is pruned; the
derived `vocab_head` is never saved) and `config.json` (the DraftConfig, the target's name, the default tree
and the run's training summary).
"""

from __future__ import annotations

from pathlib import Path

from lsjax import artifacts
from lsjax.config import ConfigError, DraftConfig, to_dict
from lsjax.methods.longspec.checkpoint import DEFAULT_TARGET, target_key
from lsjax.models.draft_params import DraftParams
from lsjax.train.checkpoint import run_draft_params
from lsjax.train.runner import training_summary
from lsjax.tree import TreeConfig


def save_draft(
    path: str | Path,
    draft_params,
    draft_config: DraftConfig,
    target_name: str,
    tree: TreeConfig | dict[str, TreeConfig] | None = None,
    extra: dict | None = None,
) -> None:
    """Writes a draft directory; `draft_params` is a DraftParams or a dict in the file layout (weights, plus
    `vocab_ids` when pruned). The derived head is never saved."""
    if isinstance(tree, dict):  # per device: one measured there (`shipped_tree` reads either form)
        stored = {device: list(t.widths) for device, t in tree.items()}
    else:
        stored = list(tree.widths) if tree else None
    meta = {
        "target": target_name,
        "draft_config": to_dict(draft_config),
        "tree": stored,
        **(extra or {}),
    }
    artifacts.save_weights(path, DraftParams.of(draft_params).arrays(), meta, kind="longspec")


def check_tree_lags(cfg, tree: TreeConfig) -> None:
    """A draft exported with a default tree must have been trained at every lag that tree drafts at."""
    loss = cfg.loss
    if loss.flash_noisy and tree.depth > loss.gamma - 1:
        raise ConfigError(
            f"tree {','.join(map(str, tree.widths))} is {tree.depth} levels deep (it drafts at lags 1..{tree.depth}), "
            f"but this draft was trained for lags 1..{loss.gamma - 1} (loss.gamma={loss.gamma}): export a tree at "
            f"most {loss.gamma - 1} deep, or train with loss.gamma >= {tree.depth + 1}"
        )


def export_run(
    cfg, out_dir: str | Path, extra: dict | None = None, tree: TreeConfig | dict[str, TreeConfig] | None = None
) -> dict:
    """A LongSpec training run's latest checkpoint (`cfg`) -> a draft directory; returns the arrays written
    (the file layout). The run's pruned vocabulary (vocab_ids.npy) travels with them; config.json records the
    run's training summary and the default `tree` decode.py should use with this draft."""
    if tree is not None:
        for t in tree.values() if isinstance(tree, dict) else (tree,):
            check_tree_lags(cfg, t)
    params = run_draft_params(cfg)
    run_dir = Path(cfg.resolved_run_dir)
    target = target_key(cfg.target.path) if cfg.target.path else DEFAULT_TARGET
    extra = {"run_dir": str(run_dir), "training": training_summary(run_dir), **(extra or {})}
    if cfg.checkpoint.init_from and extra.get("train_config"):
        extra["lineage"] = lineage(cfg.checkpoint.init_from) + [extra["train_config"]]
    save_draft(out_dir, params, cfg.draft, target, tree=tree, extra=extra)
    return params.arrays()


def lineage(draft_dir: str | Path) -> list[str]:
    """The training configs that made the draft in `draft_dir`, first stage first (from its config; a run
    directory that is no exported draft, or an unrecorded config, contributes nothing): what a continued draft
    records."""
    if not artifacts.has_weights(draft_dir, "longspec"):
        return []
    meta = artifacts.read_config(draft_dir, "longspec")
    return list(meta.get("lineage") or ([meta["train_config"]] if meta.get("train_config") else []))


def export_kind(cfg, out_dir, *, config_path: str | None = None, tree: str | None = None) -> dict:
    """`train.py --export` of a LongSpec run -> its draft directory; `tree`: the default tree stored with the
    draft."""
    from lsjax.tree import parse_device_trees

    trees = parse_device_trees(tree) if tree else None
    params = export_run(cfg, out_dir, extra={"train_config": config_path}, tree=trees)
    return {"tensors": len(params)}
