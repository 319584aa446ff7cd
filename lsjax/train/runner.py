"""The step loop every trainer shares: resume, step, log, evaluate, checkpoint, limits, plots.

    run_dir = prepare_run_dir(cfg, config_dict, resume=..., overwrite=...)
    out = run_steps(cfg, state, step, consts, data, rng, run_dir=run_dir, log=..., resume=..., evaluate=...)

`step(state, consts, batch, key) -> (state, metrics)` is jitted here with the state donated (or by `compile`,
e.g. with a mesh's shardings); `consts` are frozen arrays (the target's params, ...) passed as arguments so
they are not baked into the program; `metrics` must hold "loss". `data` is any `lsjax.train.inputs.Batches`:
`next()` gives one step's batch, `get_state()` / `set_state()` its JSON position. The key of step i is
fold_in(rng, i), and the data position is checkpointed with the params, the optimizer state and the RNG
(`lsjax.train.checkpoint`), so a resumed run replays the same batches and keys.

What a run writes in its directory: config.yaml, metrics.jsonl (every `log.every`-th step's record, the last
one, and `evaluate`'s dev metrics every `log.eval_every` steps), checkpoints/, run.json (steps and wall time
of this process), loss.png (`log.plot`), tb/ (`log.tensorboard`, when a writer is installed). A tqdm bar
shows progress (`log.progress`); without it each logged record is one line through `log`. A non-finite loss
stops the run (`TrainingDiverged`) with the last good checkpoint kept as the latest. `max_minutes` ends a run
early with a checkpoint (the learning-rate schedule keeps its length: a bounded run ends at a higher rate).
A directory that already has checkpoints must be resumed or overwritten (`prepare_run_dir`, `RunDirError`);
Ctrl-C in the loop raises `TrainingInterrupted` (a KeyboardInterrupt) with the steps done.

Multi-host (`lsjax.sharding.maybe_initialize_distributed`, which `fit` calls first): every process runs this
loop on the same global batches and writes the checkpoints with the others (orbax); only process 0 writes the
other files (config.yaml, metrics.jsonl, run.json, loss.png, tb/) and shows the bar. A kind runs multi-host
only with a `compile` that lays its step out on the mesh, and a `data` that gives global batches.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np

from lsjax import sharding
from lsjax.config import ConfigError
from lsjax.errors import LsjaxError
from lsjax.train import checkpoint as ckpt_lib


class TrainingDiverged(RuntimeError):
    """A non-finite loss: the run stops and the last good checkpoint stays the latest."""


class RunDirError(LsjaxError):
    """A run directory that already has checkpoints, trained again neither resumed nor overwritten (its old
    checkpoints would stay the latest: orbax skips a step that exists), or resume and overwrite together."""


_STOP = threading.Event()


def request_stop() -> None:
    """Asks the running step loop to stop after the step in flight (what a CLI's Ctrl-C handler calls). A
    KeyboardInterrupt raised wherever the main thread happens to be can be swallowed by library code there (an
    orbax save, a data iterator; seen: the loop went on stepping), so the loop polls this instead."""
    _STOP.set()


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C in the step loop: `step` optimizer steps of `total` done, checkpoints in `checkpoints`."""

    def __init__(self, step: int, total: int, checkpoints: Path):
        super().__init__(f"interrupted after step {step} of {total}")
        self.step, self.total, self.checkpoints = step, total, checkpoints


# What a run writes in its directory: `--overwrite` removes these (a fixed feature cache, features/, stays:
# it is checked against its inputs when reused).
RUN_OUTPUTS = (
    "checkpoints",
    "metrics.jsonl",
    "run.json",
    "config.yaml",
    "loss.png",
    "tb",
    "vocab_ids.npy",
    "unigram_logprior.npy",
    "prior.json",
    "dev.json",
    "export",
)


def prepare_run_dir(cfg, config_dict: dict | None = None, *, resume: bool = False, overwrite: bool = False) -> Path:
    """Creates the run directory (`cfg.resolved_run_dir`) and writes the run's config.yaml when given.

    The one check every trainer goes through before it loads anything: a directory with checkpoints is
    continued (`resume`) or emptied of the old run's outputs (`overwrite`, `RUN_OUTPUTS`); neither is a
    `RunDirError`, since training over it would keep the old run's checkpoints as the latest."""
    run_dir = Path(cfg.resolved_run_dir)
    if resume and overwrite:
        raise RunDirError("--resume and --overwrite: pass one (continue the run, or start it afresh)")
    primary = sharding.is_primary()
    if overwrite and primary:
        for name in RUN_OUTPUTS:
            path = run_dir / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.exists() or path.is_symlink():
                path.unlink()
    elif not resume and not overwrite:
        _check_fresh(run_dir, ckpt_lib.latest_step(run_dir / "checkpoints"))
    run_dir.mkdir(parents=True, exist_ok=True)
    if config_dict is not None and primary:
        import yaml

        (run_dir / "config.yaml").write_text(yaml.safe_dump(config_dict, sort_keys=False))
    # The other hosts must not look at (or write into) the directory before process 0 has emptied it.
    sharding.barrier("lsjax-run-dir")
    return run_dir


def _check_fresh(run_dir: Path, latest: int | None) -> None:
    if latest is not None:
        raise RunDirError(
            f"run directory {run_dir} has checkpoints (latest step {latest}): pass --resume to continue it "
            "or --overwrite to start afresh"
        )


def run_steps(
    cfg,
    state,
    step,
    consts,
    data,
    rng: jax.Array,
    *,
    run_dir: Path,
    log=print,
    resume: bool = False,
    stop_after: int | None = None,
    progress: bool | None = None,
    config_dict: dict | None = None,
    tokens_per_step: int = 0,
    evaluate=None,
    compile=None,
    max_minutes: float = 0.0,
) -> dict:
    """Runs (or resumes) `cfg.num_steps` optimizer steps; returns the run's summary (module docstring).

    `cfg` is any trainer's config with `num_steps`, `checkpoint` (every, keep) and `log` sections. `stop_after`
    ends the run after that many steps without the final checkpoint, as a kill would (tests use it).
    `evaluate(params) -> {name: float}` adds dev metrics every `log.eval_every` steps. `compile(step, state,
    consts) -> (jitted step, state, consts)` replaces the default `jax.jit(step, donate_argnums=0)` (it runs
    before a resume, and the checkpoint is restored with the shardings of the state it returns).
    `tokens_per_step` feeds the throughput figures."""
    multi = jax.process_count() > 1
    if multi and compile is None:
        raise ConfigError(
            f"kind {getattr(cfg, 'kind', '?')}: trains on one host only (its step has no mesh layout); this is "
            f"process {jax.process_index()} of {jax.process_count()}"
        )
    primary = sharding.is_primary()
    ckpt = ckpt_lib.Checkpointer(run_dir / "checkpoints", keep=cfg.checkpoint.keep)
    metrics_file = run_dir / "metrics.jsonl"
    start = 0
    # Placed first, so that a restore lays the checkpoint out on this run's mesh (any mesh wrote it).
    if compile is None:
        jitted = jax.jit(step, donate_argnums=(0,))
    else:
        jitted, state, consts = compile(step, state, consts)
    if resume and ckpt.latest_step() is not None:
        state, rng, data_state, _ = ckpt.restore(state, rng)
        data.set_state(data_state)
        start = int(state.step)
        log(f"resumed from step {start} ({ckpt.directory})")
        if primary:
            _truncate_metrics(metrics_file, start)
    else:
        if resume:
            log(f"--resume: no checkpoint in {ckpt.directory}; starting fresh")
        else:  # a caller that skipped prepare_run_dir: the same check
            _check_fresh(run_dir, ckpt.latest_step())
        if primary:
            metrics_file.write_text("")

    total = cfg.num_steps if stop_after is None else min(cfg.num_steps, stop_after)
    budget = max_minutes * 60 or float("inf")
    log_cfg = cfg.log
    writer = _tensorboard(run_dir) if log_cfg.tensorboard and primary else None
    bar = _progress(start, cfg.num_steps, primary and (log_cfg.progress if progress is None else progress))
    last_good = ckpt.latest_step()
    t_start, history, last_step = time.perf_counter(), [], start
    try:
        for i in range(start, total):
            if _STOP.is_set():  # a stop asked before the loop began (while loading, compiling) counts too
                _STOP.clear()
                raise TrainingInterrupted(last_step, total, ckpt.directory)
            batch = data.next()
            t0 = time.perf_counter()
            state, metrics = jitted(state, consts, batch, jax.random.fold_in(rng, i))
            metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
            dt = time.perf_counter() - t0
            if not np.isfinite(metrics["loss"]):
                where = f"step {last_good} in {ckpt.directory}" if last_good is not None else "none saved"
                raise TrainingDiverged(
                    f"non-finite loss ({metrics['loss']}) at step {i + 1}; stopped, last good checkpoint: {where}"
                )
            record = {"step": i + 1, **metrics, "step_s": dt}
            if tokens_per_step:
                record["tokens_per_s"] = tokens_per_step / dt
            if evaluate is not None and log_cfg.eval_every and (i + 1) % log_cfg.eval_every == 0:
                record |= evaluate(state.params)
            history.append(record)
            last_step = i + 1
            # Stop before a step that would end past the budget (the last one's time is the estimate), so a
            # time-boxed run (a device lease) ends within it, not one step after.
            out_of_time = time.perf_counter() - t_start + dt > budget
            if multi and budget < float("inf"):  # process 0's clock decides: every process stops at one step
                from jax.experimental import multihost_utils

                out_of_time = bool(multihost_utils.broadcast_one_to_all(np.bool_(out_of_time)))
            if ((i + 1) % log_cfg.every == 0 or i + 1 == total or out_of_time) and primary:
                with metrics_file.open("a") as f:
                    f.write(json.dumps(record) + "\n")
                if writer is not None:
                    for k, v in record.items():
                        writer.add_scalar(f"train/{k}", v, i + 1)
                if bar is None:
                    log(" ".join(f"{k}={v:.4g}" for k, v in record.items() if k != "lr"))
            if bar is not None:
                bar.set_postfix({k: fmt.format(record[f]) for k, f, fmt in _POSTFIX if f in record})
                bar.update(1)
            if (i + 1) % cfg.checkpoint.every == 0 or i + 1 == cfg.num_steps or out_of_time:
                meta = {"step": i + 1, "config": config_dict or {}, "elapsed_s": time.perf_counter() - t_start}
                ckpt.save(i + 1, state, rng, data.get_state(), meta)
                last_good = i + 1
            if out_of_time:
                log(f"max_minutes={max_minutes:g}: stopped after step {i + 1}, before one past it; checkpoint saved")
                break
    except KeyboardInterrupt as e:
        if isinstance(e, TrainingInterrupted):
            raise
        raise TrainingInterrupted(last_step, total, ckpt.directory) from None
    finally:
        if bar is not None:
            bar.close()
        if writer is not None:
            writer.close()
        ckpt.close()
    wall = time.perf_counter() - t_start
    # What an export reports as the training cost (metrics.jsonl keeps only every log.every-th step).
    seen = (last_step - start) * tokens_per_step
    run = {"steps": last_step, "wall_s": round(wall, 1), "tokens_this_process": seen, "resumed_from": start}
    if primary:
        (run_dir / "run.json").write_text(json.dumps(run) + "\n")
    if log_cfg.plot and stop_after is None and history and primary:
        plot_losses(metrics_file, run_dir / "loss.png")
    # The first step of a process includes compilation: throughput counts the steps after it.
    timed_s = wall - (history[0]["step_s"] if history else 0.0)
    return {
        "run_dir": str(run_dir),
        "steps": last_step,
        "start": start,
        "losses": [r["loss"] for r in history],
        "final": history[-1] if history else {},
        "wall_s": wall,
        "tokens_per_s": tokens_per_step * max(len(history) - 1, 0) / max(timed_s, 1e-9),
        "last_checkpoint": last_good,
        "state": state,
    }


# The tqdm bar's fields: (label, record key, format).
_POSTFIX = (("loss", "loss", "{:.3f}"), ("acc", "acc", "{:.2f}"), ("tok_s", "tokens_per_s", "{:.0f}"))


@dataclasses.dataclass
class Job:
    """What a training kind's setup hands the shared run (`fit`): the arguments of `run_steps` that differ by
    kind, and `finish(out, run_dir)` -> entries added to the summary after a run that was not cut short
    (`stop_after`): an export, a dev evaluation."""

    state: Any
    step: Callable  # (state, consts, batch, key) -> (state, metrics)
    consts: Any
    data: Any  # `lsjax.train.inputs.Batches`
    rng: jax.Array
    tokens_per_step: int = 0
    evaluate: Callable | None = None
    compile: Callable | None = None
    max_minutes: float = 0.0
    finish: Callable[[dict, Path], dict] | None = None


def fit(
    cfg,
    setup: Callable,
    *,
    resume: bool = False,
    overwrite: bool = False,
    stop_after: int | None = None,
    log=print,
    progress: bool | None = None,
    config_dict: dict | None = None,
) -> dict:
    """The run every training kind shares: `setup(cfg, open_run_dir, log) -> Job` loads the kind's target, data
    and params, calling `open_run_dir()` (the resume / overwrite check of `prepare_run_dir`; it returns the run
    directory) once what must be checked before the directory is touched has been; then the step loop
    (`run_steps`), then `job.finish`. Returns `run_steps`' summary."""
    # Before anything touches a device: a multi-host launch joins its peers here (every kind, so that a
    # kind that cannot train multi-host says so instead of training the same batches on every host).
    sharding.maybe_initialize_distributed()
    opened: list[Path] = []

    def open_run_dir() -> Path:
        if not opened:
            opened.append(prepare_run_dir(cfg, config_dict, resume=resume, overwrite=overwrite))
        return opened[0]

    job = setup(cfg, open_run_dir, log)
    run_dir = open_run_dir()
    out = run_steps(
        cfg,
        job.state,
        job.step,
        job.consts,
        job.data,
        job.rng,
        run_dir=run_dir,
        log=log,
        resume=resume,
        stop_after=stop_after,
        progress=progress,
        config_dict=config_dict,
        tokens_per_step=job.tokens_per_step,
        evaluate=job.evaluate,
        compile=job.compile,
        max_minutes=job.max_minutes,
    )
    if job.finish is not None and stop_after is None:
        out |= job.finish(out, run_dir)
    return out


def training_summary(run_dir) -> dict:
    """What the run's metrics say about it: steps, the last train and dev numbers, the training wall time."""
    path = Path(run_dir) / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    if not rows:
        return {}
    last = rows[-1]
    dev = [r for r in rows if "dev_ce" in r]
    out = {
        "steps": last["step"],
        "train_steps_s": round(sum(r["step_s"] for r in rows), 1),
        **{f"final_{k}": round(last[k], 4) for k in ("loss", "ce", "distill", "acc") if k in last},
    }
    if dev:
        d = dev[-1]
        out |= {"dev_step": d["step"], "dev_ce": round(d["dev_ce"], 4), "dev_acc": round(d["dev_acc"], 4)}
    return out


def plot_losses(metrics_file: Path, out: Path) -> Path | None:
    """The loss curve (and dev CE when logged) of a run as a PNG."""
    records = [json.loads(line) for line in Path(metrics_file).read_text().splitlines() if line.strip()]
    if not records:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([r["step"] for r in records], [r["loss"] for r in records], label="train loss", lw=1)
    dev = [r for r in records if "dev_ce" in r]
    if dev:
        ax.plot([r["step"] for r in dev], [r["dev_ce"] for r in dev], "o-", label="dev CE")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def _truncate_metrics(path: Path, step: int) -> None:
    # A killed run may have logged steps past its last checkpoint; the resumed run logs them again.
    if not path.exists():
        return
    keep = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= step]
    path.write_text("".join(line + "\n" for line in keep))


def _progress(start: int, total: int, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=start, unit="step", dynamic_ncols=True)


def _tensorboard(run_dir: Path):
    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            return None
    return SummaryWriter(str(run_dir / "tb"))
