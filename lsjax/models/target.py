"""The target model: a Llama / Qwen2 / Mistral decoder as pure functions of a params pytree.

Parameter layout (every per-layer leaf is stacked over L so the layers run under
`lax.scan`):

    embed [V, D]; final_norm [D]; lm_head [D, V] (only when untied)
    layers: attn_norm [L, D]; wq [L, D, N, H]; wk, wv [L, D, K, H];
            bq [L, N, H]; bk, bv [L, K, H] (only with qkv_bias); wo [L, N, H, D];
            mlp_norm [L, D]; w_gate, w_up [L, D, F]; w_down [L, F, D]

`prepare_for_decode` turns this into the inference layout (one dict per layer,
fused projections); `forward_hidden` runs either layout, with the same outputs
up to float rounding:

    layers: a tuple of L dicts: attn_norm [D]; w_qkv [D, (N + 2K) H]; b_qkv [(N + 2K) H]
            (only with qkv_bias); wo [N H, D]; mlp_norm [D]; w_gate_up [D, 2F]; w_down [F, D]

and, on a CPU, the same projections also stored as output rows (keys with a `_t` suffix: w_qkv_t
[(N + 2K) H, D], wo_t [D, N H], w_gate_up_t [2F, D], w_down_t [D, F]), which XLA CPU multiplies with 3 or
more rows of activations 10-20% faster (`default_layout`).

`forward` never writes the cache: it attends to the committed prefix
`[0, cache.lengths)` plus the T new tokens (causal chain, or a speculative
tree's ancestor mask) and returns the new tokens' K/V for the caller to commit.
"""

from __future__ import annotations

import concurrent.futures
import functools
import math
from collections.abc import Callable, Iterable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from lsjax import attention
from lsjax.cache import KVCache, commit
from lsjax.config import ConfigError, ModelConfig
from lsjax.models.layers import (
    ACT_DTYPE,
    ParamSpec,
    dense,
    dense_mlp,
    dense_rows,
    embed,
    head_logits,
    init_from_specs,
    mlp,
    rms_norm,
    shape_problem,
    unflatten,
)
from lsjax.models.module import Model
from lsjax.rope import apply_rope, inverse_frequencies, rope_angles
from lsjax.runtime import host_threads

__all__ = [
    "Transformer",
    "embed",
    "forward",
    "forward_hidden",
    "init_params",
    "lm_head",
    "mlp",
    "param_specs",
    "prepare_for_decode",
    "project",
    "rms_norm",
]


# Logical axes of every parameter (the "layers" axis of stacked leaves is added by param_specs).
AXES: dict[str, tuple[str, ...]] = {
    "embed": ("vocab", "embed"),
    "final_norm": ("norm",),
    "lm_head": ("embed", "vocab"),
    "attn_norm": ("norm",),
    "wq": ("embed", "heads", "head_dim"),
    "wk": ("embed", "kv_heads", "head_dim"),
    "wv": ("embed", "kv_heads", "head_dim"),
    "bq": ("heads", "head_dim"),
    "bk": ("kv_heads", "head_dim"),
    "bv": ("kv_heads", "head_dim"),
    "q_norm": ("head_dim",),
    "k_norm": ("head_dim",),
    "wo": ("heads", "head_dim", "embed"),
    "mlp_norm": ("norm",),
    "w_gate": ("embed", "mlp"),
    "w_up": ("embed", "mlp"),
    "w_down": ("mlp", "embed"),
}


def param_specs(config: ModelConfig) -> dict[str, ParamSpec]:
    """The parameter schema (module docstring's stacked layout): {path: ParamSpec}, per-layer leaves under
    "layers/". Random init, the loaders' shape checks and the sharding rules derive from it."""
    L, D, F, V = config.num_layers, config.hidden_size, config.intermediate_size, config.vocab_size
    N, K, H = config.num_heads, config.num_kv_heads, config.head_dim
    per_layer = {
        "wq": (D, N, H),
        "wk": (D, K, H),
        "wv": (D, K, H),
        "wo": (N, H, D),
        "w_gate": (D, F),
        "w_up": (D, F),
        "w_down": (F, D),
    }
    if config.qkv_bias:
        per_layer |= {"bq": (N, H), "bk": (K, H), "bv": (K, H)}
    specs = {f"layers/{n}": ParamSpec((L, *s), config.dtype, ("layers", *AXES[n])) for n, s in per_layer.items()}
    specs |= {
        f"layers/{n}": ParamSpec((L, D), config.dtype, ("layers", "norm"), "ones") for n in ("attn_norm", "mlp_norm")
    }
    if config.qk_norm:
        specs |= {f"layers/{n}": ParamSpec((L, H), config.dtype, ("layers", *AXES[n]), "ones") for n in QK_NORMS}
    specs["embed"] = ParamSpec((V, D), config.dtype, AXES["embed"])
    specs["final_norm"] = ParamSpec((D,), config.dtype, AXES["final_norm"], "ones")
    if not config.tie_embeddings:
        specs["lm_head"] = ParamSpec((D, V), config.dtype, AXES["lm_head"])
    return specs


def abstract_params(config: ModelConfig, prepared: bool = False) -> dict:
    """`config`'s params as shapes and dtypes (`jax.ShapeDtypeStruct` leaves, `param_specs`' stacked layout, or
    with `prepared` `prepare_for_decode`'s): what programs are compiled from before the weights are loaded."""
    specs = param_specs(config)
    params = unflatten({path: jax.ShapeDtypeStruct(s.shape, jnp.dtype(s.dtype)) for path, s in specs.items()})
    return jax.eval_shape(functools.partial(prepare_for_decode, config=config), params) if prepared else params


def check_params(params, config: ModelConfig) -> str | None:
    """Why `params` cannot be the weights of `config`'s target (one line naming the tensor), or None.

    The stacked layout is checked against `param_specs` exactly; the inference layouts (`prepare_for_decode`,
    `group_for_shards`) by their top-level tensors' shapes, the layer count and each layer tensor's size,
    which every layout of the same weights keeps. Shapes only: a trace-time check, free under `jax.jit`."""
    if not isinstance(params, Mapping):
        return f"expected the target's {{name: array}} dict (lsjax.load_model().params), got {type(params).__name__}"
    if "layers" not in params:
        return "tensor layers: missing (not a target's params?)"
    specs = param_specs(config)
    layers = params["layers"]
    if isinstance(layers, Mapping):
        return shape_problem(params, specs)
    top = {name: s for name, s in specs.items() if not name.startswith("layers/")}
    if problem := shape_problem({k: v for k, v in params.items() if k != "layers"}, top):
        return problem
    L, D, F = config.num_layers, config.hidden_size, config.intermediate_size
    QKV = (config.num_heads + 2 * config.num_kv_heads) * config.head_dim
    if len(layers) != L:
        return f"layers: {len(layers)} of them, the model config has num_layers={L}"
    sizes = {"attn_norm": D, "mlp_norm": D, "w_qkv": D * QKV, "wo": config.num_heads * config.head_dim * D}
    sizes |= {"w_gate_up": 2 * D * F, "w_down": F * D} | ({"b_qkv": QKV} if config.qkv_bias else {})
    sizes |= dict.fromkeys(QK_NORMS, config.head_dim) if config.qk_norm else {}
    for i, layer in enumerate(layers):
        for name, size in sizes.items():
            leaves = [layer[n] for n in (name, f"{name}_t") if n in layer]
            if not leaves:
                return f"tensor layers[{i}]/{name}: missing"
            for leaf in leaves:
                if math.prod(leaf.shape) != size:
                    shape = tuple(leaf.shape)
                    return f"tensor layers[{i}]/{name}: shape {shape}, the model config implies {size} elements"
    return None


def lm_head(params: dict, config: ModelConfig, hidden: jax.Array, pad_to: int = 0) -> jax.Array:
    """Final norm + output projection: hidden [..., D] -> logits [..., V] (fp32).

    `pad_to=R`: hidden [B, T <= R, D] runs as R rows (the same GEMM shapes in every call; `forward_hidden`)."""
    if pad_to and hidden.shape[1] != pad_to:
        T = hidden.shape[1]
        full = jnp.pad(hidden, ((0, 0), (0, pad_to - T), (0, 0)))
        return lm_head(params, config, full, pad_to)[:, :T]
    h = rms_norm(hidden, params["final_norm"], config.rms_norm_eps)
    if config.tie_embeddings:
        return head_logits(h, params["embed"])
    return dense(h, params["lm_head"], "...d,dv->...v")


def qkv_projection(layer: dict, config: ModelConfig, x: jax.Array, cos, sin):
    """x [B, T, D] -> q [B, T, N, H], k/v [B, T, K, H] in the weights' dtype (the cache's), RoPE on q and k
    applied to the fp32 projections before they are rounded."""
    q = dense(x, layer["wq"], "btd,dnh->btnh")
    k = dense(x, layer["wk"], "btd,dkh->btkh")
    v = dense(x, layer["wv"], "btd,dkh->btkh")
    if config.qkv_bias:
        q, k, v = q + layer["bq"], k + layer["bk"], v + layer["bv"]
    q, k = qk_normed(layer, config, q, k)
    dt = layer["wq"].dtype
    return apply_rope(q, cos, sin).astype(dt), apply_rope(k, cos, sin).astype(dt), v.astype(dt)


QK_NORMS = ("q_norm", "k_norm")


def qk_normed(layer: dict, config: ModelConfig, q: jax.Array, k: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Qwen3's per-head RMSNorm of q [.., N, H] and k [.., K, H] (one weight [H] each, shared by the heads),
    before RoPE; the identity for the other families."""
    if not config.qk_norm:
        return q, k
    eps = config.rms_norm_eps
    return rms_norm(q, layer["q_norm"], eps), rms_norm(k, layer["k_norm"], eps)


# The fused projections of the inference layout. A layer holds each as `name` [in, out], as f"{name}_t"
# [out, in] (out-major), or both (`prepare_for_decode`'s layouts "in", "out", "both").
PROJECTIONS = ("w_qkv", "wo", "w_gate_up", "w_down")
LAYOUTS = ("in", "out", "both")
# From this many rows of activations on, `project` multiplies an out-major copy where the layer has one.
OUT_MAJOR_MIN_ROWS = 3


def default_layout() -> str:
    """The projections' storage for this backend: both orders on a CPU, [in, out] elsewhere.

    Measured on 2 CPU cores (SmolLM2 at 1.5K and 4K context, `python -m studies.tree_cost.tree_cost --layout in
    out`): a verification forward of 5-13 nodes costs 10-20% less with [out, in] weights (5 nodes: 1.33x a
    1-token forward instead of 1.49x), 1 node the same, 2 nodes ~8% more (1.23x against 1.13x). So a CPU
    keeps both copies (twice the projections' memory: 0.5 GB for SmolLM2 in fp32) and `project` picks by
    row count. A GPU or TPU takes either operand order at no cost, and the mesh's shardings are written for
    [in, out]."""
    return "both" if jax.default_backend() == "cpu" else "in"


def prepare_for_decode(params: dict, config: ModelConfig, *, layout: str | None = None) -> dict:
    """The inference layout of `params` (module docstring): per-layer arrays, q/k/v and gate/up fused.

    Why (docs/design/cpu-verify-cost.md): `lax.scan` over stacked weights copies each layer's matrices out of
    the stack on every step (425 MB per SmolLM2 token on a CPU), and so does indexing a stacked array
    in an unrolled loop; separate arrays per layer are read in place. One [D, (N+2K)H] GEMV reads at
    full bandwidth where the [D, KH] ones for k and v do not, and `wo` as [NH, D] spares XLA a
    transpose per layer. `layout`: the four projections stored [in, out] ("in"), [out, in] ("out") or
    both; None keeps prepared params as they are and prepares others in `default_layout()`. Run once after
    loading; idempotent, and a named layout converts params prepared in another; training keeps the stacked
    layout.
    """
    if layout is not None and layout not in LAYOUTS:
        raise ConfigError(f"layout: expected one of {', '.join(LAYOUTS)}, got {layout!r}")
    layers = params["layers"]
    if not isinstance(layers, dict):
        grouped = layers[0].get("w_qkv", layers[0].get("w_qkv_t")).ndim == 3  # for a mesh: always [in, out]
        if layout is None or layout_of(params) == layout or grouped:
            return params
        return {**params, "layers": tuple(_relayout(layer, layout) for layer in layers)}
    layout = default_layout() if layout is None else layout
    D = config.hidden_size
    # Host (numpy) params stay on the host, so a caller's device copy is made once, of the new layout.
    xp = np if isinstance(layers["wq"], np.ndarray) else jnp

    def cat(parts: list) -> object:
        if xp is jnp:
            return jnp.concatenate(parts, axis=1)
        out = host_empty((parts[0].shape[0], sum(p.shape[1] for p in parts)), parts[0].dtype)
        return np.concatenate(parts, axis=1, out=out)

    def one(i: int) -> dict:
        lay = {name: leaf[i] for name, leaf in layers.items()}
        out = {
            "attn_norm": lay["attn_norm"],
            "w_qkv": cat([lay[w].reshape(D, -1) for w in ("wq", "wk", "wv")]),
            "wo": lay["wo"].reshape(-1, D),  # [N, H, D] -> [N H, D]
            "mlp_norm": lay["mlp_norm"],
            "w_gate_up": cat([lay["w_gate"], lay["w_up"]]),
            "w_down": lay["w_down"],
        }
        if config.qkv_bias:
            out["b_qkv"] = xp.concatenate([lay[b].reshape(-1) for b in ("bq", "bk", "bv")])
        out |= {n: lay[n] for n in QK_NORMS if config.qk_norm}
        return _relayout(out, layout)

    layers_out = host_map(one, range(config.num_layers)) if xp is np else [one(i) for i in range(config.num_layers)]
    return {**params, "layers": tuple(layers_out)}


def _relayout(layer: dict, layout: str) -> dict:
    """A prepared layer with its projections stored as `layout` asks; other leaves as they are."""
    out = {k: v for k, v in layer.items() if k.removesuffix("_t") not in PROJECTIONS}
    for name in PROJECTIONS:
        w, w_t = layer.get(name), layer.get(f"{name}_t")
        if layout in ("in", "both"):
            out[name] = w if w is not None else _transpose(w_t)
        if layout in ("out", "both"):
            out[f"{name}_t"] = w_t if w_t is not None else _transpose(w)
    return out


def _transpose(w):
    # Contiguous on the host, so the device copy is [out, in] in memory, not a strided view.
    return host_copy(w.T) if isinstance(w, np.ndarray) else w.T


# XLA:CPU uses a read-only host array in place, without a copy (`lsjax.engine.host.on_device`), only when its data
# starts on a 64-byte boundary; numpy's large allocations start 16 bytes into a page.
HOST_ALIGN = 64


def host_empty(shape: tuple[int, ...], dtype) -> np.ndarray:
    """An uninitialised host array whose data starts on a `HOST_ALIGN`-byte boundary."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    raw = np.empty(nbytes + HOST_ALIGN, np.uint8)
    start = -raw.ctypes.data % HOST_ALIGN
    return raw[start : start + nbytes].view(dtype).reshape(shape)


def host_map(fn: Callable, items: Iterable) -> list:
    """`[fn(x) for x in items]` on up to 8 threads, for numpy work on the host (copies into new arrays): a VM that
    backs memory at its first touch does so per vCPU, so two threads fill fresh memory about twice as fast as
    one (docs/design/cpu-startup.md), and weights are made before anything else needs the cores."""
    workers = host_threads()
    if workers < 2:
        return [fn(x) for x in items]
    with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="lsjax-host") as pool:
        return list(pool.map(fn, items))


def host_copy(x: np.ndarray, dtype=None) -> np.ndarray:
    """`x` cast to `dtype` (default: its own) in a `host_empty` array: one pass over the new memory."""
    out = host_empty(x.shape, x.dtype if dtype is None else dtype)
    np.copyto(out, x, casting="unsafe")
    return out


def is_prepared(params: dict) -> bool:
    return not isinstance(params["layers"], dict)


def is_stacked(params: dict) -> bool:
    """Params from `stack_layers`: the inference layout with the layers stacked [L, ...] for `lax.scan`."""
    layers = params["layers"]
    return isinstance(layers, dict) and ("w_gate_up" in layers or "w_gate_up_t" in layers)


def stack_layers(params: dict, rows: int) -> dict:
    """Prepared params with the layers as one dict of [L, ...] arrays, which `forward_hidden` runs under
    `lax.scan`, keeping of each projection the copy `project` takes for `rows` rows of activations.

    For a prefill program: scanned layers lower and compile ~4x faster than 30 unrolled ones
    (docs/design/cpu-startup.md), for the same prefill time and the same logits to the bit (the layer's code is
    the same). The price is one copy of the projections while the program runs (stacking) and each layer's
    weights copied out of the stack per chunk, which a chunk of hundreds of tokens does not notice; a 1-token
    decode step would (`prepare_for_decode` says why it stays unrolled)."""
    if not is_prepared(params):
        return params
    first = params["layers"][0]

    # Of a projection stored both ways, the copy `project` skips for this many rows is left out.
    unread = {
        n if reads_out_major(first, n, rows) else f"{n}_t" for n in PROJECTIONS if n in first and f"{n}_t" in first
    }
    keep = [name for name in first if name not in unread]
    stacked = {n: jnp.stack([layer[n] for layer in params["layers"]]) for n in keep}
    return {**params, "layers": stacked}


def layout_of(params: dict) -> str | None:
    """Prepared params' projection storage ("in", "out" or "both"); None for the training layout (stacked over L)."""
    if not is_prepared(params):
        return None
    layer = params["layers"][0]
    return {(True, False): "in", (False, True): "out", (True, True): "both"}[("w_qkv" in layer, "w_qkv_t" in layer)]


def project(layer: dict, name: str, x: jax.Array, spec: str | None = None) -> jax.Array:
    """x [..., in] through a prepared layer's projection `name` (one of PROJECTIONS) -> fp32 [..., out]: the
    out-major copy for OUT_MAJOR_MIN_ROWS or more rows of x, or where it is the only one (`default_layout`
    says why). `spec`: the einsum of the grouped (sharded) [in, M, c] layout."""
    if reads_out_major(layer, name, math.prod(x.shape[:-1])):
        return dense_rows(x, layer[f"{name}_t"])
    return dense(x, layer[name], spec)


def reads_out_major(layer: dict, name: str, rows: int) -> bool:
    """Whether `project` multiplies `rows` rows through projection `name`'s out-major copy (`{name}_t`)."""
    return f"{name}_t" in layer and (name not in layer or rows >= OUT_MAJOR_MIN_ROWS)


def group_for_shards(params: dict, config: ModelConfig, shards: int) -> dict:
    """The inference layout regrouped for `shards`-way tensor parallelism: the fused projections become
    w_qkv [D, M, (n + 2k) H] (b_qkv [M, (n + 2k) H]) and w_gate_up [D, M, 2f], where shard m's block holds
    its n = N/M query heads, k = K/M KV heads (the same heads its slice of `wo` and of the K/V cache hold) and
    its f = F/M MLP columns (the rows of `w_down` it holds). Splitting the flat [D, (N + 2K) H] matrix in M
    would hand shard 0 only query heads. `_prepared_layer` reads either layout; M = 1 keeps the flat one.
    """
    # The mesh's shardings are written for [in, out]; one shard keeps the params' layout (or this backend's).
    params = prepare_for_decode(params, config, layout=None if shards == 1 else "in")
    if shards == 1 or params["layers"][0]["w_qkv"].ndim == 3:
        return params
    N, K, H, F = config.num_heads, config.num_kv_heads, config.head_dim, config.intermediate_size
    M = shards
    xp = np if isinstance(params["layers"][0]["w_qkv"], np.ndarray) else jnp

    def group(w, widths):  # w [..., sum(widths)] -> [..., M, sum(widths) / M], each part split M ways
        parts, at = [], 0
        for width in widths:
            parts.append(w[..., at : at + width].reshape(*w.shape[:-1], M, width // M))
            at += width
        return xp.concatenate(parts, axis=-1)

    def one(layer: dict) -> dict:
        out = dict(layer)
        out["w_qkv"] = group(layer["w_qkv"], (N * H, K * H, K * H))
        out["w_gate_up"] = group(layer["w_gate_up"], (F, F))
        if "b_qkv" in layer:
            out["b_qkv"] = group(layer["b_qkv"], (N * H, K * H, K * H))
        return out

    return {**params, "layers": tuple(one(layer) for layer in params["layers"])}


# Logical axes of the decode layout's fused projections ([in, out], flat), from the declared ones (`AXES`): q/k/v
# fuse along their head axes, gate/up along "mlp". `group_for_shards` splits that axis into (heads, "block"); an
# out-major copy (`{name}_t`) lists them reversed.
FUSED_AXES = {
    "w_qkv": (AXES["wq"][0], AXES["wq"][1]),
    "b_qkv": (AXES["bq"][0],),
    "wo": (AXES["wo"][0], AXES["wo"][2]),
    "w_gate_up": AXES["w_gate"],
    "w_down": AXES["w_down"],
}


def decode_axes(params: dict) -> dict:
    """The logical axes of every leaf of params in a decode layout (`prepare_for_decode`, `group_for_shards`):
    a tree like `params` whose leaves are tuples of axis names, what `lsjax.mesh` shards a decode by."""

    def leaf_axes(name: str, ndim: int) -> tuple[str, ...]:
        base = name.removesuffix("_t")
        if base not in FUSED_AXES:
            return AXES[name]
        ax = FUSED_AXES[base]
        if ndim == len(ax) + 1:  # grouped per shard: [.., M, c]
            ax = (*ax, "block")
        return ax[::-1] if name.endswith("_t") else ax

    out = {name: AXES[name] for name in params if name != "layers"}
    out["layers"] = tuple({k: leaf_axes(k, np.ndim(v)) for k, v in layer.items()} for layer in params["layers"])
    return out


def _prepared_layer(layer: dict, config: ModelConfig, x: jax.Array, cos, sin, attend) -> tuple:
    """One decoder layer in the inference layout: x [B, T, D] -> (x, k, v [B, T, K, H])."""
    B, T, D = x.shape
    N, K, H, F = config.num_heads, config.num_kv_heads, config.head_dim, config.intermediate_size
    eps = config.rms_norm_eps
    # The cache's dtype: q/k/v are rounded to it once, after RoPE in fp32.
    dt = (layer["w_qkv"] if "w_qkv" in layer else layer["w_qkv_t"]).dtype
    # Flat [D, (N + 2K) H] (or its transpose, out-major), or grouped per tensor-parallel shard [D, M, ...]
    # (`group_for_shards`): the same columns in another order, so shard m computes its own heads' q, k, v
    # and its own MLP columns.
    M = layer["w_qkv"].shape[1] if "w_qkv" in layer and layer["w_qkv"].ndim == 3 else 1
    n, k_, f = N // M, K // M, F // M
    spec = "btd,dmc->btmc" if M > 1 else None
    qkv = project(layer, "w_qkv", rms_norm(x, layer["attn_norm"], eps), spec)  # [B, T, (M,) (n + 2k) H]
    if config.qkv_bias:
        qkv = qkv + layer["b_qkv"]
    q = qkv[..., : n * H].reshape(B, T, N, H)
    k = qkv[..., n * H : (n + k_) * H].reshape(B, T, K, H)
    v = qkv[..., (n + k_) * H :].reshape(B, T, K, H).astype(dt)
    q, k = qk_normed(layer, config, q, k)
    q, k = apply_rope(q, cos, sin).astype(dt), apply_rope(k, cos, sin).astype(dt)
    x = x + project(layer, "wo", attend(q, k, v).reshape(B, T, N * H))
    gate_up = project(layer, "w_gate_up", rms_norm(x, layer["mlp_norm"], eps), spec)  # [B, T, (M,) 2f]
    act = (jax.nn.silu(gate_up[..., :f]) * gate_up[..., f:]).reshape(B, T, F)
    x = x + project(layer, "w_down", act)
    return x, k, v


def forward_hidden(
    params: dict,
    config: ModelConfig,
    tokens: jax.Array,
    positions: jax.Array,
    cache: KVCache,
    tree_mask: jax.Array | None = None,
    *,
    backend: str = "auto",
    layers: tuple[int, int] | None = None,
    x: jax.Array | None = None,
    pad_to: int = 0,
):
    """Runs the decoder over T new tokens.

    tokens, positions [B, T]; the new tokens see the committed cache
    `[0, cache.lengths)` unmasked and each other under `tree_mask` [B, T, T]
    (None = causal chain). Returns (hidden [B, T, D] (fp32) before the final norm,
    new_k, new_v [L, B, T, K, H]).

    `layers=(lo, hi)` runs layers [lo, hi) only, from `x` [B, T, D] (the residual stream entering layer lo;
    the embeddings when None), and returns that range's K/V [hi - lo, B, T, K, H]: a caller can stop
    between layers (to read or prune the tree there) and go on. Without it the code is the plain forward.

    `pad_to=R` (batch-invariant numerics, `ModelConfig.invariant_rows`): the T <= R tokens run as R rows (the
    rest padding, each seeing only itself) with `attention.invariant_tree_attention`, so every matmul,
    reduction and attention has the same shapes in every call and a token's outputs are the same bits
    whichever row it sits in and however many real rows there are. Outputs are cut back to T rows.
    """
    if pad_to:
        return _padded(params, config, tokens, positions, cache, tree_mask, layers, x, pad_to, backend)
    cos, sin = rope_angles(positions, inverse_frequencies(config))
    lo, hi = layers if layers is not None else (0, config.num_layers)
    # The residual stream is fp32 whatever the weights' dtype (`layers.dense` says why).
    x = embed(params, tokens) if x is None else x
    x = x.astype(ACT_DTYPE)
    eps = config.rms_norm_eps

    def attend(q, k, v, index):
        # The whole cache goes in with the layer index: slicing it here would copy a layer per call.
        return attention.hybrid_tree_attention(
            q,
            cache.k,
            cache.v,
            cache.lengths,
            k,
            v,
            tree_mask,
            causal=tree_mask is None,
            layer=index,
            backend=backend,
            out_dtype=ACT_DTYPE,
        )

    if is_stacked(params):
        # One layer's code, looped (`stack_layers`); each step takes its layer out of the whole stack, so a
        # range [lo, hi) copies nothing else.
        stack = params["layers"]

        def scanned(x, i):
            layer = jax.tree.map(lambda a: jax.lax.dynamic_index_in_dim(a, i, keepdims=False), stack)
            x, k, v = _prepared_layer(layer, config, x, cos, sin, lambda q, k, v: attend(q, k, v, i))
            return x, (k, v)

        x, (new_k, new_v) = jax.lax.scan(scanned, x, jnp.arange(lo, hi))
        return x, new_k, new_v

    if is_prepared(params):
        # Unrolled: each layer reads its own weight arrays in place (see prepare_for_decode).
        new_k, new_v = [], []
        for i, layer in enumerate(params["layers"][lo:hi], start=lo):
            x, k, v = _prepared_layer(layer, config, x, cos, sin, lambda q, k, v, i=i: attend(q, k, v, i))
            new_k.append(k)
            new_v.append(v)
        return x, jnp.stack(new_k), jnp.stack(new_v)

    def layer_fn(x, xs):
        layer, index = xs
        h = rms_norm(x, layer["attn_norm"], eps)
        q, k, v = qkv_projection(layer, config, h, cos, sin)
        o = attend(q, k, v, index)
        x = x + dense(o, layer["wo"], "btnh,nhd->btd")
        x = x + dense_mlp(layer, rms_norm(x, layer["mlp_norm"], eps))
        return x, (k, v)

    stacked = params["layers"]
    if layers is not None:
        stacked = jax.tree.map(lambda a: a[lo:hi], stacked)
    x, (new_k, new_v) = jax.lax.scan(layer_fn, x, (stacked, jnp.arange(lo, hi)))
    return x, new_k, new_v


def forward_streams(
    params: dict,
    config: ModelConfig,
    tokens: jax.Array,
    positions: jax.Array,
    cache: KVCache,
    taps: tuple[int, ...],
    tree_mask: jax.Array | None = None,
    *,
    backend: str = "auto",
    pad_to: int = 0,
    upto: int | None = None,
):
    """`forward_hidden` that also returns the residual streams entering the layers `taps` (the embeddings for
    layer 0), concatenated in that order [B, T, len(taps) * D] (fp32): (hidden, new_k, new_v, streams). The
    forward runs in segments between the distinct layers: the same layers and shapes as the plain one.
    `upto=l` stops before layer l (l >= every tap): hidden is then the stream entering l, and the K/V cover
    layers [0, l)."""
    stop = config.num_layers if upto is None else upto
    x, ks, vs, seen, lo = None, [], [], {}, 0
    for cut in (*sorted(set(taps)), stop):
        if cut > lo:
            x, k, v = forward_hidden(
                params,
                config,
                tokens,
                positions,
                cache,
                tree_mask,
                backend=backend,
                layers=(lo, cut),
                x=x,
                pad_to=pad_to,
            )
            ks.append(k)
            vs.append(v)
            lo = cut
        if cut not in seen:
            seen[cut] = embed(params, tokens).astype(ACT_DTYPE) if x is None else x
    streams = jnp.concatenate([seen[i] for i in taps], axis=-1)
    if not ks:  # `upto=0`: no layer ran
        return x, None, None, streams
    return x, jnp.concatenate(ks, axis=0), jnp.concatenate(vs, axis=0), streams


def _padded(params, config, tokens, positions, cache, tree_mask, layers, x, rows: int, backend: str):
    """`forward_hidden(..., pad_to=rows)`: the batch-invariant forward (`attention.invariant_tree_attention`,
    whose cache part is a Pallas kernel on a GPU)."""
    B, T = tokens.shape
    if rows < T:
        raise ConfigError(
            f"invariant_rows: a forward over {T} tree nodes does not fit {rows} rows; raise invariant_rows to >= {T}"
        )
    extra = rows - T
    if tree_mask is None:  # a causal chain
        tree_mask = jnp.broadcast_to(jnp.tril(jnp.ones((T, T), bool)), (B, T, T))
    # Padding rows sit at the cache length (depth 0) and see only themselves: a finite row nothing reads.
    pad_rows = jnp.arange(rows) >= T
    tree_mask = jnp.pad(tree_mask, ((0, 0), (0, extra), (0, extra))) | (jnp.eye(rows, dtype=bool) & pad_rows)
    tokens = jnp.pad(tokens, ((0, 0), (0, extra)))
    positions = jnp.concatenate([positions, jnp.broadcast_to(cache.lengths[:, None], (B, extra))], axis=1)
    if x is not None:
        x = jnp.pad(x, ((0, 0), (0, extra), (0, 0)))
    cos_sin = rope_angles(positions, inverse_frequencies(config))
    plan = attention.invariant_plan(tree_mask, positions, cache.lengths, cache.capacity)
    lo, hi = layers if layers is not None else (0, config.num_layers)
    x = (embed(params, tokens) if x is None else x).astype(ACT_DTYPE)

    def attend(q, k, v, index):
        out = attention.invariant_tree_attention(q, cache.k, cache.v, k, v, plan, layer=index, backend=backend)
        return out.astype(ACT_DTYPE)

    layer_list = prepare_for_decode(params, config)["layers"]
    new_k, new_v = [], []
    for i, layer in enumerate(layer_list[lo:hi], start=lo):
        x, k, v = _prepared_layer(layer, config, x, *cos_sin, lambda q, k, v, i=i: attend(q, k, v, i))
        new_k.append(k)
        new_v.append(v)
    return x[:, :T], jnp.stack(new_k)[:, :, :T], jnp.stack(new_v)[:, :, :T]


def forward(
    params: dict,
    config: ModelConfig,
    tokens: jax.Array,
    positions: jax.Array,
    cache: KVCache,
    num_valid: jax.Array | None = None,
    *,
    backend: str = "auto",
) -> tuple[jax.Array, KVCache]:
    """Causal forward over T new tokens that commits them: returns (logits [B, T, V], cache).

    `num_valid` [B] counts the real tokens per row (the rest is padding at the
    end of the row and is not committed); default all T.
    """
    B, T = tokens.shape
    hidden, new_k, new_v = forward_hidden(params, config, tokens, positions, cache, backend=backend)
    if num_valid is None:
        num_valid = jnp.full((B,), T, jnp.int32)
    return lm_head(params, config, hidden), commit(cache, new_k, new_v, num_valid)


def init_params(config: ModelConfig, key: jax.Array, scale: float = 0.02) -> dict:
    """Random parameters from `param_specs` (tests and tiny experiments)."""
    specs = param_specs(config)
    layer_weights = [p for p, s in specs.items() if p.startswith("layers/") and s.init == "normal"]
    keys = jax.random.split(key, len(layer_weights) + 2)
    # The key order predates param_specs: kept so tests' tiny models keep their weights.
    key_of = dict(zip(layer_weights, keys)) | {"embed": keys[-1], "lm_head": keys[-2]}
    return init_from_specs(specs, key_of, scale)


class Transformer(Model):
    """The target decoder (`config.arch`: Llama, Qwen2, Qwen3 or Mistral) as a linen module.

        model = Transformer(config)
        variables = model.init(key, method="weights")          # random, with logical axes (lsjax.models.module)
        logits, cache = model.apply(variables, tokens, positions, cache)

    Its parameters are `param_specs(config)`; `apply` also takes them in the decode layouts
    (`prepare_for_decode`, `group_for_shards`, `stack_layers`), which are transformations of the same
    variables. The methods are the forward; the functions above are their bodies, written over the params
    dict so one code path serves every layout.
    """

    config: ModelConfig

    def schema(self) -> dict[str, ParamSpec]:
        return param_specs(self.config)

    def random_weights(self, key: jax.Array) -> dict:
        return init_params(self.config, key)

    def __call__(self, tokens, positions, cache: KVCache, num_valid=None, *, backend: str = "auto"):
        """`forward`: causal over T new tokens, committed: (logits [B, T, V], cache)."""
        return forward(self.weights(), self.config, tokens, positions, cache, num_valid, backend=backend)

    def hidden(self, tokens, positions, cache: KVCache, tree_mask=None, **kwargs):
        """`forward_hidden`: (hidden [B, T, D] before the final norm, new_k, new_v), nothing committed."""
        return forward_hidden(self.weights(), self.config, tokens, positions, cache, tree_mask, **kwargs)

    def streams(self, tokens, positions, cache: KVCache, taps: tuple[int, ...], tree_mask=None, **kwargs):
        """`forward_streams`: `hidden` plus the residual streams entering the layers `taps`."""
        return forward_streams(self.weights(), self.config, tokens, positions, cache, taps, tree_mask, **kwargs)

    def logits(self, hidden: jax.Array, pad_to: int = 0) -> jax.Array:
        """`lm_head`: final norm and output projection, fp32 logits."""
        return lm_head(self.weights(), self.config, hidden, pad_to)

    def embed(self, tokens: jax.Array) -> jax.Array:
        """The token embeddings [B, T, D] in the weights' dtype."""
        return embed(self.weights(), tokens)
