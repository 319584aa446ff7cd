"""Training the LongSpec draft against a frozen target: losses, the step, the optimizer, the feature cache.

    step = make_train_step(model_cfg, train_cfg, vocab_ids)      # pure: (state, target_params, batch, key)
    state, metrics = jax.jit(step, donate_argnums=0)(state, target_params, batch, key)

A batch is what `lsjax.data.batches` yields ([A, B, T] for A micro-batches), optionally with cached
target features ("target_k", "target_v" [A, B, K, T, H], "target_argmax" [A, B, T], "target_hidden"
[A, B, T, D]); without them the frozen target runs once per micro-batch inside the step.

Per micro-batch: positions from the batch's offsets (anchor-offset indices, or plain when the offset is
0) for target and draft alike; the target's last-layer K/V (post-RoPE); the flash-noisy lag j ~ U[1, gamma)
(an array: no retrace); the draft's hidden states; the LM-head losses in chunks of positions under
`jax.checkpoint`, so neither the forward nor the backward holds [B, T, V] logits. Gradients of all
micro-batches are summed (each micro-batch's loss is already divided by the step's total loss weight),
then one clipped AdamW update.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from lsjax.cache import KVCache
from lsjax.config import ModelConfig, OptimConfig, TrainConfig
from lsjax.models import draft as draft_lib
from lsjax.models import target as target_lib
from lsjax.rope import anchor_offset_positions


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TrainState:
    step: jax.Array  # int32 scalar: optimizer steps taken
    params: dict  # the draft's (the target is frozen and passed separately)
    opt_state: Any


# ----------------------------------------------------------------------------- optimizer


def lr_schedule(optim: OptimConfig) -> optax.Schedule:
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=optim.lr,
        warmup_steps=optim.warmup_steps,
        decay_steps=optim.total_steps,
        end_value=optim.lr * optim.min_lr_ratio,
    )


def _decay_mask(params):
    # Norm gains (1-D) are not decayed: pulling them towards 0 only fights the normalisation.
    return jax.tree.map(lambda p: p.ndim >= 2, params)


def make_optimizer(optim: OptimConfig) -> optax.GradientTransformation:
    adamw = optax.adamw(
        lr_schedule(optim), b1=optim.b1, b2=optim.b2, eps=optim.eps, weight_decay=optim.weight_decay, mask=_decay_mask
    )
    if optim.clip_norm > 0:
        return optax.chain(optax.clip_by_global_norm(optim.clip_norm), adamw)
    return adamw


def init_state(draft_params: dict, optimizer: optax.GradientTransformation) -> TrainState:
    return TrainState(jnp.zeros((), jnp.int32), draft_params, optimizer.init(draft_params))


# ----------------------------------------------------------------------------- positions and target features


def positions_from_offsets(seq_len: int, offset: jax.Array, num_anchors: int = 4) -> jax.Array:
    """offset [B] -> positions [B, T]: anchors [0, num_anchors) stay, later ones + offset (0 = plain)."""
    return anchor_offset_positions(seq_len, offset, num_anchors)


def target_features(target_params: dict, config: ModelConfig, tokens: jax.Array, positions: jax.Array) -> dict:
    """The frozen target on [B, T]: last-layer k, v [B, K, T, H] (k post-RoPE) and final hidden [B, T, D].

    A zero-capacity cache makes the prefix part of the hybrid attention empty, so this is a plain causal
    forward with no cache memory; the target's gradients are cut here.
    """
    B = tokens.shape[0]
    cache = KVCache.zeros(config, B, 0)
    target_params = jax.lax.stop_gradient(target_params)
    hidden, new_k, new_v = target_lib.forward_hidden(target_params, config, tokens, positions, cache)
    return {"k": new_k[-1].swapaxes(1, 2), "v": new_v[-1].swapaxes(1, 2), "hidden": hidden}


def vocab_index(vocab_ids: jax.Array | None, vocab_size: int) -> jax.Array | None:
    """[V] map from a token id to its index in the pruned vocabulary, -1 outside it."""
    if vocab_ids is None:
        return None
    ids = jnp.asarray(vocab_ids, jnp.int32)
    return jnp.full((vocab_size,), -1, jnp.int32).at[ids].set(jnp.arange(ids.shape[0], dtype=jnp.int32))


# ----------------------------------------------------------------------------- chunked LM-head losses


def _target_logits(target_params: dict, config: ModelConfig, hidden: jax.Array, vocab_ids) -> jax.Array:
    h = target_lib.rms_norm(hidden, target_params["final_norm"], config.rms_norm_eps)
    if config.tie_embeddings:
        head = target_params["embed"] if vocab_ids is None else jnp.take(target_params["embed"], vocab_ids, axis=0)
        return jnp.einsum("...d,vd->...v", h, head).astype(jnp.float32)
    head = target_params["lm_head"] if vocab_ids is None else jnp.take(target_params["lm_head"], vocab_ids, axis=1)
    return jnp.einsum("...d,dv->...v", h, head).astype(jnp.float32)


def lm_losses(
    draft_params: dict,
    target_params: dict,
    config: ModelConfig,
    hidden: jax.Array,
    labels: jax.Array,
    weights: jax.Array,
    *,
    chunk_size: int,
    vocab_ids: jax.Array | None = None,
    distill: str = "none",
    target_hidden: jax.Array | None = None,
    target_labels: jax.Array | None = None,
) -> dict:
    """Weighted sums over positions, chunk by chunk: {"ce", "distill", "correct", "weight"} (scalars).

    hidden [B, T, D] (the draft's, before its final norm); labels [B, T] the next tokens; weights [B, T].
    With `vocab_ids` [Vd] the logits cover only those tokens and labels outside them get weight 0.
    distill "argmax": CE on `target_labels` [B, T] (or the argmax of the target's logits from
    `target_hidden`); "kl": KL(target || draft) from `target_hidden` [B, T, D] (over the pruned vocabulary,
    renormalised, when pruned). Each chunk's [B, C, V] logits are rematerialised in the backward pass.
    """
    B, T, D = hidden.shape
    C = min(chunk_size, T)
    n = -(-T // C)
    pad = n * C - T
    index = vocab_index(vocab_ids, config.vocab_size)
    head_ids = None if vocab_ids is None else jnp.asarray(vocab_ids, jnp.int32)

    def chunked(x, fill=0):  # [B, T, ...] -> [n, B, C, ...]
        x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2), constant_values=fill)
        return x.reshape(B, n, C, *x.shape[2:]).swapaxes(0, 1)

    xs = {"h": chunked(hidden), "y": chunked(labels), "w": chunked(weights)}
    if distill == "kl" or (distill == "argmax" and target_labels is None):
        if target_hidden is None:
            raise ValueError(f"distill={distill!r} needs target_hidden")
        xs["th"] = chunked(target_hidden)
    if distill == "argmax" and target_labels is not None:
        xs["ty"] = chunked(target_labels)

    def to_local(y):  # full-vocab ids -> pruned indices (-1 when outside)
        return y if index is None else index[y]

    def ce(logp, y, w):
        ok = y >= 0
        picked = jnp.take_along_axis(logp, jnp.maximum(y, 0)[..., None], axis=-1)[..., 0]
        w = w * ok
        return -jnp.sum(picked * w), w

    @jax.checkpoint
    def chunk(c):
        logits = draft_lib.draft_logits(draft_params, target_params, config, c["h"], head_ids)  # [B, C, V]
        logp = jax.nn.log_softmax(logits, axis=-1)
        y = to_local(c["y"])
        ce_sum, w = ce(logp, y, c["w"])
        correct = jnp.sum((jnp.argmax(logits, axis=-1) == y) * w)
        out = {"ce": ce_sum, "correct": correct, "weight": jnp.sum(w), "distill": jnp.zeros(())}
        if distill == "argmax":
            if "ty" in c:
                ty = to_local(c["ty"])
            else:  # the target's own argmax over the full vocabulary, then mapped into the pruned one
                ty = to_local(jnp.argmax(_target_logits(target_params, config, c["th"], None), axis=-1))
            out["distill"] = ce(logp, ty, c["w"])[0]
        elif distill == "kl":
            tlogp = jax.nn.log_softmax(_target_logits(target_params, config, c["th"], head_ids), axis=-1)
            kl = jnp.sum(jnp.exp(tlogp) * (tlogp - logp), axis=-1)  # [B, C]
            out["distill"] = jnp.sum(kl * c["w"])
        return out

    per_chunk = jax.lax.map(chunk, xs)
    return jax.tree.map(lambda a: jnp.sum(a, axis=0), per_chunk)


def dense_lm_losses(draft_params, target_params, config, hidden, labels, weights, *, vocab_ids=None) -> dict:
    """Reference for `lm_losses` (CE only) with full [B, T, V] logits: tests compare the two."""
    head_ids = None if vocab_ids is None else jnp.asarray(vocab_ids, jnp.int32)
    logits = draft_lib.draft_logits(draft_params, target_params, config, hidden, head_ids)
    logp = jax.nn.log_softmax(logits, axis=-1)
    if vocab_ids is not None:
        labels = vocab_index(vocab_ids, config.vocab_size)[labels]
    ok = labels >= 0
    picked = jnp.take_along_axis(logp, jnp.maximum(labels, 0)[..., None], axis=-1)[..., 0]
    w = weights * ok
    return {"ce": -jnp.sum(picked * w), "weight": jnp.sum(w)}


# ----------------------------------------------------------------------------- the step


def next_token_targets(tokens: jax.Array, loss_mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Position t predicts token t + 1: labels [B, T] and weights [B, T] (the last position has none)."""
    labels = jnp.concatenate([tokens[:, 1:], jnp.zeros_like(tokens[:, :1])], axis=1)
    weights = jnp.concatenate([loss_mask[:, 1:], jnp.zeros_like(loss_mask[:, :1])], axis=1)
    return labels, weights.astype(jnp.float32)


def draw_shift(key: jax.Array, cfg: TrainConfig) -> jax.Array:
    """Flash-noisy lag j ~ U[1, gamma) as an int32 array; 0 (no lag) when flash noisy training is off."""
    if not cfg.loss.flash_noisy:
        return jnp.zeros((), jnp.int32)
    return jax.random.randint(key, (), 1, cfg.loss.gamma, dtype=jnp.int32)


def micro_losses(
    draft_params: dict,
    target_params: dict,
    config: ModelConfig,
    cfg: TrainConfig,
    micro: dict,
    shift: jax.Array,
    vocab_ids: jax.Array | None = None,
) -> dict:
    """Loss sums of one micro-batch (tokens [B, T] ...) at lag `shift`."""
    tokens = micro["tokens"]
    T = tokens.shape[1]
    positions = positions_from_offsets(T, micro["offset"], cfg.positions.num_anchors)
    distill = cfg.loss.distill
    if "target_k" in micro:
        tk, tv, th = micro["target_k"], micro["target_v"], micro.get("target_hidden")
    else:
        feats = target_features(target_params, config, tokens, positions)
        tk, tv, th = feats["k"], feats["v"], feats["hidden"]
    target_labels = micro.get("target_argmax")  # cached: position t's argmax is the target's guess for t + 1
    hidden = draft_lib.draft_forward_train(
        draft_params, target_params, config, cfg.draft, tokens, positions, tk, tv, shift
    )
    labels, weights = next_token_targets(tokens, micro["loss_mask"])
    return lm_losses(
        draft_params,
        target_params,
        config,
        hidden,
        labels,
        weights,
        chunk_size=cfg.loss.chunk_size,
        vocab_ids=vocab_ids,
        distill=distill,
        target_hidden=None if distill == "none" else th,
        target_labels=target_labels if distill == "argmax" else None,
    )


def _objective(sums: dict, cfg: TrainConfig, total_weight: jax.Array) -> jax.Array:
    loss = cfg.loss.ce_weight * sums["ce"]
    if cfg.loss.distill != "none":
        loss = loss + cfg.loss.distill_weight * sums["distill"]
    return loss / total_weight


def make_train_step(config: ModelConfig, cfg: TrainConfig, vocab_ids=None, optimizer=None):
    """The pure step `(state, target_params, batch, key) -> (state, metrics)`; jit it (see sharding.py)."""
    optimizer = optimizer or make_optimizer(cfg.optim)
    schedule = lr_schedule(cfg.optim)
    vocab_ids = None if vocab_ids is None else jnp.asarray(vocab_ids, jnp.int32)

    def step(state: TrainState, target_params: dict, batch: dict, key: jax.Array):
        A = batch["tokens"].shape[0]
        keys = jax.random.split(key, A)
        # The normaliser is known before any forward: sum over micro-batches of next-token weights.
        total_w = jnp.maximum(jnp.sum(batch["loss_mask"][:, :, 1:]), 1.0)

        def micro_step(carry, xs):
            grads_acc, sums_acc = carry
            micro, k = xs
            shift = draw_shift(k, cfg)

            def f(p):
                sums = micro_losses(p, target_params, config, cfg, micro, shift, vocab_ids)
                return _objective(sums, cfg, total_w), sums

            (_, sums), grads = jax.value_and_grad(f, has_aux=True)(state.params)
            grads_acc = jax.tree.map(jnp.add, grads_acc, grads)
            sums = {**sums, "shift": shift.astype(jnp.float32)}
            return (grads_acc, jax.tree.map(jnp.add, sums_acc, sums)), None

        zeros_g = jax.tree.map(jnp.zeros_like, state.params)
        zeros_s = {k: jnp.zeros((), jnp.float32) for k in ("ce", "distill", "correct", "weight", "shift")}
        (grads, sums), _ = jax.lax.scan(micro_step, (zeros_g, zeros_s), (batch, keys))
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        w = jnp.maximum(sums["weight"], 1.0)
        metrics = {
            "loss": _objective(sums, cfg, total_w),
            "ce": sums["ce"] / w,
            "distill": sums["distill"] / w,
            "acc": sums["correct"] / w,
            "loss_tokens": sums["weight"],
            "grad_norm": optax.global_norm(grads),
            "lr": schedule(state.step),
            "shift": sums["shift"] / A,
        }
        return TrainState(state.step + 1, params, opt_state), metrics

    return step


def make_eval_step(config: ModelConfig, cfg: TrainConfig, vocab_ids=None):
    """`(draft_params, target_params, batch, shift) -> sums` over every micro-batch (no update)."""
    vocab_ids = None if vocab_ids is None else jnp.asarray(vocab_ids, jnp.int32)

    def evaluate(draft_params, target_params, batch, shift):
        def one(carry, micro):
            sums = micro_losses(draft_params, target_params, config, cfg, micro, shift, vocab_ids)
            return jax.tree.map(jnp.add, carry, sums), None

        zeros = {k: jnp.zeros((), jnp.float32) for k in ("ce", "distill", "correct", "weight")}
        return jax.lax.scan(one, zeros, batch)[0]

    return evaluate


# ----------------------------------------------------------------------------- target-feature cache


FEATURES_VERSION = 1


def feature_shapes(config: ModelConfig, num_seqs: int, seq_len: int, with_hidden: bool) -> dict:
    K, H, D = config.num_kv_heads, config.head_dim, config.hidden_size
    shapes = {
        "target_k": ((num_seqs, K, seq_len, H), np.float32),
        "target_v": ((num_seqs, K, seq_len, H), np.float32),
        "target_argmax": ((num_seqs, seq_len), np.int32),
    }
    if with_hidden:
        shapes["target_hidden"] = ((num_seqs, seq_len, D), np.float32)
    return shapes


def build_feature_cache(
    target_params: dict,
    config: ModelConfig,
    tokens: np.ndarray,
    offsets: np.ndarray,
    directory: str | Path,
    *,
    num_anchors: int = 4,
    batch_size: int = 4,
    with_hidden: bool = False,
    fingerprint: str = "",
    log=print,
) -> dict[str, np.ndarray]:
    """Runs the target once over packed sequences tokens [S, T] at their fixed offsets [S] and stores its
    features in npy memmaps under `directory`; resumable (progress is recorded after every batch).

    Returns read-only memmaps {"target_k", "target_v" [S, K, T, H], "target_argmax" [S, T],
    "target_hidden" [S, T, D] (with_hidden)}.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    S, T = tokens.shape
    shapes = feature_shapes(config, S, T, with_hidden)
    meta = {
        "version": FEATURES_VERSION,
        "sequences": S,
        "seq_len": T,
        "with_hidden": with_hidden,
        "fingerprint": fingerprint,
        "tokens_sha": _sha(tokens),
        "offsets_sha": _sha(offsets),
    }
    meta_file, progress_file = directory / "meta.json", directory / "progress.json"
    fresh = not meta_file.exists() or json.loads(meta_file.read_text()) != meta
    done = 0 if fresh else json.loads(progress_file.read_text())["done"] if progress_file.exists() else 0
    arrays = {}
    for name, (shape, dtype) in shapes.items():
        path = directory / f"{name}.npy"
        mode = "w+" if fresh or not path.exists() else "r+"
        arrays[name] = np.lib.format.open_memmap(path, mode=mode, dtype=dtype, shape=shape)
    if fresh:
        meta_file.write_text(json.dumps(meta) + "\n")
        progress_file.write_text(json.dumps({"done": 0}))

    @jax.jit
    def run(tp, toks, offs):
        pos = positions_from_offsets(toks.shape[1], offs, num_anchors)
        f = target_features(tp, config, toks, pos)
        logits_argmax = jnp.argmax(_target_logits(tp, config, f["hidden"], None), axis=-1).astype(jnp.int32)
        return f["k"], f["v"], logits_argmax, f["hidden"]

    t0, start = time.perf_counter(), done
    while done < S:
        n = min(batch_size, S - done)
        toks = np.zeros((batch_size, T), np.int32)
        offs = np.zeros((batch_size,), np.int32)
        toks[:n], offs[:n] = tokens[done : done + n], offsets[done : done + n]
        k, v, am, h = jax.device_get(run(target_params, toks, offs))
        arrays["target_k"][done : done + n] = k[:n]
        arrays["target_v"][done : done + n] = v[:n]
        arrays["target_argmax"][done : done + n] = am[:n]
        if with_hidden:
            arrays["target_hidden"][done : done + n] = h[:n]
        done += n
        for a in arrays.values():
            a.flush()
        progress_file.write_text(json.dumps({"done": done}))
        rate = (done - start) * T / max(time.perf_counter() - t0, 1e-9)
        log(f"features: {done}/{S} sequences ({rate:.0f} tok/s)")
    return {name: np.load(directory / f"{name}.npy", mmap_mode="r") for name in shapes}


def _sha(a: np.ndarray) -> str:
    import hashlib

    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()[:16]


# ----------------------------------------------------------------------------- the run loop


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


def _eos(config: ModelConfig) -> int:
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
    import yaml

    from lsjax import checkpoint as ckpt_lib
    from lsjax import data as data_lib
    from lsjax import sharding

    sharding.maybe_initialize_distributed()
    run_dir = Path(cfg.resolved_run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if config_dict is not None:
        (run_dir / "config.yaml").write_text(yaml.safe_dump(config_dict, sort_keys=False))
    config, target_params, tokenizer = load_target(cfg)
    if tokenizer is None and any(s != "synthetic" for s in cfg.data.sources):
        raise ValueError("data.sources: a random-init target has no tokenizer; use the synthetic source")

    # --- data
    eos, V, T = _eos(config), config.vocab_size, cfg.data.seq_len
    seqs, mask = data_lib.load_sequences(cfg, tokenizer, eos, V, log=log)
    log(f"data: {data_lib.describe(seqs, mask)} ({', '.join(cfg.data.sources)}, {cfg.data.split})")
    extra = None
    fixed = cfg.features.enabled
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
    vocab_ids = None
    if cfg.draft.draft_vocab_size:
        counts = np.bincount(seqs[mask > 0].reshape(-1), minlength=V)
        vocab_ids = draft_lib.pruned_vocab(config, cfg.draft.draft_vocab_size, token_counts=counts)
        np.save(run_dir / "vocab_ids.npy", vocab_ids)
    if cfg.checkpoint.init_from:
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
