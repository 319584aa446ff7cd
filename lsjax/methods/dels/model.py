"""The block-parallel draft model (DFlash's role in DeLS-Spec), built from the LongSpec draft layer.

One forward over the block [root, MASK x s] at positions n .. n + s (the root is the last emitted token, not
yet in the target's cache; the masks stand for the s tokens to draft):

    x_0 = embed(root), x_j = mask_embed (j = 1..s)       the TARGET's embedding; one learned mask vector [D]
    h1 = x + SelfAttn(rms_norm(x))     keys: the draft's own K/V of the last W committed tokens (the ring, no
                                       mask) and every block position (bidirectional inside the block)
    h2 = h1 + CrossAttn(rms_norm(h1))  keys: the target's committed last-layer K/V [0, n), no mask
    h3 = h2 + MLP(rms_norm(h2));       logits_j = lm_head(rms_norm(h3_j)) for j = 1..s: the token at n + j

Every projection is the LongSpec draft's (`lsjax.methods.longspec.model`): a block draft can start from a trained
LongSpec draft, whose cross-attention on the target's cache already carries the long context. DFlash instead
injects several target layers' hidden states as extra K/V into every draft layer; here the target's own
last-layer K/V play that part, because they are already in the cache (no extra target output, no extra
memory) and the shipped LongSpec draft was trained to read them.

Training (`block_hidden_train`) drafts A blocks per sequence at once: anchor a plays the root at position a,
its window is the sequence's tokens [a - W, a) and its target context the keys [0, a) — exactly what drafting
at n = a sees.

The block draft is the linen module `BlockDraft` (a `LongSpecDraft` with `mask_embed` and a block size), used
as a pure function; its methods are the forward and the functions here their bodies:

    draft = BlockDraft(config, draft_config, block_size)
    variables = draft.init(key, method="weights")                   # {"params": the weights of param_specs}
    hidden = draft.apply({"params": weights}, target_params, root, n, ring, k, v, n, method="hidden")
    logits = draft.apply({"params": weights}, target_params, hidden, vocab_ids, vocab_head, method="logits")
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from lsjax import attention
from lsjax.cache import RingCache
from lsjax.config import ConfigError, DraftConfig, ModelConfig
from lsjax.methods.longspec import model as draft_lib
from lsjax.methods.longspec.model import LongSpecDraft, _query, _rope, _self_qkv, init_draft_params
from lsjax.models.draft_params import DraftParams
from lsjax.models.layers import ParamSpec, embed, mlp, rms_norm

# Logical axes of the weights beyond the LongSpec draft's (`lsjax.methods.longspec.model.AXES`).
AXES: dict[str, tuple[str, ...]] = {"mask_embed": ("embed",)}


def param_specs(config: ModelConfig, draft: DraftConfig | None = None) -> dict[str, ParamSpec]:
    """The block draft's parameter schema: the LongSpec draft's (`lsjax.methods.longspec.model.param_specs`, whose
    optional weights `draft` chooses) plus the mask embedding [D]. Init, the loader's shape checks and the
    sharding rules derive from it."""
    if draft is not None and draft.depth != 1:  # its forward runs one block: deeper weights would be ignored
        raise ConfigError(f"draft.depth: the block draft (dels, block) has one block, got depth {draft.depth}")
    return draft_lib.param_specs(config, draft) | {
        "mask_embed": ParamSpec((config.hidden_size,), config.dtype, AXES["mask_embed"])
    }


def mask_embed_init(target_params: dict, config: ModelConfig) -> jax.Array:
    """The mask embedding a block draft starts from: the mean of the target's embedding rows (a neutral input
    the first training steps can move anywhere)."""
    return jnp.mean(jnp.asarray(target_params["embed"], jnp.float32), axis=0).astype(jnp.dtype(config.dtype))


def init_block_params(
    config: ModelConfig, draft_config: DraftConfig, target_params: dict, key: jax.Array | None = None
) -> dict:
    """A LongSpec draft initialised from the target (`init_draft_params`) plus the mask embedding
    (`mask_embed_init`): every weight of `param_specs`."""
    params = init_draft_params(config, draft_config, target_params, key)
    params["mask_embed"] = mask_embed_init(target_params, config)
    return params


def block_inputs(params: dict, target_params: dict, config: ModelConfig, root: jax.Array, block_size: int):
    """root [...] -> x [..., s + 1, D]: the root's embedding, then s mask embeddings."""
    x0 = embed(target_params, root[..., None]).astype(jnp.dtype(config.dtype))
    masks = jnp.broadcast_to(params["mask_embed"].astype(x0.dtype), (*root.shape, block_size, x0.shape[-1]))
    return jnp.concatenate([x0, masks], axis=-2)


def block_hidden(
    params: dict,
    target_params: dict,
    config: ModelConfig,
    block_size: int,
    root: jax.Array,
    n: jax.Array,
    ring: RingCache,
    target_k: jax.Array,
    target_v: jax.Array,
    target_len: jax.Array,
    *,
    layer: int | None = None,
    backend: str = "auto",
) -> jax.Array:
    """Drafting: root [B] at positions n [B] -> hidden [B, s, D] (before the final norm) of the s masks.

    target_k/v: the committed cache [B, K, S, H] or the whole target cache [L, B, K, S, H] (`layer`, default
    the last, is read in place)."""
    if target_k.ndim == 5 and layer is None:
        layer = config.num_layers - 1
    B, s = root.shape[0], block_size
    x = block_inputs(params, target_params, config, root, s)  # [B, s + 1, D]
    cos, sin = _rope(config, n[:, None] + jnp.arange(s + 1)[None])
    q, k, v = _self_qkv(params, config, x, cos, sin)
    out_r, lse_r = attention.prefix_attention(q, ring.k, ring.v, ring.lengths, backend=backend)
    both = jnp.ones((B, s + 1, s + 1), bool)  # bidirectional inside the block
    out_b, lse_b = attention.tree_attention(q, k, v, both, backend=backend)
    o, _ = attention.merge_attention(out_r, lse_r, out_b, lse_b)
    x = x + jnp.einsum("btnh,nhd->btd", o, params["self_wo"])
    qc = _query(params, config, x, cos, sin, "cross")
    oc, _ = attention.prefix_attention(qc, target_k, target_v, target_len, layer=layer, backend=backend)
    x = x + jnp.einsum("btnh,nhd->btd", oc, params["cross_wo"])
    x = x + mlp(params, rms_norm(x, params["mlp_norm"], config.rms_norm_eps))
    return x[:, 1:]


def block_hidden_train(
    params: dict,
    target_params: dict,
    config: ModelConfig,
    draft_config: DraftConfig,
    block_size: int,
    tokens: jax.Array,
    anchors: jax.Array,
    target_k: jax.Array,
    target_v: jax.Array,
    *,
    block_q: int = 512,
) -> jax.Array:
    """Training: A blocks per sequence at once. tokens [B, T] at plain positions 0..T-1; anchors [B, A] in
    [1, T - s); target_k (RoPE'd at 0..T-1), target_v [B, K, T, H]. Returns hidden [B, A, s, D]: block of
    anchor a, position j drafts token a + j.

    Masks by sequence index: a block's queries see the sequence's draft K/V at [a - W, a), their own block
    (bidirectional) and the target's keys [0, a)."""
    B, T = tokens.shape
    A, s, W = anchors.shape[1], block_size, draft_config.window
    dtype = jnp.dtype(config.dtype)
    cos, sin = _rope(config, jnp.broadcast_to(jnp.arange(T)[None], (B, T)))
    _, k_seq, v_seq = _self_qkv(params, config, embed(target_params, tokens).astype(dtype), cos, sin)
    root = jnp.take_along_axis(tokens, anchors, axis=1)  # [B, A]
    x = block_inputs(params, target_params, config, root, s).reshape(B, A * (s + 1), -1)
    pos = (anchors[:, :, None] + jnp.arange(s + 1)[None, None]).reshape(B, A * (s + 1))
    cos, sin = _rope(config, pos)
    q, k_blk, v_blk = _self_qkv(params, config, x, cos, sin)
    anchor_of = jnp.repeat(anchors, s + 1, axis=1)  # [B, Q]: each query's anchor
    t = jnp.arange(T)[None, None]
    seen_seq = (t < anchor_of[:, :, None]) & (t >= anchor_of[:, :, None] - W)  # [B, Q, T]
    block_id = jnp.repeat(jnp.arange(A), s + 1)
    seen_blk = jnp.broadcast_to(block_id[:, None] == block_id[None, :], (B, A * (s + 1), A * (s + 1)))
    keys = jnp.concatenate([k_seq, k_blk], axis=1)
    vals = jnp.concatenate([v_seq, v_blk], axis=1)
    o, _ = attention.tree_attention_xla(q, keys, vals, jnp.concatenate([seen_seq, seen_blk], axis=2), block_q=block_q)
    x = x + jnp.einsum("btnh,nhd->btd", o, params["self_wo"])
    qc = _query(params, config, x, cos, sin, "cross")
    seen_tgt = t < anchor_of[:, :, None]
    oc, _ = attention.tree_attention_xla(
        qc, target_k.swapaxes(1, 2), target_v.swapaxes(1, 2), seen_tgt, block_q=block_q
    )
    x = x + jnp.einsum("btnh,nhd->btd", oc, params["cross_wo"])
    x = x + mlp(params, rms_norm(x, params["mlp_norm"], config.rms_norm_eps))
    return x.reshape(B, A, s + 1, -1)[:, :, 1:]


# ---------------------------------------------------------------------------------------------- numpy reference


def _np_rms(x, w, eps):
    return w * x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def _np_rope(x, pos, inv_freq):
    """x [T, N, H] at positions [T] (rotate-half)."""
    f = pos[:, None] * inv_freq[None]
    c, s = np.cos(np.concatenate([f, f], -1)), np.sin(np.concatenate([f, f], -1))
    half = x.shape[-1] // 2
    rot = np.concatenate([-x[..., half:], x[..., :half]], -1)
    return x * c[:, None] + rot * s[:, None]


def _np_attend(q, k, v):
    """One query q [N, H] over keys k, v [S, K, H] (GQA by repetition), plain softmax in float64."""
    N, K = q.shape[0], k.shape[1]
    kk, vv = np.repeat(k, N // K, axis=1), np.repeat(v, N // K, axis=1)  # [S, N, H]
    s = np.einsum("nh,snh->ns", q, kk) / np.sqrt(q.shape[-1])
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("ns,snh->nh", p, vv)


def reference_position(params, target_params, config, root, n, j, ring_k, ring_v, target_k, target_v, block_size):
    """float64 numpy, one row, one block position j (1..s) computed on its own: hidden [D] before the final
    norm. ring_k/v [K, W', H] (the filled ring slots, RoPE'd), target_k/v [K, n, H] (RoPE'd)."""
    from lsjax.rope import inverse_frequencies

    p = {k: np.asarray(v, np.float64) for k, v in DraftParams.of(params).weights.items()}
    E = np.asarray(target_params["embed"], np.float64)
    eps, inv = config.rms_norm_eps, inverse_frequencies(config).astype(np.float64)
    x = np.concatenate([E[root][None], np.repeat(p["mask_embed"][None], block_size, 0)])  # [s + 1, D]
    pos = n + np.arange(block_size + 1, dtype=np.float64)
    h = _np_rms(x, p["self_norm"], eps)
    kb = _np_rope(np.einsum("td,dkh->tkh", h, p["self_wk"]), pos, inv)
    vb = np.einsum("td,dkh->tkh", h, p["self_wv"])
    q = _np_rope(np.einsum("d,dnh->nh", h[j], p["self_wq"])[None], pos[j : j + 1], inv)[0]
    keys = np.concatenate([np.asarray(ring_k, np.float64).swapaxes(0, 1), kb])
    vals = np.concatenate([np.asarray(ring_v, np.float64).swapaxes(0, 1), vb])
    xj = x[j] + np.einsum("nh,nhd->d", _np_attend(q, keys, vals), p["self_wo"])
    qc = _np_rope(np.einsum("d,dnh->nh", _np_rms(xj, p["cross_norm"], eps), p["cross_wq"])[None], pos[j : j + 1], inv)
    oc = _np_attend(
        qc[0], np.asarray(target_k, np.float64).swapaxes(0, 1), np.asarray(target_v, np.float64).swapaxes(0, 1)
    )
    xj = xj + np.einsum("nh,nhd->d", oc, p["cross_wo"])
    hm = _np_rms(xj, p["mlp_norm"], eps)
    g, u = hm @ p["w_gate"], hm @ p["w_up"]
    return xj + (g / (1 + np.exp(-g)) * u) @ p["w_down"]


# ---------------------------------------------------------------------------------------------- the module


class BlockDraft(LongSpecDraft):
    """The block draft as a linen module: the LongSpec draft's layer and methods (`self_kv` fills the ring,
    `logits` is its head) plus the mask embedding, run once over [root, MASK x block_size].

    Its parameters are `param_specs(config, draft)`; the target's tensors it reads are arguments."""

    block_size: int = 8  # s: the masks after the root, the tokens one forward drafts

    def schema(self) -> dict[str, ParamSpec]:
        return param_specs(self.config, self.draft)

    def random_weights(self, key: jax.Array) -> dict:
        """The LongSpec draft's random weights for `key` (the same values), plus a random mask embedding."""
        weights = super().random_weights(key)
        dtype = jnp.dtype(self.config.dtype)
        mask = 0.02 * jax.random.normal(jax.random.fold_in(key, 1), (self.config.hidden_size,))
        return weights | {"mask_embed": mask.astype(dtype)}

    def hidden(
        self,
        target_params: dict,
        root: jax.Array,
        n: jax.Array,
        ring: RingCache,
        target_k: jax.Array,
        target_v: jax.Array,
        target_len: jax.Array,
        *,
        layer: int | None = None,
        backend: str = "auto",
    ) -> jax.Array:
        """`block_hidden`: drafting, root [B] at positions n [B] -> hidden [B, s, D] of the s masks."""
        return block_hidden(
            self.weights(),
            target_params,
            self.config,
            self.block_size,
            root,
            n,
            ring,
            target_k,
            target_v,
            target_len,
            layer=layer,
            backend=backend,
        )

    def hidden_train(
        self, target_params: dict, tokens: jax.Array, anchors: jax.Array, target_k: jax.Array, target_v: jax.Array
    ) -> jax.Array:
        """`block_hidden_train`: A blocks per sequence at anchors [B, A] -> hidden [B, A, s, D]."""
        return block_hidden_train(
            self.weights(),
            target_params,
            self.config,
            self.draft_config(),
            self.block_size,
            tokens,
            anchors,
            target_k,
            target_v,
        )
