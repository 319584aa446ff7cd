"""What a method's programs cost to get ready: compile seconds, executable size, and seconds to load it from
the program cache in a fresh process (what a warm `decode.py` start pays), per program, methods side by side.

    python -m studies.programs.programs                                   # ar, pld, longspec, auto
    python -m studies.programs.programs --variant a2=auto:chains=1,hybrid_pld=0 --width 1024 --json out.json

Each variant (`NAME=METHOD[:key=value,...]`, as in `lsjax.bench.repeat`; a bare method name is itself) is
compiled for one prompt width and output width (`--width`, `--max-new-tokens`) into a fresh program cache; each
stored program is then loaded in a new process, `--loads` times (median). Prints one JSON line per program.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

LOAD = """
import pickle, sys, time, zlib
from jax.experimental.serialize_executable import deserialize_and_load
raw = zlib.decompress(open(sys.argv[1], "rb").read())
t = time.perf_counter()
deserialize_and_load(*pickle.loads(raw))
print(time.perf_counter() - t, len(raw))
"""


def load_seconds(path: Path, times: int) -> tuple[float, int]:
    """(median seconds to deserialize and load a stored program, each time in a new process; its bytes
    uncompressed)."""
    out, size = [], 0
    for _ in range(times):
        proc = subprocess.run([sys.executable, "-c", LOAD, str(path)], capture_output=True, text=True, check=True)
        seconds, size = proc.stdout.strip().splitlines()[-1].split()
        out.append(float(seconds))
    return statistics.median(out), int(size)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", action="append", default=[], help="NAME=METHOD[:key=value,...] (repeatable)")
    p.add_argument("--width", type=int, default=1024, help="the prompt width compiled for (256, 512, 1024, ...)")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--loads", type=int, default=3, help="fresh-process loads per program (median)")
    p.add_argument("--json", default=None, help="also write the rows here")
    args = p.parse_args(argv)
    from lsjax.bench.methods import parse_variant
    from lsjax.config import GenerateConfig
    from lsjax.engine.host import Generator
    from lsjax.engine.loop import PROMPT_BUCKETS
    from lsjax.errors import LsjaxError
    from lsjax.loading import load_model
    from lsjax.methods import registry
    from lsjax.runtime.programs import SUFFIX, ProgramCache

    if args.width not in PROMPT_BUCKETS:
        p.error(f"--width must be one of {list(PROMPT_BUCKETS)}")
    try:
        given = args.variant or ["ar", "pld", "longspec", "auto"]
        variants = [parse_variant(v if "=" in v else f"{v}={v}") for v in given]
    except ValueError as e:
        p.error(f"--variant: {e}")
    model = load_model()
    ids = (model.tokenizer.encode("The quick brown fox jumps over the lazy dog. ") * args.width)[: args.width - 8]
    gen = GenerateConfig(max_new_tokens=args.max_new_tokens)
    rows = []
    with tempfile.TemporaryDirectory(prefix="lsjax-programs-") as tmp:
        for name, (method, opts) in variants:
            opts = {**opts, "cost_profile": "prior"} if "cost_profile" in registry.get(method).options() else opts
            try:
                drafter, draft_params = registry.build(method, model, **opts)
            except (LsjaxError, ValueError) as e:
                sys.exit(f"studies.programs.programs: variant {name}: {e}")
            cache = ProgramCache(Path(tmp) / name)
            generator = Generator(model.config, model.params, drafter, draft_params, program_cache=cache)
            generator.compile_workers = 1  # one at a time: each program's compile seconds are its own
            generator.compile(ids, gen)
            for made in generator.program_log:
                stored = next(cache.root.glob(f"{made.name}-*{SUFFIX}"), None)
                row = {"variant": name, "program": made.name, "compile_s": round(made.seconds, 2)}
                if stored is not None:
                    seconds, size = load_seconds(stored, args.loads)
                    row.update(executable_mb=round(size / 2**20, 1), load_s=round(seconds, 2))
                rows.append(row)
                print(json.dumps(row), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
