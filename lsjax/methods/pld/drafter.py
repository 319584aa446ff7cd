"""Prompt-lookup decoding (PLD): training-free drafting by n-gram match against the context.

The last `n` tokens of the context (n from `ngram_max` down to `ngram_min`) are
searched for earlier in the context; the tokens that followed the most recent
match are proposed as a chain. No match: the chain is empty (invalid nodes), and
the step is an AR step. The context lives in the drafter's state, a token
buffer [B, C] sized like the target cache (`ctx.capacity`), so nothing
recompiles as it grows.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from lsjax.engine.types import DraftContext, Drafter, Verdict
from lsjax.tree import Tree, TreeConfig, chain_parents, make_tree


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class History:
    tokens: jax.Array  # [B, C] prompt + emitted tokens (root included)
    length: jax.Array  # [B] int32


def find_continuation(history: jax.Array, length: jax.Array, ngram: int, num_tokens: int):
    """Most recent earlier occurrence of the last `ngram` tokens. Returns (found [B], start [B]):
    the proposal is history[start : start + num_tokens] (clipped to `length` by the caller)."""
    B, C = history.shape
    ends = jnp.arange(C)  # candidate match end index i: history[i - ngram + 1 .. i] == the last ngram tokens
    eq = jnp.ones((B, C), bool)
    for t in range(ngram):
        last_tok = jnp.take_along_axis(history, jnp.maximum(length - 1 - t, 0)[:, None], axis=1)  # [B, 1]
        idx = jnp.clip(ends - t, 0, C - 1)
        eq = eq & (history[:, idx] == last_tok) & (ends - t >= 0)[None]
    # The match must end before the last token (else it is the suffix itself) and leave a next token.
    eq = eq & (ends[None] < length[:, None] - 1) & (length[:, None] > ngram)
    found = jnp.any(eq, axis=1)
    last_match = (C - 1) - jnp.argmax(eq[:, ::-1], axis=1)
    return found, (last_match + 1).astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class PLDDrafter(Drafter):
    num_tokens: int = 8  # chain length
    ngram_max: int = 3
    ngram_min: int = 1

    name = "pld"

    def __post_init__(self):
        if not (isinstance(self.num_tokens, int) and self.num_tokens >= 1):
            raise ValueError(
                f"pld: num_tokens must be an integer >= 1 (tokens per lookup chain), got {self.num_tokens!r}"
            )
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError(f"pld: need 1 <= ngram_min <= ngram_max, got {self.ngram_min}, {self.ngram_max}")

    @property
    def tree(self) -> TreeConfig:
        return TreeConfig((1,) * self.num_tokens)

    def init(self, ctx: DraftContext, state) -> History:
        tokens, lengths = ctx.prompt_tokens, ctx.prompt_lengths
        B, P = tokens.shape
        C = ctx.capacity  # the cache holds prompt + generation, so the history fits too
        buf = jnp.zeros((B, C), jnp.int32).at[:, :P].set(tokens[:, :C])
        buf = buf.at[jnp.arange(B), lengths].set(state.root)  # the first emitted token follows the prompt
        return History(buf, lengths + 1)

    def propose(self, ctx: DraftContext, state, draft_state: History, key=None) -> Tree:
        hist = draft_state
        B, C = hist.tokens.shape
        found = jnp.zeros((B,), bool)
        start = jnp.zeros((B,), jnp.int32)
        for n in range(self.ngram_max, self.ngram_min - 1, -1):  # longer n-grams first
            f, s = find_continuation(hist.tokens, hist.length, n, self.num_tokens)
            start = jnp.where(found, start, s)
            found = found | f
        idx = start[:, None] + jnp.arange(self.num_tokens)[None]  # [B, k]
        proposal = jnp.take_along_axis(hist.tokens, jnp.clip(idx, 0, C - 1), axis=1)
        valid = found[:, None] & (idx < hist.length[:, None])
        T = self.num_nodes
        tokens = jnp.concatenate([state.root[:, None], proposal], axis=1)
        valid = jnp.concatenate([jnp.ones((B, 1), bool), valid], axis=1)
        parents = jnp.broadcast_to(jnp.asarray(chain_parents(T)), (B, T))
        return make_tree(tokens, parents, valid, self.tree)

    def update(self, ctx: DraftContext, state, draft_state: History, verdict: Verdict) -> History:
        new = verdict.emitted()  # [B, A]: accepted tokens then the bonus
        C, A = draft_state.tokens.shape[1], new.shape[1]

        def write(buf, toks, at):
            return jax.lax.dynamic_update_slice(buf, toks, (at,))

        # Entries past the count are junk beyond the new length, overwritten later.
        room = jnp.minimum(draft_state.length, C - A)
        buf = jax.vmap(write)(draft_state.tokens, new, room)
        return History(buf, jnp.minimum(draft_state.length + verdict.count, C))
