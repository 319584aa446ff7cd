"""TokenSwift heads on the decode side: find, read, check and write the heads (`lsjax.artifacts`, kind
"tokenswift"), and build the drafter from them."""

from __future__ import annotations

from pathlib import Path

import jax.numpy as jnp

from lsjax import artifacts
from lsjax.config import from_dict, to_dict
from lsjax.errors import ShapeMismatchError
from lsjax.methods.tokenswift import model as th
from lsjax.methods.tokenswift.config import TokenSwiftConfig
from lsjax.methods.tokenswift.drafter import TokenSwiftDrafter


def default_heads_path(model_path: str | Path) -> Path | None:
    """The heads shipped for this target, beside its LongSpec draft (`lsjax/drafts/<target>/tokenswift`)."""
    from lsjax.methods.longspec.checkpoint import DRAFTS_DIR, target_key

    p = DRAFTS_DIR / target_key(model_path) / HEADS_SUBDIR
    return p if artifacts.has_weights(p, "tokenswift") else None


def save_heads(path: str | Path, params: dict, heads: th.HeadsConfig, target_name: str, extra: dict | None = None):
    meta = {"target": target_name, "heads_config": to_dict(heads), **(extra or {})}
    artifacts.save_weights(path, params, meta, kind="tokenswift")


def load_heads(path: str | Path, config) -> tuple[dict, th.HeadsConfig, dict]:
    """(params as float32 numpy, HeadsConfig, metadata) of a heads directory, checked against target `config`."""
    path = Path(path)
    params, meta = artifacts.load_weights(path, "tokenswift")
    hcfg = artifacts.parse_config(
        path, "tokenswift", lambda: from_dict(th.HeadsConfig, meta["heads_config"], "heads_config")
    )
    for name, spec in th.param_specs(config, hcfg).items():
        if name not in params or tuple(params[name].shape) != spec.shape:
            got = tuple(params[name].shape) if name in params else "missing"
            raise ShapeMismatchError(
                f"heads {path} do not fit target {config.name}: tensor {name} is {got}, this target needs "
                f"{spec.shape} (they were made for {meta.get('target', '?')})"
            )
    return params, hcfg, meta


def load_tokenswift(model, heads: str | None, cfg: TokenSwiftConfig):
    """(drafter, heads params) for a loaded model: `heads` a directory, "zero" (untrained heads: each repeats
    the target's own next-token guess, so only the n-grams and the draft pass's own head propose anything
    useful), or None (the heads shipped for this target, else zero heads)."""
    path = Path(heads) if heads not in (None, "zero") else None
    if heads is None:
        path = default_heads_path(model.path)
    if path is None:
        hcfg = th.HeadsConfig()
        params = th.init_params(model.config, hcfg, {"final_norm": jnp.asarray(model.params["final_norm"])})
    else:
        params, hcfg, _ = load_heads(path, model.config)
    return TokenSwiftDrafter(cfg, hcfg), params


HEADS_SUBDIR = "tokenswift"
