"""What `train.py` trains: a config's `kind:` -> its config class, trainer and export.

    kind = kinds.get(kinds.kind_of(raw))                  # raw: the YAML as a dict; no `kind:` = "longspec"
    cfg = from_dict(kind.config_class, raw)
    out = kind.fit(cfg, resume=False, progress=True, config_dict=raw)   # `lsjax.train.runner.run_steps`' summary
    info = kind.export(cfg, out_dir, config_path="X.yaml", tree=None)   # a directory decode.py loads

Kinds are registered by the method folders that train them (`lsjax.methods.registry.register_kind`, in a
folder's `__init__.py`), beside the method they train for. Every trainer shares the step loop
(`lsjax.train.runner`), the optimizer and gradient accumulation (`lsjax.train.step`) and the batch readers
(`lsjax.train.inputs`); a kind adds its config, data, losses and export.
"""

from __future__ import annotations

from lsjax.methods.registry import Kind, get_kind, kind_names, load, register_kind

DEFAULT = "longspec"  # what a config without `kind:` trains (every config written before kinds existed)

__all__ = ["DEFAULT", "Kind", "fit", "get", "kind_of", "load", "names", "register"]

names = kind_names
get = get_kind
register = register_kind


def kind_of(raw) -> str:
    """The kind a config (the YAML as a dict) names; `DEFAULT` when it names none."""
    kind = raw.get("kind", DEFAULT) if isinstance(raw, dict) else DEFAULT
    return DEFAULT if kind is None else kind


def fit(cfg, **opts) -> dict:
    """Trains `cfg` with its kind's trainer (`cfg.kind`)."""
    return get(cfg.kind).fit(cfg, **opts)
