"""What a few rows of activations cost against one, through a chain of 30 fp32 projections [576, 1536] (SmolLM2's
width, a quarter of its per-layer weights): XLA:CPU with its YNNPACK fusions (the default), without them (XLA's
own GEMM), and numpy's OpenBLAS, the weights [in, out] and [out, in]. Milliseconds per chain, median of 20.

    python scripts/small_rows_dot.py [--rows 1 2 5 9 16]

A verification of 9 nodes runs every projection on 9 rows; an AR step on one. Where the dots read the weights
once for all rows (memory-bound), 9 rows would cost about what one does.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

K, N, LAYERS = 576, 1536, 30


def weights():
    import numpy as np

    rng = np.random.default_rng(0)
    w_in = [rng.standard_normal((K, N), dtype=np.float32) for _ in range(LAYERS)]
    return w_in, [np.ascontiguousarray(w.T) for w in w_in]


def median_ms(f, repeats: int = 20) -> float:
    import numpy as np

    f()
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    return round(float(np.median(ts)) * 1e3, 2)


def jax_rows(rows: list[int]) -> dict:
    import jax
    import jax.numpy as jnp

    w_in, w_out = weights()
    w_in, w_out = [jnp.asarray(w) for w in w_in], [jnp.asarray(w) for w in w_out]

    def chain_in(x, ws):
        for w in ws:
            x = x + (x @ w)[:, :K]
        return x

    def chain_out(x, ws):
        for w in ws:
            x = x + jnp.einsum("mk,nk->mn", x, w)[:, :K]
        return x

    out = {}
    for layout, f, ws in (("in", chain_in, w_in), ("out", chain_out, w_out)):
        g = jax.jit(f)
        for m in rows:
            x = jnp.ones((m, K), jnp.float32)
            out[f"{layout} {m}"] = median_ms(lambda g=g, x=x, ws=ws: g(x, ws).block_until_ready())
    return out


def numpy_rows(rows: list[int]) -> dict:
    import numpy as np

    w_in, w_out = weights()
    out = {}
    for m in rows:
        x = np.ones((m, K), np.float32)
        out[f"in {m}"] = median_ms(lambda x=x: [x @ w for w in w_in])
        out[f"out {m}"] = median_ms(lambda x=x: [x @ w.T for w in w_out])
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, nargs="+", default=[1, 2, 5, 9, 16])
    p.add_argument("--child", choices=("jax",), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(jax_rows(args.rows)))
        return 0
    cmd = [sys.executable, __file__, "--child", "jax", "--rows", *map(str, args.rows)]
    results = {}
    for name, flags in (("YNNPACK", ""), ("XLA GEMM", "--xla_cpu_experimental_ynn_fusion_type=")):
        env = {**os.environ, "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip()}
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
        results[name] = json.loads(done.stdout.strip().splitlines()[-1])
    results["OpenBLAS"] = numpy_rows(args.rows)
    print("rows  layout  " + "  ".join(f"{k:>9}" for k in results))
    for layout in ("in", "out"):
        for m in args.rows:
            cells = "  ".join(f"{results[k][f'{layout} {m}']:9.2f}" for k in results)
            print(f"{m:4d}  {layout:>6}  {cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
