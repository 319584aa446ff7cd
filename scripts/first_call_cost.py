"""What the first run of programs just loaded from the program cache costs: the decode seconds of three runs of
one prompt in one process, and per split group the first call's seconds and the mean of the later calls'.

    python scripts/first_call_cost.py DIR make    # compiles auto's programs into the program cache DIR
    python scripts/first_call_cost.py DIR run     # a new process: loads them, runs the prompt three times
    python scripts/first_call_cost.py DIR ynn     # what the first run builds: YNNPACK executables per program

`auto` as `decode.py` builds it (on a CPU: AR and prompt lookup), prior costs (the same steps every run), dev
dialogue 1K-2K, 200 tokens at T = 0. Compare the first run's decode seconds with the later ones'.

`ynn` runs `run` again in a child with XLA's YNNPACK log on (`TF_CPP_VMODULE=ynn_fusion_thunk=3`), the programs
loaded before the first run (not beside it), and counts the YNNPACK executables XLA:CPU builds at each fusion's
first run: per program (the prefill's come first), how many and the milliseconds the log puts between each one's
start and end (the log's own cost included). `--method ar` after DIR times AR's programs instead.
"""

from __future__ import annotations

import collections
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def ynn_builds(log: str, gap_s: float = 0.15) -> list[tuple[int, float]]:
    """(executables built, their summed build ms) per program's first call, from an XLA log of
    `ynn_fusion_thunk=3`: each build is the time from a thread's "Create pooled YNN executable" line to its next
    "concurrency" line; a program's builds are apart from the next one's by more than `gap_s` (the first call of
    the next program comes after steps of the one before), and each of its fusions is built once."""
    import re

    line = re.compile(r"I\d+ (\d+):(\d+):([\d.]+)\s+(\d+) ynn_fusion_thunk\.cc:\d+\] (.*)")
    started, builds = {}, []
    for text in log.splitlines():
        m = line.match(text)
        if not m:
            continue
        t, thread, what = int(m[1]) * 3600 + int(m[2]) * 60 + float(m[3]), m[4], m[5]
        if "Create pooled YNN executable" in what:
            started[thread] = t
        elif "concurrency=" in what and thread in started:
            t0 = started.pop(thread)
            builds.append((t0, t - t0))
    bursts: list[list[float]] = []
    last = None
    for t0, dt in sorted(builds):
        if last is None or t0 - last > gap_s:
            bursts.append([])
        bursts[-1].append(dt)
        last = t0
    return [(len(b), round(sum(b) * 1e3, 1)) for b in bursts]


def ynn(cache: str, method: str) -> int:
    import os
    import subprocess

    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "0", "TF_CPP_VMODULE": "ynn_fusion_thunk=3"}
    cmd = [sys.executable, __file__, cache, "run-loaded", *(["--method", method] if method != "auto" else [])]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    print(out.stdout, end="")
    if out.returncode:
        print(out.stderr[-2000:], file=sys.stderr)
        return out.returncode
    for i, (n, ms) in enumerate(ynn_builds(out.stderr)):
        print(f"program {i}: {n} YNNPACK executables built at its first call, {ms} ms")
    return 0


def main() -> int:
    argv = sys.argv[1:]
    method = "auto"
    if "--method" in argv:
        i = argv.index("--method")
        method = argv[i + 1] if i + 1 < len(argv) else ""
        del argv[i : i + 2]
    if len(argv) != 2 or argv[1] not in ("make", "run", "run-loaded", "ynn") or method not in ("auto", "ar"):
        print(__doc__, file=sys.stderr)
        return 2
    if argv[1] == "ynn":
        return ynn(argv[0], method)
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
    drafter, params = registry.build(method, model, **({"cost_profile": "prior"} if method == "auto" else {}))
    g = host.Generator(model.config, model.params, drafter, params, program_cache=ProgramCache(argv[0]))
    if argv[1] == "make":
        g.run(ids, gen)
        return 0
    # run-loaded: every program loaded before the first run, so that run's extra is its own, not the load's.
    g.compile(ids, gen, background=argv[1] == "run")
    for i in range(2 if argv[1] == "run-loaded" else 3):
        calls.clear()
        r = g.run(ids, gen)
        first = {k: (round(v[0], 3), round(float(np.mean(v[1:])) if len(v) > 1 else 0.0, 3)) for k, v in calls.items()}
        print(f"run {i}: decode {r.decode_s:.3f} s; per group (first call s, later calls' mean s): {first}", flush=True)
    print("programs:", [(p.name, p.how) for p in g.program_log])
    g.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
