"""echo: proposes the last token again, as a chain (a method from a folder outside lsjax)."""

from lsjax.methods.registry import register, register_kind

from .config import EchoOptions


@register("echo", EchoOptions, help="repeat the last token (a method folder outside lsjax)")
def build(model, opts: EchoOptions, cache):
    from .drafter import EchoDrafter

    return EchoDrafter(depth=opts.echo_depth), None


@register_kind(
    "echo-bias",
    "a bias over the vocabulary, fitted to the data (a trainer on the shared step loop)",
    config=f"{__name__}.train:EchoTrainConfig",
    export=f"{__name__}.train:export",
)
def fit(cfg, **run):
    from .train import fit_bias

    return fit_bias(cfg, **run)
