"""streams: Speculative Streaming (lossless mode): the verify forward's speculative streams draft the next tree."""

from lsjax.methods.registry import register, register_kind
from lsjax.methods.streams.config import StreamsOptions


@register(
    "streams",
    StreamsOptions,
    help="Speculative Streaming: the verify forward's speculative streams draft the next tree",
)
def build(model, opts: StreamsOptions, cache):
    from lsjax.methods.streams.checkpoint import load_streams_drafter

    key = ("streams", opts.draft, opts.streams, opts.msa_layers, opts.tree, opts.streams_at)
    if cache is not None and key in cache:
        return cache[key]
    out = load_streams_drafter(model, opts.draft, opts.streams, opts.msa_layers, opts.tree, opts.streams_at)
    if cache is not None:
        cache[key] = out
    return out


@register_kind(
    "streams",
    "Speculative Streaming's streams, from the shared target-feature cache",
    config="lsjax.methods.streams.train:StreamsTrainConfig",
    export="lsjax.methods.streams.train:export_kind",
)
def fit(cfg, **run):
    from lsjax.methods.streams.train import fit_streams

    return fit_streams(cfg, **run)
