"""Seconds from launch to the first generated token of `python decode.py [ARGS]` (when decoding starts), run
`--runs` times in a row on one compile cache: the first run compiles, the later ones load.

    python scripts/time_to_first_token.py --cache /tmp/fresh-cache --runs 2            # make demo's command
    python scripts/time_to_first_token.py --cache /tmp/c -- --method ar --max-new-tokens 16

Give a fresh `--cache` directory for a first run that compiles. Prints one line per run.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cache", required=True, help="the --compile-cache directory (fresh: the first run compiles)")
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("args", nargs="*", help="decode.py's arguments (after --)")
    args = p.parse_args(argv)
    cmd = [sys.executable, str(ROOT / "decode.py"), "--compile-cache", args.cache, *args.args]
    for i in range(args.runs):
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
        proc.stdout.read(1)  # decode.py streams the first token as soon as decoding starts
        first = time.perf_counter() - t0
        _, err = proc.communicate()
        summary = [line for line in err.decode().splitlines() if "tokens (" in line]
        tail = summary[-1] if summary else err.decode().strip().splitlines()[-1:]
        print(f"run {i + 1}: first token at {first:.1f}s, done at {time.perf_counter() - t0:.1f}s; {tail}")
        if proc.returncode:
            return proc.returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
