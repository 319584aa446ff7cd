"""auto: per step, the candidate (AR, prompt lookup, draft chains and trees, hybrid) with the most expected
tokens per second on this device."""

from lsjax.methods.auto.config import AutoOptions
from lsjax.methods.registry import register


@register(
    "auto",
    AutoOptions,
    help="adaptive: per step, the candidate (AR, PLD, draft trees, hybrid) with the most expected tokens per "
    "second on this device",
    uses_draft=True,
    describe_draft="lsjax.methods.auto.config:draft_info",
)
def build(model, opts: AutoOptions, cache):
    from lsjax.methods.auto.drafter import build_auto

    return build_auto(model, opts, cache)
