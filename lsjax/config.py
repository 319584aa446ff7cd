"""Frozen, hashable configs — one per concern — static under `jax.jit`.

Every config validates itself in `__post_init__` and raises `ConfigError`
naming the field and the allowed range. YAML files in `configs/` map onto these
dataclasses with `load_yaml`; unknown keys are errors, and `--set a.b=value`
overrides are applied with `apply_overrides`.

Shape letters used across lsjax (documented once, here):
  B batch, T query length (new tokens / tree size), S cache length (capacity),
  N query heads, K kv heads, G = N // K (query heads per kv head), H head dim,
  D model width, F MLP width, V vocabulary, L layers.
"""

from __future__ import annotations

import dataclasses
import json
import math
import typing
from pathlib import Path
from typing import Any

import yaml

from lsjax.errors import LsjaxError


class ConfigError(LsjaxError, ValueError):
    """A config field is missing, unknown or out of its allowed range."""


def _check(cond: bool, field: str, msg: str) -> None:
    if not cond:
        raise ConfigError(f"{field}: {msg}")


def _positive_int(value: Any, field: str) -> None:
    _check(
        isinstance(value, int) and not isinstance(value, bool) and value > 0,
        field,
        f"must be an integer >= 1, got {value!r}",
    )


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling. `default` leaves the frequencies alone."""

    kind: str = "default"  # default | linear | llama3
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192

    def __post_init__(self):
        _check(
            self.kind in ("default", "linear", "llama3"),
            "rope_scaling.kind",
            f"must be one of default|linear|llama3, got {self.kind!r}",
        )
        _check(self.factor >= 1.0, "rope_scaling.factor", f"must be >= 1, got {self.factor}")
        if self.kind == "llama3":
            _check(
                self.high_freq_factor > self.low_freq_factor > 0,
                "rope_scaling.high_freq_factor",
                "llama3 scaling needs high_freq_factor > low_freq_factor > 0",
            )
            _positive_int(self.original_max_position, "rope_scaling.original_max_position")


ARCHITECTURES = ("llama", "qwen2", "mistral")
DTYPES = ("float32", "bfloat16", "float16")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shapes and numerics of a Llama-family decoder (Llama, Qwen2, Mistral)."""

    arch: str = "llama"
    vocab_size: int = 49152
    hidden_size: int = 576  # D
    intermediate_size: int = 1536  # F
    num_layers: int = 30  # L
    num_heads: int = 9  # N
    num_kv_heads: int = 3  # K
    head_dim: int = 64  # H
    max_position: int = 8192
    rope_theta: float = 100000.0
    rope_scaling: RopeScaling = RopeScaling()
    rms_norm_eps: float = 1e-5
    tie_embeddings: bool = True
    qkv_bias: bool = False
    bos_token_id: int | None = 1
    eos_token_ids: tuple[int, ...] = (2,)
    pad_token_id: int = 2
    dtype: str = "float32"  # activations and weights; fp32 on CPU, bf16 on accelerators
    name: str = "model"

    def __post_init__(self):
        _check(
            self.arch in ARCHITECTURES,
            "arch",
            f"unsupported architecture {self.arch!r}; supported: {', '.join(ARCHITECTURES)}",
        )
        for f in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "max_position",
        ):
            _positive_int(getattr(self, f), f)
        _check(
            self.num_heads % self.num_kv_heads == 0,
            "num_kv_heads",
            f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})",
        )
        _check(self.head_dim % 2 == 0, "head_dim", f"must be even for RoPE, got {self.head_dim}")
        _check(self.rope_theta > 0, "rope_theta", f"must be > 0, got {self.rope_theta}")
        _check(0 < self.rms_norm_eps < 1, "rms_norm_eps", f"must be in (0, 1), got {self.rms_norm_eps}")
        _check(self.dtype in DTYPES, "dtype", f"must be one of {'|'.join(DTYPES)}, got {self.dtype!r}")
        _check(isinstance(self.eos_token_ids, tuple), "eos_token_ids", "must be a tuple of ints")
        for t in (*self.eos_token_ids, self.pad_token_id):
            _check(0 <= t < self.vocab_size, "eos_token_ids", f"token id {t} outside [0, {self.vocab_size})")

    @property
    def group_size(self) -> int:  # G: query heads per kv head
        return self.num_heads // self.num_kv_heads

    @classmethod
    def from_hf(cls, hf: dict, name: str = "model") -> ModelConfig:
        """Builds a config from an HF `config.json` dict (transformers 4.x and 5.x layouts)."""
        model_type = hf.get("model_type", "?")
        _check(
            model_type in ARCHITECTURES,
            "model_type",
            f"unsupported architecture {model_type!r}; supported: {', '.join(ARCHITECTURES)}",
        )
        rope_params = dict(hf.get("rope_parameters") or {})  # transformers 5.x
        rope_theta = rope_params.get("rope_theta", hf.get("rope_theta", 10000.0))
        scaling = hf.get("rope_scaling") or rope_params
        rope_type = scaling.get("rope_type", scaling.get("type", "default")) if scaling else "default"
        if rope_type not in ("default", "linear", "llama3"):
            raise ConfigError(f"rope_scaling.kind: unsupported rope type {rope_type!r} (default|linear|llama3)")
        rs = RopeScaling(
            kind=rope_type,
            factor=float(scaling.get("factor", 1.0)) if rope_type != "default" else 1.0,
            low_freq_factor=float(scaling.get("low_freq_factor", 1.0)),
            high_freq_factor=float(scaling.get("high_freq_factor", 4.0)),
            original_max_position=int(scaling.get("original_max_position_embeddings", 8192)),
        )
        eos = hf.get("eos_token_id")
        eos = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        num_heads = hf["num_attention_heads"]
        pad = hf.get("pad_token_id")
        return cls(
            arch=model_type,
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=hf.get("num_key_value_heads") or num_heads,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // num_heads,
            max_position=hf.get("max_position_embeddings", 4096),
            rope_theta=float(rope_theta),
            rope_scaling=rs,
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
            qkv_bias=model_type == "qwen2" or bool(hf.get("attention_bias", False)),
            bos_token_id=hf.get("bos_token_id"),
            eos_token_ids=eos,
            pad_token_id=pad if pad is not None else (eos[0] if eos else 0),
            name=name,
        )

    @classmethod
    def from_hf_dir(cls, path: str | Path) -> ModelConfig:
        path = Path(path)
        cfg_file = path / "config.json"
        if not cfg_file.is_file():
            raise FileNotFoundError(f"no config.json in {path}")
        return cls.from_hf(json.loads(cfg_file.read_text()), name=path.name)

    def num_params(self) -> int:
        D, F, L, V = self.hidden_size, self.intermediate_size, self.num_layers, self.vocab_size
        qkv = D * (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
        per_layer = qkv + self.num_heads * self.head_dim * D + 3 * D * F + 2 * D
        return V * D * (1 if self.tie_embeddings else 2) + L * per_layer + D


DRAFT_SAMPLING = ("auto", "greedy", "sample")


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """How a token is chosen from logits. temperature == 0 means greedy."""

    temperature: float = 0.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    min_p: float = 0.0  # 0 = off
    # How drafters build their trees at temperature > 0: "sample" draws children from the draft's own processed
    # distribution q (verified by recursive rejection sampling: accepted with probability 1 - TV(p, q));
    # "greedy" keeps the deterministic top-k tree (sample-and-match: a child is accepted with probability
    # p(child)); "auto" samples at T > 0. Both are exactly lossless. At T = 0 trees are always deterministic.
    draft_sampling: str = "auto"

    def __post_init__(self):
        _check(
            math.isfinite(self.temperature) and self.temperature >= 0,
            "temperature",
            f"must be a finite number >= 0, got {self.temperature}",
        )
        _check(isinstance(self.top_k, int) and self.top_k >= 0, "top_k", f"must be an integer >= 0, got {self.top_k}")
        _check(0 < self.top_p <= 1, "top_p", f"must be in (0, 1], got {self.top_p}")
        _check(0 <= self.min_p < 1, "min_p", f"must be in [0, 1), got {self.min_p}")
        _check(
            self.draft_sampling in DRAFT_SAMPLING,
            "draft_sampling",
            f"must be one of {'|'.join(DRAFT_SAMPLING)}, got {self.draft_sampling!r}",
        )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def sample_drafts(self) -> bool:
        """Whether drafters sample their trees from q (never at temperature 0)."""
        return not self.greedy and self.draft_sampling in ("auto", "sample")


@dataclasses.dataclass(frozen=True)
class GenerateConfig:
    """Static limits of one generation call."""

    max_new_tokens: int = 256
    sampling: SamplingConfig = SamplingConfig()
    stop_token_ids: tuple[int, ...] = ()  # besides the model's EOS
    ignore_eos: bool = False

    def __post_init__(self):
        _positive_int(self.max_new_tokens, "max_new_tokens")
        _check(isinstance(self.stop_token_ids, tuple), "stop_token_ids", "must be a tuple of ints")


@dataclasses.dataclass(frozen=True)
class DraftConfig:
    """The LongSpec draft: one decoder layer (window self-attention, cross-attention on the target's
    last-layer KV cache, MLP) sharing the target's embedding and LM head."""

    window: int = 512  # self-attention sliding window = the ring cache size (tokens)
    draft_vocab_size: int = 0  # 0 = the full vocabulary; else the LM head covers the top-K frequent tokens
    init_from_target_layer: int = -1  # initialise from this target layer (-1 = the last one)
    # Zero the three output projections at init (the draft starts as the identity on the embedding).
    # Off by default: on SmolLM2 with tied embeddings the identity predicts the input token again with
    # huge confidence, 108 nats of CE on stdlib code vs 41 for the copied last layer (uniform: 10.8).
    zero_init_outputs: bool = False
    # Scale the draft's final-norm gain at init: the copied last layer applied to raw embeddings gives
    # confidently wrong logits (41 nats of CE at 1.0, 11.2 at 0.1 on stdlib code; uniform is 10.8).
    # Measured on SmolLM2 (smoke config, seq 256, batch 4, lr 5e-4, 20 steps): loss 61.1 -> 10.0 at 1.0,
    # 12.3 -> 8.75 at 0.1.
    init_head_scale: float = 0.1

    def __post_init__(self):
        _positive_int(self.window, "window")
        _check(0 < self.init_head_scale <= 1, "init_head_scale", f"must be in (0, 1], got {self.init_head_scale}")
        _check(
            isinstance(self.draft_vocab_size, int) and self.draft_vocab_size >= 0,
            "draft_vocab_size",
            f"must be an integer >= 0 (0 = full vocabulary), got {self.draft_vocab_size!r}",
        )


# ---------------------------------------------------------------------------
# YAML <-> dataclasses


def from_dict(cls, data: dict, where: str = ""):
    """Builds dataclass `cls` from a dict; nested dataclasses recurse, unknown keys raise."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where or cls.__name__}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(
            f"{where + '.' if where else ''}{unknown[0]}: unknown key for {cls.__name__} "
            f"(known: {', '.join(sorted(fields))})"
        )
    kwargs = {}
    for key, value in data.items():
        hint = hints[key]
        name = f"{where}.{key}" if where else key
        sub = _dataclass_in(hint)
        if sub is not None and isinstance(value, dict):
            kwargs[key] = from_dict(sub, value, name)
        elif _is_tuple(hint) and isinstance(value, list):
            kwargs[key] = tuple(value)
        elif hint is float and isinstance(value, int) and not isinstance(value, bool):
            kwargs[key] = float(value)
        else:
            kwargs[key] = value
    return cls(**kwargs)


def _dataclass_in(hint):
    if dataclasses.is_dataclass(hint):
        return hint
    for arg in typing.get_args(hint):
        if dataclasses.is_dataclass(arg):
            return arg
    return None


def _is_tuple(hint) -> bool:
    return hint is tuple or typing.get_origin(hint) is tuple or any(_is_tuple(a) for a in typing.get_args(hint))


def to_dict(cfg) -> dict:
    out = dataclasses.asdict(cfg)

    def lists(x):
        if isinstance(x, dict):
            return {k: lists(v) for k, v in x.items()}
        if isinstance(x, tuple):
            return [lists(v) for v in x]
        return x

    return lists(out)


def _parse_scalar(text: str):
    value = yaml.safe_load(text)
    if isinstance(value, str):  # YAML 1.1 reads "5e5" as a string; a number was meant
        try:
            return float(value)
        except ValueError:
            pass
    return value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Applies `a.b=value` strings (YAML-parsed values) to a nested dict, in place."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected key.path=value")
        path, raw = item.split("=", 1)
        keys = path.strip().split(".")
        node = data
        for k in keys[:-1]:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {k} is not a section")
        node[keys[-1]] = _parse_scalar(raw)
    return data


def load_yaml(cls, path: str | Path, overrides: list[str] | None = None):
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file not found: {path}")
    data = yaml.safe_load(path.read_text()) or {}
    apply_overrides(data, overrides or [])
    return from_dict(cls, data)


# ---------------------------------------------------------------------------
# Draft training (train.py). Sections map one-to-one onto YAML sections.

DATA_SOURCES = ("stdlib", "sotu", "sharegpt", "champ", "synthetic")
DISTILL_KINDS = ("none", "argmax", "kl")


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


@dataclasses.dataclass(frozen=True)
class PositionConfig:
    """Anchor-offset indices (LongSpec §3.2): the first `num_anchors` positions stay, the rest get + offset."""

    anchor_offset: bool = False
    num_anchors: int = 4
    max_len: int = 0  # offsets ~ U[0, max_len - seq_len]; 0 = the target's max_position

    def __post_init__(self):
        _check(self.num_anchors >= 0, "positions.num_anchors", f"must be >= 0, got {self.num_anchors}")
        _check(self.max_len >= 0, "positions.max_len", f"must be >= 0 (0 = the target's), got {self.max_len}")


@dataclasses.dataclass(frozen=True)
class LossConfig:
    ce_weight: float = 1.0  # next-token cross-entropy on the data (the paper)
    distill: str = "none"  # none | argmax (CE on the target's argmax) | kl (KL(target || draft))
    distill_weight: float = 0.0
    chunk_size: int = 128  # positions per LM-head chunk: [B, chunk, V] is the largest logits block
    flash_noisy: bool = True  # cross-attention lag j ~ U[1, gamma) per step
    gamma: int = 4  # the paper's RandomInt(1, 4): j in {1, 2, 3}

    def __post_init__(self):
        _check(self.ce_weight >= 0, "loss.ce_weight", f"must be >= 0, got {self.ce_weight}")
        _check(
            self.distill in DISTILL_KINDS,
            "loss.distill",
            f"must be one of {'|'.join(DISTILL_KINDS)}, got {self.distill!r}",
        )
        _check(self.distill_weight >= 0, "loss.distill_weight", f"must be >= 0, got {self.distill_weight}")
        _check(
            self.ce_weight > 0 or (self.distill != "none" and self.distill_weight > 0),
            "loss.ce_weight",
            "every loss weight is 0: set ce_weight > 0 or a distill kind with distill_weight > 0",
        )
        _positive_int(self.chunk_size, "loss.chunk_size")
        _check(
            isinstance(self.gamma, int) and self.gamma >= 2,
            "loss.gamma",
            f"must be an integer >= 2 (j ~ U[1, gamma)), got {self.gamma!r}",
        )


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
class MeshConfig:
    """A (data, fsdp) device mesh; their product must equal the device count (-1 = the rest of the devices)."""

    data: int = -1
    fsdp: int = 1

    def __post_init__(self):
        for name in ("data", "fsdp"):
            v = getattr(self, name)
            _check(
                isinstance(v, int) and (v >= 1 or v == -1),
                f"mesh.{name}",
                f"must be an integer >= 1 or -1 (the remaining devices), got {v!r}",
            )
        _check(self.data != -1 or self.fsdp != -1, "mesh.fsdp", "at most one of data/fsdp may be -1")


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

    Stores last-layer K/V, the target's argmax and (for loss.distill=kl) its final hidden state per
    packed sequence; anchor offsets are then fixed per sequence (drawn once from data.seed).
    """

    enabled: bool = False
    dir: str = ""  # "" = <run_dir>/features
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
class TrainConfig:
    """One draft-training run (a stage): `python train.py --config configs/train/X.yaml`."""

    name: str = "draft"
    run_dir: str = ""  # "" = runs/<name>
    seed: int = 0  # parameter init and per-step keys
    steps: int = 0  # optimizer steps to run; 0 = optim.total_steps
    target: TargetConfig = TargetConfig()
    draft: DraftConfig = DraftConfig()
    data: DataConfig = DataConfig()
    positions: PositionConfig = PositionConfig()
    loss: LossConfig = LossConfig()
    optim: OptimConfig = OptimConfig()
    mesh: MeshConfig = MeshConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    features: FeatureCacheConfig = FeatureCacheConfig()
    log: LogConfig = LogConfig()

    def __post_init__(self):
        _check(
            bool(self.name) and "/" not in self.name, "name", f"must be a non-empty name without '/', got {self.name!r}"
        )
        _check(self.steps >= 0, "steps", f"must be >= 0 (0 = optim.total_steps), got {self.steps}")
        _check(
            self.steps <= self.optim.total_steps,
            "steps",
            f"must be <= optim.total_steps ({self.optim.total_steps}), got {self.steps}",
        )
        _check(
            self.loss.distill == "none" or self.loss.distill_weight > 0,
            "loss.distill_weight",
            f"must be > 0 when loss.distill is {self.loss.distill!r}",
        )
        _check(
            not (self.data.chat and "synthetic" in self.data.sources),
            "data.chat",
            "dialogue SFT needs dialogue sources (sharegpt, champ), not synthetic",
        )

    @property
    def num_steps(self) -> int:
        return self.steps or self.optim.total_steps

    @property
    def resolved_run_dir(self) -> str:
        return self.run_dir or f"runs/{self.name}"
