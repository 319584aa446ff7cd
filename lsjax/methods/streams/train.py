"""Training Speculative Streaming's streams (lossless mode) from the shared target-feature cache.

    python train.py --config configs/train/smollm2-streams.yaml [--resume] [--export DIR]

The target stays frozen and mostly unrun: a batch is a few sequences of the feature cache (`tokens`,
`loss_mask`, `mid_hidden` = the residual entering layer L = N - N_s, `topk_ids`). The step runs only the top
N_s layers:

* the main stream from `mid_hidden` over every position (no gradient): the keys and values each stream
  attends to at those layers;
* the gamma streams at `positions` query positions per sequence drawn among the supervised ones (streams at
  different positions never interact, so the others are not computed: the paper's segment attention (App. I)
  saves memory the same way);
* loss = sum_j alpha_j CE(stream j at t, label at t + 1 + j) / sum of weights, plus `exit_weight` x the
  early-exit adapter's next-token CE at the same positions. Labels are the target's own argmax continuation
  (`labels: target`, what verification accepts) or the data (`labels: data`).

Only the stream params (stream embeddings, stream adapters, the early-exit adapter: `SpeculativeStreams`'s
variables, run through its `apply`) are optimised. The run resumes exactly (orbax: params, optimizer, step,
RNG, data position) and exports a stream checkpoint (`lsjax.methods.streams.drafter.save_streams`) that
`decode.py --method streams` finds.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from lsjax.config import ConfigError, ModelConfig, _check, _positive_int
from lsjax.methods.streams import model as ss
from lsjax.models import target as target_lib
from lsjax.train.config import CheckpointConfig, LogConfig, OptimConfig, RunConfig, TargetConfig
from lsjax.train.inputs import epoch_order

LABELS = ("target", "data")
KIND = "streams"  # the config's `kind:` (`lsjax.methods.registry.register_kind`)


@dataclasses.dataclass(frozen=True)
class StreamsDataConfig:
    set: str = "chat-2048"  # feature-cache set(s), comma-separated: names under the cache root or paths
    seq_len: int = 2048  # must equal the set's
    batch_size: int = 1  # sequences per micro-batch
    grad_accum: int = 4
    positions: int = 128  # stream query positions per sequence
    max_sequences: int = 0  # 0 = every complete sequence of the set(s)

    def __post_init__(self):
        _check(isinstance(self.set, str) and bool(self.set), "data.set", "must name a feature-cache set")
        for f in ("seq_len", "batch_size", "grad_accum", "positions"):
            _positive_int(getattr(self, f), f"data.{f}")
        _check(self.max_sequences >= 0, "data.max_sequences", f"must be >= 0 (0 = all), got {self.max_sequences}")


@dataclasses.dataclass(frozen=True)
class StreamsLossConfig:
    alphas: tuple[float, ...] = ()  # per stream; () = 1.0 each
    exit_weight: float = 1.0  # the early-exit (pruning) adapter's next-token loss
    labels: str = "target"
    chunk_size: int = 128  # rows per LM-head chunk

    def __post_init__(self):
        _check(all(a >= 0 for a in self.alphas), "loss.alphas", f"must be >= 0, got {self.alphas}")
        _check(self.exit_weight >= 0, "loss.exit_weight", f"must be >= 0, got {self.exit_weight}")
        _check(self.labels in LABELS, "loss.labels", f"must be one of {'|'.join(LABELS)}, got {self.labels!r}")
        _positive_int(self.chunk_size, "loss.chunk_size")


@dataclasses.dataclass(frozen=True)
class StreamsTrainConfig(RunConfig):
    name: str = "streams"
    optim: OptimConfig = OptimConfig(lr=5e-4, warmup_steps=20, total_steps=500, weight_decay=0.0)
    checkpoint: CheckpointConfig = CheckpointConfig(every=50)
    log: LogConfig = LogConfig(tensorboard=False)
    kind: str = KIND
    target: TargetConfig = TargetConfig()
    streams: ss.StreamsConfig = ss.StreamsConfig()
    data: StreamsDataConfig = StreamsDataConfig()
    loss: StreamsLossConfig = StreamsLossConfig()
    tree: str = ""  # the decode tree stored with the export ("" = the drafter's default)

    def __post_init__(self):
        _check(self.kind == KIND, "kind", f"must be {KIND!r}, got {self.kind!r}")
        super().__post_init__()
        _check(
            not self.loss.alphas or len(self.loss.alphas) == self.streams.num_streams,
            "loss.alphas",
            f"needs one weight per stream ({self.streams.num_streams}), got {len(self.loss.alphas)}",
        )


# ----------------------------------------------------------------------------- the loss


def sample_positions(key: jax.Array, loss_mask: jax.Array, num: int) -> jax.Array:
    """[B, num] query positions t, uniform without replacement among those whose first stream label
    (t + 2) is supervised, falling back to any position with a label when there are fewer."""
    B, T = loss_mask.shape
    t = jnp.arange(T)
    supervised = jnp.zeros((B, T), bool).at[:, : T - 2].set(loss_mask[:, 2:] > 0)
    score = jnp.where(supervised, 0.0, -1e9) + jnp.where(t < T - 2, 0.0, -2e9)[None]
    noise = jax.random.gumbel(key, (B, T))
    return jax.lax.top_k(score + noise, min(num, T - 2))[1].astype(jnp.int32)


def _chunked_ce(target_params, config, h, labels, weights, chunk: int):
    """Weighted CE sums over rows h [R, D] (LM head in chunks, rematerialised in the backward pass):
    (ce_sum, correct_sum)."""
    R = h.shape[0]
    n = -(-R // chunk)
    pad = n * chunk - R
    h = jnp.pad(h, ((0, pad), (0, 0))).reshape(n, chunk, -1)
    labels = jnp.pad(labels, (0, pad)).reshape(n, chunk)
    weights = jnp.pad(weights, (0, pad)).reshape(n, chunk)

    @jax.checkpoint
    def one(x):
        hc, yc, wc = x
        logits = target_lib.Transformer(config).apply({"params": target_params}, hc, method="logits")
        logp = jax.nn.log_softmax(logits, axis=-1)
        picked = jnp.take_along_axis(logp, yc[:, None], axis=1)[:, 0]
        right = jnp.argmax(logp, axis=-1) == yc
        return -jnp.sum(picked * wc), jnp.sum(right * wc)

    ce, right = jax.lax.map(one, (h, labels, weights))
    return jnp.sum(ce), jnp.sum(right)


def stream_losses(stream_params, target_params, config: ModelConfig, cfg: StreamsTrainConfig, batch, key) -> dict:
    """Per-stream and early-exit weighted sums for one micro-batch: {"ce_j", "acc_j", "w_j", "exit_ce", ...}.

    batch: tokens, loss_mask [B, T]; mid_hidden [B, T, D]; topk_ids [B, T, k] (the target's argmax first)."""
    scfg, lcfg = cfg.streams, cfg.loss
    S = scfg.num_streams
    L = scfg.first_layer(config)
    mid = batch["mid_hidden"].astype(jnp.dtype(config.dtype))
    B, T, D = mid.shape
    pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    # The frozen main stream: its keys and values at the top layers, no gradient.
    _, mk, mv = jax.lax.stop_gradient(ss.main_top_layers(target_params, config, scfg, mid, pos))
    q = sample_positions(key, batch["loss_mask"], cfg.data.positions)  # [B, P]
    mid_q = jnp.take_along_axis(mid, q[:, :, None], axis=1)
    streams = functools.partial(ss.SpeculativeStreams(config, scfg).apply, {"params": stream_params})
    s = streams(target_params, mid_q, q, ss.causal_main_kv(mk, mv, q, L))
    # Labels: the token at t + 1 + j. "target": the target's argmax after t + j (its own continuation).
    if lcfg.labels == "target":
        nxt = batch["topk_ids"][..., 0]  # [B, T]: the token the target predicts after each position
        label_at = lambda t: jnp.take_along_axis(nxt, jnp.clip(t - 1, 0, T - 1), axis=1)  # noqa: E731
    else:
        label_at = lambda t: jnp.take_along_axis(batch["tokens"], jnp.clip(t, 0, T - 1), axis=1)  # noqa: E731
    mask = batch["loss_mask"].astype(jnp.float32)
    out = {}
    for j in range(1, S + 1):
        t = q + 1 + j
        w = jnp.where(t < T, jnp.take_along_axis(mask, jnp.clip(t, 0, T - 1), axis=1), 0.0)
        ce, right = _chunked_ce(
            target_params,
            config,
            s[:, :, j - 1].reshape(-1, D),
            label_at(t).reshape(-1),
            w.reshape(-1),
            lcfg.chunk_size,
        )
        out |= {f"ce_{j}": ce, f"acc_{j}": right, f"w_{j}": jnp.sum(w)}
    # The early-exit adapter: the next token from the residual entering layer L.
    t = q + 1
    w = jnp.take_along_axis(mask, jnp.clip(t, 0, T - 1), axis=1)
    ce, right = _chunked_ce(
        target_params,
        config,
        streams(mid_q, method="exit_hidden").reshape(-1, D),
        label_at(t).reshape(-1),
        w.reshape(-1),
        lcfg.chunk_size,
    )
    return out | {"exit_ce": ce, "exit_acc": right, "exit_w": jnp.sum(w)}


def _objective(sums: dict, cfg: StreamsTrainConfig) -> jax.Array:
    S = cfg.streams.num_streams
    alphas = cfg.loss.alphas or (1.0,) * S
    loss = sum(a * sums[f"ce_{j}"] / jnp.maximum(sums[f"w_{j}"], 1.0) for j, a in zip(range(1, S + 1), alphas))
    return loss + cfg.loss.exit_weight * sums["exit_ce"] / jnp.maximum(sums["exit_w"], 1.0)


def make_train_step(config: ModelConfig, cfg: StreamsTrainConfig, optimizer):
    """(state, target_params, batch [A, B, ...], key) -> (state, metrics): gradients for the stream params
    only (the target is an argument, never differentiated), summed over the A micro-batches."""
    import optax

    from lsjax.train.step import apply_grads

    def sums_of(params, target_params, batch, key):
        A = batch["tokens"].shape[0]

        def micro(carry, xs):
            b, k = xs
            out = stream_losses(params, target_params, config, cfg, b, k)
            return jax.tree.map(jnp.add, carry, out), None

        init = jax.eval_shape(
            lambda: stream_losses(params, target_params, config, cfg, jax.tree.map(lambda x: x[0], batch), key)
        )
        zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), init)
        sums, _ = jax.lax.scan(micro, zeros, (batch, jax.random.split(key, A)))
        return sums

    def loss_fn(params, target_params, batch, key):
        sums = sums_of(params, target_params, batch, key)
        return _objective(sums, cfg), sums

    def step(state, target_params, batch, key):
        # One gradient of the whole step's objective: each stream's loss is normalised by its weight over every
        # micro-batch, which the forward computes.
        (loss, sums), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, target_params, batch, key)
        metrics = {"loss": loss, "grad_norm": optax.tree.norm(grads)} | summarize(sums, cfg)
        return apply_grads(state, grads, optimizer), metrics

    return step


def summarize(sums: dict, cfg: StreamsTrainConfig) -> dict:
    out = {}
    for j in range(1, cfg.streams.num_streams + 1):
        w = jnp.maximum(sums[f"w_{j}"], 1.0)
        out |= {f"ce_{j}": sums[f"ce_{j}"] / w, f"acc_{j}": sums[f"acc_{j}"] / w}
    w = jnp.maximum(sums["exit_w"], 1.0)
    return out | {"exit_ce": sums["exit_ce"] / w, "exit_acc": sums["exit_acc"] / w, "acc": out["acc_1"]}


# ----------------------------------------------------------------------------- data


class Batches:
    """Seeded epochs over the feature sets' sequences; the state is one integer (sequences consumed)."""

    FIELDS = ("tokens", "loss_mask", "mid_hidden", "topk_ids")

    def __init__(self, cfg: StreamsTrainConfig, config: ModelConfig):
        from lsjax.train import feature_sets as fcm

        self.fc = fcm.FeatureSets.open(cfg.data.set, cfg.data.max_sequences)
        if self.fc.seq_len != cfg.data.seq_len:
            raise ConfigError(f"data.seq_len: must equal the feature set's {self.fc.seq_len}, got {cfg.data.seq_len}")
        mids = {c.mid_layer for c in self.fc.caches}
        L = cfg.streams.first_layer(config)
        if mids != {L}:
            raise ConfigError(
                f"streams.msa_layers: the feature set stores the residual entering layer {sorted(mids)}, "
                f"the streams start at layer {L} = {config.num_layers} - {cfg.streams.msa_layers}"
            )
        self.n = self.fc.num_sequences
        self.per_step = cfg.data.batch_size * cfg.data.grad_accum
        if self.n < self.per_step:
            raise ConfigError(f"data.set: {self.n} complete sequences, fewer than one step's {self.per_step}")
        self.cfg, self.position = cfg, 0

    def _order(self, epoch: int) -> np.ndarray:
        return epoch_order(self.cfg.seed, epoch, self.n)

    def get_state(self) -> dict:
        return {"position": self.position}

    def set_state(self, state: dict) -> None:
        self.position = int(state["position"])

    def next(self) -> dict:
        idx = []
        while len(idx) < self.per_step:
            epoch, at = divmod(self.position, self.n)
            take = min(self.per_step - len(idx), self.n - at)
            idx.extend(self._order(epoch)[at : at + take].tolist())
            self.position += take
        rows = self.fc.read(np.asarray(idx), self.FIELDS)
        A, B = self.cfg.data.grad_accum, self.cfg.data.batch_size
        return {k: v.reshape(A, B, *v.shape[1:]) for k, v in rows.items()}

    def describe(self) -> str:
        return self.fc.describe()


# ----------------------------------------------------------------------------- the run


def fit_streams(cfg: StreamsTrainConfig, *, target=None, **run) -> dict:
    """Runs (or resumes) a stream-training run (`lsjax.train.runner.fit`: metrics.jsonl, checkpoints/) and, at
    the end, exports the stream checkpoint to <run_dir>/export (`out["export"]`; None for a run cut short).
    `target` = (config, params) replaces `cfg.target` (tests: a tiny target with peaky logits)."""
    from lsjax.train.runner import fit

    out = fit(cfg, lambda cfg, open_run_dir, log: _setup(cfg, open_run_dir, log, target), **run)
    out.setdefault("export", None)
    return out


def _setup(cfg: StreamsTrainConfig, open_run_dir, log, target):
    from lsjax.methods.streams.checkpoint import save_streams
    from lsjax.train.inputs import load_target
    from lsjax.train.runner import Job
    from lsjax.train.step import init_state, make_optimizer

    config, target_params, _ = target if target is not None else load_target(cfg)
    data = Batches(cfg, config)
    log(f"data: {data.n} sequences x {cfg.data.seq_len} tokens from {data.describe()}")
    if cfg.checkpoint.init_from:  # checked against this run's streams config before the run directory is touched
        params = initial_streams(cfg, config)
        log(f"streams: initialised from {cfg.checkpoint.init_from}")
    else:
        params = ss.SpeculativeStreams(config, cfg.streams).random_weights(jax.random.PRNGKey(cfg.seed))
    open_run_dir()
    log(f"streams: {ss.num_params(config, cfg.streams)} trained parameters (the target's {config.num_params()})")
    optimizer = make_optimizer(cfg.optim)
    d = cfg.data

    def finish(out, run_dir) -> dict:
        meta = {"target": config.name, "trained_steps": out["steps"], **({"tree": cfg.tree} if cfg.tree else {})}
        params = jax.device_get(out["state"].params)
        return {"export": str(save_streams(run_dir / "export", params, cfg.streams, meta))}

    return Job(
        init_state(params, optimizer),
        make_train_step(config, cfg, optimizer),
        target_params,
        data,
        jax.random.PRNGKey(cfg.seed),
        tokens_per_step=d.batch_size * d.grad_accum * d.positions * cfg.streams.num_streams,
        finish=finish,
    )


def initial_streams(cfg: StreamsTrainConfig, config: ModelConfig) -> dict:
    """The stream params of `checkpoint.init_from` (a stream checkpoint directory: a previous run's export or
    the shipped one), which must have been trained with this run's `streams` config: a continuation on new
    data starts where that run ended instead of from random stream embeddings."""
    from lsjax.methods.streams.checkpoint import check_streams_fit, load_streams

    params, scfg, _ = load_streams(cfg.checkpoint.init_from)
    if scfg != cfg.streams:
        raise ConfigError(
            f"checkpoint.init_from: its streams config {scfg} differs from this run's streams {cfg.streams}"
        )
    check_streams_fit(params, config, scfg, f"checkpoint {cfg.checkpoint.init_from}")
    return {k: jnp.asarray(v) for k, v in params.items()}


def export_streams(cfg: StreamsTrainConfig, out_dir, config: ModelConfig | None = None) -> Path:
    """The run's latest checkpoint as a stream checkpoint directory."""
    from lsjax.methods.streams.checkpoint import save_streams
    from lsjax.train.checkpoint import load_draft_params

    params = load_draft_params(Path(cfg.resolved_run_dir))
    meta = {"trained_run": cfg.resolved_run_dir, **({"tree": cfg.tree} if cfg.tree else {})}
    if config is not None:
        meta["target"] = config.name
    return save_streams(out_dir, params, cfg.streams, meta)


def export_kind(cfg, out_dir, *, config_path: str | None = None, tree: str | None = None) -> dict:
    """`train.py --export` of a streams run -> a stream checkpoint directory."""
    export_streams(cfg, out_dir)
    return {}
