"""Training an EAGLE-3 draft against a frozen target (`python train.py --config configs/train/eagle3-smollm2.yaml`,
a config with `kind: eagle3`).

At position t the draft reads the pair (h_t, x_{t+1}): h_t the target's residual streams entering the aux layers
at token t, and guesses x_{t+2}. EAGLE-3's training-time test (SafeAILab/EAGLE `traineagle3`) runs the draft
`loss.ttt_steps` times over every position; step j (0-based) at position t:

    input token   x_{t+1+j}                       the data's token (teacher-forced, as the reference)
    state g       fc(h_t) at j = 0, else the draft's own output of step j - 1 at t
    position      t + j                           RoPE of its query and its new key
    attends to    step 0's keys at positions <= t (causal) and steps 1..j's keys at t itself: the K/V a tree's
                  level-j node sees at decode (the committed context, then its ancestors)
    target        p = softmax of the target's logits at position t + 1 + j over the draft vocabulary
    loss          -sum_v p_v log q_v, weighted by loss_mask[t + j] (the reference indexes the mask by the
                  query position) and by whether the target's argmax (over its whole vocabulary) is in the
                  draft vocabulary; 0 where position t + 1 + j is past the row

Each step's loss is its weighted sum over the step's batch divided by the batch's positions (the reference's
mean over positions), and the objective is sum_j step_weight^j loss_j (the reference's 0.8^j). The draft's
embedding is the target's, frozen; the draft vocabulary is the `draft.draft_vocab_size` target tokens most
frequent at the training rows' loss positions (the reference's `d2t` / `t2d`), saved as `vocab_ids.npy`.

The target's features (the aux streams, its final hidden state, its argmax) come from sets of the shared
feature cache built with the draft's aux layers (`features.set`, `--aux-layers`), else the target runs once
per micro-batch inside the step. The optimizer, checkpoints and the step loop are every trainer's
(`lsjax.train.step`, `.checkpoint`, `.runner`); `lsjax.methods.eagle3.export` writes the published layouts.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from lsjax import attention
from lsjax.band_attention import band_attention
from lsjax.cache import KVCache
from lsjax.config import ConfigError, ModelConfig, RopeScaling, from_dict, to_dict
from lsjax.methods.eagle3 import model as em
from lsjax.methods.eagle3.train_config import Eagle3TrainConfig
from lsjax.models import target as target_lib
from lsjax.models.layers import ParamSpec, rms_norm
from lsjax.models.layers import embed as lookup
from lsjax.train.step import TrainState, accumulate_grads, apply_grads, init_state, lr_schedule, make_optimizer

DRAFT_FILE = "eagle3.json"  # the run's draft shape (the export reads it without loading the target)
HEAD_KEYS = ("embed", "final_norm", "lm_head")  # the target params the step reads when the features are cached
SUMS = ("ploss", "weight", "correct", "mask")  # what `ttt_losses` sums per step


# ----------------------------------------------------------------------------------------- the draft


def draft_vocab(counts: np.ndarray, size: int) -> np.ndarray:
    """The draft vocabulary: the `size` most frequent target ids (ties by id), ascending (so the published
    `d2t[i] = id_i - i` is never negative); counts [V]. `size` 0 or V: the whole vocabulary."""
    V = len(counts)
    if not size or size >= V:
        return np.arange(V, dtype=np.int32)
    by_freq = np.lexsort((np.arange(V), -np.asarray(counts, np.float64)))
    return np.sort(by_freq[:size]).astype(np.int32)


def vocab_masks(vocab_ids: np.ndarray, vocab_size: int) -> np.ndarray:
    """t2d [V] bool: which target ids the draft vocabulary holds."""
    t2d = np.zeros(vocab_size, bool)
    t2d[np.asarray(vocab_ids)] = True
    return t2d


def draft_config(target: ModelConfig, cfg: Eagle3TrainConfig, draft_vocab_size: int) -> em.Eagle3Config:
    """The draft's shape: one Llama layer as wide as the target (fp32 while it trains)."""
    d = cfg.draft
    heads = d.num_heads or target.num_heads
    head_dim = target.head_dim if not d.num_heads else target.hidden_size // heads
    layer = dataclasses.replace(
        target,
        arch="llama",
        num_layers=1,
        num_heads=heads,
        num_kv_heads=d.num_kv_heads or (target.num_kv_heads if not d.num_heads else heads),
        head_dim=head_dim,
        intermediate_size=d.intermediate_size or target.intermediate_size,
        rope_scaling=RopeScaling(),
        qkv_bias=False,
        qk_norm=False,
        tie_embeddings=False,
        bos_token_id=None,
        eos_token_ids=(),
        pad_token_id=0,
        invariant_rows=0,
        dtype="float32",
        name="eagle3",
    )
    aux = d.aux_layers or em.default_aux_layers(target.num_layers)
    return em.Eagle3Config(layer, draft_vocab_size, target.hidden_size, aux, d.norm_before_residual)


def trainable_specs(dcfg: em.Eagle3Config) -> dict[str, ParamSpec]:
    """The draft's trained params: all but `draft_to_target` (the vocabulary, fixed before training)."""
    return {k: v for k, v in em.param_specs(dcfg).items() if k != "draft_to_target"}


def init_draft(dcfg: em.Eagle3Config, cfg: Eagle3TrainConfig, key, target_params=None, vocab_ids=None) -> dict:
    """Fresh trainable params (fp32): weights ~ N(0, draft.init_std), norm gains 1; with `draft.head_init:
    target`, the LM head and final norm are the target's (the head on the draft vocabulary `vocab_ids`)."""
    specs = trainable_specs(dcfg)
    keys = dict(zip(specs, jax.random.split(key, len(specs)), strict=True))
    std = cfg.draft.init_std
    params = {
        n: jnp.ones(s.shape, jnp.float32) if s.init == "ones" else std * jax.random.normal(keys[n], s.shape)
        for n, s in specs.items()
    }
    if cfg.draft.head_init == "target":
        if target_params is None or vocab_ids is None:
            raise ValueError("init_draft: draft.head_init target needs the target's params and the draft vocabulary")
        head = target_head(target_params, jnp.asarray(vocab_ids, jnp.int32))
        params["lm_head"] = jnp.array(head, jnp.float32)  # a copy: the trainer donates the draft's buffers
        params["final_norm"] = jnp.array(target_params["final_norm"], jnp.float32)
    return params


def target_head(target_params: dict, vocab_ids) -> jax.Array:
    """The target's LM head restricted to the draft vocabulary, [D, Vd] (its columns in draft-id order)."""
    if "lm_head" in target_params:
        return jnp.take(target_params["lm_head"], vocab_ids, axis=1)
    return jnp.take(target_params["embed"], vocab_ids, axis=0).T


# ------------------------------------------------------------------------------- the training-time test


def _shift(x: jax.Array, n: int, fill=0) -> jax.Array:
    """x[:, t + n] at t (`fill` past the row's end)."""
    if n == 0:
        return x
    pad = jnp.full((x.shape[0], n) + x.shape[2:], fill, x.dtype)
    return jnp.concatenate([x[:, n:], pad], axis=1)


def _ttt_attend(k0, v0, diag_k: list, diag_v: list):
    """An `attend` for `model.layer` at a TTT step: the step-0 keys k0, v0 [B, T, K, H] causally, merged by LSE
    with the keys of steps 1..j at the query's own position (`diag_*`, then the step's own). At step 0 (k0 None)
    the step's own keys, causally."""

    def attend(q, k, v):
        if k0 is None:
            return band_attention(q, k.swapaxes(1, 2), v.swapaxes(1, 2))
        out0, lse0 = band_attention(q, k0.swapaxes(1, 2), v0.swapaxes(1, 2), with_lse=True)
        B, T, N, H = q.shape
        K = k.shape[2]
        qg = q.astype(jnp.float32).reshape(B, T, K, N // K, H) * H**-0.5
        ks = jnp.stack([*diag_k, k]).astype(jnp.float32)  # [j, B, T, K, H]
        vs = jnp.stack([*diag_v, v]).astype(jnp.float32)
        s = jnp.einsum("btkgh,jbtkh->jbtkg", qg, ks)
        lse = jax.nn.logsumexp(s, axis=0)  # [B, T, K, G]
        out = jnp.einsum("jbtkg,jbtkh->btkgh", jnp.exp(s - lse[None]), vs)
        out = out.reshape(B, T, N, H).astype(out0.dtype)
        return attention.merge_attention(out0, lse0, out, lse.reshape(B, T, N))[0]

    return attend


def ttt_forward(params: dict, dcfg: em.Eagle3Config, aux, tokens, target_embed, steps: int) -> list[jax.Array]:
    """The draft's states of every TTT step, [B, T, D] each: aux [B, T, A Dt] the target's streams, tokens
    [B, T] the row (step j's input at t is tokens[t + 1 + j]), target_embed [V, D]. Each step is
    rematerialised under autodiff."""
    B, T = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))

    @jax.checkpoint
    def one(p, emb, g, pos, k0, v0, dk, dv):
        return em.layer(p, dcfg, emb, g, pos, _ttt_attend(k0, v0, dk, dv))

    g = em.fuse(params, aux)
    k0 = v0 = None
    dk, dv, outs = [], [], []
    for j in range(steps):
        emb = lookup({"embed": target_embed}, _shift(tokens, 1 + j))
        out, k, v = one(params, emb, g, positions + j, k0, v0, list(dk), list(dv))
        if j == 0:
            k0, v0 = k, v
        else:
            dk.append(k)
            dv.append(v)
        outs.append(out)
        g = out
    return outs


def live_features(target_params: dict, config: ModelConfig, tokens, aux_layers, chunk: int) -> dict:
    """The frozen target on tokens [B, T] at positions 0..T-1: {"aux" [B, T, A D] (the model's dtype),
    "hidden" [B, T, D] (final, before the norm), "argmax" [B, T] over its whole vocabulary}."""
    B, T = tokens.shape
    target_params = jax.lax.stop_gradient(target_params)
    positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    net = target_lib.Transformer(config)
    hidden, _, _, streams = net.apply(
        {"params": target_params}, tokens, positions, KVCache.zeros(config, B, 0), tuple(aux_layers), method="streams"
    )

    def chunk_argmax(h):  # [B, C, D] -> [B, C]: the full-vocabulary logits never exist for the whole row
        return jnp.argmax(target_lib.lm_head(target_params, config, h), axis=-1).astype(jnp.int32)

    argmax = jax.lax.map(chunk_argmax, _chunks(hidden, chunk)).swapaxes(0, 1).reshape(B, -1)[:, :T]
    return {"aux": streams.astype(jnp.dtype(config.dtype)), "hidden": hidden, "argmax": argmax}


def _chunks(x: jax.Array, C: int) -> jax.Array:
    """[B, T, ...] -> [n, B, C, ...] (zero-padded to n C positions)."""
    B, T = x.shape[:2]
    n = -(-T // C)
    x = jnp.pad(x, [(0, 0), (0, n * C - T)] + [(0, 0)] * (x.ndim - 2))
    return x.reshape(B, n, C, *x.shape[2:]).swapaxes(0, 1)


def ttt_losses(
    params: dict, consts: dict, config: ModelConfig, dcfg: em.Eagle3Config, cfg: Eagle3TrainConfig, micro: dict
) -> dict:
    """One micro-batch's per-step sums [S]: "ploss" (the weighted soft cross-entropy), "weight" (its weights),
    "correct" (draft argmax = target argmax where weighted), "mask" (the step's loss-mask positions that have a
    target)."""
    S, C = cfg.loss.ttt_steps, cfg.loss.chunk_size
    tp = consts["target"]
    tokens, loss_mask = micro["tokens"], micro["loss_mask"].astype(jnp.float32)
    B, T = tokens.shape
    if "target_aux" in micro:
        feats = {"aux": micro["target_aux"], "hidden": micro["target_hidden"], "argmax": micro["target_argmax"]}
    else:
        feats = live_features(tp, config, tokens, dcfg.aux_layers, C)
    aux = feats["aux"].astype(jnp.dtype(config.dtype))
    outs = ttt_forward(params, dcfg, aux, tokens, jax.lax.stop_gradient(tp["embed"]), S)
    head = jax.lax.stop_gradient(target_head(tp, consts["vocab_ids"]))
    final_norm = jax.lax.stop_gradient(tp["final_norm"])
    in_vocab = jnp.take(consts["t2d"], feats["argmax"].astype(jnp.int32)).astype(jnp.float32)  # [B, T]
    hidden = feats["hidden"].astype(jnp.float32)

    @jax.checkpoint
    def chunk(p, xs):
        out, h, w = xs
        logq = jax.nn.log_softmax(em.logits(p, dcfg, out), axis=-1)  # [B, C, Vd]
        t_logits = jnp.einsum("bcd,dv->bcv", rms_norm(h, final_norm, config.rms_norm_eps), head.astype(jnp.float32))
        target_p = jax.nn.softmax(t_logits, axis=-1)
        ce = -jnp.sum(target_p * logq, axis=-1)
        hit = jnp.argmax(logq, axis=-1) == jnp.argmax(t_logits, axis=-1)
        return jnp.sum(w * ce), jnp.sum(w * hit)

    sums = {"ploss": [], "weight": [], "correct": [], "mask": []}
    valid_all = jnp.arange(T)[None, :]
    for j in range(S):
        valid = (valid_all + 1 + j < T).astype(jnp.float32)  # position t + 1 + j is inside the row
        lm = _shift(loss_mask, j) * valid
        weight = lm * _shift(in_vocab, 1 + j)
        xs = (_chunks(outs[j], C), _chunks(_shift(hidden, 1 + j), C), _chunks(weight, C))
        ce, hit = jax.lax.map(lambda x: chunk(params, x), xs)
        sums["ploss"].append(jnp.sum(ce))
        sums["correct"].append(jnp.sum(hit))
        sums["mask"].append(jnp.sum(lm))
        sums["weight"].append(jnp.sum(weight))
    return {k: jnp.stack(v) for k, v in sums.items()}


def objective(sums: dict, cfg: Eagle3TrainConfig, positions) -> jax.Array:
    """sum_j step_weight^j ploss_j / positions (the reference's per-step mean over the batch's positions)."""
    w = jnp.asarray([cfg.loss.step_weight**j for j in range(cfg.loss.ttt_steps)], jnp.float32)
    return jnp.sum(w * sums["ploss"]) / positions


def make_train_step(config: ModelConfig, dcfg: em.Eagle3Config, cfg: Eagle3TrainConfig, optimizer=None):
    """The pure step `(state, consts, batch, key) -> (state, metrics)`; consts {"target", "vocab_ids", "t2d"};
    batch fields [A, B, T, ...]."""
    optimizer = optimizer or make_optimizer(cfg.optim)
    schedule = lr_schedule(cfg.optim)
    S = cfg.loss.ttt_steps

    def step(state: TrainState, consts: dict, batch: dict, key=None):
        positions = float(np.prod(batch["tokens"].shape))  # A B T: static

        def loss_fn(p, micro):
            sums = ttt_losses(p, consts, config, dcfg, cfg, micro)
            return objective(sums, cfg, positions), sums

        zeros = {k: jnp.zeros((S,), jnp.float32) for k in SUMS}
        grads, sums = accumulate_grads(loss_fn, state.params, batch, zeros)
        metrics = {"loss": objective(sums, cfg, positions), "grad_norm": optax.tree.norm(grads)}
        metrics["lr"] = schedule(state.step)
        acc = sums["correct"] / jnp.maximum(sums["mask"], 1.0)
        # The soft cross-entropy per weighted position at step 0 (the loss's terms are per position of the batch,
        # so they move with how much of it the loss mask covers).
        metrics["ce"] = sums["ploss"][0] / jnp.maximum(sums["weight"][0], 1.0)
        metrics["acc"] = acc[0]
        for j in range(S):
            metrics[f"ploss_{j}"] = sums["ploss"][j] / positions
            metrics[f"acc_{j}"] = acc[j]
        return apply_grads(state, grads, optimizer), metrics

    return step


# ------------------------------------------------------------------------------------------------- fit


def fit(cfg: Eagle3TrainConfig, **run) -> dict:
    """Runs (or resumes) an EAGLE-3 training run (`lsjax.train.runner.fit`): <run_dir>/metrics.jsonl,
    checkpoints/, vocab_ids.npy, eagle3.json (the draft's shape), config.yaml."""
    from lsjax.train.runner import fit as run_fit

    return run_fit(cfg, _setup, **run)


def _setup(cfg: Eagle3TrainConfig, open_run_dir, log):
    from lsjax.train import data as data_lib
    from lsjax.train.inputs import GrainBatches, load_target, training_rows
    from lsjax.train.runner import Job

    config, target_params, tokenizer = load_target(cfg)
    cfg.draft.check_target(config)
    aux_layers = cfg.draft.aux_layers or em.default_aux_layers(config.num_layers)
    T = cfg.data.seq_len
    extra = None
    if cfg.features.set:
        seqs, mask, extra = _feature_set_inputs(cfg, aux_layers, log)
    else:
        seqs, mask = training_rows(cfg.data, config, tokenizer, log=log)
    if int(np.max(seqs)) >= config.vocab_size:
        raise ConfigError(f"data: token id {int(np.max(seqs))} >= the target's vocabulary {config.vocab_size}")

    init = _init_from(cfg, config)
    if init is not None:
        params, vocab_ids = init
    else:
        counts = np.bincount(np.asarray(seqs)[np.asarray(mask) > 0].reshape(-1), minlength=config.vocab_size)
        vocab_ids = draft_vocab(counts, cfg.draft.draft_vocab_size)
        covered = counts[vocab_ids].sum() / max(counts.sum(), 1)
        log(f"draft vocabulary: {len(vocab_ids)} tokens, {covered:.1%} of the training targets")
        params = None
    dcfg = draft_config(config, cfg, len(vocab_ids))
    dcfg = dataclasses.replace(dcfg, aux_layers=tuple(aux_layers))
    if params is None:
        params = init_draft(dcfg, cfg, jax.random.PRNGKey(cfg.seed), target_params, vocab_ids)

    run_dir = open_run_dir()
    from lsjax import sharding

    if sharding.is_primary():
        np.save(run_dir / "vocab_ids.npy", vocab_ids)
        (run_dir / DRAFT_FILE).write_text(json.dumps(describe_draft(dcfg, config, cfg), indent=1) + "\n")
    vocab = jnp.asarray(vocab_ids, jnp.int32)
    consts = {
        "target": target_params if extra is None else {k: target_params[k] for k in HEAD_KEYS if k in target_params},
        "vocab_ids": vocab,
        "t2d": jnp.asarray(vocab_masks(vocab_ids, config.vocab_size)),
    }
    optimizer = make_optimizer(cfg.optim)
    dataset = data_lib.batches(seqs, mask, cfg, config.max_position, extra=extra)
    evaluate = _dev_eval(cfg, config, dcfg, target_params, consts, tokenizer, log) if cfg.log.eval_every else None
    return Job(
        init_state(params, optimizer),
        make_train_step(config, dcfg, cfg, optimizer),
        consts,
        GrainBatches(iter(dataset.to_iter_dataset())),
        jax.random.PRNGKey(cfg.seed),
        tokens_per_step=cfg.data.batch_size * cfg.data.grad_accum * T,
        evaluate=evaluate,
        max_minutes=cfg.max_minutes,
    )


def _feature_set_inputs(cfg: Eagle3TrainConfig, aux_layers, log):
    """(tokens, loss_mask, extra) from the shared cache's sets: lazy views of the aux streams, the final hidden
    state and the argmax. The sets must hold the draft's aux layers."""
    from lsjax.train import feature_sets as fcm
    from lsjax.train.data import describe

    fc = fcm.FeatureSets.open(cfg.features.set, cfg.data.max_sequences)
    if fc.seq_len != cfg.data.seq_len:
        raise ConfigError(f"data.seq_len: must equal the feature set's length {fc.seq_len}, got {cfg.data.seq_len}")
    if fc.aux_layers != tuple(aux_layers):
        held = "differ between the sets" if fc.aux_layers is None else f"are {list(fc.aux_layers) or 'none'}"
        raise ConfigError(
            f"features.set: its aux layers {held}, the draft reads {list(aux_layers)} (draft.aux_layers); build the "
            "set with --aux-layers " + " ".join(map(str, aux_layers))
        )
    n = fc.num_sequences
    if n < cfg.data.batch_size:
        raise ConfigError(f"features.set: {cfg.features.set} has {n} complete sequences, fewer than data.batch_size")
    extra = {
        "target_aux": fcm.FieldView(fc, "aux_hidden", n),
        "target_hidden": fcm.FieldView(fc, "hidden", n),
        "target_argmax": fcm.FieldView(fc, "topk_ids", n, first_only=True),
    }
    log(f"data: {describe(fc.tokens, fc.loss_mask)} from feature sets {fc.describe()} (complete/total sequences)")
    return fc.tokens, fc.loss_mask, extra


def _init_from(cfg: Eagle3TrainConfig, config: ModelConfig):
    """(trainable params, vocab_ids) from `checkpoint.init_from`: an exported draft directory (either published
    layout) or a previous eagle3 run; None without one."""
    src = cfg.checkpoint.init_from
    if not src:
        return None
    path = Path(src)
    if (path / "config.json").is_file():
        from lsjax.methods.eagle3.checkpoint import read_draft

        dcfg, params, _ = read_draft(path, dataclasses.replace(config, dtype="float32"))
        vocab_ids = np.asarray(params.pop("draft_to_target"), np.int32)
    else:
        from lsjax.train.checkpoint import load_draft_params

        params = load_draft_params(path)
        run = path if (path / "vocab_ids.npy").is_file() else path.parent
        vocab_ids = np.load(run / "vocab_ids.npy")
    if cfg.draft.draft_vocab_size and len(vocab_ids) != cfg.draft.draft_vocab_size:
        raise ConfigError(
            f"draft.draft_vocab_size: must equal the init_from draft's {len(vocab_ids)}, "
            f"got {cfg.draft.draft_vocab_size}"
        )
    return jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), params), vocab_ids


def describe_draft(dcfg: em.Eagle3Config, target: ModelConfig, cfg: Eagle3TrainConfig) -> dict:
    """The draft's shape as JSON (eagle3.json), with what the export says of the target: its depth (which layout
    can express the aux layers), architecture and path, and the steps the draft was trained to draft."""
    return {
        "layer": to_dict(dcfg.layer),
        "draft_vocab_size": dcfg.draft_vocab_size,
        "target_hidden_size": dcfg.target_hidden_size,
        "aux_layers": list(dcfg.aux_layers),
        "norm_before_residual": dcfg.norm_before_residual,
        "target_layers": target.num_layers,
        "target_arch": target.arch,
        "target_path": cfg.target.path or None,
        "ttt_steps": cfg.loss.ttt_steps,
    }


def read_draft_shape(run_dir: str | Path) -> tuple[em.Eagle3Config, dict]:
    """(the draft's config, the rest of eagle3.json) a run recorded."""
    info = json.loads((Path(run_dir) / DRAFT_FILE).read_text())
    layer = from_dict(ModelConfig, info["layer"])
    dcfg = em.Eagle3Config(
        layer,
        info["draft_vocab_size"],
        info["target_hidden_size"],
        tuple(info["aux_layers"]),
        info["norm_before_residual"],
    )
    return dcfg, info


def _dev_eval(cfg: Eagle3TrainConfig, config, dcfg, target_params, consts, tokenizer, log):
    """Per-step loss and accuracy on fixed dev batches (the data sources' dev split, the target run live)."""
    from lsjax.train.inputs import dev_batches

    batches = dev_batches(cfg, config, tokenizer, log=log)
    live = {**consts, "target": target_params}

    @jax.jit
    def sums(params, batch):
        def one(carry, micro):
            s = ttt_losses(params, live, config, dcfg, cfg, micro)
            return jax.tree.map(jnp.add, carry, s), None

        zeros = {k: jnp.zeros((cfg.loss.ttt_steps,), jnp.float32) for k in SUMS}
        return jax.lax.scan(one, zeros, batch)[0]

    def evaluate(params) -> dict:
        got = [jax.device_get(sums(params, b)) for b in batches]
        total = {k: sum(g[k] for g in got) for k in got[0]}
        w = np.maximum(total["mask"], 1.0)
        out = {
            "dev_ce": float(total["ploss"][0] / max(total["weight"][0], 1.0)),
            "dev_acc": float(total["correct"][0] / w[0]),
        }
        return out | {f"dev_acc_{j}": float(total["correct"][j] / w[j]) for j in range(cfg.loss.ttt_steps)}

    return evaluate
