"""What the first run of programs just loaded from the program cache costs: the decode seconds of three runs of
one prompt in one process, and per split group the first call's seconds and the mean of the later calls'.

    python scripts/first_call_cost.py DIR make    # compiles auto's programs into the program cache DIR
    python scripts/first_call_cost.py DIR run     # a new process: loads them, runs the prompt three times

`auto` as `decode.py` builds it (on a CPU: AR and prompt lookup), prior costs (the same steps every run), dev
dialogue 1K-2K, 200 tokens at T = 0. Compare the first run's decode seconds with the later ones'.
"""

from __future__ import annotations

import collections
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    if len(sys.argv) != 3 or sys.argv[2] not in ("make", "run"):
        print(__doc__, file=sys.stderr)
        return 2
    import numpy as np

    from lsjax.bench.suites import encode, load_suite
    from lsjax.config import GenerateConfig
    from lsjax.engine import host
    from lsjax.engine.programs import ProgramCache
    from lsjax.loading import load_model
    from lsjax.methods import registry

    calls = collections.defaultdict(list)  # group -> seconds of each call this run
    made = host.SplitDecode._program

    def timed_program(self, g):
        program = made(self, g)

        def call(*args):
            t = time.perf_counter()
            out = program(*args)
            np.asarray(out[1])  # (waits for it)
            calls[g].append(time.perf_counter() - t)
            return out

        return call

    host.SplitDecode._program = timed_program
    model = load_model()
    prompt = load_suite(model.tokenizer, "dev", None, 1, ("dialogue",), ("1K-2K",))[0]
    ids = encode(model.tokenizer, prompt)
    gen = GenerateConfig(max_new_tokens=200, ignore_eos=True)
    auto, params = registry.build("auto", model, cost_profile="prior")
    g = host.Generator(model.config, model.params, auto, params, program_cache=ProgramCache(sys.argv[1]))
    if sys.argv[2] == "make":
        g.run(ids, gen)
        return 0
    g.compile(ids, gen, background=True)
    for i in range(3):
        calls.clear()
        r = g.run(ids, gen)
        first = {k: (round(v[0], 3), round(float(np.mean(v[1:])) if len(v) > 1 else 0.0, 3)) for k, v in calls.items()}
        print(f"run {i}: decode {r.decode_s:.3f} s; per group (first call s, later calls' mean s): {first}", flush=True)
    print("programs:", [(p.name, p.how) for p in g.program_log])
    g.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
