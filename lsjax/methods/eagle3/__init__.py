"""eagle3: published EAGLE-3 drafts (EAGLE / SpecForge and speculators layouts) and EAGLE-2's dynamic tree."""

from lsjax.methods.eagle3.config import Eagle3Options
from lsjax.methods.registry import cached, register


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
