"""pld: prompt lookup, continuing an earlier match of the last n-gram (no draft model)."""

from lsjax.methods.pld.config import PLDOptions
from lsjax.methods.registry import register


@register("pld", PLDOptions, help="prompt lookup: continue an earlier n-gram match")
def build(model, opts: PLDOptions, cache):
    from lsjax.methods.pld.drafter import PLDDrafter

    return PLDDrafter(num_tokens=opts.pld_tokens, ngram_max=opts.pld_ngram), None
