"""`--method auto`: an adaptive, hardware-aware speculation policy that picks a whole step per iteration.

A small static tuple of candidate steps is compiled once into the engine's loop (`Drafter.step_variants`;
the engine `lax.switch`es over their drafting and verification, so a small tree costs only its own small
verification, and candidates with equal node counts share one compiled forward):

    ar                   one token per forward
    pld-4, pld-8         prompt-lookup chains
    ls-chain1, 2, 4      the LongSpec draft's greedy (T > 0: sampled) chains
    ls-tree              a tree of the draft ((2, 1, 1) unless --tree says otherwise)
    hybrid               that tree plus a 6-token prompt-lookup chain, verified together
    e3-chain1, 2, 4      with an EAGLE-3 draft instead of LongSpec's (`--draft DIR` in either published layout):
    e3-tree              its greedy chains and its dynamic tree (`--eagle-tree`)
    df-chain1, 2, 4      with a DFlash draft instead (`--draft DIR` of a published one): the first 1, 2, 4 tokens
    df-tree              of its block, and its static tree (`--dflash-tree`)

Each step runs the candidate with the highest expected tokens per second,

    E[accepted + 1] / cost,    cost = the device's measured seconds per step of that candidate (`costs`)

Acceptance is estimated online: per *family* and depth d, a decayed count of "node d accepted | node d - 1
accepted" (truncations of one family share it: pld-4 teaches pld-8's first four depths). Prompt lookup's
family is keyed by the n-gram its match used (a 3-gram match is far more reliable than a 1-gram one), and
the match is found before choosing, so a step without one never pays for an empty chain. Families start from
a prior (a few pseudo-observations) and forget with a ~20-observation window.

Prompt lookup learns from every step, whichever candidate ran (`lookup_shadow`): its would-be proposal at each root
is put aside and compared, depth by depth, with the tokens committed after that root, which are the target's own,
so its acceptance is observed exactly and for free (`LookupShadow`). The draft's families are explored by shadow
drafts (`lsjax.methods.auto.shadow`, the default): when exploration is due, the draft alone proposes its tree at
the new root (~0.2 AR steps on a CPU: docs/design/auto-policy.md), the proposal waits until the tokens after that
root are committed, and is then walked against them as verification would walk it, teaching ls-tree, ls-chain (read
off the beam tree) and hybrid at once (at T > 0 with sampled drafts, the chain's first depth is scored as the
probability that rejection sampling accepts a child drawn from the draft's q, from q and the target's p of the
emitted token: `DraftShadow.first_accept`). Opt-in (`AutoPolicy.stretch_observe`), the draft's first depth is
also learnt at every root an AR stretch passed, from one teacher-forced pass of the draft after it
(`_stretch_drafts`; T = 0 and deterministic trees). With `AutoPolicy.shadow=False` they are probed instead: a group's
most hopeful candidate (rates + a binomial confidence width) runs once, a full verification that costs 1.3-2.3x
an AR step when it accepts nothing. Either way, exploration that leaves every group ranked below the rest doubles
its interval (8 .. 64 steps) and one that makes a group win resets it (or, with `AutoPolicy.explore_share`, a
group's next look is spaced by what it can win at this device's costs). This bounds what exploration costs when
AR is best and notices when the text changes (prose, then code). Everything is a deterministic function of the
decode state: the same seed gives the same choices.

Never slower: the run keeps a slack, in AR steps, of (1 + budget) x the tokens it has emitted minus what
its steps cost (from the profile, priced with `cost_margin`), starting at `initial_slack`. A candidate runs,
greedy or as a probe (a shadow draft likewise), only if the slack covers its extra cost should it accept
nothing, or if it beats AR even at the low end of its rates' confidence range (evidence, not exploration).
Steps that pay earn slack for later exploration; where nothing pays, the run falls back to AR and explores
only with the 3% it is allowed to lose.

Lossless whatever it picks: every candidate is a valid tree drafted without the verification key, and the
choice only looks at the committed history. Every sub-drafter's state (PLD's token history, LongSpec's ring)
is updated once per step from the committed path, whichever candidate ran (`update`).

An EAGLE-3 draft reads the target's streams at every committed token: auto then sets the draft's
`aux_hidden_layers`, every candidate's verification returns them along the accepted path (`SwitchExtras.aux`),
and the draft's cache takes the committed pairs whichever candidate ran. Its candidates are explored by probes
(shadow drafts are LongSpec's), and AR stretches are off (an AR step inside one keeps no streams). A DFlash draft
reads the target's streams the same way (its context cache takes the committed tokens whichever candidate ran),
and is explored and priced alike.

Costs reach the jitted step as an array in the draft params (`draft_params["costs"]`, one entry per
candidate, then an AR step with a shadow draft: `cost_names`), so a measured profile replaces the prior
without recompiling (`lsjax.methods.auto.profile`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from lsjax.config import ConfigError
from lsjax.engine.types import DraftContext, Drafter, Verdict
from lsjax.methods.auto.candidates import (
    Candidate,
    CandidateStep,
    candidates_of,
    families_of,
    sub_context,
)
from lsjax.methods.auto.config import AutoPolicy
from lsjax.methods.auto.policy import PolicyRules, PolicyState
from lsjax.methods.auto.shadow import DraftShadow, LookupShadow
from lsjax.methods.auto.shadow import accepts as shadow_accepts
from lsjax.methods.dflash.drafter import DFlashDrafter
from lsjax.methods.eagle3.drafter import Eagle3Drafter
from lsjax.methods.longspec.drafter import LongSpecDrafter
from lsjax.methods.pld.drafter import History, PLDDrafter, find_continuation
from lsjax.tree import Tree, TreeConfig


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class AutoState:
    pld: History
    ring: Any  # the draft's state: LongSpec's RingCache, EAGLE-3's Eagle3State or DFlash's; () without a draft
    policy: PolicyState
    shadow: Any  # DraftShadow; () without a draft
    match: tuple  # (n, start, avail) [B] each: `_match` of the history, kept so a step computes it once
    lookup: LookupShadow  # a prompt-lookup proposal waiting for the tokens after its root


@dataclasses.dataclass(frozen=True)
class AutoDrafter(PolicyRules, Drafter):
    longspec: LongSpecDrafter | None = None  # the draft and its own tree; None: AR and prompt lookup only
    eagle3: Eagle3Drafter | None = None  # an EAGLE-3 draft and its tree instead (one draft at a time)
    dflash: DFlashDrafter | None = None  # a DFlash draft and its tree instead
    pld_tokens: tuple[int, ...] = (4, 8)
    pld_ngram: int = 3
    # LongSpec chain depths. One node is what the draft pays for most often on a CPU (dev, every task kind:
    # 1.03x AR as a fixed tree, where 2 nodes gave 0.96x); with it auto's worst dev prompt at T=0 went 0.97x -> 1.00x.
    chains: tuple[int, ...] = (1, 2, 4)
    hybrid_pld: int = 6  # the hybrid's chain length; 0 = no hybrid candidate
    policy: AutoPolicy = AutoPolicy()
    # How the host finds this device's per-candidate costs (`AutoOptions.cost_profile`): cached | measure | prior.
    cost_profile: str = "cached"

    name = "auto"

    def check_params(self, draft_params, config) -> str | None:
        sub = self.sub
        if sub is None:
            return None
        key = self.sub_key
        if not isinstance(draft_params, dict) or key not in draft_params:
            kind = {"eagle3": "an EAGLE-3", "dflash": "a DFlash"}.get(key, "a LongSpec")
            return (
                f"auto with {kind} draft needs {{'{key}': the draft's "
                "params, 'costs': ...} as "
                f"registry.build('auto', ...) returns it, got {type(draft_params).__name__}"
            )
        problem = sub.check_params(draft_params[key], config)
        return None if problem is None else f"['{key}']: {problem}"

    @property
    def sub(self) -> Drafter | None:
        """The draft auto's draft candidates run (LongSpec's, EAGLE-3's or DFlash's), None without one."""
        return next((d for d in (self.longspec, self.eagle3, self.dflash) if d is not None), None)

    @property
    def sub_key(self) -> str:
        """Where the draft's params sit in auto's draft params."""
        return "eagle3" if self.eagle3 is not None else "dflash" if self.dflash is not None else "longspec"

    @property
    def streams_draft(self) -> Drafter | None:
        """The draft that reads the target's streams (EAGLE-3's or DFlash's), None without one."""
        return self.eagle3 if self.eagle3 is not None else self.dflash

    @property
    def aux_hidden_layers(self) -> tuple[int, ...]:
        return self.streams_draft.aux_hidden_layers if self.streams_draft is not None else ()

    def prefill_hook(self, ctx: DraftContext):
        d = self.streams_draft
        return d.prefill_hook(sub_context(ctx, self.sub_key)) if d is not None else None

    def __post_init__(self):
        for field, vals in (("pld_tokens", self.pld_tokens), ("chains", self.chains)):
            if not isinstance(vals, tuple) or not all(isinstance(v, int) and v >= 1 for v in vals):
                raise ConfigError(f"auto.{field}: must be a tuple of integers >= 1, got {vals!r}")
        if not (isinstance(self.pld_ngram, int) and self.pld_ngram >= 1):
            raise ConfigError(f"auto.pld_ngram: must be an integer >= 1, got {self.pld_ngram!r}")
        if not (isinstance(self.hybrid_pld, int) and self.hybrid_pld >= 0):
            raise ConfigError(f"auto.hybrid_pld: must be an integer >= 0, got {self.hybrid_pld!r}")
        if self.longspec is not None and not isinstance(self.longspec, LongSpecDrafter):
            raise ConfigError(f"auto.longspec: must be a LongSpecDrafter or None, got {type(self.longspec).__name__}")
        if self.eagle3 is not None and not isinstance(self.eagle3, Eagle3Drafter):
            raise ConfigError(f"auto.eagle3: must be an Eagle3Drafter or None, got {type(self.eagle3).__name__}")
        if self.dflash is not None and not isinstance(self.dflash, DFlashDrafter):
            raise ConfigError(f"auto.dflash: must be a DFlashDrafter or None, got {type(self.dflash).__name__}")
        if sum(d is not None for d in (self.longspec, self.eagle3, self.dflash)) > 1:
            raise ConfigError(
                "auto: one draft at a time: a LongSpec draft (longspec), an EAGLE-3 one (eagle3) or a DFlash one "
                "(dflash)"
            )

    # ------------------------------------------------------------------------------------------ layout

    @property
    def candidates(self) -> tuple[Candidate, ...]:
        return candidates_of(self)

    @property
    def families(self) -> tuple[str, ...]:
        return families_of(self)

    @property
    def max_depth(self) -> int:
        return max(c.drafter.max_depth for c in self.candidates)

    @property
    def num_nodes(self) -> int:
        return max(c.drafter.num_nodes for c in self.candidates)

    @property
    def tree(self) -> TreeConfig:  # the deepest step's shape, for capacity checks
        return TreeConfig((1,) * self.max_depth)

    def step_variants(self) -> tuple[Drafter, ...]:
        return tuple(CandidateStep(self, i) for i in range(len(self.candidates)))

    @property
    def shadows(self) -> bool:
        """Whether the draft's candidates are explored by shadow drafts (else by probes)."""
        return self.policy.shadow and self.longspec is not None

    @property
    def cost_names(self) -> tuple[str, ...]:
        """What `costs` holds, in order: every candidate's step, then an AR step with a shadow draft."""
        return tuple(c.name for c in self.candidates) + (("shadow",) if self.longspec is not None else ())

    @property
    def _shadow_depth(self) -> int:
        """Committed tokens a shadow waits for: its tree's depth or the hybrid's chain, the longer."""
        return max(self.longspec.max_depth, self.hybrid_pld)

    def _costs(self, ctx: DraftContext) -> jax.Array:
        """The costs (`cost_names`) in the draft params (the built-in prior when none were given), with each
        cost above AR's scaled by 1 + `cost_margin`."""
        if isinstance(ctx.draft_params, dict) and "costs" in ctx.draft_params:
            costs = ctx.draft_params["costs"]
        else:
            from lsjax.methods.auto.profile import prior_costs

            costs = jnp.asarray(prior_costs(self), jnp.float32)
        return self.priced(costs)

    def priced(self, costs: jax.Array) -> jax.Array:
        """Profiled costs as the policy prices them: AR's as measured, every other's extra over AR's scaled by
        1 + `cost_margin`."""
        m = self.policy.cost_margin
        extra = costs - costs[0]  # a cost below AR's (a test pricing AR out) is taken as given, not scaled
        return costs if not m else costs[0] + jnp.where(extra > 0, extra * (1.0 + m), extra)

    def _pld(self, num_tokens: int) -> PLDDrafter:
        return PLDDrafter(num_tokens=num_tokens, ngram_max=self.pld_ngram)

    # ------------------------------------------------------------------------------------------ state

    def init(self, ctx: DraftContext, state) -> AutoState:
        pld = self._pld(max(self.pld_tokens)).init(ctx, state)
        ring = self.sub.init(sub_context(ctx, self.sub_key), state) if self.sub is not None else ()
        B = state.root.shape[0]
        scored = ctx.sampling.sample_drafts and self.policy.sampled_first
        V = ctx.config.vocab_size if scored else 0  # the shadow keeps q at its root
        shadow = DraftShadow.empty(B, self.longspec.num_nodes, self.hybrid_pld, V) if self.longspec is not None else ()
        pol = self.init_policy(ctx.sampling.greedy or not ctx.sampling.sample_drafts)
        D = max(self.pld_tokens)
        lookup = LookupShadow.empty(B, D + 1, D)  # an AR step frees a slot every step: D + 1 never collide
        return AutoState(pld, ring, pol, shadow, self._match(pld), lookup)

    def host_params(self, run) -> dict:
        """`HostTuned`: the draft params with this device's per-candidate costs at the run's bucket (measured
        once and cached on disk, measured again, or the prior: `cost_profile`)."""
        from lsjax.methods.auto.profile import profile_costs

        costs = profile_costs(
            self,
            run.model_name,
            run.backend,
            run.params,
            run.draft_params,
            run.gen,
            run.bucket,
            run.state,
            run.decode,
            self.cost_profile,
            run.model_sig,
            run.mesh,
            borrow=run.borrow,
            settled=run.settled,
        )
        return {**run.draft_params, "costs": jnp.asarray(costs, jnp.float32)}

    def switch_split(self, generator, prompt_ids, gen, seed: int) -> dict:
        """`SwitchProfiled`: ms per step of each candidate, forced in the compiled loop on this prompt."""
        from lsjax.methods.auto.profile import candidate_split

        return candidate_split(generator, prompt_ids, gen, seed)

    def summary(self, draft_state: AutoState) -> dict:
        """Steps each candidate ran (host side, after decoding)."""
        uses = np.asarray(draft_state.policy.uses)
        out = {"steps_by_candidate": {c.name: int(u) for c, u in zip(self.candidates, uses) if u}}
        if self.shadows:
            out["shadow_drafts"] = int(draft_state.policy.shadows)
        if self.ar_stretches:
            out["ar_stretch_steps"] = int(draft_state.policy.stretched)
        pol = draft_state.policy
        rates = np.asarray(pol.succ[:, 0]) / np.maximum(np.asarray(pol.trials[:, 0]), 1e-6)
        # What the policy believed at the end: each family's first-depth rate (prior included).
        out["first_depth_rates"] = {f: round(float(r), 3) for f, r in zip(self.families, rates)}
        return out

    def propose(self, ctx, state, draft_state, key) -> Tree:
        raise NotImplementedError("auto runs one of its step_variants() per step (the engine switches over them)")

    # ------------------------------------------------------------------------------------------ policy

    def _match(self, hist: History):
        """(n [B] the n-gram of the most recent prompt-lookup match, 0 for none; where its continuation starts;
        tokens available after it)."""
        n = jnp.zeros(hist.length.shape, jnp.int32)
        start = jnp.zeros(hist.length.shape, jnp.int32)
        for g in range(self.pld_ngram, 0, -1):  # longer n-grams first, as PLDDrafter does
            f, s = find_continuation(hist.tokens, hist.length, g, 1)
            take = (n == 0) & f
            n, start = jnp.where(take, g, n), jnp.where(take, s, start)
        return n, start, jnp.maximum(hist.length - start, 0)

    def choose(self, ctx: DraftContext, state) -> jax.Array:
        ds: AutoState = state.draft
        n, _, avail = ds.match
        active = (~state.done).astype(jnp.float32)
        return self.decide(ds.policy, self._costs(ctx), n, avail, active, state.steps, _ready(ctx))

    def choice_rates(self, ctx: DraftContext, state) -> jax.Array:
        """`Drafter.choice_rates`: the policy's expected tokens per second of every candidate now."""
        ds: AutoState = state.draft
        n, _, avail = ds.match
        active = (~state.done).astype(jnp.float32)
        return self._scores(self._costs(ctx), ds.policy, n, avail, active)

    def ready_params(self, draft_params, ready) -> dict:
        """`Drafter.ready_params`: `ready` rides in the params (`draft_params["ready"]`), so the same programs
        serve every mask."""
        ready = np.asarray(ready, bool)
        if ready.shape != (len(self.candidates),) or not ready[0]:
            raise ValueError(f"auto: ready must be [{len(self.candidates)}] bool with AR's entry set, got {ready}")
        base = draft_params if isinstance(draft_params, dict) else auto_params(self)
        return {**base, "ready": jnp.asarray(ready)}

    @property
    def ar_stretches(self) -> bool:
        return bool(self.policy.stretch) and self.streams_draft is None

    @property
    def stretch_limit(self) -> int:
        # The catch-up writes the stretch into the draft's ring in one go: no longer than the ring.
        window = self.longspec.draft.window if self.longspec is not None else self.policy.stretch
        return min(self.policy.stretch, window)

    def ar_stretch(self, ctx: DraftContext, state) -> jax.Array | None:
        """`Drafter.ar_stretch`: once AR ran 2+ steps in a row, as many AR steps again (so stretches double) up
        to `AutoPolicy.stretch`, while nothing might pay: no shadow waits for tokens, no exploration is due or
        affordable before the stretch ends (`quiet_steps`), and no prompt-lookup match turns up that the policy
        would run (`stretch_stop`, checked before every AR step of it). The policy step after it looks again."""
        if not self.ar_stretches:
            return None
        ds: AutoState = state.draft
        pol = ds.policy
        live = ~state.done
        calm = (pol.force < 0) & (pol.ar_run >= 2)
        if self.shadows:
            calm = calm & ~jnp.any(ds.shadow.pending & live)
        k = jnp.minimum(pol.ar_run, self.quiet_steps(pol, self._costs(ctx), state.steps))
        return jnp.where(calm, jnp.maximum(k, 0), 0).astype(jnp.int32)

    def stretch_plan(self, ctx: DraftContext, start) -> jax.Array:
        """[pld_ngram + 1] bool: for a match of each n-gram length (0: none), whether the policy, at the
        stretch's rates and costs, would run something other than AR for it (with as many tokens after the match
        as any candidate uses: a stop on a match too short to pay costs one policy step)."""
        ds: AutoState = start.draft
        costs, live = self._costs(ctx), (~start.done).astype(jnp.float32)
        n = ds.match[0]
        deep = jnp.full_like(n, self.max_depth)
        acts = [
            self.decide(ds.policy, costs, jnp.full_like(n, g), deep, live, start.steps, _ready(ctx)) != 0
            for g in range(1, self.pld_ngram + 1)
        ]
        return jnp.stack([jnp.bool_(False), *acts])

    def stretch_stop(self, ctx: DraftContext, start, plan, state) -> jax.Array:
        """`Drafter.stretch_stop`: the prompt-lookup match the history has now (the stretch's tokens appended to
        the history it began with) is one the policy would act on (`stretch_plan`). A copy that begins inside a
        stretch is run from its first match, as without stretches; stretches that began only where no possible
        match could tempt the policy kept a run with one well-rated 3-gram family out of them altogether
        (docs/design/auto-policy.md). The search runs only where some match would tempt it (on prose, none does)."""

        def search(_):
            ds: AutoState = start.draft
            B, C = ds.pld.tokens.shape
            j = jnp.arange(self.stretch_limit)[None]
            ran = (state.num_out - start.num_out)[:, None]  # [B, 1] tokens the stretch emitted so far
            idx = jnp.clip(start.num_out[:, None] + j, 0, state.out.shape[1] - 1)
            pos = jnp.where(j < ran, ds.pld.length[:, None] + j, C)  # C: past the buffer, dropped
            tokens = ds.pld.tokens.at[jnp.arange(B)[:, None], pos].set(
                jnp.take_along_axis(state.out, idx, axis=1), mode="drop"
            )
            n, _, _ = self._match(History(tokens, ds.pld.length + ran[:, 0]))
            return jnp.any(plan[n] & ~state.done)

        return jax.lax.cond(jnp.any(plan), search, lambda _: jnp.bool_(False), None)

    def catch_up(self, ctx: DraftContext, state, ds: AutoState, verdict: Verdict, ran) -> AutoState:
        """After a stretch of `ran` AR steps: the sub-drafters see its committed tokens at once, and the policy
        counts them as the AR steps they were (each adds `budget` to the slack, as `learn` would)."""
        pld = self._pld(max(self.pld_tokens)).update(ctx, state, ds.pld, verdict)
        ring = self.longspec.update(sub_context(ctx), state, ds.ring, verdict) if self.longspec is not None else ()
        pol = ds.policy
        pol = dataclasses.replace(
            pol,
            uses=pol.uses.at[0].add(ran),
            slack=pol.slack + self.policy.budget * ran.astype(jnp.float32),
            ar_run=pol.ar_run + ran,
            stretched=pol.stretched + ran,
        )
        # Prompt lookup learns from the stretch's tokens: at the roots inside it, at once; the proposals put aside
        # before it as every step's are; then the next step's match is put aside.
        pol = self._stretch_lookups(pld, ds.pld.length, pol)
        if self._observes_stretch(ctx):
            pol = self._stretch_drafts(ctx, state, ds.ring, verdict, pol)
        match = self._match(pld)
        pol, lookup = self._lookup_step(state, pld, ds.lookup, pol, match)
        return AutoState(pld, ring, pol, ds.shadow, match, lookup)

    def _observes_stretch(self, ctx: DraftContext) -> bool:
        """Whether the draft's first depth is learnt at the roots a stretch passed (`_stretch_drafts`): with a
        draft, `AutoPolicy.stretch_observe`, and drafts whose first depth is accepted iff it equals the emitted
        token (T = 0, or deterministic trees at T > 0; a sampled chain's acceptance needs the target's p at
        each root, which an AR step does not keep)."""
        s = ctx.sampling
        return self.longspec is not None and self.policy.stretch_observe and (s.greedy or not s.sample_drafts)

    def _stretch_drafts(self, ctx: DraftContext, state, ring, verdict: Verdict, pol: PolicyState) -> PolicyState:
        """The draft's first level at every root the stretch passed, in one teacher-forced pass
        (`LongSpecDrafter.first_children`: the draft layer and its pruned head over the stretch's k roots),
        checked against the token the target emitted there: ls-chain's
        first depth (the best child) and ls-tree's (any child of its first level). A shadow draft, ~0.2 AR
        steps, observes one root; a stretch observes up to 16, so where AR runs most of the time the draft's
        first-depth rate is known from the run's own text rather than from 3-7 looks."""
        K = self.stretch_limit
        toks = verdict.path_tokens  # [B, K + 1]: the stretch's roots, then the root after it
        start = state.cache.lengths - verdict.count
        w = self.longspec.tree.widths[0]
        top = self.longspec.first_children(sub_context(ctx), ring, state.cache, toks[:, :K], start, width=w)
        nxt = toks[:, 1 : K + 1]
        valid = jnp.arange(K)[None] < verdict.count[:, None]
        fams = self.families
        if "ls-chain" in fams:
            pol = self.observe_first(pol, fams.index("ls-chain"), top[..., 0] == nxt, valid)
        return self.observe_first(pol, fams.index("ls-tree"), jnp.any(top == nxt[..., None], axis=-1), valid)

    def _stretch_lookups(self, pld: History, before: jax.Array, pol: PolicyState) -> PolicyState:
        """Prompt lookup's would-be proposals at the roots a stretch passed (history lengths before + 1 .. its
        end - 1; the roots before and after it are put aside as every step's are), each checked against the
        stretch's tokens. Without it a copy that starts inside a stretch is noticed only steps after it ends."""
        K = self.stretch_limit - 1
        if K <= 0:
            return pol
        D = max(self.pld_tokens)
        lengths = before[:, None] + 1 + jnp.arange(K)[None]  # [B, K]
        count = jnp.clip(pld.length[:, None] - lengths, 0, D).reshape(-1)  # tokens committed after each root
        hist = History(jnp.repeat(pld.tokens, K, axis=0), jnp.minimum(lengths, pld.length[:, None]).reshape(-1))
        n, start, avail = self._match(hist)
        n = jnp.where(count > 0, n, 0)
        return self.lookup_shadow(pol, n, avail, _window(hist, start, D), _window(hist, hist.length, D), count)

    def root_logp_wanted(self, ctx: DraftContext, state) -> jax.Array | bool:
        """Only the step right after a shadow was drafted at T > 0 (`DraftShadow.first_accept`)."""
        shadow = state.draft.shadow
        return self.shadows and shadow.logq.shape[1] > 0 and jnp.any(shadow.fresh)

    def update(self, ctx: DraftContext, state, ds: AutoState, verdict: Verdict) -> AutoState:
        """After the engine's commit (once per step, whichever candidate ran; `verdict` is the accepted path as
        a chain, `verdict.extras` a `SwitchExtras`: the candidate's index): every sub-drafter sees the committed
        tokens, the candidate that ran updates its family's rates, and prompt lookup learns from the committed
        tokens."""
        pld = self._pld(max(self.pld_tokens)).update(ctx, state, ds.pld, verdict)
        if self.streams_draft is not None:  # the draft takes the target's streams along the path
            aux_verdict = dataclasses.replace(verdict, extras=verdict.extras.aux)
            ring = self.streams_draft.update(sub_context(ctx, self.sub_key), state, ds.ring, aux_verdict)
        elif self.longspec is not None:
            ring = self.longspec.update(sub_context(ctx), state, ds.ring, verdict)
        else:
            ring = ()
        n, _, avail = ds.match  # the match the step was chosen and drafted with (old history)
        costs = self._costs(ctx)
        active = verdict.count > 0
        # One small branch per candidate: the policy state is a few hundred floats, so this switch is cheap.
        learners = [functools.partial(self._learn_at, i) for i in range(len(self.candidates))]
        operands = (ds.policy, costs, n, avail, verdict.num_accepted, active, state.steps)
        ran = verdict.extras.index
        pol = jax.lax.switch(ran, learners, *operands)
        pol = dataclasses.replace(pol, ar_run=jnp.where(ran == 0, pol.ar_run + 1, 0))
        # Prompt lookup learns from the committed tokens through its put-aside proposals (`_lookup_step`): the
        # one this step was chosen with sits in the slot whose base is the history's length before the commit.
        # A prompt-lookup step taught its family itself (`learn`): that slot skips the depths it saw.
        lookup = ds.lookup
        depth = jnp.asarray([c.drafter.max_depth if c.kind == "pld" else 0 for c in self.candidates])[ran]
        taught = jnp.minimum(verdict.count, depth)[:, None]  # [B, 1]; 0 unless prompt lookup ran
        mine = lookup.pending & (lookup.base == ds.pld.length[:, None])
        lookup = dataclasses.replace(lookup, seen=jnp.where(mine, jnp.maximum(lookup.seen, taught), lookup.seen))
        match = self._match(pld)  # the next step's
        pol, lookup = self._lookup_step(state, pld, lookup, pol, match)
        if not self.shadows:
            return AutoState(pld, ring, pol, ds.shadow, match, lookup)
        shadow = ds.shadow.score_first(verdict.emitted()[:, 0], verdict.extras.root_logp, active)
        pol, shadow = self._shadow_step(ctx, state, pld, ring, shadow, pol, costs, match)
        return AutoState(pld, ring, pol, shadow, match, lookup)

    def _lookup_step(self, state, pld: History, lookup: LookupShadow, pol: PolicyState, match):
        """Put-aside prompt-lookup proposals teach the depths whose tokens were committed since they were last
        checked (a slot is free again once a depth failed or every depth it can be tried at was checked); then
        the new root's match, if there is one, is put aside in this step's slot."""
        B, R, D = lookup.tokens.shape
        committed = jnp.clip(pld.length[:, None] - lookup.base, 0, D)  # [B, R] depths whose token is known
        ready = lookup.pending & (committed > lookup.seen)

        def observe(args):
            pol, lookup = args
            following = _window(pld, lookup.base, D).reshape(B, R, D)
            n = jnp.where(ready, lookup.n, 0).reshape(-1)
            tokens, avail, known = lookup.tokens, lookup.avail, committed
            pol = self.lookup_shadow(
                pol,
                n,
                avail.reshape(-1),
                tokens.reshape(B * R, D),
                following.reshape(B * R, D),
                known.reshape(-1),
                lookup.seen.reshape(-1) + 1,
            )
            d = jnp.arange(1, D + 1)
            same = (tokens == following) & (d <= known[..., None])
            matched = jnp.sum(jnp.cumprod(same, axis=-1), axis=-1)  # [B, R]
            over = (matched < jnp.minimum(known, avail)) | (known >= jnp.minimum(avail, D))
            pending = lookup.pending & ~(ready & over)
            return pol, dataclasses.replace(lookup, pending=pending, seen=jnp.where(ready, known, lookup.seen))

        pol, lookup = jax.lax.cond(jnp.any(ready), observe, lambda args: args, (pol, lookup))
        n, start, avail = match
        slot = state.steps % R
        fresh = ~lookup.pending[:, slot] & (n > 0) & ~state.done  # [B]
        proposal = _window(pld, start, D)

        def put(old, new):  # old [B, R, ...], new [B, ...]: row b's slot gets new where fresh
            keep = fresh.reshape((-1,) + (1,) * (new.ndim - 1))
            return old.at[:, slot].set(jnp.where(keep, new, old[:, slot]))

        lookup = LookupShadow(
            put(lookup.tokens, proposal),
            put(lookup.n, n),
            put(lookup.avail, avail),
            put(lookup.base, pld.length),
            put(lookup.pending, jnp.ones_like(fresh)),
            put(lookup.seen, jnp.zeros_like(n)),
        )
        return pol, lookup

    def _shadow_step(self, ctx, state, pld: History, ring, shadow: DraftShadow, pol: PolicyState, costs, match):
        """After the commit: a shadow whose tokens are all committed teaches the draft's families; then, when
        one is due and affordable, the draft proposes at the new root and its proposal is put aside."""
        D = self._shadow_depth
        n, start, avail = match
        ready = shadow.pending & (pld.length >= shadow.base + D)

        def observe(pol):
            following = _window(pld, shadow.base, D)
            got = shadow_accepts(shadow, following, self.longspec.tree.level_offsets())
            live = (~state.done).astype(jnp.float32)
            return self.observe_shadow(pol, costs, n, avail, live, ready, got, state.steps)

        # Most steps resolve no shadow: skip the bookkeeping then (an AR step is ~70 ms; every op counts).
        pol = jax.lax.cond(jnp.any(ready), observe, lambda pol: pol, pol)
        shadow = dataclasses.replace(shadow, pending=shadow.pending & ~ready)
        waiting = jnp.any(shadow.pending & ~state.done)
        due = (pol.force < 0) & ~waiting & self.shadow_due(pol, costs, state.steps)
        run = ((pol.force == len(self.candidates)) | due) & jnp.any(~state.done)

        def draft(args):
            pol, shadow = args
            # The deterministic tree at every temperature: its match with the emitted tokens is what
            # verification accepts at T = 0 (and what sample-and-match accepts at T > 0).
            sub = sub_context(ctx)
            sub = dataclasses.replace(sub, sampling=dataclasses.replace(sub.sampling, draft_sampling="greedy"))
            if shadow.logq.shape[1]:  # sampled drafts: also q at the root (`DraftShadow.first_accept`)
                tree, logq = self.longspec.propose_with_root_q(sub, state, ring, state.key)
            else:
                tree, logq = self.longspec.propose(sub, state, ring, state.key), shadow.logq
            H = self.hybrid_pld
            chain = _window(pld, start, H)
            return self.start_shadow(pol, costs), DraftShadow.record(tree, chain, n, avail, pld.length, logq)

        return jax.lax.cond(run, draft, lambda args: args, (pol, shadow))


def _ready(ctx: DraftContext):
    """The candidates whose programs are loaded (`AutoDrafter.ready_params`), None: all."""
    dp = ctx.draft_params
    return dp.get("ready") if isinstance(dp, dict) else None


def _window(hist: History, start: jax.Array, n: int) -> jax.Array:
    """[B, ..., n] history tokens from index start [B, ...] on (clipped to the buffer; callers mask what is past
    it)."""
    idx = jnp.clip(start[..., None] + jnp.arange(n), 0, hist.tokens.shape[1] - 1)
    flat = jnp.take_along_axis(hist.tokens, idx.reshape(idx.shape[0], -1), axis=1)
    return flat.reshape(idx.shape)


def auto_params(drafter: AutoDrafter, longspec_params=None, costs=None, eagle3_params=None, dflash_params=None) -> dict:
    """The draft params `auto` runs with: the LongSpec (or EAGLE-3, or DFlash) draft's, and the per-candidate costs
    (the built-in prior unless given; `lsjax.methods.auto.profile` measures them)."""
    from lsjax.methods.auto.profile import prior_costs

    if costs is not None and np.shape(costs) != (len(drafter.cost_names),):
        raise ConfigError(
            f"auto costs: need one per entry of {drafter.cost_names} (shape ({len(drafter.cost_names)},)), "
            f"got shape {np.shape(costs)}"
        )
    out = {"costs": jnp.asarray(prior_costs(drafter) if costs is None else costs, jnp.float32)}
    if longspec_params is not None:
        out["longspec"] = longspec_params
    if eagle3_params is not None:
        out["eagle3"] = eagle3_params
    if dflash_params is not None:
        out["dflash"] = dflash_params
    return out


def with_shipped_choice(model, opts):
    """`opts` naming the shipped draft the target's `auto.json` chose, where no draft is given and auto runs one
    (`without_draft`); unchanged otherwise."""
    from lsjax.methods.auto.config import shipped_choice, without_draft

    given = opts.draft not in (None, "shipped") or opts.eagle3 is not None or opts.dflash is not None
    if given or model.path is None or without_draft(opts):
        return opts
    choice = shipped_choice(model.path)
    if choice is None or choice[0] == "longspec":
        return opts
    method, path = choice
    return dataclasses.replace(opts, draft=None, **{method: path})


def build_auto(model, opts, cache) -> tuple[AutoDrafter, dict]:
    """`--method auto` (`lsjax.methods.auto.config.AutoOptions`): the draft given or shipped for the target, or
    AR and prompt lookup alone where there is none."""
    from lsjax.methods import registry
    from lsjax.methods.auto.config import CPU_PLD_TOKENS, DRAFT_WORDS, without_draft
    from lsjax.methods.dflash.checkpoint import is_dflash_dir
    from lsjax.methods.eagle3.checkpoint import is_eagle3_dir
    from lsjax.methods.hybrid.config import combined_tree
    from lsjax.methods.longspec.checkpoint import default_draft_path

    shape = {k: getattr(opts, k) for k in ("pld_tokens", "chains", "hybrid_pld") if getattr(opts, k) is not None}
    opts = with_shipped_choice(model, opts)
    df = opts.dflash or (opts.draft if opts.draft not in DRAFT_WORDS and is_dflash_dir(opts.draft) else None)
    if df is not None:
        if opts.dflash and opts.draft:
            raise ConfigError("auto: give one draft, --draft (LongSpec's, EAGLE-3's or DFlash's) or --dflash, not both")
        df_tree = opts.dflash_tree or ("cpu" if jax.default_backend() == "cpu" else "small")
        sub, sub_params = registry.build("dflash", model, cache=cache, draft=df, dflash_tree=df_tree)
        shape.pop("hybrid_pld", None)
        drafter = AutoDrafter(
            dflash=sub,
            hybrid_pld=0,
            pld_ngram=opts.pld_ngram,
            policy=opts.policy,
            cost_profile=opts.cost_profile,
            **shape,
        )
        return drafter, auto_params(drafter, dflash_params=sub_params)
    e3 = opts.eagle3 or (opts.draft if opts.draft not in DRAFT_WORDS and is_eagle3_dir(opts.draft) else None)
    if e3 is not None:
        if opts.eagle3 and opts.draft:
            raise ConfigError("auto: give one draft, --draft (LongSpec's or EAGLE-3's) or --eagle3, not both")
        e3_tree = opts.eagle_tree or ("cpu" if jax.default_backend() == "cpu" else "small")
        sub, sub_params = registry.build("eagle3", model, cache=cache, draft=e3, eagle_tree=e3_tree)
        shape.pop("hybrid_pld", None)
        drafter = AutoDrafter(
            eagle3=sub,
            hybrid_pld=0,
            pld_ngram=opts.pld_ngram,
            policy=opts.policy,
            cost_profile=opts.cost_profile,
            **shape,
        )
        return drafter, auto_params(drafter, eagle3_params=sub_params)
    if without_draft(opts):
        ls, params = None, None  # `--draft none`, or the CPU default (`without_draft`)
        if "pld_tokens" not in shape and jax.default_backend() == "cpu":
            shape["pld_tokens"] = CPU_PLD_TOKENS
    elif opts.draft in (None, "shipped") and (model.path is None or default_draft_path(model.path) is None):
        import warnings

        from lsjax.errors import MethodNote
        from lsjax.methods.longspec.checkpoint import target_key

        ls, params = None, None  # no draft shipped for this target: AR and prompt lookup only
        name = target_key(model.path) if model.path is not None else model.config.name
        warnings.warn(
            f"no LongSpec draft for {name}: auto uses AR and prompt lookup only (pass --draft DIR)", MethodNote, 2
        )
    else:  # a draft given (or shipped) is used, or its error (missing, corrupt, another target's) is raised
        # The tree candidate (and the shadow the chains are read from): not the draft's shipped tree (see there).
        ls, params = registry.build("longspec", model, cache=cache, draft=opts.draft, tree=combined_tree(opts.tree))
    drafter = AutoDrafter(
        longspec=ls, pld_ngram=opts.pld_ngram, policy=opts.policy, cost_profile=opts.cost_profile, **shape
    )
    return drafter, auto_params(drafter, params)
