"""Write the dev suite's prompts as text files for decode.py: `python -m lsjax.bench.write_prompts --out DIR`."""

from __future__ import annotations

from lsjax.prompts import BUCKETS, TASKS, build_prompts


def main(argv=None) -> None:
    """Write dev prompts as text files for decode.py (chat prompts already rendered: pass no --chat)."""
    import argparse
    from pathlib import Path

    from lsjax.loading import load_model

    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS))
    p.add_argument("--buckets", nargs="+", choices=list(BUCKETS), default=list(BUCKETS))
    p.add_argument("--per-cell", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True, help="directory for <task>-<bucket>-<i>.txt")
    args = p.parse_args(argv)
    tokenizer = load_model().tokenizer
    args.out.mkdir(parents=True, exist_ok=True)
    for prompt in build_prompts(tokenizer, args.tasks, args.buckets, args.per_cell, args.seed):
        path = args.out / f"{prompt.id.replace('/', '-')}.txt"
        path.write_text(prompt.text, encoding="utf-8")
        print(f"{path}  {prompt.num_tokens} tokens")


if __name__ == "__main__":
    main()
