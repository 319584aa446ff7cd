"""Layers shared by the target and the draft, and the parameter schema both describe themselves with.

A model states its parameters once, as `{path: ParamSpec}` (paths like "layers/wq"): its Flax module declares
them from it (`lsjax.models.module.Model.schema`, each with its logical axes as partitioning metadata), and random
init (`init_from_specs`) and the loaders' shape checks (`check_shapes`) read it.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from lsjax.errors import ShapeMismatchError

INITS = ("normal", "ones", "zeros")


@dataclasses.dataclass(frozen=True)
class ParamSpec:
    """One parameter: its shape, dtype, one logical axis name per dimension, and how random init fills it."""

    shape: tuple[int, ...]
    dtype: str
    logical_axes: tuple[str, ...]
    init: str = "normal"  # "normal" (scaled by init_from_specs' `scale`) | "ones" | "zeros"

    def __post_init__(self):
        if len(self.shape) != len(self.logical_axes):
            raise ValueError(f"shape {self.shape} and logical axes {self.logical_axes} differ in rank")
        if self.init not in INITS:
            raise ValueError(f"init must be one of {'|'.join(INITS)}, got {self.init!r}")


def flatten(params: dict, prefix: str = "") -> dict:
    """{"layers": {"wq": x}} -> {"layers/wq": x} (the paths `param_specs` uses)."""
    out = {}
    for name, leaf in params.items():
        if isinstance(leaf, dict):
            out |= flatten(leaf, f"{prefix}{name}/")
        else:
            out[f"{prefix}{name}"] = leaf
    return out


def unflatten(flat: dict) -> dict:
    out: dict = {}
    for path, leaf in flat.items():
        *parents, name = path.split("/")
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        node[name] = leaf
    return out


def init_from_specs(specs: dict[str, ParamSpec], keys: dict[str, jax.Array], scale: float) -> dict:
    """Random params: `scale * normal` for "normal" specs (keys[path] each), ones / zeros for the others."""

    def one(path: str, s: ParamSpec):
        dtype = jnp.dtype(s.dtype)
        if s.init == "ones":
            return jnp.ones(s.shape, dtype)
        if s.init == "zeros":
            return jnp.zeros(s.shape, dtype)
        return (scale * jax.random.normal(keys[path], s.shape)).astype(dtype)

    return unflatten({path: one(path, s) for path, s in specs.items()})


def check_shapes(params: dict, specs: dict[str, ParamSpec]) -> None:
    """Raises ShapeMismatchError naming the first leaf whose presence or shape differs from `specs`."""
    flat = flatten(params)
    if missing := sorted(specs.keys() - flat.keys()):
        raise ShapeMismatchError(f"tensor {missing[0]}: missing (expected shape {specs[missing[0]].shape})")
    if extra := sorted(flat.keys() - specs.keys()):
        raise ShapeMismatchError(f"tensor {extra[0]}: not a parameter of this model")
    for path, s in specs.items():
        if tuple(flat[path].shape) != s.shape:
            raise ShapeMismatchError(f"tensor {path}: expected shape {s.shape}, got {tuple(flat[path].shape)}")


def shape_problem(params: dict, specs: dict[str, ParamSpec]) -> str | None:
    """`check_shapes` as one line (None when `params` fit `specs`), for callers that name the argument."""
    try:
        check_shapes(params, specs)
    except ShapeMismatchError as e:
        return str(e)
    return None


# ---------------------------------------------------------------------------
# Layers


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    xf = x.astype(jnp.float32)
    xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return weight * xf.astype(x.dtype)


ACT_DTYPE = jnp.float32  # the residual stream, matmul outputs and logits, whatever dtype the weights are in


def dense(x: jax.Array, w: jax.Array, spec: str | None = None) -> jax.Array:
    """x @ w (or einsum `spec`) with the input cast to the weight's dtype and an fp32 result.

    Why: with bf16 weights, a bf16 result rounds every activation and logit to 8 bits. Logits near 16 then
    step by 0.125, so two tokens often tie exactly, and which one wins depends on how the last bits of the
    hidden state happened to round; AR (1 row) and verification (T rows, another split of the attention sum)
    round differently, and greedy speculative output left AR's (docs/design/gpu.md).
    fp32 results leave ties only below fp32 resolution. fp32 weights run at HIGHEST precision (a GPU would
    otherwise use TF32 for them).
    """
    precision = jax.lax.Precision.HIGHEST if w.dtype == jnp.float32 else None
    x = x.astype(w.dtype)
    if spec is None:
        return jnp.matmul(x, w, precision=precision, preferred_element_type=ACT_DTYPE)
    return jnp.einsum(spec, x, w, precision=precision, preferred_element_type=ACT_DTYPE)


def embed(params: dict, tokens: jax.Array) -> jax.Array:
    return jnp.take(params["embed"], tokens, axis=0)  # [B, T, D]


def mlp(layer: dict, x: jax.Array) -> jax.Array:
    """SwiGLU in the input's dtype (the draft models' MLP; the target's goes through `dense`)."""
    gate = jnp.einsum("btd,df->btf", x, layer["w_gate"])
    up = jnp.einsum("btd,df->btf", x, layer["w_up"])
    return jnp.einsum("btf,fd->btd", jax.nn.silu(gate) * up, layer["w_down"])


def dense_mlp(layer: dict, x: jax.Array) -> jax.Array:
    """SwiGLU through `dense`: fp32 results from weights in any dtype."""
    gate = dense(x, layer["w_gate"], "btd,df->btf")
    up = dense(x, layer["w_up"], "btd,df->btf")
    return dense(jax.nn.silu(gate) * up, layer["w_down"], "btf,fd->btd")


def dense_rows(x: jax.Array, rows: jax.Array) -> jax.Array:
    """x [..., K] against a weight stored as output rows [N, K] (torch's Linear layout) -> fp32 [..., N].

    Computed as rows @ x^T. On XLA CPU that form is the faster one for 3 or more rows of x: a SmolLM2
    verification forward of 4-8 nodes costs 7-14% less with its projections stored [N, K] than with x @ w,
    w [K, N]; 1 row costs the same and 2 rows ~8% more (`target.default_layout`).
    """
    flat = x.reshape(-1, x.shape[-1])
    return dense(flat.T, rows, "kt,nk->nt").T.reshape(*x.shape[:-1], rows.shape[0])


def head_logits(h: jax.Array, rows: jax.Array) -> jax.Array:
    """h [..., D] against output rows [V, D] (a tied embedding, a pruned head) -> fp32 logits [..., V].

    `dense_rows`: for more than one row of h, XLA CPU runs h @ rows^T ~2x slower (at 2-16 rows x 49152 x 576:
    docs/design/cpu-verify-cost.md); for one row both are the same GEMV.
    """
    return dense_rows(h, rows)
