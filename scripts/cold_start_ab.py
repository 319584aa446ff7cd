"""A first start, as a new user's: `decode.py --json` with a fresh program cache and cost-profile directory per
run, the default method (`now`: on a CPU at T = 0 it decodes with AR's own programs and compiles its own after
the output), the default as it was before 2026-12-03 (`eager`: `$LSJAX_SPLIT_LOAD=eager`, its programs compiled
beside the decode) and `--method ar`; interleaved, the order reversed every round. Each process is stopped once its
JSON is out: what follows it is compiling for the next start (`decode.py`'s `finish`), which nobody waits for.
One JSON line per run, then the medians of the seconds from launch to the first and the last token over AR's.
`--baseline DIR` (another checkout, e.g. `git worktree add DIR HEAD~1`) also runs each variant from there
("base-now", ...), interleaved with this tree's: a change measured against the code before it.
`--gap S` idles S seconds before each run: a VM that hands freed memory back to its host (free page reporting)
backs it again at its next first touch, ~11 s/GB on one core of our 2-core VMs, so a first start after a pause
pays for every fresh byte it touches, one right after another process does not (2026-12-05: 45 s is enough).
`--last-tokens N`: each prompt cut to its last N tokens (`lsjax.bench.launch.last_tokens`).
Each row also has the seconds `decode.py` spent loading the weights and prefilling, and the process's peak
resident memory (Linux).
`--printed`: `decode.py` as a user runs it (streaming, no `--json`), timed by what it prints: the first byte of
text on stdout (`first_printed_s`) and its summary line (`summary_s`, after the last token).

    python scripts/cold_start_ab.py [--suite dev] [--buckets 1K-2K] [--tasks code] [--rounds 2]
        [--variants now eager ar] [--baseline DIR] [--to-exit] [--gap S] [--last-tokens N] [--printed] [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
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
    "load_s",
    "compile_s",
    "prefill_s",
    "tokens_per_s",
    "mean_accepted",
)


def first_start(prompt: Path, variant: str, new: int, work: Path, root: Path = ROOT, to_exit: bool = False) -> dict:
    """One `decode.py --json` process of the checkout at `root`, with fresh caches, stopped once its JSON line
    is out; with `to_exit`, left to compile for the next start and timed to its end (`exit_s`)."""
    env = {**os.environ, "LSJAX_PROFILE_DIR": str(work / "profiles")}
    env.pop("LSJAX_SPLIT_LOAD", None)
    if variant == "eager":
        env["LSJAX_SPLIT_LOAD"] = "eager"
    cmd = [sys.executable, str(root / "decode.py"), "--prompt-file", str(prompt), "--json"]
    cmd += ["--max-new-tokens", str(new), "--compile-cache", str(work / "cache")]
    cmd += ["--method", "ar"] if variant == "ar" else []
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=root)
    line = proc.stdout.readline()
    while line and not line.startswith("{"):
        line = proc.stdout.readline()
    json_at = time.perf_counter() - t0
    peak = _peak_mb(proc.pid)  # (before the kill: /proc/PID/status goes with the process)
    if to_exit:
        proc.stdout.read()
    else:
        proc.kill()
    proc.wait()
    exit_s = time.perf_counter() - t0
    if not line:
        raise RuntimeError(f"decode.py {' '.join(cmd[2:])} printed no JSON")
    out = json.loads(line)
    row = {"json_at_s": round(json_at, 3), **{k: out.get(k) for k in KEEP}, "peak_rss_mb": peak}
    return {**row, "exit_s": round(exit_s, 3)} if to_exit else row


def printed_start(prompt: Path, variant: str, new: int, work: Path, root: Path = ROOT) -> dict:
    """One streaming `decode.py` process (as a user runs it) with fresh caches, timed by what it prints: the
    first byte of text (`first_printed_s`) and the summary line after the last token (`summary_s`); stopped
    there (what follows compiles for the next start)."""
    env = {**os.environ, "LSJAX_PROFILE_DIR": str(work / "profiles")}
    env.pop("LSJAX_SPLIT_LOAD", None)
    if variant == "eager":
        env["LSJAX_SPLIT_LOAD"] = "eager"
    cmd = [sys.executable, str(root / "decode.py"), "--prompt-file", str(prompt), "--max-new-tokens", str(new)]
    cmd += ["--compile-cache", str(work / "cache")] + (["--method", "ar"] if variant == "ar" else [])
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=root)
    first: list[float] = []
    reader = threading.Thread(target=lambda: (proc.stdout.read(1), first.append(time.perf_counter() - t0)))
    reader.start()
    summary = None
    for line in proc.stderr:
        if b" tokens (" in line and line.startswith(b"[lsjax] "):
            summary = time.perf_counter() - t0
            break
    peak = _peak_mb(proc.pid)
    proc.kill()
    proc.wait()
    reader.join()
    if summary is None:
        raise RuntimeError(f"decode.py {' '.join(cmd[2:])} printed no summary line")
    return {"first_printed_s": round(first[0], 3), "summary_s": round(summary, 3), "peak_rss_mb": peak}


def _peak_mb(pid: int) -> int | None:
    """A live process's peak resident memory so far in MB (`VmHWM`), None off Linux."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) // 1024 for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration, ValueError):
        return None


def main(argv=None) -> int:
    from lsjax.bench.launch import last_tokens
    from lsjax.bench.suites import load_suite
    from lsjax.loading import load_model
    from lsjax.prompts import BUCKETS, TASKS

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", choices=("dev", "heldout"), default="dev")
    p.add_argument("--buckets", nargs="+", choices=list(BUCKETS), default=["1K-2K"])
    p.add_argument("--tasks", nargs="+", default=["code"], choices=TASKS)
    p.add_argument("--max-new-tokens", type=int, default=200)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    p.add_argument("--baseline", default=None, help="another checkout whose decode.py runs each variant too")
    p.add_argument("--json", default=None, help="also write the rows here (JSON lines)")
    p.add_argument(
        "--to-exit", action="store_true", help="let each process compile for the next start; time it to its end"
    )
    p.add_argument("--gap", type=float, default=0.0, help="seconds idle before each run (see above)")
    p.add_argument("--last-tokens", type=int, default=None, help="each prompt cut to its last N tokens")
    p.add_argument("--printed", action="store_true", help="streaming runs, timed by what they print (see above)")
    args = p.parse_args(argv)
    runs = [(v, ROOT, v) for v in args.variants]
    if args.baseline:
        base = Path(args.baseline).resolve()
        if not (base / "decode.py").is_file():
            p.error(f"--baseline: no decode.py in {args.baseline}")
        runs += [(f"base-{v}", base, v) for v in args.variants]
    rows = []
    with tempfile.TemporaryDirectory(prefix="lsjax-cold-") as tmp:
        tok = load_model().tokenizer
        prompts = load_suite(tok, args.suite, None, 1, args.tasks, args.buckets)
        for i, pr in enumerate(prompts):
            prompt = Path(tmp) / f"prompt{i}.txt"
            prompt.write_text(last_tokens(tok, pr.text, [args.last_tokens])[0][1] if args.last_tokens else pr.text)
            for r in range(args.rounds):
                for name, root, variant in runs if r % 2 == 0 else runs[::-1]:
                    time.sleep(args.gap)
                    work = Path(tempfile.mkdtemp(dir=tmp))
                    row = {"suite": args.suite, "prompt": pr.id, "round": r, "variant": name}
                    if args.printed:
                        row.update(printed_start(prompt, variant, args.max_new_tokens, work, root))
                    else:
                        row.update(first_start(prompt, variant, args.max_new_tokens, work, root, args.to_exit))
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    for prompt in dict.fromkeys(r["prompt"] for r in rows):
        keys = ("first_printed_s", "summary_s") if args.printed else ("first_token_s", "last_token_s")
        for key in keys + (("exit_s",) if args.to_exit and not args.printed else ()):
            med = {name: statistics.median(r[key] for r in rows if (r["prompt"], r["variant"]) == (prompt, name))
                   for name, _, _ in runs}  # fmt: skip
            says = ", ".join(f"{name} {s:.1f} s" for name, s in med.items())
            ar = {name: med[ar] for name, ar in (("now", "ar"), ("eager", "ar"), ("base-now", "base-ar"),
                                                 ("base-eager", "base-ar")) if name in med and ar in med}  # fmt: skip
            over = "; ".join(f"{name} / its AR {med[name] / a:.3f}x" for name, a in ar.items())
            print(
                f"{prompt}: {key.removesuffix('_s').replace('_', ' ')} (median) {says}" + (f"; {over}" if over else "")
            )
    if args.json:
        Path(args.json).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
