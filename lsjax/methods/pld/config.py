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
        for name in ("pld_tokens", "pld_ngram"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"{name}: must be an integer >= 1, got {v!r}")
