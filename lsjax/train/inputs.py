"""What a training step reads: the frozen target, and batches whose position can be checkpointed.

    config, target_params, tokenizer = load_target(cfg)
    seqs, mask, extra = shared_feature_inputs(cfg.features, cfg.data, log=log)   # sets of the shared cache
    data = GrainBatches(iter(lsjax.train.data.batches(seqs, mask, cfg, ..., extra=extra).to_iter_dataset()))

Every trainer hands the shared step loop (`lsjax.train.runner.run_steps`) a `Batches`: `next()` is one
optimizer step's batch (every field [A, B, ...] for A = data.grad_accum micro-batches of B sequences) and
`get_state()` / `set_state()` its position as JSON, checkpointed with the params so a resumed run reads the
same batches. A trainer reads `lsjax.train.data`'s grain pipeline over packed corpora or feature-cache sets
(`GrainBatches`), or its own reader over feature-cache rows in seeded epochs (`epoch_order`).
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

import jax
import jax.numpy as jnp
import numpy as np

from lsjax.config import ConfigError, ModelConfig
from lsjax.train.config import DataConfig, FeatureCacheConfig


class Batches(Protocol):
    def next(self) -> dict: ...

    def get_state(self) -> dict: ...

    def set_state(self, state: dict) -> None: ...


class GrainBatches:
    """A grain iterator over `lsjax.train.data.batches` as `Batches` (its bookkeeping field "index" dropped)."""

    def __init__(self, iterator):
        self.iterator = iterator

    def next(self) -> dict:
        return {k: v for k, v in next(self.iterator).items() if k != "index"}

    def get_state(self) -> dict:
        return self.iterator.get_state()

    def set_state(self, state: dict) -> None:
        self.iterator.set_state(state)


class ProcessBatches:
    """A multi-host run's `Batches`: `local` reads this process's rows of each step batch
    (`lsjax.train.data.batches(..., rows=...)`); `next()` joins every process's rows into the global batch,
    laid out by the step's batch `shardings` (`lsjax.sharding.global_batch`). The position is the local
    iterator's, checkpointed per process (`lsjax.train.checkpoint`)."""

    def __init__(self, local: Batches, shardings: dict, batch_size: int):
        self.local, self.shardings, self.batch_size = local, shardings, batch_size

    def next(self) -> dict:
        from lsjax.sharding import global_batch

        return global_batch(self.local.next(), self.shardings, self.batch_size)

    def get_state(self) -> dict:
        return self.local.get_state()

    def set_state(self, state: dict) -> None:
        self.local.set_state(state)


def epoch_order(seed: int, epoch: int, n: int) -> np.ndarray:
    """The order in which epoch `epoch` visits n sequences (seeded, so a resumed run sees the same order)."""
    return np.random.default_rng([seed, epoch]).permutation(n)


def load_target(cfg):
    """(model config, params, tokenizer or None) for the run's frozen target (`cfg.target`, any trainer's)."""
    from lsjax.config import load_yaml
    from lsjax.models import target as target_lib

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


def shared_feature_inputs(features: FeatureCacheConfig, data: DataConfig, *, hidden: bool = False, log=print):
    """(tokens, loss_mask, extra) from the sets `features.set` of the shared target-feature cache, read as a
    `data` section's sequences (`lsjax.train.data.batches`). `extra` holds lazy views of the target's
    last-layer keys (pre-RoPE: the loss ropes them at the batch's positions, so anchor offsets may change every
    epoch), values and argmax, and with `hidden` its final hidden states."""
    from lsjax.train import feature_sets as fcm
    from lsjax.train.data import describe

    fc = fcm.FeatureSets.open(features.set, data.max_sequences)
    if fc.seq_len != data.seq_len:
        raise ConfigError(f"data.seq_len: must equal the feature set's length {fc.seq_len}, got {data.seq_len}")
    n = fc.num_sequences
    if n < data.batch_size:
        raise ConfigError(f"features.set: {features.set} has {n} complete sequences, fewer than data.batch_size")
    seqs, mask = fc.tokens, fc.loss_mask
    extra = {
        "target_k_raw": fcm.FieldView(fc, "k", n),
        "target_v": fcm.FieldView(fc, "v", n),
        "target_argmax": fcm.FieldView(fc, "topk_ids", n, first_only=True),
    }
    if hidden:
        extra["target_hidden"] = fcm.FieldView(fc, "hidden", n)
    log(f"data: {describe(seqs, mask)} from feature sets {fc.describe()} (complete/total sequences)")
    return seqs, mask, extra


def training_rows(data: DataConfig, config: ModelConfig, tokenizer, *, log=print) -> tuple[np.ndarray, np.ndarray]:
    """The packed rows (tokens, loss_mask) [S, T] a kind trains on: the self-distilled set `data.distilled` when
    set (its rows must be `data.seq_len` long and in the target's vocabulary), else `data.sources` packed."""
    from lsjax.train import data as data_lib

    V, T = config.vocab_size, data.seq_len
    if data.distilled:
        seqs, mask = data_lib.load_distilled(data.distilled)
        if seqs.shape[1] != T:
            raise ConfigError(
                f"data.seq_len: {T} differs from the self-distilled rows' {seqs.shape[1]} ({data.distilled})"
            )
        if seqs.size and int(seqs.max()) >= V:
            raise ConfigError(
                f"data.distilled: token id {int(seqs.max())} is outside the target's vocabulary of {V} (rows "
                "written for another target?)"
            )
        log(f"data: {data_lib.describe(seqs, mask)} (self-distilled: {data.distilled})")
        return seqs, mask
    if tokenizer is None and any(s != "synthetic" for s in data.sources):
        raise ConfigError("data.sources: a random-init target has no tokenizer; use the synthetic source")
    seqs, mask = data_lib.load_sequences(data, tokenizer, eos_id(config), V, log=log)
    log(f"data: {data_lib.describe(seqs, mask)} ({', '.join(data.sources)}, {data.split})")
    return seqs, mask


def dev_batches(cfg, config: ModelConfig, tokenizer, *, keys=("tokens", "loss_mask"), log=print) -> list[dict]:
    """The first `log.eval_batches` step batches of `data.sources`' dev split, in order (the same every evaluation),
    each holding only `keys`; `cfg` is any kind's config with data and positions sections."""
    from lsjax.train import data as data_lib

    seqs, mask = data_lib.load_sequences(cfg.data, tokenizer, eos_id(config), config.vocab_size, split="dev", log=log)
    ds = data_lib.batches(seqs, mask, cfg, config.max_position, shuffle=False)
    return [{k: v for k, v in ds[i].items() if k in keys} for i in range(min(cfg.log.eval_batches, len(ds)))]
