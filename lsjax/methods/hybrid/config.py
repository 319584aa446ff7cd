"""hybrid's decode options: the draft's and a prompt-lookup chain's."""

from __future__ import annotations

import dataclasses

from lsjax.methods.longspec.config import LongSpecOptions
from lsjax.methods.pld.config import PLD_NGRAM, check_at_least_one
from lsjax.methods.registry import option

# Beside the draft's tree, a shorter chain keeps the union's verification small.
HYBRID_PLD_TOKENS = 6
# The draft's tree inside `hybrid` and `auto` on a CPU unless --tree says otherwise: both were tuned with it
# there, and it is not the shipped draft's CPU tree, which is picked for `--method longspec` alone (one node).
# Elsewhere they take the draft's tree for the device, as `longspec` does.
COMBINED_TREE = "2,1,1"


def combined_tree(tree):
    import jax

    return tree or (COMBINED_TREE if jax.default_backend() == "cpu" else None)


@dataclasses.dataclass(frozen=True)
class HybridOptions(LongSpecOptions):
    tree: str | None = option(None, f"the draft's tree, as for longspec (default {COMBINED_TREE} on a CPU)")
    pld_tokens: int = option(HYBRID_PLD_TOKENS, "tokens per lookup chain")
    pld_ngram: int = option(PLD_NGRAM, "longest n-gram matched")

    def __post_init__(self):
        check_at_least_one(self, "pld_tokens", "pld_ngram")
