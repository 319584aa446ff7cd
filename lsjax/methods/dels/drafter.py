"""Block-parallel drafting (`--method block`) and DeLS-Spec's fusion (`--method dels`).

One forward of the block draft (`lsjax.methods.dels.model`) gives the long-context logits ℓ_L for all s
positions of the block at once. The chain (or `branches` chains) is then read off position by position:

    token 1:     from ℓ_L^(1) alone
    token j > 1: block:  from ℓ_L^(j)                       (the positions do not see each other's tokens)
                 dels:   from ℓ = ℓ_L^(j) + α ℓ_S^(j) − β ℓ_P   (DeLS-Spec eq. 10, Algorithm 1)

where ℓ_S^(j) is the local head (`lsjax.methods.dels.local_head`) run autoregressively over the tokens drafted so
far in THIS block only (its state starts from zero at every proposal) and ℓ_P the unigram log-prior. The fused
logits cover the block draft's vocabulary (its pruned one when it has one); ℓ_S is the head's log-softmax
over the tokens it was trained on, and equals ℓ_P on the others (the head says nothing about them). The local
head's vocabulary map E W_out^T is folded once at load time (`prepare_dels_params`), so each in-block step
costs one GRU step and one rank-256 product per vocabulary row.

Tree: `branches` chains of depth s. At T = 0 (and `draft_sampling=greedy`), chain b starts with the b-th best
first token and continues greedily on its own fused logits. At T > 0 the first tokens are drawn without
replacement from q_1 = processed(ℓ_L^(1)) and each later token from its own q_j = processed(fused logits) with
the drafting key: every node's children are a without-replacement sample from the q stored in `Tree.logq`
(one child below level 1), so recursive rejection sampling keeps verification exactly lossless.

α and β live in the draft params (arrays, `with_weights`), so one compiled program serves every (α, β).
Draft state: the LongSpec ring of the block draft's self-attention K/V (`LongSpecDrafter.init/update`).

The two models run as linen modules bound to their params inside the caller's trace: the block draft
`BlockDraft(config, draft, block_size)` over the block DraftParams' weights, the local head
`LocalHead(local, hidden_size)` over `params["local"]`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from lsjax.cache import RingCache
from lsjax.config import BlockConfig, DraftConfig, LocalHeadConfig
from lsjax.engine.types import DraftContext, Drafter, Verdict
from lsjax.methods.dels import local_head as lh
from lsjax.methods.dels.model import BlockDraft
from lsjax.methods.longspec.drafter import LongSpecDrafter
from lsjax.models.draft_params import DraftParams, weights_problem
from lsjax.sampling import processed_logprobs
from lsjax.tree import Tree, TreeConfig, make_tree


def fuse(long_logits, short_logp, prior, alpha: float, beta: float):
    """DeLS-Spec's fusion ℓ = ℓ_L + α ℓ_S − β ℓ_P (broadcasting)."""
    return long_logits + alpha * short_logp - beta * prior


def short_logprobs(r: jax.Array, table: jax.Array, in_head: jax.Array, prior: jax.Array) -> jax.Array:
    """The local head's ℓ_S over the drafter's vocabulary: log-softmax of r @ table^T over the rows the head
    was trained on (`in_head`), the prior on the others. r [..., rank]; table [Vd, rank]; in_head, prior [Vd]."""
    raw = r @ table.T
    logz = jax.nn.logsumexp(jnp.where(in_head, raw, -jnp.inf), axis=-1, keepdims=True)
    return jnp.where(in_head, raw - logz, prior)


# The best (α, β) of the α-β sweep on the dev suite (studies/dels_sweep) for the shipped block-s8 + GRU head
# (docs/methods/dels.md).


def prepare_dels_params(block, local: dict, prior, head_vocab, embed, alpha=0.3, beta=0.3) -> dict:
    """The draft params `dels` runs with: the block draft's (a DraftParams, or a dict in the file layout), plus
    the local head with its vocabulary map folded and the prior and head mask gathered at the block draft's
    vocabulary (derived at load, never saved). `head_vocab`: the ids the head's loss covered (None: all). α and
    β are arrays here, not drafter fields, so one compiled program serves every (α, β) (`with_weights`; the
    α-β sweep of studies/dels_sweep)."""
    block = DraftParams.of(block)
    ids = block.vocab_ids
    V = embed.shape[0]
    prior = jnp.asarray(prior, jnp.float32)
    in_head = (
        jnp.ones((V,), bool) if head_vocab is None else jnp.zeros((V,), bool).at[jnp.asarray(head_vocab)].set(True)
    )
    local = {k: jnp.asarray(v, jnp.float32) for k, v in local.items()}
    rows = None if ids is None else jnp.asarray(ids, jnp.int32)
    head = lh.LocalHead(lh.config_of(local), embed.shape[-1])
    return {
        "block": block,
        "local": local,
        "table": head.apply({"params": local}, embed, rows, method="vocab_table"),
        "prior": prior if rows is None else prior[rows],
        "in_head": in_head if rows is None else in_head[rows],
        **weights(alpha, beta),
    }


def weights(alpha: float, beta: float) -> dict:
    return {"alpha": jnp.asarray(alpha, jnp.float32), "beta": jnp.asarray(beta, jnp.float32)}


def with_weights(dels_params: dict, alpha: float, beta: float) -> dict:
    """The same dels params with fusion weights α, β."""
    return {**dels_params, **weights(alpha, beta)}


@dataclasses.dataclass(frozen=True)
class BlockDrafter(Drafter):
    """`local is None`: the plain block drafter (`params` = the block draft's DraftParams). Else DeLS-Spec
    (`params` from `prepare_dels_params`, which hold α and β)."""

    block: BlockConfig = BlockConfig()
    draft: DraftConfig = DraftConfig()
    branches: int = 1
    local: LocalHeadConfig | None = None

    def __post_init__(self):
        if not isinstance(self.branches, int) or self.branches < 1:
            raise ValueError(f"block drafter: branches must be an integer >= 1, got {self.branches!r}")

    @property
    def name(self) -> str:
        return "block" if self.local is None else "dels"

    @property
    def tree(self) -> TreeConfig:
        return TreeConfig((self.branches,) * self.block.block_size)

    def check_params(self, draft_params, config) -> str | None:
        if self.local is None:
            return weights_problem(draft_params, self.model(config).schema(), "block")
        parts = ("block", "local", "table", "prior", "in_head", "alpha", "beta")
        if not isinstance(draft_params, dict) or (missing := [p for p in parts if p not in draft_params]):
            got = type(draft_params).__name__ if not isinstance(draft_params, dict) else f"no {missing[0]!r}"
            return f"dels needs the params prepare_dels_params (or registry.build('dels', ...)) makes, got {got}"
        if problem := weights_problem(draft_params["block"], self.model(config).schema(), "dels"):
            return f"['block']: {problem}"
        problem = lh.check_params(draft_params["local"], self.local, config.hidden_size)
        return None if problem is None else f"['local']: {problem}"

    def model(self, config) -> BlockDraft:
        """The block draft module this drafter runs (its params: the block DraftParams' weights)."""
        return BlockDraft(config, self.draft, self.block.block_size)

    def _block_params(self, ctx: DraftContext) -> DraftParams:
        return DraftParams.of(ctx.draft_params if self.local is None else ctx.draft_params["block"])

    def _ring_keeper(self) -> LongSpecDrafter:
        return LongSpecDrafter(tree=TreeConfig((1,)), draft=self.draft)

    def init(self, ctx: DraftContext, state) -> RingCache:
        return self._ring_keeper().init(dataclasses.replace(ctx, draft_params=self._block_params(ctx)), state)

    def update(self, ctx: DraftContext, state, draft_state: RingCache, verdict: Verdict) -> RingCache:
        ctx = dataclasses.replace(ctx, draft_params=self._block_params(ctx))
        return self._ring_keeper().update(ctx, state, draft_state, verdict)

    def long_logits(self, ctx: DraftContext, state, ring: RingCache) -> jax.Array:
        """ℓ_L [B, s, Vd]: one block-draft forward."""
        params = self._block_params(ctx)
        cache = state.cache
        net = self.model(ctx.config).bind({"params": params.weights})
        hidden = net.hidden(
            ctx.target_params,
            state.root,
            cache.lengths,
            ring,
            cache.k,
            cache.v,
            cache.lengths,
            backend=ctx.backend,
        )
        return net.logits(ctx.target_params, hidden, params.vocab_ids, params.vocab_head)

    def propose(self, ctx: DraftContext, state, draft_state: RingCache, key: jax.Array) -> Tree:
        s, w = self.block.block_size, self.branches
        ll = self.long_logits(ctx, state, draft_state)  # [B, s, Vd]
        B, _, Vd = ll.shape
        vocab_ids = self._block_params(ctx).vocab_ids
        stochastic = ctx.sampling.sample_drafts

        def pick(logits, k, level):
            """k children per row of logits [B, m, Vd]: (tokens [B, m, k] in Vd, log q [B, m, Vd] or None, ok)."""
            if not stochastic:
                return jax.lax.top_k(logits, k)[1], None, jnp.ones(logits.shape[:2] + (k,), bool)
            # q leaves the contextual penalty out (it needs each node's generated-token window): verification
            # divides by the q the children were drawn from, whatever it is, so the output stays exact.
            logq = processed_logprobs(logits, dataclasses.replace(ctx.sampling, penalty=1.0))
            g = jax.random.gumbel(jax.random.fold_in(key, level), logq.shape)
            perturbed, tok = jax.lax.top_k(logq + g, k)  # Gumbel-top-k: a draw without replacement, in order
            return tok, logq, jnp.isfinite(perturbed)

        first, q1, ok1 = pick(ll[:, :1], w, 0)  # [B, 1, w]
        toks, logqs, oks = [first[:, 0]], [q1], [ok1[:, 0]]
        if self.local is not None:
            p = ctx.draft_params
            embed = ctx.target_params["embed"]
            head = lh.LocalHead(self.local, ctx.config.hidden_size).bind({"params": p["local"]})
            hstate = lh.init_state(self.local, (B, w))
        prev = first[:, 0]  # [B, w]
        for j in range(1, s):
            if self.local is None:
                logits = jnp.broadcast_to(ll[:, j : j + 1], (B, w, Vd))
            else:
                full = prev if vocab_ids is None else jnp.take(vocab_ids, prev)
                hstate, r = head.step(embed, hstate, full)
                ls = short_logprobs(r, p["table"], p["in_head"], p["prior"])  # [B, w, Vd]
                logits = fuse(ll[:, j : j + 1], ls, p["prior"], p["alpha"], p["beta"])
            nxt, lq, ok = pick(logits, 1, j)
            toks.append(nxt[..., 0])
            logqs.append(lq)
            oks.append(ok[..., 0])
            prev = nxt[..., 0]

        chain = jnp.stack(toks, axis=2)  # [B, w, s] (Vd indices)
        if vocab_ids is not None:
            chain = jnp.take(vocab_ids, chain)
        # Level-major layout: node 1 + (j * w + b) holds chain b's token j; its parent is chain b's token j - 1.
        T = 1 + s * w
        tokens = jnp.concatenate([state.root[:, None], chain.swapaxes(1, 2).reshape(B, s * w)], axis=1)
        idx = jnp.arange(s * w)
        parents = jnp.concatenate([jnp.full((1,), -1), jnp.where(idx < w, 0, idx + 1 - w)]).astype(jnp.int32)
        parents = jnp.broadcast_to(parents[None], (B, T))
        valid = jnp.concatenate([jnp.ones((B, 1), bool), jnp.cumprod(jnp.stack(oks, 1), axis=1).astype(bool)
                                 .reshape(B, s * w)], axis=1)  # fmt: skip
        if not stochastic:
            return make_tree(tokens.astype(jnp.int32), parents, valid, self.tree)
        V = ctx.config.vocab_size

        def full_vocab(lq):  # [B, m, Vd] -> [B, m, V]
            return lq if vocab_ids is None else jnp.full(lq.shape[:2] + (V,), -jnp.inf).at[..., vocab_ids].set(lq)

        # logq[node] = the q its children were drawn from: the root's is q_1; chain b's token j's is q_{j+1}[b].
        logq = jnp.full((B, T, V), -jnp.inf, jnp.float32).at[:, :1].set(full_vocab(logqs[0]))
        if s > 1:
            deeper = jnp.stack([full_vocab(lq) for lq in logqs[1:]], axis=1)  # [B, s - 1, w, V]
            logq = logq.at[:, 1 : 1 + (s - 1) * w].set(deeper.reshape(B, (s - 1) * w, V))
        sampled = jnp.broadcast_to((jnp.arange(T) > 0)[None], (B, T)) & valid
        return make_tree(tokens.astype(jnp.int32), parents, valid, self.tree, logq, sampled)


# ---------------------------------------------------------------------------------------------- loading
