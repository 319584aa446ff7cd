"""Whether a method's start program (the prefill, plus its draft's own set-up) costs more than AR's: both compiled
in one process for a suite prompt, then run alone, interleaved, the order reversed each round. Prints each
one's compile seconds and the median of its runs.

    python scripts/start_program_ab.py [--suite dev] [--bucket 1K-2K] [--method auto] [--rounds 6]

Measured 2026-12-04 (docs/CHANGELOG.md): auto's start program at the dev 1165-token code prompt takes what
AR's does (4.07 s against 4.08 s; 3.55 against 3.43 s in a second run), so what a `decode.py` start of auto adds
to its prefill over AR's is the bigger first decode program read beside it.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    from lsjax.prompts import BUCKETS

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", choices=("dev", "heldout"), default="dev")
    p.add_argument("--bucket", choices=list(BUCKETS), default="1K-2K")
    p.add_argument("--method", default="auto")
    p.add_argument("--rounds", type=int, default=6)
    args = p.parse_args(argv)

    import jax
    import numpy as np

    from lsjax.bench.suites import encode, load_suite
    from lsjax.config import GenerateConfig
    from lsjax.engine import loop
    from lsjax.engine.host import Generator, start_args
    from lsjax.loading import load_model
    from lsjax.methods import registry

    model = load_model()
    ids = encode(model.tokenizer, load_suite(model.tokenizer, args.suite, None, 1, ["code"], [args.bucket])[0])
    print(f"{args.suite} code prompt, {len(ids)} tokens")
    runs = {}
    for method in ("ar", args.method):
        drafter, draft_params = registry.build(method, model)
        g = Generator(model.config, model.params, drafter, draft_params)
        gen, bucket, capacity, width = g._shapes(ids, GenerateConfig(max_new_tokens=200))
        key = jax.random.key(0)
        spec, params, kwargs = g._start_spec(bucket, capacity, width, key)
        t = time.perf_counter()
        program = jax.jit(functools.partial(loop.start, config=spec)).lower(*params, **kwargs).compile()
        print(f"{method}: start program compiled in {time.perf_counter() - t:.1f} s")
        buf = np.zeros((1, bucket), np.int32)
        buf[0, : len(ids)] = ids
        runs[method] = (program, g.params, g.draft_params, start_args(buf, len(ids), key, gen))
    times = {m: [] for m in runs}
    for r in range(args.rounds):
        for m in list(runs)[:: 1 if r % 2 == 0 else -1]:
            program, params, draft_params, kw = runs[m]
            t = time.perf_counter()
            jax.block_until_ready(program(params, draft_params, **kw).num_out)
            times[m].append(time.perf_counter() - t)
    for m, ts in times.items():
        print(f"{m}: median {statistics.median(ts):.3f} s ({', '.join(f'{x:.2f}' for x in ts)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
