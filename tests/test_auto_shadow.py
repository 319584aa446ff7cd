"""`auto`'s shadow drafts: the walk of a put-aside proposal against the tokens that followed is what verification
would have accepted; the chain read off the beam tree is the draft's greedy chain; the engine stays lossless
with a shadow draft every step, in one compiled loop."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lsjax import engine
from lsjax.config import GenerateConfig, SamplingConfig
from lsjax.engine.verify import accept
from lsjax.methods.auto.shadow import DraftShadow, accepts
from lsjax.tree import Tree, TreeConfig, ancestor_mask
from tests.test_auto import SMALL, _engine
from tests.test_speculative import longspec_params
from tests.tiny import tiny_model


def random_tree(rng, widths: tuple[int, ...], batch: int, vocab: int) -> Tree:
    """Beam-shaped trees: each level's parents on the level above, siblings' tokens distinct (as a top-k is)."""
    cfg = TreeConfig(widths)
    T, offsets = cfg.num_nodes, cfg.level_offsets()
    tokens = np.zeros((batch, T), np.int32)
    parents = np.full((batch, T), -1, np.int32)
    for d, w in enumerate(widths, start=1):
        lo, up = offsets[d], offsets[d - 1]
        for b in range(batch):
            parents[b, lo : lo + w] = np.sort(rng.randint(up, up + (1 if d == 1 else widths[d - 2]), w))
            tokens[b, lo : lo + w] = rng.choice(vocab, w, replace=False)  # distinct across the level
    valid = rng.rand(batch, T) < 0.9
    valid[:, 0] = True
    for i in range(1, T):  # an invalid node has no valid children
        valid[:, i] &= valid[np.arange(batch), np.maximum(parents[:, i], 0)]
    depth = np.broadcast_to(cfg.node_depths(), (batch, T))
    p, v = jnp.asarray(parents), jnp.asarray(valid)
    return Tree(jnp.asarray(tokens), p, jnp.asarray(depth), v, ancestor_mask(p, v, cfg.depth))


@pytest.mark.parametrize("widths", [(2, 1, 1), (2, 2, 2), (3, 2)])
def test_shadow_walk_is_what_greedy_verification_accepts(widths):
    """Target logits whose argmax after a depth-d node is following[d]: greedy verification accepts exactly the
    depth the shadow's walk reports."""
    rng = np.random.RandomState(len(widths) + sum(widths))
    B, V, D = 64, 6, len(widths)
    tree = random_tree(rng, widths, B, V)
    following = jnp.asarray(rng.randint(0, V, (B, D + 1)).astype(np.int32))
    # Skew towards matches so deep paths occur: copy the tree's first path into half the rows' tokens.
    first = np.asarray(tree.tokens)[:, list(TreeConfig(widths).level_offsets()[1:])]
    following = following.at[: B // 2, :D].set(jnp.asarray(first[: B // 2]))
    logits = jax.nn.one_hot(jnp.take_along_axis(following, tree.depth, axis=1), V) * 10.0
    _, num_accepted, _ = accept(tree, logits, SamplingConfig(temperature=0.0), jax.random.key(0), D)
    empty = jnp.zeros((B, 0), jnp.int32)
    shadow = DraftShadow.record(tree, empty, jnp.zeros((B,), jnp.int32), jnp.zeros((B,), jnp.int32), None)
    got = accepts(shadow, following, TreeConfig(widths).level_offsets())
    np.testing.assert_array_equal(np.asarray(got.tree), np.asarray(num_accepted))
    assert len(set(np.asarray(num_accepted).tolist())) >= 3  # the test sees shallow and deep acceptances
    assert np.all(np.asarray(got.hybrid) == 0) and np.all(np.asarray(got.hybrid_limit) == 0)


def test_hybrid_is_the_better_of_tree_and_lookup():
    rng = np.random.RandomState(0)
    tree = random_tree(rng, (2, 1, 1), 3, 50)
    chain = jnp.asarray([[7, 8, 9, 10, 11, 12]] * 3, jnp.int32)
    n, avail = jnp.asarray([3, 3, 0]), jnp.asarray([6, 2, 6])
    following = jnp.asarray([[7, 8, 9, 10, 0, 0]] * 3, jnp.int32)
    got = accepts(DraftShadow.record(tree, chain, n, avail, None), following, (0, 1, 3, 4))
    # Row 0: the chain matches 4 deep; row 1: only 2 tokens were available after its match; row 2: no match.
    assert np.asarray(got.hybrid).tolist() == [4, 2, 0]
    assert np.asarray(got.hybrid_limit).tolist() == [6, 3, 0]


@functools.cache
def _tree_and_chain():
    """The tiny draft's (2, 1, 1) beam tree and its greedy 3-chain at the same 16 states (one compiled program)."""
    config, params = tiny_model()
    tree_ls = dataclasses.replace(SMALL.longspec, tree=TreeConfig((2, 1, 1)))
    chain_ls = dataclasses.replace(tree_ls, tree=TreeConfig((1, 1, 1)))
    dp = longspec_params(params, config, tree_ls)
    gen = GenerateConfig(max_new_tokens=8, sampling=SamplingConfig(temperature=0.0), ignore_eos=True)
    cap = engine.required_capacity(24, gen, tree_ls)
    prompts = jnp.asarray(np.random.RandomState(3).randint(3, 97, (16, 24)).astype(np.int32))

    @jax.jit
    def run(params, dp, prompts):
        lengths = jnp.full((16,), 24)
        state = engine.start(
            params, dp, config, tree_ls, gen, prompts, lengths, jax.random.key(0), capacity=cap, chunk=24
        )
        ctx = engine.context(params, dp, config, gen, cap)
        tree = tree_ls.propose(ctx, state, state.draft, jax.random.key(1))
        return tree, chain_ls.propose(ctx, state, state.draft, jax.random.key(1)).tokens[:, 1:]

    return run(params, dp, prompts)


@pytest.mark.slow  # the shadow walk tests below cover the greedy reading
def test_chain_read_off_the_beam_tree_is_the_greedy_chain():
    """Where `accepts` says the chain is known, the tree's nodes it reads are the greedy chain's tokens: fed the
    chain itself as the following tokens, the chain is accepted exactly as deep as it is known."""
    tree, chain = _tree_and_chain()
    B = chain.shape[0]
    z = jnp.zeros((B,), jnp.int32)
    got = accepts(DraftShadow.record(tree, jnp.zeros((B, 0), jnp.int32), z, z, z), chain, (0, 1, 3, 4))
    known = np.asarray(got.chain_known)
    np.testing.assert_array_equal(np.asarray(got.chain), known)
    assert known.min() >= 1 and known.max() == 3  # both cases occur among the 16 prompts
    # A wrong chain token is caught: shift the chain's last token.
    wrong = chain.at[:, 2].add(1)
    got = accepts(DraftShadow.record(tree, jnp.zeros((B, 0), jnp.int32), z, z, z), wrong, (0, 1, 3, 4))
    assert np.all(np.asarray(got.chain)[known == 3] == 2)


@pytest.mark.slow  # 14 s; test_auto.py::test_greedy_equals_ar_and_switches runs the default policy, shadows included
def test_shadow_every_step_is_lossless_in_the_same_loop():
    """Forced AR steps with a shadow draft after each (how the profile times a shadow) reuse auto's compiled
    loop, equal AR, and count a shadow per step; the policy itself runs shadows too."""
    dp, ref, decode = _engine()
    costs = jnp.asarray([1.0, 1.05, 1.1, 1.15, 1.1])
    decode({**dp, "costs": costs})
    before = engine.decode._cache_size()
    out = decode({**dp, "costs": costs}, force=len(SMALL.candidates))
    np.testing.assert_array_equal(np.asarray(out.out), np.asarray(ref.out))
    # A shadow after every step but the last (no row is left to draft for).
    assert int(out.draft.policy.shadows) == int(out.steps) - 1 and int(out.draft.policy.uses[0]) == int(out.steps)
    assert engine.decode._cache_size() == before
    free = decode({**dp, "costs": costs})
    np.testing.assert_array_equal(np.asarray(free.out), np.asarray(ref.out))
    assert int(free.draft.policy.shadows) > 0


def _lookup_at(hist, lookup, pol, step, done=False):
    from types import SimpleNamespace

    from tests.test_auto import FULL

    state = SimpleNamespace(done=jnp.full((1,), done), steps=jnp.int32(step))
    return FULL._lookup_step(state, hist, lookup, pol, FULL._match(hist))


def test_a_put_aside_lookup_proposal_teaches_every_depth():
    """AR steps emit one token, so the step's own tokens show prompt lookup's depth 1 only; a lookup proposal
    put aside at a root is checked at every depth once the tokens after it are committed, and its slot is free
    again once a depth failed."""
    from lsjax.methods.auto.shadow import LookupShadow
    from lsjax.methods.pld.drafter import History
    from tests.test_auto import FULL

    D = max(FULL.pld_tokens)
    seq = [5, 6, 7, *range(10, 10 + D), 5, 6, 7]  # the last 3-gram matches; its continuation is 10 .. 17
    hist = History(jnp.zeros((1, 64), jnp.int32).at[0, : len(seq)].set(jnp.asarray(seq)), jnp.array([len(seq)]))
    pol0 = FULL.init_policy()
    pol1, put = _lookup_at(hist, LookupShadow.empty(1, D + 1, D), pol0, 0)
    assert bool(put.pending[0, 0]) and np.asarray(put.tokens[0, 0]).tolist() == list(range(10, 10 + D))
    np.testing.assert_array_equal(np.asarray(pol1.trials), np.asarray(pol0.trials))  # nothing known yet
    follow = [10, 11, 12, 13, 14, 99, 98, 97]  # the target continued 5 tokens as the lookup proposed
    later = History(hist.tokens.at[0, len(seq) : len(seq) + D].set(jnp.asarray(follow)), jnp.array([len(seq) + D]))
    pol2, after = _lookup_at(later, put, pol1, D)
    assert not bool(after.pending[0, 0])
    fam = FULL.families.index("pld3")
    tried = np.flatnonzero(np.asarray(pol2.trials[fam]) != np.asarray(pol1.trials[fam])) + 1
    assert tried.tolist() == [1, 2, 3, 4, 5, 6]  # depth 6 failed, 7-8 untried
    gained = np.asarray(pol2.succ[fam]) - FULL.policy.decay * np.asarray(pol1.succ[fam])
    np.testing.assert_allclose(gained[:6], [1, 1, 1, 1, 1, 0], atol=1e-6)


def test_a_put_aside_proposal_is_checked_depth_by_depth():
    """Each depth is observed once, as soon as its token is committed (a copy is trusted within a few steps, not
    after D); a failed depth frees the slot at once; a prompt-lookup step's own depths are not counted again."""
    from lsjax.methods.auto.shadow import LookupShadow
    from lsjax.methods.pld.drafter import History
    from tests.test_auto import FULL

    D = max(FULL.pld_tokens)
    fam = FULL.families.index("pld3")
    seq = [5, 6, 7, *range(10, 10 + D), 5, 6, 7]
    tokens = jnp.zeros((1, 64), jnp.int32).at[0, : len(seq)].set(jnp.asarray(seq))
    empty = LookupShadow.empty(1, D + 1, D)
    pol, lookup = _lookup_at(History(tokens, jnp.array([len(seq)])), empty, FULL.init_policy(), 0)
    trials = [np.asarray(pol.trials[fam]).copy()]
    for i, tok in enumerate([10, 11, 12]):  # three AR steps that copy
        tokens = tokens.at[0, len(seq) + i].set(tok)
        pol, lookup = _lookup_at(History(tokens, jnp.array([len(seq) + i + 1])), lookup, pol, i + 1, done=True)
        trials.append(np.asarray(pol.trials[fam]).copy())
        assert int(lookup.seen[0, 0]) == i + 1 and bool(lookup.pending[0, 0])
    for i in range(3):  # step i + 1 observed depth i + 1 of the first proposal, and no other
        moved = np.flatnonzero(trials[i + 1] != trials[i]) + 1
        assert moved.tolist() == [i + 1]
    tokens = tokens.at[0, len(seq) + 3].set(99)  # depth 4 fails: the slot is free, depths 5.. never tried
    before = pol
    pol, lookup = _lookup_at(History(tokens, jnp.array([len(seq) + 4])), lookup, pol, 4, done=True)
    assert not bool(lookup.pending[0, 0])
    succ_before = np.asarray(before.succ[fam])
    np.testing.assert_allclose(np.asarray(pol.succ[fam])[3], FULL.policy.decay * succ_before[3])  # tried, missed
    assert np.asarray(pol.trials[fam])[3] > trials[-1][3] and np.asarray(pol.trials[fam])[4] == trials[-1][4]
    # Depths a prompt-lookup step saw itself (`seen`) are skipped: a slot marked seen=3 after 3 tokens observes
    # nothing more until the 4th.
    pol0, fresh = _lookup_at(History(tokens, jnp.array([len(seq)])), empty, FULL.init_policy(), 0)
    fresh = dataclasses.replace(fresh, seen=fresh.seen.at[0, 0].set(3))
    tok = tokens.at[0, len(seq) : len(seq) + 3].set(jnp.asarray([10, 11, 12]))
    pol1, _ = _lookup_at(History(tok, jnp.array([len(seq) + 3])), fresh, pol0, 3, done=True)
    np.testing.assert_array_equal(np.asarray(pol1.trials), np.asarray(pol0.trials))


@pytest.mark.slow  # put-aside proposals: the depth tests below
def test_a_lookup_proposal_is_put_aside_every_step():
    """While AR runs (one token per step) a proposal is put aside at every root and each is checked D steps
    later: the deeper depths are observed about once per step, not once per D steps."""
    from types import SimpleNamespace

    from lsjax.methods.auto.shadow import LookupShadow
    from lsjax.methods.pld.drafter import History
    from tests.test_auto import FULL

    D = max(FULL.pld_tokens)
    text = list(range(100, 160))
    seq = text[:40] + text[:3]  # the text repeats: every later 3-gram matches its first occurrence
    tokens = jnp.zeros((1, 128), jnp.int32).at[0, : len(seq)].set(jnp.asarray(seq))
    lookup, pol = LookupShadow.empty(1, D + 1, D), FULL.init_policy()
    fam = FULL.families.index("pld3")
    steps = 3 * D
    resolved = 0
    for step in range(steps):
        hist = History(tokens, jnp.array([len(seq) + step]))
        before = np.asarray(lookup.pending[0]).copy()
        pol, lookup = FULL._lookup_step(
            SimpleNamespace(done=jnp.zeros((1,), bool), steps=jnp.int32(step)), hist, lookup, pol, FULL._match(hist)
        )
        resolved += int(np.sum(before & ~np.asarray(lookup.pending[0])))
        tokens = tokens.at[0, len(seq) + step].set(text[3 + step])  # the target copies: AR commits one token
    assert resolved == steps - D  # every proposal whose D tokens were committed before the loop ended
    # Every resolved proposal matched all the way: depth D's rate moved from its prior towards 1.
    rate = np.asarray(pol.succ[fam]) / np.asarray(pol.trials[fam])
    prior = np.asarray(FULL.init_policy().succ[fam]) / np.asarray(FULL.init_policy().trials[fam])
    assert np.all(rate[1:] > prior[1:]) and rate[D - 1] > 0.9


# ------------------------------------------------------------------------------ T > 0: a sampled chain's first depth


def test_first_accept_is_unbiased_for_a_sampled_1_node_chain():
    """min(1, q(x) / p(x)) with x ~ p averages sum_x min(p, q): how often verification's rejection sampling
    accepts a child drawn from q (measured here with `accept` itself). The greedy token's match, what the shadow
    observed before, averages p(argmax q): far below on these flat distributions (so this test can fail)."""
    rng = np.random.RandomState(0)
    B, V = 20000, 7
    p = rng.dirichlet(np.ones(V) * 2.0)
    q = rng.dirichlet(np.ones(V) * 2.0)
    q[int(np.argmin(q))] = 0.0  # a token the draft cannot propose (pruned vocabulary)
    q /= q.sum()
    want = float(np.minimum(p, q).sum())
    x = rng.choice(V, B, p=p)
    logq = np.log(np.maximum(q, 1e-45)).astype(np.float32)
    logq[q == 0] = -np.inf
    tree = Tree(
        jnp.zeros((B, 2), jnp.int32),
        jnp.zeros((B, 2), jnp.int32),
        jnp.zeros((B, 2), jnp.int32),
        jnp.ones((B, 2), bool),
        None,
    )
    shadow = DraftShadow.record(
        tree,
        jnp.zeros((B, 0), jnp.int32),
        *(jnp.zeros((B,), jnp.int32),) * 3,
        jnp.broadcast_to(jnp.asarray(logq), (B, V)),
    )
    root_logp = jnp.log(jnp.asarray(p, jnp.float32))[x]
    scored = shadow.score_first(jnp.asarray(x, jnp.int32), root_logp, jnp.ones((B,), bool))
    est = np.asarray(scored.first_accept)
    assert not np.asarray(scored.fresh).any()
    assert abs(est.mean() - want) < 4 * est.std() / np.sqrt(B)
    # Verification of a sampled 1-node chain with this q accepts as often.
    child = rng.choice(V, B, p=q).astype(np.int32)
    chain = Tree(
        jnp.asarray(np.stack([np.zeros(B, np.int32), child], 1)),
        jnp.asarray(np.tile([-1, 0], (B, 1)).astype(np.int32)),
        jnp.asarray(np.tile([0, 1], (B, 1)).astype(np.int32)),
        jnp.ones((B, 2), bool),
        jnp.ones((B, 2, 2), bool),
        jnp.broadcast_to(jnp.asarray(logq), (B, 2, V)),
        jnp.asarray(np.tile([False, True], (B, 1))),
    )
    logits = jnp.broadcast_to(jnp.log(jnp.asarray(p, jnp.float32)), (B, 2, V))
    _, num_accepted, _ = accept(chain, logits, SamplingConfig(temperature=1.0), jax.random.key(1), 1)
    rate = float(np.asarray(num_accepted).mean())
    assert abs(rate - want) < 4 * np.sqrt(want * (1 - want) / B)
    greedy_match = p[int(np.argmax(q))]
    assert want - greedy_match > 0.1  # the old observation's bias on flat distributions


def test_observing_a_shadow_adds_the_first_depth_as_a_probability():
    """The ls-chain family's depth-1 count grows by first_accept, not by the greedy token's match."""
    from lsjax.methods.auto.drafter import AutoDrafter
    from lsjax.methods.auto.shadow import ShadowAccepts
    from tests.test_auto import LS

    auto = AutoDrafter(longspec=LS)
    pol = auto.init_policy(greedy=False)
    B = 2
    costs = jnp.ones((len(auto.cost_names),))
    one = jnp.ones((B,), jnp.int32)
    got = ShadowAccepts(one, 0 * one, 3 * one, one, 0 * one, jnp.asarray([0.25, 0.5]))
    z = jnp.zeros((B,), jnp.int32)
    new = auto.observe_shadow(pol, costs, z, z, jnp.ones((B,)), jnp.ones((B,), bool), got, jnp.int32(1))
    f = auto.families.index("ls-chain")
    g = auto.policy.decay
    np.testing.assert_allclose(float(new.succ[f, 0]), g * float(pol.succ[f, 0]) + 0.75, rtol=1e-6)
    np.testing.assert_allclose(float(new.trials[f, 0]), g * float(pol.trials[f, 0]) + 2, rtol=1e-6)
    # Depth 2 is tried only where the greedy token matched (nowhere here).
    np.testing.assert_allclose(float(new.trials[f, 1]), float(pol.trials[f, 1]), rtol=1e-6)


def test_prompt_lookup_learns_from_the_roots_inside_a_stretch():
    """An AR stretch puts nothing aside; its catch-up checks lookup at every root the stretch passed against
    the stretch's tokens, so a copy that began inside it is known when it ends (and nothing past its end is)."""
    from lsjax.methods.pld.drafter import History
    from tests.test_auto import FULL

    fam = FULL.families.index("pld3")
    text = list(range(100, 140))
    seq = text + [7, 8, 9] + text[:12]  # the stretch (12 tokens) copies the text's start
    L = len(seq)
    hist = History(jnp.zeros((1, 96), jnp.int32).at[0, :L].set(jnp.asarray(seq)), jnp.array([L]))
    pol0 = FULL.init_policy()
    before = jnp.array([L - 12])  # the history's length when the stretch began
    pol = FULL._stretch_lookups(hist, before, pol0)
    rate = np.asarray(pol.succ[fam]) / np.asarray(pol.trials[fam])
    prior = np.asarray(pol0.succ[fam]) / np.asarray(pol0.trials[fam])
    # Roots after stretch tokens 3 .. 11 have a 3-gram match that continues as the stretch did.
    assert np.asarray(pol.trials[fam])[0] - np.asarray(pol0.trials[fam])[0] * FULL.policy.decay**9 > 7.0
    assert rate[0] > 0.9 > prior[0] and rate[3] > prior[3]
    # A one-step stretch passes no root: nothing is learnt (its roots are put aside like any step's).
    same = FULL._stretch_lookups(hist, jnp.array([L - 1]), pol0)
    np.testing.assert_array_equal(np.asarray(same.trials), np.asarray(pol0.trials))


def test_a_stretch_stops_where_the_policy_would_run_lookup():
    """Inside an AR stretch, before each AR step: the match of the history so far (the stretch's tokens
    appended), and whether the policy would run lookup for it. A copy that begins inside a stretch ends it."""
    from types import SimpleNamespace

    from lsjax.methods.auto.drafter import AutoState
    from lsjax.methods.auto.profile import prior_costs
    from lsjax.methods.pld.drafter import History
    from tests.test_auto import FULL

    fams = FULL.families
    pol = FULL.init_policy()
    rates = np.zeros(pol.succ.shape, np.float32) + 0.05  # every family pays nothing ...
    rates[fams.index("pld3")] = 0.95  # ... but a 3-gram match, seen often
    trials = np.full(pol.trials.shape, 40.0, np.float32)
    pol = dataclasses.replace(pol, succ=jnp.asarray(rates * trials), trials=jnp.asarray(trials))
    text = list(range(100, 140))
    seq = text + [7, 8, 9]  # the history when the stretch began: no match for its last tokens
    L0 = len(seq)
    pld = History(jnp.zeros((1, 128), jnp.int32).at[0, :L0].set(jnp.asarray(seq)), jnp.array([L0]))
    ds = AutoState(pld, (), pol, (), FULL._match(pld), ())
    out = jnp.zeros((1, 64), jnp.int32).at[0, :5].set(jnp.asarray([3, 4, 7, 8, 9]))
    start = SimpleNamespace(draft=ds, num_out=jnp.array([5]), out=out, done=jnp.zeros((1,), bool), steps=0)
    ctx = SimpleNamespace(draft_params={"costs": jnp.asarray(prior_costs(FULL))})

    def stop_after(stretch_tokens):
        o = out.at[0, 5 : 5 + len(stretch_tokens)].set(jnp.asarray(stretch_tokens, jnp.int32))
        s = SimpleNamespace(**{**vars(start), "num_out": jnp.array([5 + len(stretch_tokens)]), "out": o})
        return bool(FULL.stretch_stop(ctx, start, FULL.stretch_plan(ctx, start), s))

    assert not stop_after([])  # no match: AR
    assert not stop_after([100])  # a 1-gram match: its family pays nothing
    assert not stop_after([100, 101])  # a 2-gram: the same
    assert stop_after([100, 101, 102])  # a 3-gram match, the family that pays: the stretch ends
    assert not stop_after([55, 56, 200])  # no match anywhere
    assert np.asarray(FULL.stretch_plan(ctx, start)).tolist() == [False, False, False, True]
    # Where no match could tempt the policy (every family pays nothing), nothing is searched and nothing stops.
    low = dataclasses.replace(pol, succ=jnp.asarray(np.full(rates.shape, 0.05, np.float32) * trials))
    start = SimpleNamespace(**{**vars(start), "draft": dataclasses.replace(ds, policy=low)})
    assert not np.asarray(FULL.stretch_plan(ctx, start)).any() and not stop_after([100, 101, 102])


@pytest.mark.parametrize("pruned", [0, pytest.param(20, marks=pytest.mark.slow)])
def test_first_children_are_what_propose_drafts_at_each_root(pruned):
    """One teacher-forced pass over k committed roots gives, at each, the top-w first level `propose` drafts
    there (its own ring and the target cache as they stood at that root): what `auto` learns from after a
    stretch must be what a proposal would have accepted. A pass whose cross-attention saw the whole tail (no
    per-root mask) differs."""
    from lsjax.config import DraftConfig
    from lsjax.engine.types import DraftContext
    from lsjax.methods.longspec.drafter import LongSpecDrafter

    config, params = tiny_model(vocab=31, scale=0.6)
    drafter = LongSpecDrafter(TreeConfig((3,)), DraftConfig(window=64))
    dp = longspec_params(params, config, drafter, pruned=pruned)
    gen = GenerateConfig(max_new_tokens=2, ignore_eos=True)
    seq = np.random.RandomState(1).randint(3, 31, 30).astype(np.int32)
    s0, k = 17, 8

    buf = np.zeros((1, 32), np.int32)
    buf[0, : s0 + k] = seq[: s0 + k]
    full = engine.start(
        params,
        dp,
        config,
        drafter,
        gen,
        jnp.asarray(buf),
        jnp.array([s0 + k]),
        jax.random.key(0),
        capacity=64,
        chunk=16,
    )
    ctx = DraftContext(params, dp, config, capacity=64)

    @jax.jit
    def at(m):  # the state at root m: the cache and the ring as they stood there
        init = dataclasses.replace(ctx, prompt_tokens=jnp.asarray(buf), prompt_lengths=m[None])
        cache = dataclasses.replace(full.cache, lengths=m[None])
        st = dataclasses.replace(full, cache=cache, root=jnp.asarray(buf)[:, m])
        return st, drafter.init(init, st)

    tokens = jnp.asarray(seq[None, s0 : s0 + k])
    ring0 = at(jnp.int32(s0))[1]
    got = np.asarray(drafter.first_children(ctx, ring0, full.cache, tokens, jnp.array([s0]), width=3))[0]
    propose = jax.jit(lambda st, ring: drafter.propose(ctx, st, ring, jax.random.key(0)))
    for i in range(k):
        tree = propose(*at(jnp.int32(s0 + i)))
        np.testing.assert_array_equal(got[i], np.asarray(tree.tokens)[0, 1:4], err_msg=f"root {i}")
    # Without the per-root mask over the tail, later keys leak into earlier roots.
    import lsjax.methods.longspec.model as ld  # the body LongSpecDraft.step runs

    real = ld.draft_step

    def unmasked(*a, target_tail=None, **kw):
        tk, tv, m = target_tail
        return real(*a, target_tail=(tk, tv, jnp.ones_like(m)), **kw)

    ld.draft_step = unmasked
    try:
        bad = np.asarray(drafter.first_children(ctx, ring0, full.cache, tokens, jnp.array([s0]), width=3))[0]
    finally:
        ld.draft_step = real
    assert (bad[:, 0] != got[:, 0]).any()
