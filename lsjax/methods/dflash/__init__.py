"""dflash: published DFlash block drafts (z-lab/dflash), verified as a chain or a tree, exactly at T > 0."""

from lsjax.methods.dflash.config import DFlashOptions
from lsjax.methods.registry import cached, register, register_kind


@register(
    "dflash",
    DFlashOptions,
    help="a DFlash block draft: one forward drafts a block, verified as a chain or a tree (--draft DIR)",
    uses_draft=True,
    describe_draft="lsjax.methods.dflash.checkpoint:draft_info",
)
def build(model, opts: DFlashOptions, cache):
    from lsjax.methods.dflash.checkpoint import load_dflash

    key = ("dflash", opts.draft, opts.dflash_tree, opts.block_size)
    return cached(cache, key, lambda: load_dflash(model, opts.draft, opts.dflash_tree, opts.block_size))


@register_kind(
    "dflash",
    "a DFlash block draft (block diffusion over the target's layer features), exported in z-lab's layout",
    config="lsjax.methods.dflash.train_config:DFlashTrainConfig",
    export="lsjax.methods.dflash.train:export_kind",
)
def fit(cfg, **run):
    from lsjax.methods.dflash.train import fit

    return fit(cfg, **run)
