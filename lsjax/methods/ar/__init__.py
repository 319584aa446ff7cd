"""ar: plain autoregressive decoding, one token per target forward (the engine's step with an empty tree)."""

from lsjax.methods.registry import register


@register("ar", help="autoregressive, one token per target forward", speculative=False)
def build(model, opts, cache):
    from lsjax.engine.types import ARDrafter

    return ARDrafter(), None
