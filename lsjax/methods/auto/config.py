"""auto's decode options and its policy's constants."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from lsjax.config import ConfigError
from lsjax.methods.hybrid.config import COMBINED_TREE
from lsjax.methods.longspec.config import LongSpecOptions
from lsjax.methods.pld.config import PLD_NGRAM, check_at_least_one
from lsjax.methods.registry import option


@dataclasses.dataclass(frozen=True)
class AutoPolicy:
    # Tuned on scripted acceptances (tests/test_auto.py's simulator; copy, chain, tree, nothing, and changes
    # of text): a ~20-observation memory and a narrow confidence width kept >= 0.89 of the best's speed in all.
    decay: float = 0.95  # per observation of a family
    prior_weight: float = 1.5  # pseudo-observations behind each prior rate
    probe_min: int = 8  # fewest steps between two looks at a group (shadow drafts or probes)
    probe_max: int = 64  # ... and most, for a group that cannot win enough to pay for looking more often
    # Between those, a group's interval doubles while it ranks below the rest and resets when it wins (0), or,
    # with explore_share > 0, its next look is spaced by what it can win (`PolicyRules._backoff`): exploration
    # may spend that share of the speedup the group would give were its first-depth rate `explore_optimism` std
    # above its estimate, at this device's costs (0.25 and 1.0 tried). Not the default: scripted it found the
    # draft sooner after a change of text, but on real prompts it lost at T=0: its longer quiet spells made
    # longer AR stretches, inside which prompt lookup is not observed, and lookup started later or never
    # (docs/design/auto-policy.md).
    explore_share: float = 0.0
    explore_optimism: float = 1.0
    optimism: float = 0.25  # confidence width (binomial std units) a probe's optimistic score adds
    # The never-slower budget (module doc): a run may spend at most `budget` of its AR-equivalent time, plus
    # `initial_slack` AR steps, on steps that accept less than they cost. Held-out prompts lost up to 18% to
    # exploration without it (docs/design/auto-policy.md). With shadow drafts (~0.2 AR steps each) 1% of a 64-token
    # run and half a step still buy ~5 looks at the draft; with probes (3%, 1 step) it bought 2-3 probes.
    budget: float = 0.01
    initial_slack: float = 0.5
    # ... except a candidate that pays even at the low end of its rates' confidence range (binomial std units):
    # that is evidence, not exploration (prompt lookup, observed every step for free, gets there within a few
    # steps of copying text; without this exception the budget kept pld-8 off a held-out code prompt: 1.44x
    # instead of 1.60x). 2 std: at 1, a 0.2 rate seen ~10 times cleared its low end by chance often enough to
    # overdraw the 1% budget in the simulator.
    confidence: float = 2.0
    # ... once its family's depth-1 rate rests on this many observations beyond the prior (one lucky look at a
    # family is not evidence).
    evidence: float = 3.0
    # Explore the draft's candidates with shadow drafts (`lsjax.methods.auto.shadow`: draft only, check the
    # proposal against the tokens that follow; ~0.2 AR steps) instead of probes that run them (a failed probe
    # costs 1.3-2.3x an AR step for one token). Shadows are scheduled like probes (probe_min .. probe_max).
    shadow: bool = True
    # The profile times each candidate forced, in isolation; mixed into a run, speculative steps cost more than
    # that, so each step's cost above AR's is scaled by 1 + cost_margin, in choosing and in the budget alike.
    # Fitted on dev runs: the margin that makes the profile predict the measured speed had a median near 0.2
    # and a wide spread (docs/design/auto-policy.md).
    cost_margin: float = 0.2
    # At T > 0 with sampled drafts, shadows score the draft chain's first depth as the probability that
    # rejection sampling accepts it (`DraftShadow.first_accept`); False: as the greedy token's match (biased low).
    sampled_first: bool = True
    # Once AR has run 2+ steps in a row (no shadow waiting, no exploration due or affordable yet), up to this
    # many AR steps run back to back in an inner loop with none of the policy's per-step work but a check that
    # no prompt-lookup match the policy would run has turned up, the sub-drafters caught up once after
    # (`engine.step.ar_stretch`); the length grows with the AR run (2, 4, 8, ...). 0: every step is a policy step.
    stretch: int = 16
    # After a stretch, the draft's first level is computed at every root it passed in one pass and checked
    # against the emitted tokens (`AutoDrafter._stretch_drafts`): the chain's and the tree's first-depth rates
    # learnt from up to 16 roots, where a shadow draft sees one. Not the default: the estimates it gives are
    # right (the same children as a proposal at each root, tested), but with the draft near its break-even the
    # rate of all the roots keeps the policy on AR where the default, from a few looks and then the chain's own
    # steps, runs the chain when it pays: auto ran the draft less, and slower (docs/design/auto-policy.md).
    stretch_observe: bool = False

    def __post_init__(self):
        if not (isinstance(self.stretch, int) and not isinstance(self.stretch, bool) and 0 <= self.stretch <= 256):
            raise ConfigError(f"auto.stretch: must be an integer in [0, 256] (AR steps), got {self.stretch!r}")
        if not 0.0 < self.decay < 1.0:
            raise ConfigError(f"auto.decay: must be in (0, 1), got {self.decay!r}")
        if not self.prior_weight > 0:
            raise ConfigError(f"auto.prior_weight: must be > 0, got {self.prior_weight!r}")
        if not (isinstance(self.probe_min, int) and isinstance(self.probe_max, int) and self.probe_min >= 1):
            raise ConfigError(f"auto.probe_min/probe_max: must be integers >= 1, got {self.probe_min!r}")
        if self.probe_max < self.probe_min:
            raise ConfigError(f"auto.probe_max: must be >= probe_min={self.probe_min}, got {self.probe_max}")
        if not (isinstance(self.explore_share, (int, float)) and 0.0 <= self.explore_share <= 1.0):
            raise ConfigError(f"auto.explore_share: must be a float in [0, 1], got {self.explore_share!r}")
        if not (isinstance(self.explore_optimism, (int, float)) and 0.0 <= self.explore_optimism <= 10.0):
            raise ConfigError(
                f"auto.explore_optimism: must be a float in [0, 10] (std units), got {self.explore_optimism!r}"
            )
        if not self.optimism >= 0:
            raise ConfigError(f"auto.optimism: must be >= 0, got {self.optimism!r}")
        if not (isinstance(self.budget, (int, float)) and 0.0 < self.budget <= 1.0):
            raise ConfigError(f"auto.budget: must be a float in (0, 1], got {self.budget!r}")
        if not (isinstance(self.confidence, (int, float)) and self.confidence >= 0):
            raise ConfigError(f"auto.confidence: must be a float >= 0 (std units), got {self.confidence!r}")
        if not (isinstance(self.initial_slack, (int, float)) and self.initial_slack >= 0):
            raise ConfigError(f"auto.initial_slack: must be a float >= 0 (AR steps), got {self.initial_slack!r}")
        if not (isinstance(self.cost_margin, (int, float)) and 0.0 <= self.cost_margin <= 10.0):
            raise ConfigError(f"auto.cost_margin: must be a float in [0, 10], got {self.cost_margin!r}")
        if not (isinstance(self.evidence, (int, float)) and self.evidence >= 0):
            raise ConfigError(f"auto.evidence: must be a float >= 0 (observations), got {self.evidence!r}")
        for name in ("shadow", "sampled_first", "stretch_observe"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"auto.{name}: must be a bool, got {getattr(self, name)!r}")


def _ints(v):
    """A candidate set: a lone number (a flag, a bench variant) is a one-element tuple; '4/8' as well."""
    if isinstance(v, str):
        return tuple(int(x) for x in v.replace("/", ",").split(",") if x)
    return (v,) if isinstance(v, int) else v


@dataclasses.dataclass(frozen=True)
class AutoOptions(LongSpecOptions):
    draft: str | None = option(
        None,
        "a draft checkpoint (directory: LongSpec's or an EAGLE-3 one), 'random' (untrained), 'shipped' (the "
        "target's shipped draft) or 'none' (AR and prompt lookup only); default: the shipped one, on a CPU none "
        "(there its programs cost more to load than its steps save: docs/methods/auto.md)",
    )
    tree: str | None = option(None, f"the draft's tree candidate, as for longspec (default {COMBINED_TREE} on a CPU)")
    pld_tokens: tuple[int, ...] | None = option(
        None, "prompt-lookup chain lengths among the candidates (4,8; on a CPU without the draft 8)", parse=_ints
    )
    pld_ngram: int = option(PLD_NGRAM, "longest n-gram matched")
    chains: tuple[int, ...] | None = option(None, "the draft's chain depths among the candidates", flag=False)
    eagle3: str | None = option(
        None,
        "an EAGLE-3 draft's chains and dynamic tree among the candidates instead of LongSpec's (a directory in "
        "either published layout, or 'random'); --draft DIR of an EAGLE-3 draft does the same",
    )
    eagle_tree: str | None = option(
        None, "the EAGLE-3 draft's tree candidate, as for eagle3 (default: cpu on a CPU, else small)"
    )
    dflash: str | None = option(
        None,
        "a DFlash draft's chains and tree among the candidates instead of LongSpec's (a directory, or 'random'); "
        "--draft DIR of a DFlash draft does the same",
    )
    dflash_tree: str | None = option(
        None, "the DFlash draft's tree candidate, as for dflash (default: cpu on a CPU, else small)"
    )
    hybrid_pld: int | None = option(None, "the hybrid candidate's chain length; 0 = none", flag=False)
    cost_profile: str = option(
        "cached",
        "per-candidate step costs of this device; cached = measured once per prompt bucket (~15 s, in "
        "$LSJAX_PROFILE_DIR or $XDG_CACHE_HOME/lsjax/profiles) then reused; measure = measure again; prior = the "
        "built-in estimate, never measure",
        choices=("cached", "measure", "prior"),
    )
    policy: AutoPolicy = option(
        AutoPolicy(), "the policy's constants (bench variants: auto:shadow=0,budget=0.03)", flag=False
    )

    EXTRA_OPTIONS: ClassVar[tuple[str, ...]] = tuple(f.name for f in dataclasses.fields(AutoPolicy))

    def __post_init__(self):
        for name in ("pld_tokens", "chains"):
            v = getattr(self, name)
            if v is not None:
                object.__setattr__(self, name, _ints(v))
                check_at_least_one(self, name)
        check_at_least_one(self, "pld_ngram")
        if self.cost_profile not in ("cached", "measure", "prior"):
            raise ConfigError(f"cost_profile: must be cached, measure or prior, got {self.cost_profile!r}")

    @classmethod
    def from_values(cls, **values) -> AutoOptions:
        """Options from flat values: a name of an AutoPolicy field sets the policy ("auto:shadow=0,budget=0.03")."""
        fields = {f.name: f.type for f in dataclasses.fields(AutoPolicy)}
        policy = {}
        for k in [k for k in values if k in fields]:  # bench variants pass numbers as int or float, flags as 0 / 1
            v = values.pop(k)
            t = fields[k]
            policy[k] = bool(v) if t == "bool" else int(v) if t == "int" else float(v)
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known}, policy=AutoPolicy(**policy))


def draft_info(opts: AutoOptions) -> dict | None:
    """`--json`'s "draft" field: the EAGLE-3 or DFlash draft's (directory and layout) when auto runs one, else the
    LongSpec draft's."""
    from lsjax.methods.dflash.checkpoint import draft_info as dflash_info
    from lsjax.methods.dflash.checkpoint import is_dflash_dir
    from lsjax.methods.eagle3.checkpoint import draft_info as eagle3_info
    from lsjax.methods.eagle3.checkpoint import is_eagle3_dir
    from lsjax.methods.longspec.checkpoint import draft_info as longspec_info

    if opts.dflash:
        return dflash_info(dataclasses.replace(opts, draft=opts.dflash))
    if opts.draft not in DRAFT_WORDS and is_dflash_dir(opts.draft):
        return dflash_info(opts)
    if opts.eagle3:
        return eagle3_info(dataclasses.replace(opts, draft=opts.eagle3))
    if opts.draft not in DRAFT_WORDS and is_eagle3_dir(opts.draft):
        return eagle3_info(opts)
    if without_draft(opts):
        return {"dir": "none", "format": "none"}
    return longspec_info(opts)


# Prompt lookup's chains in the draft-less auto on a CPU: 8 alone. There a 9-node verify costs about what a
# 5-node one does, so the 4-token chain almost never wins, while its program costs every first start a compile
# and a profile measurement (docs/design/auto-policy.md).
CPU_PLD_TOKENS = (8,)

DRAFT_WORDS = (None, "random", "shipped", "none")  # `--draft` values that name no directory


def without_draft(opts: AutoOptions) -> bool:
    """Whether auto runs without a draft by choice: `--draft none`, or no `--draft` on a CPU, where the draft's
    program groups cost more to load beside the decode than its steps save (docs/design/auto-policy.md)."""
    import jax

    given = opts.eagle3 is not None or opts.dflash is not None
    return not given and (opts.draft == "none" or (opts.draft is None and jax.default_backend() == "cpu"))


AUTO_CHOICE = "auto.json"  # lsjax/drafts/<target>/auto.json: {"draft": <method>}, the shipped draft auto runs
CHOOSABLE = ("longspec", "eagle3", "dflash")


def shipped_choice(model_path) -> tuple[str, str] | None:
    """(method, directory) of the shipped draft `auto` runs for a target when no draft is given, as the target's
    `auto.json` names it (`python -m tools.ship_draft --auto` writes it, choosing on dev); None without one,
    where auto runs the LongSpec draft at `lsjax/drafts/<target>/` if one ships."""
    import json

    from lsjax.errors import ModelNotFoundError
    from lsjax.methods.longspec.checkpoint import shipped_dir, shipped_draft

    f = shipped_dir(model_path) / AUTO_CHOICE
    if not f.is_file():
        return None
    try:
        method = json.loads(f.read_text())["draft"]
    except (ValueError, KeyError, TypeError):
        raise ConfigError(f'{f}: must be {{"draft": one of {", ".join(CHOOSABLE)}}}') from None
    if method not in CHOOSABLE:
        raise ConfigError(f"{f}: draft must be one of {', '.join(CHOOSABLE)}, got {method!r}")
    kind = "" if method == "longspec" else method
    if (path := shipped_draft(model_path, kind)) is None:
        raise ModelNotFoundError(f"{f} names the {method} draft, but {shipped_dir(model_path, kind)} holds none")
    return method, str(path)
