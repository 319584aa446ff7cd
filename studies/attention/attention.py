"""Hybrid tree attention on this machine: the `xla` backend (split prefix + tree, LSE merge) vs `reference`.

`reference` is what HF eager attention does for tree verification: concatenate the cache and tree keys,
build the full [T, S + T] mask and take one softmax. Shapes are SmolLM2-135M's attention (N=9, K=3, H=64),
batch 1, fp32 (bf16 matmuls are ~10x slower on this CPU). Both backends are jitted and warmed up; timings
are the median over repeats, with the two backends interleaved so that machine noise hits both alike.

    python -m studies.attention.attention [--quick] [--breakdown] [--out bench_results/attention.png]
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from lsjax.attention import hybrid_tree_attention, prefix_attention, tree_attention
from lsjax.bench.device_kernels import random_tree_mask

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM = 9, 3, 64
BACKENDS = ("xla", "reference")


def make_inputs(cache_len: int, tree_size: int, seed: int = 0):
    rng = np.random.default_rng(seed)

    def normal(*shape):
        return jnp.asarray(rng.standard_normal(shape, dtype=np.float32))

    q = normal(1, tree_size, NUM_HEADS, HEAD_DIM)
    cache_k, cache_v = normal(1, NUM_KV_HEADS, cache_len, HEAD_DIM), normal(1, NUM_KV_HEADS, cache_len, HEAD_DIM)
    tree_k, tree_v = normal(1, tree_size, NUM_KV_HEADS, HEAD_DIM), normal(1, tree_size, NUM_KV_HEADS, HEAD_DIM)
    lengths = jnp.array([cache_len], jnp.int32)
    mask = jnp.asarray(random_tree_mask(rng, tree_size)[None])
    return q, cache_k, cache_v, lengths, tree_k, tree_v, mask


@functools.cache
def compiled(backend: str):
    return jax.jit(functools.partial(hybrid_tree_attention, backend=backend))


def time_once(fn, args) -> float:
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - t0


def bench_point(cache_len: int, tree_size: int, repeats: int) -> dict[str, float]:
    args = make_inputs(cache_len, tree_size)
    fns = {b: compiled(b) for b in BACKENDS}
    outs = {b: fn(*args) for b, fn in fns.items()}  # compile + warm up
    err = float(jnp.max(jnp.abs(outs["xla"] - outs["reference"])))
    if not err < 1e-4:
        raise AssertionError(f"xla and reference disagree at S={cache_len}, T={tree_size}: max abs err {err}")
    for fn in fns.values():
        time_once(fn, args)
    times: dict[str, list[float]] = {b: [] for b in BACKENDS}
    for r in range(repeats):
        order = BACKENDS if r % 2 == 0 else BACKENDS[::-1]
        for b in order:
            times[b].append(time_once(fns[b], args))
    return {b: statistics.median(ts) * 1e3 for b, ts in times.items()}


def breakdown_point(cache_len: int, tree_size: int, repeats: int) -> dict[str, float]:
    """Median ms of the xla backend's two parts alone (the rest of `hybrid` is the LSE merge)."""
    q, ck, cv, lengths, tk, tv, mask = make_inputs(cache_len, tree_size)
    fns = {
        "prefix": (jax.jit(functools.partial(prefix_attention, backend="xla")), (q, ck, cv, lengths)),
        "tree": (jax.jit(functools.partial(tree_attention, backend="xla")), (q, tk, tv, mask)),
        "hybrid": (compiled("xla"), (q, ck, cv, lengths, tk, tv, mask)),
    }
    times: dict[str, list[float]] = {name: [] for name in fns}
    for fn, args in fns.values():
        time_once(fn, args)
    for _ in range(repeats):
        for name, (fn, args) in fns.items():
            times[name].append(time_once(fn, args))
    return {name: statistics.median(ts) * 1e3 for name, ts in times.items()}


def plot(results, cache_lens, tree_sizes, out_path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_ms, ax_ratio) = plt.subplots(1, 2, figsize=(11, 4.2))
    for t, color in zip(tree_sizes, ("C0", "C1", "C2", "C3", "C4"), strict=False):
        ref = [results[(s, t)]["reference"] for s in cache_lens]
        xla = [results[(s, t)]["xla"] for s in cache_lens]
        ax_ms.plot(cache_lens, ref, "--o", color=color, label=f"reference T={t}")
        ax_ms.plot(cache_lens, xla, "-s", color=color, label=f"xla T={t}")
        ax_ratio.plot(cache_lens, [r / x for r, x in zip(ref, xla, strict=True)], "-o", color=color, label=f"T={t}")
    for ax in (ax_ms, ax_ratio):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("cache length (tokens)")
        ax.grid(alpha=0.3)
    ax_ms.set_yscale("log")
    ax_ms.set_ylabel("latency (ms, median)")
    ax_ms.set_title("hybrid tree attention, one layer")
    ax_ms.legend(fontsize=7)
    ax_ratio.axhline(4.0, color="gray", ls=":", label="4x target")
    ax_ratio.set_ylabel("reference / xla")
    ax_ratio.set_title(f"speedup (N={NUM_HEADS}, K={NUM_KV_HEADS}, H={HEAD_DIM}, B=1, fp32, CPU)")
    ax_ratio.legend(fontsize=7)
    fig.tight_layout()
    os.makedirs(os.path.dirname(out_path) or ".", exist_ok=True)
    fig.savefig(out_path, dpi=120)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer points and repeats (a smoke run)")
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats per backend and point")
    parser.add_argument("--cache-lens", type=int, nargs="+", default=None)
    parser.add_argument("--tree-sizes", type=int, nargs="+", default=None)
    parser.add_argument("--out", default="bench_results/attention.png", help="where to save the PNG plot")
    parser.add_argument("--breakdown", action="store_true", help="also time the xla prefix and tree parts alone")
    args = parser.parse_args(argv)
    cache_lens = args.cache_lens or ([1024, 8192] if args.quick else [1024, 4096, 8192, 16384, 32768])
    tree_sizes = args.tree_sizes or ([16, 69] if args.quick else [16, 32, 69])
    repeats = args.repeats or (5 if args.quick else 15)

    print(f"jax {jax.__version__} on {jax.default_backend()}; N={NUM_HEADS} K={NUM_KV_HEADS} H={HEAD_DIM} B=1 fp32")
    print(f"median of {repeats} interleaved repeats, jitted and warmed up\n")
    header = f"{'cache':>7} {'tree':>5} {'reference ms':>13} {'xla ms':>9} {'ratio':>7}"
    print(header)
    print("-" * len(header))
    results = {}
    for s in cache_lens:
        for t in tree_sizes:
            r = bench_point(s, t, repeats)
            results[(s, t)] = r
            print(
                f"{s:>7} {t:>5} {r['reference']:>13.3f} {r['xla']:>9.3f} {r['reference'] / r['xla']:>6.2f}x", flush=True
            )
    if args.breakdown:
        header = f"{'cache':>7} {'tree':>5} {'prefix ms':>10} {'tree ms':>8} {'hybrid ms':>10}"
        print(f"\nxla backend, parts alone\n{header}\n{'-' * len(header)}")
        for s in cache_lens:
            for t in tree_sizes:
                r = breakdown_point(s, t, repeats)
                print(f"{s:>7} {t:>5} {r['prefix']:>10.3f} {r['tree']:>8.3f} {r['hybrid']:>10.3f}", flush=True)
    plot(results, cache_lens, tree_sizes, args.out)
    print(f"\nplot saved to {args.out}")


if __name__ == "__main__":
    main()
