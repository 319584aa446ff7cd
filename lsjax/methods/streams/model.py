"""Speculative Streaming's multi-stream attention (MSA) layers, lossless mode (Bhendawade et al., §2.1-2.3).

The frozen target's top N_s layers also carry gamma *speculative streams* per position: stream j at node t
starts at layer L = N - N_s from the main stream's residual there plus a learned stream embedding P_j (the
paper's f_eta is the identity, which it found as good as a low-rank map), and runs through layers L..N-1
with the target's own frozen weights:

    attention  its own query (frozen wq at t's position) over the main stream's keys and values up to t:
               the committed cache plus t's tree ancestors (no key of a stream is ever cached, §2.2), and,
               with `attend_streams`, the keys of streams 1..j at the same node (eq. 2: S_{t(<=j)}), which
               lets stream j condition on what streams < j predict
    MLP        the frozen MLP (`stream_mlp`; or none, the paper's H.2 FLOP saving) plus a parallel low-rank
               stream adapter of rank r, the only trained weights inside the layers
    head       the target's final norm and LM head: stream j at t predicts the token at t + 1 + j

The main stream is never touched (lossless mode): its logits are the plain target's. Early-exit pruning
(§2.3): `exit_logits` maps the residual entering layer L through a low-rank residual adapter o_theta and the
LM head, an approximation of the next token the drafter uses to score parent -> child transitions before
the top layers run.

Shapes: streams s [B, T, S, D] (S = gamma streams per node); the target's params in either layout
(`lsjax.models.target`: stacked for training, per-layer fused for decoding).

Stream params (`param_specs`): stream_embed [S, D]; adapter_norm [Ns, D], adapter_down [Ns, D, r],
adapter_up [Ns, r, D] (zero init: the adapter starts as a no-op); exit_down [D, r], exit_up [r, D] (zero).

They are the linen module `SpeculativeStreams` (`lsjax.models.module`); the drafter and the trainer call it,
never the functions below (its bodies). Its forward reads the target's top layers and LM head, which are the
target's weights: an argument, never a variable of the module.

    streams = SpeculativeStreams(config, StreamsConfig())
    variables = streams.init(key, method="weights")                              # random, with logical axes
    s = streams.apply(variables, target_params, mid_hidden, positions, main_kv)   # [B, T, S, D]
    logits = streams.apply(variables, target_params, s, method="logits")          # [B, T, S, V]
    early = streams.apply(variables, target_params, mid_hidden, method="exit_logits")
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from lsjax import attention
from lsjax.config import ConfigError, ModelConfig, _check
from lsjax.models import target
from lsjax.models.layers import ParamSpec, init_from_specs, rms_norm
from lsjax.models.module import Model
from lsjax.rope import apply_rope, inverse_frequencies, rope_angles


@dataclasses.dataclass(frozen=True)
class StreamsConfig:
    """The streams' shape: gamma streams through the top N_s layers, adapters of rank r."""

    num_streams: int = 3  # gamma: stream j = 1..gamma predicts the token j + 1 positions ahead
    msa_layers: int = 4  # N_s: the target's top layers that carry the streams (the paper's default 4)
    rank: int = 8  # stream adapters and the early-exit adapter (the paper's R_s = 8)
    stream_mlp: bool = True  # streams also pass through the frozen MLP (False: the adapter alone)
    attend_streams: bool = True  # stream j also attends to streams 1..j of its node (eq. 2)
    # The stream embeddings and the stream adapters' outputs are multiplied by `gain`. Adam's steps are sized
    # in parameter units (~lr per step) while the residual they add to is large (SmolLM2's entering layer 26
    # has RMS ~20): at gain 1 the stream losses of a SmolLM2 run had not moved after 30 steps.
    # Set it near the residual's RMS at layer L.
    gain: float = 1.0

    def __post_init__(self):
        for f in ("num_streams", "msa_layers", "rank"):
            v = getattr(self, f)
            _check(
                isinstance(v, int) and not isinstance(v, bool) and v >= 1,
                f"streams.{f}",
                f"must be an integer >= 1, got {v!r}",
            )
        _check(isinstance(self.stream_mlp, bool), "streams.stream_mlp", "must be true or false")
        _check(isinstance(self.attend_streams, bool), "streams.attend_streams", "must be true or false")
        _check(
            isinstance(self.gain, (int, float)) and not isinstance(self.gain, bool) and self.gain > 0,
            "streams.gain",
            f"must be a number > 0, got {self.gain!r}",
        )

    def first_layer(self, config: ModelConfig) -> int:
        """L = N - N_s: the layer whose input initialises the streams (and feeds early exit)."""
        if self.msa_layers > config.num_layers:
            raise ConfigError(
                f"streams.msa_layers: must be <= the target's {config.num_layers} layers, got {self.msa_layers}"
            )
        return config.num_layers - self.msa_layers


def param_specs(config: ModelConfig, scfg: StreamsConfig) -> dict[str, ParamSpec]:
    D, S, Ns, r, dt = config.hidden_size, scfg.num_streams, scfg.msa_layers, scfg.rank, config.dtype
    return {
        "stream_embed": ParamSpec((S, D), dt, ("streams", "embed")),
        "adapter_norm": ParamSpec((Ns, D), dt, ("layers", "norm"), "ones"),
        "adapter_down": ParamSpec((Ns, D, r), dt, ("layers", "embed", "rank")),
        "adapter_up": ParamSpec((Ns, r, D), dt, ("layers", "rank", "embed"), "zeros"),
        "exit_down": ParamSpec((D, r), dt, ("embed", "rank")),
        "exit_up": ParamSpec((r, D), dt, ("rank", "embed"), "zeros"),
    }


def init_params(config: ModelConfig, scfg: StreamsConfig, key: jax.Array, scale: float = 0.02) -> dict:
    specs = param_specs(config, scfg)
    keys = dict(zip(specs, jax.random.split(key, len(specs)), strict=True))
    return init_from_specs(specs, keys, scale)


def num_params(config: ModelConfig, scfg: StreamsConfig) -> int:
    return sum(math.prod(s.shape) for s in param_specs(config, scfg).values())


# ----------------------------------------------------------------------------- the target's layer pieces


def _layer(target_params: dict, index: int) -> dict:
    layers = target_params["layers"]
    return layers[index] if target.is_prepared(target_params) else jax.tree.map(lambda a: a[index], layers)


def _mm(layer: dict, name: str, x: jax.Array) -> jax.Array:
    """x through a projection of the target's inference layout, stored [in, out] or out-major [out, in]."""
    return x @ layer[name] if name in layer else x @ layer[f"{name}_t"].T


def _qkv(layer: dict, config: ModelConfig, h: jax.Array, cos, sin):
    """h [B, T, S, D] -> q [B, T, S, N, H], k, v [B, T, S, K, H] with the frozen weights, RoPE on q and k
    (cos/sin [B, T, 1, H/2]: every stream of a node sits at the node's position)."""
    N, K, H = config.num_heads, config.num_kv_heads, config.head_dim
    if "w_qkv" in layer or "w_qkv_t" in layer:  # the inference layout, either order
        qkv = _mm(layer, "w_qkv", h)
        if config.qkv_bias:
            qkv = qkv + layer["b_qkv"]
        q = qkv[..., : N * H].reshape(*h.shape[:3], N, H)
        k = qkv[..., N * H : (N + K) * H].reshape(*h.shape[:3], K, H)
        v = qkv[..., (N + K) * H :].reshape(*h.shape[:3], K, H)
    else:
        q = jnp.einsum("btsd,dnh->btsnh", h, layer["wq"])
        k = jnp.einsum("btsd,dkh->btskh", h, layer["wk"])
        v = jnp.einsum("btsd,dkh->btskh", h, layer["wv"])
        if config.qkv_bias:
            q, k, v = q + layer["bq"], k + layer["bk"], v + layer["bv"]
    q, k = target.qk_normed(layer, config, q, k)
    return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v


def _out_proj(layer: dict, o: jax.Array) -> jax.Array:
    """o [B, T, S, N, H] -> [B, T, S, D]."""
    if "w_qkv" in layer or "w_qkv_t" in layer:
        return _mm(layer, "wo", o.reshape(*o.shape[:3], -1))
    return jnp.einsum("btsnh,nhd->btsd", o, layer["wo"])


def _mlp(layer: dict, config: ModelConfig, h: jax.Array) -> jax.Array:
    if "w_gate_up" in layer or "w_gate_up_t" in layer:
        F = config.intermediate_size
        gu = _mm(layer, "w_gate_up", h)
        return _mm(layer, "w_down", jax.nn.silu(gu[..., :F]) * gu[..., F:])
    return (jax.nn.silu(h @ layer["w_gate"]) * (h @ layer["w_up"])) @ layer["w_down"]


# ----------------------------------------------------------------------------- multi-stream attention


def _stream_heads(q: jax.Array, K: int) -> jax.Array:
    """[B, T, S, N, H] -> [B, T, K * S * G, H]: each kv head's query group grows by the streams, so the
    main stream's attention kernels serve the streams unchanged (query head k*S*G + j*G + g)."""
    B, T, S, N, H = q.shape
    G = N // K
    return q.reshape(B, T, S, K, G, H).transpose(0, 1, 3, 2, 4, 5).reshape(B, T, K * S * G, H)


def _unstream_heads(o: jax.Array, S: int, K: int) -> jax.Array:
    B, T, NS, H = o.shape
    G = NS // (K * S)
    return o.reshape(B, T, K, S, G, H).transpose(0, 1, 3, 2, 4, 5).reshape(B, T, S, K * G, H)


def _self_streams(q, k, v):
    """Streams attending to streams 1..j of their own node: q [B, T, S, N, H], k, v [B, T, S, K, H] ->
    (out [B, T, S, N, H], lse [B, T, S, N])."""
    B, T, S, N, H = q.shape
    K = k.shape[3]
    qg = q.reshape(B, T, S, K, N // K, H).astype(jnp.float32) * H**-0.5
    s = jnp.einsum("btjkgh,btikh->btjkgi", qg, k.astype(jnp.float32))  # [B, T, S, K, G, S]
    causal = jnp.arange(S)[:, None] >= jnp.arange(S)[None, :]  # stream j sees streams i <= j
    s = jnp.where(causal[None, None, :, None, None, :], s, attention.NEG_INF)
    lse = jax.nn.logsumexp(s, axis=-1)
    o = jnp.einsum("btjkgi,btikh->btjkgh", jnp.exp(s - lse[..., None]), v.astype(jnp.float32))
    return o.reshape(B, T, S, N, H).astype(q.dtype), lse.reshape(B, T, S, N)


def msa_attention(
    q: jax.Array,
    main: tuple,
    streams_kv: tuple | None = None,
    *,
    backend: str = "auto",
) -> jax.Array:
    """Stream queries q [B, T, S, N, H] over the main stream's keys up to each node, plus (with
    `streams_kv` = (k, v) [B, T, S, K, H]) streams 1..j of the same node. Returns [B, T, S, N, H].

    `main` says which main-stream keys node t sees, as one of
      ("cache", cache_k, cache_v, lengths, layer)                          the committed cache only
      ("tree", cache_k, cache_v, lengths, layer, tree_k, tree_v, mask)      cache + the tree under mask [B, T, Tk]
      ("keys", k, v, mask)                                                  keys [B, Tk, K, H] under mask [B, T, Tk]
    (cache_k/v [L, B, K, S, H] with `layer`, as in `lsjax.attention`).
    """
    S = q.shape[2]
    kind = main[0]
    K = main[1].shape[2] if kind == "keys" else main[1].shape[-3]
    qs = _stream_heads(q, K)
    if kind == "keys":
        _, k, v, mask = main
        out, lse = attention.tree_attention(qs, k, v, mask, backend=backend)
    else:
        _, cache_k, cache_v, lengths, layer = main[:5]
        out, lse = attention.prefix_attention(qs, cache_k, cache_v, lengths, layer=layer, backend=backend)
        if kind == "tree":
            tree_k, tree_v, mask = main[5:]
            out_t, lse_t = attention.tree_attention(qs, tree_k, tree_v, mask, backend=backend)
            out, lse = attention.merge_attention(out, lse, out_t, lse_t)
    out = _unstream_heads(out, S, K)
    if streams_kv is None:
        return out
    lse = _unstream_heads(lse[..., None], S, K)[..., 0]  # [B, T, S, N]
    out_s, lse_s = _self_streams(q, *streams_kv)
    out, _ = attention.merge_attention(out, lse, out_s, lse_s)
    return out


# ----------------------------------------------------------------------------- the streams


def init_streams(stream_params: dict, mid_hidden: jax.Array, gain: float = 1.0) -> jax.Array:
    """mid_hidden [B, T, D] (the residual entering layer L) -> streams [B, T, S, D] (eq. 4, f_eta = id)."""
    return mid_hidden[:, :, None, :] + gain * stream_params["stream_embed"].astype(mid_hidden.dtype)


def stream_hidden(
    stream_params: dict,
    target_params: dict,
    config: ModelConfig,
    scfg: StreamsConfig,
    mid_hidden: jax.Array,
    positions: jax.Array,
    main_kv,
    *,
    backend: str = "auto",
) -> jax.Array:
    """The streams' final residual [B, T, S, D] (before the final norm) at T nodes.

    mid_hidden [B, T, D] is the main stream entering layer L at the nodes, positions [B, T] theirs.
    `main_kv(i)` gives `msa_attention`'s `main` for target layer i (L <= i < N): the main stream's keys
    each node may see at that layer.
    """
    L = scfg.first_layer(config)
    eps = config.rms_norm_eps
    cos, sin = rope_angles(positions, inverse_frequencies(config))
    cos, sin = cos[:, :, None], sin[:, :, None]  # one position per node, shared by its streams
    s = init_streams(stream_params, mid_hidden, scfg.gain)
    for i in range(L, config.num_layers):
        a = i - L
        layer = _layer(target_params, i)
        q, k, v = _qkv(layer, config, rms_norm(s, layer["attn_norm"], eps), cos, sin)
        o = msa_attention(q, main_kv(i), (k, v) if scfg.attend_streams else None, backend=backend)
        s = s + _out_proj(layer, o)
        h = rms_norm(s, layer["mlp_norm"], eps)
        down = rms_norm(s, stream_params["adapter_norm"][a], eps) @ stream_params["adapter_down"][a]
        delta = scfg.gain * (jax.nn.silu(down) @ stream_params["adapter_up"][a])
        s = s + delta + (_mlp(layer, config, h) if scfg.stream_mlp else 0.0)
    return s


def stream_logits(target_params: dict, config: ModelConfig, s: jax.Array) -> jax.Array:
    """Final residuals [..., D] -> logits [..., V] through the target's final norm and LM head."""
    # The target's body function: this runs inside the streams module's methods, where a second module cannot
    # be constructed outside `setup`.
    return target.lm_head(target_params, config, s)


def exit_hidden(stream_params: dict, mid_hidden: jax.Array) -> jax.Array:
    """o_theta(M^L) = M + up(down(M)): the early-exit residual (identity at init)."""
    return mid_hidden + (mid_hidden @ stream_params["exit_down"]) @ stream_params["exit_up"]


def exit_logits(stream_params: dict, target_params: dict, config: ModelConfig, mid_hidden: jax.Array) -> jax.Array:
    """Early-exit logits [..., V] at layer L: the LM head on o_theta(mid_hidden)."""
    return stream_logits(target_params, config, exit_hidden(stream_params, mid_hidden))


def tree_main_kv(taps, tree_mask: jax.Array):
    """`main_kv` for the verify forward's nodes (`lsjax.engine.verify.ForwardTaps`): committed cache plus ancestors."""
    cache = taps.cache

    def main(i: int):
        return ("tree", cache.k, cache.v, cache.lengths, i, taps.tree_k[i], taps.tree_v[i], tree_mask)

    return main


def causal_main_kv(main_k: jax.Array, main_v: jax.Array, query_pos: jax.Array, first_layer: int):
    """`main_kv` for training: every position's main-stream K/V of layers L..N-1 (main_k, main_v
    [Ns, B, T, K, H]), queries at query_pos [B, P] seeing the keys at positions <= theirs."""
    T = main_k.shape[2]
    mask = jnp.arange(T)[None, None, :] <= query_pos[:, :, None]  # [B, P, T]

    def main(i: int):
        return ("keys", main_k[i - first_layer], main_v[i - first_layer], mask)

    return main


def main_top_layers(target_params: dict, config: ModelConfig, scfg: StreamsConfig, mid_hidden, positions):
    """The frozen main stream through layers L..N-1 from mid_hidden [B, T, D] at positions [B, T], causal,
    no cache (training reads mid_hidden from the feature cache): (hidden [B, T, D], k, v [Ns, B, T, K, H])."""
    from lsjax.cache import KVCache

    B, T, _ = mid_hidden.shape
    return target.Transformer(config).apply(
        {"params": target_params},
        jnp.zeros((B, T), jnp.int32),
        positions,
        KVCache.zeros(config, B, 0),
        layers=(scfg.first_layer(config), config.num_layers),
        x=mid_hidden,
        method="hidden",
    )


class SpeculativeStreams(Model):
    """The stream parameters of a target `config` as a linen module: `param_specs` are its variables,
    `init_params` its random init. Each method takes the target's params (either layout) as an argument."""

    config: ModelConfig
    streams: StreamsConfig = StreamsConfig()

    def schema(self) -> dict[str, ParamSpec]:
        return param_specs(self.config, self.streams)

    def random_weights(self, key: jax.Array) -> dict:
        return init_params(self.config, self.streams, key)

    def __call__(self, target_params, mid_hidden, positions, main_kv, *, backend: str = "auto") -> jax.Array:
        """`stream_hidden`: the streams' final residuals [B, T, S, D] at T nodes, from the main stream entering
        layer L there (mid_hidden [B, T, D] at positions [B, T]); `main_kv(i)` the keys each node sees."""
        w = self.weights()
        return stream_hidden(
            w, target_params, self.config, self.streams, mid_hidden, positions, main_kv, backend=backend
        )

    def logits(self, target_params, s: jax.Array) -> jax.Array:
        """The streams' residuals [..., D] -> logits [..., V] (the target's final norm and LM head)."""
        return stream_logits(target_params, self.config, s)

    def exit_hidden(self, mid_hidden: jax.Array) -> jax.Array:
        """The early-exit residual o_theta(mid_hidden) [..., D]."""
        return exit_hidden(self.weights(), mid_hidden)

    def exit_logits(self, target_params, mid_hidden: jax.Array) -> jax.Array:
        """Early-exit logits [..., V] at layer L."""
        return exit_logits(self.weights(), target_params, self.config, mid_hidden)
