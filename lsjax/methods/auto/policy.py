"""`auto`'s policy: which candidate step runs, what it learns from each step, and what exploration may cost.

The rules are a mixin of `AutoDrafter` (`lsjax.methods.auto.drafter`, whose module doc describes the policy): pure
functions of the policy state, the cost profile and the current prompt-lookup match, so the scripted
simulator in tests/test_auto.py runs them without a model.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from lsjax.methods.auto.candidates import Candidate, members_of, prior_rates
from lsjax.methods.auto.shadow import ShadowAccepts


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PolicyState:
    succ: jax.Array  # [F, D] f32 decayed count of accepted nodes at depth d
    trials: jax.Array  # [F, D] f32 decayed count of depth-d nodes whose parent was accepted
    due: jax.Array  # [G] int32 step at which each probe group may be probed
    interval: jax.Array  # [G] int32
    uses: jax.Array  # [C] int32 steps each candidate ran (diagnostics)
    force: jax.Array  # [] int32: >= 0 runs that candidate every step (C: AR + a shadow draft every step; cost
    # profiling); -1 = the policy
    slack: jax.Array  # [] f32 AR steps the run may still lose: (1 + budget) x its tokens - its cost, + initial
    shadows: jax.Array  # [] int32 shadow drafts run (diagnostics)
    ar_run: jax.Array  # [] int32 steps in a row that ran AR (stretches included)
    stretched: jax.Array  # [] int32 AR steps run inside stretches (diagnostics)


class PolicyRules:
    """The policy's rules over `AutoDrafter`'s layout (candidates, families, policy, longspec, hybrid_pld)."""

    def init_policy(self, greedy: bool = True) -> PolicyState:
        prior = np.asarray([prior_rates(f, self.max_depth, greedy) for f in self.families], np.float32)
        w = self.policy.prior_weight
        G = 1 + max(c.group for c in self.candidates)
        # Probes: staggered, so no two families are explored in the same stretch of steps. Shadows: one look at
        # every family after the first step (nothing of the draft runs before it has been looked at).
        due = np.ones(G) if self.shadows else self.policy.probe_min + 2 * np.arange(G)
        return PolicyState(
            succ=jnp.asarray(prior * w),
            trials=jnp.full(prior.shape, w, jnp.float32),
            due=jnp.asarray(due, jnp.int32),
            interval=jnp.full((G,), self.policy.probe_min, jnp.int32),
            uses=jnp.zeros((len(self.candidates),), jnp.int32),
            force=jnp.int32(-1),
            slack=jnp.float32(self.policy.initial_slack),
            shadows=jnp.int32(0),
            ar_run=jnp.int32(0),
            stretched=jnp.int32(0),
        )

    def _rows(self, c: Candidate, n, avail):
        """Per row: (family index [B], depth limit [B], valid [B]) of candidate c given the match."""
        k = c.drafter.max_depth
        if c.kind == "pld":
            return c.family + jnp.maximum(n - 1, 0), jnp.minimum(k, avail), n > 0
        if c.kind == "hybrid":
            # Without a match the union is exactly the draft's tree: those rows belong to the ls-tree family.
            ls_depth = self.longspec.max_depth
            fam = jnp.where(n > 0, c.family, self.families.index("ls-tree"))
            return fam, jnp.where(n > 0, jnp.maximum(ls_depth, jnp.minimum(self.hybrid_pld, avail)), ls_depth), n > 0
        full = jnp.full(n.shape, 1)
        return c.family * full, k * full, full > 0

    def _scores(self, costs, policy: PolicyState, n, avail, active, optimism: float = 0.0, first_only=False):
        """Expected tokens per second of every candidate for the batch [C] (-inf where no row can use it).
        `optimism`: rates that many binomial std above their estimates (`first_only`: the first depth's)."""
        rates = policy.succ / jnp.maximum(policy.trials, 1e-6)
        if optimism:
            width = jnp.sqrt(jnp.maximum(rates * (1 - rates), 0.04) / jnp.maximum(policy.trials, 1e-6))
            if first_only:
                width = width.at[:, 1:].set(0.0)
            rates = jnp.clip(rates + optimism * width, 0.0, 1.0)
        w = active / jnp.maximum(jnp.sum(active), 1)
        depths = jnp.arange(1, rates.shape[1] + 1)
        out = []
        for c in self.candidates:
            if c.kind == "ar":
                out.append(jnp.float32(1.0) / costs[0])
                continue
            fam, limit, valid = self._rows(c, n, avail)
            r = jnp.where(depths[None] <= limit[:, None], rates[fam], 0.0)  # [B, D]
            expected = jnp.sum(jnp.cumprod(r, axis=1), axis=1)  # E[accepted] = sum_d P(accepted >= d)
            tokens = jnp.sum(w * (1.0 + expected))
            ok = jnp.any(valid & (active > 0))
            out.append(jnp.where(ok, tokens / costs[len(out)], -jnp.inf))
        return jnp.stack(out)

    def affordable(self, pol: PolicyState, costs, n, avail, active) -> jax.Array:
        """[C] bool: AR; candidates whose step keeps the run within its budget even if it accepts nothing;
        and those that beat AR even at the low end of their rates' confidence range."""
        C = len(self.candidates)
        fam = np.asarray([max(c.family, 0) for c in self.candidates])
        if any(c.kind == "pld" for c in self.candidates):  # prompt lookup: the family of the match's n-gram
            pld = self.families.index("pld1") + jnp.max(jnp.maximum(n - 1, 0))
            fam = jnp.where(jnp.asarray([c.kind == "pld" for c in self.candidates]), pld, fam)
        seen = pol.trials[fam, 0] - self.policy.prior_weight  # observations beyond the prior (decayed)
        sure = self._scores(costs, pol, n, avail, active, -self.policy.confidence) > 1.0 / costs[0]
        ok = (pol.slack >= costs[:C] / costs[0] - 1.0) | (sure & (seen >= self.policy.evidence))
        if self.shadows:
            # Shadows look at the draft's families for ~0.2 AR steps: none of them runs on its prior alone.
            ok = ok & ((seen > 1e-3) | jnp.asarray([c.kind in ("ar", "pld") for c in self.candidates]))
        return ok.at[0].set(True)

    def decide(self, pol: PolicyState, costs, n, avail, active, steps, ready=None) -> jax.Array:
        """The candidate to run: the best expected tokens per second, unless a probe is due (module doc); only
        candidates the budget affords, and only those `ready` ([C] bool, None: all) marks."""
        ok = self.affordable(pol, costs, n, avail, active)
        if ready is not None:
            ok = ok & ready
        score = jnp.where(ok, self._scores(costs, pol, n, avail, active), -jnp.inf)
        greedy = jnp.argmax(score).astype(jnp.int32)
        # force == C profiles AR steps with a shadow draft each.
        forced = jnp.where(pol.force == len(self.candidates), 0, pol.force)
        if self.shadows or not members_of(self).shape[0]:  # shadows explore (or nothing to explore)
            return jnp.where(pol.force >= 0, forced, greedy).astype(jnp.int32)
        hopeful = self._scores(costs, pol, n, avail, active, self.policy.optimism)
        # Each group's most hopeful member is its probe: it could beat the greedy choice if its rates sit at the
        # top of their confidence range.
        members = jnp.asarray(members_of(self))  # [G, C]
        reps = jnp.argmax(jnp.where(members, hopeful[None], -jnp.inf), axis=1).astype(jnp.int32)
        # Due is enough: gating on the (stale) estimates would never re-check a family after the text changes.
        probe = (steps >= pol.due) & jnp.isfinite(score[reps]) & (reps != greedy)  # score is -inf if unaffordable
        choice = jnp.where(jnp.any(probe), reps[jnp.argmax(probe)], greedy)
        return jnp.where(pol.force >= 0, forced, choice).astype(jnp.int32)

    def quiet_steps(self, pol: PolicyState, costs, steps) -> jax.Array:
        """[] int32: steps before exploration can next run (a shadow or probe due and the slack covering the
        cheapest one), which an AR stretch must not pass. AR steps add `budget` to the slack each."""
        C = len(self.candidates)
        if pol.due.shape[0] == 0 or C == 1:  # nothing to explore (prompt lookup is observed for free)
            return jnp.int32(2**30)
        if self.shadows:
            cheapest = costs[-1] / costs[0] - 1.0
        else:
            cheapest = jnp.min(costs[1:C]) / costs[0] - 1.0
        until_due = jnp.min(pol.due) - steps
        until_affordable = jnp.ceil((cheapest - pol.slack) / self.policy.budget)
        return jnp.maximum(until_due, until_affordable.astype(jnp.int32))

    def shadow_due(self, pol: PolicyState, costs, steps) -> jax.Array:
        """Whether a shadow draft runs now: some group's exploration is due and the slack covers the draft."""
        return (steps >= jnp.min(pol.due)) & (pol.slack >= costs[-1] / costs[0] - 1.0)

    def start_shadow(self, pol: PolicyState, costs) -> PolicyState:
        """A shadow draft was run: its cost comes out of the slack."""
        return dataclasses.replace(pol, slack=pol.slack - (costs[-1] / costs[0] - 1.0), shadows=pol.shadows + 1)

    def observe_shadow(
        self, pol: PolicyState, costs, n, avail, active, ready, got: ShadowAccepts, steps
    ) -> PolicyState:
        """The draft's families learn what a shadow (rows `ready` [B]) would have accepted; each probe group is
        then due again (`_backoff`).
        n, avail, active: the current step's prompt-lookup match and live rows, for the ranking."""
        d = jnp.arange(1, pol.succ.shape[1] + 1)[None]

        def add(pol, fam, limit, acc, rows, first=None):
            trial = rows[:, None] & (d <= limit[:, None]) & (acc[:, None] >= d - 1)
            hit = (trial & (acc[:, None] >= d)).astype(jnp.float32)
            if first is not None:  # depth 1 as a probability (sampled drafts; `DraftShadow.first_accept`)
                hit = hit.at[:, 0].set(jnp.where(trial[:, 0], first, 0.0))
            return self._observe(pol, jnp.full(acc.shape, fam), trial, hit)

        fams = self.families
        new = add(pol, fams.index("ls-tree"), jnp.full(got.tree.shape, self.longspec.max_depth), got.tree, ready)
        if "ls-chain" in fams:
            new = add(new, fams.index("ls-chain"), got.chain_known, got.chain, ready, got.chain_first)
        if "hybrid" in fams:
            new = add(new, fams.index("hybrid"), got.hybrid_limit, got.hybrid, ready & (got.hybrid_limit > 0))
        score = self._scores(costs, new, n, avail, active)  # looks only move due dates: one ranking serves all
        for g in range(members_of(self).shape[0]):
            new = self._backoff(new, g, costs, n, avail, active, steps, score)
        return jax.tree.map(lambda a, b: jnp.where(jnp.any(ready), a, b), new, pol)

    def _backoff(self, pol: PolicyState, group: int, costs, n, avail, active, steps, score=None) -> PolicyState:
        """Group `group` was just observed: when is it looked at again.

        `explore_share` 0 (the default): after probe_max at most if the estimates still rank it below the rest
        (the interval doubles), after probe_min if it wins. Otherwise its next look is spaced by what it can win.
        A look (a shadow draft, or a probe's worst case) costs `look` AR steps; the group could win `gain` per
        step over the best of the rest if its rates sat `explore_optimism` std above their estimates. Looking
        every `look / (explore_share x gain)` steps spends at most that share of the possible gain on finding
        out: a group that could pay much is looked at again soon (probe_min), one whose optimistic rates still
        lose, or win too little at this device's costs, at probe_max. Fresh estimates are wide, so the first
        looks come soon; confirmed ones narrow and space out."""
        mine = np.asarray(members_of(self)[group])
        score = self._scores(costs, pol, n, avail, active) if score is None else score
        p = self.policy
        if not p.explore_share:  # the plain back-off: doubled while the group ranks below the rest, else reset
            worse = jnp.max(jnp.where(mine, score, -jnp.inf)) < jnp.max(jnp.where(mine, -jnp.inf, score))
            iv = jnp.where(worse, jnp.minimum(2 * pol.interval[group], p.probe_max), p.probe_min)
            return self._due_in(pol, group, iv, steps)
        # Optimism at the first depth only: deeper depths of a family that rarely passes the first are seldom
        # observed, and their wide prior would make every such family look worth a look.
        hopeful = self._scores(costs, pol, n, avail, active, self.policy.explore_optimism, first_only=True)
        rest = jnp.max(jnp.where(mine, -jnp.inf, score))
        gain = jnp.max(jnp.where(mine, hopeful, -jnp.inf)) / rest - 1.0
        if self.shadows:
            look = costs[-1] / costs[0] - 1.0
        else:
            look = jnp.min(jnp.where(mine, costs[: len(self.candidates)], jnp.inf)) / costs[0] - 1.0
        spacing = jnp.maximum(look, 1e-3) / (p.explore_share * jnp.maximum(gain, 1e-6))
        iv = jnp.clip(jnp.ceil(jnp.minimum(spacing, p.probe_max)), p.probe_min, p.probe_max).astype(jnp.int32)
        return self._due_in(pol, group, iv, steps)

    @staticmethod
    def _due_in(pol: PolicyState, group: int, interval, steps) -> PolicyState:
        return dataclasses.replace(
            pol, interval=pol.interval.at[group].set(interval), due=pol.due.at[group].set(steps + interval)
        )

    def _learn_at(self, index: int, pol, costs, n, avail, accepted, active, steps) -> PolicyState:
        return self.learn(pol, index, costs, n, avail, accepted, active, steps)

    def _observe(self, pol: PolicyState, fam, trial, hit) -> PolicyState:
        """Adds rows' observations (family fam [B]; trial, hit [B, D] per depth) to the decayed counts."""
        onehot = jax.nn.one_hot(fam, pol.succ.shape[0], dtype=jnp.float32)  # [B, F]
        add_t = jnp.einsum("bf,bd->fd", onehot, trial.astype(jnp.float32))
        add_s = jnp.einsum("bf,bd->fd", onehot, hit.astype(jnp.float32))
        seen = add_t > 0  # only what was observed forgets: an idle family keeps its estimate
        g = self.policy.decay
        return dataclasses.replace(
            pol,
            succ=jnp.where(seen, g * pol.succ + add_s, pol.succ),
            trials=jnp.where(seen, g * pol.trials + add_t, pol.trials),
        )

    def observe_first(self, pol: PolicyState, fam: int, hit: jax.Array, valid: jax.Array) -> PolicyState:
        """Family `fam`'s first depth learns k observations per row at once (hit, valid [B, k], oldest first),
        each weighed as `_observe` would weigh it had they come one at a time: the newest most, and the
        estimate before them decayed k times, so a stretch of 16 is ~16 observations of the ~20-observation
        memory, not one."""
        g = self.policy.decay
        n = jnp.sum(valid, axis=1)  # [B]
        age = (n[:, None] - 1 - jnp.arange(hit.shape[1])[None]).astype(jnp.float32)
        w = jnp.where(valid, g**age, 0.0)
        add_t, add_s = jnp.sum(w), jnp.sum(w * hit)
        keep = g ** jnp.max(n).astype(jnp.float32)
        seen = jnp.max(n) > 0
        return dataclasses.replace(
            pol,
            succ=pol.succ.at[fam, 0].set(jnp.where(seen, keep * pol.succ[fam, 0] + add_s, pol.succ[fam, 0])),
            trials=pol.trials.at[fam, 0].set(jnp.where(seen, keep * pol.trials[fam, 0] + add_t, pol.trials[fam, 0])),
        )

    def lookup_shadow(self, pol: PolicyState, n, avail, proposal, emitted, count, from_depth=1) -> PolicyState:
        """Prompt lookup's rates from a step it did not run: its proposal [B, D] (the continuation of the match
        the step saw) against the emitted tokens [B, D] (the first count [B] valid). Whatever ran, the emitted
        tokens are the target's own (T = 0: its greedy choices; T > 0: draws from its distribution), and a
        prompt-lookup child is accepted exactly when it equals that token (greedy or sample-and-match): so
        depth d is observed, without bias, whenever d <= count. Free, so prompt lookup is never probed.
        `from_depth` (an int or [B]): record depths from there on only (the ones before were seen already)."""
        D = proposal.shape[1]
        d = jnp.arange(1, D + 1)[None]
        same = (proposal == emitted) & (d <= avail[:, None]) & (d <= count[:, None])
        matched = jnp.sum(jnp.cumprod(same, axis=1), axis=1)  # [B] leading depths that would be accepted
        valid = (n > 0) & (count > 0)
        trial = valid[:, None] & (d <= count[:, None]) & (d <= avail[:, None]) & (matched[:, None] >= d - 1)
        trial = trial & (d >= jnp.reshape(jnp.asarray(from_depth), (-1, 1)))
        hit = trial & (matched[:, None] >= d)
        fam = self.families.index("pld1") + jnp.maximum(n - 1, 0)
        return self._observe(pol, fam, trial, hit)

    def learn(self, pol: PolicyState, index: int, costs, n, avail, accepted, active, steps) -> PolicyState:
        """Policy state after candidate `index` ran and rows accepted `accepted` [B] nodes (`active` [B] rows
        that were generating; n, avail: the prompt-lookup match the step was drafted with)."""
        c = self.candidates[index]
        ran = jnp.any(active)
        # The step emitted `tokens` per row, which AR would have taken `tokens` steps for; it cost
        # costs[index] / costs[0] AR steps. A step the budget paid for had slack >= that - 1 before it and
        # emits >= 1 token, so the slack stays >= budget: exploration keeps the run's time within (1 + budget) x
        # AR's for the same tokens, plus initial_slack AR steps (as far as the cost profile is right). A step
        # run on evidence (`affordable`'s confidence bound) may overdraw it; it is expected to pay it back.
        live = active.astype(jnp.float32)
        tokens = jnp.sum(live * (accepted + 1)) / jnp.maximum(jnp.sum(live), 1.0)
        gain = (1.0 + self.policy.budget) * tokens - costs[index] / costs[0]
        pol = dataclasses.replace(
            pol,
            uses=pol.uses.at[index].add(ran.astype(jnp.int32)),
            slack=jnp.where(ran, pol.slack + gain, pol.slack),
        )
        if c.kind == "ar":
            return pol
        fam, limit, valid = self._rows(c, n, avail)
        valid = active & (valid | (c.kind == "hybrid"))
        d = jnp.arange(1, pol.succ.shape[1] + 1)[None]  # [1, D]
        trial = valid[:, None] & (d <= limit[:, None]) & (accepted[:, None] >= d - 1)  # [B, D]
        pol = self._observe(pol, fam, trial, trial & (accepted[:, None] >= d))
        if c.group < 0 or self.shadows:  # shadows schedule exploration
            return pol
        return self._backoff(pol, c.group, costs, n, avail, active.astype(jnp.float32), steps)
