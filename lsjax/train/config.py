"""The sections every trainer's config may share (`python train.py --config configs/train/X.yaml`).

One frozen config per concern, each mapping one-to-one onto a YAML section and validated in `__post_init__`
(errors name the field and its allowed range). `RunConfig` is the base of every trainer's config (the run,
optimizer, checkpoint and log sections the step loop reads); `TargetConfig`, `DataConfig`, `PositionConfig`
and `FeatureCacheConfig` are what the scaffold's target loader, data pipeline and feature cache read. A kind's
own config (its draft, loss and `kind:`) lives in its method's folder, which registers it
(`lsjax.methods.registry.register_kind`); the model, draft and mesh configs live in `lsjax.config`.
"""

from __future__ import annotations

import dataclasses

from lsjax.config import DTYPES, ModelConfig, _check, _positive_int

DATA_SOURCES = ("stdlib", "sotu", "sharegpt", "champ", "synthetic")


@dataclasses.dataclass(frozen=True)
class TargetConfig:
    """Which frozen target the draft learns from."""

    path: str = ""  # .gguf file or HF directory; "" = the bundled SmolLM2-135M-Instruct
    preset: str = ""  # a configs/models/*.yaml; used for random_init (and documents the shapes of paper configs)
    model: ModelConfig | None = None  # inline shapes for random_init (tests); wins over preset
    random_init: bool = False  # random weights (tests, smoke runs without a checkpoint)
    dtype: str = "float32"

    def __post_init__(self):
        _check(self.dtype in DTYPES, "target.dtype", f"must be one of {'|'.join(DTYPES)}, got {self.dtype!r}")
        _check(
            not self.random_init or self.model is not None or bool(self.preset),
            "target.random_init",
            "needs target.model or target.preset for the shapes",
        )


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Token streams from lsjax.corpora, packed into [B, T] sequences."""

    sources: tuple[str, ...] = ("stdlib", "sotu")
    split: str = "train"  # train | dev (document-level split of lsjax.corpora)
    split_seed: int = 0
    dev_fraction: float = 0.1
    seq_len: int = 256  # T
    batch_size: int = 8  # sequences per micro-batch (global, over all devices)
    grad_accum: int = 1  # micro-batches per optimizer step
    chat: bool = False  # SFT: render dialogues with the chat template, loss on assistant tokens only
    max_docs: int = 0  # per source; 0 = all (smoke runs)
    max_sequences: int = 0  # a seeded random subset of the packed sequences; 0 = all (a token budget)
    seed: int = 0  # shuffling and offsets
    cache_dir: str = ""  # tokenized corpora; "" = ~/.cache/lsjax/tokens
    synthetic_tokens: int = 65536  # length of the random stream for source "synthetic"
    # A self-distilled set (`lsjax.cli.distill`, `tools/device/device_job.py`): its rows ([N, seq_len], loss on
    # the target's answers) are the training sequences; data.sources then feed only the dev loss. "" = off.
    distilled: str = ""

    def __post_init__(self):
        _check(isinstance(self.sources, tuple) and len(self.sources) > 0, "data.sources", "must be a non-empty list")
        for s in self.sources:
            _check(s in DATA_SOURCES, "data.sources", f"unknown source {s!r}; choose from {', '.join(DATA_SOURCES)}")
        _check(self.split in ("train", "dev"), "data.split", f"must be train|dev, got {self.split!r}")
        _check(0 < self.dev_fraction < 1, "data.dev_fraction", f"must be in (0, 1), got {self.dev_fraction}")
        _check(
            isinstance(self.seq_len, int) and self.seq_len >= 8,
            "data.seq_len",
            f"must be an integer >= 8, got {self.seq_len!r}",
        )
        _positive_int(self.batch_size, "data.batch_size")
        _positive_int(self.grad_accum, "data.grad_accum")
        _check(self.max_docs >= 0, "data.max_docs", f"must be >= 0 (0 = all), got {self.max_docs}")
        _check(
            isinstance(self.max_sequences, int) and self.max_sequences >= 0,
            "data.max_sequences",
            f"must be an integer >= 0 (0 = all), got {self.max_sequences!r}",
        )
        _positive_int(self.synthetic_tokens, "data.synthetic_tokens")
        _check(
            not (self.chat and "synthetic" in self.sources),
            "data.chat",
            "dialogue SFT needs dialogue sources (sharegpt, champ), not synthetic",
        )


@dataclasses.dataclass(frozen=True)
class PositionConfig:
    """Anchor-offset indices, drawn per sequence by the data pipeline (`lsjax.train.data.batches`): the first
    `num_anchors` positions stay, the rest get + offset."""

    anchor_offset: bool = False
    num_anchors: int = 4
    max_len: int = 0  # offsets ~ U[0, max_len - seq_len]; 0 = the target's max_position

    def __post_init__(self):
        _check(self.num_anchors >= 0, "positions.num_anchors", f"must be >= 0, got {self.num_anchors}")
        _check(self.max_len >= 0, "positions.max_len", f"must be >= 0 (0 = the target's), got {self.max_len}")


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """optax AdamW with linear warmup then cosine decay to min_lr_ratio * lr, global-norm clipping."""

    lr: float = 5e-4
    warmup_steps: int = 100
    total_steps: int = 1000  # optimizer steps of the run (the schedule's length)
    min_lr_ratio: float = 0.1
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1
    clip_norm: float = 1.0  # 0 = off

    def __post_init__(self):
        _check(0 < self.lr < 1, "optim.lr", f"must be in (0, 1), got {self.lr}")
        _check(self.warmup_steps >= 0, "optim.warmup_steps", f"must be >= 0, got {self.warmup_steps}")
        _positive_int(self.total_steps, "optim.total_steps")
        _check(
            self.warmup_steps < self.total_steps,
            "optim.warmup_steps",
            f"must be < optim.total_steps ({self.total_steps}), got {self.warmup_steps}",
        )
        _check(0 <= self.min_lr_ratio <= 1, "optim.min_lr_ratio", f"must be in [0, 1], got {self.min_lr_ratio}")
        _check(0 <= self.b1 < 1, "optim.b1", f"must be in [0, 1), got {self.b1}")
        _check(0 <= self.b2 < 1, "optim.b2", f"must be in [0, 1), got {self.b2}")
        _check(self.eps > 0, "optim.eps", f"must be > 0, got {self.eps}")
        _check(self.weight_decay >= 0, "optim.weight_decay", f"must be >= 0, got {self.weight_decay}")
        _check(self.clip_norm >= 0, "optim.clip_norm", f"must be >= 0 (0 = off), got {self.clip_norm}")


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    every: int = 200  # optimizer steps between checkpoints (and one at the end)
    keep: int = 3
    init_from: str = ""  # a previous stage's run or checkpoint dir: its draft params start this run

    def __post_init__(self):
        _positive_int(self.every, "checkpoint.every")
        _positive_int(self.keep, "checkpoint.keep")


@dataclasses.dataclass(frozen=True)
class FeatureCacheConfig:
    """Precompute the frozen target's features once (npy memmaps) and reuse them every epoch.

    Stores last-layer K/V, the target's argmax and (for a kind that distills through KL) its final hidden
    state per packed sequence; anchor offsets are then fixed per sequence (drawn once from data.seed).
    """

    enabled: bool = False
    dir: str = ""  # "" = <run_dir>/features
    # Sets of the shared target-feature cache (lsjax.train.feature_cache), comma-separated: names under the
    # cache root or paths. Training data and target features then come from them (data.sources is not read;
    # data.seq_len must match); their complete shards at start are used (data.max_sequences caps the total),
    # or `name:N` takes a set's first N sequences.
    set: str = ""
    batch_size: int = 4  # sequences per target forward while building

    def __post_init__(self):
        _positive_int(self.batch_size, "features.batch_size")


@dataclasses.dataclass(frozen=True)
class LogConfig:
    every: int = 1  # steps between JSONL records
    eval_every: int = 0  # steps between dev-loss evaluations; 0 = off
    eval_batches: int = 4
    tensorboard: bool = True  # when tensorboardX / tensorboard is installed
    plot: bool = True  # loss-curve PNG at the end
    progress: bool = True  # tqdm bar

    def __post_init__(self):
        _positive_int(self.every, "log.every")
        _check(self.eval_every >= 0, "log.eval_every", f"must be >= 0 (0 = off), got {self.eval_every}")
        _positive_int(self.eval_batches, "log.eval_batches")


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """The run section every trainer's config starts with (a base class: its fields stay top-level in the YAML):
    where the run lives, its seed and length, and the optimizer, checkpoint and log sections the shared step
    loop (`lsjax.train.runner`) reads."""

    name: str = "draft"
    run_dir: str = ""  # "" = runs/<name>
    seed: int = 0  # parameter init and per-step keys
    steps: int = 0  # optimizer steps to run; 0 = optim.total_steps
    max_minutes: float = 0.0  # stop (with a checkpoint) after this much training wall time; 0 = no limit
    optim: OptimConfig = OptimConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    log: LogConfig = LogConfig()

    def __post_init__(self):
        _check(
            bool(self.name) and "/" not in self.name, "name", f"must be a non-empty name without '/', got {self.name!r}"
        )
        _check(self.steps >= 0, "steps", f"must be >= 0 (0 = optim.total_steps), got {self.steps}")
        _check(self.max_minutes >= 0, "max_minutes", f"must be >= 0 (0 = no limit), got {self.max_minutes}")
        _check(
            self.steps <= self.optim.total_steps,
            "steps",
            f"must be <= optim.total_steps ({self.optim.total_steps}), got {self.steps}",
        )

    @property
    def num_steps(self) -> int:
        return self.steps or self.optim.total_steps

    @property
    def resolved_run_dir(self) -> str:
        return self.run_dir or f"runs/{self.name}"
