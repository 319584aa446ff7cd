"""pld's decode options."""

from __future__ import annotations

import dataclasses

from lsjax.config import ConfigError
from lsjax.methods.registry import option

# Prompt lookup alone: a long chain costs little when it misses (one verify of 9 nodes).
PLD_TOKENS = 8
PLD_NGRAM = 3


@dataclasses.dataclass(frozen=True)
class PLDOptions:
    pld_tokens: int = option(PLD_TOKENS, "tokens per lookup chain")
    pld_ngram: int = option(PLD_NGRAM, "longest n-gram matched")

    def __post_init__(self):
        check_at_least_one(self, "pld_tokens", "pld_ngram")


def check_at_least_one(opts, *names: str) -> None:
    """Each named option is an integer >= 1 (or, for a candidate set, a tuple of them)."""
    for name in names:
        v = getattr(opts, name)
        values = v if isinstance(v, tuple) else (v,)
        if not values or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in values):
            raise ConfigError(f"{name}: must be an integer >= 1, got {v!r}")
