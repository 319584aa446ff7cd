"""tokenswift: TokenSwift's multi-token heads, n-gram reuse and a partial-KV draft pass, for ultra-long generation."""

from lsjax.methods.registry import register, register_kind
from lsjax.methods.tokenswift.config import TokenSwiftOptions


@register(
    "tokenswift",
    TokenSwiftOptions,
    help="TokenSwift: multi-token heads + n-gram reuse + a partial-KV draft pass",
    describe_draft="lsjax.methods.tokenswift.checkpoint:draft_info",
)
def build(model, opts: TokenSwiftOptions, cache):
    import warnings

    from lsjax.errors import MethodNote
    from lsjax.methods.tokenswift.checkpoint import load_tokenswift

    if opts.heads is not None and opts.draft is None:
        warnings.warn(MethodNote("--heads is deprecated (it goes in the next release): use --draft"), stacklevel=2)
    return load_tokenswift(model, opts.weights(), opts.config())


@register_kind(
    "tokenswift-heads",
    "TokenSwift's multi-token heads, from the shared target-feature cache",
    config="lsjax.methods.tokenswift.train:HeadsTrainConfig",
    export="lsjax.methods.tokenswift.train:export_kind",
)
def fit(cfg, **run):
    from lsjax.methods.tokenswift.train import fit_heads

    return fit_heads(cfg, **run)
