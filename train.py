"""Train a LongSpec draft: python train.py --config configs/train/X.yaml [--set a.b=value ...] [--resume]"""

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
    args = p.parse_args(argv)

    from lsjax.config import ConfigError, TrainConfig, apply_overrides, from_dict, to_dict

    try:
        with open(args.config) as f:
            raw = yaml.safe_load(f) or {}
        cfg = from_dict(TrainConfig, apply_overrides(raw, args.set))
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (ConfigError, yaml.YAMLError, TypeError) as e:
        print(f"error: config {args.config}: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2

    if args.export:
        return export(cfg, args.export, args.config)

    from lsjax.train import TrainingDiverged, fit

    try:
        out = fit(cfg, resume=args.resume, progress=not args.no_progress, config_dict=to_dict(cfg))
    except TrainingDiverged as e:
        print(f"error: {e}", file=sys.stderr)
        return 3
    except ConfigError as e:
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


def export(cfg, out_dir: str, config_path: str) -> int:
    """Latest checkpoint of the run -> a draft directory `decode.py --draft DIR` (or the shipped one) loads."""
    from pathlib import Path

    import numpy as np

    from lsjax.checkpoint import load_draft_params
    from lsjax.drafters.longspec import save_draft
    from lsjax.errors import LsjaxError

    run_dir = Path(cfg.resolved_run_dir)
    try:
        params = load_draft_params(run_dir)
    except (LsjaxError, FileNotFoundError, ValueError) as e:
        print(f"error: no checkpoint to export in {run_dir}: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    params = {k: np.asarray(v) for k, v in params.items()}
    vocab = run_dir / "vocab_ids.npy"
    if vocab.is_file():  # a pruned draft vocabulary travels with the params
        params["vocab_ids"] = np.load(vocab)
    target = Path(cfg.target.path).name.split(".")[0] if cfg.target.path else "SmolLM2-135M-Instruct"
    save_draft(out_dir, params, cfg.draft, target, extra={"train_config": config_path, "run_dir": str(run_dir)})
    print(json.dumps({"exported": out_dir, "from": str(run_dir), "tensors": len(params)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
