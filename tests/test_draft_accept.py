"""`lsjax.bench.draft_accept`: its teacher-forced estimates are what a proposal at each root would accept."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lsjax import engine
from lsjax.bench.draft_accept import first_level, summarize, two_wide
from lsjax.config import DraftConfig, GenerateConfig, SamplingConfig
from lsjax.engine import verify
from lsjax.engine.types import DraftContext
from lsjax.methods.longspec.drafter import LongSpecDrafter
from lsjax.train.features import target_features, target_logits
from lsjax.tree import Tree, TreeConfig
from tests.test_speculative import longspec_params
from tests.tiny import tiny_model

P, NEW = 14, 12


L = 48  # the buffer


@pytest.fixture(scope="module")
def setup():
    """A tiny target and draft, and a sequence whose continuation follows the draft's own chains for a random
    number of tokens, then leaves them: an untrained draft matches a tiny target's text almost never, and the
    estimates must be checked at every depth."""
    config, params = tiny_model(vocab=31, scale=0.6)
    drafter = LongSpecDrafter(TreeConfig((1, 1, 1, 1)), DraftConfig(window=64))
    dp = longspec_params(params, config, drafter, pruned=20)
    rng = np.random.RandomState(2)
    seq = list(rng.randint(3, 31, P))
    propose = _proposer(config, params, drafter, dp)
    while len(seq) < P + NEW + 4:
        chain = propose(np.asarray(seq, np.int32), len(seq) - 1)
        k = rng.randint(0, 5)
        other = [t for t in range(3, 31) if k == 4 or t != chain[k]]
        seq += list(chain[:k]) + [int(rng.choice(other))]
    return config, params, drafter, dp, np.asarray(seq[: P + NEW + 4], np.int32)


def _state_at(config, params, drafter, dp, buf, n, m, sampling=SamplingConfig()):
    """(ctx, the decode state at root m of buf [1, L] (n tokens): target cache [0, m), the draft's ring below m)."""
    full = engine.start(
        params,
        dp,
        config,
        drafter,
        GenerateConfig(max_new_tokens=2, ignore_eos=True),
        buf,
        n[None],
        jax.random.key(0),
        capacity=64,
        chunk=16,
    )
    ctx = DraftContext(params, dp, config, capacity=64, sampling=sampling)
    init = dataclasses.replace(ctx, prompt_tokens=buf, prompt_lengths=m[None])
    st = dataclasses.replace(full, cache=dataclasses.replace(full.cache, lengths=m[None]), root=buf[:, m])
    return ctx, st, drafter.init(init, st)


def _padded(seq):
    buf = np.zeros((1, L), np.int32)
    buf[0, : len(seq)] = seq
    return jnp.asarray(buf), jnp.int32(len(seq))


def _proposer(config, params, drafter, dp):
    """propose(seq, m) -> the chain `drafter` proposes at root m of seq."""

    @jax.jit
    def at(buf, n, m):
        ctx, st, ring = _state_at(config, params, drafter, dp, buf, n, m)
        return drafter.propose(ctx, st, ring, jax.random.key(0)).tokens[0, 1:]

    return lambda seq, m: np.asarray(at(*_padded(seq), jnp.int32(m)))


def _at(setup, m, sampling):
    config, params, drafter, dp, seq = setup
    return _state_at(config, params, drafter, dp, *_padded(seq), jnp.int32(m), sampling)


@pytest.mark.slow  # ~45 s: a bench estimator (the decode paths it estimates are tested for losslessness)
def test_greedy_chain_estimates_are_what_a_chain_proposal_accepts(setup):
    """T = 0: at every root, depth d of the estimate is accepted exactly when the 4-token chain proposed there
    matches the continuation through depth d (the draft at the d-th successor with the target d tokens
    behind); the first level and a 2-token chain likewise. Lag 1 at every depth (a biased estimate) differs."""
    config, params, drafter, dp, seq = setup
    toks = jnp.asarray(seq[None, : P + NEW])
    got = {k: np.asarray(v) for k, v in first_level(params, config, dp, drafter.draft, toks, NEW, 0.0).items()}
    propose = _proposer(config, params, drafter, dp)
    accepted = []
    for i in range(NEW):
        m = P - 1 + i  # root i sits at position m and predicts seq[m + 1]
        ok = propose(seq, m) == seq[m + 1 : m + 5]
        accepted.append(int(np.cumprod(ok).sum()))
    accepted = np.asarray(accepted)
    # The estimate counts depths past the continuation's end as unmatched: compare the roots with 4 successors.
    full = slice(0, NEW - 3)
    np.testing.assert_array_equal(got["first"], (accepted >= 1).astype(np.float32))
    np.testing.assert_array_equal(got["chain4"][full], 1.0 + accepted[full])
    np.testing.assert_array_equal(got["chain2"][: NEW - 1], 1.0 + np.minimum(accepted, 2)[: NEW - 1])
    assert (accepted == 0).any() and (accepted >= 3).any(), "the fixture must reach every depth, and miss"
    assert np.all(got["top2"] >= got["first"])
    padded = jnp.zeros((1, 40), jnp.int32).at[:, : P + NEW].set(toks)  # padding after the text changes nothing
    again = first_level(params, config, dp, drafter.draft, padded, NEW, 0.0, length=jnp.int32(P + NEW))
    for k, v in got.items():  # the dump's logits come from other matmul shapes: equal to rounding
        if k == "top_logits":
            np.testing.assert_allclose(np.asarray(again[k]), v, atol=1e-5, err_msg=k)
        else:
            np.testing.assert_array_equal(np.asarray(again[k]), v, err_msg=k)

    import lsjax.methods.longspec.model as dl

    real = dl.draft_forward_train

    def lag_one(*a):  # every depth drafted with the target one token behind: not what a chain sees
        return real(*a[:-1], jnp.int32(1))

    dl.draft_forward_train = lag_one
    try:
        bad = np.asarray(first_level(params, config, dp, drafter.draft, toks, NEW, 0.0)["chain4"])
    finally:
        dl.draft_forward_train = real
    assert (bad[full] != 1.0 + accepted[full]).any()


@pytest.mark.slow  # ~45 s
def test_sampled_estimate_is_the_overlap_of_p_and_the_roots_q(setup):
    """T > 0: `sampled` is sum_x min(p, q) with q the draft's processed distribution at the root (as
    `propose_with_root_q` gives it) and p the target's at that temperature; `match` is p at q's argmax."""
    config, params, drafter, dp, seq = setup
    temp = 0.8
    toks = jnp.asarray(seq[None, : P + NEW])
    got = {k: np.asarray(v) for k, v in first_level(params, config, dp, drafter.draft, toks, NEW, temp).items()}
    sampling = SamplingConfig(temperature=temp)
    for i in (0, 5, NEW - 1):
        m = P - 1 + i
        ctx, st, ring = _at(setup, m, sampling)
        _, logq = drafter.propose_with_root_q(ctx, st, ring, jax.random.key(0))
        q = np.exp(np.asarray(logq)[0])
        h = target_features(params, config, toks[:, : m + 1], jnp.arange(m + 1)[None])["hidden"]
        p = np.asarray(jax.nn.softmax(target_logits(params, config, h[:, -1], None)[0] / temp))
        np.testing.assert_allclose(got["sampled"][i], np.minimum(p, q).sum(), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(got["match"][i], p[np.argmax(q)], rtol=1e-4, atol=1e-5)
    assert np.all((got["sampled"] > 0) & (got["sampled"] <= 1 + 1e-5))


def _two_wide_by_enumeration(p, q):
    """Recursive rejection sampling over two children drawn from q without replacement, every pair
    enumerated: p [V] (may leave mass outside q's support, as p outside a pruned vocabulary), q [V]."""
    total = 0.0
    for c1 in range(len(q)):
        a = min(1.0, p[c1] / q[c1])
        r = np.maximum(p - q, 0.0) / (1.0 - np.minimum(p, q).sum())  # p's mass outside q's support counts
        q2 = q.copy()
        q2[c1] = 0.0
        q2 /= q2.sum()
        second = sum(q2[c2] * min(1.0, r[c2] / q2[c2]) for c2 in range(len(q)) if q2[c2] > 0)
        total += q[c1] * (a + (1 - a) * second)
    return total


@pytest.mark.slow  # a bench measure; the verifier itself: tests/test_verify_sampling.py
def test_two_wide_is_what_recursive_rejection_sampling_accepts():
    """`sampled2` against every pair of children enumerated, then against the engine's verification run on
    two-child sampled trees many times: a variant that forgets to drop the first child from q fails."""
    rng = np.random.RandomState(0)
    for trial in range(6):
        V = 6 + trial
        q = rng.dirichlet(np.full(V, 0.5 + trial * 0.3))
        p_full = rng.dirichlet(np.full(V + 2, 0.7))  # two tokens outside the draft's vocabulary
        p = p_full[:V]
        got = float(two_wide(jnp.asarray(p)[None], jnp.asarray(q)[None])[0])
        np.testing.assert_allclose(got, _two_wide_by_enumeration(p, q), rtol=1e-5)
        assert np.minimum(p, q).sum() <= got <= p.sum() + 1e-6
    # q underflowed to 0 on part of the draft's vocabulary: the residual lives there, no second child can take it.
    assert float(
        two_wide(jnp.asarray([[0.5, 0.3, 0.2, 0.0]]), jnp.asarray([[0.6, 0.4, 0.0, 0.0]]))[0]
    ) == pytest.approx(0.8)
    # The engine's walk over root + two sampled children, 20000 draws of the children and of the walk; the
    # last two tokens are outside the draft's vocabulary (q = 0 there).
    V = 9
    q = np.concatenate([rng.dirichlet(np.ones(V - 2)), np.zeros(2)])
    p = rng.dirichlet(np.ones(V) * 0.6)
    n = 20000
    keys = jax.random.split(jax.random.key(1), n)

    def walk(key):
        kc, kw = jax.random.split(key)
        kids = jax.random.choice(kc, V, (2,), replace=False, p=jnp.asarray(q))
        tree = Tree(
            tokens=jnp.concatenate([jnp.zeros(1, jnp.int32), kids.astype(jnp.int32)])[None],
            parents=jnp.asarray([[-1, 0, 0]], jnp.int32),
            depth=jnp.asarray([[0, 1, 1]], jnp.int32),
            valid=jnp.ones((1, 3), bool),
            mask=jnp.asarray([[[1, 0, 0], [1, 1, 0], [1, 0, 1]]], bool),
            logq=jnp.broadcast_to(jnp.log(jnp.asarray(q, jnp.float32)), (1, 3, V)),  # -inf outside
            sampled=jnp.asarray([[False, True, True]]),
        )
        logits = jnp.broadcast_to(jnp.log(jnp.asarray(p, jnp.float32)), (1, 3, V))
        return verify.accept(tree, logits, SamplingConfig(temperature=1.0), kw, 1)[1][0]

    rate = float(jnp.mean(jax.jit(jax.vmap(walk))(keys)))
    want = float(two_wide(jnp.asarray(p[:-2])[None], jnp.asarray(q[:-2])[None])[0])
    se = np.sqrt(want * (1 - want) / n)
    assert abs(rate - want) < 4 * se, (rate, want)
    one = float(np.minimum(p, q).sum())
    assert want - one > 8 * se  # the second child adds more than the test can miss
    # A variant that keeps the first child in q for the second draw disagrees with the enumeration.
    r = np.maximum(p - q, 0) / (1 - one)
    wrong = one + np.sum(np.maximum(q - p, 0)) * np.minimum(r, q).sum()
    assert abs(wrong - want) > 8 * se


def test_summary_means_per_draft_and_temperature():
    rows = [
        {"prompt": "a", "draft": "x", "T": 0.0, "first": 0.2, "top2": 0.3, "chain2": 1.2, "chain4": 1.3},
        {"prompt": "b", "draft": "x", "T": 0.0, "first": 0.4, "top2": 0.5, "chain2": 1.4, "chain4": 1.5},
        {"prompt": "a", "draft": "x", "T": 1.0, "sampled": 0.3, "match": 0.2},
    ]
    s = summarize(rows)
    assert s[("x", 0.0)]["first"] == pytest.approx(0.3) and s[("x", 0.0)]["prompts"] == 2
    assert s[("x", 1.0)] == {"sampled": 0.3, "match": 0.2, "prompts": 1}


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--draft", "no/such/draft"], "--draft no/such/draft: no such directory"),
        (["--new-tokens", "3"], "--new-tokens: must be >= 8"),
        (["--temperatures", "-1"], "--temperatures: must be >= 0"),
    ],
)
def test_bad_options_are_one_line_before_the_model_loads(argv, says, capsys):
    from lsjax.bench import draft_accept

    with pytest.raises(SystemExit) as e:
        draft_accept.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert says in err[-1]
