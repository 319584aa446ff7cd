"""LongSpec drafts as their authors released them (sail/longspec-*: a `LlamaGlideDecoderLayer` or its Qwen2 twin,
sail-sg/LongSpec `longspec/test/llama_glide.py`), read without conversion.

A released directory holds an HF config.json (the target's architecture: `model_type` llama or qwen2) and the
layer's weights (single or sharded safetensors, or `pytorch_model.bin` through torch's weights-only loader):

    input_layernorm                    -> self_norm
    self_attn.{q,k,v}_proj (+ bias)    -> self_w{q,k,v}, self_b{q,k,v}; self_attn.o_proj -> self_wo
    post_self_attention_layernorm      -> cross_norm
    cross_attn.q_proj (+ bias)         -> cross_wq, cross_bq; cross_attn.o_proj -> cross_wo
    post_cross_attention_layernorm     -> mlp_norm
    mlp.{gate,up,down}_proj            -> w_gate, w_up, w_down

The cross-attention's k/v projections are saved but never used (its keys and values are the target's last-layer
cache). `read_release` gives the variables of the same module as lsjax's own drafts (`LongSpecDraft(target,
RELEASED)`), checked against it. What the released layer does differently from lsjax's own draft is the draft's config
(`DraftConfig`): biases on both attentions whatever the target (`qkv_bias=True`), no final norm
(`final_norm=False`: the target's LM head reads the last hidden state), and flash-attn's bottom-right-aligned
512-token window at tree steps (`frontier_window=True`). The RoPE is the target's.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from lsjax.config import ConfigError, DraftConfig, ModelConfig
from lsjax.errors import MissingTensorError, ModelNotFoundError, ShapeMismatchError, UnsupportedModelError
from lsjax.loading.corrupt import reading
from lsjax.loading.hf import checkpoint_tensors, config_json
from lsjax.loading.layout import numpy_dtype
from lsjax.methods.longspec.model import DEEP, LongSpecDraft, blocks
from lsjax.models.module import shapes, variables_problem

WHAT = "released LongSpec draft (config.json or weights)"
RELEASED = DraftConfig(window=512, qkv_bias=True, final_norm=False, frontier_window=True)
# Prefixes a saved layer's tensor names may carry (saved alone: none; saved from the training wrapper: glide.).
PREFIXES = ("", "glide.", "model.glide.", "model.")


def is_release(path) -> bool:
    """Whether a directory holds a released draft: an HF config.json (lsjax's own drafts write theirs with a
    `draft_config`)."""
    hf = config_json(path)
    return hf is not None and "model_type" in hf and "draft_config" not in hf


def _mapping(c: ModelConfig) -> dict[str, tuple[str, callable]]:
    D, N, K, H = c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim

    def proj(heads):  # torch Linear [heads * H, D] -> [D, heads, H]
        return lambda w: w.T.reshape(D, heads, H)

    def bias(heads):
        return lambda b: b.reshape(heads, H)

    out = {
        "self_norm": ("input_layernorm.weight", None),
        "self_wq": ("self_attn.q_proj.weight", proj(N)),
        "self_wk": ("self_attn.k_proj.weight", proj(K)),
        "self_wv": ("self_attn.v_proj.weight", proj(K)),
        "self_wo": ("self_attn.o_proj.weight", lambda w: w.T.reshape(N, H, D)),
        "self_bq": ("self_attn.q_proj.bias", bias(N)),
        "self_bk": ("self_attn.k_proj.bias", bias(K)),
        "self_bv": ("self_attn.v_proj.bias", bias(K)),
        "cross_norm": ("post_self_attention_layernorm.weight", None),
        "cross_wq": ("cross_attn.q_proj.weight", proj(N)),
        "cross_bq": ("cross_attn.q_proj.bias", bias(N)),
        "cross_wo": ("cross_attn.o_proj.weight", lambda w: w.T.reshape(N, H, D)),
        "mlp_norm": ("post_cross_attention_layernorm.weight", None),
        "w_gate": ("mlp.gate_proj.weight", lambda w: w.T),
        "w_up": ("mlp.up_proj.weight", lambda w: w.T),
        "w_down": ("mlp.down_proj.weight", lambda w: w.T),
    }
    return out


def read_release(path: str | Path, target: ModelConfig, dcfg: DraftConfig = RELEASED) -> tuple[DraftConfig, dict]:
    """(the draft's config, its weights as numpy in the target's dtype, lsjax's layout) of a released directory.
    A draft for another target (hidden size, heads, MLP) is one line naming both shapes."""
    path = Path(path)
    if not path.is_dir():
        raise ModelNotFoundError(f"--draft {path}: no such directory")
    with reading(path, WHAT):
        hf = json.loads((path / "config.json").read_text())
        if hf.get("model_type") not in ("llama", "qwen2"):
            raise UnsupportedModelError(
                f"{path}: a released LongSpec draft is a llama or qwen2 layer, this config.json says "
                f"model_type {hf.get('model_type')!r}"
            )
        mine = (hf.get("hidden_size"), hf.get("num_attention_heads"), hf.get("intermediate_size"))
        theirs = (target.hidden_size, target.num_heads, target.intermediate_size)
        if mine != theirs:
            raise ShapeMismatchError(
                f"--draft {path}: this released draft has hidden size, heads, MLP width {mine}; "
                f"{target.name} has {theirs} (it is another target's draft)"
            )
        st = checkpoint_tensors(path, WHAT)
        names = set(st.names())
        prefix = next((p for p in PREFIXES if f"{p}cross_attn.q_proj.weight" in names), None)
        if prefix is None:
            raise MissingTensorError(
                f"{path}: not a released LongSpec draft: expected tensors self_attn.*, cross_attn.*, mlp.* and "
                f"input_layernorm / post_self_attention_layernorm / post_cross_attention_layernorm; found "
                f"{', '.join(sorted(names)[:6]) or 'none'}"
            )
        model = LongSpecDraft(target, dcfg)
        declared = shapes(model)
        dt = numpy_dtype(target.dtype)
        params = {}
        for name, (src, convert) in _mapping(target).items():
            if name not in declared:
                continue
            if prefix + src not in names:
                raise MissingTensorError(f"{path}: tensor {prefix + src} is missing from this released draft")
            w = np.asarray(st.get(prefix + src), np.float32)
            try:
                w = convert(w) if convert is not None else w
            except ValueError:
                w = np.zeros(0)
            if tuple(w.shape) != declared[name]:
                raise ShapeMismatchError(
                    f"--draft {path}: tensor {prefix + src} has shape {tuple(st.shape(prefix + src))}; "
                    f"{target.name} needs {declared[name]} in lsjax's layout"
                )
            params[name] = np.ascontiguousarray(w).astype(dt)
    # Every tensor read was checked above: what is left is a variable of `dcfg`'s draft that the released
    # layout does not hold (a final norm).
    if problem := variables_problem(model, params, f"--draft {path}"):
        raise MissingTensorError(problem)
    return dcfg, params


def write_release(path: str | Path, target: ModelConfig, params: dict, prefix: str = "") -> Path:
    """A draft in the released layout (tests, fixtures): config.json as the target's one-layer llama config, the
    layer's tensors in torch's layout (the unused cross-attention k/v included, as the authors' files have)."""
    from safetensors.numpy import save_file

    if any(name.startswith(DEEP) for name in params):
        raise ConfigError(
            f"draft.depth: {len(blocks(params))} blocks cannot be expressed in the released layout "
            "(LlamaGlideDecoderLayer is one layer); keep lsjax's layout"
        )
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    c = target
    D, N, K, H = c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim
    out = {}
    for name, (src, _) in _mapping(c).items():
        w = np.asarray(params[name], np.float32)
        if name in ("self_wq", "self_wk", "self_wv", "cross_wq"):
            w = w.reshape(D, -1).T
        elif name in ("self_wo", "cross_wo"):
            w = w.reshape(N * H, D).T
        elif name in ("w_gate", "w_up", "w_down"):
            w = w.T
        elif name.startswith(("self_b", "cross_b")):
            w = w.reshape(-1)
        out[prefix + src] = np.ascontiguousarray(w)
    rng = np.random.default_rng(0)
    out[prefix + "cross_attn.k_proj.weight"] = rng.standard_normal((K * H, D)).astype(np.float32)
    out[prefix + "cross_attn.v_proj.weight"] = rng.standard_normal((K * H, D)).astype(np.float32)
    out[prefix + "cross_attn.k_proj.bias"] = np.zeros(K * H, np.float32)
    out[prefix + "cross_attn.v_proj.bias"] = np.zeros(K * H, np.float32)
    save_file(out, str(path / "model.safetensors"))
    hf = {
        "model_type": "llama" if c.arch != "qwen2" else "qwen2",
        "architectures": ["LlamaGlideDecoderLayer"],
        "hidden_size": D,
        "intermediate_size": c.intermediate_size,
        "num_attention_heads": N,
        "num_key_value_heads": K,
        "num_hidden_layers": 1,
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta,
        "vocab_size": c.vocab_size,
        "max_position_embeddings": c.max_position,
    }
    (path / "config.json").write_text(json.dumps(hf, indent=1))
    return path
