"""DeLS-Spec's local head p_S and unigram prior ℓ_P (DeLS-Spec, Appendix A).

The local head is the short-context expert: it sees only the tokens drafted so far inside the current block
(never the committed context: its prefix restarts at every block start) and is trained without the target,
on plain text with next-token loss. Both variants read tokens through the TARGET's frozen embedding E and end
in the same low-rank output stage:

    gru:     h_i = GRU(E[x_i], h_{i-1}), h_{-1} = 0       bias-free, one layer, `hidden` wide
             r_i = SiLU(h_i W_rank)                         [hidden, rank]
    markov:  r_i = SiLU(E[x_i] W_rank)                      [D, rank]: the last token alone (a bigram head)
    logits(x_{i+1}) = E (r_i W_out)^T                       W_out [rank, D]; E is the target's (tied) head

The paper maps the rank-r state to the vocabulary with a learned [V, r] matrix (and the Markov variant looks
its state up in a learned [V, r] table). Here both go through the target's frozen embedding instead: a [V, r]
table is 12.6M parameters for SmolLM2's 49K vocabulary (25 MB in fp16, per head), while W_out is 147K, and the
pretrained embedding already places tokens that follow similar contexts close together, which matters when the
head trains for minutes on a CPU. `vocab_table` folds E W_out^T into one [V, r] matrix at load time (derived,
never saved), so a drafting step costs a rank-r product per vocabulary row instead of a D-wide one.

GRU gates (PyTorch's formulation, no biases), with w_ih [D, 3, hidden] and w_hh [hidden, 3, hidden] in gate
order (r, z, n):

    r = sigmoid(x W_ir + h W_hr);  z = sigmoid(x W_iz + h W_hz);  n = tanh(x W_in + r * (h W_hn))
    h' = (1 - z) * n + z * h

The unigram prior is log of add-λ smoothed token counts over the training tokens that carry loss (assistant
tokens only in chat data): ℓ_P(v) = log((c(v) + λ) / Σ_v' (c(v') + λ)).

The head is the linen module `LocalHead`, used as a pure function (the target's embedding is an argument,
never one of its variables); its methods are the forward, the functions here their bodies:

    head = LocalHead(cfg, hidden_size)
    variables = head.init(key, method="weights")                    # {"params": w_ih, w_hh, w_rank, w_out}
    state, r = head.apply({"params": weights}, embed, state, tokens, method="step")
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from lsjax.config import LocalHeadConfig
from lsjax.models.layers import ParamSpec
from lsjax.models.module import Model, variables_problem

# ---------------------------------------------------------------------------------------------- params


def param_shapes(cfg: LocalHeadConfig, hidden_size: int) -> dict[str, tuple[int, ...]]:
    D, Hd, r = hidden_size, cfg.hidden, cfg.rank
    if cfg.kind == "gru":
        return {"w_ih": (D, 3, Hd), "w_hh": (Hd, 3, Hd), "w_rank": (Hd, r), "w_out": (r, D)}
    return {"w_rank": (D, r), "w_out": (r, D)}


def init_params(cfg: LocalHeadConfig, hidden_size: int, key: jax.Array, embed_rms: float = 1.0) -> dict:
    """Random params: normals scaled to unit-variance pre-activations (embedding inputs have RMS `embed_rms`);
    W_out small, so the head starts near uniform."""
    shapes = param_shapes(cfg, hidden_size)
    embed_inputs = {"w_ih"} if cfg.kind == "gru" else {"w_rank"}
    keys = jax.random.split(key, len(shapes))
    out = {}
    for k, (name, shape) in zip(keys, shapes.items()):
        scale = shape[0] ** -0.5 / (embed_rms if name in embed_inputs else 1.0)
        if name == "w_out":
            scale *= 0.1
        out[name] = scale * jax.random.normal(k, shape, jnp.float32)
    return out


# Logical axes of each weight: "embed" the target's width D, "local_hidden" the GRU's, "gate" (r, z, n).
AXES: dict[str, tuple[str, ...]] = {
    "w_ih": ("embed", "gate", "local_hidden"),
    "w_hh": ("local_hidden", "gate", "local_hidden"),
    "w_out": ("rank", "embed"),
}


def param_specs(cfg: LocalHeadConfig, hidden_size: int) -> dict[str, ParamSpec]:
    """The head's parameter schema (float32, whatever the target's dtype: the head is trained and run in fp32)."""
    rank_in = ("local_hidden",) if cfg.kind == "gru" else ("embed",)  # w_rank reads the GRU state or the token
    axes = AXES | {"w_rank": (*rank_in, "rank")}
    return {name: ParamSpec(shape, "float32", axes[name]) for name, shape in param_shapes(cfg, hidden_size).items()}


def check_params(params: dict, cfg: LocalHeadConfig, hidden_size: int) -> str | None:
    """None when `params` are the variables of `LocalHead(cfg, hidden_size)`, else one line naming the first
    variable that is missing, extra or of another shape (with both shapes)."""
    return variables_problem(LocalHead(cfg, hidden_size), params, "local head")


# ---------------------------------------------------------------------------------------------- the head


def gru_cell(params: dict, x: jax.Array, h: jax.Array) -> jax.Array:
    """One bias-free GRU step: x [..., D] (embedded token), h [..., Hd] -> h' [..., Hd] (fp32)."""
    gi = jnp.einsum("...d,dgh->...gh", x.astype(jnp.float32), params["w_ih"])  # [..., 3, Hd]
    gh = jnp.einsum("...k,kgh->...gh", h, params["w_hh"])
    r = jax.nn.sigmoid(gi[..., 0, :] + gh[..., 0, :])
    z = jax.nn.sigmoid(gi[..., 1, :] + gh[..., 1, :])
    n = jnp.tanh(gi[..., 2, :] + r * gh[..., 2, :])
    return (1.0 - z) * n + z * h


def gru_cell_from_input(params: dict, gi: jax.Array, h: jax.Array) -> jax.Array:
    """`gru_cell` with the input projection gi = x W_ih [..., 3, Hd] computed ahead (for a batch of tokens at
    once, so drafting reads W_ih once per block instead of once per token)."""
    gh = jnp.einsum("...k,kgh->...gh", h, params["w_hh"])
    r = jax.nn.sigmoid(gi[..., 0, :] + gh[..., 0, :])
    z = jax.nn.sigmoid(gi[..., 1, :] + gh[..., 1, :])
    n = jnp.tanh(gi[..., 2, :] + r * gh[..., 2, :])
    return (1.0 - z) * n + z * h


def low_rank(params: dict, cfg: LocalHeadConfig, state: jax.Array) -> jax.Array:
    """The head's state (GRU h [..., Hd], or the embedded last token [..., D] for markov) -> r [..., rank]."""
    return jax.nn.silu(jnp.einsum("...k,kr->...r", state.astype(jnp.float32), params["w_rank"]))


def init_state(cfg: LocalHeadConfig, batch_shape: tuple[int, ...]) -> jax.Array:
    """The state at a block start: zeros (GRU), or nothing to carry for markov (a [..., 0] array)."""
    return jnp.zeros((*batch_shape, cfg.hidden if cfg.kind == "gru" else 0), jnp.float32)


def step(params: dict, cfg: LocalHeadConfig, embed: jax.Array, state: jax.Array, tokens: jax.Array):
    """Feed drafted tokens [...] (the block's latest): (new state, r [..., rank] predicting the next token)."""
    x = jnp.take(embed, tokens, axis=0).astype(jnp.float32)
    if cfg.kind == "markov":
        return state, low_rank(params, cfg, x)
    h = gru_cell(params, x, state)
    return h, low_rank(params, cfg, h)


def block_states(params: dict, cfg: LocalHeadConfig, embed: jax.Array, blocks: jax.Array) -> jax.Array:
    """blocks [N, s] of tokens, each block a fresh prefix -> r [N, s, rank]; r[:, j] predicts blocks[:, j + 1].

    Nothing outside a block reaches its outputs: the GRU starts from zeros at column 0 of every block."""
    x = jnp.take(embed, blocks, axis=0).astype(jnp.float32)  # [N, s, D]
    if cfg.kind == "markov":
        return low_rank(params, cfg, x)
    gi = jnp.einsum("nsd,dgh->nsgh", x, params["w_ih"])  # all input projections in one GEMM

    def one(h, g):
        h = gru_cell_from_input(params, g, h)
        return h, h

    h0 = init_state(cfg, (blocks.shape[0],))
    _, hs = jax.lax.scan(one, h0, gi.swapaxes(0, 1))  # [s, N, Hd]
    return low_rank(params, cfg, hs.swapaxes(0, 1))


def vocab_table(params: dict, embed: jax.Array, rows: jax.Array | None = None) -> jax.Array:
    """E W_out^T [V, rank] (or over vocabulary `rows` [Vd]): logits = r @ table^T. Derived at load time."""
    e = embed if rows is None else jnp.take(embed, rows, axis=0)
    return jnp.einsum("vd,rd->vr", e.astype(jnp.float32), params["w_out"])


def logits(params: dict, embed: jax.Array, r: jax.Array, rows: jax.Array | None = None) -> jax.Array:
    """r [..., rank] -> fp32 logits [..., V] (or over `rows`) through the target's tied head: E (r W_out)^T."""
    e = embed if rows is None else jnp.take(embed, rows, axis=0)
    out = jnp.einsum("...r,rd->...d", r, params["w_out"])
    flat = out.reshape(-1, out.shape[-1])
    return (e.astype(jnp.float32) @ flat.T).T.reshape(*out.shape[:-1], e.shape[0])


# ---------------------------------------------------------------------------------------------- the module


class LocalHead(Model):
    """The local head as a linen module (module docstring). Fields: its config, the target's width D, and the
    RMS of the target's embedding rows that random init scales the input projections by."""

    config: LocalHeadConfig
    hidden_size: int
    embed_rms: float = 1.0

    def schema(self) -> dict[str, ParamSpec]:
        return param_specs(self.config, self.hidden_size)

    def random_weights(self, key: jax.Array) -> dict:
        return init_params(self.config, self.hidden_size, key, self.embed_rms)

    def step(self, embed: jax.Array, state: jax.Array, tokens: jax.Array):
        """`step`: feed drafted tokens [...] -> (new state, r [..., rank] predicting the next token)."""
        return step(self.weights(), self.config, embed, state, tokens)

    def block_states(self, embed: jax.Array, blocks: jax.Array) -> jax.Array:
        """`block_states`: blocks [N, s], each a fresh prefix -> r [N, s, rank]."""
        return block_states(self.weights(), self.config, embed, blocks)

    def logits(self, embed: jax.Array, r: jax.Array, rows: jax.Array | None = None) -> jax.Array:
        """`logits`: r [..., rank] -> fp32 logits [..., V] (or over `rows`) through the target's tied head."""
        return logits(self.weights(), embed, r, rows)

    def vocab_table(self, embed: jax.Array, rows: jax.Array | None = None) -> jax.Array:
        """`vocab_table`: E W_out^T [V, rank] (or over `rows`), derived at load time."""
        return vocab_table(self.weights(), embed, rows)


def config_of(params: dict, block_size: int = LocalHeadConfig.block_size) -> LocalHeadConfig:
    """The LocalHeadConfig whose module `params` are the variables of (kind, GRU width and rank read off their
    shapes; `block_size` is training's, not a shape)."""
    rank = int(np.shape(params["w_out"])[0])
    if "w_ih" in params:
        return LocalHeadConfig(kind="gru", hidden=int(np.shape(params["w_hh"])[0]), rank=rank, block_size=block_size)
    return LocalHeadConfig(kind="markov", rank=rank, block_size=block_size)


# ---------------------------------------------------------------------------------------------- the prior


def unigram_logprior(tokens: np.ndarray, weights: np.ndarray | None, vocab_size: int, lam: float = 1.0) -> np.ndarray:
    """log((c(v) + lam) / sum(c + lam)) [V] float32, counting tokens where `weights` > 0 (all when None)."""
    if lam <= 0:
        raise ValueError(f"unigram prior: lam must be > 0, got {lam}")
    toks = np.asarray(tokens).reshape(-1)
    if weights is not None:
        toks = toks[np.asarray(weights).reshape(-1) > 0]
    counts = np.bincount(toks, minlength=vocab_size)[:vocab_size].astype(np.float64)
    return (np.log(counts + lam) - np.log(counts.sum() + lam * vocab_size)).astype(np.float32)


# ---------------------------------------------------------------------------------------------- numpy reference


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def reference_block_logits(params: dict, cfg: LocalHeadConfig, embed: np.ndarray, block: np.ndarray) -> np.ndarray:
    """float64 numpy: logits [s, V] after each token of one block (a fresh prefix), token by token."""
    p = {k: np.asarray(v, np.float64) for k, v in params.items()}
    E = np.asarray(embed, np.float64)
    h = np.zeros(cfg.hidden)
    out = []
    for tok in np.asarray(block):
        x = E[tok]
        if cfg.kind == "gru":
            gi = np.einsum("d,dgh->gh", x, p["w_ih"])
            gh = np.einsum("k,kgh->gh", h, p["w_hh"])
            r = _sigmoid(gi[0] + gh[0])
            z = _sigmoid(gi[1] + gh[1])
            n = np.tanh(gi[2] + r * gh[2])
            h = (1 - z) * n + z * h
            state = h
        else:
            state = x
        a = state @ p["w_rank"]
        rr = a / (1 + np.exp(-a))
        out.append(E @ (rr @ p["w_out"]))
    return np.stack(out)
