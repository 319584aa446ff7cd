"""dflash's decode options."""

from __future__ import annotations

import dataclasses

from lsjax.config import ConfigError
from lsjax.methods.registry import option

TREE_HELP = (
    "verify a tree instead of the block's chain: a preset (gpu: 32 nodes, top-4; small: 16, top-2; cpu: 8 "
    "nodes, top-2, 4 levels) or NODES,TOP_K[,DEPTH] (DEPTH default: the block's, block size - 1); default: the chain"
)


@dataclasses.dataclass(frozen=True)
class DFlashOptions:
    draft: str | None = option(
        None, "a draft checkpoint (directory), or 'random' (untrained); dflash has no shipped draft"
    )
    block_size: int | None = option(None, "tokens per block (default: the draft's)")
    dflash_tree: str | None = option(None, TREE_HELP)

    def __post_init__(self):
        if self.block_size is not None and not (isinstance(self.block_size, int) and 2 <= self.block_size <= 64):
            raise ConfigError(f"block_size: dflash needs an integer in [2, 64], got {self.block_size!r}")
