"""What decode.py's shapes and programs cost in decoding speed, compilation excluded, interleaved, same run:

- split: `auto`'s decode loop as one program per verification size (`SplitDecode`, what decode.py runs) against
  the single program (what `lsjax.generate` and `lsjax.bench.repeat` run), with the same costs, so the same
  steps (tokens per second of the decode; the outputs must be identical);
- bucketed: the prompt padded to its width (256, 512, 1024, ...) and the output to a width of 256 or more
  (`loop.prompt_bucket`, `loop.new_tokens_bucket`) against exact shapes (the prompt rounded up to the prefill
  chunk, the output to the tokens asked for), for AR and `auto`.

One JSON line per (comparison, prompt): the median decode tokens/s of each side over `--rounds` and their ratio.

    python scripts/split_overhead.py [--suite dev] [--rounds 3] [--max-new-tokens 200] [--only split]
        [--draft shipped] [--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


@contextlib.contextmanager
def exact_shapes():
    """Host runs compiled for the prompt rounded to the prefill chunk and the output count itself."""
    from lsjax.engine import loop
    from lsjax.engine.types import PREFILL_CHUNK

    saved = loop.prompt_bucket, loop.new_tokens_bucket
    loop.prompt_bucket = lambda n, chunk=PREFILL_CHUNK: -(-n // chunk) * chunk
    loop.new_tokens_bucket = lambda n, max_position: n
    try:
        yield
    finally:
        loop.prompt_bucket, loop.new_tokens_bucket = saved


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", default="dev", choices=("dev", "heldout"))
    p.add_argument("--buckets", nargs="+", default=["1K-2K"])
    p.add_argument("--tasks", nargs="+", default=["code", "summarization"])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=200)
    p.add_argument("--json", default=None, help="also write the rows here (JSON lines)")
    p.add_argument("--only", choices=("split", "buckets"), help="one of the two comparisons")
    p.add_argument(
        "--draft",
        default=None,
        help="auto's --draft (default: decode.py's, AR and prompt lookup alone on a CPU; 'shipped': the draft)",
    )
    args = p.parse_args()
    from lsjax.bench.suites import encode, load_suite
    from lsjax.config import GenerateConfig
    from lsjax.engine.host import Generator
    from lsjax.engine.programs import ProgramCache
    from lsjax.loading import load_model
    from lsjax.methods import registry

    model = load_model()
    tok = model.tokenizer
    prompts = load_suite(tok, args.suite, None, 1, tuple(args.tasks), tuple(args.buckets))
    gen = GenerateConfig(max_new_tokens=args.max_new_tokens, ignore_eos=True)
    # The same costs both sides (the prior's), so the same steps.
    auto, auto_params = registry.build("auto", model, draft=args.draft, cost_profile="prior")
    rows = []
    with tempfile.TemporaryDirectory(prefix="lsjax-split-") as tmp:

        def generator(drafter=None, params=None, cache=False):
            kw = {} if drafter is None else {"drafter": drafter, "draft_params": params}
            cache = ProgramCache(Path(tmp) / str(len(list(Path(tmp).iterdir())))) if cache else None
            return Generator(model.config, model.params, **kw, program_cache=cache)

        sides = {
            "split": ("auto", generator(auto, auto_params, cache=True), False),
            "single": ("auto", generator(auto, auto_params), False),
            "ar-bucketed": ("ar", generator(), False),
            "ar-exact": ("ar", generator(), True),
            "auto-bucketed": ("auto", generator(auto, auto_params), False),
            "auto-exact": ("auto", generator(auto, auto_params), True),
        }
        pairs = [("split", "single"), ("ar-bucketed", "ar-exact"), ("auto-bucketed", "auto-exact")]
        pairs = pairs[:1] if args.only == "split" else pairs[1:] if args.only == "buckets" else pairs
        sides = {k: v for k, v in sides.items() if any(k in pair for pair in pairs)}
        for pr in prompts:
            ids = encode(tok, pr)
            speed, tokens = {k: [] for k in sides}, {}
            for r in range(args.rounds + 1):  # round 0 compiles
                order = list(sides) if r % 2 else list(reversed(sides))
                for name in order:
                    _, g, exact = sides[name]
                    with exact_shapes() if exact else contextlib.nullcontext():
                        res = g.run(ids, gen)
                    if r:
                        speed[name].append(res.tokens_per_s)
                    tokens.setdefault(name, res.tokens)
                print(f"[split_overhead] {pr.id}: round {r} done", file=sys.stderr, flush=True)
            med = {k: statistics.median(v) for k, v in speed.items()}
            for a, b in pairs:
                row = {
                    "prompt": pr.id,
                    "prompt_tokens": len(ids),
                    "compare": f"{a} vs {b}",
                    f"{a}_tok_s": round(med[a], 2),
                    f"{b}_tok_s": round(med[b], 2),
                    "ratio": round(med[a] / med[b], 4),
                    "identical": tokens[a] == tokens[b],
                    "rounds": args.rounds,
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
    if args.json:
        Path(args.json).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
