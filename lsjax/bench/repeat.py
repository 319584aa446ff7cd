"""Methods vs AR with repeats: each round runs every method once per prompt, back to back, and each method's
speed is divided by AR's from the same round (so machine noise between rounds cancels).

    python -m lsjax.bench.repeat --methods auto pld longspec hybrid --tasks code summarization dialogue \\
        --buckets 1K-2K --max-new-tokens 64 --repeats 3 --temperatures 0 1

Prints per prompt and temperature the median (min-max) speedup over AR of every method, and auto's choices.
Prompts come from the dev suite (`lsjax.bench.suites`), or a JSONL file (--prompts).
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
    p.add_argument("--prompts", help='a JSONL file of {"id", "prompt"[, "chat"]} instead of the dev suite')
    p.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS))
    p.add_argument("--buckets", nargs="+", choices=list(BUCKETS), default=["1K-2K"])
    p.add_argument("--per-cell", type=int, default=1)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    p.add_argument("--out", help="write every measurement here (JSON)")
    args = p.parse_args(argv)

    from lsjax.bench.suites import encode, load_suite
    from lsjax.config import GenerateConfig, SamplingConfig
    from lsjax.drafters import registry
    from lsjax.generation import Generator
    from lsjax.loading import load_model

    model = load_model()
    prompts = load_suite(model.tokenizer, "dev", args.prompts, args.per_cell, args.tasks, args.buckets)
    methods = ["ar", *[m for m in args.methods if m != "ar"]]
    cache: dict = {}
    gens = {}
    for m in methods:
        drafter, dp = registry.build(m, model, cache=cache)
        gens[m] = Generator(model.config, model.params, drafter, dp)
    rows, warm = [], set()
    for prompt in prompts:
        ids = encode(model.tokenizer, prompt)
        for t in args.temperatures:
            gen = GenerateConfig(args.max_new_tokens, SamplingConfig(temperature=t), ignore_eos=True)
            if (len(ids) > 2048, t) not in warm:  # compile (and auto's cost profile) outside the timed rounds
                warm.add((len(ids) > 2048, t))
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
