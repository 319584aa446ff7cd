"""The LongSpec draft model: one decoder layer (or deeper: `DraftConfig.depth`) that reads the target's last-layer
KV cache.

    h0 = embed(token)                                   the TARGET's embedding (shared, frozen, never copied)
    h1 = h0 + SelfAttn(rms_norm(h0))                    sliding-window causal attention over the draft's own K/V
    h2 = h1 + CrossAttn(rms_norm(h1))                   queries from the draft; keys/values = the TARGET's
                                                        last-layer cache, already RoPE-rotated (no wk/wv here)
    h3 = h2 + MLP(rms_norm(h2))                         SwiGLU
    logits = lm_head(rms_norm(h3, final_norm))          the TARGET's LM head, optionally on a pruned vocabulary

Parameters (`param_specs`: a dict of weights in the target's dtype):

    self_norm [D]; self_wq [D, N, H]; self_wk, self_wv [D, K, H]; self_wo [N, H, D]
    (+ self_bq [N, H], self_bk, self_bv [K, H] with q/k/v biases: the target's `qkv_bias`, or the draft's own)
    cross_norm [D]; cross_wq [D, N, H]; cross_wo [N, H, D] (+ cross_bq [N, H] with biases)
    mlp_norm [D]; w_gate, w_up [D, F]; w_down [F, D]; final_norm [D] (unless `DraftConfig.final_norm` is off)
    deep_<name> [depth - 1, ...] for each cross-attention + MLP weight <name>, when `DraftConfig.depth` > 1:
    the (h2, h3) block repeated, each further block reading the same target cache (`blocks`)

Which optional weights a draft has is its config's (`param_specs(config, draft)`); the functions below read them
from the weights themselves (a bias or final norm present is applied), so one code path serves both.

The draft is the linen module `LongSpecDraft` (end of this file), used as a pure function:

    draft = LongSpecDraft(config, draft_config)
    variables = draft.init(key, method="weights")                   # {"params": the weights of param_specs}
    hidden = draft.apply({"params": weights}, target_params, tokens, positions, ring, ..., method="step")

Its methods (`self_kv`, `step`, `forward_train`, `logits`) are the forward; the functions below are their
bodies. Random init, the draft loader's shape checks (`lsjax.methods.longspec.checkpoint`) and the sharding
rules (`lsjax.sharding`) derive from its schema. At decode time the weights travel in a `DraftParams`
(`lsjax.models.draft_params`) with the pruned vocabulary and its gathered head.

The self-attention layer's input is the embedding, so a token's draft K/V depend
only on (token, position): `draft_self_kv` computes them for committed tokens and
tree nodes ahead of attention, and the drafter keeps the committed ones in a
`RingCache` of the window size.

Two modes share every projection:
* training (`draft_forward_train`): the whole sequence at once; self-attention
  is causal within the window (query p sees keys p - W .. p), cross-attention is
  LongSpec's flash noisy training (query t sees target keys s <= t - j, so the
  first j outputs are exactly zero; j is an array and never retraces). Both
  run blocked over queries with masks from sequence indices, never from
  `positions` (those may be anchor-offset indices); RoPE uses `positions`.
* inference (`draft_step`): T query tokens (a tree frontier) attend to the ring
  (no mask) + the tree's K/V (under a mask), merged by LSE, then to the
  committed target cache [0, target_len) (no mask).

Where we deliberately differ from the official code (sail-sg/LongSpec,
`models/llama_glide.py`, read to understand the architecture):
* a constant-size ring buffer for the draft's self-attention cache; the official
  code allocates a full-length draft cache and limits attention with a window;
* a final RMSNorm (initialised from the target's `final_norm`) before the shared
  LM head; the official draft feeds its last hidden state to the LM head
  un-normalised, which only works after training;
* q/k/v biases only when the target has them (`config.qkv_bias`); the official
  GlideAttention always has them;
* optional pruned draft vocabulary (`vocab_ids`), our own;
* at inference a tree node at depth d sees the W ring entries plus its d + 1
  ancestors (up to W + d + 1 keys); training's window is W + 1 keys. The ring
  stays constant-size; for W = 512 and depths <= 5 the difference is a few of
  the oldest keys.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lsjax import attention
from lsjax.band_attention import band_attention
from lsjax.cache import RingCache
from lsjax.config import DraftConfig, ModelConfig
from lsjax.models.draft_params import DraftParams
from lsjax.models.layers import ParamSpec, embed, head_logits, init_from_specs, mlp, rms_norm
from lsjax.models.module import Model
from lsjax.rope import apply_rope, inverse_frequencies, rope_angles

# ---------------------------------------------------------------------------
# Parameters

# Logical axes of every weight (`lsjax.sharding` maps them to mesh axes).
AXES: dict[str, tuple[str, ...]] = {
    "self_norm": ("norm",),
    "self_wq": ("embed", "heads", "head_dim"),
    "self_wk": ("embed", "kv_heads", "head_dim"),
    "self_wv": ("embed", "kv_heads", "head_dim"),
    "self_wo": ("heads", "head_dim", "embed"),
    "self_bq": ("heads", "head_dim"),
    "self_bk": ("kv_heads", "head_dim"),
    "self_bv": ("kv_heads", "head_dim"),
    "cross_norm": ("norm",),
    "cross_wq": ("embed", "heads", "head_dim"),
    "cross_wo": ("heads", "head_dim", "embed"),
    "cross_bq": ("heads", "head_dim"),
    "mlp_norm": ("norm",),
    "w_gate": ("embed", "mlp"),
    "w_up": ("embed", "mlp"),
    "w_down": ("mlp", "embed"),
    "final_norm": ("norm",),
}

# Where `init_draft_params` copies each weight from: the target layer's tensor of this name ("final_norm":
# the target's final norm).
FROM_TARGET = {
    "self_norm": "attn_norm",
    "self_wq": "wq",
    "self_wk": "wk",
    "self_wv": "wv",
    "self_wo": "wo",
    "self_bq": "bq",
    "self_bk": "bk",
    "self_bv": "bv",
    "cross_norm": "attn_norm",
    "cross_wq": "wq",
    "cross_wo": "wo",
    "cross_bq": "bq",
    "mlp_norm": "mlp_norm",
    "w_gate": "w_gate",
    "w_up": "w_up",
    "w_down": "w_down",
    "final_norm": "final_norm",
}


# The weights of one (cross-attention + MLP) block; blocks 2.. stack theirs as DEEP + name (`DraftConfig.depth`).
BLOCK = ("cross_norm", "cross_wq", "cross_bq", "cross_wo", "mlp_norm", "w_gate", "w_up", "w_down")
BLOCK_OUTPUTS = ("cross_wo", "w_down")
DEEP = "deep_"


def has_bias(config: ModelConfig, draft: DraftConfig | None) -> bool:
    return config.qkv_bias if draft is None or draft.qkv_bias is None else draft.qkv_bias


def param_specs(config: ModelConfig, draft: DraftConfig | None = None) -> dict[str, ParamSpec]:
    """The draft's parameter schema {name: ParamSpec} (module docstring): `draft` says which optional weights it
    has (None: lsjax's own layout). Random init, the loader's shape checks and the sharding rules derive from
    it. The "normal" matrices come first, in the order random init draws their keys."""
    D, F, N, K, H, dt = (
        config.hidden_size,
        config.intermediate_size,
        config.num_heads,
        config.num_kv_heads,
        config.head_dim,
        config.dtype,
    )
    shapes = {
        "self_wq": (D, N, H),
        "self_wk": (D, K, H),
        "self_wv": (D, K, H),
        "self_wo": (N, H, D),
        "cross_wq": (D, N, H),
        "cross_wo": (N, H, D),
        "w_gate": (D, F),
        "w_up": (D, F),
        "w_down": (F, D),
    }
    specs = {name: ParamSpec(shape, dt, AXES[name]) for name, shape in shapes.items()}
    specs |= {name: ParamSpec((D,), dt, AXES[name], "ones") for name in ("self_norm", "cross_norm", "mlp_norm")}
    if draft is None or draft.final_norm:
        specs["final_norm"] = ParamSpec((D,), dt, AXES["final_norm"], "ones")
    if has_bias(config, draft):
        biases = {"self_bq": (N, H), "self_bk": (K, H), "self_bv": (K, H), "cross_bq": (N, H)}
        specs |= {name: ParamSpec(shape, dt, AXES[name], "zeros") for name, shape in biases.items()}
    depth = 1 if draft is None else draft.depth
    if depth > 1:  # blocks 2..depth, stacked on a leading "layers" axis after every one-block weight
        specs |= {
            DEEP + name: ParamSpec((depth - 1, *s.shape), s.dtype, ("layers", *s.logical_axes), s.init)
            for name, s in list(specs.items())
            if name in BLOCK
        }
    return specs


def blocks(draft_params: dict) -> list[dict]:
    """The draft's (cross-attention + MLP) blocks, each a dict with the one-block weight names: the first block's
    weights as they are, then one slice of the stacked `deep_*` weights per further block."""
    out = [draft_params]
    deep = {name[len(DEEP) :]: w for name, w in draft_params.items() if name.startswith(DEEP)}
    for i in range(next(iter(deep.values())).shape[0] if deep else 0):
        out.append({name: w[i] for name, w in deep.items()})
    return out


def _layer_index(config: ModelConfig, index: int) -> int:
    L = config.num_layers
    if not -L <= index < L:
        raise ValueError(f"init_from_target_layer={index} outside [-{L}, {L}) for a {L}-layer target")
    return index % L


def init_draft_params(
    config: ModelConfig,
    draft_config: DraftConfig,
    target_params: dict | None = None,
    key: jax.Array | None = None,
    *,
    from_target: bool = True,
) -> dict:
    """Draft weights initialised from target layer `draft_config.init_from_target_layer`, or random.

    From the target (`FROM_TARGET`, for every weight of `param_specs`): self_* and cross_wq/cross_wo from
    that layer's attention (the cross-attention's keys come from the target's last layer, whose queries
    live in the same space when the layer is the last one), the MLP and its norm from that layer,
    `self_norm`/`cross_norm` from its attention norm and `final_norm` from the target's final norm.
    Tensors are copied, not aliased: a trainer that donates the draft params must not invalidate the
    target's buffers. With `from_target=False`, `key` gives random parameters.
    """
    if not from_target:
        if key is None:
            raise ValueError("init_draft_params(from_target=False) needs a PRNG key")
        return LongSpecDraft(config, draft_config).random_weights(key)
    if target_params is None:
        raise ValueError("init_draft_params(from_target=True) needs target_params")
    i = _layer_index(config, draft_config.init_from_target_layer)
    layer = {name: leaf[i] for name, leaf in target_params["layers"].items()}
    dtype = jnp.dtype(config.dtype)

    specs = param_specs(config, draft_config)

    def source(name: str):
        if name == "final_norm":
            return target_params["final_norm"]
        if FROM_TARGET[name] not in layer:  # a bias the draft has and the target does not (a released draft's)
            return jnp.zeros(specs[name].shape)
        return layer[FROM_TARGET[name]]

    params = {name: jnp.array(source(name), dtype=dtype, copy=True) for name in specs if not name.startswith(DEEP)}
    if "final_norm" in params:
        params["final_norm"] = params["final_norm"] * draft_config.init_head_scale
    if draft_config.zero_init_outputs:
        for name in ("self_wo", "cross_wo", "w_down"):
            params[name] = jnp.zeros_like(params[name])
    return grow_depth(params, draft_config.depth)


def grow_depth(params: dict, depth: int) -> dict:
    """One-block draft weights (a dict, no `deep_*`) grown to `depth` blocks, the same function: each new block
    copies the first block's weights with its output projections (`cross_wo`, `w_down`) zero, so it adds
    nothing until training moves them. A trainer continuing a one-block draft at a larger depth starts here."""
    have = len(blocks(params))
    if depth < have:
        raise ValueError(f"grow_depth: the draft already has {have} blocks, more than depth {depth}")
    if depth == have:
        return params
    if have != 1:
        raise ValueError(f"grow_depth: grows a one-block draft, this one has {have} blocks")
    n = depth - 1
    out = dict(params)
    for name in BLOCK:
        if name in params:
            w = jnp.asarray(params[name])
            w = jnp.zeros_like(w) if name in BLOCK_OUTPUTS else w
            out[DEEP + name] = jnp.broadcast_to(w, (n, *w.shape)).copy()  # a copy: trainers donate every leaf
    return out


def random_draft_params(
    config: ModelConfig, key: jax.Array, scale: float = 0.02, draft: DraftConfig | None = None
) -> dict:
    """Random draft weights from `param_specs`: normal * scale for matrices, ones for norms, zeros for biases."""
    specs = param_specs(config, draft)
    normal = [name for name, s in specs.items() if s.init == "normal"]
    return init_from_specs(specs, dict(zip(normal, jax.random.split(key, len(normal)))), scale)


# ---------------------------------------------------------------------------
# Vocabulary (the pruned set itself is chosen by lsjax.vocab)


def with_vocab_head(draft_params, target_params: dict, config: ModelConfig) -> DraftParams:
    """`draft_params` (a DraftParams, or a dict in the file layout) as a DraftParams with `vocab_head`
    [Vd, D], the LM-head rows of its pruned vocabulary, gathered once (`DraftParams.with_vocab_head`)."""
    return DraftParams.of(draft_params).with_vocab_head(target_params, config)


def draft_logits(
    draft_params, target_params: dict, config: ModelConfig, hidden: jax.Array, vocab_ids=None
) -> jax.Array:
    """hidden [..., D] (before the final norm) -> fp32 logits [..., V], or [..., Vd] over a pruned vocabulary.

    `draft_params`: a DraftParams (its own `vocab_ids`, and `vocab_head` when gathered at load, are used), or
    a weights dict (then `vocab_ids` [Vd] prunes, or None). The LM head is the target's (the embedding when
    tied); logit i is the full vocabulary's logit at vocab_ids[i]. Without a gathered head the [Vd, D] rows
    are gathered per call, which a jitted caller hoists out of its loop.
    """
    p = DraftParams.of(draft_params)
    if vocab_ids is None:
        vocab_ids = p.vocab_ids if isinstance(draft_params, DraftParams) else None
    w = p.weights
    h = rms_norm(hidden, w["final_norm"], config.rms_norm_eps) if "final_norm" in w else hidden
    if vocab_ids is not None and p.vocab_head is not None:  # gathered once at load (with_vocab_head)
        return head_logits(h, p.vocab_head).astype(jnp.float32)
    if config.tie_embeddings:
        head = target_params["embed"] if vocab_ids is None else jnp.take(target_params["embed"], vocab_ids, axis=0)
        logits = head_logits(h, head)
    else:
        head = target_params["lm_head"] if vocab_ids is None else jnp.take(target_params["lm_head"], vocab_ids, axis=1)
        logits = jnp.einsum("...d,dv->...v", h, head)
    return logits.astype(jnp.float32)


# ---------------------------------------------------------------------------
# Projections shared by training and inference


def _rope(config: ModelConfig, positions: jax.Array):
    return rope_angles(positions, inverse_frequencies(config))  # (cos, sin) [B, T, H]


def _self_qkv(draft_params: dict, config: ModelConfig, x: jax.Array, cos, sin):
    """x [B, T, D] (the embedding) -> q [B, T, N, H], k, v [B, T, K, H], RoPE on q and k."""
    h = rms_norm(x, draft_params["self_norm"], config.rms_norm_eps)
    q = jnp.einsum("btd,dnh->btnh", h, draft_params["self_wq"])
    k = jnp.einsum("btd,dkh->btkh", h, draft_params["self_wk"])
    v = jnp.einsum("btd,dkh->btkh", h, draft_params["self_wv"])
    if "self_bq" in draft_params:
        q, k, v = q + draft_params["self_bq"], k + draft_params["self_bk"], v + draft_params["self_bv"]
    return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v


def _query(draft_params: dict, config: ModelConfig, x: jax.Array, cos, sin, part: str):
    """x [B, T, D] -> q [B, T, N, H] of the `part` ("self" or "cross") attention, RoPE'd at the query's absolute
    position (the cross-attention's target keys already are)."""
    h = rms_norm(x, draft_params[f"{part}_norm"], config.rms_norm_eps)
    q = jnp.einsum("btd,dnh->btnh", h, draft_params[f"{part}_wq"])
    if f"{part}_bq" in draft_params:
        q = q + draft_params[f"{part}_bq"]
    return apply_rope(q, cos, sin)


def draft_self_kv(draft_params: dict, target_params: dict, config: ModelConfig, tokens, positions):
    """The draft's self-attention K/V of tokens [B, T] at positions [B, T]: (k RoPE'd, v), each [B, T, K, H].

    They depend on (token, position) only, so committed tokens and tree nodes get
    theirs before any attention runs.
    """
    cos, sin = _rope(config, positions)
    x = embed(target_params, tokens).astype(jnp.dtype(config.dtype))
    _, k, v = _self_qkv(draft_params, config, x, cos, sin)
    return k, v


# ---------------------------------------------------------------------------
# Training mode


def self_attention_train(draft_params, target_params, config, draft_config, tokens, positions, *, block_q=512):
    """The self-attention branch in training mode: SelfAttn(rms_norm(h0)) [B, T, D] (after self_wo)."""
    cos, sin = _rope(config, positions)
    x = embed(target_params, tokens).astype(jnp.dtype(config.dtype))
    q, k, v = _self_qkv(draft_params, config, x, cos, sin)
    o = band_attention(q, k.swapaxes(1, 2), v.swapaxes(1, 2), window=draft_config.window, block_q=block_q)
    return jnp.einsum("btnh,nhd->btd", o, draft_params["self_wo"])


def cross_attention_train(draft_params, config, x, positions, target_k, target_v, shift, *, block_q=512):
    """Flash noisy cross-attention: x [B, T, D] (h1); target_k/v [B, K, T, H]; query t sees keys s <= t - shift.

    Equals the paper's O[j:] = attn(Q[j:], K[:-j], V[:-j]) with zeros for the
    first j rows (Appendix G), computed with a mask by sequence index so that j
    can be an array. Returns CrossAttn(rms_norm(x)) [B, T, D] (after cross_wo).
    """
    cos, sin = _rope(config, positions)
    q = _query(draft_params, config, x, cos, sin, "cross")
    o = band_attention(q, target_k, target_v, shift=shift, block_q=block_q)
    return jnp.einsum("btnh,nhd->btd", o, draft_params["cross_wo"])


def draft_forward_train(
    draft_params: dict,
    target_params: dict,
    config: ModelConfig,
    draft_config: DraftConfig,
    tokens: jax.Array,
    positions: jax.Array,
    target_k: jax.Array,
    target_v: jax.Array,
    shift: jax.Array,
    *,
    block_q: int = 512,
) -> jax.Array:
    """The draft over a whole sequence: hidden [B, T, D] before the final norm.

    tokens, positions [B, T] (positions may be anchor-offset indices; they only
    drive RoPE); target_k (post-RoPE), target_v [B, K, T, H]: the target's
    last-layer K/V of the same tokens; shift: int32 scalar j >= 1 (an array:
    new values do not retrace).
    """
    x = embed(target_params, tokens).astype(jnp.dtype(config.dtype))
    x = x + self_attention_train(draft_params, target_params, config, draft_config, tokens, positions, block_q=block_q)
    for b in blocks(draft_params):
        x = x + cross_attention_train(b, config, x, positions, target_k, target_v, shift, block_q=block_q)
        x = x + mlp(b, rms_norm(x, b["mlp_norm"], config.rms_norm_eps))
    return x


# ---------------------------------------------------------------------------
# Inference mode


def ring_positions(ring: RingCache, end: jax.Array) -> jax.Array:
    """[B, S] the absolute position each ring slot holds when positions [0, end) [B] were written in order
    (slot p % S keeps the last of them); -1 for a slot never written."""
    S = ring.window
    s = jnp.arange(S, dtype=jnp.int32)[None]
    last = end[:, None] - 1
    p = last - jnp.mod(last - s, S)
    return jnp.where(p >= 0, p, -1)


def draft_step(
    draft_params: dict,
    target_params: dict,
    config: ModelConfig,
    draft_config: DraftConfig,
    tokens: jax.Array,
    positions: jax.Array,
    ring: RingCache,
    tree_k: jax.Array,
    tree_v: jax.Array,
    tree_mask: jax.Array,
    target_k: jax.Array,
    target_v: jax.Array,
    target_len: jax.Array,
    *,
    layer: int | None = None,
    backend: str = "auto",
    target_tail: tuple[jax.Array, jax.Array, jax.Array] | None = None,
    ring_lo: tuple[jax.Array, jax.Array] | None = None,
) -> jax.Array:
    """The draft on T query tokens (a tree frontier): hidden [B, T, D] before the final norm.

    Self-attention: over every filled ring slot (all committed tokens of the
    window, no mask) and over the tree's K/V tree_k/v [B, Tk, K, H] under
    tree_mask [B, T, Tk] — the caller has put the queries' own K/V in there
    (from `draft_self_kv`) and set mask[self] = True — merged exactly by LSE.
    Cross-attention: over the target's committed last-layer cache
    [0, target_len) [B], no mask. target_k/v are [B, K, S, H], or the whole
    target cache [L, B, K, S, H]: then `layer` (default the last) is read in
    place, with no copy of that layer. `target_tail` (k, v [B, Tt, K, H], mask [B, T, Tt]): more target keys,
    each query seeing those its mask allows, merged by LSE (queries at consecutive positions, each reading the
    target cache up to its own position: `LongSpecDrafter.first_children`). `ring_lo` (n [B] the positions committed
    to the ring, lo [B, T]): each query sees only the ring's keys at positions >= its lo
    (`DraftConfig.frontier_window`); None: every filled slot.
    """
    del draft_config  # the window is the ring's size
    if target_k.ndim == 5 and layer is None:
        layer = config.num_layers - 1
    cos, sin = _rope(config, positions)
    x = embed(target_params, tokens).astype(jnp.dtype(config.dtype))
    q = _query(draft_params, config, x, cos, sin, "self")
    if ring_lo is None:
        out_r, lse_r = attention.prefix_attention(q, ring.k, ring.v, ring.lengths, backend=backend)
    else:
        n, lo = ring_lo
        seen = ring_positions(ring, n)
        mask = (seen[:, None, :] >= lo[:, :, None]) & (seen[:, None, :] >= 0)
        k_r, v_r = ring.k.swapaxes(1, 2), ring.v.swapaxes(1, 2)
        out_r, lse_r = attention.tree_attention(q, k_r, v_r, mask, backend=backend)
    out_t, lse_t = attention.tree_attention(q, tree_k, tree_v, tree_mask, backend=backend)
    o, _ = attention.merge_attention(out_r, lse_r, out_t, lse_t)
    x = x + jnp.einsum("btnh,nhd->btd", o, draft_params["self_wo"])
    for b in blocks(draft_params):
        qc = _query(b, config, x, cos, sin, "cross")
        oc, lse_c = attention.prefix_attention(qc, target_k, target_v, target_len, layer=layer, backend=backend)
        if target_tail is not None:
            tail_k, tail_v, tail_mask = target_tail
            out_tail, lse_tail = attention.tree_attention(qc, tail_k, tail_v, tail_mask, backend=backend)
            oc, _ = attention.merge_attention(oc, lse_c, out_tail, lse_tail)
        x = x + jnp.einsum("btnh,nhd->btd", oc, b["cross_wo"])
        x = x + mlp(b, rms_norm(x, b["mlp_norm"], config.rms_norm_eps))
    return x


# ---------------------------------------------------------------------------
# The module


class LongSpecDraft(Model):
    """The LongSpec draft as a linen module: the layer of the module docstring, run through `init` / `apply`.

        draft = LongSpecDraft(config, draft_config)
        variables = draft.init(key, method="weights")       # random, with logical axes (lsjax.models.module)
        k, v = draft.apply(variables, target_params, tokens, positions, method="self_kv")
        hidden = draft.apply(variables, target_params, tokens, positions, ring, ..., method="step")
        logits = draft.apply(variables, target_params, hidden, vocab_ids, vocab_head, method="logits")

    Its parameters are `param_specs(config, draft)`; at decode time they are `DraftParams.weights`. The
    target's tensors it reads (the embedding, the LM head, the last layer's K/V) are arguments of the
    methods, never variables of the draft, and so are the pruned vocabulary and its gathered head. The
    methods are the forward; the functions above are their bodies, written over the weights dict.
    """

    config: ModelConfig
    draft: DraftConfig | None = None  # its optional weights and its window; None: lsjax's own layout

    def schema(self) -> dict[str, ParamSpec]:
        return param_specs(self.config, self.draft)

    def random_weights(self, key: jax.Array) -> dict:
        return random_draft_params(self.config, key, draft=self.draft)

    def draft_config(self) -> DraftConfig:
        return DraftConfig() if self.draft is None else self.draft

    def self_kv(self, target_params: dict, tokens: jax.Array, positions: jax.Array):
        """`draft_self_kv`: the self-attention K/V [B, T, K, H] (k RoPE'd) of tokens at positions."""
        return draft_self_kv(self.weights(), target_params, self.config, tokens, positions)

    def step(
        self,
        target_params: dict,
        tokens: jax.Array,
        positions: jax.Array,
        ring: RingCache,
        tree_k: jax.Array,
        tree_v: jax.Array,
        tree_mask: jax.Array,
        target_k: jax.Array,
        target_v: jax.Array,
        target_len: jax.Array,
        *,
        layer: int | None = None,
        backend: str = "auto",
        target_tail: tuple[jax.Array, jax.Array, jax.Array] | None = None,
        ring_lo: tuple[jax.Array, jax.Array] | None = None,
    ) -> jax.Array:
        """`draft_step`: inference on T query tokens, hidden [B, T, D] before the final norm."""
        return draft_step(
            self.weights(),
            target_params,
            self.config,
            self.draft_config(),
            tokens,
            positions,
            ring,
            tree_k,
            tree_v,
            tree_mask,
            target_k,
            target_v,
            target_len,
            layer=layer,
            backend=backend,
            target_tail=target_tail,
            ring_lo=ring_lo,
        )

    def forward_train(
        self,
        target_params: dict,
        tokens: jax.Array,
        positions: jax.Array,
        target_k: jax.Array,
        target_v: jax.Array,
        shift: jax.Array,
    ) -> jax.Array:
        """`draft_forward_train`: the whole sequence at lag `shift`, hidden [B, T, D] before the final norm."""
        return draft_forward_train(
            self.weights(),
            target_params,
            self.config,
            self.draft_config(),
            tokens,
            positions,
            target_k,
            target_v,
            shift,
        )

    def logits(
        self,
        target_params: dict,
        hidden: jax.Array,
        vocab_ids: jax.Array | None = None,
        vocab_head: jax.Array | None = None,
    ) -> jax.Array:
        """`draft_logits`: fp32 logits [..., V] (or [..., Vd] over `vocab_ids`, through `vocab_head` [Vd, D]
        when it was gathered at load) of hidden [..., D] before the final norm."""
        return draft_logits(DraftParams(self.weights(), vocab_ids, vocab_head), target_params, self.config, hidden)
