"""block and dels: DeLS-Spec's block-parallel draft (one forward drafts a chain of s tokens), alone or with its
logits fused with a local head and a unigram prior."""

from lsjax.methods.dels.config import BlockOptions, DelsOptions
from lsjax.methods.registry import cached, register, register_kind


@register(
    "block",
    BlockOptions,
    help="block-parallel draft: one forward drafts a chain of s tokens (DFlash's role)",
    uses_draft=True,
    describe_draft="lsjax.methods.dels.checkpoint:draft_info",
)
def build_block(model, opts: BlockOptions, cache):
    from lsjax.methods.dels.checkpoint import load_block
    from lsjax.methods.dels.drafter import BlockDrafter

    weights = _weights(opts)
    key = ("block", weights, opts.block_size)
    params, dcfg, bcfg = cached(cache, key, lambda: load_block(model, weights, opts.block_size))
    return BlockDrafter(block=bcfg, draft=dcfg, branches=opts.branches), params


@register(
    "dels",
    DelsOptions,
    help="DeLS-Spec: the block draft's logits fused with a local head and a unigram prior",
    uses_draft=True,
    describe_draft="lsjax.methods.dels.checkpoint:draft_info",
)
def build_dels(model, opts: DelsOptions, cache):
    from lsjax.methods.dels.checkpoint import load_block, load_dels_params
    from lsjax.methods.dels.drafter import BlockDrafter, with_weights

    weights = _weights(opts)
    key = ("block", weights, opts.block_size)
    params, dcfg, bcfg = cached(cache, key, lambda: load_block(model, weights, opts.block_size))
    hcfg, dels_params = cached(
        cache, ("dels", *key, opts.local_head), lambda: load_dels_params(model, params, opts.local_head)
    )
    drafter = BlockDrafter(block=bcfg, draft=dcfg, branches=opts.branches, local=hcfg)
    return drafter, with_weights(dels_params, opts.alpha, opts.beta)


_TRAIN_CONFIG = "lsjax.methods.dels.train_config:DelsTrainConfig"
_EXPORT = "lsjax.methods.dels.export:export_kind"


def _weights(opts: BlockOptions) -> str | None:
    import warnings

    from lsjax.errors import MethodNote

    if opts.block_draft is not None and opts.draft is None:
        warnings.warn(
            MethodNote("--block-draft is deprecated (it goes in the next release): use --draft"), stacklevel=3
        )
    return opts.weights()


@register_kind(
    "block",
    "DeLS-Spec's block-parallel draft, from the shared target-feature cache",
    config=_TRAIN_CONFIG,
    export=_EXPORT,
)
def fit_block(cfg, **run):
    from lsjax.methods.dels.train import fit_block

    return fit_block(cfg, **run)


@register_kind(
    "local_head",
    "DeLS-Spec's local head (GRU or Markov) and unigram prior, without the target",
    config=_TRAIN_CONFIG,
    export=_EXPORT,
)
def fit_local_head(cfg, **run):
    from lsjax.methods.dels.train_local_head import fit_local_head

    return fit_local_head(cfg, **run)
