"""DeLS-Spec checkpoints on the decode side: the local head (with its unigram prior) and the block drafter.

    <drafts>/<target>/local-<kind>/    local_head.npz (params in float16, `unigram_logprior` [V] float32,
                                       `vocab_ids` when the head's loss covered a pruned vocabulary)
                                       + local_head.json (LocalHeadConfig, the prior's counts, training summary)
    <drafts>/<target>/block-s<s>/      params.npz (the draft layer + `mask_embed`, `vocab_ids` when pruned)
                                       + block.json (DraftConfig, BlockConfig, training summary)

Training writes them (`lsjax.train.local_head`, `lsjax.train.block`); nothing here imports the trainer. A bad
file is a named one-line error (CorruptFileError, ShapeMismatchError, ModelNotFoundError).
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from lsjax.config import BlockConfig, ConfigError, DraftConfig, LocalHeadConfig, from_dict, to_dict
from lsjax.drafters.checkpoints import _NPZ_ERRORS, DRAFTS_DIR, _reason, check_draft_fits, load_draft, target_key
from lsjax.errors import CorruptFileError, ModelNotFoundError, ShapeMismatchError
from lsjax.models import block_draft as bd
from lsjax.models import local_head as lh
from lsjax.models.draft_params import DraftParams

LOCAL_PARAMS, LOCAL_META = "local_head.npz", "local_head.json"
BLOCK_PARAMS, BLOCK_META = "params.npz", "block.json"


def default_local_head_path(model_path, kind: str) -> Path | None:
    p = DRAFTS_DIR / target_key(model_path) / f"local-{kind}"
    return p if (p / LOCAL_PARAMS).is_file() else None


def default_block_path(model_path, block_size: int) -> Path | None:
    p = DRAFTS_DIR / target_key(model_path) / f"block-s{block_size}"
    return p if (p / BLOCK_PARAMS).is_file() else None


# ---------------------------------------------------------------------------------------------- local head


def save_local_head(
    path, params: dict, cfg: LocalHeadConfig, prior: np.ndarray, target_name: str, vocab_ids=None, extra=None
) -> int:
    """Writes a local-head directory; returns the size of its params file in bytes."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    arrays = {k: np.asarray(v, np.float16) for k, v in params.items()}
    arrays["unigram_logprior"] = np.asarray(prior, np.float32)
    if vocab_ids is not None:
        arrays["vocab_ids"] = np.asarray(vocab_ids, np.int32)
    np.savez(path / LOCAL_PARAMS, **arrays)
    meta = {"target": target_name, "local_head": to_dict(cfg), **(extra or {})}
    (path / LOCAL_META).write_text(json.dumps(meta, indent=2) + "\n")
    return (path / LOCAL_PARAMS).stat().st_size


def load_local_head(path, config=None):
    """(params as float32 numpy, LocalHeadConfig, unigram_logprior [V], vocab_ids or None, meta). With a target
    `config`, the head's shapes are checked against it."""
    path = Path(path)
    if not (path / LOCAL_PARAMS).is_file() or not (path / LOCAL_META).is_file():
        raise ModelNotFoundError(f"no local head at {path} (expected {LOCAL_PARAMS} and {LOCAL_META})")
    try:
        meta = json.loads((path / LOCAL_META).read_text())
        cfg = from_dict(LocalHeadConfig, meta["local_head"], "local_head")
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
        raise CorruptFileError(f"{path / LOCAL_META}: not a local-head description ({_reason(e)})") from None
    except ConfigError as e:
        raise CorruptFileError(f"{path / LOCAL_META}: {e}") from None
    try:
        with np.load(path / LOCAL_PARAMS) as z:
            arrays = {k: z[k] for k in z.files}
    except _NPZ_ERRORS as e:
        raise CorruptFileError(f"{path / LOCAL_PARAMS}: truncated or corrupt local head ({_reason(e)})") from None
    prior = arrays.pop("unigram_logprior", None)
    vocab_ids = arrays.pop("vocab_ids", None)
    if prior is None:
        raise CorruptFileError(f"{path / LOCAL_PARAMS}: the unigram prior is missing")
    params = {k: v.astype(np.float32) for k, v in arrays.items()}
    if config is not None:
        bad = lh.check_params(params, cfg, config.hidden_size)
        if bad is None and prior.shape != (config.vocab_size,):
            bad = f"its prior covers {prior.shape[0]} tokens, the target's vocabulary {config.vocab_size}"
        if bad is not None:
            raise ShapeMismatchError(f"local head {path} does not fit target {config.name}: {bad}")
    return params, cfg, prior, vocab_ids, meta


# ---------------------------------------------------------------------------------------------- block drafter


def save_block_draft(path, params, draft_cfg: DraftConfig, block_cfg: BlockConfig, target_name: str, extra=None):
    """Writes a block-draft directory from `params` (a DraftParams, or a dict in the file layout); returns the
    size of its params file in bytes."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    np.savez(path / BLOCK_PARAMS, **{k: np.asarray(v) for k, v in DraftParams.of(params).arrays().items()})
    meta = {"target": target_name, "draft_config": to_dict(draft_cfg), "block": to_dict(block_cfg), **(extra or {})}
    (path / BLOCK_META).write_text(json.dumps(meta, indent=2) + "\n")
    return (path / BLOCK_PARAMS).stat().st_size


def load_block_draft(path, config) -> tuple[dict, DraftConfig, BlockConfig, dict]:
    """(the params.npz arrays, checked against target `config`, DraftConfig, BlockConfig, meta) of a block-draft
    directory; `DraftParams.from_arrays` makes the first the typed structure."""
    path = Path(path)
    if not (path / BLOCK_PARAMS).is_file() or not (path / BLOCK_META).is_file():
        raise ModelNotFoundError(f"no block draft at {path} (expected {BLOCK_PARAMS} and {BLOCK_META})")
    try:
        meta = json.loads((path / BLOCK_META).read_text())
        dcfg = from_dict(DraftConfig, meta["draft_config"], "draft_config")
        bcfg = from_dict(BlockConfig, meta["block"], "block")
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
        raise CorruptFileError(f"{path / BLOCK_META}: not a block-draft description ({_reason(e)})") from None
    except ConfigError as e:
        raise CorruptFileError(f"{path / BLOCK_META}: {e}") from None
    try:
        with np.load(path / BLOCK_PARAMS) as z:
            params = {k: z[k] for k in z.files}
    except _NPZ_ERRORS as e:
        raise CorruptFileError(f"{path / BLOCK_PARAMS}: truncated or corrupt block draft ({_reason(e)})") from None
    check_block_fits(params, dcfg, config, str(path), meta.get("target", ""))
    return params, dcfg, bcfg, meta


def check_block_fits(params: dict, dcfg: DraftConfig, config, where: str, made_for: str = "") -> None:
    """`check_draft_fits` against the block draft's schema (`lsjax.models.block_draft.param_specs`)."""
    check_draft_fits(params, dcfg, config, where, made_for, specs=bd.param_specs(config))


def longspec_as_block(model, draft: str | None) -> tuple[DraftParams, DraftConfig]:
    """A block drafter's starting point from a LongSpec draft (a directory, or None for the shipped one):
    its layer, vocabulary and window, plus a mask embedding at the mean of the target's embedding rows."""
    from lsjax.drafters.checkpoints import default_draft_path

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
