"""The TokenSwift drafter: the target drafts for itself with multi-token heads, reused n-grams and a partial
KV cache (Wu et al., 2025), verified by the same engine as every other drafter.

Per step the tree is the heads' Cartesian top-k tree (`topk`, the paper's [1, 3, 3, 3]) plus the
`ngram_topk` most frequent n-grams of the history (`lsjax.methods.tokenswift.ngram_pool`), merged as a trie
(`lsjax.methods.tokenswift.tree`). Where the heads' hidden state comes from is `draft_pass`:

* "partial" (the paper): the target's own layers run on the root over the dynamic partial KV cache
  (`lsjax.methods.tokenswift.partial_cache`, `kv_budget` entries); its LM head guesses the root's child, head i the
  token i levels further (gamma = 1 + heads logit sets). The n-grams start with the best child guess.
* "full" (ablation): the same pass over the full cache (no KV saving).
* "verified" (no draft pass at all, Medusa-style): the heads read the hidden state that verification
  computed, with the full cache, at the last accepted node; head i guesses the token i levels below the
  root (the root itself is what the target's head sampled there). The n-grams start with the root.

The draft pass for the next step runs in `update`, right after the commit, when the next root (the bonus
token) is known: then the partial cache's rebuild (which needs the pass's queries) and its result stay
in the drafter's state, and `propose` only assembles the tree. Verification's own hidden states reach
`update` through `verify_extras` ("verified" mode), so that mode costs no forward of its own.

Losslessness does not depend on any of this: verification runs the full target with the full cache. At
T = 0 (and at T > 0 with `draft_sampling=greedy`) the tree is a deterministic function of the committed
context, walked greedily or by sample-and-match. At T > 0 by default each head level's candidates are drawn
from its processed distribution q (the target's own filters) without replacement with the drafting key,
and verification runs recursive rejection sampling over them (acceptance 1 - TV(p, q) rather than p(top
guess)); n-gram chains stay deterministic. Candidates are ranked (and q built) on penalized logits when the
contextual penalty is on; the draft side uses the committed window only, which changes acceptance, never
the verified distribution.

Heads checkpoints (`lsjax.artifacts` kind "tokenswift": bfloat16 `model.safetensors` + `config.json`; the old
`params.npz` + `heads.json` still load) in `lsjax/drafts/<target>/tokenswift/` (found by default,
like the LongSpec draft beside it), or any directory given with `--heads`; "zero" = untrained heads (each a
copy of the target's next-token head), also what runs when no heads are shipped for the target.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from lsjax.cache import KVCache
from lsjax.config import _check
from lsjax.engine.types import DraftContext, Drafter, Verdict
from lsjax.methods.tokenswift import model as th
from lsjax.methods.tokenswift import ngram_pool as ng
from lsjax.methods.tokenswift.config import TokenSwiftConfig
from lsjax.methods.tokenswift.partial_cache import PartialCache, partial_forward, write_committed
from lsjax.methods.tokenswift.tree import build_tree, union_config
from lsjax.models import target
from lsjax.models.layers import shape_problem
from lsjax.sampling import apply_penalty, processed_logprobs, window_presence
from lsjax.tree import Tree, TreeConfig


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TokenSwiftState:
    cands: jax.Array  # [B, D, kmax] int32: each logit set's best tokens for the next tree
    ngrams: Any = ()  # NgramHistory (ngram_topk > 0)
    pcache: Any = ()  # PartialCache ("partial")
    logq: Any = ()  # [B, D, V] the logit sets' processed distributions (sampled trees at T > 0)


@dataclasses.dataclass(frozen=True)
class TokenSwiftDrafter(Drafter):
    cfg: TokenSwiftConfig = TokenSwiftConfig()
    heads: th.HeadsConfig = th.HeadsConfig()

    name = "tokenswift"

    def check_params(self, draft_params, config) -> str | None:
        if not isinstance(draft_params, dict):
            got = type(draft_params).__name__
            return f"tokenswift needs its heads' params (load_heads or registry.build), got {got}"
        return shape_problem(draft_params, th.TokenSwiftHeads(config, self.heads).schema())

    def __post_init__(self):
        sets = self.heads.num_heads + (1 if self.cfg.self_draft else 0)
        _check(
            len(self.cfg.topk) <= sets,
            "tokenswift.topk",
            f"{len(self.cfg.topk)} levels but the {self.cfg.draft_pass} pass has {sets} logit sets "
            f"({self.heads.num_heads} heads{' + the target head' if self.cfg.self_draft else ''})",
        )

    @property
    def tree(self) -> TreeConfig:
        return union_config(self.cfg.topk, self.cfg.ngram_topk, self.cfg.chain_depth)

    def _lag(self, ctx: DraftContext) -> int:
        if self.cfg.ngram_lag >= 0:
            return self.cfg.ngram_lag
        return ctx.sampling.penalty_window if ctx.sampling.penalized else 0

    # ------------------------------------------------------------------------------------------- contract

    def init(self, ctx: DraftContext, state) -> TokenSwiftState:
        cfg = self.cfg
        B = state.root.shape[0]
        ngrams = ()
        if cfg.ngram_topk:
            ngrams = ng.history_init(
                ctx.prompt_tokens, ctx.prompt_lengths, cfg.ngram_n, self._lag(ctx), ctx.capacity, ctx.capacity
            )
            ngrams = ng.history_append(
                ngrams, state.root[:, None], jnp.ones((B,), jnp.int32), cfg.ngram_n, self._lag(ctx)
            )
        if cfg.draft_pass == "verified":
            # The heads need the hidden state at the last prompt token: one forward of it over the prompt
            # before it (its K/V come out as the prefill wrote them).
            last = jnp.take_along_axis(ctx.prompt_tokens, (ctx.prompt_lengths - 1)[:, None], axis=1)
            before = KVCache(state.cache.k, state.cache.v, state.cache.lengths - 1)
            net = target.Transformer(ctx.config)
            h, _, _ = net.apply(
                {"params": ctx.target_params},
                last,
                before.lengths[:, None],
                before,
                backend=ctx.backend,
                method="hidden",
            )
            h = h.astype(jnp.dtype(ctx.config.dtype))  # the heads' dtype (the target's stream is fp32)
            cands, logq = self._candidates(ctx, state, h[:, 0], heads_only=True)
            return TokenSwiftState(cands, ngrams, (), logq)
        pcache = ()
        if cfg.draft_pass == "partial":
            pcache = PartialCache.empty(ctx.config, B, min(cfg.kv_budget, ctx.capacity))
        cands, logq, pcache = self._draft_pass(ctx, state, pcache)
        return TokenSwiftState(cands, ngrams, pcache, logq)

    def propose(self, ctx: DraftContext, state, draft_state: TokenSwiftState, key=None) -> Tree:
        cfg = self.cfg
        cands = [draft_state.cands[:, d, :k] for d, k in enumerate(cfg.topk)]
        ok = logq = None
        if ctx.sampling.sample_drafts:
            # Each level's candidates drawn from its q without replacement (Gumbel-top-k), with the
            # drafting key: verification then runs recursive rejection sampling over them.
            logq = draft_state.logq
            cands, ok = [], []
            for d, k in enumerate(cfg.topk):
                noise = jax.random.gumbel(jax.random.fold_in(key, d), logq[:, d].shape)
                perturbed, tok = jax.lax.top_k(logq[:, d] + noise, k)
                cands.append(tok.astype(jnp.int32))
                ok.append(jnp.isfinite(perturbed))
        chains = found = None
        if cfg.ngram_topk:
            first = draft_state.cands[:, 0, 0] if cfg.self_draft else state.root
            grams, found = ng.pool_topk(draft_state.ngrams.pool, first, cfg.ngram_topk)
            chains = grams if cfg.self_draft else grams[:, :, 1:]
        return build_tree(state.root, cands, cfg.topk, chains, found, ok, logq)

    def verify_extras(self, ctx: DraftContext, tree: Tree, hidden: jax.Array, logits: jax.Array):
        return hidden if self.cfg.draft_pass == "verified" else ()

    def update(self, ctx: DraftContext, state, draft_state: TokenSwiftState, verdict: Verdict) -> TokenSwiftState:
        cfg = self.cfg
        ngrams = draft_state.ngrams
        if cfg.ngram_topk:
            ngrams = ng.history_append(ngrams, verdict.emitted(), verdict.count, cfg.ngram_n, self._lag(ctx))
        if cfg.draft_pass == "verified":
            last = jnp.take_along_axis(verdict.path, verdict.num_accepted[:, None], axis=1)[:, 0]  # [B]
            h = jnp.take_along_axis(verdict.extras, last[:, None, None], axis=1)[:, 0]  # [B, D]
            cands, logq = self._candidates(ctx, state, h, heads_only=True)
            return TokenSwiftState(cands, ngrams, (), logq)
        pcache = draft_state.pcache
        if cfg.draft_pass == "partial":
            start = state.cache.lengths - verdict.count  # the committed root's position
            pcache = write_committed(pcache, state.cache, start, verdict.count, self.max_depth + 1, cfg.kv_sink)
        cands, logq, pcache = self._draft_pass(ctx, state, pcache)
        return TokenSwiftState(cands, ngrams, pcache, logq)

    # --------------------------------------------------------------------------------------------- pieces

    def _draft_pass(self, ctx: DraftContext, state, pcache):
        """The target (over the partial or the full cache) on the pending root -> candidates, cache."""
        root, pos = state.root[:, None], state.cache.lengths[:, None]
        if self.cfg.draft_pass == "partial":
            h, pcache = partial_forward(
                ctx.target_params, ctx.config, pcache, state.cache, root, pos, self.cfg.kv_sink, backend=ctx.backend
            )
        else:
            net = target.Transformer(ctx.config)
            h, _, _ = net.apply(
                {"params": ctx.target_params}, root, pos, state.cache, backend=ctx.backend, method="hidden"
            )
        h = h.astype(jnp.dtype(ctx.config.dtype))  # the heads' dtype (the target's stream is fp32)
        return *self._candidates(ctx, state, h[:, 0], heads_only=False), pcache

    def _candidates(self, ctx: DraftContext, state, h0: jax.Array, heads_only: bool):
        """h0 [B, D] -> (cands [B, levels, kmax]: the best tokens of each logit set the tree uses, ranked on
        penalized logits when the penalty is on; the sets' processed log-probabilities [B, levels, V] when
        trees are sampled, else ())."""
        levels = len(self.cfg.topk)
        heads = th.TokenSwiftHeads(ctx.config, self.heads)
        method = None if heads_only else "all_logits"  # the heads' sets alone, or the target's own first
        logits = heads.apply({"params": ctx.draft_params}, h0, ctx.target_params, method=method)
        logits = logits[:, :levels]  # [B, levels, V]
        s = ctx.sampling
        window = None
        if s.penalized:
            window = window_presence(state.out, state.num_out, s.penalty_window, ctx.config.vocab_size, 0)[0]
            window = jnp.broadcast_to(window[:, None, :], logits.shape)
            logits = apply_penalty(logits, window, s.penalty)
        cands = jax.lax.top_k(logits, max(self.cfg.topk))[1].astype(jnp.int32)
        if not s.sample_drafts:
            return cands, ()
        # The same filters as the target's (the penalty is already in the logits).
        return cands, processed_logprobs(logits, dataclasses.replace(s, penalty=1.0))


# ------------------------------------------------------------------------------------------- checkpoints
