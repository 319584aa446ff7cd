"""What a program loading beside a prefill and a decode costs them, at each CPU priority the loading thread can
have: the same prompt prefilled and decoded (`--method ar`'s programs) alone, and with a thread reading a stored
program over and over meanwhile at normal priority, at nice 19, and under SCHED_IDLE (Linux). Interleaved, the
order rotating; prints the median prefill and decode seconds per mode and their ratio to "alone".

Why: a split `auto` decode loads the trees it asks for during the decode, and a start could read them ahead
during the prefill; both are free only if a low-priority thread takes nothing from the compute threads.

    python scripts/idle_load_cost.py [--suite heldout] [--bucket 1K-2K] [--rounds 4] [--new-tokens 40]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODES = ("alone", "normal", "nice19", "sched-idle")


def lower(mode: str) -> None:
    tid = threading.get_native_id()
    if mode == "nice19":
        os.setpriority(os.PRIO_PROCESS, tid, 19)
    elif mode == "sched-idle":
        os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))


def main(argv=None) -> int:
    from lsjax.prompts import BUCKETS

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", choices=("dev", "heldout"), default="heldout")
    p.add_argument("--bucket", choices=list(BUCKETS), default="1K-2K")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--new-tokens", type=int, default=40)
    args = p.parse_args(argv)
    if not sys.platform.startswith("linux"):
        p.error("thread priorities are set per thread on Linux only")

    from lsjax.bench.suites import encode, load_suite
    from lsjax.config import GenerateConfig
    from lsjax.engine.host import Generator
    from lsjax.engine.programs import SUFFIX, ProgramCache
    from lsjax.loading import load_model

    model = load_model()
    ids = encode(model.tokenizer, load_suite(model.tokenizer, args.suite, None, 1, ["code"], [args.bucket])[0])
    gen = GenerateConfig(max_new_tokens=200)
    with tempfile.TemporaryDirectory(prefix="lsjax-idle-load-") as tmp:
        g = Generator(model.config, model.params, program_cache=ProgramCache(tmp))
        g.run(ids, gen, max_new=1)  # compiles and stores AR's programs
        stored = next(Path(tmp).glob(f"decode-*{SUFFIX}"))  # the program the loader reads, again and again
        stop, loads = threading.Event(), [0]

        def loader(mode: str) -> None:
            lower(mode)
            while not stop.is_set():
                g.programs._read(stored)
                loads[0] += 1

        rows: dict[str, list[tuple[float, float]]] = {m: [] for m in MODES}
        for r in range(args.rounds):
            order = MODES[r % len(MODES) :] + MODES[: r % len(MODES)]
            for mode in order:
                thread = None
                if mode != "alone":
                    stop.clear()
                    thread = threading.Thread(target=loader, args=(mode,))
                    thread.start()
                    time.sleep(0.05)
                out = g.run(ids, gen, max_new=args.new_tokens)
                if thread is not None:
                    stop.set()
                    thread.join()
                rows[mode].append((out.prefill_s, out.decode_s))
                print(f"round {r} {mode:10s} prefill {out.prefill_s:.2f}s decode {out.decode_s:.2f}s", flush=True)
    print(f"{len(ids)} prompt tokens, {args.new_tokens} new, {args.rounds} rounds; {loads[0]} loads of {stored.name}")
    base = [statistics.median(x[k] for x in rows["alone"]) for k in (0, 1)]
    for mode in MODES:
        med = [statistics.median(x[k] for x in rows[mode]) for k in (0, 1)]
        ratio = [m / b for m, b in zip(med, base, strict=True)]
        print(f"{mode:10s} prefill {med[0]:.2f}s ({ratio[0]:.2f}x)  decode {med[1]:.2f}s ({ratio[1]:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
