"""Training the block-parallel drafter from the shared target-feature cache (`train.py` with `kind: block`).

Each step draws `dels.num_anchors` anchor positions per sequence (distinct, among positions whose next token
carries loss). Anchor a plays the root of a block at position a: its s masks at a + 1 .. a + s learn the
tokens there, reading the draft's window [a - W, a) and the target's last-layer keys [0, a) (the cached
pre-RoPE keys, roped at the plain positions the target ran at) — what drafting at n = a sees
(`BlockDraft.hidden_train`, `lsjax.methods.dels.model`). Block position k weighs exp(-(k - 1) / dels.decay_gamma)
(DFlash's loss decay: early positions matter most, since a chain is accepted up to its first miss).

Losses: cross-entropy on the data and, with `loss.distill: argmax`, on the target's argmax at a + k - 1 (the
token verification accepts after an accepted prefix), through the draft's LM head in chunks
(`lsjax.methods.longspec.losses.lm_losses`).

Start: `checkpoint.init_from` an exported LongSpec draft (its layer, window and vocabulary; the mask
embedding starts at the mean of the target's embedding rows), an exported block draft, or a run directory;
empty = the target's last layer.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from lsjax.methods.dels import model as bd
from lsjax.methods.dels.train_config import DelsTrainConfig
from lsjax.methods.longspec.losses import lm_losses
from lsjax.train.feature_cache import rope_keys


def draw_anchors(key: jax.Array, loss_mask: jax.Array, num: int, block_size: int) -> jax.Array:
    """[B, num] distinct anchors a in [1, T - s), preferring those whose token a + 1 carries loss (Gumbel
    top-k over log(mask)); rows with fewer such positions fill up with others, whose targets weigh 0 anyway."""
    B, T = loss_mask.shape
    a = jnp.arange(T)
    ok = (a >= 1) & (a < T - block_size)
    nxt = jnp.concatenate([loss_mask[:, 1:], jnp.zeros_like(loss_mask[:, :1])], axis=1) > 0
    score = jnp.where(ok[None] & nxt, 0.0, jnp.where(ok[None], -1e4, -1e9)) + jax.random.gumbel(key, (B, T))
    return jax.lax.top_k(score, num)[1].astype(jnp.int32)


def block_targets(tokens, loss_mask, argmax, anchors, block_size: int, gamma: float):
    """(labels, distill labels, weights), each [B, A, s]: the tokens at a + k, the target's argmax at
    a + k - 1, loss_mask[a + k] * exp(-(k - 1) / gamma), k = 1..s."""
    k = jnp.arange(1, block_size + 1)
    at = anchors[:, :, None] + k[None, None]  # [B, A, s]
    B = tokens.shape[0]
    flat = at.reshape(B, -1)

    def take(x, idx):
        return jnp.take_along_axis(x, idx, axis=1).reshape(at.shape)

    decay = jnp.exp(-(k - 1) / gamma) if gamma > 0 else jnp.ones((block_size,))
    weights = take(loss_mask, flat).astype(jnp.float32) * decay[None, None]
    return take(tokens, flat), take(argmax, flat - 1), weights


def micro_block_losses(params, target_params, config, cfg: DelsTrainConfig, micro: dict, key, vocab_ids) -> dict:
    tokens, mask = micro["tokens"], micro["loss_mask"]
    B, T = tokens.shape
    s = cfg.block.block_size
    anchors = draw_anchors(key, mask, cfg.dels.num_anchors, s)
    positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32)[None], (B, T))
    tk = rope_keys(micro["target_k_raw"], positions, config)
    tv = micro["target_v"].astype(jnp.float32)
    model = bd.BlockDraft(config, cfg.draft, s)
    hidden = model.apply({"params": params}, target_params, tokens, anchors, tk, tv, method="hidden_train")
    labels, distill_labels, weights = block_targets(
        tokens, mask, micro["target_argmax"], anchors, s, cfg.dels.decay_gamma
    )
    D = hidden.shape[-1]
    return lm_losses(
        params,
        target_params,
        config,
        hidden.reshape(B, -1, D),
        labels.reshape(B, -1),
        weights.reshape(B, -1),
        chunk_size=cfg.loss.chunk_size,
        vocab_ids=vocab_ids,
        distill=cfg.loss.distill if cfg.loss.distill == "argmax" else "none",
        target_labels=distill_labels.reshape(B, -1) if cfg.loss.distill == "argmax" else None,
        model=model,
    )


def make_step(config, cfg: DelsTrainConfig, optimizer, vocab_ids):
    """`(state, target_params, batch, key) -> (state, metrics)`; batch fields are [A, B, ...] micro-batches."""
    import optax

    from lsjax.train.step import TrainState, accumulate_grads, apply_grads, lr_schedule

    schedule = lr_schedule(cfg.optim)
    vocab_ids = None if vocab_ids is None else jnp.asarray(vocab_ids, jnp.int32)
    names = ("tokens", "loss_mask", "target_k_raw", "target_v", "target_argmax")

    def objective(sums):
        loss = cfg.loss.ce_weight * sums["ce"]
        if cfg.loss.distill == "argmax":
            loss = loss + cfg.loss.distill_weight * sums["distill"]
        return loss

    def step(state: TrainState, target_params, batch, key):
        A = batch["tokens"].shape[0]
        micro = {k: batch[k] for k in names}
        keys = jax.random.split(key, A)

        def loss_fn(p, xs):
            m, k = xs
            sums = micro_block_losses(p, target_params, config, cfg, m, k, vocab_ids)
            return objective(sums), sums

        zeros = {k: jnp.zeros((), jnp.float32) for k in ("ce", "distill", "correct", "weight", "distill_weight")}
        grads, sums = accumulate_grads(loss_fn, state.params, (micro, keys), zeros)
        w = jnp.maximum(sums["weight"], 1e-6)
        grads = jax.tree.map(lambda g: g / w, grads)  # the mean over the step's weighted targets
        new_state = apply_grads(state, grads, optimizer)
        metrics = {
            "loss": objective(sums) / w,
            "ce": sums["ce"] / w,
            "distill": sums["distill"] / w,
            "acc": sums["correct"] / w,
            "loss_weight": sums["weight"],
            "grad_norm": optax.tree.norm(grads),
            "lr": schedule(state.step),
        }
        return new_state, metrics

    return step


def initial_params(cfg: DelsTrainConfig, config, target_params, counts: np.ndarray, log=print):
    """(block params, vocab_ids or None) from `checkpoint.init_from` (see the module doc)."""
    from lsjax import artifacts
    from lsjax.config import ConfigError
    from lsjax.methods.dels.checkpoint import BLOCK, load_block_draft
    from lsjax.methods.longspec.checkpoint import load_draft
    from lsjax.models.draft_params import DraftParams
    from lsjax.train.checkpoint import load_draft_params
    from lsjax.vocab import pruned_vocab

    src = Path(cfg.checkpoint.init_from) if cfg.checkpoint.init_from else None
    exported_kind = artifacts.stored_kind(src) if src is not None else None
    if exported_kind == "longspec":  # an exported LongSpec draft
        arrays, dcfg, _ = load_draft(src)
        for field in ("window", "draft_vocab_size"):
            if getattr(dcfg, field) != getattr(cfg.draft, field):
                raise ConfigError(f"draft.{field}: must equal the init_from draft's {getattr(dcfg, field)}")
        exported = DraftParams.from_arrays(arrays)
        params, vocab_ids = dict(exported.weights), exported.vocab_ids
        params["mask_embed"] = np.asarray(jnp.mean(jnp.asarray(target_params["embed"], jnp.float32), axis=0))
        log(f"block draft: initialised from the LongSpec draft {src}")
    elif exported_kind == BLOCK:  # an exported block draft
        exported = DraftParams.from_arrays(load_block_draft(src, config)[0])
        params, vocab_ids = exported.weights, exported.vocab_ids
        log(f"block draft: initialised from the block draft {src}")
    elif src is not None:  # a run directory or checkpoint
        params = load_draft_params(src)
        vocab = src / "vocab_ids.npy"
        vocab_ids = np.load(vocab) if vocab.is_file() else None
        log(f"block draft: initialised from {src}")
    else:
        params = bd.init_block_params(config, cfg.draft, target_params)
        vocab_ids = None
        if cfg.draft.draft_vocab_size:
            vocab_ids = pruned_vocab(config, cfg.draft.draft_vocab_size, token_counts=counts)
    return jax.tree.map(lambda x: jnp.asarray(x, jnp.dtype(config.dtype)), params), vocab_ids


def fit_block(cfg: DelsTrainConfig, **run) -> dict:
    """Runs (or resumes) a block-draft run from the shared target-feature cache (`lsjax.train.runner.fit`)."""
    from lsjax.train.runner import fit

    return fit(cfg, _setup, **run)


def _setup(cfg: DelsTrainConfig, open_run_dir, log):
    from lsjax.config import ConfigError
    from lsjax.train import data as data_lib
    from lsjax.train.inputs import GrainBatches, load_target, shared_feature_inputs
    from lsjax.train.runner import Job
    from lsjax.train.step import init_state, make_optimizer

    if not cfg.features.set:
        raise ConfigError("features.set: kind block trains from the shared target-feature cache; name a set")
    if cfg.loss.distill == "kl":
        raise ConfigError("loss.distill: kind block distills to the target's argmax (argmax) or not at all (none)")
    if cfg.loss.distill_on != "answers":
        raise ConfigError("loss.distill_on: kind block distills where its blocks' CE is (answers) only")
    s = cfg.block.block_size
    if cfg.data.seq_len < s + 2 + cfg.dels.num_anchors:
        raise ConfigError(f"dels.num_anchors: {cfg.dels.num_anchors} anchors of {s}-token blocks need longer sequences")
    run_dir = open_run_dir()
    config, target_params, _ = load_target(cfg)
    seqs, mask, extra = shared_feature_inputs(cfg.features, cfg.data, log=log)
    data = GrainBatches(iter(data_lib.batches(seqs, mask, cfg, config.max_position, extra=extra).to_iter_dataset()))

    counts = np.bincount(seqs[mask > 0].reshape(-1), minlength=config.vocab_size)
    params, vocab_ids = initial_params(cfg, config, target_params, counts, log)
    if vocab_ids is not None:
        np.save(run_dir / "vocab_ids.npy", vocab_ids)
    optimizer = make_optimizer(cfg.optim)
    d = cfg.data
    return Job(
        init_state(params, optimizer),
        make_step(config, cfg, optimizer, vocab_ids),
        target_params,
        data,
        jax.random.PRNGKey(cfg.seed),
        tokens_per_step=d.batch_size * d.grad_accum * cfg.dels.num_anchors * s,
        max_minutes=cfg.dels.max_minutes,
    )
