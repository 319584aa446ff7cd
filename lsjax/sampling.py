"""Turning logits into tokens: contextual penalty, temperature, top-k, top-p, min-p; greedy at temperature 0.

`processed_logprobs` is the single definition of "the target's distribution"
used by AR sampling and by speculative verification alike, which is what makes
speculative sampling match AR sampling exactly.

The contextual penalty (`SamplingConfig.penalty`, TokenSwift §3.4) depends on the last W generated tokens,
so every caller passes the window as a mask `penalized [..., V]`. Inside a speculative tree the window of a
node is the committed generation followed by the tokens on the node's own path (`tree_penalty_mask`): the
distribution verified at a node is exactly the one AR would sample from after that path.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lsjax.config import SamplingConfig


def apply_penalty(logits: jax.Array, penalized: jax.Array, penalty: float) -> jax.Array:
    """CTRL's repetition penalty on the tokens in `penalized`: a positive logit is divided by `penalty`, a
    negative one multiplied (either way the token loses probability when penalty > 1)."""
    return jnp.where(penalized, jnp.where(logits < 0, logits * penalty, logits / penalty), logits)


def _penalize(logits: jax.Array, cfg: SamplingConfig, penalized: jax.Array | None) -> jax.Array:
    if not cfg.penalized:
        return logits
    if penalized is None:
        raise ValueError(
            f"penalty: SamplingConfig.penalty={cfg.penalty} needs the generated-token window; pass `penalized`"
        )
    return apply_penalty(logits, penalized, cfg.penalty)


def processed_logprobs(logits: jax.Array, cfg: SamplingConfig, penalized: jax.Array | None = None) -> jax.Array:
    """logits [..., V] -> log-probabilities [..., V] after the contextual penalty, temperature, top-k, top-p,
    min-p (fp32). `penalized` [..., V] bool marks the tokens in the penalty window (needed iff the penalty
    is on).

    Filtered tokens get -inf. At temperature 0 this is a one-hot on the argmax (of the penalized logits).
    """
    logits = _penalize(logits.astype(jnp.float32), cfg, penalized)
    if cfg.greedy:
        return jnp.where(jax.nn.one_hot(jnp.argmax(logits, -1), logits.shape[-1], dtype=bool), 0.0, -jnp.inf)
    logits = logits / cfg.temperature
    if cfg.top_k > 0 and cfg.top_k < logits.shape[-1]:
        kth = jax.lax.top_k(logits, cfg.top_k)[0][..., -1:]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    if cfg.top_p < 1.0:
        logp = jax.nn.log_softmax(logits, -1)
        sorted_logp = jnp.sort(logp, axis=-1)[..., ::-1]
        # Keep the smallest prefix whose mass reaches top_p: a token stays if the mass before it is < top_p.
        mass_before = jnp.cumsum(jnp.exp(sorted_logp), axis=-1) - jnp.exp(sorted_logp)
        keep_sorted = mass_before < cfg.top_p
        cutoff = jnp.min(jnp.where(keep_sorted, sorted_logp, jnp.inf), axis=-1, keepdims=True)
        logits = jnp.where(logp < cutoff, -jnp.inf, logits)
    if cfg.min_p > 0.0:
        logp = jax.nn.log_softmax(logits, -1)
        threshold = jnp.max(logp, -1, keepdims=True) + jnp.log(cfg.min_p)
        logits = jnp.where(logp < threshold, -jnp.inf, logits)
    return jax.nn.log_softmax(logits, -1)


def sample(key: jax.Array, logits: jax.Array, cfg: SamplingConfig, penalized: jax.Array | None = None) -> jax.Array:
    """logits [..., V] -> tokens [...] int32 (argmax at temperature 0); `penalized` as in processed_logprobs."""
    if cfg.greedy:
        return jnp.argmax(_penalize(logits.astype(jnp.float32), cfg, penalized), axis=-1).astype(jnp.int32)
    return categorical(key, processed_logprobs(logits, cfg, penalized))


def categorical(key: jax.Array, logp: jax.Array) -> jax.Array:
    """One draw per row from softmax(logp) [..., V] (entries may be -inf): tokens [...] int32."""
    return draw(key, jnp.exp(logp - jnp.max(logp, axis=-1, keepdims=True)))


def draw(key: jax.Array, weights: jax.Array, block: int = 256) -> jax.Array:
    """One draw per row from the distribution proportional to `weights` [..., V] (>= 0, some > 0):
    tokens [...] int32. A zero-weight token is never drawn.

    Inverse CDF with one uniform per row, in two levels (which block of `block` tokens, then which token in
    it). `jax.random.categorical` adds Gumbel noise to every entry: V random numbers and two logs per row,
    ~2.5 ms per row for SmolLM2's 49K vocabulary on a CPU core, which made every T > 0 step of a tree
    verification several times dearer than its forward. This costs one sum over the row and two short
    cumulative sums (~20x cheaper at 11 rows).
    """
    return draw_at(jax.random.uniform(key, weights.shape[:-1]), weights, block)


def draw_at(u: jax.Array, weights: jax.Array, block: int = 256) -> jax.Array:
    """`draw` with its uniforms u [...] in [0, 1) given (tests reach the ends of the range with it)."""
    w = weights.astype(jnp.float32)
    V = w.shape[-1]
    nb = -(-V // block)
    w = jnp.pad(w, [(0, 0)] * (w.ndim - 1) + [(0, nb * block - V)]).reshape(w.shape[:-1] + (nb, block))
    block_mass = jnp.sum(w, axis=-1)  # [..., nb]
    upto = jnp.cumsum(block_mass, axis=-1)
    before = jnp.concatenate([jnp.zeros_like(upto[..., :1]), upto[..., :-1]], axis=-1)
    x = u * upto[..., -1]
    # The first block whose cumulative mass exceeds x; rounding (u * total == total) can push the count past
    # the end, hence the clip to the last block with mass.
    last_block = nb - 1 - jnp.argmax((block_mass > 0)[..., ::-1], axis=-1)
    b = jnp.minimum(jnp.sum(upto <= x[..., None], axis=-1), last_block)
    rest = x - jnp.take_along_axis(before, b[..., None], axis=-1)[..., 0]  # >= 0: before[b] <= x
    wb = jnp.take_along_axis(w, b[..., None, None], axis=-2)[..., 0, :]  # [..., block]
    # Counting the cumulative sums <= rest steps over zero weights (their sum equals the previous one).
    j = jnp.sum(jnp.cumsum(wb, axis=-1) <= rest[..., None], axis=-1)
    # Rounding can leave `rest` at or past the block's summed mass: take its last token with weight > 0.
    last = block - 1 - jnp.argmax((wb > 0)[..., ::-1], axis=-1)
    return (b * block + jnp.minimum(j, last)).astype(jnp.int32)


# ---------------------------------------------------------------------------------------- penalty windows


def window_presence(history: jax.Array, length: jax.Array, window: int, vocab: int, max_depth: int) -> jax.Array:
    """history [B, M] generated tokens (the first length[b] valid) -> [max_depth + 1, B, V] bool.

    Entry d marks the tokens among the last `window - d` generated ones: what stays of the committed
    generation in the window of a tree node at depth d, whose own path supplies the d newest tokens.
    """
    B, M = history.shape
    idx = length[:, None] - window + jnp.arange(window)[None]  # [B, W] oldest first
    ok = (idx >= 0).astype(jnp.int32)
    toks = jnp.take_along_axis(history, jnp.clip(idx, 0, M - 1), axis=1)
    rows = jnp.arange(B)
    counts = jnp.zeros((B, vocab), jnp.int32).at[rows[:, None], toks].add(ok)
    out = [counts > 0]
    for d in range(1, max_depth + 1):
        if d - 1 < window:  # one token deeper in the tree pushes the oldest committed token out
            counts = counts.at[rows, toks[:, d - 1]].add(-ok[:, d - 1])
        out.append(counts > 0)
    return jnp.stack(out)


def tree_penalty_mask(
    history: jax.Array,
    length: jax.Array,
    tokens: jax.Array,
    ancestors: jax.Array,
    depth: jax.Array,
    window: int,
    vocab: int,
    max_depth: int,
    query_depth: jax.Array | None = None,
) -> jax.Array:
    """The penalty window of every queried tree node as a mask [B, Tq, V].

    history [B, M], length [B]: the generated tokens so far (the tree's root is the last of them).
    tokens [B, T], depth [B, T]: the tree's nodes; ancestors [B, Tq, T]: for each queried node, its
    self-or-ancestor nodes (a tree's `mask`, or some of its rows); query_depth [B, Tq] (default depth).
    The window after node n at depth d is the last `window` tokens of (generation, path tokens at depths
    1..d): the committed part from `window_presence`, the path part scattered from the ancestors.
    """
    B, T = tokens.shape
    query_depth = depth if query_depth is None else query_depth
    Tq = query_depth.shape[1]
    pres = window_presence(history, length, window, vocab, max_depth)  # [D + 1, B, V]
    committed = jax.vmap(lambda p, d: p[d], in_axes=(1, 0))(pres, query_depth)  # [B, Tq, V]
    on_path = ancestors & (depth[:, None, :] >= 1) & (query_depth[:, :, None] - depth[:, None, :] < window)
    # Tokens off the path scatter to index V and are dropped.
    idx = jnp.where(on_path, tokens[:, None, :], vocab)  # [B, Tq, T]
    b = jnp.arange(B)[:, None, None]
    n = jnp.arange(Tq)[None, :, None]
    return committed.at[b, n, idx].set(True, mode="drop")
