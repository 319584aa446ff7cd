"""DeLS-Spec checkpoints on the decode side: the local head (with its unigram prior) and the block drafter.

    <drafts>/<target>/local-<kind>/    model.safetensors (params in float16, `unigram_logprior` [V] float32,
                                       `vocab_ids` when the head's loss covered a pruned vocabulary)
                                       + config.json (LocalHeadConfig, the prior's counts, training summary)
    <drafts>/<target>/block-s<s>/      model.safetensors (bfloat16: the draft layer + `mask_embed`, `vocab_ids`
                                       when pruned) + config.json (DraftConfig, BlockConfig, training summary)

Both are `lsjax.artifacts` directories (kinds "local_head" and "block"); the layout before 2026-11-26
(local_head.npz + local_head.json, params.npz + block.json) still loads. Training writes them
(`lsjax.methods.dels.train_local_head`, `lsjax.methods.dels.train`); nothing here imports the trainer. A bad
file is a named one-line error (CorruptFileError, ShapeMismatchError, ModelNotFoundError).
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from lsjax import artifacts
from lsjax.config import BlockConfig, DraftConfig, LocalHeadConfig, from_dict, to_dict
from lsjax.errors import CorruptFileError, ModelNotFoundError, ShapeMismatchError
from lsjax.methods.dels import local_head as lh
from lsjax.methods.dels import model as bd
from lsjax.methods.dels.drafter import prepare_dels_params
from lsjax.methods.longspec.checkpoint import DRAFTS_DIR, check_draft_fits, load_draft, target_key
from lsjax.models.draft_params import DraftParams
from lsjax.models.module import variables_problem

LOCAL, BLOCK = "local_head", "block"  # their lsjax.artifacts kinds


def default_local_head_path(model_path, kind: str) -> Path | None:
    p = DRAFTS_DIR / target_key(model_path) / f"local-{kind}"
    return p if artifacts.has_weights(p, LOCAL) else None


def default_block_path(model_path, block_size: int) -> Path | None:
    p = DRAFTS_DIR / target_key(model_path) / f"block-s{block_size}"
    return p if artifacts.has_weights(p, BLOCK) else None


# ---------------------------------------------------------------------------------------------- local head


def save_local_head(
    path, params: dict, cfg: LocalHeadConfig, prior: np.ndarray, target_name: str, vocab_ids=None, extra=None
) -> int:
    """Writes a local-head directory (float16 params, the prior in float32); returns the size of its weights
    file in bytes."""
    arrays = {k: np.asarray(v, np.float32) for k, v in params.items()}
    arrays["unigram_logprior"] = np.asarray(prior, np.float32)
    if vocab_ids is not None:
        arrays["vocab_ids"] = np.asarray(vocab_ids, np.int32)
    meta = {"target": target_name, "local_head": to_dict(cfg), **(extra or {})}
    return artifacts.save_weights(path, arrays, meta, kind=LOCAL)


def load_local_head(path, config=None):
    """(params as float32 numpy, LocalHeadConfig, unigram_logprior [V], vocab_ids or None, meta). With a target
    `config`, the params are checked against the module `LocalHead(cfg, config.hidden_size)` and the prior
    against the vocabulary: a ShapeMismatchError naming the variable and both shapes."""
    path = Path(path)
    arrays, meta = artifacts.load_weights(path, LOCAL)
    cfg = artifacts.parse_config(path, LOCAL, lambda: from_dict(LocalHeadConfig, meta["local_head"], "local_head"))
    prior = arrays.pop("unigram_logprior", None)
    vocab_ids = arrays.pop("vocab_ids", None)
    if prior is None:
        raise CorruptFileError(f"{artifacts.files(path, LOCAL)[0]}: the unigram prior is missing")
    params = arrays
    if config is not None:
        where = f"local head {path} does not fit target {config.name}"
        bad = variables_problem(lh.LocalHead(cfg, config.hidden_size), params, where)
        if bad is None and prior.shape != (config.vocab_size,):
            bad = f"{where}: its prior covers {prior.shape[0]} tokens, the target's vocabulary {config.vocab_size}"
        if bad is not None:
            raise ShapeMismatchError(bad)
    return params, cfg, prior, vocab_ids, meta


# ---------------------------------------------------------------------------------------------- block drafter


def save_block_draft(path, params, draft_cfg: DraftConfig, block_cfg: BlockConfig, target_name: str, extra=None):
    """Writes a block-draft directory from `params` (a DraftParams, or a dict in the file layout); returns the
    size of its weights file in bytes."""
    meta = {"target": target_name, "draft_config": to_dict(draft_cfg), "block": to_dict(block_cfg), **(extra or {})}
    return artifacts.save_weights(path, DraftParams.of(params).arrays(), meta, kind=BLOCK)


def load_block_draft(path, config) -> tuple[dict, DraftConfig, BlockConfig, dict]:
    """(the draft's arrays, checked against target `config`, DraftConfig, BlockConfig, meta) of a block-draft
    directory; `DraftParams.from_arrays` makes the first the typed structure."""
    path = Path(path)
    params, meta = artifacts.load_weights(path, BLOCK)
    dcfg, bcfg = artifacts.parse_config(
        path,
        BLOCK,
        lambda: (
            from_dict(DraftConfig, meta["draft_config"], "draft_config"),
            from_dict(BlockConfig, meta["block"], "block"),
        ),
    )
    check_block_fits(params, dcfg, config, str(path), meta.get("target", ""))
    return params, dcfg, bcfg, meta


def check_block_fits(params: dict, dcfg: DraftConfig, config, where: str, made_for: str = "") -> None:
    """`check_draft_fits` against the block draft's module (`lsjax.methods.dels.model.BlockDraft`)."""
    check_draft_fits(params, dcfg, config, where, made_for, model=bd.BlockDraft(config, dcfg))


def longspec_as_block(model, draft: str | None) -> tuple[DraftParams, DraftConfig]:
    """A block drafter's starting point from a LongSpec draft (a directory, or None for the shipped one):
    its layer, vocabulary and window, plus a mask embedding at the mean of the target's embedding rows."""
    from lsjax.methods.longspec.checkpoint import default_draft_path

    path = Path(draft) if draft else default_draft_path(model.path)
    if path is None:
        raise ModelNotFoundError(f"no shipped LongSpec draft for {target_key(model.path)} to start a block draft from")
    arrays, dcfg, meta = load_draft(path)
    check_draft_fits(arrays, dcfg, model.config, str(path), meta.get("target", ""))
    mask = np.asarray(jnp.mean(jnp.asarray(model.params["embed"], jnp.float32), axis=0))
    return DraftParams.from_arrays(arrays).replace_weights(mask_embed=mask), dcfg


def with_block_heads(params, target_params: dict, config) -> DraftParams:
    """`params` (a DraftParams or the file's arrays) on the device, with the tensors drafting reads every step
    gathered once: the pruned vocabulary's LM-head rows."""
    return DraftParams.of(jax.tree.map(jnp.asarray, params)).with_vocab_head(target_params, config)


def load_block(model, draft: str | None, block_size: int | None):
    """(block DraftParams with the derived head, DraftConfig, BlockConfig) for a loaded target. `draft`: a block-draft
    directory, "longspec" (the shipped LongSpec draft with a fresh mask embedding: untrained for blocks), or
    None (the shipped block draft)."""
    from lsjax.errors import ModelNotFoundError
    from lsjax.methods.dels.checkpoint import (
        default_block_path,
        load_block_draft,
        longspec_as_block,
        with_block_heads,
    )
    from lsjax.methods.longspec.checkpoint import target_key

    if draft == "longspec":
        params, dcfg = longspec_as_block(model, None)
        bcfg = BlockConfig(block_size or DEFAULT_BLOCK_SIZES[0])
    else:
        path = draft
        if path is None:
            sizes = (block_size,) if block_size else DEFAULT_BLOCK_SIZES
            path = next((p for p in (default_block_path(model.path, s) for s in sizes) if p is not None), None)
        if path is None:
            raise ModelNotFoundError(
                f"no shipped block draft for {target_key(model.path)}; pass --draft DIR, or "
                f"--draft longspec (the LongSpec draft, untrained for blocks), or {TRAIN_HINT}"
            )
        params, dcfg, bcfg, _ = load_block_draft(path, model.config)
        if block_size:
            bcfg = BlockConfig(block_size)
    return with_block_heads(params, model.params, model.config), dcfg, bcfg


def load_dels_params(model, block_params: dict, local_head: str | None):
    """(LocalHeadConfig, dels params) with the local head `local_head`: a kind (gru | markov: the shipped head)
    or a directory; None = gru."""
    from pathlib import Path

    from lsjax.config import LOCAL_HEADS
    from lsjax.errors import ModelNotFoundError
    from lsjax.methods.dels.checkpoint import default_local_head_path, load_local_head
    from lsjax.methods.longspec.checkpoint import target_key

    spec = local_head or "gru"
    path = default_local_head_path(model.path, spec) if spec in LOCAL_HEADS else Path(spec)
    if path is None:
        raise ModelNotFoundError(
            f"no shipped {spec} local head for {target_key(model.path)}; pass --local-head DIR or train one: "
            "python train.py --config configs/train/smollm2-localhead.yaml"
        )
    params, cfg, prior, head_vocab, _ = load_local_head(path, model.config)
    embed = jnp.asarray(model.params["embed"], jnp.float32)
    return cfg, prepare_dels_params(block_params, params, prior, head_vocab, embed)


DEFAULT_BLOCK_SIZES = (8, 16)  # shipped block drafts are looked up in this order when no size is given


TRAIN_HINT = (
    "train one: python train.py --config configs/train/smollm2-block.yaml, then "
    "python train.py --config configs/train/smollm2-block.yaml --export lsjax/drafts/<target>/block-s8"
)


def draft_info(opts) -> dict:
    """`--json`'s "draft" field for block and dels: the block draft's directory ("shipped" by default, "longspec"
    for the LongSpec draft with an untrained mask embedding) and its layout (lsjax's own: the only one)."""
    given = opts.weights()
    if given is None or given == "longspec":
        return {"dir": given or "shipped", "format": "lsjax"}
    return {"dir": str(given), "format": "lsjax"}
