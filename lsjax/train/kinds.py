"""What `train.py` trains: one registry from a config's `kind:` to its config class, trainer and export.

    kind = kinds.get(kinds.kind_of(raw))                  # raw: the YAML as a dict; no `kind:` = "longspec"
    cfg = from_dict(kind.config_class, raw)
    out = kind.fit(cfg, resume=False, progress=True, config_dict=raw)   # `lsjax.train.runner.run_steps`' summary
    info = kind.export(cfg, out_dir, config_path="X.yaml", tree=None)   # a directory decode.py loads

Every trainer shares the step loop (`lsjax.train.runner`), the optimizer and gradient accumulation
(`lsjax.train.step`) and the batch readers (`lsjax.train.inputs`); a kind adds its config, data, losses and
export. Its entry names them as "module:attribute" strings, imported on first use, so resolving a kind (and
rejecting an unknown one) loads neither jax nor optax.

A new trainer is one module (its config dataclass with a `kind` field, a `fit(cfg, *, resume, overwrite,
stop_after, log, progress, config_dict)` built on `prepare_run_dir` (which checks resume / overwrite against the
run's checkpoints) and `run_steps`, an export) plus one `register(Kind(...))` below.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable

from lsjax.config import ConfigError

DEFAULT = "longspec"  # what a config without `kind:` trains (every config written before kinds existed)


@dataclasses.dataclass(frozen=True)
class Kind:
    name: str
    help: str
    config: str  # "module:attribute" of the config dataclass
    trainer: str  # "module:attribute" of fit(cfg, *, resume, overwrite, stop_after, log, progress, config_dict)
    exporter: str  # "module:attribute" of export(cfg, out_dir, *, config_path, tree) -> dict (what to report)
    flags: tuple[str, ...] = ()  # train.py options that apply to this kind beyond the common ones

    @property
    def config_class(self) -> type:
        return _load(self.config)

    def fit(self, cfg, **opts) -> dict:
        return _load(self.trainer)(cfg, **opts)

    def export(self, cfg, out_dir, *, config_path: str | None = None, tree: str | None = None) -> dict:
        return _load(self.exporter)(cfg, out_dir, config_path=config_path, tree=tree)


_KINDS: dict[str, Kind] = {}


def register(kind: Kind) -> Kind:
    if kind.name in _KINDS and _KINDS[kind.name] != kind:
        raise ConfigError(f"kind: {kind.name!r} is already registered")
    _KINDS[kind.name] = kind
    return kind


def names() -> tuple[str, ...]:
    return tuple(_KINDS)


def kind_of(raw) -> str:
    """The kind a config (the YAML as a dict) names; `DEFAULT` when it names none."""
    kind = raw.get("kind", DEFAULT) if isinstance(raw, dict) else DEFAULT
    return DEFAULT if kind is None else kind


def get(name) -> Kind:
    if not isinstance(name, str) or name not in _KINDS:
        raise ConfigError(f"kind: unknown kind {name!r}; known kinds: {', '.join(_KINDS)}")
    return _KINDS[name]


def _load(path: str) -> Callable:
    module, attr = path.split(":")
    return getattr(importlib.import_module(module), attr)


# ---------------------------------------------------------------------------------------------- exports


def export_train_config(cfg, out_dir, *, config_path: str | None = None, tree: str | None = None) -> dict:
    """A TrainConfig run (longspec, block, local_head) -> its draft directory (`lsjax.train.export.export_run`);
    `tree` (longspec only): the default tree stored with the draft."""
    from lsjax.train.export import export_run
    from lsjax.tree import parse_device_trees

    trees = parse_device_trees(tree) if tree else None
    params = export_run(cfg, out_dir, extra={"train_config": config_path}, tree=trees)
    return {"tensors": len(params)}


def export_heads(cfg, out_dir, *, config_path: str | None = None, tree: str | None = None) -> dict:
    """A TokenSwift-heads run -> a heads directory (`lsjax.train.heads.export_heads`)."""
    from lsjax.train.heads import export_heads

    return {"tensors": len(export_heads(cfg, out_dir))}


def export_streams(cfg, out_dir, *, config_path: str | None = None, tree: str | None = None) -> dict:
    """A streams run -> a stream checkpoint directory (`lsjax.train.streams.export_streams`)."""
    from lsjax.train.streams import export_streams

    export_streams(cfg, out_dir)
    return {}


# ---------------------------------------------------------------------------------------------- the kinds

_TRAIN_CONFIG = "lsjax.train.config:TrainConfig"
register(
    Kind(
        "longspec",
        "the LongSpec draft (window self-attention + cross-attention on the target's cache)",
        _TRAIN_CONFIG,
        "lsjax.train.loop:fit",
        "lsjax.train.kinds:export_train_config",
        flags=("tree",),
    )
)
register(
    Kind(
        "block",
        "DeLS-Spec's block-parallel draft, from the shared target-feature cache",
        _TRAIN_CONFIG,
        "lsjax.train.block:fit_block",
        "lsjax.train.kinds:export_train_config",
    )
)
register(
    Kind(
        "local_head",
        "DeLS-Spec's local head (GRU or Markov) and unigram prior, without the target",
        _TRAIN_CONFIG,
        "lsjax.train.local_head:fit_local_head",
        "lsjax.train.kinds:export_train_config",
    )
)
register(
    Kind(
        "tokenswift-heads",
        "TokenSwift's multi-token heads, from the shared target-feature cache",
        "lsjax.train.heads:HeadsTrainConfig",
        "lsjax.train.heads:fit_heads",
        "lsjax.train.kinds:export_heads",
    )
)
register(
    Kind(
        "streams",
        "Speculative Streaming's streams, from the shared target-feature cache",
        "lsjax.train.streams:StreamsTrainConfig",
        "lsjax.train.streams:fit_streams",
        "lsjax.train.kinds:export_streams",
    )
)
