"""Which LongSpec tree is fastest for this device, draft and kind of text? A sweep against AR, in one process.

    python -m studies.trees.trees --prompt-file a.txt b.txt                       # the shipped draft, tree presets
    python -m studies.trees.trees --prompt-file a.txt --trees chain4 3,2,1 cpu --draft runs/x/draft --max-new-tokens 64

For each prompt: AR once, then every tree, greedily (EOS ignored so all runs emit the same number of tokens);
each run's output must equal AR's, else the sweep exits 1. Reports tau (tokens per target forward), decode
tok/s and the speedup over the AR run of the same prompt, pooled per tree over the prompts (total tokens /
total seconds). The draft's cost grows with depth and the verification's with the node count (see
`studies.tree_cost.tree_cost`); what wins depends on the device, so measure on a quiet machine. Prompt files are
encoded as given (already rendered chat prompts stay as they are: `python -m lsjax.bench.run --write-prompts DIR` writes
such).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

DEFAULT_TREES = ("chain4", "chain8", "cpu-small", "cpu", "2,1,1,1,1")


def sweep(model, drafter_for, draft_params, prompts: dict[str, list[int]], trees: list[str], max_new: int, log=print):
    """{"ar": {...}, tree: {...}} pooled rows plus per-prompt rows; raises AssertionError on an output mismatch."""
    import jax
    import jax.numpy as jnp

    from lsjax.config import GenerateConfig
    from lsjax.engine.host import Generator
    from lsjax.engine.types import ARDrafter
    from lsjax.tree import parse_tree

    params = jax.tree.map(jnp.asarray, model.params)
    gen = GenerateConfig(max_new_tokens=max_new, ignore_eos=True)
    runs: dict[str, Generator] = {"ar": Generator(model.config, params, ARDrafter())}
    for spec in trees:
        runs[spec] = Generator(model.config, params, drafter_for(parse_tree(spec)), draft_params)
    rows = {name: [] for name in runs}
    for pid, ids in prompts.items():
        ref = None
        for name, g in runs.items():
            g.run(ids, gen)  # compile + warm up, untimed
            r = g.run(ids, gen)
            if ref is None:
                ref = r.tokens
            elif list(r.tokens) != list(ref):
                raise AssertionError(f"{name} on {pid}: output differs from AR's (lossless decoding is broken)")
            rows[name].append({"prompt": pid, "prompt_tokens": len(ids), **_row(r)})
            log(f"{pid:>28} {name:>12}  tau {rows[name][-1]['tau']:.2f}  {rows[name][-1]['tokens_per_s']:.1f} tok/s")
    ar_s = {r["prompt"]: r["decode_s"] for r in rows["ar"]}
    out = {}
    for name, rs in rows.items():
        emitted, forwards = sum(r["emitted"] for r in rs), sum(r["forwards"] for r in rs)
        secs = sum(r["decode_s"] for r in rs)
        out[name] = {
            "tau": emitted / max(forwards, 1),
            "tokens_per_s": emitted / secs,
            "speedup_vs_ar": sum(ar_s.values()) / secs,
            "prompts": rs,
        }
    return out


def _row(r) -> dict:
    emitted, forwards = r.new_tokens - 1, r.target_forwards - 1  # the first token comes from prefill
    return {
        "emitted": emitted,
        "forwards": forwards,
        "tau": emitted / max(forwards, 1),
        "decode_s": r.decode_s,
        "tokens_per_s": emitted / r.decode_s,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompt-file", nargs="+", required=True, type=Path)
    p.add_argument("--trees", nargs="+", default=list(DEFAULT_TREES), help="presets or widths like 3,2,1")
    p.add_argument("--draft", help="a draft directory (default: the shipped one for the model)")
    p.add_argument("--model", help="a .gguf file or HF directory (default: the bundled SmolLM2)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args(argv)

    import dataclasses

    from lsjax.errors import LsjaxError
    from lsjax.loading import load_model
    from lsjax.methods import registry
    from lsjax.tree import parse_tree

    try:
        for spec in args.trees:
            parse_tree(spec)
        model = load_model(args.model)
        drafter, draft_params = registry.build("longspec", model, draft=args.draft)
        prompts = {f.name: model.tokenizer.encode(f.read_text(encoding="utf-8")) for f in args.prompt_file}
    except (LsjaxError, OSError) as e:
        print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    try:
        out = sweep(
            model,
            lambda t: dataclasses.replace(drafter, tree=t),
            draft_params,
            prompts,
            args.trees,
            args.max_new_tokens,
        )
    except AssertionError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"\n{'tree':>12} {'nodes':>6} {'tau':>6} {'tok/s':>8} {'vs AR':>7}")
    for name, r in out.items():
        nodes = 1 if name == "ar" else parse_tree(name).num_nodes
        print(f"{name:>12} {nodes:>6} {r['tau']:>6.2f} {r['tokens_per_s']:>8.1f} {r['speedup_vs_ar']:>6.2f}x")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
