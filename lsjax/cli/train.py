"""Train a draft: python train.py --config configs/train/X.yaml [--set a.b=value ...] [--resume | --overwrite]
(installed: lsjax-train ...)

The config's `kind:` names the trainer, as the method folders register them (`lsjax.methods.registry`):
longspec (the LongSpec draft; the default when the config names no kind), block, local_head, streams,
tokenswift-heads, eagle3 or dflash. A run directory that already has checkpoints is continued (--resume) or
started afresh (--overwrite); Ctrl-C stops with exit status 130.
On several hosts (kind longspec), the same command runs on each, with JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES
and JAX_PROCESS_ID set (or LSJAX_DISTRIBUTED=1 on a Cloud TPU pod): docs/training.md, "Several hosts"."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

import yaml


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--config", required=True, help="a configs/train/*.yaml file")
    p.add_argument("--set", action="append", default=[], metavar="a.b=value", help="override a config field")
    p.add_argument("--resume", action="store_true", help="continue from the run's latest checkpoint")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="start afresh in a run directory that has checkpoints: removes the old run's checkpoints, metrics "
        "and other outputs first",
    )
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
    previous = signal.getsignal(signal.SIGINT)
    if argv is None:  # run as a program (not from a test's or a caller's process): Ctrl-C stops between steps
        signal.signal(signal.SIGINT, _stop_between_steps)
    try:
        return _main(args)
    except KeyboardInterrupt:  # before or after training (fit reports one during it)
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGINT, previous)


def _stop_between_steps(signum, frame) -> None:
    """The first Ctrl-C asks the step loop to stop after the step in flight (a KeyboardInterrupt raised inside
    library code can be swallowed there); a second one interrupts at once."""
    from lsjax.train import runner

    signal.signal(signal.SIGINT, signal.default_int_handler)
    runner.request_stop()


def _main(args) -> int:
    from lsjax.config import ConfigError, apply_overrides, from_dict, to_dict
    from lsjax.methods import registry

    if args.resume and args.overwrite:
        return _error("--resume and --overwrite: pass one (continue the run, or start it afresh)")
    if args.overwrite and args.export:
        return _error("--overwrite: only when training (it removes the run's checkpoints), not with --export")
    raw = _read_config(args.config)
    if isinstance(raw, str):
        return _error(raw)
    try:
        for item in args.set:
            try:
                apply_overrides(raw, [item])
            except yaml.YAMLError as e:
                return _error(f"--set {item}: not a YAML value ({getattr(e, 'problem', None) or e})")
        kind = registry.get_kind(registry.kind_of(raw))
        cfg = from_dict(kind.config_class, raw)
    except (ConfigError, TypeError) as e:
        return _error(f"config {args.config}: {str(e).splitlines()[0]}")
    if (bad := _inapplicable_flag(args, kind)) is not None:
        return _error(bad)
    if args.export:
        return export(kind, cfg, args)
    return fit(kind, cfg, to_dict(cfg), progress=not args.no_progress, resume=args.resume, overwrite=args.overwrite)


def _error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def _read_config(path: str) -> dict | str:
    """The config file as a dict, or what is wrong with it (one line)."""
    if Path(path).is_dir():
        return f"--config: {path} is a directory, not a YAML file"
    try:
        with open(path) as f:
            raw = yaml.safe_load(f)
    except FileNotFoundError:
        return f"--config: {path}: no such file"
    except OSError as e:
        return f"--config: {path}: {e.strerror or e}"
    except UnicodeDecodeError:
        return f"--config: {path} is not a text (YAML) file"
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = e.problem or e.context or "unparsable"
        return f"config {path}: YAML syntax error{where}: {problem}"
    except yaml.YAMLError as e:
        return f"config {path}: YAML error: {str(e).splitlines()[0]}"
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        return f"config {path}: expected a mapping of config sections, got a YAML {type(raw).__name__}"
    return raw


def _inapplicable_flag(args, kind) -> str | None:
    """Why a given option does not apply to this kind (None when they all do)."""
    if args.tree is None:
        return None
    if "tree" not in kind.flags:
        from lsjax.methods import registry

        takers = ", ".join(name for name in registry.kind_names() if "tree" in registry.get_kind(name).flags)
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


def fit(kind, cfg, config_dict: dict, *, progress: bool, resume: bool, overwrite: bool = False) -> int:
    from lsjax.errors import LsjaxError
    from lsjax.train.runner import TrainingDiverged

    try:
        out = kind.fit(cfg, resume=resume, overwrite=overwrite, progress=progress, config_dict=config_dict)
    except TrainingDiverged as e:
        print(f"error: {e}", file=sys.stderr)
        return 3
    except KeyboardInterrupt as e:
        print(_interrupted(e, cfg), file=sys.stderr)
        return 130
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


def _interrupted(e: KeyboardInterrupt, cfg) -> str:
    """Ctrl-C during a run, in one line: the steps done (when in the step loop) and the checkpoint to resume."""
    from lsjax.train.runner import TrainingInterrupted

    line = f"interrupted after step {e.step} of {e.total}" if isinstance(e, TrainingInterrupted) else "interrupted"
    try:
        from lsjax.train.checkpoint import latest_step

        latest = latest_step(Path(cfg.resolved_run_dir) / "checkpoints")
    except Exception:  # an interrupted import, say: the line without the checkpoint
        return line
    if latest is None:
        return f"{line}; no checkpoint saved"
    return f"{line}; the last checkpoint is step {latest}: continue with --resume"


def export(kind, cfg, args) -> int:
    """The run's latest checkpoint -> the directory `decode.py` (or the shipped drafts) loads."""
    from lsjax.errors import LsjaxError
    from lsjax.train.checkpoint import checkpoint_dir, latest_step

    run_dir = cfg.resolved_run_dir
    if latest_step(checkpoint_dir(run_dir)) is None:
        return _error(f"no checkpoint to export in {run_dir} (train it first)")
    try:
        info = kind.export(cfg, args.export, config_path=args.config, tree=args.tree)
    except (LsjaxError, FileNotFoundError, ValueError) as e:
        return _error(f"cannot export {run_dir}: {str(e).splitlines()[0]}")
    print(json.dumps({"exported": args.export, "from": run_dir, **info}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
