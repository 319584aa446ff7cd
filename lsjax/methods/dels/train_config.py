"""DeLS-Spec's training config (`kind: block` and `kind: local_head`): the LongSpec run's sections
(`lsjax.methods.longspec.train_config`: the block drafter is the LongSpec draft layer run over a block) with
the block drafter's, the local head's and the two kinds' own training section.

Light to import (no jax): `train.py` builds it from the YAML before any trainer loads.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from lsjax.config import BlockConfig, LocalHeadConfig, _check, _positive_int
from lsjax.methods.longspec.train_config import LongSpecTrainConfig

BLOCK, LOCAL_HEAD = "block", "local_head"


@dataclasses.dataclass(frozen=True)
class DelsConfig:
    """The `dels:` section: training of DeLS-Spec's parts (kind block | local_head)."""

    num_anchors: int = 32  # block: random anchor positions per sequence and step (each drafts a block)
    decay_gamma: float = 7.0  # loss weight exp(-(k - 1) / gamma) at block position k (DFlash); 0 = flat
    # local_head: sources rendered with the chat template (loss and prior on assistant tokens only), beside
    # data.sources read as plain text
    chat_sources: tuple[str, ...] = ()
    prior_lambda: float = 1.0  # add-lambda smoothing of the unigram prior
    max_minutes: float = 0.0  # stop (with a checkpoint) after this much training wall time; 0 = no limit

    def __post_init__(self):
        _positive_int(self.num_anchors, "dels.num_anchors")
        _check(self.decay_gamma >= 0, "dels.decay_gamma", f"must be >= 0 (0 = flat), got {self.decay_gamma}")
        _check(isinstance(self.chat_sources, tuple), "dels.chat_sources", "must be a list of sources")
        for s in self.chat_sources:
            _check(
                s in ("sharegpt", "champ"), "dels.chat_sources", f"must be dialogue sources (sharegpt, champ): {s!r}"
            )
        _check(self.prior_lambda > 0, "dels.prior_lambda", f"must be > 0, got {self.prior_lambda}")
        _check(self.max_minutes >= 0, "dels.max_minutes", f"must be >= 0 (0 = no limit), got {self.max_minutes}")


@dataclasses.dataclass(frozen=True)
class DelsTrainConfig(LongSpecTrainConfig):
    """One DeLS-Spec training run: the block drafter (`kind: block`) or the local head (`kind: local_head`)."""

    KINDS: ClassVar[tuple[str, ...]] = (BLOCK, LOCAL_HEAD)

    kind: str = BLOCK
    block: BlockConfig = BlockConfig()  # kind block
    local_head: LocalHeadConfig = LocalHeadConfig()  # kind local_head
    dels: DelsConfig = DelsConfig()
