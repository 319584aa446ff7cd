"""TokenSwift's multi-token heads: chained residual linear layers on the target's last hidden state.

    h_0 = the target's final hidden state at position t (before its final norm)
    h_i = h_{i-1} + W_i · RMSNorm_in_i(h_{i-1})            i = 1 .. gamma - 1
    logits_i = LMHead(RMSNorm_out_i(h_i))                   head i guesses token t + 1 + i

The LM head is the target's own (frozen, shared; tied embedding or untied matrix); only W_i and the two norm
gains per head train. With the target's own LM head on h_0 (token t + 1) one hidden state yields gamma sets
of logits. The chain (each head reads the previous one's state) is the paper's Eq. 1, the official code's
per-head input and output norms included.

Parameters (stacked over the heads, "heads" axis first):

    w [Hn, D, D]; in_norm [Hn, D]; out_norm [Hn, D]

The heads are the linen module `TokenSwiftHeads` (`lsjax.models.module`); the drafter, trainer and loaders call
it, never the functions below (its bodies). The target's weights it reads (LM head, final norm) are an
argument:

    heads = TokenSwiftHeads(config, HeadsConfig(3))
    variables = heads.init(key, method="weights")                        # random W, with logical axes
    logits = heads.apply(variables, h0, target_params)                   # [..., Hn, V]
    logits = heads.apply(variables, h0, target_params, method="all_logits")  # [..., 1 + Hn, V]
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from lsjax.config import ModelConfig, _positive_int
from lsjax.models.layers import ParamSpec, head_logits, init_from_specs, rms_norm
from lsjax.models.module import Model


@dataclasses.dataclass(frozen=True)
class HeadsConfig:
    """How many extra heads (gamma - 1; the paper uses 3)."""

    num_heads: int = 3

    def __post_init__(self):
        _positive_int(self.num_heads, "heads.num_heads")


def param_specs(config: ModelConfig, heads: HeadsConfig) -> dict[str, ParamSpec]:
    n, D = heads.num_heads, config.hidden_size
    return {
        # Zero init: every head starts as the target's own next-token head (Medusa's choice), so training
        # starts from a sensible guess and the gradient still reaches every W_i through h_i.
        "w": ParamSpec((n, D, D), config.dtype, ("layers", "embed", "norm"), "zeros"),
        "in_norm": ParamSpec((n, D), config.dtype, ("layers", "norm"), "ones"),
        "out_norm": ParamSpec((n, D), config.dtype, ("layers", "norm"), "ones"),
    }


def init_params(config: ModelConfig, heads: HeadsConfig, target_params: dict | None = None, key=None) -> dict:
    """Zero W; output norms copied from the target's final norm (so each head's logits start as the target's),
    input norms at one. `key` adds a small random W instead (tests)."""
    specs = param_specs(config, heads)
    params = init_from_specs(specs, {}, 0.0)
    if key is not None:
        params["w"] = (0.02 * jax.random.normal(key, specs["w"].shape)).astype(params["w"].dtype)
    if target_params is not None:
        params["out_norm"] = jnp.broadcast_to(jnp.asarray(target_params["final_norm"]), specs["out_norm"].shape)
    return params


def head_states(params: dict, config: ModelConfig, h0: jax.Array) -> jax.Array:
    """h0 [..., D] -> the normalised states RMSNorm_out_i(h_i) [..., Hn, D] of every head."""
    eps = config.rms_norm_eps
    h, out = h0, []
    for i in range(params["w"].shape[0]):
        h = h + rms_norm(h, params["in_norm"][i], eps) @ params["w"][i]
        out.append(rms_norm(h, params["out_norm"][i], eps))
    return jnp.stack(out, axis=-2)


def lm_head_logits(target_params: dict, config: ModelConfig, h: jax.Array, vocab_ids=None) -> jax.Array:
    """The target's output projection (no final norm) on normalised states h [..., D] -> fp32 logits."""
    if config.tie_embeddings:
        rows = target_params["embed"] if vocab_ids is None else jnp.take(target_params["embed"], vocab_ids, axis=0)
        return head_logits(h, rows).astype(jnp.float32)
    head = target_params["lm_head"] if vocab_ids is None else jnp.take(target_params["lm_head"], vocab_ids, axis=1)
    return jnp.einsum("...d,dv->...v", h, head).astype(jnp.float32)


def heads_logits(params: dict, target_params: dict, config: ModelConfig, h0: jax.Array) -> jax.Array:
    """h0 [..., D] (the target's final hidden state, before its norm) -> the heads' logits [..., Hn, V]."""
    return lm_head_logits(target_params, config, head_states(params, config, h0))


def all_logits(params: dict, target_params: dict, config: ModelConfig, h0: jax.Array) -> jax.Array:
    """h0 [..., D] -> [..., 1 + Hn, V]: the target's own next-token logits, then each head's."""
    own = lm_head_logits(target_params, config, rms_norm(h0, target_params["final_norm"], config.rms_norm_eps))
    return jnp.concatenate([own[..., None, :], heads_logits(params, target_params, config, h0)], axis=-2)


class TokenSwiftHeads(Model):
    """TokenSwift's heads as a linen module over the target `config`: `param_specs` are its parameters,
    `init_params` its init (random W under `init`; `untrained_weights` for the zero-W start)."""

    config: ModelConfig
    heads: HeadsConfig = HeadsConfig()

    def schema(self) -> dict[str, ParamSpec]:
        return param_specs(self.config, self.heads)

    def random_weights(self, key: jax.Array) -> dict:
        return init_params(self.config, self.heads, key=key)

    def untrained_weights(self, final_norm: jax.Array) -> dict:
        """Zero W, output norms the target's `final_norm`: each head starts as the target's next-token head."""
        return init_params(self.config, self.heads, {"final_norm": final_norm})

    def __call__(self, h0: jax.Array, target_params: dict) -> jax.Array:
        """h0 [..., D] (the target's final hidden state, before its norm) -> the heads' logits [..., Hn, V]."""
        return heads_logits(self.weights(), target_params, self.config, h0)

    def all_logits(self, h0: jax.Array, target_params: dict) -> jax.Array:
        """h0 [..., D] -> [..., 1 + Hn, V]: the target's own next-token logits, then each head's."""
        return all_logits(self.weights(), target_params, self.config, h0)

    def states(self, h0: jax.Array) -> jax.Array:
        """h0 [..., D] -> the heads' normalised states [..., Hn, D] (before the target's LM head)."""
        return head_states(self.weights(), self.config, h0)
