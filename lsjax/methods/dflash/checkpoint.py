"""DFlash drafts as they are published, read without conversion.

One layout is recognised, "dflash": z-lab/dflash's `DFlashDraftModel` (the `z-lab/*-DFlash*` repositories, and
the drafts SpecForge trains, which save the same module). config.json is a Qwen3 config of the draft's layers
(`vocab_size` the target's) plus `block_size`, `num_target_layers` and `dflash_config` (`target_layer_ids`,
`mask_token_id`); tensors `layers.{i}.self_attn.{q,k,v,o}_proj.weight`, `layers.{i}.self_attn.{q,k}_norm.weight`,
`layers.{i}.{input,post_attention}_layernorm.weight`, `layers.{i}.mlp.{gate,up,down}_proj.weight`, `fc.weight`,
`hidden_norm.weight` and `norm.weight`. The draft has no embedding or LM head: it reads the target's.

Weights are single or sharded safetensors (through `model.safetensors.index.json`), or a `pytorch_model.bin`
read with torch's weights-only loader when torch is installed. They read into `DFlashDraft(config)`'s variables,
checked against its declaration before anything compiles.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import numpy as np

from lsjax.config import ConfigError, ModelConfig
from lsjax.errors import InputError, MissingTensorError, ModelNotFoundError, ShapeMismatchError, UnsupportedModelError
from lsjax.loading.corrupt import reading
from lsjax.loading.hf import checkpoint_tensors, config_from_hf
from lsjax.loading.layout import numpy_dtype
from lsjax.methods.dflash import model as dm
from lsjax.models.module import variables_problem

WHAT = "DFlash draft weights"
LAYOUTS = {
    "dflash": "z-lab/dflash's DFlashDraftModel (config.json with dflash_config; tensors fc.weight, hidden_norm.weight, "
    "norm.weight, layers.N.self_attn.*, layers.N.mlp.*)",
}
RANDOM_LAYERS = 2  # an untrained draft's decoder layers (the published drafts have 5 to 10)
RANDOM_BLOCK = 16  # ... and its block, the published drafts' usual one


@dataclasses.dataclass(frozen=True)
class DraftInfo:
    """What `--json` reports as "draft": where the draft came from and the layout read."""

    path: str
    format: str  # "dflash" | "random"

    def as_dict(self) -> dict:
        return {"dir": self.path, "format": self.format}


def detect(hf: dict, names) -> str:
    """The layout of a draft from its config and tensor names; an unknown one names the layouts recognised."""
    names = set(names)
    has = {"fc.weight", "hidden_norm.weight", "norm.weight"} <= names
    if has and any(n.startswith("layers.0.self_attn.") for n in names):
        return "dflash"
    found = ", ".join(sorted(names)[:6]) or "none"
    known = "; ".join(f"{k}: {v}" for k, v in LAYOUTS.items())
    raise UnsupportedModelError(f"not a DFlash draft in a layout lsjax reads (recognised: {known}); found {found}")


def draft_config(hf: dict, target: ModelConfig, fc_in: int | None = None) -> dm.DFlashConfig:
    """The DFlashConfig a published config.json describes, for `target` (whose dtype the draft takes). `fc_in`:
    the fc weight's input width, from which the target's hidden size is read (else the draft's own)."""
    dflash = dict(hf.get("dflash_config") or {})
    if hf.get("attention_bias") or hf.get("mlp_bias"):
        raise UnsupportedModelError("this DFlash draft has attention or MLP biases, which lsjax's dflash does not run")
    sliding = hf.get("use_sliding_window") and "sliding_attention" in (hf.get("layer_types") or ["sliding_attention"])
    if sliding:
        raise UnsupportedModelError("this DFlash draft has sliding-window layers, which lsjax's dflash does not run")
    if "block_size" not in hf:
        raise UnsupportedModelError("DFlash config.json: no block_size (a DFlash draft's config has one)")
    if dflash.get("mask_token_id") is None:
        raise UnsupportedModelError("DFlash config.json: no dflash_config.mask_token_id")
    layer_hf = {**hf, "model_type": "qwen3", "eos_token_id": None, "pad_token_id": 0, "bos_token_id": None}
    layer_hf.setdefault("vocab_size", target.vocab_size)
    try:
        layer = config_from_hf(layer_hf, name="dflash")
    except (ConfigError, KeyError) as e:
        raise UnsupportedModelError(f"DFlash config.json: {e}") from None
    layer = dataclasses.replace(
        layer,
        dtype=target.dtype,
        max_position=max(layer.max_position, target.max_position),
        tie_embeddings=False,
        qkv_bias=False,
    )
    ids = dflash.get("target_layer_ids")
    if ids is None:
        ids = dm.default_layer_ids(int(hf.get("num_target_layers", target.num_layers)), layer.num_layers)
    ids = tuple(int(i) for i in ids)
    dt = layer.hidden_size if fc_in is None or fc_in % len(ids) else fc_in // len(ids)
    try:
        return dm.DFlashConfig(layer, dt, ids, int(hf["block_size"]), int(dflash["mask_token_id"]))
    except ConfigError as e:
        raise UnsupportedModelError(f"DFlash config.json: {e}") from None


def _mapping(cfg: dm.DFlashConfig) -> dict[str, tuple[str, callable]]:
    """lsjax name ("layers/wq" per layer i: "layers/wq/i") -> (published tensor name, torch [out, in] -> lsjax)."""
    c = cfg.layer
    D, N, K, H = c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim
    t = np.transpose
    out = {
        "fc": ("fc.weight", t),
        "hidden_norm": ("hidden_norm.weight", None),
        "final_norm": ("norm.weight", None),
    }
    for i in range(c.num_layers):
        a, m = f"layers.{i}.self_attn.", f"layers.{i}.mlp."
        out |= {
            f"layers/attn_norm/{i}": (f"layers.{i}.input_layernorm.weight", None),
            f"layers/mlp_norm/{i}": (f"layers.{i}.post_attention_layernorm.weight", None),
            f"layers/wq/{i}": (a + "q_proj.weight", lambda w: w.T.reshape(D, N, H)),
            f"layers/wk/{i}": (a + "k_proj.weight", lambda w: w.T.reshape(D, K, H)),
            f"layers/wv/{i}": (a + "v_proj.weight", lambda w: w.T.reshape(D, K, H)),
            f"layers/wo/{i}": (a + "o_proj.weight", lambda w: w.T.reshape(N, H, D)),
            f"layers/q_norm/{i}": (a + "q_norm.weight", None),
            f"layers/k_norm/{i}": (a + "k_norm.weight", None),
            f"layers/w_gate/{i}": (m + "gate_proj.weight", t),
            f"layers/w_up/{i}": (m + "up_proj.weight", t),
            f"layers/w_down/{i}": (m + "down_proj.weight", t),
        }
    return out


def read_draft(path: str | Path, target: ModelConfig) -> tuple[dm.DFlashConfig, dict, DraftInfo]:
    """(config, params as numpy in the target's dtype, info) of a published DFlash draft directory: the params
    are `DFlashDraft(config)`'s variables, checked against its declaration before anything compiles."""
    path = Path(path)
    if not path.is_dir():
        raise ModelNotFoundError(f"--draft {path}: no such directory")
    if not (path / "config.json").is_file():
        raise ModelNotFoundError(f"--draft {path}: no config.json (a DFlash draft directory has one)")
    with reading(path, "DFlash draft (config.json or weights)"):
        hf = json.loads((path / "config.json").read_text())
        st = checkpoint_tensors(path, WHAT)
        fmt = detect(hf, st.names())
        cfg = draft_config(hf, target, st.shape("fc.weight")[1])
        draft = dm.DFlashDraft(cfg)
        specs = draft.schema()
        dt = numpy_dtype(target.dtype)
        flat, stacked = {}, {}
        for name, (src, convert) in _mapping(cfg).items():
            if src not in st:
                raise MissingTensorError(f"{path}: tensor {src} is missing from this DFlash draft")
            with reading(st.file_of(src), WHAT):
                w = np.asarray(st.get(src), np.float32)
            want = specs[name.rsplit("/", 1)[0]].shape[1:] if name.startswith("layers/") else specs[name].shape
            try:
                w = convert(w) if convert is not None else w
            except ValueError:  # a projection whose size the heads cannot reshape: named below like any other
                w = None
            if w is None or tuple(w.shape) != tuple(want):
                raise ShapeMismatchError(
                    f"{path}: tensor {src} has shape {tuple(st.shape(src))}, the draft's config implies {tuple(want)} "
                    "in lsjax's layout"
                )
            w = np.ascontiguousarray(w).astype(dt)
            if name.startswith("layers/"):
                stacked.setdefault(name.rsplit("/", 1)[0], []).append(w)
            else:
                flat[name] = w
    params = {**flat, "layers": {n.split("/")[1]: np.stack(ws) for n, ws in stacked.items()}}
    if problem := variables_problem(draft, params, f"DFlash draft {path}"):
        raise ShapeMismatchError(problem)
    return cfg, params, DraftInfo(str(path), fmt)


def random_config(target: ModelConfig, layers: int, block_size: int) -> dm.DFlashConfig:
    """The shape of an untrained draft for `target`: its layers as Qwen3's, the published rule's target layers,
    the target's last id as the mask token."""
    layer = dataclasses.replace(
        target,
        arch="qwen3",
        qk_norm=True,
        num_layers=layers,
        name="dflash",
        invariant_rows=0,
        qkv_bias=False,
        tie_embeddings=False,
        bos_token_id=None,
        eos_token_ids=(),
        pad_token_id=0,
    )
    ids = dm.default_layer_ids(target.num_layers, layers)
    return dm.DFlashConfig(layer, target.hidden_size, ids, block_size, target.vocab_size - 1)


def random_draft(
    target: ModelConfig, layers: int = RANDOM_LAYERS, block_size: int = RANDOM_BLOCK, seed: int = 0
) -> tuple[dm.DFlashConfig, dict, DraftInfo]:
    """An untrained draft shaped like the target's layers (tests, `--draft random`): lossless, accepts little. Its
    mask token is the target's last id (any id works for a draft nothing trained)."""
    cfg = random_config(target, layers, block_size)
    # numpy, not jax.random: no device work (and no op-by-op compiles) for a draft nothing trains.
    rng = np.random.default_rng(seed)
    dt = numpy_dtype(target.dtype)
    flat = {}
    for name, spec in dm.param_specs(cfg).items():
        if spec.init == "normal":
            flat[name] = (0.05 * rng.standard_normal(spec.shape, np.float32)).astype(dt)
        else:
            flat[name] = np.full(spec.shape, 1.0 if spec.init == "ones" else 0.0, dt)
    params = {k: v for k, v in flat.items() if not k.startswith("layers/")}
    params["layers"] = {k.split("/", 1)[1]: v for k, v in flat.items() if k.startswith("layers/")}
    return cfg, params, DraftInfo("random", "random")


def draft_info(opts) -> dict | None:
    """`--json`'s "draft" field: the directory and the layout found there (None without a draft)."""
    draft = opts.draft
    if draft is None:
        return None
    if draft == "random":
        return DraftInfo("random", "random").as_dict()
    path = Path(draft)
    with reading(path, "DFlash draft (config.json or weights)"):
        hf = json.loads((path / "config.json").read_text())
        return DraftInfo(str(path), detect(hf, checkpoint_tensors(path, WHAT).names())).as_dict()


SHIPPED = "dflash"  # lsjax/drafts/<target>/dflash: the DFlash draft shipped for a target, used without --draft


def load_dflash(model, draft: str | None, tree=None, block_size: int | None = None) -> tuple:
    """(drafter, draft params) for a loaded target: `draft` a published DFlash directory, or "random"
    (untrained); `tree` None verifies the block's chain, else a tree budget (`parse_tree`); `block_size` None
    keeps the draft's block; `draft` None or "shipped": the draft shipped for this target, if one is."""
    from lsjax.methods.dflash.drafter import DFlashDrafter, parse_tree
    from lsjax.methods.longspec.checkpoint import shipped_draft

    if draft in (None, "shipped") and (shipped := shipped_draft(model.path, SHIPPED)) is not None:
        draft = str(shipped)
    if draft in (None, "shipped"):
        raise InputError(
            "--method dflash needs --draft DIR (no DFlash draft ships for this target): a DFlash draft for it "
            "(z-lab/dflash's layout), or --draft random (untrained: lossless, accepts little)"
        )
    if draft == "random":
        cfg, params, _ = random_draft(model.config)
    else:
        cfg, params, _ = read_draft(draft, model.config)
    if block_size is not None:
        cfg = dataclasses.replace(cfg, block_size=block_size)
    drafter = DFlashDrafter(cfg, parse_tree(tree, cfg.block_size))
    if problem := drafter.check_params(params, model.config):
        raise ShapeMismatchError(f"--draft {draft}: {problem}")
    return drafter, jax.tree.map(jax.numpy.asarray, params)


def is_dflash_dir(path) -> bool:
    """Whether a directory holds a DFlash draft (read from its config.json alone: a `dflash_config`, or the
    DFlashDraftModel architecture), so that a method taking several kinds of drafts (`auto`) can tell them
    apart before reading weights."""
    from lsjax.loading.hf import config_json

    hf = config_json(path)
    return hf is not None and ("dflash_config" in hf or "DFlashDraftModel" in (hf.get("architectures") or []))
