"""echo: proposes the last token again, as a chain (a method from a folder outside lsjax)."""

from lsjax.methods.registry import Kind, register, register_kind

from .config import EchoOptions


@register("echo", EchoOptions, help="repeat the last token (a method folder outside lsjax)")
def build(model, opts: EchoOptions, cache):
    from .drafter import EchoDrafter

    return EchoDrafter(depth=opts.echo_depth), None


register_kind(
    Kind(
        "echo-bias",
        "a bias over the vocabulary, fitted to the data (a trainer on the shared step loop)",
        f"{__name__}.train:EchoTrainConfig",
        f"{__name__}.train:fit",
        f"{__name__}.train:export",
    )
)
