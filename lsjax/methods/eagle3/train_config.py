"""The EAGLE-3 draft's training config (`kind: eagle3`): the scaffold's shared sections (`lsjax.train.config`:
the run, target, data, feature cache) with the draft's shape, EAGLE-3's training-time test and the export.

Light to import (no jax): `train.py` builds it from the YAML before any trainer loads. Checks that need the
target's shapes (aux layers within its depth, a draft vocabulary no larger than its) run in `check_target`,
once the target is loaded and before the run directory is touched.
"""

from __future__ import annotations

import dataclasses

from lsjax.config import DTYPES, ConfigError, ModelConfig, _check, _positive_int
from lsjax.train.config import DataConfig, FeatureCacheConfig, PositionConfig, RunConfig, TargetConfig

KIND = "eagle3"
FORMATS = ("eagle", "speculators")


def _dim(value, field: str) -> None:
    _check(
        isinstance(value, int) and not isinstance(value, bool) and value >= 0,
        field,
        f"must be an integer >= 0 (0 = the target's), got {value!r}",
    )


HEAD_INITS = ("random", "target")


@dataclasses.dataclass(frozen=True)
class Eagle3DraftConfig:
    """The draft's shape: one decoder layer as wide as the target (it reads the target's embeddings), fed by the
    target's residual streams entering `aux_layers`."""

    aux_layers: tuple[int, ...] = ()  # () = the published drafts' 2, L // 2, L - 3 (`model.default_aux_layers`)
    # The N most frequent target tokens of the training data's loss positions (the reference's draft vocabulary);
    # 0 = the target's whole vocabulary.
    draft_vocab_size: int = 0
    intermediate_size: int = 0  # 0 = the target's
    num_heads: int = 0  # 0 = the target's (head_dim then hidden_size // num_heads unless the target's heads)
    num_kv_heads: int = 0  # 0 = the target's (or num_heads when num_heads is set)
    norm_before_residual: bool = False  # speculators' option; the EAGLE layout cannot express True
    init_std: float = 0.02  # random weights ~ N(0, init_std), norm gains 1, as the reference's
    # "random": the LM head too, as the reference's. "target": the head starts as the target's on the draft
    # vocabulary and the final norm as the target's, so the draft's output starts in a space the target decodes
    # (its layer still has to learn to put x_{t+2} there; docs/training.md measures what the start buys).
    head_init: str = "random"

    def __post_init__(self):
        ok = isinstance(self.aux_layers, tuple) and all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in self.aux_layers
        )
        _check(ok, "draft.aux_layers", f"must be a list of target layer indices >= 0, got {self.aux_layers!r}")
        for name in ("draft_vocab_size", "intermediate_size", "num_heads", "num_kv_heads"):
            _dim(getattr(self, name), f"draft.{name}")
        if self.num_heads and self.num_kv_heads:
            _check(
                self.num_heads % self.num_kv_heads == 0,
                "draft.num_kv_heads",
                f"must divide draft.num_heads ({self.num_heads}), got {self.num_kv_heads}",
            )
        _check(self.init_std > 0, "draft.init_std", f"must be > 0, got {self.init_std}")
        _check(
            self.head_init in HEAD_INITS,
            "draft.head_init",
            f"must be one of {', '.join(HEAD_INITS)}, got {self.head_init!r}",
        )

    def check_target(self, target: ModelConfig) -> None:
        """What the target's shapes bound: aux layers within its depth, the vocabulary within its, the heads."""
        L = target.num_layers
        bad = [i for i in self.aux_layers if i >= L]
        if bad:
            raise ConfigError(
                f"draft.aux_layers: {bad[0]} is beyond the target's depth ({L} layers: indices 0..{L - 1})"
            )
        if self.draft_vocab_size > target.vocab_size:
            raise ConfigError(
                f"draft.draft_vocab_size: {self.draft_vocab_size} is larger than the target's vocabulary "
                f"({target.vocab_size})"
            )
        if self.num_heads and target.hidden_size % self.num_heads:
            raise ConfigError(
                f"draft.num_heads: must divide the target's hidden size {target.hidden_size}, got {self.num_heads}"
            )


@dataclasses.dataclass(frozen=True)
class Eagle3LossConfig:
    """EAGLE-3's training-time test: the draft run `ttt_steps` times over every position, each step on its own
    previous output; step j's loss weighs `step_weight ** j` (the reference: 7 steps, 0.8)."""

    ttt_steps: int = 7
    step_weight: float = 0.8
    chunk_size: int = 256  # positions per LM-head chunk: [B, chunk, Vd] is the largest logits block

    def __post_init__(self):
        _positive_int(self.ttt_steps, "loss.ttt_steps")
        _check(0 < self.step_weight <= 1, "loss.step_weight", f"must be in (0, 1], got {self.step_weight}")
        _positive_int(self.chunk_size, "loss.chunk_size")


@dataclasses.dataclass(frozen=True)
class Eagle3ExportConfig:
    """What `train.py --export DIR` writes: a published layout (`eagle`: EAGLE / SpecForge's `midlayer.*`;
    `speculators`: vLLM speculators' `layers.0.*`) in a dtype."""

    format: str = "eagle"
    dtype: str = "bfloat16"

    def __post_init__(self):
        _check(self.format in FORMATS, "export.format", f"must be one of {'|'.join(FORMATS)}, got {self.format!r}")
        _check(self.dtype in DTYPES, "export.dtype", f"must be one of {'|'.join(DTYPES)}, got {self.dtype!r}")


@dataclasses.dataclass(frozen=True)
class Eagle3TrainConfig(RunConfig):
    """One EAGLE-3 draft-training run: `python train.py --config configs/train/eagle3-smollm2.yaml`. The target's
    features come from `features.set` (sets of the shared cache built with the draft's aux layers) or are
    computed in the step; the rows from the set, `data.distilled` or `data.sources`."""

    name: str = "eagle3"
    kind: str = KIND
    target: TargetConfig = TargetConfig()
    draft: Eagle3DraftConfig = Eagle3DraftConfig()
    data: DataConfig = DataConfig()
    loss: Eagle3LossConfig = Eagle3LossConfig()
    features: FeatureCacheConfig = FeatureCacheConfig()
    export: Eagle3ExportConfig = Eagle3ExportConfig()

    def __post_init__(self):
        _check(self.kind == KIND, "kind", f"must be {KIND!r}, got {self.kind!r}")
        super().__post_init__()
        _check(
            not (self.features.enabled and not self.features.set),
            "features.enabled",
            "kind eagle3 computes the target's features in the step or reads a shared set (features.set), "
            "not a run's own cache",
        )
        if self.target.model is not None:
            self.draft.check_target(self.target.model)

    @property
    def positions(self) -> PositionConfig:
        """Plain positions 0..T-1 (what `lsjax.train.data.batches` reads): no anchor offsets."""
        return PositionConfig()
