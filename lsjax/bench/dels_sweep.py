"""DeLS-Spec's α-β scan (the paper's Figure 2) on a prompt suite: mean τ per (α, β), α = β = 0 being the block
drafter alone.

    python -m lsjax.bench.dels_sweep --suite dev --per-cell 1                      # the shipped drafts
    python -m lsjax.bench.dels_sweep --suite quick --block-draft longspec --local-head markov --temperature 1

One compiled program serves the whole grid: α and β are arrays in the draft params, not drafter fields. At
T = 0 every run's output must equal AR's (checked; exit 1 otherwise). τ is tokens per target forward; it does
not depend on the machine's load, so the scan needs no interleaving (speed: `lsjax.bench.run`). Writes
`<out>/dels-sweep-<suite>-T<t>.json` and `.md` (a heat-map table and the row-wise gain over β = 0).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

GRID = (0.0, 0.1, 0.3, 0.5, 1.0)


def sweep(model, drafter, dels_params, prompts: dict[str, list[int]], alphas, betas, gen, log=print) -> dict:
    """{"tau": {(α, β): mean τ}, "per_prompt": {...}}; raises AssertionError when a T = 0 output differs from AR."""
    import jax
    import jax.numpy as jnp

    from lsjax.bench.run import prompt_seed
    from lsjax.drafters.base import ARDrafter
    from lsjax.drafters.block import with_weights
    from lsjax.generation import Generator

    params = jax.tree.map(jnp.asarray, model.params)
    ar = Generator(model.config, params, ARDrafter())
    run = Generator(model.config, params, drafter, dels_params)
    taus: dict = {(a, b): [] for a in alphas for b in betas}
    per_prompt: dict = {}
    for pid, ids in prompts.items():
        want = ar.generate(ids, gen).tokens if gen.sampling.greedy else None
        per_prompt[pid] = {}
        for a in alphas:
            for b in betas:
                run.draft_params = jax.tree.map(jnp.asarray, with_weights(dels_params, a, b))
                out = run.generate(ids, gen, seed=prompt_seed(0, pid))
                if want is not None:
                    assert out.tokens == want, f"{pid}: alpha={a} beta={b} output differs from AR"
                taus[(a, b)].append(out.mean_accepted)
                per_prompt[pid][f"{a},{b}"] = round(out.mean_accepted, 3)
        log(f"{pid}: " + " ".join(f"{k}={v}" for k, v in per_prompt[pid].items()))
    return {"tau": {k: sum(v) / len(v) for k, v in taus.items()}, "per_prompt": per_prompt}


def markdown(result: dict, alphas, betas, title: str) -> str:
    tau = result["tau"]
    head = "| α \\ β | " + " | ".join(f"{b:g}" for b in betas) + " |"
    sep = "|---" * (len(betas) + 1) + "|"
    rows = [f"| {a:g} | " + " | ".join(f"{tau[(a, b)]:.3f}" for b in betas) + " |" for a in alphas]
    out = [f"### {title}", "", "Mean τ (α = β = 0: the block drafter alone)", "", head, sep, *rows]
    if 0.0 in betas:
        gains = [
            f"| {a:g} | " + " | ".join(f"{tau[(a, b)] - tau[(a, 0.0)]:+.3f}" for b in betas) + " |" for a in alphas
        ]
        out += ["", "Row-wise gain over β = 0", "", head, sep, *gains]
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", default="quick", choices=("quick", "dev", "heldout"))
    p.add_argument("--per-cell", type=int, default=1)
    p.add_argument("--limit", type=int, default=0, help="at most this many prompts (0 = all)")
    p.add_argument("--alphas", type=float, nargs="+", default=list(GRID))
    p.add_argument("--betas", type=float, nargs="+", default=list(GRID))
    p.add_argument("--block-draft", default=None, help="a block-draft directory or 'longspec' (default: shipped)")
    p.add_argument("--block-size", type=int, default=None)
    p.add_argument("--local-head", default=None, help="gru | markov | a directory (default gru)")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--out", default="bench_results")
    args = p.parse_args(argv)

    from lsjax.bench.suites import encode, load_suite
    from lsjax.config import GenerateConfig, SamplingConfig
    from lsjax.drafters import registry
    from lsjax.errors import LsjaxError
    from lsjax.loading import load_model

    try:
        model = load_model(None)
        drafter, dels_params = registry.build(
            "dels", model, block_draft=args.block_draft, block_size=args.block_size, local_head=args.local_head
        )
    except LsjaxError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    prompts = load_suite(model.tokenizer, args.suite, per_cell=args.per_cell)
    if args.limit:
        prompts = prompts[: args.limit]
    ids = {pr.id: encode(model.tokenizer, pr) for pr in prompts}
    gen = GenerateConfig(
        max_new_tokens=args.max_new_tokens, sampling=SamplingConfig(temperature=args.temperature), ignore_eos=True
    )
    try:
        result = sweep(model, drafter, dels_params, ids, args.alphas, args.betas, gen, log=print)
    except AssertionError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"dels-sweep-{args.suite}-T{args.temperature:g}"
    title = (
        f"DeLS-Spec α-β scan: suite {args.suite}, {len(ids)} prompts, T={args.temperature:g}, "
        f"block {drafter.block.block_size}, local head {drafter.local.kind}"
    )
    record = {
        "args": vars(args),
        "tau": {f"{a},{b}": v for (a, b), v in result["tau"].items()},
        "per_prompt": result["per_prompt"],
    }
    (out / f"{stem}.json").write_text(json.dumps(record, indent=1) + "\n")
    md = markdown(result, args.alphas, args.betas, title)
    (out / f"{stem}.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
