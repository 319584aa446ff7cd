"""The draft's pruned vocabulary: which tokens its LM head covers, and the map back from full-vocabulary ids.

Pruning is lossless for decoding (verification still uses the target's full distribution); it only makes the
draft's head cheaper. Host-side selection runs once before training; `vocab_index` is jittable.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from lsjax.config import ModelConfig


def pruned_vocab(
    config: ModelConfig,
    size: int,
    *,
    token_counts: np.ndarray | None = None,
    corpus_ids: np.ndarray | None = None,
    always: tuple[int, ...] = (),
) -> np.ndarray:
    """The draft's vocabulary: the `size` most frequent tokens, [Vd] int32, most frequent first.

    Give either `token_counts` [V] or `corpus_ids` (any shape, token ids). The
    EOS ids (and `always`) are always kept — a draft that cannot propose EOS
    cannot end a generation early — and take the place of the least frequent
    otherwise-selected tokens. Ties break by token id, so the result is
    deterministic. Host-side numpy: this runs once, before jit.
    """
    V = config.vocab_size
    if (token_counts is None) == (corpus_ids is None):
        raise ValueError("pruned_vocab needs exactly one of token_counts or corpus_ids")
    if token_counts is None:
        ids = np.asarray(corpus_ids).reshape(-1).astype(np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= V):
            raise ValueError(f"corpus_ids has ids outside [0, {V})")
        counts = np.bincount(ids, minlength=V)
    else:
        counts = np.asarray(token_counts)
        if counts.shape != (V,):
            raise ValueError(f"token_counts must have shape [{V}], got {counts.shape}")
    forced = sorted(set(config.eos_token_ids) | set(always))
    if not len(forced) <= size <= V:
        raise ValueError(f"size must be in [{len(forced)}, {V}] (it must hold the forced ids {forced}), got {size}")
    by_freq = np.lexsort((np.arange(V), -counts.astype(np.float64)))  # count desc, then id asc
    rest = by_freq[~np.isin(by_freq, forced)][: size - len(forced)]
    chosen = np.concatenate([rest, np.asarray(forced, np.int64)])
    order = np.lexsort((chosen, -counts[chosen].astype(np.float64)))
    return chosen[order].astype(np.int32)


def vocab_index(vocab_ids: jax.Array | None, vocab_size: int) -> jax.Array | None:
    """[V] map from a token id to its index in the pruned vocabulary, -1 outside it."""
    if vocab_ids is None:
        return None
    ids = jnp.asarray(vocab_ids, jnp.int32)
    return jnp.full((vocab_size,), -1, jnp.int32).at[ids].set(jnp.arange(ids.shape[0], dtype=jnp.int32))
