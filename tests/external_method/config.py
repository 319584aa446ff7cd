from __future__ import annotations

import dataclasses

from lsjax.config import ConfigError
from lsjax.methods.registry import option


@dataclasses.dataclass(frozen=True)
class EchoOptions:
    echo_depth: int = option(3, "tokens the chain repeats")

    def __post_init__(self):
        if not (isinstance(self.echo_depth, int) and 1 <= self.echo_depth <= 8):
            raise ConfigError(f"echo_depth: must be an integer in [1, 8], got {self.echo_depth!r}")
