"""EAGLE-3 drafts as they are published, read without conversion.

Two layouts exist, told apart by the files:

* "eagle": SafeAILab/EAGLE and SGLang's SpecForge. config.json is a Llama config of the draft's one layer
  (`vocab_size` the target's, `draft_vocab_size`, optional `target_hidden_size`; no `rope_theta` means 10000);
  tensors `midlayer.*`, `fc.weight`, `norm.weight`, `lm_head.weight`, `d2t`, `t2d`, maybe `embed_tokens.weight`.
  The target layers read are 2, L // 2 and L - 3.
* "speculators": vLLM's speculators. config.json has `speculators_model_type: eagle3`, the layer's config under
  `transformer_layer_config`, `norm_before_residual`, `eagle_aux_hidden_state_layer_ids`; tensors `layers.0.*`
  and the same others.

Weights are single or sharded safetensors (through `model.safetensors.index.json`), or a `pytorch_model.bin`
read with torch's weights-only loader when torch is installed. `d2t[i]` is the offset of draft id i in the
target's vocabulary; a draft whose vocabulary is the target's has none.

Either layout reads into the same params, `lsjax.methods.eagle3.model.Eagle3Draft`'s variables (lsjax's names
and layouts), checked against the module's declaration (`variables_problem`) before anything compiles.
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
from lsjax.loading.hf import checkpoint_tensors, config_from_hf, config_json
from lsjax.loading.layout import numpy_dtype
from lsjax.methods.eagle3 import model as em
from lsjax.models.module import variables_problem

FORMATS = ("eagle", "speculators")
PREFIX = {"eagle": "midlayer.", "speculators": "layers.0."}
# Flags of the speculators config this reader does not implement: refused by name rather than run wrongly.
UNSUPPORTED_FLAGS = ("norm_before_fc", "fc_norm", "norm_output")


@dataclasses.dataclass(frozen=True)
class DraftInfo:
    """What `--json` reports as "draft": where the draft came from and the layout read."""

    path: str
    format: str  # "eagle" | "speculators" | "random"

    def as_dict(self) -> dict:
        return {"dir": self.path, "format": self.format}


WHAT = "EAGLE-3 draft weights"


def detect(hf: dict, names) -> str:
    """The layout of a draft from its config and tensor names."""
    if hf.get("speculators_model_type") == "eagle3" or "transformer_layer_config" in hf:
        return "speculators"
    names = list(names)
    if any(n.startswith("midlayer.") for n in names):
        return "eagle"
    if any(n.startswith("layers.0.") for n in names):
        return "speculators"
    raise UnsupportedModelError(
        "not an EAGLE-3 draft: expected tensors midlayer.* (EAGLE / SpecForge) or layers.0.* (speculators) beside "
        f"fc.weight and lm_head.weight; found {', '.join(sorted(names)[:6]) or 'none'}"
    )


def draft_config(hf: dict, fmt: str, target: ModelConfig) -> em.Eagle3Config:
    """The Eagle3Config a published config.json describes, for `target` (whose dtype the draft takes)."""
    if fmt == "speculators":
        for flag in UNSUPPORTED_FLAGS:
            if hf.get(flag):
                raise UnsupportedModelError(f"this speculators draft sets {flag}, which lsjax's eagle3 does not run")
        layer_hf = dict(hf.get("transformer_layer_config") or {})
        aux = hf.get("eagle_aux_hidden_state_layer_ids")
        nbr = bool(hf.get("norm_before_residual", False))
    else:
        layer_hf, aux, nbr = dict(hf), None, bool(hf.get("norm_before_residual", False))
    layers = layer_hf.get("num_hidden_layers", 1)
    if layers != 1:
        raise UnsupportedModelError(f"this EAGLE-3 draft has {layers} decoder layers; lsjax's eagle3 runs one")
    if layer_hf.get("attention_bias") or layer_hf.get("mlp_bias"):
        raise UnsupportedModelError("this EAGLE-3 draft has attention or MLP biases, which lsjax's eagle3 does not run")
    layer_hf.setdefault("model_type", "llama")
    layer_hf.setdefault("vocab_size", target.vocab_size)
    # Published EAGLE configs may omit rope_theta: the reference then uses 10000, whatever the target's.
    layer_hf.setdefault("rope_theta", 10000.0)
    layer_hf.update(num_hidden_layers=1, eos_token_id=None, pad_token_id=0, bos_token_id=None)
    try:
        layer = config_from_hf(layer_hf, name="eagle3")
    except (ConfigError, KeyError) as e:
        raise UnsupportedModelError(f"EAGLE-3 config.json: {e}") from None
    layer = dataclasses.replace(layer, dtype=target.dtype, max_position=max(layer.max_position, target.max_position))
    return em.Eagle3Config(
        layer=layer,
        draft_vocab_size=int(hf.get("draft_vocab_size") or layer.vocab_size),
        target_hidden_size=int(hf.get("target_hidden_size") or layer.hidden_size),
        aux_layers=tuple(int(i) for i in aux) if aux else em.default_aux_layers(target.num_layers),
        norm_before_residual=nbr,
        own_embed=False,
    )


def _mapping(cfg: em.Eagle3Config, prefix: str) -> dict[str, tuple[str, callable]]:
    """lsjax name -> (published tensor name, torch [out, in] -> lsjax layout)."""
    c = cfg.layer
    D, N, K, H = c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim
    a, m = prefix + "self_attn.", prefix + "mlp."
    t = np.transpose
    out = {
        "fc": ("fc.weight", t),
        "hidden_norm": (prefix + "hidden_norm.weight", None),
        "input_norm": (prefix + "input_layernorm.weight", None),
        "mlp_norm": (prefix + "post_attention_layernorm.weight", None),
        "wq": (a + "q_proj.weight", lambda w: w.T.reshape(2 * D, N, H)),
        "wk": (a + "k_proj.weight", lambda w: w.T.reshape(2 * D, K, H)),
        "wv": (a + "v_proj.weight", lambda w: w.T.reshape(2 * D, K, H)),
        "wo": (a + "o_proj.weight", lambda w: w.T.reshape(N, H, D)),
        "w_gate": (m + "gate_proj.weight", t),
        "w_up": (m + "up_proj.weight", t),
        "w_down": (m + "down_proj.weight", t),
        "final_norm": ("norm.weight", None),
        "lm_head": ("lm_head.weight", t),
    }
    if c.qk_norm:
        out |= {"q_norm": (a + "q_norm.weight", None), "k_norm": (a + "k_norm.weight", None)}
    if cfg.own_embed:
        out["embed"] = ("embed_tokens.weight", None)
    return out


def read_draft(path: str | Path, target: ModelConfig) -> tuple[em.Eagle3Config, dict, DraftInfo]:
    """(config, params as numpy in the target's dtype, info) of a published EAGLE-3 draft directory: the params
    are `Eagle3Draft(config)`'s variables, checked against its declaration before anything compiles."""
    path = Path(path)
    if not path.is_dir():
        raise ModelNotFoundError(f"--draft {path}: no such directory")
    if not (path / "config.json").is_file():
        raise ModelNotFoundError(f"--draft {path}: no config.json (an EAGLE-3 draft directory has one)")
    with reading(path, "EAGLE-3 draft (config.json or weights)"):
        hf = json.loads((path / "config.json").read_text())
        st = checkpoint_tensors(path, WHAT)
        names = st.names()
        fmt = detect(hf, names)
        cfg = draft_config(hf, fmt, target)
        if "lm_head.weight" in st:  # the draft vocabulary is the head's rows, whatever the config says
            cfg = dataclasses.replace(cfg, draft_vocab_size=st.shape("lm_head.weight")[0])
        cfg = dataclasses.replace(cfg, own_embed="embed_tokens.weight" in st)
        if PREFIX[fmt] + "self_attn.q_proj.bias" in st:
            raise UnsupportedModelError(f"{path}: attention biases are not supported by lsjax's eagle3")
        draft = em.Eagle3Draft(cfg)
        specs = draft.schema()
        dt = numpy_dtype(target.dtype)
        params = {}
        for name, (src, convert) in _mapping(cfg, PREFIX[fmt]).items():
            if src not in st:
                raise MissingTensorError(f"{path}: tensor {src} is missing from this {fmt}-layout EAGLE-3 draft")
            with reading(st.file_of(src), WHAT):
                w = np.asarray(st.get(src), np.float32)
            try:
                w = convert(w) if convert is not None else w
            except ValueError:  # a projection whose size the heads cannot reshape: named below like any other
                w = None
            if w is None or tuple(w.shape) != specs[name].shape:
                # The published tensor's name and shape: what a user can look up in the files.
                raise ShapeMismatchError(
                    f"{path}: tensor {src} has shape {tuple(st.shape(src))}, the draft's config implies "
                    f"{specs[name].shape} in lsjax's layout"
                )
            params[name] = np.ascontiguousarray(w).astype(dt)
        Vd = cfg.draft_vocab_size
        offsets = np.asarray(st.get("d2t"), np.int64) if "d2t" in st else np.zeros(Vd, np.int64)
        if offsets.shape != (Vd,):
            raise ShapeMismatchError(f"{path}: d2t has shape {offsets.shape}, the draft vocabulary has {Vd} ids")
        ids = np.arange(Vd, dtype=np.int64) + offsets
        if ids.min() < 0 or ids.max() >= target.vocab_size:
            raise ShapeMismatchError(
                f"{path}: d2t maps draft ids outside the target's vocabulary of {target.vocab_size} "
                f"(this draft is for another target)"
            )
        params["draft_to_target"] = ids.astype(np.int32)
    if problem := variables_problem(draft, params, f"EAGLE-3 draft {path}"):
        raise ShapeMismatchError(problem)
    return cfg, params, DraftInfo(str(path), fmt)


def random_draft(target: ModelConfig, seed: int = 0) -> tuple[em.Eagle3Config, dict, DraftInfo]:
    """An untrained draft shaped like the target's layers (tests, `--draft random`): lossless, accepts little."""
    layer = dataclasses.replace(
        target,
        num_layers=1,
        name="eagle3",
        invariant_rows=0,
        qkv_bias=False,
        tie_embeddings=False,
        bos_token_id=None,
        eos_token_ids=(),
        pad_token_id=0,
    )
    cfg = em.Eagle3Config(layer, target.vocab_size, target.hidden_size, em.default_aux_layers(target.num_layers))
    # numpy, not jax.random: no device work (and no op-by-op compiles) for a draft nothing trains.
    rng = np.random.default_rng(seed)
    dt = numpy_dtype(target.dtype)
    params = {}
    for name, spec in em.Eagle3Draft(cfg).schema().items():
        if spec.init == "normal":
            params[name] = (0.05 * rng.standard_normal(spec.shape, np.float32)).astype(dt)
        else:
            params[name] = np.full(
                spec.shape, 1.0 if spec.init == "ones" else 0.0, np.dtype(spec.dtype) if spec.dtype == "int32" else dt
            )
    params["draft_to_target"] = np.arange(cfg.draft_vocab_size, dtype=np.int32)
    return cfg, params, DraftInfo("random", "random")


def write_draft(
    path: str | Path, cfg: em.Eagle3Config, params: dict, fmt: str = "eagle", shards: int = 1, dtype: str = "float32"
) -> Path:
    """A draft in a published layout (`fmt`), from lsjax params: the inverse of `read_draft` (tests, a round trip
    for drafts trained elsewhere, and the export of drafts lsjax trains). Float tensors are written in `dtype`;
    `shards` > 1 writes sharded safetensors with an index."""
    from safetensors.numpy import save_file

    if fmt not in FORMATS:
        raise InputError(f"write_draft: format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    c = cfg.layer
    tensors = {}
    for name, (dst, _) in _mapping(cfg, PREFIX[fmt]).items():
        w = np.asarray(params[name], np.float32)
        if name in ("wq", "wk", "wv"):
            w = w.reshape(w.shape[0], -1).T
        elif name == "wo":
            w = w.reshape(-1, w.shape[-1]).T
        elif name in ("fc", "w_gate", "w_up", "w_down", "lm_head"):
            w = w.T
        tensors[dst] = np.ascontiguousarray(w).astype(numpy_dtype(dtype))
    ids = np.asarray(params["draft_to_target"], np.int64)
    tensors["d2t"] = ids - np.arange(len(ids))
    t2d = np.zeros(c.vocab_size, bool)
    t2d[ids] = True
    tensors["t2d"] = t2d
    layer_hf = {
        "model_type": c.arch,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads,
        "head_dim": c.head_dim,
        "num_hidden_layers": 1,
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta,
        "max_position_embeddings": c.max_position,
        "vocab_size": c.vocab_size,
    }
    if fmt == "eagle":
        hf = {"architectures": ["LlamaForCausalLMEagle3"], **layer_hf, "draft_vocab_size": cfg.draft_vocab_size}
        # Only where it differs: with the key present EAGLE's loader no longer reads the target's embedding table.
        if cfg.target_hidden_size != c.hidden_size:
            hf["target_hidden_size"] = cfg.target_hidden_size
    else:
        hf = {
            "speculators_model_type": "eagle3",
            "architectures": ["Eagle3Speculator"],
            "transformer_layer_config": layer_hf,
            "draft_vocab_size": cfg.draft_vocab_size,
            "norm_before_residual": cfg.norm_before_residual,
            "target_hidden_size": cfg.target_hidden_size,
            "eagle_aux_hidden_state_layer_ids": list(cfg.aux_layers),
        }
    (path / "config.json").write_text(json.dumps(hf, indent=2))
    names = sorted(tensors)
    if shards <= 1:
        save_file(tensors, str(path / "model.safetensors"))
        return path
    weight_map = {}
    for s in range(shards):
        part = names[s::shards]
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: tensors[n] for n in part}, str(path / file))
        weight_map |= dict.fromkeys(part, file)
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return path


def is_eagle3_dir(path) -> bool:
    """Whether a directory holds an EAGLE-3 draft in a published layout (read from its config.json alone: a
    `draft_vocab_size`, or speculators' eagle3 type), so that a method taking several kinds of drafts (`auto`)
    can tell them apart before reading weights."""
    hf = config_json(path)
    return hf is not None and (
        "draft_vocab_size" in hf or hf.get("speculators_model_type") == "eagle3" or "transformer_layer_config" in hf
    )


def draft_info(opts) -> dict | None:
    """`--json`'s "draft" field: the directory and the layout found there (None without a draft)."""
    draft = opts.draft
    if draft is None:
        return None
    if draft == "random":
        return DraftInfo("random", "random").as_dict()
    path = Path(draft)
    with reading(path, "EAGLE-3 draft (config.json or weights)"):
        hf = json.loads((path / "config.json").read_text())
        st = checkpoint_tensors(path, WHAT)
        names = st.names()
        return DraftInfo(str(path), detect(hf, names)).as_dict()


SHIPPED = "eagle3"  # lsjax/drafts/<target>/eagle3: the EAGLE-3 draft shipped for a target, used without --draft


def load_eagle3(model, draft: str | None, tree) -> tuple:
    """(drafter, draft params) for a loaded target: `draft` a directory in either published layout, or
    "random" (untrained), or None or "shipped" (the draft shipped for this target, if one is)."""
    from lsjax.methods.eagle3.drafter import Eagle3Drafter, parse_tree
    from lsjax.methods.longspec.checkpoint import shipped_draft

    if draft in (None, "shipped") and (shipped := shipped_draft(model.path, SHIPPED)) is not None:
        draft = str(shipped)
    if draft in (None, "shipped"):
        raise InputError(
            "--method eagle3 needs --draft DIR (no EAGLE-3 draft ships for this target): an EAGLE-3 draft for it "
            "(EAGLE / SpecForge or speculators layout), or --draft random (untrained: lossless, accepts little)"
        )
    if draft == "random":
        cfg, params, _ = random_draft(model.config)
    else:
        cfg, params, _ = read_draft(draft, model.config)
    drafter = Eagle3Drafter(cfg, parse_tree(tree or "eagle3"))
    if problem := drafter.check_params(params, model.config):
        raise ShapeMismatchError(f"--draft {draft}: {problem}")
    return drafter, jax.tree.map(jax.numpy.asarray, params)
