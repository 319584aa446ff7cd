"""How a warm `decode.py` start should load auto's split programs: every group auto asks for, those after the first
in the CPU time the decode leaves idle ("idle", decode.py's CPU default), at normal priority ("asked"), only where
running them pays for loading them ("priced"), all of them, wanted first ("eager"), or none but AR's group
("first": what auto costs where it never leaves AR), against `--method ar`;
interleaved, same run, compilation and loading included (`$LSJAX_SPLIT_LOAD`, `lsjax.engine.host.SplitDecode`).

Per prompt: one start on a sibling prompt of the same width fills each method's caches (programs and the
width's cost profile), then `--rounds` rounds of warm starts on the prompt itself, the order rotating. One JSON
line per run, then per prompt and variant the medians of the seconds to the first token, from it to the last, and
to the last, and the last's ratio to AR's.

    python scripts/split_load_ab.py [--suite dev] [--buckets 1K-2K 2K-4K] [--tasks code] [--rounds 2]
        [--variants idle priced asked eager first ar] [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

VARIANTS = {
    "idle": ("auto", "idle"),
    "priced": ("auto", "priced"),
    "asked": ("auto", "asked"),
    "eager": ("auto", "eager"),
    "first": ("auto", "first"),
    "ar": ("ar", ""),
}


def main(argv=None) -> int:
    from lsjax.bench.launch import decode_py
    from lsjax.bench.suites import load_suite
    from lsjax.engine.host import LOAD_ENV
    from lsjax.loading import load_model
    from lsjax.prompts import BUCKETS, TASKS

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", choices=("dev", "heldout"), default="dev")
    p.add_argument("--buckets", nargs="+", choices=list(BUCKETS), default=["1K-2K", "2K-4K"])
    p.add_argument("--tasks", nargs="+", default=["code"], choices=TASKS)
    p.add_argument("--max-new-tokens", type=int, default=200)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=["idle", "asked", "ar"])
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)

    rows = []
    names = list(dict.fromkeys([*args.variants, "ar"]))
    with tempfile.TemporaryDirectory(prefix="lsjax-split-load-") as tmp:
        work = Path(tmp)
        tok = load_model().tokenizer
        prompts = load_suite(tok, args.suite, None, 1, args.tasks, args.buckets)
        for i, pr in enumerate(prompts):
            f, sibling = work / f"prompt{i}.txt", work / f"sibling{i}.txt"
            f.write_text(pr.text)
            sibling.write_text(pr.text[len(pr.text) // 20 :])
            for method in ("auto", "ar"):  # both auto variants share one cache: the same programs and profile
                decode_py(sibling, method, args.max_new_tokens, work / method / "c", work / method / "p")
            for r in range(args.rounds):
                for name in names[r % len(names) :] + names[: r % len(names)]:
                    method, how = VARIANTS[name]
                    os.environ[LOAD_ENV] = how
                    row = decode_py(f, method, args.max_new_tokens, work / method / "c", work / method / "p")
                    row = {"prompt": i, "round": r, "variant": name, **{k: v for k, v in row.items() if k != "text"}}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    summary = []
    for i in sorted({r["prompt"] for r in rows}):

        def median(v, of, i=i):
            return round(statistics.median(of(r) for r in rows if r["prompt"] == i and r["variant"] == v), 3)

        # What a user waits for: the last token. (Until 2026-12-03 auto's --json process also prefilled again
        # after its output; the process's end is in the rows as process_s.)
        wall = {v: median(v, lambda r: r["last_token_s"]) for v in names}
        summary.append(
            {"prompt": i, **{f"{v}_first_token_s": median(v, lambda r: r["first_token_s"]) for v in names}}
            | {f"{v}_decoding_s": median(v, lambda r: r["last_token_s"] - r["first_token_s"]) for v in names}
            | {f"{v}_last_token_s": w for v, w in wall.items()}
            | {f"{v}_vs_ar": round(wall[v] / wall["ar"], 3) for v in names if v != "ar"}
        )
        print(json.dumps(summary[-1]), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
