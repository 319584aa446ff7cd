"""Training TokenSwift's heads from the shared target-feature cache (`python train.py --config
configs/train/smollm2-tokenswift.yaml`, a config with `kind: tokenswift-heads`).

The target never runs: each batch reads the cached final hidden states `hidden` [B, T, D] and `tokens`
(`lsjax.train.feature_cache.FeatureCache`; `loss_mask`, and `topk_ids` / `topk_logprobs` for distillation).
Head i (1-based) at position t guesses token t + 1 + i:

    ce_i       = -log q_i(tokens[t + 1 + i] | h_t)                        weighted by loss_mask[t + 1 + i]
    distill_i  = -sum_j p_j log q_i(topk_ids[t + i, j] | h_t)            p = softmax(topk_logprobs[t + i])

(the cached top-k at position t + i is the target's own distribution for token t + 1 + i). The LM head is
the target's, frozen; the logits are computed in chunks of positions under `jax.checkpoint`, so [B, T, V]
never exists. Optimizer, schedule, checkpoints (exact resume: params, optimizer, step, RNG, the sampler's
position) and the step loop are every trainer's (`lsjax.train.step`, `.checkpoint`, `.runner`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from lsjax.config import _check, _positive_int
from lsjax.methods.tokenswift import model as th
from lsjax.train.config import RunConfig, TargetConfig
from lsjax.train.inputs import epoch_order
from lsjax.train.step import TrainState, accumulate_grads, apply_grads, init_state, lr_schedule, make_optimizer

KIND = "tokenswift-heads"


@dataclasses.dataclass(frozen=True)
class FeatureDataConfig:
    """Which feature-cache sets to read, and how to batch them."""

    root: str = ""  # the sets' parent directory; "" = $LSJAX_FEATURES or ~/.cache/lsjax/features
    sets: tuple[str, ...] = ("text-2048",)
    seq_len: int = 0  # a random window of this many tokens per sequence (0 = the whole cached sequence)
    batch_size: int = 4
    grad_accum: int = 1
    max_sequences: int = 0  # use only the first N sequences of each set (0 = all)
    dev_sequences: int = 0  # hold out the last N sequences of the first set for dev evaluation
    seed: int = 0

    def __post_init__(self):
        _check(isinstance(self.sets, tuple) and len(self.sets) > 0, "data.sets", "must be a non-empty list")
        _check(self.seq_len == 0 or self.seq_len >= 8, "data.seq_len", f"must be 0 or >= 8, got {self.seq_len}")
        _positive_int(self.batch_size, "data.batch_size")
        _positive_int(self.grad_accum, "data.grad_accum")
        _check(self.max_sequences >= 0, "data.max_sequences", f"must be >= 0, got {self.max_sequences}")
        _check(self.dev_sequences >= 0, "data.dev_sequences", f"must be >= 0, got {self.dev_sequences}")


@dataclasses.dataclass(frozen=True)
class HeadsLossConfig:
    ce_weight: float = 1.0
    distill_weight: float = 0.0  # toward the target's cached top-k
    head_decay: float = 1.0  # head i's loss weighs head_decay ** (i - 1) (Medusa uses 0.8)
    chunk_size: int = 64  # positions per LM-head chunk: [B, chunk, heads, V] is the largest logits block

    def __post_init__(self):
        _check(self.ce_weight >= 0 and self.distill_weight >= 0, "loss.ce_weight", "weights must be >= 0")
        _check(self.ce_weight + self.distill_weight > 0, "loss.ce_weight", "ce_weight + distill_weight must be > 0")
        _check(0 < self.head_decay <= 1, "loss.head_decay", f"must be in (0, 1], got {self.head_decay}")
        _positive_int(self.chunk_size, "loss.chunk_size")


@dataclasses.dataclass(frozen=True)
class HeadsTrainConfig(RunConfig):
    name: str = "tokenswift-heads"
    kind: str = KIND
    target: TargetConfig = TargetConfig()
    heads: th.HeadsConfig = th.HeadsConfig()
    data: FeatureDataConfig = FeatureDataConfig()
    loss: HeadsLossConfig = HeadsLossConfig()

    def __post_init__(self):
        _check(self.kind == KIND, "kind", f"must be {KIND!r}, got {self.kind!r}")
        super().__post_init__()


# ------------------------------------------------------------------------------------------------ data


def features_root(cfg: FeatureDataConfig) -> Path:
    path = cfg.root or os.environ.get("LSJAX_FEATURES") or Path.home() / ".cache" / "lsjax" / "features"
    return Path(path).expanduser()


def open_feature_set(directory: Path):
    """The shared cache reader (`lsjax.train.feature_cache`); tests pass their own opener."""
    from lsjax.train.feature_sets import FeatureCache

    # A set grows across sessions (its build resumes); training reads the shards finished so far, as the
    # LongSpec and block trainers do.
    return FeatureCache.open(directory, allow_partial=True)


class FeatureBatches:
    """Seeded, resumable batches over one or more feature sets. State: {"epoch", "pos"} (JSON)."""

    def __init__(self, caches: list, cfg: FeatureDataConfig, fields: tuple[str, ...], split: str = "train"):
        self.caches, self.cfg, self.fields = caches, cfg, fields
        index = []
        for c, cache in enumerate(caches):
            n = cache.num_sequences if not cfg.max_sequences else min(cfg.max_sequences, cache.num_sequences)
            lo, hi = 0, n
            if c == 0 and cfg.dev_sequences:
                lo, hi = (0, n - cfg.dev_sequences) if split == "train" else (n - cfg.dev_sequences, n)
            index += [(c, i) for i in range(lo, hi)]
        if not index:
            raise ValueError(f"data: no {split} sequences in sets {', '.join(cfg.sets)}")
        self.index = np.asarray(index, np.int64)
        self.seq_len = min(cache.seq_len for cache in caches)
        self.window = cfg.seq_len or self.seq_len
        _check(self.window <= self.seq_len, "data.seq_len", f"must be <= the cached {self.seq_len} tokens")
        self.state = {"epoch": 0, "pos": 0}

    def _order(self, epoch: int) -> np.ndarray:
        return epoch_order(self.cfg.seed, epoch, len(self.index))

    def get_state(self) -> dict:
        return dict(self.state)

    def set_state(self, state: dict) -> None:
        self.state = dict(state)

    def read(self, rows: np.ndarray, key: tuple) -> dict:
        """Sequences `rows` (indices into self.index), each cut to a window at a seeded offset."""
        rng = np.random.default_rng([self.cfg.seed, *key])
        out = {f: [] for f in self.fields}
        for c in np.unique(self.index[rows, 0]):
            pick = rows[self.index[rows, 0] == c]
            got = self.caches[c].read(self.index[pick, 1], self.fields)
            for f in self.fields:
                out[f].append(np.asarray(got[f]))
        batch = {f: np.concatenate(v) for f, v in out.items()}
        starts = rng.integers(0, self.seq_len - self.window + 1, size=len(rows))
        take = starts[:, None] + np.arange(self.window)[None]
        return {
            f: np.take_along_axis(a, take.reshape(take.shape + (1,) * (a.ndim - 2)), axis=1) for f, a in batch.items()
        }

    def next(self) -> dict:
        """One step: every field [A, B, T, ...] for A = grad_accum micro-batches of B sequences."""
        A, B = self.cfg.grad_accum, self.cfg.batch_size
        rows = []
        while len(rows) < A * B:
            order = self._order(self.state["epoch"])
            take = order[self.state["pos"] : self.state["pos"] + A * B - len(rows)]
            rows += take.tolist()
            self.state["pos"] += len(take)
            if self.state["pos"] >= len(order):
                self.state = {"epoch": self.state["epoch"] + 1, "pos": 0}
        batch = self.read(np.asarray(rows), (self.state["epoch"], self.state["pos"]))
        return {f: a.reshape(A, B, *a.shape[1:]) for f, a in batch.items()}


# ------------------------------------------------------------------------------------------------ loss


def heads_losses(params, target_params, config, micro: dict, loss_cfg: HeadsLossConfig, num_heads: int) -> dict:
    """Per-head weighted sums over one micro-batch: {"ce", "distill", "correct", "weight"} each [Hn]."""
    h = micro["hidden"].astype(jnp.float32)  # [B, T, D]
    tokens = micro["tokens"]
    mask = micro.get("loss_mask", jnp.ones_like(tokens)).astype(jnp.float32)
    B, T, _ = h.shape
    C = min(loss_cfg.chunk_size, T)
    n = -(-T // C)
    pad = n * C - T
    target_params = jax.lax.stop_gradient(target_params)
    distill = loss_cfg.distill_weight > 0
    heads = th.TokenSwiftHeads(config, th.HeadsConfig(num_heads))

    def shifted(x, i, fill=0):  # x[t + i] at position t (fill past the end)
        return jnp.concatenate([x[:, i:], jnp.full((B, i) + x.shape[2:], fill, x.dtype)], axis=1)

    labels = jnp.stack([shifted(tokens, 1 + i) for i in range(1, num_heads + 1)], axis=2)  # [B, T, Hn]
    weights = jnp.stack([shifted(mask, 1 + i) for i in range(1, num_heads + 1)], axis=2)
    xs = {"h": h, "y": labels, "w": weights}
    if distill:
        xs["tid"] = jnp.stack([shifted(micro["topk_ids"], i) for i in range(1, num_heads + 1)], axis=2)
        xs["tlp"] = jnp.stack(
            [shifted(micro["topk_logprobs"].astype(jnp.float32), i, -jnp.inf) for i in range(1, num_heads + 1)],
            axis=2,
        )

    def chunked(x):
        x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
        return x.reshape(B, n, C, *x.shape[2:]).swapaxes(0, 1)

    @jax.checkpoint
    def chunk(c):
        logits = heads.apply({"params": params}, c["h"], target_params)  # [B, C, Hn, V]
        logp = jax.nn.log_softmax(logits, axis=-1)
        picked = jnp.take_along_axis(logp, c["y"][..., None], axis=-1)[..., 0]
        out = {
            "ce": -jnp.sum(picked * c["w"], axis=(0, 1)),
            "correct": jnp.sum((jnp.argmax(logits, -1) == c["y"]) * c["w"], axis=(0, 1)),
            "weight": jnp.sum(c["w"], axis=(0, 1)),
            "distill": jnp.zeros((num_heads,)),
        }
        if distill:
            p = jax.nn.softmax(c["tlp"], axis=-1)  # the target's top-k, renormalised
            p = jnp.where(jnp.isfinite(c["tlp"]), p, 0.0)
            q = jnp.take_along_axis(logp, c["tid"], axis=-1)
            out["distill"] = -jnp.sum(jnp.sum(p * q, -1) * c["w"], axis=(0, 1))
        return out

    per_chunk = jax.lax.map(chunk, jax.tree.map(chunked, xs))
    return jax.tree.map(lambda a: jnp.sum(a, axis=0), per_chunk)


def make_heads_step(config, cfg: HeadsTrainConfig, optimizer):
    """The pure step `(state, target_params, batch) -> (state, metrics)`; batch fields are [A, B, T, ...]."""
    Hn = cfg.heads.num_heads
    decay = jnp.asarray([cfg.loss.head_decay**i for i in range(Hn)], jnp.float32)
    schedule = lr_schedule(cfg.optim)

    def objective(sums, total_w):
        per_head = cfg.loss.ce_weight * sums["ce"] + cfg.loss.distill_weight * sums["distill"]
        return jnp.sum(decay * per_head / total_w)

    def step(state: TrainState, target_params, batch):
        total_w = jnp.maximum(_head_weight(batch, Hn), 1.0)

        def loss_fn(p, micro):
            sums = heads_losses(p, target_params, config, micro, cfg.loss, Hn)
            return objective(sums, total_w), sums

        zeros = {k: jnp.zeros((Hn,), jnp.float32) for k in ("ce", "distill", "correct", "weight")}
        grads, sums = accumulate_grads(loss_fn, state.params, batch, zeros)
        w = jnp.maximum(sums["weight"], 1.0)
        metrics = {"loss": objective(sums, total_w), "grad_norm": optax.tree.norm(grads), "lr": schedule(state.step)}
        for i in range(Hn):
            metrics |= {f"ce{i + 1}": sums["ce"][i] / w[i], f"acc{i + 1}": sums["correct"][i] / w[i]}
            if cfg.loss.distill_weight > 0:
                metrics[f"distill{i + 1}"] = sums["distill"][i] / w[i]
        return apply_grads(state, grads, optimizer), metrics

    return step


def _head_weight(batch: dict, Hn: int) -> jax.Array:
    """The step's loss normaliser: every head's target tokens, summed (known before any forward)."""
    mask = batch.get("loss_mask", jnp.ones_like(batch["tokens"])).astype(jnp.float32)
    return sum(jnp.sum(mask[..., 1 + i :]) for i in range(1, Hn + 1)) / Hn


# ------------------------------------------------------------------------------------------------- fit


def fit_heads(cfg: HeadsTrainConfig, *, open_set: Callable = open_feature_set, **run) -> dict:
    """Runs (or resumes) a heads training run (`lsjax.train.runner.fit`): <run_dir>/metrics.jsonl, checkpoints/
    and config.yaml. `open_set(directory)` opens one feature set."""
    from lsjax.train.runner import fit

    return fit(cfg, lambda cfg, open_run_dir, log: _setup(cfg, open_run_dir, log, open_set), **run)


def _setup(cfg: HeadsTrainConfig, open_run_dir, log, open_set):
    from lsjax.train.inputs import load_target
    from lsjax.train.runner import Job

    open_run_dir()
    config, target_params, _ = load_target(cfg)
    head_params = {k: target_params[k] for k in ("embed", "lm_head", "final_norm") if k in target_params}
    fields = ("hidden", "tokens", "loss_mask") + (("topk_ids", "topk_logprobs") if cfg.loss.distill_weight else ())
    caches = [open_set(features_root(cfg.data) / name) for name in cfg.data.sets]
    data = FeatureBatches(caches, cfg.data, fields)
    log(f"data: {len(data.index)} sequences of {data.window} tokens from {', '.join(cfg.data.sets)}")

    optimizer = make_optimizer(cfg.optim)
    heads_step = make_heads_step(config, cfg, optimizer)
    evaluate = None
    if cfg.data.dev_sequences and cfg.log.eval_every:
        evaluate = _dev_eval(config, cfg, head_params, FeatureBatches(caches, cfg.data, fields, split="dev"))
    d = cfg.data
    return Job(
        init_state(th.TokenSwiftHeads(config, cfg.heads).untrained_weights(head_params["final_norm"]), optimizer),
        lambda state, consts, batch, key: heads_step(state, consts, batch),  # the step draws nothing
        head_params,
        data,
        jax.random.PRNGKey(cfg.seed),  # unused by the step; checkpointed like every trainer's
        tokens_per_step=d.batch_size * d.grad_accum * data.window,
        evaluate=evaluate,
    )


def _dev_eval(config, cfg: HeadsTrainConfig, head_params, dev: FeatureBatches):
    """Per-head CE and accuracy on fixed dev batches (the held-out tail of the first set)."""
    Hn = cfg.heads.num_heads
    n = min(cfg.log.eval_batches, -(-len(dev.index) // cfg.data.batch_size))
    batches = [
        dev.read(np.arange(i * cfg.data.batch_size, min((i + 1) * cfg.data.batch_size, len(dev.index))), (1 << 30, i))
        for i in range(n)
    ]
    losses = jax.jit(lambda p, b: heads_losses(p, head_params, config, b, cfg.loss, Hn))

    def evaluate(params) -> dict:
        sums = [jax.device_get(losses(params, b)) for b in batches]
        w = np.maximum(sum(s["weight"] for s in sums), 1.0)
        ce, acc = sum(s["ce"] for s in sums) / w, sum(s["correct"] for s in sums) / w
        return {f"dev_ce{i + 1}": float(ce[i]) for i in range(Hn)} | {
            f"dev_acc{i + 1}": float(acc[i]) for i in range(Hn)
        }

    return evaluate


def export_heads(cfg: HeadsTrainConfig, out_dir: str | Path) -> dict:
    """A run's latest checkpoint -> a heads directory (`decode.py --method tokenswift --heads DIR`; ship it
    as lsjax/drafts/<target>/tokenswift to make it the default)."""
    from lsjax.methods.longspec.checkpoint import DEFAULT_TARGET, target_key
    from lsjax.methods.tokenswift.checkpoint import save_heads
    from lsjax.train.checkpoint import load_draft_params
    from lsjax.train.runner import training_summary

    run_dir = Path(cfg.resolved_run_dir)
    params = {k: np.asarray(v) for k, v in load_draft_params(run_dir).items()}
    name = target_key(cfg.target.path) if cfg.target.path else DEFAULT_TARGET
    save_heads(out_dir, params, cfg.heads, name, {"run_dir": str(run_dir), "training": training_summary(run_dir)})
    return params


def export_kind(cfg, out_dir, *, config_path: str | None = None, tree: str | None = None) -> dict:
    """`train.py --export` of a heads run -> a heads directory."""
    return {"tensors": len(export_heads(cfg, out_dir))}
