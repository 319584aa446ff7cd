"""streams: Speculative Streaming (lossless mode): the verify forward's speculative streams draft the next tree."""

from lsjax.methods.registry import cached, register, register_kind
from lsjax.methods.streams.config import NO_MESH, StreamsOptions


@register(
    "streams",
    StreamsOptions,
    help="Speculative Streaming: the verify forward's speculative streams draft the next tree",
    no_mesh=NO_MESH,
    describe_draft="lsjax.methods.streams.checkpoint:draft_info",
)
def build(model, opts: StreamsOptions, cache):
    from lsjax.methods.streams.checkpoint import load_streams_drafter

    args = (opts.draft, opts.streams, opts.msa_layers, opts.tree, opts.streams_at)
    return cached(cache, ("streams", *args), lambda: load_streams_drafter(model, *args))


@register_kind(
    "streams",
    "Speculative Streaming's streams, from the shared target-feature cache",
    config="lsjax.methods.streams.train:StreamsTrainConfig",
    export="lsjax.methods.streams.train:export_kind",
)
def fit(cfg, **run):
    from lsjax.methods.streams.train import fit_streams

    return fit_streams(cfg, **run)
