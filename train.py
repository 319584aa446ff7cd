"""Train a draft: python train.py --config configs/train/X.yaml [--set a.b=value ...] [--resume]

A LongSpec draft by default; Speculative Streaming's streams for a config with a `streams:` section;
TokenSwift's heads for a config with `kind: tokenswift-heads`."""

from __future__ import annotations

import argparse
import json
import sys

import yaml


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--config", required=True, help="a configs/train/*.yaml file")
    p.add_argument("--set", action="append", default=[], metavar="a.b=value", help="override a config field")
    p.add_argument("--resume", action="store_true", help="continue from the run's latest checkpoint")
    p.add_argument("--no-progress", action="store_true", help="no tqdm bar (logs only)")
    p.add_argument(
        "--export",
        metavar="DIR",
        help="do not train: write the run's latest checkpoint as a decode.py draft (params.npz + draft.json)",
    )
    p.add_argument("--tree", help="with --export: the tree preset or widths decode.py uses for this draft by default")
    args = p.parse_args(argv)

    from lsjax.config import ConfigError, apply_overrides, from_dict, to_dict
    from lsjax.errors import LsjaxError
    from lsjax.train.config import TrainConfig

    try:
        with open(args.config) as f:
            raw = yaml.safe_load(f) or {}
        if isinstance(raw, dict) and "streams" in raw:  # Speculative Streaming: its own trainer
            from lsjax.train.streams import cli

            return cli(raw, args)
        raw = apply_overrides(raw, args.set)
        if (
            isinstance(raw, dict) and raw.get("kind") == "tokenswift-heads"
        ):  # TokenSwift's heads, from the shared feature cache
            return heads(raw, args)
        cfg = from_dict(TrainConfig, raw)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (ConfigError, yaml.YAMLError, TypeError) as e:
        print(f"error: config {args.config}: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2

    if args.export:
        return export(cfg, args.export, args.config, args.tree)

    from lsjax.train.loop import TrainingDiverged, fit

    try:
        out = fit(cfg, resume=args.resume, progress=not args.no_progress, config_dict=to_dict(cfg))
    except TrainingDiverged as e:
        print(f"error: {e}", file=sys.stderr)
        return 3
    except LsjaxError as e:  # a bad config field, a missing or corrupt target checkpoint
        print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    final = out["final"]
    print(
        json.dumps(
            {
                "run_dir": out["run_dir"],
                "steps": out["steps"],
                "loss": final.get("loss"),
                "tokens_per_s": round(out["tokens_per_s"], 1),
                "wall_s": round(out["wall_s"], 1),
                "last_checkpoint": out["last_checkpoint"],
            }
        )
    )
    return 0


def heads(raw: dict, args) -> int:
    """`kind: tokenswift-heads` configs: train (or --export) TokenSwift's multi-token heads."""
    from lsjax.config import ConfigError, from_dict, to_dict
    from lsjax.errors import LsjaxError
    from lsjax.train.heads import HeadsTrainConfig, export_heads, fit_heads
    from lsjax.train.loop import TrainingDiverged

    try:
        cfg = from_dict(HeadsTrainConfig, raw)
    except (ConfigError, TypeError) as e:
        print(f"error: config {args.config}: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    if args.export:
        try:
            export_heads(cfg, args.export)
        except (LsjaxError, FileNotFoundError, ValueError) as e:
            print(
                f"error: no checkpoint to export in {cfg.resolved_run_dir}: {str(e).splitlines()[0]}", file=sys.stderr
            )
            return 2
        print(json.dumps({"exported": args.export, "from": cfg.resolved_run_dir}))
        return 0
    try:
        out = fit_heads(cfg, resume=args.resume, config_dict=to_dict(cfg))
    except TrainingDiverged as e:
        print(f"error: {e}", file=sys.stderr)
        return 3
    except (LsjaxError, FileNotFoundError, ImportError, ValueError) as e:
        print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    final = out["final"]
    print(
        json.dumps(
            {
                "run_dir": out["run_dir"],
                "steps": out["steps"],
                "loss": final.get("loss"),
                "wall_s": round(out["wall_s"], 1),
            }
        )
    )
    return 0


def export(cfg, out_dir: str, config_path: str, tree: str | None = None) -> int:
    """Latest checkpoint of the run -> a draft directory `decode.py --draft DIR` (or the shipped one) loads."""
    from lsjax.config import ConfigError
    from lsjax.errors import LsjaxError
    from lsjax.train.export import export_run
    from lsjax.tree import parse_tree

    run_dir = cfg.resolved_run_dir
    try:
        tree_cfg = parse_tree(tree) if tree else None
    except ConfigError as e:
        print(f"error: --tree: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    try:
        params = export_run(cfg, out_dir, extra={"train_config": config_path}, tree=tree_cfg)
    except (LsjaxError, FileNotFoundError, ValueError) as e:
        print(f"error: no checkpoint to export in {run_dir}: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    print(json.dumps({"exported": out_dir, "from": run_dir, "tensors": len(params)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
