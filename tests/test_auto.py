"""`--method auto`: the policy converges, settles on AR when nothing matches, stays lossless, never recompiles
across switches; its cost profile is keyed, cached and rebuilt when missing or corrupt.

(T > 0 losslessness: the `auto` entry of tests/test_verify_sampling.py.)
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lsjax import engine
from lsjax.config import ConfigError, DraftConfig, GenerateConfig, SamplingConfig
from lsjax.engine.types import ARDrafter
from lsjax.methods import registry
from lsjax.methods.auto import candidates as auto_candidates
from lsjax.methods.auto.drafter import AutoDrafter, AutoPolicy, auto_params
from lsjax.methods.auto.shadow import ShadowAccepts
from lsjax.methods.longspec.drafter import LongSpecDrafter
from lsjax.tree import TreeConfig
from tests.test_speculative import longspec_params, run
from tests.tiny import tiny_model

LS = LongSpecDrafter(TreeConfig((2, 1, 1)), DraftConfig(window=16))
FULL = AutoDrafter(longspec=LS)  # the shipped layout: ar, pld-4, pld-8, ls-chain1/2/4, ls-tree, hybrid
# A small candidate set keeps the tiny model's compile short: ar, pld-3, ls-tree (2, 1), hybrid. pld-3 and the
# tree have 4 nodes each: they share one verification forward (the engine's inner switch).
SMALL = AutoDrafter(longspec=LongSpecDrafter(TreeConfig((2, 1)), LS.draft), pld_tokens=(3,), chains=(), hybrid_pld=2)


# ------------------------------------------------------------------------------ the policy, scripted


def true_rates(auto, spec: dict[str, float]) -> np.ndarray:
    """[F, D] per-depth conditional acceptance of each family (default 0)."""
    return np.asarray([[spec.get(f, 0.0)] * auto.max_depth for f in auto.families])


SIM_STEPS = 600  # every simulation runs this many steps (one compile per layout and match); tests read a prefix


@functools.cache
def _simulator(auto, match: int):
    """A jitted scan of the policy against scripted acceptances (see `simulate`)."""
    D = auto.max_depth
    pld = auto.families.index("pld1") + max(match - 1, 0)
    fam = jnp.asarray([pld if c.kind == "pld" else max(c.family, 0) for c in auto.candidates])
    depth = jnp.asarray([0 if c.kind == "ar" else c.drafter.max_depth for c in auto.candidates])
    is_pld = jnp.asarray([c.kind == "pld" for c in auto.candidates])
    n, avail, active = jnp.array([match]), jnp.array([16]), jnp.ones((1,), bool)
    learners = [functools.partial(auto.learn, index=i) for i in range(len(auto.candidates))]
    fams = auto.families
    ls_depth = auto.longspec.max_depth if auto.longspec is not None else 0

    def leading(key, rates, limit):  # how many depths in a row succeed, at most `limit`
        ok = (jax.random.uniform(key, (D,)) < rates) & (jnp.arange(D) < limit)
        return jnp.sum(jnp.cumprod(ok))

    @jax.jit
    def run(costs, rates, key):
        def body(pol, xs):
            step, rates, key = xs
            c = auto.decide(pol, costs, n, avail, active.astype(jnp.float32), step)
            k1, k2 = jax.random.split(key)
            a = leading(k1, rates[fam[c]], depth[c])
            kw = dict(costs=costs, n=n, avail=avail, accepted=a[None], active=active, steps=step + 1)
            pol = jax.lax.switch(c, [functools.partial(f, **kw) for f in learners], pol)
            # Prompt lookup's shadow: how far its proposal matches the a + 1 emitted tokens.
            m = leading(k2, rates[pld], D)
            emitted = jnp.where(jnp.arange(D) < m, 0, 1)[None]
            shadowed = auto.lookup_shadow(pol, n, avail, jnp.zeros((1, D), jnp.int32), emitted, (a + 1)[None])
            pol = jax.tree.map(lambda x, y: jnp.where(is_pld[c], x, y), pol, shadowed)
            # Every step a put-aside lookup proposal is checked at every depth (`AutoDrafter._lookup_step`: one
            # is put aside per step and checked once its tokens are committed; here at once).
            m = leading(jax.random.fold_in(k2, 1), rates[pld], D)
            deep = jnp.where(jnp.arange(D) < m, 0, 1)[None]
            pol = auto.lookup_shadow(pol, n, avail, jnp.zeros((1, D), jnp.int32), deep, jnp.full((1,), D), 2)
            if not auto.shadows:
                return pol, (c, a, False)
            # A shadow draft: each draft family's would-be acceptance, drawn from its scripted rates (observed at
            # once; the engine waits for the tokens to be committed).
            run = auto.shadow_due(pol, costs, step + 1)
            k3, k4, k5 = jax.random.split(jax.random.fold_in(key, 7), 3)
            tree = leading(k3, rates[fams.index("ls-tree")], ls_depth)
            chain = leading(k4, rates[fams.index("ls-chain")], ls_depth) if "ls-chain" in fams else tree
            hyb = leading(k5, rates[fams.index("hybrid")], D) if "hybrid" in fams else tree
            one = lambda x: jnp.reshape(x, (1,)).astype(jnp.int32)  # noqa: E731
            got = ShadowAccepts(one(tree), one(chain), one(ls_depth), one(hyb), one(D if match else 0))
            seen = auto.observe_shadow(
                auto.start_shadow(pol, costs), costs, n, avail, active.astype(jnp.float32), active, got, step + 1
            )
            return jax.tree.map(lambda x, y: jnp.where(run, x, y), seen, pol), (c, a, run)

        steps = jnp.arange(SIM_STEPS, dtype=jnp.int32)
        return jax.lax.scan(body, auto.init_policy(), (steps, rates, jax.random.split(key, SIM_STEPS)))[1]

    return run


def simulate(auto, costs, phases, seed=0, match=3):
    """Runs the policy against scripted acceptances: `phases` is [(steps, true rates [F, D])]. Every row has a
    `match`-gram prompt-lookup match (0: none). Returns the candidate index chosen at every step."""
    return simulate_accepted(auto, costs, phases, seed, match)[0]


def simulate_accepted(auto, costs, phases, seed=0, match=3):
    """`simulate`'s choices, the nodes each step accepted and whether a shadow draft ran after it."""
    per_step = np.concatenate([np.broadcast_to(r, (k, *r.shape)) for k, r in phases])
    total = len(per_step)
    assert total <= SIM_STEPS
    per_step = np.concatenate([per_step, np.zeros((SIM_STEPS - total, *per_step.shape[1:]))]).astype(np.float32)
    chosen, accepted, shadow = _simulator(auto, match)(jnp.asarray(costs, jnp.float32), per_step, jax.random.key(seed))
    return np.asarray(chosen)[:total], np.asarray(accepted)[:total], np.asarray(shadow)[:total]


def best(auto, costs, rates, match=3) -> int:
    """The candidate with the most true expected tokens per second."""
    out = []
    for c, cost in zip(auto.candidates, costs):
        if c.kind == "ar":
            out.append(1.0 / cost)
            continue
        fam = c.family + (match - 1 if c.kind == "pld" else 0)
        out.append((1 + np.cumprod(rates[fam, : c.drafter.max_depth]).sum()) / cost)
    return int(np.argmax(out))


# Measured ratios on the 2-core CPU (1.2K-token prompt): ar, pld-4, pld-8, ls-chain1, ls-chain2, ls-chain4, ls-tree,
# hybrid, then an AR step with a shadow draft (ls-chain1: its extra cost over AR in proportion to ls-chain2's, as in a
# 2K-bucket profile: 0.27 vs 0.46).
COSTS = (1.0, 1.28, 1.55, 1.15, 1.25, 1.28, 1.24, 1.5, 1.2)


def names(auto, idx):
    return [auto.candidates[i].name for i in idx]


def speed(auto, costs, rates, c, match=3) -> float:
    """True expected tokens per unit cost of candidate c."""
    cand = auto.candidates[c]
    if cand.kind == "ar":
        return 1.0 / costs[0]
    fam = cand.family + (match - 1 if cand.kind == "pld" else 0)
    return (1 + np.cumprod(rates[fam, : cand.drafter.max_depth]).sum()) / costs[c]


def efficiency(auto, costs, rates, chosen) -> float:
    """Mean speed of the choices relative to always running the best candidate."""
    b = speed(auto, costs, rates, best(auto, costs, rates))
    return float(np.mean([speed(auto, costs, rates, c) for c in chosen]) / b)


@pytest.mark.parametrize(
    "spec,clear",
    [
        ({"pld3": 0.9}, True),  # copying: a long prompt-lookup chain
        ({"ls-chain": 0.8}, True),  # the draft's chain
        ({"ls-tree": 0.7, "ls-chain": 0.3}, True),  # the draft's tree beats its chain
        ({}, True),  # nothing matches: AR
        ({"pld3": 0.35, "ls-chain": 0.25}, False),  # pld-4 wins by ~20% over AR: close calls
    ],
)
def test_policy_converges_to_the_best_candidate(spec, clear):
    rates = true_rates(FULL, spec)
    target = best(FULL, COSTS, rates)
    tail = simulate(FULL, COSTS, [(300, rates)])[150:]
    got = dict(zip(*np.unique(names(FULL, tail), return_counts=True)))
    assert efficiency(FULL, COSTS, rates, tail) >= 0.9, f"best {FULL.candidates[target].name}: chose {got}"
    if clear:
        assert np.mean(tail == target) >= 0.85, f"best {FULL.candidates[target].name}: chose {got}"


def test_policy_follows_a_change_of_text():
    """Prose (nothing pays: AR), then code (prompt lookup copies): the policy notices within a bounded delay."""
    prose, code = true_rates(FULL, {"pld3": 0.2, "ls-chain": 0.1}), true_rates(FULL, {"pld3": 0.95})
    chosen = simulate(FULL, COSTS, [(200, prose), (200, code)])
    assert best(FULL, COSTS, prose) == 0 and FULL.candidates[best(FULL, COSTS, code)].name == "pld-8"
    # A close call (prompt lookup at 0.98x AR): what matters is the speed of what was chosen.
    assert efficiency(FULL, COSTS, prose, chosen[100:200]) >= 0.95
    switched = np.argmax(chosen[200:] == best(FULL, COSTS, code))
    assert switched <= FULL.policy.probe_max + 8, f"noticed the change only after {switched} steps"
    assert np.mean(chosen[300:] == best(FULL, COSTS, code)) >= 0.85


def test_a_drafter_that_never_matches_settles_on_ar():
    """Every proposal fails: after a bounded warm-up only spaced-out probes leave AR, and they thin out."""
    chosen = simulate(FULL, COSTS, [(600, true_rates(FULL, {}))])
    first_ar_run = np.argmax(np.convolve(chosen == 0, np.ones(16), "valid") == 16)
    # The warm-up probes each wait until the never-slower budget affords them (~(cost - 1) / budget steps).
    assert first_ar_run <= 80, f"AR only from step {first_ar_run}: {names(FULL, chosen[:60])}"
    late = np.flatnonzero(chosen[200:] != 0)
    groups = len({c.group for c in FULL.candidates if c.group >= 0})
    assert len(late) <= (400 // FULL.policy.probe_max + 1) * groups
    # What exploration costs when AR is best: one probe per group every probe_max steps, no more.
    assert np.mean(chosen[100:] == 0) >= 1 - groups / FULL.policy.probe_max - 0.01


NO_BUDGET = dataclasses.replace(FULL, policy=AutoPolicy(budget=1.0, initial_slack=1e6, shadow=False))
PROBES = dataclasses.replace(FULL, policy=AutoPolicy(shadow=False))  # explores by running the candidates


@pytest.mark.parametrize(
    "spec",
    [{}, {"pld3": 0.2, "ls-chain": 0.1}, {"ls-tree": 0.15, "ls-chain": 0.1}, {"hybrid": 0.25}],
    ids=["nothing", "prose", "weak-draft", "weak-hybrid"],
)
@pytest.mark.parametrize("auto", [FULL, PROBES, NO_BUDGET], ids=["shadows", "probes", "no-budget"])
def test_never_slower_than_ar_by_more_than_the_budget(spec, auto):
    """Wherever speculation does not pay, the run's cost after every step stays within (1 + budget) x the AR
    steps its tokens would have taken, plus the initial slack. The same policy without the budget breaks it."""
    rates = true_rates(FULL, spec)
    assert best(FULL, COSTS, rates) == 0  # AR is the best candidate in every case here
    chosen, accepted, shadow = simulate_accepted(auto, COSTS, [(SIM_STEPS, rates)])
    spent = np.cumsum(np.asarray(COSTS)[chosen] + shadow * (COSTS[-1] - COSTS[0])) / COSTS[0]
    allowed = (1 + FULL.policy.budget) * np.cumsum(accepted + 1) + FULL.policy.initial_slack + 1e-4
    over = float(np.max(spent - allowed))
    if auto is NO_BUDGET:
        assert over > 0  # the test can fail: unbudgeted exploration loses more than 3% here
        return
    assert over <= 0, f"{over:.2f} AR steps over the budget: {names(auto, chosen[:40])}"
    assert np.mean((chosen[100:] != 0) | shadow[100:]) > 0  # it still explores
    if auto is FULL:  # ... by shadow drafts, at least one per probe_max steps
        assert np.sum(shadow[100:]) >= 400 // FULL.policy.probe_max


def test_shadows_lose_less_than_probes_where_nothing_pays():
    """The point of shadow drafts: where AR is best, exploring costs less than running the candidates."""

    def lost(auto):  # AR steps lost per token emitted, over a draft that never pays and one that rarely does
        out = 0.0
        for spec in ({}, {"ls-tree": 0.15, "ls-chain": 0.1}):
            chosen, accepted, shadow = simulate_accepted(auto, COSTS, [(SIM_STEPS, true_rates(FULL, spec))])
            spent = np.sum(np.asarray(COSTS)[chosen] + shadow * (COSTS[-1] - COSTS[0])) / COSTS[0]
            out += spent / np.sum(accepted + 1) - 1
        return out

    # With a 1-node chain among the candidates a probe is cheap (1.15 AR steps), so the gap is narrower than the
    # 0.54x it was without one (simulated: 0.011 vs 0.021 AR steps lost per token; now 0.015 vs 0.020).
    assert lost(FULL) < 0.8 * lost(PROBES), (lost(FULL), lost(PROBES))


def test_evidence_is_not_exploration():
    """With no budget to explore, prompt lookup still runs once its free observations show it pays even at the
    low end of their confidence range; without that exception it would wait for slack it never earns."""
    copying = true_rates(FULL, {"pld3": 0.9})
    strict = AutoPolicy(budget=0.001, initial_slack=0.0)
    evidence = simulate(dataclasses.replace(FULL, policy=strict), COSTS, [(150, copying)])
    blind = simulate(
        dataclasses.replace(FULL, policy=dataclasses.replace(strict, confidence=1e6)), COSTS, [(150, copying)]
    )
    is_pld = np.asarray([c.kind == "pld" for c in FULL.candidates])
    assert np.mean(is_pld[evidence[50:]]) >= 0.85, names(FULL, evidence[:40])
    assert np.mean(is_pld[blind[50:]]) <= 0.1


def test_cost_margin_prices_speculation_above_ar():
    """Each cost's extra over AR's is scaled by 1 + cost_margin: a close call (prompt lookup ~20% ahead by the
    profile) goes to AR once speculative steps are assumed to cost twice their profiled extra."""
    careful = dataclasses.replace(FULL, policy=AutoPolicy(cost_margin=1.0))
    priced = np.asarray(careful.priced(jnp.asarray(COSTS)))
    np.testing.assert_allclose(priced, [1.0] + [1 + (c - 1) * 2.0 for c in COSTS[1:]], rtol=1e-6)
    # A cost below AR's (a test pricing AR out) is left as it is: scaling it would push it towards 0 or below.
    np.testing.assert_allclose(careful.priced(jnp.asarray([2.0, 1.0, 3.0])), [2.0, 1.0, 4.0])
    close = true_rates(FULL, {"pld3": 0.35, "ls-chain": 0.25})
    assert np.mean(simulate(FULL, COSTS, [(300, close)])[150:] == 0) < 0.5
    assert np.mean(simulate(careful, priced, [(300, close)])[150:] == 0) > 0.8


# A device where the draft is cheap (a GPU-like profile: every draft step ~5-25% over AR, a shadow 3%).
CHEAP = (1.0, 1.2, 1.4, 1.05, 1.08, 1.12, 1.1, 1.25, 1.03)


PRICED = dataclasses.replace(FULL, policy=AutoPolicy(explore_share=0.25))  # looks spaced by what they can win


def shadows_after(auto, costs, spec, start=100):
    return int(np.sum(simulate_accepted(auto, costs, [(SIM_STEPS, true_rates(FULL, spec))])[2][start:]))


def test_exploration_is_priced_by_what_it_can_win():
    """With `explore_share` (opt-in), looks at the draft are spaced by what it could win at this device's
    costs: where it cannot pay they thin out to one per probe_max steps; where it comes close (or on a device
    where drafting is cheap, so the same rates come close) they come far more often. With explore_share tiny
    they stay at probe_max everywhere."""
    steps = SIM_STEPS - 100
    sparse = steps // PRICED.policy.probe_max + 2
    nothing = shadows_after(PRICED, COSTS, {})
    late = SIM_STEPS - 300  # after the first looks, whose wide estimates still hope
    assert (
        late // PRICED.policy.probe_max - 1
        <= shadows_after(PRICED, COSTS, {}, 300)
        <= late // PRICED.policy.probe_max + 1
    )
    close = {"ls-chain": 0.1, "ls-tree": 0.05}  # the one-node chain ~4% slower than AR on the CPU profile
    assert best(FULL, COSTS, true_rates(FULL, close)) == 0
    assert shadows_after(PRICED, COSTS, close) >= 1.5 * nothing, (shadows_after(PRICED, COSTS, close), nothing)
    weak = {"ls-chain": 0.03}  # the one-node chain 2% slower than AR on the cheap device, 10% on the CPU
    assert best(FULL, CHEAP, true_rates(FULL, weak)) == 0 and best(FULL, COSTS, true_rates(FULL, weak)) == 0
    on_cpu, on_cheap = shadows_after(PRICED, COSTS, weak), shadows_after(PRICED, CHEAP, weak)
    assert on_cheap >= 1.5 * on_cpu, (on_cpu, on_cheap)
    assert shadows_after(FULL, CHEAP, weak) < 1.5 * shadows_after(FULL, COSTS, weak)  # the default back-off: 8 vs 10
    stingy = dataclasses.replace(FULL, policy=AutoPolicy(explore_share=1e-4))
    assert shadows_after(stingy, COSTS, close) <= sparse


@pytest.mark.parametrize("auto", [FULL, PRICED], ids=["back-off", "priced"])
def test_the_draft_is_picked_up_when_the_text_changes(auto):
    """Prose where nothing pays (looks thinned out to probe_max), then text the draft's chain predicts: the
    policy runs the draft within about one probe_max of the change, and stays with it."""
    prose, easy = true_rates(FULL, {}), true_rates(FULL, {"ls-chain": 0.85, "ls-tree": 0.6})
    chosen = simulate(auto, COSTS, [(300, prose), (300, easy)], match=0)
    assert np.mean(chosen[200:300] == 0) >= 0.97
    switched = int(np.argmax(chosen[300:] != 0))
    assert switched <= auto.policy.probe_max + 8, f"picked up the draft only after {switched} steps"
    assert FULL.candidates[best(FULL, COSTS, easy, match=0)].kind == "ls"
    assert efficiency(FULL, COSTS, easy, chosen[300 + switched + 30 :]) >= 0.9


def test_no_match_never_runs_prompt_lookup():
    chosen = simulate(FULL, COSTS, [(100, true_rates(FULL, {"pld3": 1.0}))], match=0)
    assert not any(FULL.candidates[c].kind in ("pld", "hybrid") for c in chosen)


def test_config_validation_names_the_field():
    with pytest.raises(ConfigError, match="auto.decay"):
        AutoPolicy(decay=1.0)
    with pytest.raises(ConfigError, match="auto.probe_max"):
        AutoPolicy(probe_min=8, probe_max=4)
    bad_values = (
        ("budget", 0.0),
        ("initial_slack", -1.0),
        ("confidence", "high"),
        ("cost_margin", -0.1),
        ("explore_share", -0.1),
        ("explore_optimism", -1.0),
    )
    for field, bad in bad_values:
        with pytest.raises(ConfigError, match=f"auto.{field}"):
            AutoPolicy(**{field: bad})
    with pytest.raises(ConfigError, match="auto.pld_tokens"):
        AutoDrafter(pld_tokens=(0,))
    with pytest.raises(ConfigError, match="auto costs: need one per entry"):  # e.g. a profile without the shadow
        auto_params(FULL, None, COSTS[:-1])


# ------------------------------------------------------------------------------ the engine, tiny model


def repetitive_prompts():
    rng = np.random.RandomState(0)
    loop = list(rng.randint(3, 97, 7))
    return [loop * 6 + list(rng.randint(3, 97, 5)), list(rng.randint(3, 97, 37))]


@functools.cache
def _engine():
    """The tiny model, AR's greedy reference, and auto's start; every decode below shares one compiled loop."""
    config, params = tiny_model()
    gen = GenerateConfig(max_new_tokens=40, sampling=SamplingConfig(temperature=0.0), ignore_eos=True)
    dp = auto_params(SMALL, longspec_params(params, config, SMALL.longspec))
    prompts = repetitive_prompts()
    ref = run(params, config, prompts, gen, ARDrafter())
    tokens = jnp.asarray(np.stack([np.pad(p, (0, 64 - len(p))) for p in prompts]).astype(np.int32))
    lengths = jnp.asarray([len(p) for p in prompts], jnp.int32)
    cap = engine.required_capacity(64, gen, SMALL)
    start = jax.jit(functools.partial(engine.start, config=config, drafter=SMALL, gen=gen, capacity=cap, chunk=64))

    def decode(draft_params, force: int = -1):
        state = start(params, dp, tokens=tokens, lengths=lengths, key=jax.random.key(0))
        pol = dataclasses.replace(state.draft.policy, force=jnp.int32(force))
        state = dataclasses.replace(state, draft=dataclasses.replace(state.draft, policy=pol))
        return engine.decode(params, draft_params, config, SMALL, gen, state, jnp.int32(100))

    return dp, ref, decode


def test_greedy_equals_ar_and_switches():
    dp, ref, decode = _engine()
    # Cheap speculation so the policy moves between candidates within a short run.
    out = decode({**dp, "costs": jnp.asarray([1.0, 1.05, 1.1, 1.15, 1.1])})
    np.testing.assert_array_equal(np.asarray(out.out), np.asarray(ref.out))
    uses = np.asarray(out.draft.policy.uses)
    assert (uses > 0).sum() >= 2 and uses[1:].sum() > 0, uses
    stats = SMALL.summary(out.draft)
    assert sum(stats["steps_by_candidate"].values()) == int(out.steps)
    rates = stats["first_depth_rates"]
    assert set(rates) == set(SMALL.families) and all(0.0 <= r <= 1.0 for r in rates.values())
    prior = {f: round(auto_candidates.prior_rates(f, 1, True)[0], 3) for f in rates}
    assert rates != prior  # learnt from the run


def test_every_candidate_forced_equals_ar_without_recompiling():
    """One compiled loop: forcing each candidate in turn (and new costs) reuses it, and each is lossless."""
    dp, ref, decode = _engine()
    decode(dp)  # compiled once (shared with the test above)
    before = engine.decode._cache_size()
    for c in range(len(SMALL.candidates)):
        out = decode({**dp, "costs": dp["costs"] * (1 + c)}, force=c)
        np.testing.assert_array_equal(np.asarray(out.out), np.asarray(ref.out), err_msg=SMALL.candidates[c].name)
        assert int(np.asarray(out.draft.policy.uses)[c]) == int(out.steps)
    assert engine.decode._cache_size() == before


@dataclasses.dataclass(frozen=True)
class _NoCatchUp(AutoDrafter):
    """A stretch whose sub-drafters never see its tokens: what the test below must catch."""

    def catch_up(self, ctx, state, ds, verdict, ran):
        return ds


def _priced_out(drafter):
    """Decode with every candidate but AR priced 50x: the policy settles on AR (and stretches)."""
    config, params = tiny_model()
    gen = GenerateConfig(max_new_tokens=60, ignore_eos=True)
    costs = [1.0] + [50.0] * (len(drafter.cost_names) - 1)
    dp = auto_params(drafter, longspec_params(params, config, drafter.longspec), costs)
    return run(params, config, repetitive_prompts(), gen, drafter, draft_params=dp)


@pytest.mark.slow  # ~1.5 min; tests/test_split_decode.py's "stretches" runs stretches against the single program
def test_ar_stretches_leave_output_and_draft_state_as_every_step_does():
    """An all-AR run with stretches (inner loops of plain AR steps, the sub-drafters caught up once after each)
    emits AR's tokens and ends with the prompt-lookup history and the draft's ring of a run without them
    (a stretch not caught up fails that comparison: the slow test below)."""
    config, params = tiny_model()
    ref = run(params, config, repetitive_prompts(), GenerateConfig(max_new_tokens=60, ignore_eos=True), ARDrafter())
    every = _priced_out(dataclasses.replace(SMALL, policy=AutoPolicy(stretch=0)))
    stretched = _priced_out(dataclasses.replace(SMALL, policy=AutoPolicy(stretch_observe=True)))
    for out in (every, stretched):
        np.testing.assert_array_equal(np.asarray(out.out), np.asarray(ref.out))
    assert int(stretched.steps) == int(every.steps) == 59  # no forward over finished rows after a stretch
    steps = SMALL.summary(stretched.draft)["ar_stretch_steps"]
    assert steps >= 40, steps  # most of the run: 2, 4, 8, 16, 16 ... after two policy steps
    assert int(np.asarray(stretched.draft.policy.uses)[0]) == int(stretched.steps)

    assert same_draft_state(every.draft, stretched.draft)
    # The stretches taught the draft's first depth (`stretch_observe`; nothing else could: shadows are priced
    # out too).
    fam = SMALL.families.index("ls-tree")
    assert float(every.draft.policy.trials[fam, 0]) == SMALL.policy.prior_weight
    assert float(stretched.draft.policy.trials[fam, 0]) > SMALL.policy.prior_weight + 10


class _Successor(LongSpecDrafter):
    """A draft whose first level at root t is (t + 1, t + 2, ...) mod V: what a stretch teaches is known."""

    def first_children(self, ctx, ring, cache, tokens, start, width):
        return (tokens[..., None] + 1 + jnp.arange(width)) % 97


def test_a_stretch_teaches_the_first_depth_at_each_root_it_passed():
    """Root i of a stretch is scored against the token emitted after it (not itself, not the one after),
    only where the stretch ran; ls-chain by the first child, ls-tree by any child of its first level; the
    observations weighed as one at a time, the newest most."""
    from types import SimpleNamespace

    from lsjax.engine.types import DraftContext

    policy = AutoPolicy(stretch=8, stretch_observe=True)
    auto = AutoDrafter(longspec=_Successor(TreeConfig((2, 1, 1)), LS.draft), policy=policy)
    pol = auto.init_policy()
    # Roots 10, 11, 13, 20, 21, 22, then the root after the stretch; row 1 ran only 3 steps (the rest junk).
    toks = jnp.asarray([[10, 11, 13, 20, 21, 22, 30, 31, 32], [5, 6, 7, 9, 50, 51, 52, 53, 54]], jnp.int32)
    count = jnp.asarray([6, 3], jnp.int32)
    state = SimpleNamespace(cache=SimpleNamespace(lengths=jnp.asarray([40, 40], jnp.int32)))
    verdict = SimpleNamespace(path_tokens=toks, count=count)
    ctx = DraftContext(None, {"longspec": None}, None)
    got = auto._stretch_drafts(ctx, state, None, verdict, pol)
    g, w0 = auto.policy.decay, auto.policy.prior_weight
    # Row 0: next - root = 1, 2, 7, 1, 1, 8 (chain hits at 0, 3, 4; tree (2 children) also at 1);
    # row 1: 1, 1, 2 (chain 0, 1; tree 0, 1, 2). Weights g^(age), age 0 for the newest of each row.
    w = lambda ages: np.asarray([g**a for a in ages])  # noqa: E731
    keep = g**6
    chain = auto.families.index("ls-chain")
    tree = auto.families.index("ls-tree")
    trials = keep * w0 + w(range(6)).sum() + w(range(3)).sum()
    chain_s = keep * float(pol.succ[chain, 0]) + w([5, 2, 1]).sum() + w([2, 1]).sum()
    tree_s = keep * float(pol.succ[tree, 0]) + w([5, 4, 2, 1]).sum() + w([2, 1, 0]).sum()
    np.testing.assert_allclose(float(got.trials[chain, 0]), trials, rtol=1e-6)
    np.testing.assert_allclose(float(got.succ[chain, 0]), chain_s, rtol=1e-6)
    np.testing.assert_allclose(float(got.trials[tree, 0]), trials, rtol=1e-6)
    np.testing.assert_allclose(float(got.succ[tree, 0]), tree_s, rtol=1e-6)
    # Deeper depths and the other families are untouched.
    np.testing.assert_array_equal(np.asarray(got.trials[:, 1:]), np.asarray(pol.trials[:, 1:]))
    others = [i for i in range(len(auto.families)) if i not in (chain, tree)]
    np.testing.assert_array_equal(np.asarray(got.trials)[others], np.asarray(pol.trials)[others])


def same_draft_state(a, b) -> bool:
    """Equal prompt-lookup histories and matches, and draft rings equal to fp32 rounding."""
    n = np.asarray(a.pld.length)
    hist = (n == np.asarray(b.pld.length)).all() and all(
        (np.asarray(a.pld.tokens)[i, :m] == np.asarray(b.pld.tokens)[i, :m]).all() for i, m in enumerate(n)
    )
    ring = np.allclose(a.ring.k, b.ring.k, atol=1e-5) and np.allclose(a.ring.v, b.ring.v, atol=1e-5)
    match = all((np.asarray(x) == np.asarray(y)).all() for x, y in zip(a.match, b.match))
    return bool(hist and ring and match)


@pytest.mark.slow  # ~40 s: two more compiles of the tiny model's auto loop
def test_a_stretch_not_caught_up_is_caught():
    """The comparison above can fail: stretches whose tokens the sub-drafters never see stay lossless (AR
    steps) but leave the draft state behind."""
    every = _priced_out(dataclasses.replace(SMALL, policy=AutoPolicy(stretch=0)))
    stale = _priced_out(_NoCatchUp(**{f.name: getattr(SMALL, f.name) for f in dataclasses.fields(SMALL)}))
    assert int(np.asarray(stale.draft.policy.uses)[0]) < int(stale.steps)  # stretches ran (and went uncounted)
    assert not same_draft_state(every.draft, stale.draft)


def test_stretch_option_is_checked():
    for bad in (-1, 1.5, True, 1000):
        with pytest.raises(ConfigError, match="auto.stretch"):
            AutoPolicy(stretch=bad)


def test_registry_and_bench_offer_auto():
    from lsjax.bench.run import available_methods

    assert "auto" in registry.names() and registry.get("auto").uses_draft
    assert "lsjax-auto" in available_methods()


def test_bench_variants_set_the_candidates(tmp_path):
    """`auto:chains=1/2/4,pld_tokens=8` builds that candidate set (a lone number is one chain); policy fields
    still go to the policy."""
    from lsjax.bench.methods import parse_variant

    config, params = tiny_model()
    model = type("M", (), {"config": config, "params": params, "path": tmp_path / "tiny.gguf"})()
    _, (method, opts) = parse_variant("a=auto:draft=random,chains=1/2/4,pld_tokens=8,budget=0.02")
    drafter, _ = registry.build(method, model, **opts)
    names = [c.name for c in drafter.candidates]
    assert names[:2] == ["ar", "pld-8"] and names[2:5] == ["ls-chain1", "ls-chain2", "ls-chain4"], names
    assert drafter.policy.budget == 0.02
    assert parse_variant("s=streams:draft=runs/x/export,tree=1/1")[1] == (
        "streams",
        {"draft": "runs/x/export", "tree": (1, 1)},
    )
    _, (method, opts) = parse_variant("a=auto:draft=random,chains=3")
    assert [c.name for c in registry.build(method, model, **opts)[0].candidates if "chain" in c.name] == ["ls-chain3"]


def test_api_auto_without_a_draft_or_profile_equals_ar():
    """`lsjax.AutoDrafter()` with no draft params: AR + prompt lookup on the built-in prior costs, lossless."""
    import lsjax

    _, ref, _ = _engine()  # AR's greedy output on the same prompts and GenerateConfig
    config, params = tiny_model()
    gen = GenerateConfig(max_new_tokens=40, sampling=SamplingConfig(temperature=0.0), ignore_eos=True)
    prompts = repetitive_prompts()
    tokens = jnp.asarray(np.stack([np.pad(p, (0, 64 - len(p))) for p in prompts]).astype(np.int32))
    lengths = jnp.asarray([len(p) for p in prompts], jnp.int32)
    cfg = lsjax.SpecConfig(model=config, gen=gen, drafter=lsjax.AutoDrafter(pld_tokens=(3,)), chunk=64)
    out = jax.jit(lsjax.generate, static_argnames="config")(params, (), tokens, cfg, jax.random.key(0), lengths)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.out))


def test_hybrid_and_auto_keep_their_tree_on_a_cpu(tmp_path):
    """On a CPU the combined methods run the 2,1,1 they were tuned with, whatever tree the draft ships for
    `--method longspec`; an explicit tree wins."""
    config, params = tiny_model()
    model = type("M", (), {"config": config, "params": params, "path": tmp_path / "tiny.gguf"})()
    alone, _ = registry.build("longspec", model, draft="random")
    assert alone.tree.widths == (2, 2, 2, 2, 2)  # no tree in the draft: the device preset
    assert registry.build("hybrid", model, draft="random")[0].longspec.tree.widths == (2, 1, 1)
    assert registry.build("auto", model, draft="random")[0].longspec.tree.widths == (2, 1, 1)
    assert registry.build("hybrid", model, draft="random", tree="1,1")[0].longspec.tree.widths == (1, 1)
