"""Methods vs AR with repeats: each round runs every method once per prompt, back to back, and each method's
speed is divided by AR's from the same round (so machine noise between rounds cancels).

    python -m lsjax.bench.repeat --suite dev --per-cell 1 --max-new-tokens 128 --repeats 2 --temperatures 0 1

Prints per prompt and temperature the median (min-max) speedup over AR of every method (auto's choices go to
--out), then per temperature each method's mean speedup, auto's share of the best fixed method's mean and its
worst prompt. Prompts come from a suite (`lsjax.bench.suites`: dev, or heldout, which nothing is tuned on) or
a JSONL file (--prompts). Compiles and auto's cost profile happen in a warm-up outside the timed rounds.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np


def main(argv=None) -> int:
    from lsjax.bench.prompts import BUCKETS, TASKS

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--methods", nargs="+", default=["auto", "pld", "longspec", "hybrid"])
    p.add_argument("--suite", choices=("dev", "heldout"), default="dev")
    p.add_argument(
        "--cost-profile", choices=("cached", "measure", "prior"), default="measure", help="auto's (see decode.py)"
    )
    p.add_argument("--prompts", help='a JSONL file of {"id", "prompt"[, "chat"]} instead of the dev suite')
    p.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS))
    p.add_argument("--buckets", nargs="+", choices=list(BUCKETS), default=list(BUCKETS))
    p.add_argument("--per-cell", type=int, default=1)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    p.add_argument("--out", help="write every measurement here (JSON)")
    args = p.parse_args(argv)

    import jax
    import jax.numpy as jnp

    from lsjax.bench.suites import encode, load_suite
    from lsjax.config import GenerateConfig, SamplingConfig
    from lsjax.decoding import prompt_bucket
    from lsjax.drafters import registry
    from lsjax.generation import Generator
    from lsjax.loading import load_model
    from lsjax.models import target

    model = load_model()
    # One device copy of the decode-layout weights for every method (a Generator given raw params makes its own).
    params = jax.tree.map(jnp.asarray, target.prepare_for_decode(model.params, model.config))
    prompts = load_suite(model.tokenizer, args.suite, args.prompts, args.per_cell, args.tasks, args.buckets)
    methods = ["ar", *[m for m in args.methods if m != "ar"]]
    cache: dict = {}
    gens = {}
    for m in methods:
        drafter, dp = registry.build(m, model, cache=cache)
        gens[m] = Generator(model.config, params, drafter, dp, cost_profile=args.cost_profile)
    rows, warm = [], set()
    for prompt in prompts:
        ids = encode(model.tokenizer, prompt)
        for t in args.temperatures:
            gen = GenerateConfig(args.max_new_tokens, SamplingConfig(temperature=t), ignore_eos=True)
            bucket = prompt_bucket(len(ids))
            if (bucket, t) not in warm:  # compile (and auto's cost profile) outside the timed rounds
                warm.add((bucket, t))
                for m in methods:
                    gens[m].generate(ids, gen, seed=0)
            for r in range(args.repeats):
                outs = {m: gens[m].generate(ids, gen, seed=r) for m in methods}
                ar = outs["ar"]
                for m, o in outs.items():
                    rows.append(
                        {
                            "prompt": prompt.id,
                            "tokens": len(ids),
                            "T": t,
                            "round": r,
                            "method": m,
                            "tok_s": o.tokens_per_s,
                            "speedup": o.tokens_per_s / ar.tokens_per_s,
                            "tau": o.mean_accepted,
                            "equal_to_ar": o.tokens == ar.tokens if t == 0 else None,
                            "stats": o.drafter_stats,
                        }
                    )
                    print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    print(f"| prompt | T | {' | '.join(methods[1:])} |")
    print("|---|---|" + "---|" * (len(methods) - 1))
    for pid, t in dict.fromkeys((r["prompt"], r["T"]) for r in rows):
        cells = []
        for m in methods[1:]:
            s = [r["speedup"] for r in rows if r["prompt"] == pid and r["T"] == t and r["method"] == m]
            cells.append(f"{np.median(s):.2f}x ({min(s):.2f}-{max(s):.2f})")
        print(f"| {pid} | {t:g} | {' | '.join(cells)} |")
    for t in args.temperatures:
        means = {m: np.mean([r["speedup"] for r in rows if r["T"] == t and r["method"] == m]) for m in methods[1:]}
        print(f"mean speedup T={t:g}: " + ", ".join(f"{m} {v:.3f}x" for m, v in means.items()))
        if "auto" in means and len(means) > 1:
            fixed = {m: v for m, v in means.items() if m != "auto"}
            best = max(fixed, key=fixed.get)
            auto_rows = [r for r in rows if r["T"] == t and r["method"] == "auto"]
            per_prompt = {
                pid: np.median([r["speedup"] for r in auto_rows if r["prompt"] == pid])
                for pid in dict.fromkeys(r["prompt"] for r in auto_rows)
            }
            worst = min(per_prompt, key=per_prompt.get)
            print(
                f"  auto = {means['auto'] / fixed[best]:.1%} of the best fixed method ({best}); "
                f"worst prompt {worst} {per_prompt[worst]:.2f}x"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
