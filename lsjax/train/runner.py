"""The step loop shared by DeLS-Spec's trainers (kind block | local_head): checkpoints, resume, metrics, limits.

    out = run_steps(cfg, state, step, consts, iterator, rng, run_dir=..., log=...)

`step(state, consts, batch, key) -> (state, metrics)` is jitted here with the state donated; `consts` are
frozen arrays (the target's embedding, ...) passed as arguments so they are not baked into the program;
`metrics` must hold "loss". The key of step i is fold_in(rng, i), and the grain iterator's position is
checkpointed with the params and the optimizer state, so a resumed run replays the same batches and keys.
`dels.max_minutes` ends a run early with a checkpoint (the learning-rate schedule keeps its length: a
bounded run ends at a higher rate than a finished one).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import jax
import numpy as np

from lsjax.train import checkpoint as ckpt_lib
from lsjax.train.config import TrainConfig
from lsjax.train.loop import TrainingDiverged, _progress, _truncate_metrics, plot_losses


def run_steps(
    cfg: TrainConfig,
    state,
    step,
    consts,
    iterator,
    rng: jax.Array,
    *,
    run_dir: Path,
    log=print,
    resume: bool = False,
    stop_after: int | None = None,
    progress: bool | None = None,
    config_dict: dict | None = None,
    tokens_per_step: int = 0,
) -> dict:
    ckpt = ckpt_lib.Checkpointer(run_dir / "checkpoints", keep=cfg.checkpoint.keep)
    metrics_file = run_dir / "metrics.jsonl"
    start = 0
    if resume and ckpt.latest_step() is not None:
        state, rng, data_state, _ = ckpt.restore(state, rng)
        iterator.set_state(data_state)
        start = int(state.step)
        log(f"resumed from step {start} ({ckpt.directory})")
        _truncate_metrics(metrics_file, start)
    else:
        if resume:
            log(f"--resume: no checkpoint in {ckpt.directory}; starting fresh")
        metrics_file.write_text("")
    jitted = jax.jit(step, donate_argnums=(0,))
    total = cfg.num_steps if stop_after is None else min(cfg.num_steps, stop_after)
    budget = cfg.dels.max_minutes * 60 or float("inf")
    bar = _progress(start, cfg.num_steps, cfg.log.progress if progress is None else progress)
    last_good = ckpt.latest_step()
    t_start, history, last_step = time.perf_counter(), [], start
    try:
        for i in range(start, total):
            batch = {k: v for k, v in next(iterator).items() if k != "index"}
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
            history.append(record)
            last_step = i + 1
            out_of_time = time.perf_counter() - t_start > budget
            if (i + 1) % cfg.log.every == 0 or i + 1 == total or out_of_time:
                with metrics_file.open("a") as f:
                    f.write(json.dumps(record) + "\n")
            if bar is not None:
                bar.set_postfix(loss=f"{metrics['loss']:.3f}")
                bar.update(1)
            if (i + 1) % cfg.checkpoint.every == 0 or i + 1 == cfg.num_steps or out_of_time:
                meta = {"step": i + 1, "config": config_dict or {}, "elapsed_s": time.perf_counter() - t_start}
                ckpt.save(i + 1, state, rng, iterator.get_state(), meta)
                last_good = i + 1
            if out_of_time:
                log(f"dels.max_minutes={cfg.dels.max_minutes} reached after step {i + 1}; checkpoint saved")
                break
    finally:
        if bar is not None:
            bar.close()
        ckpt.close()
    wall = time.perf_counter() - t_start
    # What the export reports as the training cost (metrics.jsonl keeps only every log.every-th step).
    seen = (last_step - start) * tokens_per_step
    run = {"steps": last_step, "wall_s": round(wall, 1), "tokens_this_process": seen, "resumed_from": start}
    (run_dir / "run.json").write_text(json.dumps(run) + "\n")
    if cfg.log.plot and stop_after is None and history:
        plot_losses(metrics_file, run_dir / "loss.png")
    timed = history[1:] if len(history) > 1 else history  # the first step of a process includes compilation
    return {
        "run_dir": str(run_dir),
        "steps": last_step,
        "start": start,
        "losses": [r["loss"] for r in history],
        "final": history[-1] if history else {},
        "wall_s": wall,
        "tokens_per_s": tokens_per_step * len(timed) / max(sum(r["step_s"] for r in timed), 1e-9),
        "last_checkpoint": last_good,
        "state": state,
    }
