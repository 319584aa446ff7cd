"""The DFlash draft (z-lab/dflash): a block of masked positions denoised in one forward, conditioned on the
target's hidden states.

At a step whose last emitted token x_n sits at position n (not yet committed), the block is

    noise = embed_target([x_n, MASK, ..., MASK])           block_size tokens at positions n .. n + s - 1

and the context is every committed position t < n, represented by the target's streams there:

    c_t = RMSNorm_hidden(fc(concat_i h_t^(i)))              h^(i): HF's hidden_states[i + 1], i in target_layer_ids

Each of the N decoder layers (Qwen3's: q/k RMSNorm per head, GQA, SwiGLU) reads

    q   = rope(q_norm(Wq RMSNorm_in(x)))                   the block's positions only
    k   = rope(k_norm(Wk [c_<n ; RMSNorm_in(x)]))          the context's and the block's
    v   = Wv [c_<n ; RMSNorm_in(x)]
    x  += Wo attention(q, k, v)                            no mask: every block position sees the whole
    x  += MLP(RMSNorm_post(x))                             context and the whole block

and `RMSNorm_final(x)` at block positions 1 .. s - 1 goes through the target's LM head: the logits of the
tokens at n + 1 .. n + s - 1. The context's K/V in a layer depend on c_t alone (not on the block), so they
are computed once per committed token and kept: the draft's own K/V cache, one entry per layer and
committed position (`context_kv`), which the block forward attends to (`block`).

The draft is the linen module `DFlashDraft`; the drafter, the loaders and the tests call its `apply`:

    draft = DFlashDraft(cfg)
    variables = draft.init(key, method="weights")                           # random, with logical axes
    k, v = draft.apply(variables, aux, positions, method="context_kv")      # [N, B, T, K, H] to commit
    hidden = draft.apply(variables, noise, positions, cache)                # [B, s, D], final norm applied
    hidden = draft.apply(variables, noise, pos, anchors, k, v, method="blocks")  # training: [B, M, s, D]
    logits = draft.apply(variables, hidden[:, 1:], lm_head, embed, method="logits")

The target's embedding table and LM head are arguments (the draft has neither). Shapes follow the published
drafts (`DFlashDraftModel` in z-lab/dflash's `dflash/model.py`); this code is lsjax's own.

Parameters (`param_specs`; per-layer leaves stacked over the draft's N layers):

    fc [A Dt, D]; hidden_norm, final_norm [D]
    layers: attn_norm, mlp_norm [N, D]; wq [N, D, Nq, H]; wk, wv [N, D, K, H]; wo [N, Nq, H, D];
            q_norm, k_norm [N, H]; w_gate, w_up [N, D, F]; w_down [N, F, D]
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from lsjax import attention
from lsjax.cache import KVCache
from lsjax.config import ModelConfig, _check
from lsjax.models.layers import (
    ACT_DTYPE,
    ParamSpec,
    dense,
    dense_mlp,
    head_logits,
    init_from_specs,
    rms_norm,
)
from lsjax.models.module import Model
from lsjax.rope import apply_rope, inverse_frequencies, rope_angles

# `fc` is EAGLE-3's name for the same kind of weight (the target's concatenated streams in, the draft's width
# out): the same logical axes.
AXES = {"fc": ("aux", "embed")}
LAYER_AXES = {
    "attn_norm": ("norm",),
    "mlp_norm": ("norm",),
    "wq": ("embed", "heads", "head_dim"),
    "wk": ("embed", "kv_heads", "head_dim"),
    "wv": ("embed", "kv_heads", "head_dim"),
    "wo": ("heads", "head_dim", "embed"),
    "q_norm": ("head_dim",),
    "k_norm": ("head_dim",),
    "w_gate": ("embed", "mlp"),
    "w_up": ("embed", "mlp"),
    "w_down": ("mlp", "embed"),
}


@dataclasses.dataclass(frozen=True)
class DFlashConfig:
    """A DFlash draft's shape. `layer` describes its decoder layers (`num_layers` of them; hidden size, heads, MLP,
    RoPE, norm epsilon; `vocab_size` the vocabulary of the target it was made for); the rest is DFlash's own."""

    layer: ModelConfig
    target_hidden_size: int
    target_layer_ids: tuple[int, ...]  # HF's hidden_states[i + 1] for each i, concatenated in this order
    block_size: int  # s: the block's tokens, the last emitted one included (s - 1 drafted)
    mask_token_id: int

    def __post_init__(self):
        _check(isinstance(self.layer, ModelConfig), "dflash.layer", f"expected a ModelConfig, got {self.layer!r}")
        _check(self.layer.qk_norm, "dflash.layer.qk_norm", "DFlash layers are Qwen3's: qk_norm must be set")
        v = self.target_hidden_size
        _check(isinstance(v, int) and v >= 1, "dflash.target_hidden_size", f"must be an integer >= 1, got {v!r}")
        ids = self.target_layer_ids
        ok = isinstance(ids, tuple) and ids and all(isinstance(i, int) and i >= 0 for i in ids)
        _check(ok, "dflash.target_layer_ids", f"must be a non-empty tuple of layer indices >= 0, got {ids!r}")
        s = self.block_size
        _check(isinstance(s, int) and 2 <= s <= 64, "dflash.block_size", f"must be an integer in [2, 64], got {s!r}")
        m = self.mask_token_id
        _check(isinstance(m, int) and m >= 0, "dflash.mask_token_id", f"must be a token id >= 0, got {m!r}")

    @property
    def hidden_size(self) -> int:
        return self.layer.hidden_size

    @property
    def taps(self) -> tuple[int, ...]:
        """The target layers whose input streams are the features: HF's hidden_states[i + 1] enters layer i + 1."""
        return tuple(i + 1 for i in self.target_layer_ids)


def default_layer_ids(num_target_layers: int, num_draft_layers: int) -> tuple[int, ...]:
    """The target layers a DFlash draft reads when its config names none: one in the middle for a one-layer
    draft, else `num_draft_layers` spread evenly from layer 1 to layer L - 3 (the published drafts' rule),
    clipped into a target of fewer than 5 layers."""
    L = num_target_layers
    if num_draft_layers == 1:
        return (L // 2,)
    lo, hi = 1, L - 3
    spread = (int(round(lo + i * (hi - lo) / (num_draft_layers - 1))) for i in range(num_draft_layers))
    return tuple(min(max(i, 0), L - 1) for i in spread)


def param_specs(cfg: DFlashConfig) -> dict[str, ParamSpec]:
    c = cfg.layer
    L, D, F, N, K, H = c.num_layers, c.hidden_size, c.intermediate_size, c.num_heads, c.num_kv_heads, c.head_dim
    dt = c.dtype
    shapes = {
        "attn_norm": (D,),
        "mlp_norm": (D,),
        "wq": (D, N, H),
        "wk": (D, K, H),
        "wv": (D, K, H),
        "wo": (N, H, D),
        "q_norm": (H,),
        "k_norm": (H,),
        "w_gate": (D, F),
        "w_up": (D, F),
        "w_down": (F, D),
    }
    ones = ("attn_norm", "mlp_norm", "q_norm", "k_norm")
    specs = {
        f"layers/{n}": ParamSpec((L, *s), dt, ("layers", *LAYER_AXES[n]), "ones" if n in ones else "normal")
        for n, s in shapes.items()
    }
    specs["fc"] = ParamSpec((len(cfg.target_layer_ids) * cfg.target_hidden_size, D), dt, AXES["fc"])
    specs |= {n: ParamSpec((D,), dt, ("norm",), "ones") for n in ("hidden_norm", "final_norm")}
    return specs


def init_params(cfg: DFlashConfig, key: jax.Array, scale: float = 0.05) -> dict:
    specs = param_specs(cfg)
    names = [n for n, s in specs.items() if s.init == "normal"]
    return init_from_specs(specs, dict(zip(names, jax.random.split(key, len(names)))), scale)


def _layer(params: dict, i: int) -> dict:
    return {name: w[i] for name, w in params["layers"].items()}


def features(params: dict, cfg: DFlashConfig, aux: jax.Array) -> jax.Array:
    """The target's concatenated streams [..., A Dt] -> the context features [..., D] (fp32)."""
    return rms_norm(dense(aux, params["fc"]), params["hidden_norm"], cfg.layer.rms_norm_eps)


def _keys_values(layer: dict, cfg: DFlashConfig, x: jax.Array, cos, sin):
    """x [B, T, D] (already normed where the layer norms it) -> k, v [B, T, K, H] in the weights' dtype."""
    dt = layer["wk"].dtype
    k = rms_norm(dense(x, layer["wk"], "btd,dkh->btkh"), layer["k_norm"], cfg.layer.rms_norm_eps)
    v = dense(x, layer["wv"], "btd,dkh->btkh")
    return apply_rope(k, cos, sin).astype(dt), v.astype(dt)


def context_kv(params: dict, cfg: DFlashConfig, aux: jax.Array, positions: jax.Array):
    """The context's K/V at every layer for the target's streams aux [B, T, A Dt] at positions [B, T]:
    k, v [N, B, T, K, H] in the weights' dtype (what the draft's cache keeps)."""
    f = features(params, cfg, aux)
    cos, sin = rope_angles(positions, inverse_frequencies(cfg.layer))
    ks, vs = zip(*(_keys_values(_layer(params, i), cfg, f, cos, sin) for i in range(cfg.layer.num_layers)))
    return jnp.stack(ks), jnp.stack(vs)


def block(params: dict, cfg: DFlashConfig, noise: jax.Array, positions: jax.Array, cache: KVCache, backend: str):
    """The block's noise embeddings [B, s, D] at positions [B, s] over the context in `cache` (the draft's K/V,
    [N, B, K, S, H], up to `cache.lengths`) -> the final-normed states [B, s, D] (fp32)."""
    c = cfg.layer
    eps = c.rms_norm_eps
    cos, sin = rope_angles(positions, inverse_frequencies(c))
    x = noise.astype(ACT_DTYPE)
    B, s = noise.shape[:2]
    every = jnp.ones((B, s, s), bool)  # non-causal inside the block
    for i in range(c.num_layers):
        layer = _layer(params, i)
        h = rms_norm(x, layer["attn_norm"], eps)
        q = rms_norm(dense(h, layer["wq"], "btd,dnh->btnh"), layer["q_norm"], eps)
        q = apply_rope(q, cos, sin).astype(layer["wq"].dtype)
        k, v = _keys_values(layer, cfg, h, cos, sin)
        out_c, lse_c = attention.prefix_attention(q, cache.k, cache.v, cache.lengths, layer=i, backend=backend)
        out_b, lse_b = attention.tree_attention(q, k, v, every, backend=backend)
        out = attention.merge_attention(out_c, lse_c, out_b, lse_b)[0]
        x = x + dense(out, layer["wo"], "btnh,nhd->btd")
        x = x + dense_mlp(layer, rms_norm(x, layer["mlp_norm"], eps))
    return rms_norm(x, params["final_norm"], eps)


def parallel_blocks(
    params: dict, cfg: DFlashConfig, noise: jax.Array, positions: jax.Array, anchors: jax.Array, ctx_k, ctx_v
) -> jax.Array:
    """Many blocks in one forward, as training runs them: the noise embeddings [B, M, s, D] of M blocks at
    positions [B, M, s]; block m of row b reads the context positions t < anchors[b, m] (ctx_k, ctx_v
    [N, B, T, K, H]: `context_kv` at every position of the row) and its own s positions, never another block's
    -> the final-normed states [B, M, s, D] (fp32). Each block is exactly what `block` computes over a cache of
    the context before its anchor (attention as one softmax over both parts, fp32)."""
    c = cfg.layer
    eps = c.rms_norm_eps
    B, M, s, D = noise.shape
    T = ctx_k.shape[2]
    K, G, H = c.num_kv_heads, c.group_size, c.head_dim
    cos, sin = rope_angles(positions.reshape(B, M * s), inverse_frequencies(c))
    visible = (jnp.arange(T)[None, None] < anchors[:, :, None])[:, :, None, None, None, :]  # [B, M, 1, 1, 1, T]
    f32 = jnp.float32
    x = noise.reshape(B, M * s, D).astype(ACT_DTYPE)
    for i in range(c.num_layers):
        layer = _layer(params, i)
        h = rms_norm(x, layer["attn_norm"], eps)
        q = rms_norm(dense(h, layer["wq"], "btd,dnh->btnh"), layer["q_norm"], eps)
        q = apply_rope(q, cos, sin).astype(f32).reshape(B, M, s, K, G, H) * H**-0.5
        k, v = _keys_values(layer, cfg, h, cos, sin)
        k, v = k.astype(f32).reshape(B, M, s, K, H), v.astype(f32).reshape(B, M, s, K, H)
        on_ctx = jnp.einsum("bmskgh,btkh->bmkgst", q, ctx_k[i].astype(f32), preferred_element_type=f32)
        # A large finite floor, not -inf: a block anchored at 0 sees no context, and its row stays finite.
        on_ctx = jnp.where(visible, on_ctx, -1e30)
        on_blk = jnp.einsum("bmskgh,bmrkh->bmkgsr", q, k, preferred_element_type=f32)
        p = jax.nn.softmax(jnp.concatenate([on_ctx, on_blk], axis=-1), axis=-1)
        out = jnp.einsum("bmkgst,btkh->bmskgh", p[..., :T], ctx_v[i].astype(f32), preferred_element_type=f32)
        out = out + jnp.einsum("bmkgsr,bmrkh->bmskgh", p[..., T:], v, preferred_element_type=f32)
        x = x + dense(out.reshape(B, M * s, K * G, H), layer["wo"], "btnh,nhd->btd")
        x = x + dense_mlp(layer, rms_norm(x, layer["mlp_norm"], eps))
    return rms_norm(x, params["final_norm"], eps).reshape(B, M, s, D)


def logits(hidden: jax.Array, lm_head: jax.Array | None = None, embed: jax.Array | None = None) -> jax.Array:
    """The target's output projection (no norm: the draft's final norm is applied): `lm_head` [D, V] when the
    target has one, else its tied embedding rows `embed` [V, D] -> fp32 logits [..., V]."""
    if lm_head is not None:
        return dense(hidden, lm_head, "...d,dv->...v")
    return head_logits(hidden, embed)


class DFlashDraft(Model):
    """A DFlash draft as a linen module: `param_specs(config)` are its parameters, `init_params` its random init.
    The target's embedding and LM head are arguments of the methods that read them."""

    config: DFlashConfig

    def schema(self) -> dict[str, ParamSpec]:
        return param_specs(self.config)

    def random_weights(self, key: jax.Array) -> dict:
        return init_params(self.config, key)

    def __call__(self, noise, positions, cache: KVCache, *, backend: str = "auto"):
        """`block`: the noise embeddings [B, s, D] at positions [B, s] over the cached context -> [B, s, D]."""
        return block(self.weights(), self.config, noise, positions, cache, backend)

    def features(self, aux) -> jax.Array:
        """The context features [..., D] of the target's concatenated streams [..., A Dt]."""
        return features(self.weights(), self.config, aux)

    def context_kv(self, aux, positions):
        """The context's K/V at every layer: (k, v) [N, B, T, K, H] for the streams aux [B, T, A Dt]."""
        return context_kv(self.weights(), self.config, aux, positions)

    def blocks(self, noise, positions, anchors, ctx_k, ctx_v) -> jax.Array:
        """`parallel_blocks`: M blocks per row [B, M, s, D], each over the context before its anchor."""
        return parallel_blocks(self.weights(), self.config, noise, positions, anchors, ctx_k, ctx_v)

    def noise(self, tokens, embed) -> jax.Array:
        """The block's noise embeddings [B, s, D]: the target's table `embed` [V, D] at [root, MASK, ...]."""
        return jnp.take(embed, tokens, axis=0)

    def logits(self, hidden, lm_head=None, embed=None) -> jax.Array:
        """The target's head on the draft's final states (`logits`)."""
        return logits(hidden, lm_head, embed)
