"""longspec: the LongSpec draft model's tree (window self-attention + cross-attention on the target's cache)."""

from lsjax.methods.longspec.config import LongSpecOptions
from lsjax.methods.registry import cached, register, register_kind


@register(
    "longspec",
    LongSpecOptions,
    help="the LongSpec draft model's tree",
    uses_draft=True,
    describe_draft="lsjax.methods.longspec.checkpoint:draft_info",
)
def build(model, opts: LongSpecOptions, cache):
    from lsjax.methods.longspec.checkpoint import load_checked

    return cached(cache, ("longspec", opts.draft, opts.tree), lambda: load_checked(model, opts.draft, opts.tree))


@register_kind(
    "longspec",
    "the LongSpec draft (window self-attention + cross-attention on the target's cache)",
    config="lsjax.methods.longspec.train_config:LongSpecTrainConfig",
    export="lsjax.methods.longspec.export:export_kind",
    flags=("tree",),
    default=True,  # every config written before kinds existed trains the LongSpec draft
)
def fit(cfg, **run):
    from lsjax.methods.longspec.train import fit

    return fit(cfg, **run)
