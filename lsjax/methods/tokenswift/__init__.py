"""tokenswift: TokenSwift's multi-token heads, n-gram reuse and a partial-KV draft pass, for ultra-long generation."""

from lsjax.methods.registry import Kind, register, register_kind
from lsjax.methods.tokenswift.config import TokenSwiftOptions


@register(
    "tokenswift", TokenSwiftOptions, help="TokenSwift: multi-token heads + n-gram reuse + a partial-KV draft pass"
)
def build(model, opts: TokenSwiftOptions, cache):
    from lsjax.methods.tokenswift.drafter import load_tokenswift

    return load_tokenswift(model, opts.heads, opts.config())


register_kind(
    Kind(
        "tokenswift-heads",
        "TokenSwift's multi-token heads, from the shared target-feature cache",
        "lsjax.methods.tokenswift.train:HeadsTrainConfig",
        "lsjax.methods.tokenswift.train:fit_heads",
        "lsjax.methods.tokenswift.train:export_kind",
    )
)
