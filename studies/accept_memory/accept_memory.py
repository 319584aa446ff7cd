"""Does a fixed method's acceptance have a memory? One step per decode call, the accepted count of each step
recorded, then per prompt: the rate p of steps that accepted >= 1 node, and the rate after a step that did
(P(1|1)) and after one that did not (P(1|0)).

    python -m studies.accept_memory.accept_memory                                  # LongSpec one node, dev, T=0
    python -m studies.accept_memory.accept_memory --method longspec --opts tree=2 --steps 96

A rule that keeps a candidate running while its own recent steps pay (or drops it after a miss) can only beat
the average-rate rule `auto` uses where P(1|1) is well above P(1|0); near-equal rates mean the steps are close
to independent and the average is all there is to know. Dev split by default: the held-out one is not for
tuning a policy.
"""

from __future__ import annotations

import argparse
import json

import numpy as np


def memory(accepted: list[int]) -> tuple[float, float, float, int, int]:
    """(p, P(1|1), P(1|0), steps after a hit, steps after a miss) of one run's accepted counts."""
    a = (np.asarray(accepted) > 0).astype(int)
    prev, cur = a[:-1], a[1:]
    n1, n0 = int((prev == 1).sum()), int((prev == 0).sum())
    p11 = float(cur[prev == 1].mean()) if n1 else float("nan")
    p01 = float(cur[prev == 0].mean()) if n0 else float("nan")
    return float(a.mean()), p11, p01, n1, n0


def main(argv=None) -> int:
    from lsjax.prompts import BUCKETS, TASKS

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--method", default="longspec")
    p.add_argument("--opts", default="tree=1", help="the method's options, k=v,... (as a bench variant's)")
    p.add_argument("--suite", choices=("dev", "heldout"), default="dev")
    p.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS))
    p.add_argument("--buckets", nargs="+", choices=list(BUCKETS), default=list(BUCKETS))
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--steps", type=int, default=128, help="steps per prompt")
    p.add_argument("--json", metavar="FILE", help="also write every prompt's accepted counts here")
    args = p.parse_args(argv)
    if args.steps < 2:
        p.error(f"--steps: must be >= 2, got {args.steps}")
    from lsjax.bench.methods import parse_variant

    try:
        method, opts = parse_variant(f"run={args.method}:{args.opts}" if args.opts else f"run={args.method}")[1]
    except ValueError as e:
        p.error(f"--method/--opts: {e}")

    import jax
    import jax.numpy as jnp

    from lsjax.config import GenerateConfig, SamplingConfig
    from lsjax.engine.host import Generator
    from lsjax.engine.profiling import prefilled
    from lsjax.loading import load_model
    from lsjax.methods import registry
    from lsjax.models import target
    from lsjax.prompts import encode, load_suite

    model = load_model()
    params = jax.tree.map(jnp.asarray, target.prepare_for_decode(model.params, model.config))
    g = Generator(model.config, params, *registry.build(method, model, **opts))
    runs, totals = {}, np.zeros(4)
    print(f"{method}:{args.opts} on {args.suite}, T={args.temperature:g}, {args.steps} steps a prompt")
    for prompt in load_suite(model.tokenizer, args.suite, None, 1, args.tasks, args.buckets):
        ids = encode(model.tokenizer, prompt)
        # Room for every step to accept its whole tree: no step is cut short by the end of the run.
        new_tokens = args.steps * (g.drafter.max_depth + 1) + 8
        gen = GenerateConfig(new_tokens, SamplingConfig(temperature=args.temperature), ignore_eos=True)
        _, _, s, (_, decode, _) = prefilled(g, ids, gen)
        got, length = [], int(s.cache.lengths[0])
        for _ in range(args.steps):
            s = decode(g.params, g.draft_params, s, jnp.int32(int(s.steps) + 1))
            new = int(s.cache.lengths[0])
            got.append(new - length - 1)
            length = new
        runs[prompt.id] = got
        rate, p11, p01, n1, n0 = memory(got)
        totals += (p11 * n1 if n1 else 0, n1, p01 * n0 if n0 else 0, n0)
        print(f"{prompt.id:28s} p {rate:.2f}  P(1|1) {p11:.2f} ({n1})  P(1|0) {p01:.2f} ({n0})", flush=True)
    print(f"{'pooled':28s}         P(1|1) {totals[0] / totals[1]:.2f}  P(1|0) {totals[2] / totals[3]:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"method": method, "opts": args.opts, "T": args.temperature, "accepted": runs}, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
