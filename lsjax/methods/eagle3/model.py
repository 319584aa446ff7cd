"""The EAGLE-3 draft (Li et al., 2025): one decoder layer fed by three of the target's hidden states.

For the pair (h_t, x_{t+1}) at position t, where h_t = concat of the residual streams entering the target
layers `aux_layers` at token t:

    g   = fc(h_t)                                   only for target features; deeper tree steps feed the
                                                    draft's own output back as g (no fc)
    e   = embed(x_{t+1})                            the draft's own table, else the target's
    a   = [RMSNorm_in(e), RMSNorm_hidden(g)]        [2D]: q/k/v read both halves
    r   = RMSNorm_hidden(g) if norm_before_residual else g
    y   = r + o(attention(a))                       RoPE at position t, GQA, the draft's own K/V cache
    out = y + MLP(RMSNorm_post(y))                  the draft's hidden state, fed back at the next depth
    logits = lm_head(RMSNorm_final(out))            over the draft vocabulary; draft id i is target id
                                                    `draft_to_target[i]` (the published d2t is the offset)

`out` at position t guesses x_{t+2}. Shapes follow the published drafts (SafeAILab/EAGLE `cnets.py`, the
vLLM speculators `Eagle3Speculator`); this code is lsjax's own.

The draft is the linen module `Eagle3Draft` (`lsjax.models.module`); the drafter, the loaders and the bench
call it, never the functions below (its bodies):

    draft = Eagle3Draft(cfg)
    variables = draft.init(key, method="weights")                    # random, with logical axes
    out, k, v = draft.apply(variables, aux, tokens, positions, attend, target_embed)   # pairs from the target
    out, k, v = draft.apply(variables, tokens, g, positions, attend, target_embed, method="expand")  # a tree
    logits = draft.apply(variables, out, method="logits")             # [..., Vd]; "target_ids" maps ids

Its params are both published layouts' weights once read (`lsjax.methods.eagle3.checkpoint.read_draft`); the
target's embedding table is an argument (`target_embed`), read only when the draft ships none of its own.

Parameters (`param_specs`, one layer, not stacked):

    fc [A Dt, D]; hidden_norm, input_norm, mlp_norm, final_norm [D]
    wq [2D, N, H]; wk, wv [2D, K, H]; wo [N, H, D]; (q_norm, k_norm [H] with a Qwen3-style layer)
    w_gate, w_up [D, F]; w_down [F, D]; lm_head [D, Vd]; draft_to_target [Vd] int32; (embed [V, D])
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from lsjax import attention
from lsjax.config import ModelConfig, _check
from lsjax.errors import InputError
from lsjax.models.layers import ACT_DTYPE, ParamSpec, dense, dense_mlp, init_from_specs, rms_norm
from lsjax.models.layers import embed as lookup
from lsjax.models.module import Model
from lsjax.rope import apply_rope, inverse_frequencies, rope_angles

AXES = {"fc": ("aux", "embed"), "draft_to_target": ("draft_vocab",)}


@dataclasses.dataclass(frozen=True)
class Eagle3Config:
    """An EAGLE-3 draft's shape. `layer` describes its decoder layer as a one-layer model (hidden size, heads,
    MLP, RoPE, norm epsilon, q/k norms; `vocab_size` the target's vocabulary); the rest is EAGLE-3's own."""

    layer: ModelConfig
    draft_vocab_size: int
    target_hidden_size: int
    aux_layers: tuple[int, ...]  # target layers whose input streams feed fc, in concatenation order
    norm_before_residual: bool = False
    own_embed: bool = False  # the draft ships its own embedding table; else it reads the target's

    def __post_init__(self):
        _check(isinstance(self.layer, ModelConfig), "eagle3.layer", f"expected a ModelConfig, got {self.layer!r}")
        _check(self.layer.num_layers == 1, "eagle3.layer.num_layers", f"must be 1, got {self.layer.num_layers}")
        for name in ("draft_vocab_size", "target_hidden_size"):
            v = getattr(self, name)
            _check(isinstance(v, int) and v >= 1, f"eagle3.{name}", f"must be an integer >= 1, got {v!r}")
        _check(
            self.draft_vocab_size <= self.layer.vocab_size,
            "eagle3.draft_vocab_size",
            f"{self.draft_vocab_size} is more than the target's vocabulary ({self.layer.vocab_size})",
        )
        ok = isinstance(self.aux_layers, tuple) and self.aux_layers
        ok = ok and all(isinstance(i, int) and i >= 0 for i in self.aux_layers)
        _check(ok, "eagle3.aux_layers", f"must be a non-empty tuple of layer indices >= 0, got {self.aux_layers!r}")

    @property
    def hidden_size(self) -> int:
        return self.layer.hidden_size


def default_aux_layers(num_layers: int) -> tuple[int, ...]:
    """The target layers the published drafts read: 2, L // 2 and L - 3 (clipped into a small target)."""
    return tuple(min(max(i, 0), num_layers - 1) for i in (2, num_layers // 2, num_layers - 3))


def param_specs(cfg: Eagle3Config) -> dict[str, ParamSpec]:
    c = cfg.layer
    D, F, N, K, H = c.hidden_size, c.intermediate_size, c.num_heads, c.num_kv_heads, c.head_dim
    dt = c.dtype
    specs = {
        "fc": ParamSpec((len(cfg.aux_layers) * cfg.target_hidden_size, D), dt, AXES["fc"]),
        "wq": ParamSpec((2 * D, N, H), dt, ("embed", "heads", "head_dim")),
        "wk": ParamSpec((2 * D, K, H), dt, ("embed", "kv_heads", "head_dim")),
        "wv": ParamSpec((2 * D, K, H), dt, ("embed", "kv_heads", "head_dim")),
        "wo": ParamSpec((N, H, D), dt, ("heads", "head_dim", "embed")),
        "w_gate": ParamSpec((D, F), dt, ("embed", "mlp")),
        "w_up": ParamSpec((D, F), dt, ("embed", "mlp")),
        "w_down": ParamSpec((F, D), dt, ("mlp", "embed")),
        "lm_head": ParamSpec((D, cfg.draft_vocab_size), dt, ("embed", "vocab")),
        "draft_to_target": ParamSpec((cfg.draft_vocab_size,), "int32", AXES["draft_to_target"], "zeros"),
    }
    norms = ("hidden_norm", "input_norm", "mlp_norm", "final_norm")
    specs |= {n: ParamSpec((D,), dt, ("norm",), "ones") for n in norms}
    if c.qk_norm:
        specs |= {n: ParamSpec((H,), dt, ("head_dim",), "ones") for n in ("q_norm", "k_norm")}
    if cfg.own_embed:
        specs["embed"] = ParamSpec((c.vocab_size, D), dt, ("vocab", "embed"))
    return specs


def init_params(cfg: Eagle3Config, key: jax.Array, scale: float = 0.05) -> dict:
    """Random weights (tests, `--draft random`); the draft vocabulary is the target's first Vd ids."""
    specs = param_specs(cfg)
    names = [n for n, s in specs.items() if s.init == "normal"]
    params = init_from_specs(specs, dict(zip(names, jax.random.split(key, len(names)))), scale)
    params["draft_to_target"] = jnp.arange(cfg.draft_vocab_size, dtype=jnp.int32)
    return params


def embed_rows(params: dict, target_params: dict) -> jax.Array:
    """The embedding table the draft reads: its own when it ships one, else the target's."""
    return params["embed"] if "embed" in params else target_params["embed"]


def fuse(params: dict, aux: jax.Array) -> jax.Array:
    """The target's concatenated streams [..., A Dt] -> the draft's input state [..., D] (fp32)."""
    return dense(aux, params["fc"])


def layer(
    params: dict, cfg: Eagle3Config, emb: jax.Array, g: jax.Array, positions: jax.Array, attend
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The decoder layer on T pairs: emb, g [B, T, D], positions [B, T] -> (out [B, T, D] fp32, k, v [B, T, K, H]
    in the weights' dtype). `attend(q, k, v) -> [B, T, N, H]` sees the pairs' own K/V and whatever came before."""
    c = cfg.layer
    eps = c.rms_norm_eps
    dt = params["wq"].dtype
    hn = rms_norm(g.astype(ACT_DTYPE), params["hidden_norm"], eps)
    en = rms_norm(emb.astype(ACT_DTYPE), params["input_norm"], eps)
    residual = hn if cfg.norm_before_residual else g.astype(ACT_DTYPE)
    a = jnp.concatenate([en, hn], axis=-1)
    q = dense(a, params["wq"], "btd,dnh->btnh")
    k = dense(a, params["wk"], "btd,dkh->btkh")
    v = dense(a, params["wv"], "btd,dkh->btkh")
    if c.qk_norm:
        q, k = rms_norm(q, params["q_norm"], eps), rms_norm(k, params["k_norm"], eps)
    cos, sin = rope_angles(positions, inverse_frequencies(c))
    q, k, v = apply_rope(q, cos, sin).astype(dt), apply_rope(k, cos, sin).astype(dt), v.astype(dt)
    y = residual + dense(attend(q, k, v), params["wo"], "btnh,nhd->btd")
    out = y + dense_mlp(params, rms_norm(y, params["mlp_norm"], eps))
    return out, k, v


def logits(params: dict, cfg: Eagle3Config, out: jax.Array) -> jax.Array:
    """The draft's state [..., D] -> fp32 logits over the draft vocabulary [..., Vd]."""
    return dense(rms_norm(out, params["final_norm"], cfg.layer.rms_norm_eps), params["lm_head"])


def attend_over(cache_k, cache_v, lengths, *, backend: str, fresh=None):
    """An `attend` for `layer`: the draft's committed cache [1, B, K, S, H] up to `lengths` [B], unmasked, merged
    by LSE with the fresh keys. `fresh` None: the queries' own K/V, causal (a run of consecutive pairs);
    (buf_k, buf_v [B, Tk, K, H], at, mask [B, T, Tk]): a tree's keys so far, the queries' own written at slots
    [at, at + T) first (the mask names each query's ancestors and itself)."""

    def attend(q, k, v):
        out_c, lse_c = attention.prefix_attention(q, cache_k, cache_v, lengths, layer=0, backend=backend)
        if fresh is None:
            out_t, lse_t = attention.tree_attention(q, k, v, causal=True, backend=backend)
        else:
            buf_k, buf_v, at, mask = fresh
            buf_k = jax.lax.dynamic_update_slice_in_dim(buf_k, k.astype(buf_k.dtype), at, axis=1)
            buf_v = jax.lax.dynamic_update_slice_in_dim(buf_v, v.astype(buf_v.dtype), at, axis=1)
            out_t, lse_t = attention.tree_attention(q, buf_k, buf_v, mask, backend=backend)
        return attention.merge_attention(out_c, lse_c, out_t, lse_t)[0]

    return attend


class Eagle3Draft(Model):
    """An EAGLE-3 draft as a linen module: `param_specs(config)` are its parameters (`draft_to_target`, the
    draft vocabulary's target ids, among them), `init_params` its random init. Attention is the caller's
    `attend(q, k, v)` (`attend_over`: the draft's own cache, and a tree's keys so far)."""

    config: Eagle3Config

    def schema(self) -> dict[str, ParamSpec]:
        return param_specs(self.config)

    def random_weights(self, key: jax.Array) -> dict:
        return init_params(self.config, key)

    def __call__(self, aux, tokens, positions, attend, target_embed=None):
        """The pairs (the target's streams aux [B, T, A Dt], the next tokens [B, T]) at positions [B, T] ->
        (out [B, T, D] fp32, k, v [B, T, K, H])."""
        w = self.weights()
        return layer(w, self.config, self.embed(tokens, target_embed), fuse(w, aux), positions, attend)

    def expand(self, tokens, g, positions, attend, target_embed=None):
        """Deeper in a tree: the draft's own states g [B, T, D] (no fc) paired with tokens [B, T]."""
        return layer(self.weights(), self.config, self.embed(tokens, target_embed), g, positions, attend)

    def embed(self, tokens, target_embed=None) -> jax.Array:
        """Embeddings [B, T, D] from the draft's own table, else from the target's (`target_embed` [V, D])."""
        w = self.weights()
        if "embed" not in w and target_embed is None:
            raise InputError("this EAGLE-3 draft has no embedding table of its own: pass the target's (target_embed)")
        return lookup({"embed": embed_rows(w, {"embed": target_embed})}, tokens)

    def logits(self, out) -> jax.Array:
        """The draft's states [..., D] -> fp32 logits over the draft vocabulary [..., Vd]."""
        return logits(self.weights(), self.config, out)

    def target_ids(self, ids) -> jax.Array:
        """Draft vocabulary ids -> the target's."""
        return jnp.take(self.weights()["draft_to_target"], ids)
