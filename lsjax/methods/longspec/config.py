"""longspec's decode options (hybrid, auto and streams take `draft` and `tree` too)."""

from __future__ import annotations

import dataclasses

from lsjax.methods.registry import option

TREE_HELP = (
    "speculation tree: a preset (paper, gpu, cpu, cpu-small, chain4, chain8) or comma-separated widths per "
    "depth, e.g. 2,2,2 (default: the draft's tree for this device, one node on a CPU)"
)


@dataclasses.dataclass(frozen=True)
class LongSpecOptions:
    draft: str | None = option(
        None, "a draft checkpoint (directory), 'random' (untrained) or 'shipped'; default: the shipped one"
    )
    tree: str | None = option(None, TREE_HELP)
