"""block's and dels's decode options."""

from __future__ import annotations

import dataclasses

from lsjax.config import ConfigError
from lsjax.methods.registry import option

DELS_ALPHA, DELS_BETA = 1.0, 1.0


@dataclasses.dataclass(frozen=True)
class BlockOptions:
    draft: str | None = option(
        None, "a draft checkpoint (directory), or 'random' (untrained); default: the shipped one"
    )
    block_draft: str | None = option(
        None,
        "deprecated alias of --draft for block and dels: a block draft (directory), or 'longspec' (the LongSpec "
        "draft with an untrained mask embedding)",
    )
    block_size: int | None = option(None, "tokens per block (default: the draft's)")
    branches: int = option(1, "parallel chains from the top first tokens")

    def weights(self) -> str | None:
        """The block draft to load: --draft, else the deprecated --block-draft ("random" and "longspec": the
        LongSpec draft with an untrained mask embedding)."""
        given = self.draft if self.draft is not None else self.block_draft
        return "longspec" if given == "random" else given

    def __post_init__(self):
        if self.draft is not None and self.block_draft is not None and self.draft != self.block_draft:
            given = f"--draft {self.draft} and --block-draft {self.block_draft}"
            raise ConfigError(f"{given}: give one (--block-draft is --draft's old name)")
        if self.block_size is not None and not (isinstance(self.block_size, int) and 1 <= self.block_size <= 64):
            raise ConfigError(f"block_size: must be an integer in [1, 64], got {self.block_size!r}")
        if not (isinstance(self.branches, int) and self.branches >= 1):
            raise ConfigError(f"branches: must be an integer >= 1, got {self.branches!r}")


@dataclasses.dataclass(frozen=True)
class DelsOptions(BlockOptions):
    alpha: float = option(DELS_ALPHA, "weight of the local head's logits")
    beta: float = option(DELS_BETA, "weight of the unigram prior")
    local_head: str | None = option(None, "gru (default) | markov (the shipped heads) or a local-head directory")
