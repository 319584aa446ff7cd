"""Training a DFlash draft (`python train.py --config configs/train/dflash-smollm2.yaml`, `kind: dflash`).

The objective is DFlash's block-diffusion draft training (Chen, Liang and Liu, arXiv 2602.06036, section 4;
z-lab/dflash publishes the draft module, not a trainer, so this follows the paper's description):

* per sequence, `loss.num_anchors` anchors a drawn without replacement among the positions whose next token is a
  training target (loss_mask[a + 1] > 0), fresh every step;
* each anchor opens a block [x_a, MASK, ..., MASK] at positions a .. a + s - 1, embedded with the target's
  (frozen) table; the draft denoises every block in one parallel forward, block m attending to the context
  features at positions t < a_m (the target's streams at the draft's target layers, `DFlashConfig.taps`, as
  decoding feeds them) and to its own s positions, never to another block (`DFlashDraft.blocks`);
* the target's (frozen) LM head at block positions k = 1 .. s - 1 predicts x_{a + k}, with cross-entropy weighed
  by w_k = exp(-(k - 1) / gamma) (`loss.decay_gamma`; 0 = uniform) times loss_mask[a + k], positions past the
  row's end weighing 0; the step's loss is sum(w CE) / sum(w) over all its micro-batches.

The target runs inside the step (no feature cache), once per micro-batch, up to the deepest target layer the
draft reads. The draft's blocks and the LM head run in chunks of `loss.chunk_blocks` blocks under
`jax.checkpoint`, so [B, M, s - 1, V] logits never exist. Data, optimizer, checkpoints (exact resume) and the step
loop are the scaffold's (`lsjax.train.inputs`, `.data`, `.step`, `.runner`). Draft params train in float32 and
export in the target's dtype (`lsjax.methods.dflash.export`, z-lab's published layout).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from lsjax.cache import KVCache
from lsjax.config import ConfigError, ModelConfig
from lsjax.methods.dflash import model as dm
from lsjax.methods.dflash.drafter import hf_streams
from lsjax.methods.dflash.export import DRAFT_CONFIG, hf_config
from lsjax.methods.dflash.train_config import DFlashTrainConfig
from lsjax.models import target as target_lib
from lsjax.train.step import accumulate_grads, apply_grads, init_state, lr_schedule, make_optimizer

SUMS = ("wce", "weight", "ce", "tokens", "correct", "first_correct", "blocks", "accept")


# ------------------------------------------------------------------------------------------ the draft's shape


def draft_config(cfg: DFlashTrainConfig, target: ModelConfig) -> dm.DFlashConfig:
    """The trained draft's shape for `target` (its layers Qwen3's at the target's width; float32 params). Bad
    input against the target is one ConfigError naming the field."""
    from lsjax.methods.dflash.checkpoint import random_config

    d = cfg.draft
    ids = d.target_layer_ids or dm.default_layer_ids(target.num_layers, d.num_layers)
    if max(ids) >= target.num_layers:
        raise ConfigError(
            f"draft.target_layer_ids: {list(ids)} reach beyond the target's {target.num_layers} layers "
            f"(0 .. {target.num_layers - 1})"
        )
    mask = d.mask_token_id if d.mask_token_id >= 0 else target.vocab_size - 1
    if mask >= target.vocab_size:
        raise ConfigError(
            f"draft.mask_token_id: {mask} is outside the target's vocabulary of {target.vocab_size} (0 .. "
            f"{target.vocab_size - 1})"
        )
    base = random_config(target, d.num_layers, d.block_size)
    layer = dataclasses.replace(base.layer, dtype="float32")
    return dataclasses.replace(base, layer=layer, target_layer_ids=tuple(ids), mask_token_id=mask)


def decay_weights(block_size: int, gamma: float) -> np.ndarray:
    """[s - 1] weights of block positions 1 .. s - 1: exp(-(k - 1) / gamma), or ones for gamma = 0."""
    k = np.arange(1, block_size, dtype=np.float32)
    return np.ones_like(k) if gamma == 0 else np.exp(-(k - 1) / np.float32(gamma)).astype(np.float32)


# ------------------------------------------------------------------------------------------- anchors, targets


def sample_anchors(key: jax.Array, loss_mask: jax.Array, num_anchors: int):
    """(anchors [B, M] int32, valid [B, M] bool), M = min(num_anchors, T - 1): a uniform draw without
    replacement among the positions a < T - 1 with loss_mask[a + 1] > 0; a row with fewer such positions has
    its remaining anchors invalid (at 0, weighing nothing)."""
    B, T = loss_mask.shape
    ok = jnp.pad(loss_mask[:, 1:] > 0, ((0, 0), (0, 1)))
    M = min(num_anchors, T - 1)
    score = jnp.where(ok, jax.random.uniform(key, (B, T)), 2.0)
    idx = jax.lax.top_k(-score, M)[1]  # the M smallest scores: qualifying positions first, in random order
    valid = jnp.take_along_axis(ok, idx, axis=1)
    return jnp.where(valid, idx, 0).astype(jnp.int32), valid


def block_targets(tokens, loss_mask, anchors, valid, block_size: int, decay):
    """What each block is trained to produce: labels [B, M, s - 1] (x_{a + k}), their loss mask (valid block,
    inside the row, loss_mask[a + k]) and weights (the mask times decay[k - 1])."""
    B, T = tokens.shape
    at = anchors[..., None] + jnp.arange(1, block_size, dtype=jnp.int32)  # [B, M, s - 1]
    idx = jnp.minimum(at, T - 1).reshape(B, -1)
    labels = jnp.take_along_axis(tokens, idx, axis=1).reshape(at.shape)
    lm = jnp.take_along_axis(loss_mask, idx, axis=1).reshape(at.shape).astype(jnp.float32)
    mask = jnp.where(valid[..., None] & (at < T), lm, 0.0)
    return labels.astype(jnp.int32), mask, mask * jnp.asarray(decay, jnp.float32)


# --------------------------------------------------------------------------------------------------- the loss


def target_streams(target_params: dict, config: ModelConfig, dcfg: dm.DFlashConfig, tokens: jax.Array):
    """The frozen target's streams at the draft's target layers, [B, T, A Dt] in HF's hidden_states layout and
    the target's dtype: what decoding commits to the draft's context cache."""
    B, T = tokens.shape
    tp = jax.lax.stop_gradient(target_params)
    pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    taps = dcfg.taps
    net = target_lib.Transformer(config)
    *_, streams = net.apply(
        {"params": tp}, tokens, pos, KVCache.zeros(config, B, 0), taps, method="streams", upto=max(taps)
    )
    return jax.lax.stop_gradient(hf_streams(streams.astype(jnp.dtype(config.dtype)), taps, config, tp))


def block_losses(
    params, target_params, config: ModelConfig, dcfg: dm.DFlashConfig, tokens, anchors, labels, mask, weights, chunk
) -> dict:
    """One micro-batch's sums (`SUMS`): weighted CE "wce" and its "weight"; plain CE, "tokens", "correct" over the
    masked labels; "first_correct" and "blocks" at block position 1; "accept", the leading correct positions of
    each block summed (a chain's accepted tokens on the data, teacher-forced)."""
    B, T = tokens.shape
    s, M = dcfg.block_size, anchors.shape[1]
    tp = jax.lax.stop_gradient(target_params)
    draft, v = dm.DFlashDraft(dcfg), {"params": params}
    pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    ctx_k, ctx_v = draft.apply(v, target_streams(tp, config, dcfg, tokens), pos, method="context_kv")
    embed = tp["embed"]
    lm_head = None if config.tie_embeddings else tp.get("lm_head")

    C = min(chunk, M)
    n = -(-M // C)
    first = jnp.take_along_axis(tokens, anchors, axis=1)
    block = jnp.concatenate([first[..., None], jnp.full((B, M, s - 1), dcfg.mask_token_id, jnp.int32)], axis=-1).astype(
        jnp.int32
    )
    xs = {
        "anchors": anchors,
        "block": block,
        "positions": anchors[..., None] + jnp.arange(s, dtype=jnp.int32),
        "labels": labels,
        "mask": mask,
        "weights": weights,
    }

    def chunked(x):  # [B, M, ...] -> [n, B, C, ...], padded blocks weighing nothing
        x = jnp.pad(x, [(0, 0), (0, n * C - M)] + [(0, 0)] * (x.ndim - 2))
        return x.reshape(B, n, C, *x.shape[2:]).swapaxes(0, 1)

    @jax.checkpoint
    def one(c):
        noise = draft.apply(v, c["block"], embed, method="noise")
        hidden = draft.apply(v, noise, c["positions"], c["anchors"], ctx_k, ctx_v, method="blocks")
        logits = draft.apply(v, hidden[:, :, 1:], lm_head, embed, method="logits")  # [B, C, s - 1, V]
        ce = -jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), c["labels"][..., None], axis=-1)[..., 0]
        hit = (jnp.argmax(logits, axis=-1) == c["labels"]) & (c["mask"] > 0)
        lead = jnp.sum(jnp.cumprod(hit.astype(jnp.float32), axis=-1), axis=-1)
        return {
            "wce": jnp.sum(ce * c["weights"]),
            "weight": jnp.sum(c["weights"]),
            "ce": jnp.sum(ce * c["mask"]),
            "tokens": jnp.sum(c["mask"]),
            "correct": jnp.sum(hit.astype(jnp.float32)),
            "first_correct": jnp.sum(hit[..., 0].astype(jnp.float32)),
            "blocks": jnp.sum(c["mask"][..., 0] > 0).astype(jnp.float32),
            "accept": jnp.sum(lead),
        }

    per_chunk = jax.lax.map(one, jax.tree.map(chunked, xs))
    return jax.tree.map(lambda a: jnp.sum(a, axis=0), per_chunk)


def step_targets(key, batch: dict, cfg: DFlashTrainConfig):
    """Anchors and block targets of a step's micro-batches (every field [A, B, ...]), one key per micro-batch."""
    s = cfg.draft.block_size
    decay = decay_weights(s, cfg.loss.decay_gamma)

    def one(k, tokens, loss_mask):
        anchors, valid = sample_anchors(k, loss_mask, cfg.loss.num_anchors)
        return (anchors, *block_targets(tokens, loss_mask, anchors, valid, s, decay))

    keys = jax.random.split(key, batch["tokens"].shape[0])
    return jax.vmap(one)(keys, batch["tokens"], batch["loss_mask"])


def metrics_of(sums: dict) -> dict:
    nz = lambda x: jnp.maximum(x, 1.0)  # noqa: E731
    return {
        "loss": sums["wce"] / jnp.maximum(sums["weight"], 1e-6),
        "ce": sums["ce"] / nz(sums["tokens"]),
        "acc": sums["correct"] / nz(sums["tokens"]),
        "acc1": sums["first_correct"] / nz(sums["blocks"]),
        "accept": sums["accept"] / nz(sums["blocks"]),
        "loss_tokens": sums["tokens"],
    }


def make_train_step(config: ModelConfig, dcfg: dm.DFlashConfig, cfg: DFlashTrainConfig, optimizer=None):
    """The pure step `(state, target_params, batch, key) -> (state, metrics)`; jit it (the runner does)."""
    optimizer = optimizer or make_optimizer(cfg.optim)
    schedule = lr_schedule(cfg.optim)

    def step(state, target_params, batch, key):
        anchors, labels, mask, weights = step_targets(key, batch, cfg)
        # The normaliser is known before any forward: every micro-batch's weights, summed.
        total = jnp.maximum(jnp.sum(weights), 1e-6)

        def loss_fn(p, xs):
            tokens, a, y, m, w = xs
            sums = block_losses(p, target_params, config, dcfg, tokens, a, y, m, w, cfg.loss.chunk_blocks)
            return sums["wce"] / total, sums

        zeros = {k: jnp.zeros((), jnp.float32) for k in SUMS}
        xs = (batch["tokens"], anchors, labels, mask, weights)
        grads, sums = accumulate_grads(loss_fn, state.params, xs, zeros)
        metrics = metrics_of(sums) | {"grad_norm": optax.tree.norm(grads), "lr": schedule(state.step)}
        return apply_grads(state, grads, optimizer), metrics

    return step


# ------------------------------------------------------------------------------------------------------- fit


def fit(cfg: DFlashTrainConfig, **run) -> dict:
    """Runs (or resumes) a DFlash training run (`lsjax.train.runner.fit`); returns its summary. Writes
    <run_dir>/metrics.jsonl, checkpoints/, config.yaml and `DRAFT_CONFIG` (the draft's shape, for --export)."""
    from lsjax.train.runner import fit as run_fit

    return run_fit(cfg, _setup, **run)


def _setup(cfg: DFlashTrainConfig, open_run_dir, log):
    from lsjax import sharding
    from lsjax.train import data as data_lib
    from lsjax.train.inputs import GrainBatches, load_target, training_rows
    from lsjax.train.runner import Job

    config, target_params, tokenizer = load_target(cfg)
    dcfg, params = _draft(cfg, config, target_params, log)
    T = cfg.data.seq_len
    seqs, mask = training_rows(cfg.data, config, tokenizer, log=log)
    run_dir = open_run_dir()
    if sharding.is_primary():
        shape = hf_config(dcfg, config.num_layers, config.dtype)
        (run_dir / DRAFT_CONFIG).write_text(json.dumps(shape, indent=2) + "\n")
    dataset = data_lib.batches(seqs, mask, cfg, config.max_position)
    optimizer = make_optimizer(cfg.optim)
    log(
        f"draft: {dcfg.layer.num_layers} layers, block {dcfg.block_size}, target layers "
        f"{list(dcfg.target_layer_ids)}, mask token {dcfg.mask_token_id}, "
        f"{sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params)):,} parameters"
    )
    evaluate = _dev_eval(cfg, config, dcfg, target_params, tokenizer, log) if cfg.log.eval_every else None
    return Job(
        init_state(params, optimizer),
        make_train_step(config, dcfg, cfg, optimizer),
        target_params,
        GrainBatches(iter(dataset.to_iter_dataset())),
        jax.random.PRNGKey(cfg.seed),
        tokens_per_step=cfg.data.batch_size * cfg.data.grad_accum * T,
        evaluate=evaluate,
        max_minutes=cfg.max_minutes,
    )


def _draft(cfg: DFlashTrainConfig, config: ModelConfig, target_params, log):
    """(the draft's shape, its initial float32 params): random, a run's checkpoint or an exported (or published)
    DFlash draft directory (`checkpoint.init_from`), checked against the target."""
    from lsjax.methods.dflash.checkpoint import is_dflash_dir
    from lsjax.models.module import variables_problem

    src = cfg.checkpoint.init_from
    if src and Path(src).is_dir() and is_dflash_dir(src):
        dcfg, params = _exported(cfg, config, src)
        log(f"draft: initialised from the DFlash draft {src}")
    else:
        dcfg = draft_config(cfg, config)
        if src:
            from lsjax.train.checkpoint import load_draft_params

            params = load_draft_params(src)
            log(f"draft: initialised from {src}")
        else:
            params = dm.init_params(dcfg, jax.random.PRNGKey(cfg.seed), scale=cfg.draft.init_std)
    params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), params)
    if problem := variables_problem(dm.DFlashDraft(dcfg), params, f"checkpoint.init_from {src}"):
        raise ConfigError(problem.splitlines()[0])
    return dcfg, params


def _exported(cfg: DFlashTrainConfig, config: ModelConfig, src: str):
    """An exported or published draft to continue: its shape rules, the config's draft section must agree."""
    from lsjax.methods.dflash.checkpoint import read_draft

    hf = json.loads((Path(src) / "config.json").read_text())
    if hf.get("vocab_size") not in (None, config.vocab_size):
        raise ConfigError(
            f"checkpoint.init_from: the draft {src} is for a target with vocabulary {hf['vocab_size']}; the target "
            f"has {config.vocab_size}"
        )
    dcfg, params, _ = read_draft(src, dataclasses.replace(config, dtype="float32"))
    d = cfg.draft
    if dcfg.target_hidden_size != config.hidden_size or dcfg.hidden_size != config.hidden_size:
        raise ConfigError(
            f"checkpoint.init_from: the draft {src} is for a target of hidden size {dcfg.target_hidden_size}; the "
            f"target has {config.hidden_size}"
        )
    if d.num_layers != dcfg.layer.num_layers:
        raise ConfigError(
            f"draft.num_layers: must equal the init_from draft's {dcfg.layer.num_layers}, got {d.num_layers}"
        )
    if d.target_layer_ids and tuple(d.target_layer_ids) != dcfg.target_layer_ids:
        raise ConfigError(
            f"draft.target_layer_ids: must equal the init_from draft's {list(dcfg.target_layer_ids)}, got "
            f"{list(d.target_layer_ids)}"
        )
    if max(dcfg.target_layer_ids) >= config.num_layers:
        raise ConfigError(
            f"checkpoint.init_from: the draft {src} reads target layers {list(dcfg.target_layer_ids)}; the target "
            f"has {config.num_layers} layers"
        )
    if d.mask_token_id >= 0 and d.mask_token_id != dcfg.mask_token_id:
        raise ConfigError(
            f"draft.mask_token_id: must equal the init_from draft's {dcfg.mask_token_id}, got {d.mask_token_id}"
        )
    if dcfg.mask_token_id >= config.vocab_size:
        raise ConfigError(
            f"checkpoint.init_from: the draft's mask token {dcfg.mask_token_id} is outside the target's vocabulary "
            f"of {config.vocab_size}"
        )
    dcfg = dataclasses.replace(dcfg, block_size=d.block_size, layer=dataclasses.replace(dcfg.layer, dtype="float32"))
    return dcfg, params


def _dev_eval(cfg: DFlashTrainConfig, config, dcfg, target_params, tokenizer, log):
    """Dev-split loss and acceptance on fixed batches with fixed anchors (`data.sources`' dev split)."""
    from lsjax.train.inputs import dev_batches

    batches = dev_batches(cfg, config, tokenizer, log=log)

    @jax.jit
    def sums_of(params, batch, key):
        anchors, labels, m, w = step_targets(key, batch, cfg)

        def one(carry, xs):
            tokens, a, y, mm, ww = xs
            out = block_losses(params, target_params, config, dcfg, tokens, a, y, mm, ww, cfg.loss.chunk_blocks)
            return jax.tree.map(jnp.add, carry, out), None

        zeros = {k: jnp.zeros((), jnp.float32) for k in SUMS}
        return jax.lax.scan(one, zeros, (batch["tokens"], anchors, labels, m, w))[0]

    def evaluate(params) -> dict:
        got = [jax.device_get(sums_of(params, b, jax.random.PRNGKey(1_000_003 + i))) for i, b in enumerate(batches)]
        total = {k: sum(float(g[k]) for g in got) for k in SUMS}
        m = {k: float(x) for k, x in metrics_of(total).items()}
        return {"dev_ce": m["ce"], "dev_acc": m["acc"], "dev_accept": m["accept"]}

    return evaluate


def export_kind(cfg, out_dir, *, config_path: str | None = None, tree: str | None = None) -> dict:
    """`train.py --export DIR` of a dflash run: the published layout (`lsjax.methods.dflash.export`)."""
    from lsjax.methods.dflash.export import export_run

    return export_run(cfg, out_dir)
