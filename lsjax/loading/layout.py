"""Checkpoint tensor names and the torch -> lsjax parameter layout, shared by the HF and GGUF loaders.

Both checkpoint formats store per-layer matrices in torch layout `[out, in]`. Loaders stack them over
layers into `[L, out, in]` and hand them to `to_params`, which reshapes them into the head-explicit
layout the target model consumes (see the module docstring of lsjax.models.target):

  wq [L, D, N, H]   wk, wv [L, D, K, H]   wo [L, N, H, D]   w_gate, w_up [L, D, F]   w_down [L, F, D]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from lsjax.config import ModelConfig
from lsjax.errors import ShapeMismatchError, UnsupportedModelError
from lsjax.models.layers import check_shapes
from lsjax.models.target import param_specs


@dataclasses.dataclass(frozen=True)
class Slot:
    """One parameter: its lsjax key, its name in HF and GGUF checkpoints ('{i}' = layer) and torch-layout shape."""

    key: str
    hf: str
    gguf: str
    shape: Callable[[ModelConfig], tuple[int, ...]]
    per_layer: bool = True


def _q(c: ModelConfig) -> int:
    return c.num_heads * c.head_dim


def _kv(c: ModelConfig) -> int:
    return c.num_kv_heads * c.head_dim


_LAYER = "model.layers.{i}."
_SLOTS = (
    Slot("attn_norm", _LAYER + "input_layernorm.weight", "blk.{i}.attn_norm.weight", lambda c: (c.hidden_size,)),
    Slot("wq", _LAYER + "self_attn.q_proj.weight", "blk.{i}.attn_q.weight", lambda c: (_q(c), c.hidden_size)),
    Slot("wk", _LAYER + "self_attn.k_proj.weight", "blk.{i}.attn_k.weight", lambda c: (_kv(c), c.hidden_size)),
    Slot("wv", _LAYER + "self_attn.v_proj.weight", "blk.{i}.attn_v.weight", lambda c: (_kv(c), c.hidden_size)),
    Slot("wo", _LAYER + "self_attn.o_proj.weight", "blk.{i}.attn_output.weight", lambda c: (c.hidden_size, _q(c))),
    Slot("mlp_norm", _LAYER + "post_attention_layernorm.weight", "blk.{i}.ffn_norm.weight", lambda c: (c.hidden_size,)),
    Slot(
        "w_gate",
        _LAYER + "mlp.gate_proj.weight",
        "blk.{i}.ffn_gate.weight",
        lambda c: (c.intermediate_size, c.hidden_size),
    ),
    Slot(
        "w_up", _LAYER + "mlp.up_proj.weight", "blk.{i}.ffn_up.weight", lambda c: (c.intermediate_size, c.hidden_size)
    ),
    Slot(
        "w_down",
        _LAYER + "mlp.down_proj.weight",
        "blk.{i}.ffn_down.weight",
        lambda c: (c.hidden_size, c.intermediate_size),
    ),
)
_BIAS_SLOTS = (
    Slot("bq", _LAYER + "self_attn.q_proj.bias", "blk.{i}.attn_q.bias", lambda c: (_q(c),)),
    Slot("bk", _LAYER + "self_attn.k_proj.bias", "blk.{i}.attn_k.bias", lambda c: (_kv(c),)),
    Slot("bv", _LAYER + "self_attn.v_proj.bias", "blk.{i}.attn_v.bias", lambda c: (_kv(c),)),
)
_QK_NORM_SLOTS = (
    Slot("q_norm", _LAYER + "self_attn.q_norm.weight", "blk.{i}.attn_q_norm.weight", lambda c: (c.head_dim,)),
    Slot("k_norm", _LAYER + "self_attn.k_norm.weight", "blk.{i}.attn_k_norm.weight", lambda c: (c.head_dim,)),
)
_GLOBAL_SLOTS = (
    Slot("embed", "model.embed_tokens.weight", "token_embd.weight", lambda c: (c.vocab_size, c.hidden_size), False),
    Slot("final_norm", "model.norm.weight", "output_norm.weight", lambda c: (c.hidden_size,), False),
)
_HEAD_SLOT = Slot("lm_head", "lm_head.weight", "output.weight", lambda c: (c.vocab_size, c.hidden_size), False)


def slots(cfg: ModelConfig) -> tuple[Slot, ...]:
    """Every tensor `cfg` needs: per-layer ones first, then the global ones."""
    out = _SLOTS + (_BIAS_SLOTS if cfg.qkv_bias else ()) + (_QK_NORM_SLOTS if cfg.qk_norm else ()) + _GLOBAL_SLOTS
    return out if cfg.tie_embeddings else out + (_HEAD_SLOT,)


def check_shape(name: str, actual: tuple[int, ...], expected: tuple[int, ...]) -> None:
    if tuple(actual) != tuple(expected):
        raise ShapeMismatchError(f"tensor {name}: expected shape {tuple(expected)}, got {tuple(actual)}")


def numpy_dtype(dtype: str) -> np.dtype:
    """The numpy dtype for a config dtype name; bfloat16 comes from ml_dtypes (numpy has none)."""
    if dtype == "float32":
        return np.dtype(np.float32)
    if dtype == "float16":
        return np.dtype(np.float16)
    if dtype == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    raise UnsupportedModelError(f"dtype {dtype!r} is not supported (float32|bfloat16|float16)")


def to_params(cfg: ModelConfig, torch_layout: dict[str, np.ndarray], dtype: str) -> dict:
    """Reshapes stacked torch-layout tensors (keys of `slots`) into the lsjax parameter tree, cast to `dtype`.

    Every output is a fresh C-contiguous array: transpose and cast happen in the same copy.
    """
    dt = numpy_dtype(dtype)
    D, N, K, H = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    t = torch_layout
    L = cfg.num_layers

    def put(x):
        return np.ascontiguousarray(x, dtype=dt)

    layers = {
        "attn_norm": put(t["attn_norm"]),
        # [L, N*H, D] -> [L, D, N*H] -> [L, D, N, H]
        "wq": put(t["wq"].transpose(0, 2, 1).reshape(L, D, N, H)),
        "wk": put(t["wk"].transpose(0, 2, 1).reshape(L, D, K, H)),
        "wv": put(t["wv"].transpose(0, 2, 1).reshape(L, D, K, H)),
        # [L, D, N*H] -> [L, D, N, H] -> [L, N, H, D]
        "wo": put(t["wo"].reshape(L, D, N, H).transpose(0, 2, 3, 1)),
        "mlp_norm": put(t["mlp_norm"]),
        "w_gate": put(t["w_gate"].transpose(0, 2, 1)),  # [L, F, D] -> [L, D, F]
        "w_up": put(t["w_up"].transpose(0, 2, 1)),
        "w_down": put(t["w_down"].transpose(0, 2, 1)),  # [L, D, F] -> [L, F, D]
    }
    if cfg.qkv_bias:
        layers["bq"] = put(t["bq"].reshape(L, N, H))
        layers["bk"] = put(t["bk"].reshape(L, K, H))
        layers["bv"] = put(t["bv"].reshape(L, K, H))
    if cfg.qk_norm:
        layers["q_norm"], layers["k_norm"] = put(t["q_norm"]), put(t["k_norm"])
    params = {"embed": put(t["embed"]), "layers": layers, "final_norm": put(t["final_norm"])}
    if not cfg.tie_embeddings:
        params["lm_head"] = put(t["lm_head"].T)  # [V, D] -> [D, V]
    check_shapes(params, param_specs(cfg))  # the target's own schema, whatever the checkpoint said
    return params
