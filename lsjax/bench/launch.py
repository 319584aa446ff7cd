"""What a user waits for: `python decode.py` as typed, the default method against `--method ar`, launch to last
token, compilation and loading included, cold and warm, interleaved.

    python -m lsjax.bench.launch --suite dev --buckets 1K-2K 2K-4K --max-new-tokens 200
    python -m lsjax.bench.launch --prompt-file a.txt --prompt-file b.txt --rounds 2 --json out.json
    python -m lsjax.bench.launch --suite dev --tasks code dialogue --buckets 1K-2K --last-tokens 600 700 --no-cold

For every prompt and round, each method (the default, then AR; the order alternates by round) runs:
- cold (unless `--no-cold`): a fresh compile cache and a fresh cost-profile directory (`--compile-cache DIR`,
  `$LSJAX_PROFILE_DIR`): a first start on a new machine;
- new-width: in the method's own cache and profile directory, kept across the prompts of a round (a returning
  user's), a sibling of the prompt (its text less its first twentieth: another prompt, of the same padded
  width but another length) with another `--max-new-tokens`: the first start at this width;
- warm: the prompt itself, right after: another prompt and length whose width has run.
Each run is a `decode.py --json` process: seconds from launch to the first token, until the method's own decode
program is in use, and to the last token (`first_token_s`, `decode_program_in_use_s`, `last_token_s`), how many
programs it compiled or loaded, AR steps bridged while it loaded, tau. One row per run; a summary per cell
(median over rounds) with the default's wall time over AR's. `--no-cold` skips the cold runs (the longest: they
compile every program). `--last-tokens N ...`: each suite prompt's last N tokens instead (one prompt per N, the
text decoded from them): short prompts of real text, whose prefill is short enough for "in use within seconds
of launch" to be measurable.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from lsjax.prompts import TASKS

ROOT = Path(__file__).resolve().parents[2]
FIELDS = (
    "prompt_tokens",
    "first_token_s",
    "decode_program_in_use_s",
    "last_token_s",
    "programs_compiled",
    "programs_loaded",
    "bridged_steps",
    "ar_stand_in",
    "declined_loads",
    "new_tokens",
    "mean_accepted",
)


def decode_py(
    prompt_file: Path,
    method: str | None,
    new: int,
    cache: Path,
    profiles: Path,
    extra=(),
    root: Path = ROOT,
    fields: tuple[str, ...] = FIELDS,
    env: dict | None = None,
) -> dict:
    """One `decode.py --json` process (`root`'s: another copy of the repository may be timed): `fields` of its
    JSON summary, its text, plus the process's own wall seconds. `env`: variables set for it."""
    import time

    cmd = [sys.executable, str(root / "decode.py"), "--prompt-file", str(prompt_file), "--json"]
    cmd += ["--max-new-tokens", str(new), "--compile-cache", str(cache), *extra]
    cmd += ["--method", method] if method else []
    env = {**os.environ, **(env or {}), "LSJAX_PROFILE_DIR": str(profiles)}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=root)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"decode.py {' '.join(cmd[2:])} failed: {proc.stderr.strip().splitlines()[-1:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"process_s": round(wall, 3), **{k: out.get(k) for k in fields}, "text": out["text"]}


MIN_LAST = 16  # the fewest tokens `--last-tokens` cuts a prompt to


def last_tokens(tokenizer, text: str, counts: list[int]) -> list[tuple[int, str]]:
    """(N, the text of `text`'s last N tokens) for each N in `counts` (the whole text where it has no more)."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    return [(n, tokenizer.decode(ids[-n:])) for n in counts]


def main(argv=None) -> int:
    from lsjax.prompts import BUCKETS

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", choices=("dev", "heldout"), default="dev")
    p.add_argument("--buckets", nargs="+", choices=list(BUCKETS), default=["1K-2K", "2K-4K"])
    p.add_argument("--per-cell", type=int, default=1, help="prompts per (task, bucket) of the suite")
    p.add_argument("--tasks", nargs="+", default=["code"], choices=TASKS, help="the suite's tasks (default code)")
    p.add_argument("--prompt-file", action="append", default=[], help="a prompt file instead of the suite")
    p.add_argument("--max-new-tokens", type=int, default=200)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--method", default=None, help="the method compared with AR (default: decode.py's default)")
    p.add_argument("--no-cold", action="store_true", help="warm runs only")
    p.add_argument("--json", default=None, help="write the rows and summary here")
    p.add_argument(
        "--last-tokens", type=int, nargs="+", default=[], help="each suite prompt cut to its last N tokens (one per N)"
    )
    args = p.parse_args(argv)
    if args.max_new_tokens < 2 or args.rounds < 1:
        p.error("--max-new-tokens must be >= 2 and --rounds >= 1")
    if args.last_tokens and (args.prompt_file or min(args.last_tokens) < MIN_LAST):
        p.error(f"--last-tokens: expected suite prompts (no --prompt-file) and N >= {MIN_LAST}, got {args.last_tokens}")

    with tempfile.TemporaryDirectory(prefix="lsjax-launch-") as tmp:
        work = Path(tmp)
        files = [Path(f) for f in args.prompt_file]
        if not files:
            from lsjax.loading import load_model
            from lsjax.prompts import load_suite

            tok = load_model().tokenizer
            for i, pr in enumerate(load_suite(tok, args.suite, None, args.per_cell, args.tasks, args.buckets)):
                cuts = last_tokens(tok, pr.text, args.last_tokens) if args.last_tokens else [(None, pr.text)]
                for n, text in cuts:
                    files.append(work / (f"prompt{i}.txt" if n is None else f"prompt{i}-last{n}.txt"))
                    files[-1].write_text(text)
        methods = [args.method, "ar"]
        rows = []

        def record(r, f, name, start, row):
            rows.append({"round": r, "prompt": f.name, "method": name, "start": start, **row})
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "text"}), flush=True)

        for r in range(args.rounds):
            order = methods if r % 2 == 0 else methods[::-1]
            for i, f in enumerate(files):
                sibling = work / f"sibling{i}.txt"
                text = f.read_text()
                sibling.write_text(text[len(text) // 20 :])
                for m in order:
                    name = m or "default"
                    if not args.no_cold:
                        cold = work / f"cold-{r}-{i}-{name}"
                        record(r, f, name, "cold", decode_py(f, m, args.max_new_tokens, cold / "c", cold / "p"))
                    own = work / f"own-{r}-{name}"
                    new = max(2, args.max_new_tokens * 3 // 4)
                    record(r, f, name, "new-width", decode_py(sibling, m, new, own / "c", own / "p"))
                    record(r, f, name, "warm", decode_py(f, m, args.max_new_tokens, own / "c", own / "p"))
    summary = summarize(rows, args.method or "default")
    for line in summary:
        print(json.dumps(line))
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows, "summary": summary}, indent=1))
    return 0


def summarize(rows: list[dict], method: str) -> list[dict]:
    """Per (prompt, start): medians over rounds of each method's seconds, and the method's wall time over AR's
    (< 1: faster end to end), whether its text equals AR's."""
    out = []
    for prompt in dict.fromkeys(r["prompt"] for r in rows):
        for start in ("cold", "new-width", "warm"):
            cell = {m: [r for r in rows if (r["prompt"], r["start"], r["method"]) == (prompt, start, m)]
                    for m in (method, "ar")}  # fmt: skip
            if not cell[method] or not cell["ar"]:
                continue
            line = {"prompt": prompt, "start": start}
            for m, rs in cell.items():
                for k in ("first_token_s", "decode_program_in_use_s", "last_token_s", "programs_compiled"):
                    known = [r[k] for r in rs if r.get(k) is not None]  # (None: an AR stand-in's program in use)
                    line[f"{m}_{k}"] = statistics.median(known) if known else None
            line["wall_vs_ar"] = round(line[f"{method}_last_token_s"] / line["ar_last_token_s"], 3)
            line["identical_to_ar"] = all(a["text"] == b["text"] for a, b in zip(cell[method], cell["ar"]))
            line[f"{method}_prompt_tokens"] = cell[method][0].get("prompt_tokens")
            out.append(line)
    return out


if __name__ == "__main__":
    sys.exit(main())
