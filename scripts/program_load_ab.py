"""What a stored program costs to load: each program file (`lsjax.engine.programs`, "*.lsjax-program") read and
loaded alone, and again on a thread beside a fixed 2-core XLA workload (a stand-in for the prefill a start loads
its first decode program beside); interleaved over `--rounds`, the order rotating. Prints, per file, the medians
of the load alone, the workload's seconds beside the load and the seconds until both were done.

    python scripts/program_load_ab.py NAME=FILE [NAME=FILE ...] [--rounds 5]

e.g. AR's decode program against auto's first group, from two compile caches that decode.py filled.
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import threading
import time
import zlib


def load(path: str):
    from jax.experimental.serialize_executable import deserialize_and_load

    with open(path, "rb") as f:
        payload, in_tree, out_tree = pickle.loads(zlib.decompress(f.read()))
    return deserialize_and_load(payload, in_tree, out_tree)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", metavar="NAME=FILE")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    if any("=" not in f for f in args.files):
        p.error("give each program as NAME=FILE")
    files = dict(f.split("=", 1) for f in args.files)

    import jax
    import jax.numpy as jnp

    @jax.jit
    def work(x):
        return jax.lax.fori_loop(0, 40, lambda i, x: jnp.tanh(x @ x) * 0.5, x)

    x = jnp.full((1536, 1536), 0.01, jnp.float32)
    work(x).block_until_ready()
    t = time.perf_counter()
    work(x).block_until_ready()
    print(f"workload alone: {time.perf_counter() - t:.2f} s", flush=True)

    names = list(files)
    res = {n: {"load_alone_s": [], "workload_beside_s": [], "both_done_s": []} for n in names}
    for r in range(args.rounds):
        for n in names[r % len(names) :] + names[: r % len(names)]:
            t = time.perf_counter()
            load(files[n])
            res[n]["load_alone_s"].append(time.perf_counter() - t)
            t = time.perf_counter()
            th = threading.Thread(target=load, args=(files[n],))
            th.start()
            work(x).block_until_ready()
            res[n]["workload_beside_s"].append(time.perf_counter() - t)
            th.join()
            res[n]["both_done_s"].append(time.perf_counter() - t)
    for n in names:
        print(n, {k: round(statistics.median(v), 3) for k, v in res[n].items()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
