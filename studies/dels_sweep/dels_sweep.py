"""DeLS-Spec's α-β scan (the paper's Figure 2) on a prompt suite: mean τ per (α, β), α = β = 0 being the block
drafter alone.

    python -m studies.dels_sweep.dels_sweep --suite dev --per-cell 1                      # the shipped drafts
    python -m studies.dels_sweep.dels_sweep --suite quick --block-draft longspec --local-head markov --temperature 1

One compiled program serves the whole grid: α and β are arrays in the draft params, not drafter fields. At
T = 0 every run's output must equal AR's (checked; exit 1 otherwise). τ is tokens per target forward; it does
not depend on the machine's load, so the scan needs no interleaving (speed: `lsjax.bench.run`). Writes
`<out>/dels-sweep-<suite>-T<t>.json`, `.md` (a heat-map table and the row-wise gain over β = 0) and `.png`.

    python -m studies.dels_sweep.dels_sweep --merge a/dels-sweep-dev-T0.json b/dels-sweep-dev-T0.json --out grid

joins scans of disjoint cells run separately (same suite, temperature and drafts) into one grid.
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
    from lsjax.engine.host import Generator
    from lsjax.engine.types import ARDrafter
    from lsjax.methods.dels.drafter import with_weights

    params = jax.tree.map(jnp.asarray, model.params)
    ar = Generator(model.config, params, ARDrafter())
    dels = Generator(model.config, params, drafter, dels_params)
    taus: dict = {(a, b): [] for a in alphas for b in betas}
    per_prompt: dict = {}
    for pid, ids in prompts.items():
        want = ar.run(ids, gen).tokens if gen.sampling.greedy else None
        per_prompt[pid] = {}
        for a in alphas:
            for b in betas:
                dels.draft_params = jax.tree.map(jnp.asarray, with_weights(dels_params, a, b))
                out = dels.run(ids, gen, seed=prompt_seed(0, pid))
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


def heatmap_png(tau: dict, alphas, betas, title: str, path: Path) -> None:
    """τ over (α, β) as an annotated heat-map; cells never run are blank."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    grid = np.array([[tau.get((a, b), np.nan) for b in betas] for a in alphas])
    fig, ax = plt.subplots(figsize=(1.1 * len(betas) + 2.2, 0.8 * len(alphas) + 1.6))
    im = ax.imshow(grid, cmap="viridis", origin="lower", aspect="auto")
    ax.set_xticks(range(len(betas)), [f"{b:g}" for b in betas])
    ax.set_yticks(range(len(alphas)), [f"{a:g}" for a in alphas])
    ax.set_xlabel("β (unigram prior)")
    ax.set_ylabel("α (local head)")
    lo, hi = np.nanmin(grid), np.nanmax(grid)
    for i in range(len(alphas)):
        for j in range(len(betas)):
            if not np.isnan(grid[i, j]):
                # Dark text on the bright end of viridis, light on the dark end.
                light = (grid[i, j] - lo) < 0.6 * (hi - lo + 1e-12)
                ax.text(j, i, f"{grid[i, j]:.3f}", ha="center", va="center", color="w" if light else "k", fontsize=9)
    fig.colorbar(im, ax=ax, label="mean τ")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def merge(records: list[dict]) -> tuple[dict, list[float], list[float]]:
    """One grid from scans of disjoint cells; raises ValueError when the scans are not comparable or overlap
    with different values (at T = 0 a cell run twice must agree: τ is deterministic)."""
    keys = ("suite", "per_cell", "limit", "block_draft", "block_size", "local_head", "temperature", "max_new_tokens")
    first = records[0]["args"]
    tau: dict = {}
    for r in records:
        diff = [k for k in keys if r["args"].get(k) != first.get(k)]
        if diff:
            raise ValueError(f"scans differ in {', '.join(diff)}: not one grid")
        for k, v in r["tau"].items():
            a, b = (float(x) for x in k.split(","))
            if (a, b) in tau and first["temperature"] == 0 and abs(tau[(a, b)] - v) > 1e-9:
                raise ValueError(f"cell α={a:g}, β={b:g} was run twice with different τ ({tau[(a, b)]} vs {v})")
            tau[(a, b)] = v
    return tau, sorted({a for a, _ in tau}), sorted({b for _, b in tau})


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
    p.add_argument("--merge", nargs="+", type=Path, metavar="JSON", help="join earlier scans instead of running")
    args = p.parse_args(argv)
    if args.merge:
        return _merge_main(args)

    from lsjax.config import GenerateConfig, SamplingConfig
    from lsjax.errors import LsjaxError
    from lsjax.loading import load_model
    from lsjax.methods import registry
    from lsjax.prompts import encode, load_suite

    try:
        model = load_model(None)
        drafter, dels_params = registry.build(
            "dels", model, draft=args.block_draft, block_size=args.block_size, local_head=args.local_head
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
    heatmap_png(result["tau"], args.alphas, args.betas, title, out / f"{stem}.png")
    print(md)
    return 0


def _merge_main(args) -> int:
    try:
        records = [json.loads(f.read_text()) for f in args.merge]
        tau, alphas, betas = merge(records)
    except (OSError, ValueError, KeyError) as e:
        print(f"error: --merge: {e}", file=sys.stderr)
        return 2
    a0 = records[0]["args"]
    missing = [(a, b) for a in alphas for b in betas if (a, b) not in tau]
    if missing:
        a, b = missing[0]
        print(f"error: --merge: the grid misses {len(missing)} cells, e.g. α={a:g}, β={b:g}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"dels-sweep-{a0['suite']}-T{a0['temperature']:g}"
    title = f"DeLS-Spec α-β scan: suite {a0['suite']}, T={a0['temperature']:g}, merged from {len(records)} runs"
    (out / f"{stem}.json").write_text(
        json.dumps({"merged_from": [str(f) for f in args.merge], "tau": {f"{a},{b}": v for (a, b), v in tau.items()}})
        + "\n"
    )
    md = markdown({"tau": tau}, alphas, betas, title)
    (out / f"{stem}.md").write_text(md)
    heatmap_png(tau, alphas, betas, title, out / f"{stem}.png")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
