"""eagle3's decode options."""

from __future__ import annotations

import dataclasses

from lsjax.methods.registry import option

TREE_HELP = (
    "the dynamic tree's budget: a preset (eagle3: 59 nodes, 8 levels, top-10, EAGLE-3's published default; eagle2: "
    "59, 6, top-8; small: 15, 5, top-4; cpu: 6, 4, top-2) or NODES,DEPTH,TOP_K (default: eagle3)"
)


@dataclasses.dataclass(frozen=True)
class Eagle3Options:
    draft: str | None = option(
        None, "a draft checkpoint (directory), or 'random' (untrained); default: the shipped one"
    )
    eagle_tree: str | None = option(None, TREE_HELP)
