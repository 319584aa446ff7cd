"""Stream checkpoints on the decode side: find, read, check and write the streams' weights (`lsjax.artifacts`,
kind "streams"), and build the drafter from them. The weights are `lsjax.methods.streams.model.SpeculativeStreams`'s
variables, checked against its declaration before anything compiles."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import jax
import numpy as np

from lsjax import artifacts
from lsjax.config import ConfigError, from_dict
from lsjax.errors import ModelNotFoundError, ShapeMismatchError
from lsjax.methods.longspec.checkpoint import DRAFTS_DIR, target_key
from lsjax.methods.streams import model as ss
from lsjax.methods.streams.drafter import StreamsDrafter
from lsjax.models.module import variables_problem
from lsjax.tree import TreeConfig, for_device


def default_streams_path(model_path) -> Path | None:
    p = DRAFTS_DIR / target_key(model_path) / "streams"
    return p if artifacts.has_weights(p, "streams") else None


def save_streams(directory, params: dict, scfg: ss.StreamsConfig, meta: dict | None = None) -> Path:
    from lsjax.config import to_dict

    artifacts.save_weights(directory, params, {"streams_config": to_dict(scfg), **(meta or {})}, kind="streams")
    return Path(directory)


def load_streams(path) -> tuple[dict, ss.StreamsConfig, dict]:
    """(params as float32 numpy, StreamsConfig, metadata) of a stream checkpoint directory."""
    params, meta = artifacts.load_weights(path, "streams")
    scfg = artifacts.parse_config(
        path, "streams", lambda: from_dict(ss.StreamsConfig, meta["streams_config"], "streams_config")
    )
    return params, scfg, meta


def check_streams_fit(params: dict, config, scfg: ss.StreamsConfig, where: str) -> None:
    """`params` as `SpeculativeStreams(config, scfg)`'s variables, or a one-line ShapeMismatchError naming the
    variable and both shapes."""
    if problem := variables_problem(ss.SpeculativeStreams(config, scfg), params, f"streams {where}"):
        raise ShapeMismatchError(f"{problem}; it does not fit target {config.name}")


def parse_stream_tree(spec) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
    """ "2,2,2" (proposed widths) or "3,4,4:2,2,2" (proposed, then kept by early-exit pruning)."""
    from lsjax.tree import parse_tree

    if isinstance(spec, TreeConfig):
        return spec.widths, None
    if isinstance(spec, (tuple, list, int)):
        return parse_tree(spec).widths, None
    full, _, kept = str(spec).partition(":")
    return parse_tree(full).widths, (parse_tree(kept).widths if kept else None)


def draft_info(opts) -> dict | None:
    """`--json`'s "draft" field: the stream checkpoint given (lsjax's own format), None for the shipped one."""
    if opts.draft is None:
        return None
    return {"dir": str(opts.draft), "format": "random" if opts.draft == "random" else "lsjax"}


def load_streams_drafter(model, draft=None, num_streams=None, msa_layers=None, tree=None, streams_at="accepted"):
    """(drafter, stream params) for a loaded model: `draft` a checkpoint directory, "random" (untrained:
    lossless, accepts little) or None (the shipped checkpoint for this target)."""
    config = model.config
    given = Path(draft) if draft not in (None, "random") else None
    if given is not None and artifacts.stored_kind(given) == "longspec":
        # A LongSpec draft, handed to every method alike (the bench does): use the streams' own checkpoint.
        draft = None if default_streams_path(model.path) else "random"
        print(f"[lsjax] streams: {given} is a LongSpec draft; using {draft or 'the shipped streams'}", file=sys.stderr)
    if draft == "random":
        scfg = ss.StreamsConfig(num_streams=num_streams or 3, msa_layers=msa_layers or min(4, config.num_layers))
        params = jax.tree.map(np.asarray, ss.SpeculativeStreams(config, scfg).random_weights(jax.random.key(0)))
        meta = {}
    else:
        path = Path(draft) if draft else default_streams_path(model.path)
        if path is None:
            raise ModelNotFoundError(
                f"no shipped stream checkpoint for {target_key(model.path)}; pass --draft DIR (or --draft random)"
            )
        params, scfg, meta = load_streams(path)
        check_streams_fit(params, config, scfg, str(path))
        if msa_layers is not None and msa_layers != scfg.msa_layers:
            raise ConfigError(
                f"msa_layers: the checkpoint at {path} has {scfg.msa_layers} MSA layers, got {msa_layers}"
            )
        if num_streams is not None and num_streams != scfg.num_streams:
            # Stream j attends to streams <= j only, so the first gamma' of them are exact without the rest.
            if num_streams > scfg.num_streams:
                raise ConfigError(
                    f"streams: the checkpoint at {path} has {scfg.num_streams} streams, cannot run {num_streams}"
                )
            params = dict(params, stream_embed=params["stream_embed"][:num_streams])
            scfg = dataclasses.replace(scfg, num_streams=num_streams)
    shipped = for_device(meta.get("tree"), jax.default_backend())
    widths, kept = parse_stream_tree(tree or shipped or default_tree(scfg))
    widths = widths[: scfg.num_streams]
    kept = kept[: len(widths)] if kept else None
    if len(widths) < scfg.num_streams:
        # A shallower tree reads only the first streams, and stream j attends to streams <= j only: running
        # just those is exact and spares the rest's rows through the top layers.
        params = dict(params, stream_embed=params["stream_embed"][: len(widths)])
        scfg = dataclasses.replace(scfg, num_streams=len(widths))
    return StreamsDrafter.for_target(config, scfg, widths, kept, streams_at), params


def default_tree(scfg: ss.StreamsConfig) -> str:
    # On a CPU one stream node: each verified node costs (studies/tree_cost) more than the streams'
    # acceptance returns (docs/methods/streams.md); wider elsewhere.
    if jax.default_backend() == "cpu":
        return "1"
    return ",".join(["4"] * scfg.num_streams)
