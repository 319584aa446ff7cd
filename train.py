"""Train a draft: python train.py --config configs/train/X.yaml [--set a.b=value ...] [--resume]

The config's `kind:` names the trainer (`lsjax.train.kinds`): longspec (the LongSpec draft; the default when
the config names no kind), block, local_head, tokenswift-heads or streams."""

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
    p.add_argument("--no-progress", action="store_true", help="no tqdm bar (one log line per logged step)")
    p.add_argument(
        "--export",
        metavar="DIR",
        help="do not train: write the run's latest checkpoint as the directory decode.py loads",
    )
    p.add_argument(
        "--tree",
        help="kind longspec, with --export: the tree preset or widths decode.py uses for this draft, for every "
        "device or per device ('cpu=1;gpu=paper': a device not named uses its preset)",
    )
    args = p.parse_args(argv)

    from lsjax.config import ConfigError, apply_overrides, from_dict, to_dict
    from lsjax.train import kinds

    try:
        with open(args.config) as f:
            raw = yaml.safe_load(f) or {}
        raw = apply_overrides(raw, args.set)
        kind = kinds.get(kinds.kind_of(raw))
        cfg = from_dict(kind.config_class, raw)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (ConfigError, yaml.YAMLError, TypeError) as e:
        print(f"error: config {args.config}: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    if (bad := _inapplicable_flag(args, kind)) is not None:
        print(f"error: {bad}", file=sys.stderr)
        return 2
    if args.export:
        return export(kind, cfg, args)
    return fit(kind, cfg, to_dict(cfg), progress=not args.no_progress, resume=args.resume)


def _inapplicable_flag(args, kind) -> str | None:
    """Why a given option does not apply to this kind (None when they all do)."""
    if args.tree is None:
        return None
    if "tree" not in kind.flags:
        from lsjax.train import kinds

        takers = ", ".join(name for name in kinds.names() if "tree" in kinds.get(name).flags)
        return f"--tree: does not apply to kind {kind.name} (only to {takers})"
    if not args.export:
        return "--tree: only with --export (the tree stored with the exported draft)"
    from lsjax.config import ConfigError
    from lsjax.tree import parse_device_trees

    try:
        parse_device_trees(args.tree)
    except ConfigError as e:
        return f"--tree: {str(e).splitlines()[0]}"
    return None


def fit(kind, cfg, config_dict: dict, *, progress: bool, resume: bool) -> int:
    from lsjax.errors import LsjaxError
    from lsjax.train.runner import TrainingDiverged

    try:
        out = kind.fit(cfg, resume=resume, progress=progress, config_dict=config_dict)
    except TrainingDiverged as e:
        print(f"error: {e}", file=sys.stderr)
        return 3
    except (LsjaxError, FileNotFoundError, ImportError, ValueError) as e:  # a bad field, a missing set or target
        print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    summary = {
        "run_dir": out["run_dir"],
        "steps": out["steps"],
        "loss": out["final"].get("loss"),
        "tokens_per_s": round(out["tokens_per_s"], 1),
        "wall_s": round(out["wall_s"], 1),
        "last_checkpoint": out["last_checkpoint"],
    }
    if "export" in out:  # a kind that exports at the end of its run
        summary["export"] = out["export"]
    print(json.dumps(summary))
    return 0


def export(kind, cfg, args) -> int:
    """The run's latest checkpoint -> the directory `decode.py` (or the shipped drafts) loads."""
    from lsjax.errors import LsjaxError

    run_dir = cfg.resolved_run_dir
    try:
        info = kind.export(cfg, args.export, config_path=args.config, tree=args.tree)
    except (LsjaxError, FileNotFoundError, ValueError) as e:
        print(f"error: no checkpoint to export in {run_dir}: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    print(json.dumps({"exported": args.export, "from": run_dir, **info}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
