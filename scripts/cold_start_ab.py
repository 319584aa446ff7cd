"""A first start, as a new user's: `decode.py --json` with a fresh program cache and cost-profile directory per
run, the default method (`now`: on a CPU at T = 0 it decodes with AR's own programs and compiles its own after
the output), the default as it was before 2026-12-03 (`eager`: `$LSJAX_SPLIT_LOAD=eager`, its programs compiled
beside the decode) and `--method ar`; interleaved, the order reversed every round. Each process is stopped once its
JSON is out: what follows it is compiling for the next start (`decode.py`'s `finish`), which nobody waits for.
One JSON line per run, then the medians of the seconds from launch to the last token over AR's.

    python scripts/cold_start_ab.py [--suite dev] [--buckets 1K-2K] [--tasks code] [--rounds 2] [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

VARIANTS = ("now", "eager", "ar")
KEEP = (
    "prompt_tokens",
    "first_token_s",
    "decode_program_in_use_s",
    "last_token_s",
    "programs_compiled",
    "bridged_steps",
    "ar_stand_in",
    "compile_s",
    "tokens_per_s",
    "mean_accepted",
)


def first_start(prompt: Path, variant: str, new: int, work: Path) -> dict:
    """One `decode.py --json` process with fresh caches, stopped once its JSON line is out."""
    env = {**os.environ, "LSJAX_PROFILE_DIR": str(work / "profiles")}
    env.pop("LSJAX_SPLIT_LOAD", None)
    if variant == "eager":
        env["LSJAX_SPLIT_LOAD"] = "eager"
    cmd = [sys.executable, str(ROOT / "decode.py"), "--prompt-file", str(prompt), "--json"]
    cmd += ["--max-new-tokens", str(new), "--compile-cache", str(work / "cache")]
    cmd += ["--method", "ar"] if variant == "ar" else []
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=ROOT)
    line = proc.stdout.readline()
    while line and not line.startswith("{"):
        line = proc.stdout.readline()
    json_at = time.perf_counter() - t0
    proc.kill()
    proc.wait()
    if not line:
        raise RuntimeError(f"decode.py {' '.join(cmd[2:])} printed no JSON")
    out = json.loads(line)
    return {"json_at_s": round(json_at, 3), **{k: out.get(k) for k in KEEP}}


def main(argv=None) -> int:
    from lsjax.bench.suites import load_suite
    from lsjax.loading import load_model
    from lsjax.prompts import BUCKETS, TASKS

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", choices=("dev", "heldout"), default="dev")
    p.add_argument("--buckets", nargs="+", choices=list(BUCKETS), default=["1K-2K"])
    p.add_argument("--tasks", nargs="+", default=["code"], choices=TASKS)
    p.add_argument("--max-new-tokens", type=int, default=200)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--json", default=None, help="also write the rows here (JSON lines)")
    args = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="lsjax-cold-") as tmp:
        prompts = load_suite(load_model().tokenizer, args.suite, None, 1, args.tasks, args.buckets)
        for i, pr in enumerate(prompts):
            prompt = Path(tmp) / f"prompt{i}.txt"
            prompt.write_text(pr.text)
            for r in range(args.rounds):
                for variant in VARIANTS if r % 2 == 0 else VARIANTS[::-1]:
                    work = Path(tempfile.mkdtemp(dir=tmp))
                    row = {"suite": args.suite, "prompt": pr.id, "round": r, "variant": variant}
                    row.update(first_start(prompt, variant, args.max_new_tokens, work))
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    for prompt in dict.fromkeys(r["prompt"] for r in rows):
        last = {v: statistics.median(r["last_token_s"] for r in rows if (r["prompt"], r["variant"]) == (prompt, v))
                for v in VARIANTS}  # fmt: skip
        print(f"{prompt}: last token now {last['now']:.1f} s, eager {last['eager']:.1f} s, AR {last['ar']:.1f} s; "
              f"now / AR {last['now'] / last['ar']:.3f}x, eager / AR {last['eager'] / last['ar']:.3f}x")  # fmt: skip
    if args.json:
        Path(args.json).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
