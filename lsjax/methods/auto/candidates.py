"""`auto`'s candidate steps: what each is (AR, a prompt-lookup chain, a draft chain or tree, the hybrid), the
acceptance family it learns into, the probe group it is explored in, and the prior its rates start from.

`lsjax.methods.auto.drafter` decides which one runs; the engine runs it as a `CandidateStep`, a fixed-shape drafter
over auto's shared state (`Drafter.step_variants`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np

from lsjax.engine.types import ARDrafter, DraftContext, Drafter
from lsjax.methods.hybrid.drafter import HybridDrafter
from lsjax.tree import Tree, TreeConfig, root_only


@dataclasses.dataclass(frozen=True)
class Candidate:
    name: str
    kind: str  # "ar" | "pld" | "ls" | "hybrid" | "e3" (an EAGLE-3 draft's chain or tree) | "df" (a DFlash draft's)
    drafter: Drafter
    family: int  # row of the acceptance statistics (pld: the 1-gram family; + n - 1 for an n-gram match)
    group: int  # probe group (-1: AR, never probed)


# Prior per-depth rates P(node d accepted | node d - 1 accepted), greedy and sampled (T > 0). Deliberately
# modest: the first steps of a run lean towards AR, the data decide within a few steps.
PRIORS = {
    "pld1": ((0.25, 0.55, 0.65, 0.7), (0.15, 0.45, 0.55, 0.6)),
    "pld2": ((0.4, 0.65, 0.75, 0.8), (0.25, 0.5, 0.6, 0.65)),
    "pld3": ((0.55, 0.75, 0.8, 0.85), (0.35, 0.6, 0.65, 0.7)),
    "ls-chain": ((0.4, 0.5, 0.5, 0.5), (0.3, 0.4, 0.4, 0.4)),
    "ls-tree": ((0.5, 0.5, 0.5, 0.5), (0.4, 0.4, 0.4, 0.4)),
    "hybrid": ((0.55, 0.65, 0.7, 0.75), (0.4, 0.5, 0.55, 0.6)),
    # An EAGLE-3 draft's: as modest as LongSpec's (published drafts report ~0.6-0.7 first-token acceptance on
    # their targets, an untrained one ~0; the run's own probes decide).
    "e3-chain": ((0.4, 0.5, 0.5, 0.5), (0.3, 0.4, 0.4, 0.4)),
    "e3-tree": ((0.5, 0.5, 0.5, 0.5), (0.4, 0.4, 0.4, 0.4)),
    # A DFlash draft's: as modest (published drafts report 6-7 tokens per block on their targets, an untrained one
    # ~1; the run's own probes decide).
    "df-chain": ((0.4, 0.5, 0.5, 0.5), (0.3, 0.4, 0.4, 0.4)),
    "df-tree": ((0.5, 0.5, 0.5, 0.5), (0.4, 0.4, 0.4, 0.4)),
}


@dataclasses.dataclass(frozen=True)
class CandidateStep(Drafter):
    """Candidate `index` of `auto` as a fixed-shape drafter over the shared AutoState."""

    auto: Drafter
    index: int

    name = "auto"

    @property
    def _c(self) -> Candidate:
        return self.auto.candidates[self.index]

    @property
    def tree(self) -> TreeConfig:
        return self._c.drafter.tree

    @property
    def max_depth(self) -> int:
        return self._c.drafter.max_depth

    @property
    def num_nodes(self) -> int:
        return self._c.drafter.num_nodes

    def propose(self, ctx: DraftContext, state, draft_state: Any, key) -> Tree:
        c = self._c
        if c.kind == "ar":
            return root_only(state.root)
        if c.kind == "pld":
            return c.drafter.propose(ctx, state, draft_state.pld, key)
        if c.kind == "ls":
            return c.drafter.propose(sub_context(ctx), state, draft_state.ring, key)
        if c.kind == "e3":
            return c.drafter.propose(sub_context(ctx, "eagle3"), state, draft_state.ring, key)
        if c.kind == "df":
            return c.drafter.propose(sub_context(ctx, "dflash"), state, draft_state.ring, key)
        return c.drafter.propose(sub_context(ctx), state, (draft_state.pld, draft_state.ring), key)


def sub_context(ctx: DraftContext, draft: str = "longspec") -> DraftContext:
    """The context a draft's sub-drafters see: its own params (`draft`: "longspec", "eagle3" or "dflash"), not auto's
    {draft, "costs"} dict."""
    dp = ctx.draft_params
    return dataclasses.replace(ctx, draft_params=dp.get(draft) if isinstance(dp, dict) else None)


def prior_rates(family: str, depth: int, greedy: bool) -> list[float]:
    rates = PRIORS[family][0 if greedy else 1]
    return [rates[min(d, len(rates) - 1)] for d in range(depth)]


@functools.cache
def families_of(auto: Drafter) -> tuple[str, ...]:
    out = [f"pld{min(n, 3)}" for n in range(1, auto.pld_ngram + 1)]
    if auto.longspec is not None:
        out += ["ls-chain", "ls-tree"] + (["hybrid"] if auto.hybrid_pld else [])
    if auto.eagle3 is not None:
        out += ["e3-chain", "e3-tree"]
    if auto.dflash is not None:
        out += ["df-chain", "df-tree"]
    return tuple(out)


@functools.cache
def candidates_of(auto: Drafter) -> tuple[Candidate, ...]:
    fams = families_of(auto)
    out = [Candidate("ar", "ar", ARDrafter(), -1, -1)]
    # Prompt lookup learns from every step for free (`AutoDrafter.lookup_shadow`): never probed.
    out += [Candidate(f"pld-{k}", "pld", auto._pld(k), 0, -1) for k in sorted(auto.pld_tokens)]
    ls = auto.longspec
    if ls is not None:
        groups = 0  # probe groups, numbered densely in order
        if auto.chains:
            chain = fams.index("ls-chain")
            for k in sorted(auto.chains):
                tree = TreeConfig((1,) * k)
                out.append(Candidate(f"ls-chain{k}", "ls", dataclasses.replace(ls, tree=tree), chain, groups))
            groups += 1
        out.append(Candidate("ls-tree", "ls", ls, fams.index("ls-tree"), groups))
        groups += 1
        if auto.hybrid_pld:
            hyb = HybridDrafter(ls, auto._pld(auto.hybrid_pld))
            out.append(Candidate("hybrid", "hybrid", hyb, fams.index("hybrid"), groups))
    e3 = auto.eagle3
    if e3 is not None:
        from lsjax.methods.eagle3.drafter import Eagle3Tree

        groups = 0
        if auto.chains:  # the draft's greedy chain: a one-wide dynamic tree
            chain = fams.index("e3-chain")
            for k in sorted(auto.chains):
                budget = Eagle3Tree(k, k, 1)
                out.append(Candidate(f"e3-chain{k}", "e3", dataclasses.replace(e3, budget=budget), chain, groups))
            groups += 1
        out.append(Candidate("e3-tree", "e3", e3, fams.index("e3-tree"), groups))
    df = auto.dflash
    if df is not None:
        from lsjax.methods.dflash.drafter import DFlashTree

        groups = 0
        most = df.draft.block_size - 1  # a chain drafts at most the block's positions
        if auto.chains:  # the block's first k positions, the draft's top-1 at each
            chain = fams.index("df-chain")
            for k in sorted({min(k, most) for k in auto.chains}):
                step = dataclasses.replace(df, budget=DFlashTree(k, 1, k))
                out.append(Candidate(f"df-chain{k}", "df", step, chain, groups))
            groups += 1
        out.append(Candidate("df-tree", "df", df, fams.index("df-tree"), groups))
    return tuple(out)


@functools.cache
def members_of(auto: Drafter) -> np.ndarray:
    """[G, C] bool: the candidates of each probe group."""
    groups = 1 + max(c.group for c in auto.candidates)
    return np.asarray([[c.group == g for c in auto.candidates] for g in range(groups)])
