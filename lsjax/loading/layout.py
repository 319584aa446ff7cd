"""Checkpoint tensor names and the torch -> lsjax parameter layout, shared by the HF and GGUF loaders.

Both checkpoint formats store per-layer matrices in torch layout `[out, in]`. Loaders hand them to
`to_params` one layer at a time, which writes them into the stacked, head-explicit layout the target model
consumes (see the module docstring of lsjax.models.target):

  wq [L, D, N, H]   wk, wv [L, D, K, H]   wo [L, N, H, D]   w_gate, w_up [L, D, F]   w_down [L, F, D]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from lsjax.config import ModelConfig
from lsjax.errors import ShapeMismatchError, UnsupportedModelError
from lsjax.models.layers import check_shapes
from lsjax.models.target import HOST_ALIGN, host_copy, host_empty, host_map, param_specs


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


def to_params(cfg: ModelConfig, tensor: Callable[[Slot, int | None], np.ndarray], dtype: str) -> dict:
    """The lsjax parameter tree, cast to `dtype`, from `tensor(slot, i)`: one checkpoint tensor in torch layout
    (layer `i` of a per-layer slot of `slots(cfg)`, None for a global one).

    Each output is allocated once, aligned for the device to use in place (`host_empty`), and filled layer by
    layer (`host_map`: on the host's cores side by side), the transpose and cast happening in the same copy: a
    load holds a layer's checkpoint tensor per thread beside the outputs rather than whole stacked copies, and
    writes each output byte once. (On a VM that backs memory at its first touch, fresh memory is what a cold
    load pays for: docs/design/cpu-startup.md.) `tensor` is called from several threads at once.
    """
    dt = numpy_dtype(dtype)
    D, N, K, H = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    # One layer's torch-layout tensor as the lsjax layout wants it (a view; the copy is the assignment).
    per_layer = {
        "wq": lambda w: w.T.reshape(D, N, H),  # [N*H, D] -> [D, N*H] -> [D, N, H]
        "wk": lambda w: w.T.reshape(D, K, H),
        "wv": lambda w: w.T.reshape(D, K, H),
        "wo": lambda w: w.reshape(D, N, H).transpose(1, 2, 0),  # [D, N*H] -> [N, H, D]
        "w_gate": lambda w: w.T,  # [F, D] -> [D, F]
        "w_up": lambda w: w.T,
        "w_down": lambda w: w.T,  # [D, F] -> [F, D]
        "bq": lambda b: b.reshape(N, H),
        "bk": lambda b: b.reshape(K, H),
        "bv": lambda b: b.reshape(K, H),
    }
    layers, params = {}, {}

    def as_lsjax(key: str, w: np.ndarray) -> np.ndarray:
        return per_layer[key](w) if key in per_layer else w

    def fill(work: tuple[Slot, int | None]) -> None:
        slot, i = work
        if i is None:
            x = tensor(slot, None)
            x = x.T if slot.key == "lm_head" else x  # [V, D] -> [D, V]
            aligned = x.dtype == dt and x.flags.c_contiguous and x.ctypes.data % HOST_ALIGN == 0
            params[slot.key] = x if aligned else host_copy(x, dt)
        else:
            np.copyto(layers[slot.key][i], as_lsjax(slot.key, tensor(slot, i)), casting="unsafe")

    work = []
    for slot in slots(cfg):
        if slot.per_layer:
            shape = as_lsjax(slot.key, np.broadcast_to(np.float32(0), slot.shape(cfg))).shape  # (no memory)
            layers[slot.key] = host_empty((cfg.num_layers, *shape), dt)  # (not touched until filled)
            work += [(slot, i) for i in range(cfg.num_layers)]
        else:
            work.append((slot, None))
    host_map(fill, work)  # the outputs are disjoint: filled on the host's cores side by side
    params = {"embed": params["embed"], "layers": layers, "final_norm": params["final_norm"]} | (
        {} if cfg.tie_embeddings else {"lm_head": params["lm_head"]}
    )
    check_shapes(params, param_specs(cfg))  # the target's own schema, whatever the checkpoint said
    return params
