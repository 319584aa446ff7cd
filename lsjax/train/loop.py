"""One training run (a stage): data, feature cache, optimizer, checkpoints, resume, dev eval, logs and plots.

out = fit(train_cfg)            # what `python train.py --config configs/train/X.yaml` runs
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from lsjax.config import ConfigError, ModelConfig
from lsjax.models import draft as draft_lib
from lsjax.models import target as target_lib
from lsjax.train.config import TrainConfig
from lsjax.train.features import build_feature_cache
from lsjax.train.step import init_state, make_eval_step, make_optimizer, make_train_step
from lsjax.vocab import pruned_vocab


class TrainingDiverged(RuntimeError):
    """A non-finite loss: the run stops and the last good checkpoint stays the latest."""


def load_target(cfg: TrainConfig):
    """(model config, params, tokenizer or None) for the run's frozen target."""
    from lsjax.config import load_yaml

    t = cfg.target
    if t.random_init:
        mc = t.model if t.model is not None else load_yaml(ModelConfig, t.preset)
        mc = dataclasses.replace(mc, dtype=t.dtype)
        return mc, target_lib.init_params(mc, jax.random.PRNGKey(cfg.seed + 7919)), None
    from lsjax.loading import load_model

    loaded = load_model(t.path or None, dtype=t.dtype)
    return loaded.config, jax.tree.map(jnp.asarray, loaded.params), loaded.tokenizer


def eos_id(config: ModelConfig) -> int:
    return config.eos_token_ids[0] if config.eos_token_ids else config.pad_token_id


def fit(
    cfg: TrainConfig,
    *,
    resume: bool = False,
    stop_after: int | None = None,
    log=print,
    progress: bool | None = None,
    config_dict: dict | None = None,
) -> dict:
    """Runs (or resumes) one training stage; returns a summary dict.

    Writes <run_dir>/metrics.jsonl, checkpoints/, vocab_ids.npy (pruned vocabulary), loss.png and
    config.yaml. `stop_after` ends the run after that many optimizer steps without the final
    checkpoint, as a kill would (tests use it). Raises TrainingDiverged on a non-finite loss.
    """
    if cfg.kind != "longspec":  # DeLS-Spec's parts have their own data and losses
        opts = {"resume": resume, "stop_after": stop_after, "log": log, "progress": progress}
        if cfg.kind == "local_head":
            from lsjax.train.local_head import fit_local_head

            return fit_local_head(cfg, config_dict=config_dict, **opts)
        from lsjax.train.block import fit_block

        return fit_block(cfg, config_dict=config_dict, **opts)
    import yaml

    from lsjax import data as data_lib
    from lsjax import sharding
    from lsjax.train import checkpoint as ckpt_lib

    sharding.maybe_initialize_distributed()
    run_dir = Path(cfg.resolved_run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if config_dict is not None:
        (run_dir / "config.yaml").write_text(yaml.safe_dump(config_dict, sort_keys=False))
    config, target_params, tokenizer = load_target(cfg)
    if tokenizer is None and any(s != "synthetic" for s in cfg.data.sources):
        raise ValueError("data.sources: a random-init target has no tokenizer; use the synthetic source")

    # --- data
    eos, V, T = eos_id(config), config.vocab_size, cfg.data.seq_len
    extra = None
    fixed = cfg.features.enabled and not cfg.features.set
    if cfg.features.set:
        seqs, mask, extra = _shared_features(cfg, config, log)
    else:
        seqs, mask = data_lib.load_sequences(cfg, tokenizer, eos, V, log=log)
        log(f"data: {data_lib.describe(seqs, mask)} ({', '.join(cfg.data.sources)}, {cfg.data.split})")
    if fixed:
        high = data_lib.max_offset(cfg.positions, T, config.max_position)
        offsets = data_lib.offsets_for(cfg.data.seed, np.arange(len(seqs)), high)
        extra = build_feature_cache(
            target_params,
            config,
            seqs,
            offsets,
            cfg.features.dir or run_dir / "features",
            num_anchors=cfg.positions.num_anchors,
            batch_size=cfg.features.batch_size,
            with_hidden=cfg.loss.distill == "kl",
            fingerprint=f"{config.name}:{config.num_layers}:{config.hidden_size}:{cfg.target.path}",
            log=log,
        )
    dataset = data_lib.batches(seqs, mask, cfg, config.max_position, fixed_offsets=fixed, extra=extra)
    iterator = iter(dataset.to_iter_dataset())

    # --- vocabulary, params, optimizer
    vocab_ids, exported = None, _exported_draft(cfg)
    if exported is not None:  # continuing a shipped draft: its vocabulary comes with it
        vocab_ids = exported.vocab_ids
    elif cfg.draft.draft_vocab_size:
        counts = np.bincount(seqs[mask > 0].reshape(-1), minlength=V)
        vocab_ids = pruned_vocab(config, cfg.draft.draft_vocab_size, token_counts=counts)
    if vocab_ids is not None:
        np.save(run_dir / "vocab_ids.npy", vocab_ids)
    if exported is not None:
        draft_params = jax.tree.map(jnp.asarray, exported.weights)
        log(f"draft: initialised from the exported draft {cfg.checkpoint.init_from}")
    elif cfg.checkpoint.init_from:
        draft_params = jax.tree.map(jnp.asarray, ckpt_lib.load_draft_params(cfg.checkpoint.init_from))
        log(f"draft: initialised from {cfg.checkpoint.init_from}")
    else:
        draft_params = draft_lib.init_draft_params(config, cfg.draft, target_params, jax.random.PRNGKey(cfg.seed))
    optimizer = make_optimizer(cfg.optim)
    state = init_state(draft_params, optimizer)
    rng = jax.random.PRNGKey(cfg.seed)

    # --- checkpoint / resume
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

    # --- the step, on a mesh when there are several devices
    step_fn = make_train_step(config, cfg, vocab_ids, optimizer)
    example = {k: v for k, v in next(iter(dataset.to_iter_dataset())).items() if k != "index"}
    if jax.device_count() > 1:
        mesh = sharding.make_mesh(cfg.mesh)
        jitted, state_sh, target_sh, _ = sharding.shard_train_step(step_fn, mesh, state, target_params, example)
        state, target_params = sharding.place(state, state_sh), sharding.place(target_params, target_sh)
    else:
        jitted = jax.jit(step_fn, donate_argnums=(0,))
    evaluate = (
        _make_dev_eval(cfg, config, target_params, tokenizer, eos, vocab_ids, log) if cfg.log.eval_every else None
    )

    writer = _tensorboard(run_dir) if cfg.log.tensorboard else None
    total = cfg.num_steps if stop_after is None else min(cfg.num_steps, stop_after)
    tokens_per_step = cfg.data.batch_size * cfg.data.grad_accum * T
    bar = _progress(start, cfg.num_steps, cfg.log.progress if progress is None else progress)
    last_good = ckpt.latest_step()
    t_start, tokens_done, history = time.perf_counter(), 0, []
    try:
        for step in range(start, total):
            batch = {k: v for k, v in next(iterator).items() if k != "index"}
            t0 = time.perf_counter()
            state, metrics = jitted(state, target_params, batch, jax.random.fold_in(rng, step))
            metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
            dt = time.perf_counter() - t0
            if not np.isfinite(metrics["loss"]):
                where = f"step {last_good} in {ckpt.directory}" if last_good is not None else "none saved"
                raise TrainingDiverged(
                    f"non-finite loss ({metrics['loss']}) at step {step + 1}; stopped, last good checkpoint: {where}"
                )
            if step > start:  # the first step of a process includes compilation
                tokens_done += tokens_per_step
            elapsed = time.perf_counter() - t_start
            record = {"step": step + 1, **metrics, "step_s": dt, "tokens_per_s": tokens_per_step / dt}
            if evaluate is not None and (step + 1) % cfg.log.eval_every == 0:
                record |= evaluate(state.params)
            history.append(record)
            if (step + 1) % cfg.log.every == 0 or step + 1 == total:
                with metrics_file.open("a") as f:
                    f.write(json.dumps(record) + "\n")
                if writer is not None:
                    for k, v in record.items():
                        writer.add_scalar(f"train/{k}", v, step + 1)
            if bar is not None:
                bar.set_postfix(
                    loss=f"{metrics['loss']:.3f}", acc=f"{metrics['acc']:.2f}", tok_s=f"{record['tokens_per_s']:.0f}"
                )
                bar.update(1)
            if (step + 1) % cfg.checkpoint.every == 0 or step + 1 == cfg.num_steps:
                meta = {"step": step + 1, "config": config_dict or {}, "elapsed_s": elapsed}
                ckpt.save(step + 1, state, rng, iterator.get_state(), meta)
                last_good = step + 1
    finally:
        if bar is not None:
            bar.close()
        if writer is not None:
            writer.close()
        ckpt.close()
    wall = time.perf_counter() - t_start
    if cfg.log.plot and stop_after is None:
        plot_losses(metrics_file, run_dir / "loss.png")
    return {
        "run_dir": str(run_dir),
        "steps": total,
        "start": start,
        "losses": [r["loss"] for r in history],
        "final": history[-1] if history else {},
        "wall_s": wall,
        "tokens_per_s": tokens_done / max(wall - (history[0]["step_s"] if history else 0), 1e-9),
        "last_checkpoint": last_good,
        "state": state,
    }


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


def _exported_draft(cfg: TrainConfig):
    """The DraftParams of `checkpoint.init_from` when it is an exported draft directory (draft.json), else
    None."""
    src = Path(cfg.checkpoint.init_from) if cfg.checkpoint.init_from else None
    if src is None or not (src / "draft.json").is_file():
        return None
    from lsjax.drafters.checkpoints import load_draft
    from lsjax.models.draft_params import DraftParams

    arrays, dcfg, _ = load_draft(src)
    for field in ("window", "draft_vocab_size"):
        want, got = getattr(dcfg, field), getattr(cfg.draft, field)
        if want != got:
            raise ConfigError(f"draft.{field}: must equal the init_from draft's {want}, got {got}")
    return DraftParams.from_arrays(arrays)


def _shared_features(cfg: TrainConfig, config: ModelConfig, log):
    """(tokens, loss_mask, extra) from a set of the shared target-feature cache; K stays pre-RoPE (the loss
    ropes it at the batch's positions, so anchor offsets may change every epoch)."""
    from lsjax.data import describe
    from lsjax.train import feature_cache as fcm

    fc = fcm.FeatureSets.open(cfg.features.set, cfg.data.max_sequences)
    if fc.seq_len != cfg.data.seq_len:
        raise ConfigError(f"data.seq_len: must equal the feature set's length {fc.seq_len}, got {cfg.data.seq_len}")
    n = fc.num_sequences
    if n < cfg.data.batch_size:
        raise ConfigError(f"features.set: {cfg.features.set} has {n} complete sequences, fewer than data.batch_size")
    seqs, mask = fc.tokens, fc.loss_mask
    extra = {
        "target_k_raw": fcm.FieldView(fc, "k", n),
        "target_v": fcm.FieldView(fc, "v", n),
        "target_argmax": fcm.FieldView(fc, "topk_ids", n, first_only=True),
    }
    if cfg.loss.distill == "kl":
        extra["target_hidden"] = fcm.FieldView(fc, "hidden", n)
    log(f"data: {describe(seqs, mask)} from feature sets {fc.describe()} (complete/total sequences)")
    return seqs, mask, extra


def _make_dev_eval(cfg: TrainConfig, config, target_params, tokenizer, eos, vocab_ids, log):
    """Dev-split loss at plain positions and the smallest lag (what inference sees), fixed batches."""
    from lsjax import data as data_lib

    dev_cfg = dataclasses.replace(
        cfg,
        positions=dataclasses.replace(cfg.positions, anchor_offset=False),
        data=dataclasses.replace(cfg.data, split="dev"),
    )
    seqs, mask = data_lib.load_sequences(dev_cfg, tokenizer, eos, config.vocab_size, log=log)
    ds = data_lib.batches(seqs, mask, dev_cfg, config.max_position, shuffle=False)
    batches = [{k: v for k, v in ds[i].items() if k != "index"} for i in range(min(cfg.log.eval_batches, len(ds)))]
    ev = jax.jit(make_eval_step(config, dev_cfg, vocab_ids))
    shift = jnp.asarray(1 if cfg.loss.flash_noisy else 0, jnp.int32)

    def evaluate(params):
        sums = [jax.device_get(ev(params, target_params, b, shift)) for b in batches]
        w = max(sum(float(s["weight"]) for s in sums), 1.0)
        return {"dev_ce": sum(float(s["ce"]) for s in sums) / w, "dev_acc": sum(float(s["correct"]) for s in sums) / w}

    return evaluate


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
