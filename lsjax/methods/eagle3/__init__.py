"""eagle3: published EAGLE-3 drafts (EAGLE / SpecForge and speculators layouts) and EAGLE-2's dynamic tree."""

from lsjax.methods.eagle3.config import Eagle3Options
from lsjax.methods.registry import cached, register, register_kind


@register(
    "eagle3",
    Eagle3Options,
    help="an EAGLE-3 draft's dynamic tree (a published draft: --draft DIR)",
    uses_draft=True,
    describe_draft="lsjax.methods.eagle3.checkpoint:draft_info",
)
def build(model, opts: Eagle3Options, cache):
    from lsjax.methods.eagle3.checkpoint import load_eagle3

    key = ("eagle3", opts.draft, opts.eagle_tree)
    return cached(cache, key, lambda: load_eagle3(model, opts.draft, opts.eagle_tree))


@register_kind(
    "eagle3",
    "an EAGLE-3 draft (one layer on three target layers' streams, training-time test), exported in the EAGLE or "
    "speculators layout",
    config="lsjax.methods.eagle3.train_config:Eagle3TrainConfig",
    export="lsjax.methods.eagle3.export:export_kind",
)
def fit(cfg, **run):
    from lsjax.methods.eagle3.train import fit

    return fit(cfg, **run)
