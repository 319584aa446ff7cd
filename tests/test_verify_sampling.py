"""Losslessness at T > 0, deep: the joint distribution of 4 generated tokens under speculative sampling equals
the target's, enumerated exactly with filters (and the contextual penalty, whose window depends on the
tokens before each one) computed by an independent numpy reference.

The first token comes from prefill; a drafter of depth >= 3 then produces tokens 2-4 in one step when it
accepts two nodes, so the tests see draws below multi-node acceptances, bonuses after them and the next
verification after a multi-node commit. Each drafter's accepted-depth histogram at its first step is
asserted, so a drafter that never gets anything accepted cannot pass.

Power: at N = 400K samples (the slow set) the test rejects a 1% relative shift of the most likely
continuation's mass, at the default run's 100K a 2.5% shift (`test_the_test_detects_small_biases`); a
deliberately biased verifier fails it.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from lsjax import engine
from lsjax.cache import KVCache
from lsjax.config import BlockConfig, DraftConfig, GenerateConfig, LocalHeadConfig, SamplingConfig
from lsjax.engine.types import Drafter
from lsjax.engine.verify import accept
from lsjax.methods.auto.drafter import AutoDrafter, AutoPolicy, auto_params
from lsjax.methods.dels import local_head
from lsjax.methods.dels.drafter import BlockDrafter, prepare_dels_params
from lsjax.methods.dels.model import init_block_params
from lsjax.methods.dflash import model as dfm
from lsjax.methods.dflash.checkpoint import random_draft as random_dflash
from lsjax.methods.dflash.drafter import DFlashDrafter, DFlashTree
from lsjax.methods.eagle3 import model as em
from lsjax.methods.eagle3.checkpoint import random_draft
from lsjax.methods.eagle3.drafter import Eagle3Drafter, Eagle3Tree
from lsjax.methods.hybrid.drafter import HybridDrafter
from lsjax.methods.longspec.drafter import LongSpecDrafter
from lsjax.methods.pld.drafter import PLDDrafter
from lsjax.methods.streams.drafter import StreamsDrafter
from lsjax.methods.streams.model import StreamsConfig
from lsjax.methods.tokenswift import model as th
from lsjax.methods.tokenswift.drafter import TokenSwiftConfig, TokenSwiftDrafter
from lsjax.models import target
from lsjax.sampling import processed_logprobs
from lsjax.tree import Tree, TreeConfig, make_tree
from tests.filters_ref import reference_probs
from tests.test_speculative import RandomTreeDrafter, longspec_params
from tests.test_streams_drafter import stream_params
from tests.tiny import tiny_model

V = 5
K = 4  # generated tokens whose joint law is tested
PROMPT = [3, 4, 1, 3, 4]
N_DEEP = 400_000  # slow set: detects a 1% relative bias in the top cell
N = 100_000  # default run: detects a 2.5% relative bias
CHUNK_ROWS = 25_000  # rows per compiled call: keeps each call's buffers small
# The suite compiles without LLVM's optimisations (tests/conftest.py); the programs here run 100K-400K rows, so
# they take them back.
OPTIMISED = {"xla_backend_optimization_level": 2}


def model():
    """A smaller model than tests.tiny's (one layer, hidden 16): the tests run 100K-400K rows through it."""
    config, _ = tiny_model(vocab=V)
    config = dataclasses.replace(
        config, hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8
    )
    return config, target.init_params(config, jax.random.key(1), scale=0.8)


def exact_joint(params, config, prompt, sampling: SamplingConfig, k: int = K) -> dict:
    """P(continuation) for all V^k continuations; one batched forward per depth, filters from numpy."""
    probs = {(): 1.0}
    for depth in range(k):
        prefixes = list(itertools.product(range(V), repeat=depth))
        toks = jnp.asarray([list(prompt) + list(p) for p in prefixes], jnp.int32)
        last = np.asarray(_last_logits(params, config, toks), np.float64)
        nxt = {}
        for p, row in zip(prefixes, last):
            # The contextual penalty's window: the last W generated tokens (the prompt is not generation).
            window = p[-sampling.penalty_window :]
            s = sampling
            q = reference_probs(row, s.temperature, s.top_k, s.top_p, s.min_p, s.penalty, window)
            for t in range(V):
                nxt[p + (t,)] = probs[p] * q[t]
        probs = nxt
    return probs


@functools.partial(jax.jit, static_argnames="config")
def _last_logits(params, config, toks):
    pos = jnp.broadcast_to(jnp.arange(toks.shape[1])[None], toks.shape)
    return target.forward(params, config, toks, pos, KVCache.zeros(config, toks.shape[0], 16))[0][:, -1]


def distribution_pvalue(samples: np.ndarray, probs: dict, top_cells: int = 8) -> float:
    """Smallest of: a chi-square over the cells (rare cells pooled among themselves only) and Bonferroni-
    corrected z-tests on the `top_cells` most likely cells. A zero-probability continuation that was
    sampled fails outright."""
    keys = list(probs)  # itertools.product order: the base-V number of the continuation
    p = np.array([probs[k] for k in keys])
    code = np.asarray(samples) @ (V ** np.arange(samples.shape[1])[::-1])
    counts = np.bincount(code, minlength=len(keys))
    impossible = p == 0
    assert counts[impossible].sum() == 0, "a zero-probability continuation was sampled"
    n = counts.sum()
    p = p / p.sum()
    exp = p * n
    big = exp >= 5
    rare = ~big & ~impossible
    obs = np.append(counts[big], counts[rare].sum())
    ex = np.append(exp[big], exp[rare].sum())
    keep = ex > 0
    chi_p = stats.chisquare(obs[keep], ex[keep] * obs[keep].sum() / ex[keep].sum()).pvalue
    top = np.argsort(p)[::-1][:top_cells]
    z = (counts[top] - exp[top]) / np.sqrt(n * p[top] * (1 - p[top]))
    z_p = min(1.0, top_cells * 2 * stats.norm.sf(np.abs(z).max()))
    return min(chi_p, z_p)


@functools.partial(jax.jit, static_argnames=("config", "drafter", "gen"), compiler_options=OPTIMISED)
def _first_step_then_rest(params, dp, config, drafter, gen, tokens, lengths, key):
    state = engine.start(params, dp, config, drafter, gen, tokens, lengths, key, capacity=32, chunk=8)
    ctx = engine.context(params, dp, config, gen, 32)
    step = functools.partial(engine.spec_step, ctx, drafter, gen)
    state = step(state)
    first = state.num_out  # 1 (prefill) + tokens of the first step
    state = jax.lax.while_loop(lambda s: ~jnp.all(s.done), step, state)
    return state.out[:, :K], first


def sample_joint(params, config, drafter, sampling, dp=(), n=N, seed=7):
    """(samples [n, K], histogram of nodes accepted at the first speculative step)."""
    gen = GenerateConfig(max_new_tokens=K, sampling=sampling, ignore_eos=True)
    outs, firsts = [], []
    for c in range(n // CHUNK_ROWS):
        rows = CHUNK_ROWS
        tokens = jnp.asarray(np.tile(np.array(PROMPT + [0] * 3, np.int32), (rows, 1)))
        lengths = jnp.full((rows,), len(PROMPT), jnp.int32)
        key = jax.random.fold_in(jax.random.key(seed), c)
        out, first = _first_step_then_rest(params, dp, config, drafter, gen, tokens, lengths, key)
        outs.append(np.asarray(out))
        firsts.append(np.asarray(first))
    accepted_first = np.minimum(np.concatenate(firsts) - 2, K - 1)  # tokens beyond the bonus
    return np.concatenate(outs), np.bincount(accepted_first, minlength=K)


# ------------------------------------------------------------------------------------------ test drafters


@dataclasses.dataclass(frozen=True)
class TableDrafter(Drafter):
    """A k-ary tree (`fanout[d]` children per node at depth d) whose children come from q(. | node token) =
    softmax(table[token] / tau), processed like the target's distribution. `sampled`: drawn without
    replacement with the drafting key (verified by recursive rejection sampling). Otherwise the top-k of q,
    deterministic; `claim_sampled` then marks those top-k children as sampled anyway: the official LongSpec
    ratio test on top-k children, which is biased."""

    fanout: tuple[int, ...] = (3, 2, 1)
    sampled: bool = True
    claim_sampled: bool = False
    tau: float = 1.0
    name = "table"

    @property
    def tree(self) -> TreeConfig:
        return TreeConfig(tuple(int(np.prod(self.fanout[: d + 1])) for d in range(len(self.fanout))))

    def table(self):
        return jax.random.normal(jax.random.key(11), (V, V)) * 1.5

    def propose(self, ctx, state, draft_state, key) -> Tree:
        B = state.root.shape[0]
        tokens, parents, logq = [state.root[:, None]], [jnp.full((B, 1), -1, jnp.int32)], []
        offsets = self.tree.level_offsets()
        frontier = state.root[:, None]
        # q may be any distribution; the penalty's window is left out of it.
        sampling = dataclasses.replace(ctx.sampling, penalty=1.0) if not ctx.sampling.greedy else SamplingConfig(1.0)
        for d, f in enumerate(self.fanout):
            lq = processed_logprobs(self.table()[frontier] / self.tau, sampling)  # [B, w, V]
            logq.append(lq)
            score = lq + (jax.random.gumbel(jax.random.fold_in(key, d), lq.shape) if self.sampled else 0.0)
            _, child = jax.lax.top_k(score, f)  # [B, w, f]: in draw order when sampled
            w = frontier.shape[1]
            par = offsets[d] + jnp.repeat(jnp.arange(w), f)
            frontier = child.reshape(B, w * f).astype(jnp.int32)
            tokens.append(frontier)
            parents.append(jnp.broadcast_to(par[None], (B, w * f)).astype(jnp.int32))
        T = self.tree.num_nodes
        logq.append(jnp.full((B, T - offsets[-1], V), -jnp.inf))  # leaves have no children
        tokens, parents = jnp.concatenate(tokens, 1), jnp.concatenate(parents, 1)
        logq = jnp.concatenate(logq, 1)
        q_child = jnp.take_along_axis(jnp.take_along_axis(logq, parents.clip(0)[:, :, None], 1), tokens[:, :, None], 2)
        valid = (jnp.arange(T) == 0)[None] | jnp.isfinite(q_child[:, :, 0])  # q = 0 children are never drawn
        valid = valid & jnp.take_along_axis(valid, parents.clip(0), 1)  # (depth <= 3: two hops suffice)
        valid = valid & jnp.take_along_axis(valid, parents.clip(0), 1)
        stochastic = self.sampled or self.claim_sampled
        if not stochastic:
            return make_tree(tokens, parents, valid, self.tree)
        return make_tree(tokens, parents, valid, self.tree, logq, (jnp.arange(T) > 0)[None] & valid)


LS = DraftConfig(window=4)
SS = StreamsConfig(num_streams=3, msa_layers=1, rank=4)
DRAFTERS = {
    "table-sampled": TableDrafter(),
    "table-topk": TableDrafter(sampled=False),
    "random-tree": RandomTreeDrafter(TreeConfig((3, 3, 2)), vocab=V),
    "pld": PLDDrafter(num_tokens=3, ngram_max=2),
    "longspec": LongSpecDrafter(TreeConfig((2, 3, 2)), LS),
    # The released drafts' semantics (biases, no final norm, flash-attn's frontier window over a 4-token window).
    "longspec-released": LongSpecDrafter(
        TreeConfig((2, 3, 2)), DraftConfig(window=4, qkv_bias=True, final_norm=False, frontier_window=True)
    ),
    "hybrid": HybridDrafter(LongSpecDrafter(TreeConfig((2, 2, 2)), LS), PLDDrafter(num_tokens=3, ngram_max=2)),
    # The adaptive policy over AR, a PLD chain, a draft chain, the draft's tree and the hybrid: each row's steps
    # switch between trees as the (batch-wide) estimates move.
    # The probing policy: it may draft a tree at the first step, which is the step this test checks (the
    # default, shadowing policy runs AR until it has looked at the draft; its shadows never touch verification).
    "auto": AutoDrafter(
        LongSpecDrafter(TreeConfig((2, 2, 2)), LS),
        pld_tokens=(3,),
        pld_ngram=2,
        chains=(2,),
        hybrid_pld=3,
        policy=AutoPolicy(shadow=False),
    ),
    # The shadowing policy at T > 0 (the default): a one-node tree and no hybrid, so a shadow resolves one token
    # after it is drafted and steers the next choice; its first depth is scored from the target's p of the
    # emitted token (`SwitchExtras.root_logp`), which must leave the output's law alone.
    "auto-shadows": AutoDrafter(
        LongSpecDrafter(TreeConfig((1,)), LS),
        pld_tokens=(3,),
        pld_ngram=2,
        chains=(1,),
        hybrid_pld=0,
        policy=AutoPolicy(probe_min=1, budget=1.0, initial_slack=100.0),
    ),
    # The model has one layer: its streams start from the embeddings (layer 0) and run through that layer.
    "streams": StreamsDrafter(SS, (3, 3, 2), layer=0),
    "streams-pruned": StreamsDrafter(SS, (3, 3, 3), (2, 2, 1), layer=0),
    # A partial cache smaller than the context (a real selection and rebuilds) and n-gram chains.
    "tokenswift": TokenSwiftDrafter(TokenSwiftConfig(topk=(1, 2, 2), kv_budget=4, kv_sink=1, ngram_topk=2, ngram_n=3)),
    "tokenswift-verified": TokenSwiftDrafter(TokenSwiftConfig(draft_pass="verified", topk=(2, 2), ngram_topk=2)),
    # Block drafts: two chains whose first tokens are drawn without replacement, then one token per level.
    "block": BlockDrafter(BlockConfig(3), LS, branches=2),
    "dels": BlockDrafter(BlockConfig(3), LS, branches=2, local=LocalHeadConfig(hidden=8, rank=4, block_size=4)),
    # EAGLE-2's dynamic tree from an EAGLE-3 draft reading the target's (only) layer thrice: 6 nodes over 3
    # levels, which levels get how many being data.
    "eagle3": Eagle3Drafter(random_draft(model()[0])[0], Eagle3Tree(6, 3, 2)),
    # auto over that draft (its chain, its tree, AR and a PLD chain), probing: the streams along every
    # committed path feed the draft whichever candidate ran.
    "auto-eagle3": AutoDrafter(
        eagle3=Eagle3Drafter(random_draft(model()[0])[0], Eagle3Tree(6, 3, 2)),
        pld_tokens=(3,),
        pld_ngram=2,
        chains=(2,),
        hybrid_pld=0,
        policy=AutoPolicy(shadow=False),
    ),
    # A DFlash draft's block of 4 (3 positions drafted in one forward, sampled from its per-position q): the chain,
    # and a static tree of 6 nodes (the chain and 3 top-2 branches, each node's children a draw without
    # replacement). Its one layer reads the target's (only) layer's output, final-normed as HF's last hidden state.
    "dflash": DFlashDrafter(random_dflash(model()[0], layers=1, block_size=4)[0]),
    "dflash-tree": DFlashDrafter(random_dflash(model()[0], layers=1, block_size=4)[0], DFlashTree(6, 2)),
}
SAMPLINGS = {
    "T1": SamplingConfig(temperature=1.0),
    "topk": SamplingConfig(temperature=1.2, top_k=3),
    "topp": SamplingConfig(temperature=1.5, top_p=0.9),
    "minp": SamplingConfig(temperature=1.5, min_p=0.1),
    # The contextual penalty with windows shorter than the tree's depth: a node's window ends on its own path.
    "T1-penalty": SamplingConfig(temperature=1.0, penalty=1.6, penalty_window=2),
    "minp-penalty": SamplingConfig(temperature=1.5, min_p=0.1, penalty=1.4, penalty_window=3),
}
# By default (N = 100K): the LongSpec drafter's sampled trees at T=1 (recursive rejection sampling over a real
# draft) and EAGLE's dynamic tree under the contextual penalty; the slow set runs every drafter with every filter
# at N = 400K (a sampled k-ary tree under top-p, the released LongSpec layout among them).
# (The released layout's sampled trees are the same method's: "longspec-released" runs in the slow set.)
DEFAULT = {("longspec", "T1"), ("eagle3", "T1-penalty"), ("dflash-tree", "topp")}
CASES = [pytest.param(d, s, N, id=f"{d}-{s}") for d, s in sorted(DEFAULT)] + [
    pytest.param(d, s, N_DEEP, id=f"{d}-{s}-deep", marks=pytest.mark.slow) for d in DRAFTERS for s in SAMPLINGS
]


def draft_params_for(params, config, drafter):
    if isinstance(drafter, AutoDrafter):
        # AR priced out, so the first step drafts a tree (the depth histogram below needs one).
        costs = [10.0] + [1.0] * (len(drafter.candidates) - 1)
        costs += [10.0] * (len(drafter.cost_names) - len(costs))  # an AR step + a shadow draft, with LongSpec's
        if drafter.eagle3 is not None:
            return auto_params(drafter, None, costs, draft_params_for(params, config, drafter.eagle3))
        return auto_params(drafter, longspec_params(params, config, drafter.longspec), costs)
    if isinstance(drafter, LongSpecDrafter | HybridDrafter):
        return longspec_params(params, config, getattr(drafter, "longspec", drafter))
    if isinstance(drafter, StreamsDrafter):
        return stream_params(config, drafter.streams)
    if isinstance(drafter, Eagle3Drafter):
        # Random weights whose trees the target accepts 2+ deep in >= 5% of the first steps (the check below).
        return em.init_params(drafter.draft, jax.random.key(2))
    if isinstance(drafter, DFlashDrafter):
        # The target's head on unit-RMS states gives logits of std ~3 here: a random draft's q would put most of
        # its mass on one arbitrary token and the target would accept almost nothing. A final norm of 0.25 keeps
        # q spread (but not uniform), so multi-node acceptances happen.
        dp = dfm.init_params(drafter.draft, jax.random.key(6), scale=0.3)
        return dp | {"final_norm": dp["final_norm"] * 0.25}
    if isinstance(drafter, TokenSwiftDrafter):
        return th.init_params(config, drafter.heads, params, key=jax.random.key(2))
    if isinstance(drafter, BlockDrafter):
        bp = init_block_params(config, dataclasses.replace(drafter.draft, init_head_scale=1.0), params)
        bp["mask_embed"] = jax.random.normal(jax.random.key(3), bp["mask_embed"].shape)
        if drafter.local is None:
            return bp
        head = local_head.init_params(drafter.local, config.hidden_size, jax.random.key(4), embed_rms=0.8)
        head["w_out"] = head["w_out"] * 30  # a head that moves the fused q away from the block's own
        prior = jax.nn.log_softmax(jax.random.normal(jax.random.key(5), (config.vocab_size,)))
        return prepare_dels_params(bp, head, prior, None, params["embed"])
    return ()


@pytest.mark.parametrize("name,sampling,n", CASES)
def test_speculative_sampling_is_exact_at_depth(name, sampling, n):
    config, params = model()
    drafter, sampling = DRAFTERS[name], SAMPLINGS[sampling]
    probs = exact_joint(params, config, PROMPT, sampling)
    samples, hist = sample_joint(params, config, drafter, sampling, draft_params_for(params, config, drafter), n=n)
    # Deep acceptance happens: two or more nodes accepted at the first step in a good share of rows.
    # pld and the shadowing auto (AR until a shadow has looked at the draft) may accept little at the first step.
    min_share = {"pld": 0.0, "random-tree": 0.02, "auto-shadows": 0.0}.get(name, 0.05)
    assert hist[2:].sum() >= min_share * n, f"accepted-depth histogram {hist.tolist()}"
    if name not in ("pld", "auto-shadows"):
        assert hist[1:].sum() >= 0.2 * n, f"accepted-depth histogram {hist.tolist()}"
    p = distribution_pvalue(samples, probs)
    assert p > 1e-4, f"speculative samples deviate from the target distribution (p={p:.2e}, hist {hist.tolist()})"


def one_level(p_logits, q_logits, k, sampled, rows, seed):
    """A root with k children drawn from q (Gumbel-top-k when `sampled`, else q's top-k), verified at T=1.
    Returns (accepted [rows] bool, emitted token [rows])."""
    n, emitted = _one_level(p_logits, q_logits, k, sampled, rows, seed)
    return np.asarray(n > 0), np.asarray(emitted)


@functools.partial(jax.jit, static_argnums=(2, 3, 4, 5), compiler_options=OPTIMISED)
def _one_level(p_logits, q_logits, k, sampled, rows, seed):
    Vq = p_logits.shape[0]
    logq = jax.nn.log_softmax(q_logits)
    noise = jax.random.gumbel(jax.random.key(seed), (rows, Vq)) if sampled else jnp.zeros((rows, Vq))
    _, kids = jax.lax.top_k(logq[None] + noise, k)
    tokens = jnp.concatenate([jnp.zeros((rows, 1), jnp.int32), kids.astype(jnp.int32)], 1)
    parents = jnp.concatenate([jnp.full((rows, 1), -1), jnp.zeros((rows, k), jnp.int32)], 1)
    lq = jnp.full((rows, k + 1, Vq), -jnp.inf).at[:, 0].set(logq)
    flag = (jnp.arange(k + 1) > 0)[None] & sampled
    tree = make_tree(tokens, parents, jnp.ones((rows, k + 1), bool), TreeConfig((k,)), lq, flag.repeat(rows, 0))
    logits = jnp.broadcast_to(p_logits, (rows, k + 1, Vq))
    path, n, bonus = accept(tree, logits, SamplingConfig(1.0), jax.random.key(seed + 1), 1, (0, 1))
    emitted = jnp.where(n > 0, jnp.take_along_axis(tokens, path[:, 1:], 1)[:, 0], bonus)
    return n, emitted


@pytest.mark.parametrize("k", [1, 2, 3])
def test_recursive_rejection_accepts_one_minus_tv_and_emits_p(k):
    """At one node: k children sampled from q are accepted with probability 1 - TV(p, q) when k = 1 (and
    more with more children); q's deterministic top-1 child only with p(top-1). Either way the emitted
    token is distributed as p."""
    rows = 200_000
    p_logits = jnp.asarray([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0])
    q_logits = jnp.asarray([1.0, 2.0, 0.5, 1.0, -1.0, 0.0, -2.0, 0.0])
    p, q = np.asarray(jax.nn.softmax(p_logits), np.float64), np.asarray(jax.nn.softmax(q_logits), np.float64)
    acc_s, tok_s = one_level(p_logits, q_logits, k, True, rows, 0)
    acc_d, tok_d = one_level(p_logits, q_logits, 1, False, rows, 5)
    se = 4 * np.sqrt(0.25 / rows)
    if k == 1:
        assert abs(acc_s.mean() - np.minimum(p, q).sum()) < se
    assert acc_s.mean() > np.minimum(p, q).sum() - se
    assert abs(acc_d.mean() - p[np.argmax(q)]) < se
    assert acc_s.mean() > acc_d.mean() + 0.1  # here p and q overlap far more than q's top-1 carries
    for tok in (tok_s, tok_d):
        counts = np.bincount(tok, minlength=len(p))
        assert stats.chisquare(counts, p / p.sum() * counts.sum()).pvalue > 1e-4


def test_a_peaked_draft_whose_later_children_underflow_is_verified_in_log_space():
    """A draft so sure of one token that the others' q lies below fp32's range (a logit gap of 200: released
    LongSpec drafts have no final norm and reach such logits): once the first child is rejected, children 2 and 3
    were drawn from the renormalised rest of q, an O(1) distribution. Verification must accept them as often as
    the same rest with a modest gap (20) is accepted, and emit p. Before 2026-12-02 q was taken out of log space
    and read as 0 there: acceptance fell from 0.86 to 0.60, and on whole trees (`longspec-released`) the output
    law was off (p = 7e-30 at 400K rows)."""
    rows = 200_000
    p_logits = jnp.asarray([0.5, 1.0, 0.0, -0.5, 0.3])
    p = np.asarray(jax.nn.softmax(p_logits), np.float64)
    rates = {}
    for gap in (20.0, 200.0):
        acc, tok = one_level(p_logits, jnp.asarray([gap, 0.0, 0.5, 0.0, -1.0]), 3, True, rows, 3)
        counts = np.bincount(tok, minlength=len(p))
        assert stats.chisquare(counts, p * counts.sum()).pvalue > 1e-4, (gap, counts / rows, p)
        rates[gap] = acc.mean()
    assert abs(rates[200.0] - rates[20.0]) < 4 * np.sqrt(0.25 / rows), rates


def test_a_biased_verifier_fails():
    """The ratio test applied to deterministic top-k children (as the official stochastic paths do) is not
    lossless; the test must catch it."""
    config, params = model()
    sampling = SAMPLINGS["T1"]
    probs = exact_joint(params, config, PROMPT, sampling)
    samples, _ = sample_joint(params, config, TableDrafter(sampled=False, claim_sampled=True), sampling)
    assert distribution_pvalue(samples, probs) < 1e-4


@dataclasses.dataclass(frozen=True)
class TopKClaimedSampledDFlash(DFlashDrafter):
    """A biased DFlash verifier: the deterministic top-k tree, its nodes marked as drawn from q and verified by
    rejection sampling against that q."""

    def propose(self, ctx, state, draft_state, key):
        sampled = super().propose(ctx, state, draft_state, key)
        greedy = dataclasses.replace(ctx.sampling, draft_sampling="greedy")
        det = super().propose(dataclasses.replace(ctx, sampling=greedy), state, draft_state, key)
        flags = det.valid & (jnp.arange(det.num_nodes) > 0)[None]
        return dataclasses.replace(det, logq=sampled.logq, sampled=flags)


@pytest.mark.parametrize(
    "budget", [pytest.param(None, marks=pytest.mark.slow), DFlashTree(6, 2)], ids=["chain", "tree"]
)
def test_a_biased_dflash_verifier_fails(budget):
    """DFlash's tokens must be draws from the q verification reads: its top-k tokens under that q are not."""
    config, params = model()
    sampling = SAMPLINGS["T1"]
    drafter = TopKClaimedSampledDFlash(DRAFTERS["dflash"].draft, budget)
    probs = exact_joint(params, config, PROMPT, sampling)
    samples, _ = sample_joint(params, config, drafter, sampling, draft_params_for(params, config, drafter))
    assert distribution_pvalue(samples, probs) < 1e-4


@pytest.mark.parametrize("n,relative", [(N, 0.025), (N_DEEP, 0.01)])
def test_the_test_detects_small_biases(n, relative):
    config, params = model()
    probs = exact_joint(params, config, PROMPT, SAMPLINGS["T1"])
    keys = np.array(list(probs))
    p = np.array(list(probs.values()))
    p = p / p.sum()
    assert p.max() > 0.2  # the model is peaky enough for the most likely cells to carry the power
    exact = np.random.default_rng(0).choice(len(keys), size=n, p=p)
    assert distribution_pvalue(keys[exact], probs) > 1e-4
    detected = 0
    for seed in range(5):
        biased = p.copy()
        top, second = np.argsort(p)[-1], np.argsort(p)[-2]
        biased[top] *= 1 + relative
        biased[second] -= biased[top] - p[top]
        draws = np.random.default_rng(seed + 1).choice(len(keys), size=n, p=biased)
        detected += distribution_pvalue(keys[draws], probs) < 1e-4
    assert detected >= 4, f"a {relative:.1%} relative bias was caught in {detected}/5 runs"


def test_impossible_continuations_are_caught():
    config, params = model()
    probs = exact_joint(params, config, PROMPT, SAMPLINGS["topk"])
    zero = next(k for k, v in probs.items() if v == 0)
    likely = max(probs, key=probs.get)
    samples = np.array([likely] * 999 + [zero])
    with pytest.raises(AssertionError, match="zero-probability"):
        distribution_pvalue(samples, probs)
