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
import math
import types
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


ARCHITECTURES = ("llama", "qwen2", "qwen3", "mistral")
DTYPES = ("float32", "bfloat16", "float16")
# What a user may type for a dtype: the short names decode.py takes, and "auto" = the platform's default.
DTYPE_NAMES = {"bf16": "bfloat16", "fp32": "float32", "fp16": "float16", **{d: d for d in DTYPES}}


def default_dtype(platform: str | None = None) -> str:
    """The dtype lsjax runs a model in on `platform` (default: JAX's default backend): fp32 on a CPU (bf16
    matmuls are ~10x slower there), bf16 on TPU/GPU, where weights and K/V caches in bf16 halve the bytes a
    decode step reads; accumulation and softmax statistics stay fp32 on every platform."""
    if platform is None:
        import jax

        platform = jax.default_backend()
    return "float32" if platform == "cpu" else "bfloat16"


def resolve_dtype(name: str, platform: str | None = None, field: str = "dtype") -> str:
    """A canonical dtype name (float32|bfloat16|float16) from a user's spelling (bf16, fp32, ..., "auto")."""
    if name == "auto":
        return default_dtype(platform)
    _check(
        isinstance(name, str) and name in DTYPE_NAMES,
        field,
        f"must be one of auto|bf16|fp32 (or {'|'.join(DTYPES)}), got {name!r}",
    )
    return DTYPE_NAMES[name]


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shapes and numerics of a Llama-family decoder (Llama, Qwen2, Qwen3, Mistral)."""

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
    qk_norm: bool = False  # Qwen3: an RMSNorm over each head's q and k (weights [H]) before RoPE
    bos_token_id: int | None = 1
    eos_token_ids: tuple[int, ...] = (2,)
    pad_token_id: int = 2
    dtype: str = "float32"  # activations and weights; fp32 on CPU, bf16 on accelerators
    name: str = "model"
    # Batch-invariant numerics (0 = off): every decode forward, AR's included, runs on exactly this many rows
    # with attention that sums each query's keys the same way in every step, so speculative output is AR's bit
    # for bit in any dtype on any device. Must be >= the largest tree verified, and equal between runs compared.
    invariant_rows: int = 0

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
        _check(
            isinstance(self.invariant_rows, int) and 0 <= self.invariant_rows <= 1024,
            "invariant_rows",
            f"must be an int in [0, 1024] (0 = off), got {self.invariant_rows!r}",
        )
        _check(isinstance(self.eos_token_ids, tuple), "eos_token_ids", "must be a tuple of ints")
        for t in (*self.eos_token_ids, self.pad_token_id):
            _check(0 <= t < self.vocab_size, "eos_token_ids", f"token id {t} outside [0, {self.vocab_size})")

    @property
    def group_size(self) -> int:  # G: query heads per kv head
        return self.num_heads // self.num_kv_heads

    def signature(self) -> str:
        """A short hash of the configuration (shapes, dtype): what a step's cost depends on, not the weights."""
        import hashlib

        # Without invariant numerics or q/k norms the repr (and every profile keyed by it) is what it was before
        # those fields.
        plain = repr(self).replace(", invariant_rows=0", "").replace(", qk_norm=False", "")
        return hashlib.sha1(plain.encode()).hexdigest()[:12]

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
    # Contextual penalty (TokenSwift §3.4; CTRL's repetition penalty over a window): every token among the
    # last `penalty_window` generated tokens has its logit divided by `penalty` when positive, multiplied when
    # negative, before temperature and the filters, at every temperature (greedy included). 1.0 = off. The
    # window is path-dependent inside a speculative tree: a node's window ends with the tokens on its own path
    # (`lsjax.sampling.tree_penalty_mask`), so verification uses the distribution AR would.
    penalty: float = 1.0
    penalty_window: int = 1024

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
        _check(
            isinstance(self.penalty, int | float) and math.isfinite(self.penalty) and self.penalty > 0,
            "penalty",
            f"must be a finite number > 0 (1 = off), got {self.penalty!r}",
        )
        _positive_int(self.penalty_window, "penalty_window")

    @property
    def penalized(self) -> bool:
        """Whether the contextual penalty is on (it needs the generated-token history)."""
        return self.penalty != 1.0

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
    """The LongSpec draft: window self-attention, then `depth` blocks of cross-attention on the target's
    last-layer KV cache + MLP (one decoder layer at depth 1), sharing the target's embedding and LM head."""

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
    # What the released LongSpec drafts (sail-sg/LongSpec's `LlamaGlideDecoderLayer`, read by
    # `lsjax.methods.longspec.release`) do differently; lsjax's own drafts keep the defaults.
    # q/k/v biases on both attentions: None = as the target (`ModelConfig.qkv_bias`); True: always (released).
    qkv_bias: bool | None = None
    # A final RMSNorm before the LM head (lsjax's); False: the head reads the last hidden state (released).
    final_norm: bool = True
    # The self-attention window at tree steps. False (lsjax's): every query sees the last `window` committed
    # keys. True (released: flash-attn's bottom-right-aligned window over the committed cache): query i of a
    # frontier of w nodes sees w - i of the oldest keys more; the root step sees `window`, as before. The ring
    # then holds `window` + the widest frontier.
    frontier_window: bool = False
    # (cross-attention + MLP) blocks after the self-attention. Blocks 2.. are stacked `deep_*` weights and start
    # with zero output projections, so a deeper draft starts as the one-block draft it grows from. The
    # self-attention stays one (its K/V depend on tokens only, which the ring of committed tokens needs).
    depth: int = 1

    def __post_init__(self):
        _positive_int(self.window, "window")
        _check(
            isinstance(self.depth, int) and not isinstance(self.depth, bool) and 1 <= self.depth <= 8,
            "depth",
            f"must be an integer in [1, 8], got {self.depth!r}",
        )
        _check(self.qkv_bias in (None, True, False), "qkv_bias", f"must be None, True or False, got {self.qkv_bias!r}")
        for name in ("final_norm", "frontier_window"):
            _check(isinstance(getattr(self, name), bool), name, f"must be a bool, got {getattr(self, name)!r}")
        _check(0 < self.init_head_scale <= 1, "init_head_scale", f"must be in (0, 1], got {self.init_head_scale}")
        _check(
            isinstance(self.draft_vocab_size, int) and self.draft_vocab_size >= 0,
            "draft_vocab_size",
            f"must be an integer >= 0 (0 = full vocabulary), got {self.draft_vocab_size!r}",
        )


LOCAL_HEADS = ("gru", "markov")


@dataclasses.dataclass(frozen=True)
class LocalHeadConfig:
    """DeLS-Spec's short-context expert p_S (Appendix A): it reads only the tokens drafted so far in the current
    block, through the target's frozen embedding, and ends in a low-rank SiLU state that the target's (tied)
    head maps to the vocabulary. `gru`: a bias-free one-layer GRU over the block prefix; `markov`: the last
    drafted token alone."""

    kind: str = "gru"  # gru | markov
    hidden: int = 1024  # GRU state width (gru only)
    rank: int = 256  # the low-rank state before the vocabulary
    block_size: int = 16  # the span it is trained on: the prefix restarts every block_size tokens
    # 0: the loss covers the whole vocabulary. K > 0: only the K most frequent training tokens (6x cheaper
    # training at 8192 of SmolLM2's 49K); at fusion the others fall back to the unigram prior, i.e. the head
    # says nothing about them.
    vocab_size: int = 0

    def __post_init__(self):
        _check(
            self.kind in LOCAL_HEADS, "local_head.kind", f"must be one of {'|'.join(LOCAL_HEADS)}, got {self.kind!r}"
        )
        _positive_int(self.hidden, "local_head.hidden")
        _positive_int(self.rank, "local_head.rank")
        _check(
            isinstance(self.block_size, int) and 2 <= self.block_size <= 256,
            "local_head.block_size",
            f"must be an integer in [2, 256], got {self.block_size!r}",
        )
        _check(
            isinstance(self.vocab_size, int) and self.vocab_size >= 0,
            "local_head.vocab_size",
            f"must be an integer >= 0 (0 = the whole vocabulary), got {self.vocab_size!r}",
        )


@dataclasses.dataclass(frozen=True)
class BlockConfig:
    """The block-parallel drafter (DFlash's role): the LongSpec draft layer run once over [root, MASK x s] at
    positions n .. n + s, bidirectional inside the block; the s mask outputs are the block's logits."""

    block_size: int = 8  # s: tokens drafted per forward

    def __post_init__(self):
        _check(
            isinstance(self.block_size, int) and 1 <= self.block_size <= 64,
            "block.block_size",
            f"must be an integer in [1, 64], got {self.block_size!r}",
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
            continue
        value = _coerce_number(value, hint)
        # Checked before the config's own validation, whose range tests would fail on a wrong type with an
        # error that names neither the field nor the type ("'<' not supported between 'int' and 'str'").
        if not _fits(value, hint):
            raise ConfigError(f"{name}: expected {_describe(hint)}, got {value!r}")
        if _is_tuple(hint) and isinstance(value, list):
            value = tuple(value)
        kwargs[key] = value
    return cls(**kwargs)


def _coerce_number(value, hint):
    """An int where a float is expected becomes a float; so does a numeric string such as "5e-4", which
    YAML 1.1 reads as a string for want of a decimal point."""
    if hint is not float or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def _fits(value, hint) -> bool:
    """Whether a YAML-parsed value has the type a field's annotation asks for (lists stand for tuples)."""
    if hint is Any:
        return True
    if hint is type(None):
        return value is None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union or isinstance(hint, types.UnionType):
        return any(_fits(value, a) for a in args)
    if hint is tuple or origin is tuple:
        if not isinstance(value, list | tuple):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_fits(v, args[0]) for v in value)
        return not args or (len(args) == len(value) and all(_fits(v, a) for v, a in zip(value, args)))
    if dataclasses.is_dataclass(hint):
        return isinstance(value, hint)
    if hint is float:
        return isinstance(value, float)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return not isinstance(hint, type) or isinstance(value, hint)


def _describe(hint) -> str:
    names = {int: "an integer", float: "a number", bool: "true or false", str: "a string", type(None): "null"}
    if hint in names:
        return names[hint]
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union or isinstance(hint, types.UnionType):
        return " or ".join(_describe(a) for a in args)
    if hint is tuple or origin is tuple:
        inner = args[0] if args else None
        return f"a list of {_describe(inner).split(' ', 1)[-1]}s" if inner in names else "a list"
    if dataclasses.is_dataclass(hint):
        return f"a mapping ({hint.__name__})"
    return getattr(hint, "__name__", str(hint))


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
# Device mesh (lsjax.sharding; training runs set it in their `mesh:` section)


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
