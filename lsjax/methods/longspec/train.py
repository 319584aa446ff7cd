"""The LongSpec draft's training run (a stage): data, feature cache, vocabulary, params, dev eval.

out = fit(train_cfg)            # what `python train.py --config configs/train/X.yaml` runs

The step loop (resume, checkpoints, logs, plots) is the one every trainer shares (`lsjax.train.runner`); the
frozen target and the batch readers come from `lsjax.train.inputs`; the config is
`lsjax.methods.longspec.train_config.LongSpecTrainConfig`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from lsjax.config import ConfigError
from lsjax.methods.longspec import model as draft_lib
from lsjax.methods.longspec.step import make_eval_step, make_train_step
from lsjax.methods.longspec.train_config import LongSpecTrainConfig
from lsjax.models.target import Transformer
from lsjax.train.features import build_feature_cache
from lsjax.train.inputs import (
    GrainBatches,
    ProcessBatches,
    dev_batches,
    eos_id,
    load_target,
    shared_feature_inputs,
    training_rows,
)
from lsjax.train.step import init_state, make_optimizer
from lsjax.vocab import pruned_vocab

__all__ = ["eos_id", "fit", "load_target"]  # the frozen target's helpers, where trainers and tests found them


def fit(cfg: LongSpecTrainConfig, **run) -> dict:
    """Runs (or resumes) one training stage (`lsjax.train.runner.fit`); returns its summary.

    Writes <run_dir>/metrics.jsonl, checkpoints/, vocab_ids.npy (pruned vocabulary), loss.png and
    config.yaml. `stop_after` ends the run after that many optimizer steps without the final
    checkpoint, as a kill would (tests use it). Raises `lsjax.train.runner.TrainingDiverged` on a non-finite
    loss.
    """
    from lsjax.train.runner import fit as run_fit

    if cfg.kind != "longspec":
        raise ConfigError(
            f"kind: {cfg.kind!r} is not trained by the LongSpec trainer (lsjax.methods.registry.fit_kind)"
        )
    return run_fit(cfg, _setup, **run)


def _setup(cfg: LongSpecTrainConfig, open_run_dir, log):
    from lsjax import sharding
    from lsjax.train import checkpoint as ckpt_lib
    from lsjax.train import data as data_lib
    from lsjax.train.runner import Job

    multi = sharding.maybe_initialize_distributed() and jax.process_count() > 1
    if multi and cfg.features.enabled and not cfg.features.set:
        raise ConfigError(
            "features.enabled: a multi-host run does not build the feature cache (every host would write it); "
            "build it on one host (train there, or lsjax.train.feature_cache) and pass it as features.set"
        )
    run_dir = open_run_dir()
    config, target_params, tokenizer = load_target(cfg)
    if tokenizer is None and any(s != "synthetic" for s in cfg.data.sources):
        raise ValueError("data.sources: a random-init target has no tokenizer; use the synthetic source")

    # --- data
    V, T = config.vocab_size, cfg.data.seq_len
    extra = None
    fixed = cfg.features.enabled and not cfg.features.set
    if cfg.features.set:
        seqs, mask, extra = shared_feature_inputs(cfg.features, cfg.data, hidden=cfg.loss.distill == "kl", log=log)
    else:
        seqs, mask = training_rows(cfg.data, config, tokenizer, log=log)
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

    # --- vocabulary, params, optimizer
    vocab_ids, exported = None, _exported_draft(cfg)
    if exported is not None:  # continuing a shipped draft: its vocabulary comes with it
        vocab_ids = exported.vocab_ids
    elif cfg.draft.draft_vocab_size:
        counts = np.bincount(seqs[mask > 0].reshape(-1), minlength=V)
        vocab_ids = pruned_vocab(config, cfg.draft.draft_vocab_size, token_counts=counts)
    if vocab_ids is not None and sharding.is_primary():  # every host computed the same one
        np.save(run_dir / "vocab_ids.npy", vocab_ids)
    if cfg.checkpoint.init_from:
        src = exported.weights if exported is not None else ckpt_lib.load_draft_params(cfg.checkpoint.init_from)
        draft_params = _grown(jax.tree.map(jnp.asarray, src), cfg)
        what = "the exported draft " if exported is not None else ""
        log(f"draft: initialised from {what}{cfg.checkpoint.init_from} ({cfg.draft.depth} blocks)")
    else:
        draft_params = draft_lib.init_draft_params(config, cfg.draft, target_params, jax.random.PRNGKey(cfg.seed))
    optimizer = make_optimizer(cfg.optim)
    state = init_state(draft_params, optimizer)

    # --- the step, on a mesh when there are several devices (of one process or of several hosts)
    step_fn = make_train_step(config, cfg, vocab_ids, optimizer)
    compile = None
    data = GrainBatches(iter(dataset.to_iter_dataset()))
    if jax.device_count() > 1:
        mesh = sharding.make_mesh(cfg.mesh)
        B = cfg.data.batch_size
        sharding.batch_shardings({"rows": jax.ShapeDtypeStruct((1, B), np.int32)}, mesh)  # B fits the mesh
        if multi:  # each host reads its rows of every batch; the step sees the global batch
            rows = sharding.process_rows(mesh, B)
            dataset = data_lib.batches(
                seqs, mask, cfg, config.max_position, fixed_offsets=fixed, extra=extra, rows=rows
            )
        local = {k: v for k, v in dataset[0].items() if k != "index"}
        example = {k: jax.ShapeDtypeStruct((v.shape[0], B, *v.shape[2:]), v.dtype) for k, v in local.items()}
        batch_sh = sharding.batch_shardings(example, mesh)
        if multi:
            data = ProcessBatches(GrainBatches(iter(dataset.to_iter_dataset())), batch_sh, B)

        def compile(step, state, target_params):
            axes = sharding.model_axes(Transformer(config), draft_lib.LongSpecDraft(config, cfg.draft))
            jitted, state_sh, target_sh, _ = sharding.shard_train_step(step, mesh, state, target_params, example, axes)
            return jitted, sharding.place(state, state_sh), sharding.place(target_params, target_sh)

    evaluate = _make_dev_eval(cfg, config, target_params, tokenizer, vocab_ids, log) if cfg.log.eval_every else None
    return Job(
        state,
        step_fn,
        target_params,
        data,
        jax.random.PRNGKey(cfg.seed),
        tokens_per_step=cfg.data.batch_size * cfg.data.grad_accum * T,
        evaluate=evaluate,
        compile=compile,
        max_minutes=cfg.max_minutes,
    )


def _grown(params: dict, cfg: LongSpecTrainConfig) -> dict:
    """The init_from draft's weights at `draft.depth` blocks: a one-block draft grows (`grow_depth`, the same
    function); a deeper one than the config's is a one-line error."""
    have = len(draft_lib.blocks(params))
    if have > cfg.draft.depth:
        raise ConfigError(f"draft.depth: the init_from draft has {have} blocks, more than {cfg.draft.depth}")
    if have != cfg.draft.depth and have != 1:
        raise ConfigError(f"draft.depth: a {have}-block init_from draft cannot grow to {cfg.draft.depth} blocks")
    return draft_lib.grow_depth(params, cfg.draft.depth)


def _exported_draft(cfg: LongSpecTrainConfig):
    """The DraftParams of `checkpoint.init_from` when it is an exported LongSpec draft directory
    (`lsjax.artifacts`, either layout), else None."""
    from lsjax import artifacts

    src = Path(cfg.checkpoint.init_from) if cfg.checkpoint.init_from else None
    if src is None or not artifacts.has_weights(src, "longspec"):
        return None
    from lsjax.methods.longspec.checkpoint import load_draft
    from lsjax.models.draft_params import DraftParams

    arrays, dcfg, _ = load_draft(src)
    for field in ("window", "draft_vocab_size"):
        want, got = getattr(dcfg, field), getattr(cfg.draft, field)
        if want != got:
            raise ConfigError(f"draft.{field}: must equal the init_from draft's {want}, got {got}")
    return DraftParams.from_arrays(arrays)


def _make_dev_eval(cfg: LongSpecTrainConfig, config, target_params, tokenizer, vocab_ids, log):
    """Dev-split loss at plain positions and the smallest lag (what inference sees), fixed batches."""
    dev_cfg = dataclasses.replace(
        cfg,
        positions=dataclasses.replace(cfg.positions, anchor_offset=False),
        data=dataclasses.replace(cfg.data, split="dev"),
    )
    batches = dev_batches(dev_cfg, config, tokenizer, keys=("tokens", "loss_mask", "offset"), log=log)
    ev = jax.jit(make_eval_step(config, dev_cfg, vocab_ids))
    shift = jnp.asarray(1 if cfg.loss.flash_noisy else 0, jnp.int32)

    def evaluate(params):
        if jax.process_count() > 1:  # every host evaluates the whole draft on its own device (one writes)
            from jax.experimental import multihost_utils

            params = multihost_utils.process_allgather(params, tiled=True)
        sums = [jax.device_get(ev(params, target_params, b, shift)) for b in batches]
        w = max(sum(float(s["weight"]) for s in sums), 1.0)
        return {"dev_ce": sum(float(s["ce"]) for s in sums) / w, "dev_acc": sum(float(s["correct"]) for s in sums) / w}

    return evaluate
