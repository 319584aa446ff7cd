"""streams' decode options."""

from __future__ import annotations

import dataclasses

from lsjax.config import ConfigError
from lsjax.methods.registry import option

# The streams run the target's own top layers on the one-device weight layout; a mesh holds the grouped,
# split one (`lsjax.mesh.place`), which they do not read.
NO_MESH = "its streams run the target's top layers in the one-device weight layout, not the mesh's split one"


@dataclasses.dataclass(frozen=True)
class StreamsOptions:
    draft: str | None = option(
        None, "a stream checkpoint (directory), or 'random' (untrained); default: the shipped one"
    )
    tree: str | None = option(
        None, "widths, or proposed:kept widths for early-exit pruning, e.g. 3,4,4:2,2,2 (default: one node on a CPU)"
    )
    streams: int | None = option(None, "speculative streams gamma (<= the checkpoint's)")
    msa_layers: int | None = option(None, "MSA layers N_s (the checkpoint's)")
    streams_at: str = option("accepted", "where the next tree's streams are read", flag=False)

    def __post_init__(self):
        for name in ("streams", "msa_layers"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, int) and v >= 1):
                raise ConfigError(f"{name}: must be an integer >= 1, got {v!r}")
