"""`decode.py --json` end to end from two or more copies of the code (a change against the code before it), against
`--method ar`: warm starts, interleaved, the order rotating; what a user waits for, compilation and loading included.

    python tools/checkout_ab.py new=DIR_A:auto old=DIR_B:auto ar=DIR_A:ar [--suite dev] [--rounds 2]
        [--buckets 1K-2K 2K-4K] [--tasks code] [--prompt-file F] [--max-new-tokens 200] [--json rows.jsonl] [--share]

Each NAME=DIR:METHOD[:VAR=VALUE...][:--FLAG=VALUE...] runs DIR/decode.py (a copy of the repository: `git worktree
add DIR COMMIT`, or the tracked files copied), with those environment variables set (`noynn=DIR:auto:XLA_FLAGS=...`)
and those decode.py arguments (`draft=DIR:auto:--draft=shipped`), and its own compile cache and auto cost profile
(a copy's programs are its own: the program cache keys by lsjax's source); with `--share`, variants of one DIR and
METHOD share theirs (one cold compile for both). Per prompt: one start on a sibling prompt of the same width fills
each variant's caches, then `--rounds` rounds of warm starts on the prompt itself. One JSON line per run (with a
hash of the text, so that equal outputs show), then per prompt the medians of the last token's time and their
ratio to the variant named `ar`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# What each row keeps of decode.py's JSON, beside `lsjax.bench.launch.FIELDS`.
MORE = ("decode_s", "prefill_s", "target_forwards", "programs", "steps_by_candidate")


def run(root: Path, method: str, env: dict, args: tuple, prompt: Path, work: Path, new: int) -> dict:
    from lsjax.bench.launch import FIELDS, decode_py

    fields = (*FIELDS, *MORE)
    cache, profiles = work / "cache", work / "profiles"
    return decode_py(prompt, method, new, cache, profiles, extra=args, root=root, fields=fields, env=env)


def main(argv=None) -> int:
    from lsjax.prompts import BUCKETS, TASKS

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("variants", nargs="+", metavar="NAME=DIR:METHOD[:VAR=VALUE...]")
    p.add_argument("--suite", choices=("dev", "heldout"), default="dev")
    p.add_argument("--buckets", nargs="+", choices=list(BUCKETS), default=["1K-2K", "2K-4K"])
    p.add_argument("--tasks", nargs="+", choices=TASKS, default=["code"], help="the suite's tasks (default code)")
    p.add_argument("--prompt-file", action="append", default=[], help="a prompt file instead of the suite's code")
    p.add_argument("--max-new-tokens", type=int, default=200)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--json", default=None, help="append the rows and summaries here (JSON lines)")
    p.add_argument("--share", action="store_true", help="variants of one DIR and METHOD share their caches")
    args = p.parse_args(argv)
    variants, homes = {}, {}
    for v in args.variants:
        name, _, rest = v.partition("=")
        root, method, *sets = rest.split(":") + [""]
        sets = [s for s in sets if s]
        flags = tuple(s for s in sets if s.startswith("--"))  # decode.py arguments ("--draft=shipped")
        env = dict(s.split("=", 1) for s in sets if "=" in s and not s.startswith("--"))
        if not (
            name and root and method and len(env) + len(flags) == len(sets) and (Path(root) / "decode.py").is_file()
        ):
            p.error(f"{v!r}: expected NAME=DIR:METHOD[:VAR=VALUE...] with DIR holding decode.py")
        variants[name] = (Path(root).resolve(), method, env, flags)
        # (a name's caches are its own, or with --share the first variant's of its DIR and METHOD)
        homes[name] = next(n for n in variants if variants[n][:2] == variants[name][:2]) if args.share else name
    if "ar" not in variants:
        p.error("name one variant ar (the baseline)")

    if args.prompt_file:
        texts = [(f, Path(f).read_text()) for f in args.prompt_file]
    else:
        from lsjax.loading import load_model
        from lsjax.prompts import load_suite

        tok = load_model().tokenizer
        texts = [
            (f"{args.suite}:{pr.id}", pr.text) for pr in load_suite(tok, args.suite, None, 1, args.tasks, args.buckets)
        ]
    names = list(variants)
    out = open(args.json, "a") if args.json else None  # noqa: SIM115
    with tempfile.TemporaryDirectory(prefix="lsjax-checkout-ab-") as tmp:
        work = Path(tmp)
        for i, (source, text) in enumerate(texts):
            prompt, sibling = work / f"prompt{i}.txt", work / f"sibling{i}.txt"
            prompt.write_text(text)
            sibling.write_text(text[len(text) // 20 :])
            for name in names:
                run(*variants[name], sibling, work / homes[name], args.max_new_tokens)
            rows = []
            for r in range(args.rounds):
                for name in names[r % len(names) :] + names[: r % len(names)]:
                    row = run(*variants[name], prompt, work / homes[name], args.max_new_tokens)
                    text_out = row.pop("text")
                    row = {"source": str(source), "prompt": i, "round": r, "variant": name, **row}
                    row["text_sha1"] = hashlib.sha1(text_out.encode()).hexdigest()[:12]
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    if out:
                        print(json.dumps(row), file=out, flush=True)
            wall = {n: statistics.median(r["last_token_s"] for r in rows if r["variant"] == n) for n in names}
            summary = {"summary": i, "source": str(source)}
            summary |= {f"{n}_last_token_s": round(w, 3) for n, w in wall.items()}
            summary |= {f"{n}_vs_ar": round(wall[n] / wall["ar"], 3) for n in names if n != "ar"}
            print(json.dumps(summary), flush=True)
            if out:
                print(json.dumps(summary), file=out, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
