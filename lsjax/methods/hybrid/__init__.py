"""hybrid: the LongSpec draft's tree and a prompt-lookup chain, verified together as one tree."""

from lsjax.methods.hybrid.config import HybridOptions, combined_tree
from lsjax.methods.registry import build as build_method
from lsjax.methods.registry import register


@register(
    "hybrid",
    HybridOptions,
    help="the draft's tree plus a prompt-lookup chain, verified together",
    uses_draft=True,
    describe_draft="lsjax.methods.longspec.checkpoint:draft_info",
)
def build(model, opts: HybridOptions, cache):
    from lsjax.methods.hybrid.drafter import HybridDrafter
    from lsjax.methods.pld.drafter import PLDDrafter

    drafter, draft_params = build_method(
        "longspec", model, cache=cache, draft=opts.draft, tree=combined_tree(opts.tree)
    )
    return HybridDrafter(drafter, PLDDrafter(num_tokens=opts.pld_tokens, ngram_max=opts.pld_ngram)), draft_params
