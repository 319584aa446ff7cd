"""`auto`'s policy against scripted acceptances, scenario by scenario: how close its choices come to always
running the best candidate (1.000 = as fast as the best), looks at the draft included.

    python -m tests.auto_scenarios [--seeds 16] [--policy explore_share=0.25,explore_optimism=1]

Two cost profiles: the 2-core CPU's (tests/test_auto.py's COSTS) and a device where drafting is cheap
(`CHEAP`). No prompt-lookup match (the draft's families only). A scenario is phases of (steps, true rates);
"change" is 300 steps where nothing pays, then 300 where the draft does. Uses the simulator of
tests/test_auto.py (no model).
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np

from lsjax.methods.auto.config import AutoPolicy
from tests.test_auto import CHEAP, COSTS, FULL, simulate_accepted, speed, true_rates

SCENARIOS = {
    "nothing pays": [(600, {})],
    "weak draft": [(600, {"ls-chain": 0.03})],
    "close call": [(600, {"ls-chain": 0.1, "ls-tree": 0.15})],
    "chain 0.2": [(600, {"ls-chain": 0.2})],
    "chain 0.5": [(600, {"ls-chain": 0.5})],
    "tree": [(600, {"ls-tree": 0.6, "ls-chain": 0.3})],
    "change": [(300, {}), (300, {"ls-chain": 0.7, "ls-tree": 0.5})],
    "change back": [(300, {"ls-chain": 0.7}), (300, {})],
}


def efficiency(auto, costs, phases, seed: int) -> float:
    """The best candidate's time for the tokens emitted, per phase, over the time the policy took."""
    rates = [(k, true_rates(FULL, spec)) for k, spec in phases]
    chosen, accepted, shadow = simulate_accepted(auto, costs, rates, seed=seed, match=0)
    spent = np.sum(np.asarray(costs)[chosen] + shadow * (costs[-1] - costs[0]))
    usable = [i for i, c in enumerate(FULL.candidates) if c.kind in ("ar", "ls")]
    best_time, i = 0.0, 0
    for k, r in rates:
        best = max(speed(FULL, costs, r, c, 0) for c in usable)
        best_time += np.sum(accepted[i : i + k] + 1) / best
        i += k
    return float(best_time / spent)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=16)
    ap.add_argument("--policy", default="", help="AutoPolicy fields, e.g. explore_share=0.1,shadow=0")
    args = ap.parse_args(argv)
    kinds = {f.name: f.type for f in dataclasses.fields(AutoPolicy)}
    values = dict(kv.split("=") for kv in args.policy.split(",") if kv)
    cast = {"bool": lambda v: bool(int(v)), "int": int, "float": float}
    auto = dataclasses.replace(FULL, policy=AutoPolicy(**{k: cast[kinds[k]](v) for k, v in values.items()}))
    print(f"| scenario | CPU profile | cheap drafting |  ({args.seeds} seeds: mean, min)")
    print("|---|---|---|")
    for name, phases in SCENARIOS.items():
        cells = []
        for costs in (COSTS, CHEAP):
            eff = [efficiency(auto, costs, phases, s) for s in range(args.seeds)]
            cells.append(f"{np.mean(eff):.3f} ({np.min(eff):.3f})")
        print(f"| {name} | {cells[0]} | {cells[1]} |")


if __name__ == "__main__":
    main()
