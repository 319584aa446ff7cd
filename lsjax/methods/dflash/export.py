"""A DFlash draft written in z-lab/dflash's published layout: what `decode.py --method dflash --draft DIR` reads,
and what z-lab's `DFlashDraftModel` (transformers, `trust_remote_code`) builds from config.json and loads with
strict key matching.

    save_draft(out_dir, draft_config, params, num_target_layers=L)      # config.json + model.safetensors
    export_run(train_cfg, out_dir)                                       # a run's latest checkpoint (train.py --export)

config.json is a Qwen3 config of the draft's layers (`vocab_size` the target's) plus `block_size`,
`num_target_layers` and `dflash_config` (`target_layer_ids`, `mask_token_id`), as the released drafts have
(`lsjax.methods.dflash.checkpoint` documents the layout and reads it). Tensors are torch's Linear layout
([out, in]), one file, in the dtype asked for (the target's by default).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from lsjax.config import ConfigError
from lsjax.methods.dflash import model as dm

ARCHITECTURE = "DFlashDraftModel"
WEIGHTS = "model.safetensors"
CONFIG = "config.json"


def hf_config(cfg: dm.DFlashConfig, num_target_layers: int, dtype: str | None = None) -> dict:
    """The config.json of a draft of shape `cfg` for a target of `num_target_layers` layers. A draft whose
    layers the published module cannot express (lsjax reads more than it writes) is one ConfigError naming both."""
    c = cfg.layer
    if c.qkv_bias or not c.qk_norm:
        raise ConfigError(
            f"dflash export: the draft's layers have qkv_bias={c.qkv_bias}, qk_norm={c.qk_norm}; z-lab's "
            "DFlashDraftModel (Qwen3 layers) has no biases and always q/k norms"
        )
    if max(cfg.target_layer_ids) >= num_target_layers:
        raise ConfigError(
            f"dflash export: target_layer_ids {list(cfg.target_layer_ids)} reach beyond a target of "
            f"{num_target_layers} layers"
        )
    rs = c.rope_scaling
    scaling = None
    if rs.kind == "linear":
        scaling = {"rope_type": "linear", "factor": rs.factor}
    elif rs.kind == "llama3":
        scaling = {
            "rope_type": "llama3",
            "factor": rs.factor,
            "low_freq_factor": rs.low_freq_factor,
            "high_freq_factor": rs.high_freq_factor,
            "original_max_position_embeddings": rs.original_max_position,
        }
    return {
        "architectures": [ARCHITECTURE],
        "auto_map": {"AutoModel": f"dflash.{ARCHITECTURE}"},
        "model_type": "qwen3",
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_layers,
        "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads,
        "head_dim": c.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta,
        "rope_scaling": scaling,
        "max_position_embeddings": c.max_position,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "sliding_window": None,
        "layer_types": ["full_attention"] * c.num_layers,
        "initializer_range": 0.02,
        "torch_dtype": dtype or c.dtype,
        "block_size": cfg.block_size,
        "num_target_layers": num_target_layers,
        "dflash_config": {"target_layer_ids": list(cfg.target_layer_ids), "mask_token_id": cfg.mask_token_id},
    }


def state_dict(cfg: dm.DFlashConfig, params: dict) -> dict[str, np.ndarray]:
    """`DFlashDraft(cfg)`'s params -> the published tensors (torch names, [out, in] projections), fp32 numpy."""
    c = cfg.layer
    D, N, K, H = c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim
    f32 = lambda a: np.asarray(a, np.float32)  # noqa: E731
    out = {
        "fc.weight": f32(params["fc"]).T,
        "hidden_norm.weight": f32(params["hidden_norm"]),
        "norm.weight": f32(params["final_norm"]),
    }
    layers = params["layers"]
    for i in range(c.num_layers):
        a, m = f"layers.{i}.self_attn.", f"layers.{i}.mlp."
        w = {name: f32(leaf[i]) for name, leaf in layers.items()}
        out |= {
            f"layers.{i}.input_layernorm.weight": w["attn_norm"],
            f"layers.{i}.post_attention_layernorm.weight": w["mlp_norm"],
            a + "q_proj.weight": w["wq"].reshape(D, N * H).T,
            a + "k_proj.weight": w["wk"].reshape(D, K * H).T,
            a + "v_proj.weight": w["wv"].reshape(D, K * H).T,
            a + "o_proj.weight": w["wo"].reshape(N * H, D).T,
            a + "q_norm.weight": w["q_norm"],
            a + "k_norm.weight": w["k_norm"],
            m + "gate_proj.weight": w["w_gate"].T,
            m + "up_proj.weight": w["w_up"].T,
            m + "down_proj.weight": w["w_down"].T,
        }
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


def save_draft(
    out_dir: str | Path,
    cfg: dm.DFlashConfig,
    params: dict,
    *,
    num_target_layers: int,
    dtype: str | None = None,
    meta: dict | None = None,
) -> Path:
    """Writes config.json and model.safetensors (tensors in `dtype`, default the draft's; bfloat16 goes through
    ml_dtypes) into `out_dir`; `meta` becomes lsjax_export.json beside them (what made the draft)."""
    from safetensors.numpy import save_file

    from lsjax.loading.layout import numpy_dtype

    dtype = dtype or cfg.layer.dtype
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = hf_config(cfg, num_target_layers, dtype)
    np_dtype = numpy_dtype(dtype)
    tensors = {k: v.astype(np_dtype) for k, v in state_dict(cfg, params).items()}
    save_file(tensors, str(out / WEIGHTS), metadata={"format": "pt"})
    (out / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    if meta is not None:
        (out / "lsjax_export.json").write_text(json.dumps(meta, indent=2) + "\n")
    return out


def export_run(cfg, out_dir: str | Path) -> dict:
    """A DFlash run's latest checkpoint (`cfg` its `DFlashTrainConfig`) -> a draft directory in the published
    layout, in the target's dtype. The draft's shape is the one the run recorded (`DRAFT_CONFIG` in its
    directory), so the target need not be loaded."""
    from lsjax.train.checkpoint import load_draft_params
    from lsjax.train.runner import training_summary

    run_dir = Path(cfg.resolved_run_dir)
    recorded = run_dir / DRAFT_CONFIG
    if not recorded.is_file():
        raise FileNotFoundError(f"{recorded}: no draft shape recorded (was the run trained by kind dflash?)")
    hf = json.loads(recorded.read_text())
    dcfg = draft_config_of(hf)
    params = load_draft_params(run_dir)
    meta = {"run_dir": str(run_dir), "kind": "dflash", "training": training_summary(run_dir)}
    save_draft(out_dir, dcfg, params, num_target_layers=hf["num_target_layers"], dtype=hf["torch_dtype"], meta=meta)
    return {"tensors": len(state_dict(dcfg, params)), "dtype": hf["torch_dtype"], "block_size": dcfg.block_size}


DRAFT_CONFIG = "dflash_config.json"  # in a run's directory: the config.json its export writes


def draft_config_of(hf: dict) -> dm.DFlashConfig:
    """The DFlashConfig a config.json written by `hf_config` describes (read as the loader reads it)."""
    import dataclasses

    from lsjax.config import ModelConfig
    from lsjax.methods.dflash.checkpoint import draft_config

    target = ModelConfig(
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        num_layers=hf["num_target_layers"],
        max_position=hf["max_position_embeddings"],
        eos_token_ids=(),
        pad_token_id=0,
        dtype="float32",
    )
    cfg = draft_config(hf, target)
    return dataclasses.replace(cfg, layer=dataclasses.replace(cfg.layer, dtype="float32"))


def export_kind(cfg, out_dir, *, config_path: str | None = None, tree: str | None = None) -> dict:
    """`train.py --export DIR` of a dflash run."""
    return export_run(cfg, out_dir)
