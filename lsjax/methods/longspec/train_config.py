"""The LongSpec draft's training config (`kind: longspec`, the default kind): the scaffold's shared sections
(`lsjax.train.config`: the run, target, data, positions, feature cache) with the draft, its loss and the mesh.

Light to import (no jax): `train.py` builds it from the YAML before any trainer loads.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from lsjax.config import DraftConfig, MeshConfig, _check, _positive_int
from lsjax.train.config import DataConfig, FeatureCacheConfig, PositionConfig, RunConfig, TargetConfig

KIND = "longspec"
DISTILL_KINDS = ("none", "argmax", "kl")
DISTILL_ON = ("answers", "text")


@dataclasses.dataclass(frozen=True)
class LossConfig:
    ce_weight: float = 1.0  # next-token cross-entropy on the data (the paper)
    distill: str = "none"  # none | argmax (CE on the target's argmax) | kl (KL(target || draft))
    distill_weight: float = 0.0
    # Where the distillation term applies: "answers", the positions the CE term weighs (loss_mask); "text", every
    # position of the row up to its last training target, the prompt included. A self-distilled row of 4096
    # tokens carries ~300 answer tokens: the other ~93% of the positions the step runs the draft and the
    # target's head on anyway learn nothing under "answers". Each term is normalised by its own weight.
    distill_on: str = "answers"
    chunk_size: int = 128  # positions per LM-head chunk: [B, chunk, V] is the largest logits block
    flash_noisy: bool = True  # cross-attention lag j ~ U[1, gamma) = {1, ..., gamma - 1} per step
    # Tree level i is drafted at lag i (its root is not in the target's cache yet), so gamma = depth + 1 trains
    # every level of a depth-(gamma - 1) tree. The paper's gamma = 5 (official randint(1, 4)) covers depth 4;
    # 6 covers the depth-5 trees lsjax drafts.
    gamma: int = 6

    def __post_init__(self):
        _check(self.ce_weight >= 0, "loss.ce_weight", f"must be >= 0, got {self.ce_weight}")
        _check(
            self.distill in DISTILL_KINDS,
            "loss.distill",
            f"must be one of {'|'.join(DISTILL_KINDS)}, got {self.distill!r}",
        )
        _check(self.distill_weight >= 0, "loss.distill_weight", f"must be >= 0, got {self.distill_weight}")
        _check(
            self.distill_on in DISTILL_ON,
            "loss.distill_on",
            f"must be one of {'|'.join(DISTILL_ON)}, got {self.distill_on!r}",
        )
        _check(
            self.distill_on == "answers" or self.distill != "none",
            "loss.distill_on",
            f"{self.distill_on!r} needs a distillation term: set loss.distill to argmax or kl",
        )
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
class LongSpecTrainConfig(RunConfig):
    """One LongSpec draft-training run (a stage): `python train.py --config configs/train/X.yaml`. Anchor-offset
    indices (the `positions` section) are LongSpec §3.2.

    `KINDS`: the kinds a config of this class may name; a subclass that reuses these sections for its own
    kinds (DeLS-Spec's, `lsjax.methods.dels.train_config`) names its own."""

    KINDS: ClassVar[tuple[str, ...]] = (KIND,)

    kind: str = KIND
    target: TargetConfig = TargetConfig()
    draft: DraftConfig = DraftConfig()
    data: DataConfig = DataConfig()
    positions: PositionConfig = PositionConfig()
    loss: LossConfig = LossConfig()
    mesh: MeshConfig = MeshConfig()
    features: FeatureCacheConfig = FeatureCacheConfig()

    def __post_init__(self):
        _check(self.kind in self.KINDS, "kind", f"must be one of {'|'.join(self.KINDS)}, got {self.kind!r}")
        super().__post_init__()
        _check(
            self.loss.distill == "none" or self.loss.distill_weight > 0,
            "loss.distill_weight",
            f"must be > 0 when loss.distill is {self.loss.distill!r}",
        )
