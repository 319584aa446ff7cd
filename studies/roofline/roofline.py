"""The target forward against this machine's memory roofline, old and new layout, in one run.

    python -m studies.roofline.roofline                                  # SmolLM2, contexts 1K/2K/4K, 1-16 nodes
    python -m studies.roofline.roofline --context 1024 4096 --sizes 1 8 --repeats 15

At batch 1 a decode step must read every weight once, so its floor on a CPU is
the weight bytes over the memory bandwidth. This bench measures that floor
here and now (GEMVs over the model's own weight matrices, the same bytes a step
reads) and, interleaved in the same run, the verification forward (tree forward
+ LM head on every node, as `lsjax.engine.verify.tree_forward` runs it) at several
contexts and node counts, for two variants of the same code:

* `before`: the forward as it was: the training layout (weights stacked over
  layers, `lax.scan`), the old prefix-attention block rule (the largest of
  1024/512/256 dividing the cache capacity) and the old tied LM head
  (`h @ embed^T`);
* `stacked`: the training layout with today's attention and LM head (what
  training and any caller that skips `prepare_for_decode` run);
* `after`: `prepare_for_decode`'s layout with today's attention and LM head.

It prints, per variant: the 1-token step over the weight-read time at the
smallest context (goal <= 1.3x); the step's growth with context over the time
to read the extra K/V bytes at the same bandwidth (goal <= 2x); and the
8-node / 1-node ratio at the largest context (goal <= 1.3x). Timings are the
minimum over repeats (noise on a shared machine only ever adds time).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from lsjax import attention
from lsjax.cache import KVCache
from lsjax.config import ModelConfig
from lsjax.engine import cache_capacity, prompt_bucket
from lsjax.engine.verify import tree_forward
from lsjax.models import target
from lsjax.tree import TreeConfig, chain_parents, make_tree, root_only

VARIANTS = ("before", "stacked", "after")


def old_block_rule(capacity: int) -> int:
    """The prefix-attention block size before this bench's changes: it had to divide the capacity."""
    return next((b for b in (1024, 512, 256) if capacity % b == 0), 512)


@contextlib.contextmanager
def _xla_block(block: int | None):
    """Traces inside this context use `block` keys per prefix-attention iteration (None: the default)."""
    saved = attention.XLA_BLOCK
    attention.XLA_BLOCK = block or saved
    try:
        yield
    finally:
        attention.XLA_BLOCK = saved


def weight_matrices(prepared: dict, config: ModelConfig) -> list[tuple[jax.Array, bool]]:
    """Every matrix a decode step reads (the LM head once) as (2-D array, read transposed)."""
    # Out-major projections ([out, in], `target.prepare_for_decode` on a CPU) are read as w @ h. A CPU keeps
    # both orders (`layout="both"`), of which a step reads one: the [in, out] twin where it exists.
    mats = [
        (w, name.endswith("_t"))
        for layer in prepared["layers"]
        for name, w in layer.items()
        if w.ndim == 2 and not (name.endswith("_t") and name[:-2] in layer)
    ]
    if config.tie_embeddings:
        return mats + [(prepared["embed"], True)]  # [V, D], read as embed @ h like the tied head
    return mats + [(prepared["lm_head"], False)]


def weight_read_fn(mats: list[tuple[jax.Array, bool]]) -> Callable:
    """A jitted function that reads every matrix once with a GEMV (its time is the weight-read floor)."""
    flags = tuple(t for _, t in mats)

    def f(ws, x):
        total = jnp.zeros((), jnp.float32)
        for w, transposed in zip(ws, flags):
            y = w @ x[: w.shape[1]] if transposed else x[: w.shape[0]] @ w
            total = total + jnp.sum(y)
        return total

    return jax.jit(f)


def gemm_fn() -> Callable:
    """A compute-bound GEMM ([M, D] x one layer's fused weights, M = 128): its rate is this machine's FLOP roof
    for the shapes a tree forward runs."""
    return jax.jit(lambda ws, x: [x[:, : w.shape[0]] @ w for w in ws])


def flops_per_node(config: ModelConfig, context: int) -> int:
    """FLOPs one more verified node adds: every weight matrix (GEMV) and the attention over the cache."""
    D, F, L, V = config.hidden_size, config.intermediate_size, config.num_layers, config.vocab_size
    N, K, H = config.num_heads, config.num_kv_heads, config.head_dim
    weights = L * (D * (N + 2 * K) * H + N * H * D + 3 * D * F) + V * D
    return 2 * weights + 2 * 2 * L * N * H * context  # q.k and p.v for every query head


def _verify(params, tree, cache, *, config):
    return tree_forward(params, config, tree, cache)[0]


def _old_verify(params, tree, cache, *, config):
    """tree_forward with the LM head as it was (`h @ embed^T`, slower for more than one row on XLA CPU)."""
    positions = cache.lengths[:, None] + tree.depth
    hidden, _, _ = target.forward_hidden(params, config, tree.tokens, positions, cache, tree_mask=tree.mask)
    h = target.rms_norm(hidden, params["final_norm"], config.rms_norm_eps)
    if config.tie_embeddings:
        return jnp.einsum("...d,vd->...v", h, params["embed"]).astype(jnp.float32)
    return jnp.einsum("...d,dv->...v", h, params["lm_head"]).astype(jnp.float32)


def chain_tree(config: ModelConfig, T: int):
    toks = jnp.asarray(np.random.RandomState(T).randint(0, config.vocab_size, (1, T)), jnp.int32)
    if T == 1:
        return root_only(toks[:, 0])
    return make_tree(toks, jnp.asarray(chain_parents(T))[None], jnp.ones((1, T), bool), TreeConfig((1,) * (T - 1)))


def measure(
    config: ModelConfig,
    params: dict,
    contexts: list[int],
    sizes: list[int],
    *,
    repeats: int = 7,
    variants: tuple[str, ...] = VARIANTS,
    capacity: int | None = None,
    log: Callable[[str], None] = print,
) -> dict:
    """Times every (variant, context, node count) interleaved; returns the raw minima and the ratios."""
    capacity = capacity or cache_capacity(prompt_bucket(max(contexts)), 128)
    if max(contexts) + max(sizes) > capacity:
        raise ValueError(f"capacity {capacity} is too small for context {max(contexts)} + {max(sizes)} nodes")
    stacked = jax.tree.map(jnp.asarray, params)
    if target.is_prepared(stacked):
        raise ValueError("pass the stacked (loader) layout: the bench builds both")
    layouts = {"before": stacked, "stacked": stacked, "after": target.prepare_for_decode(stacked, config)}
    blocks = {"before": old_block_rule(capacity), "stacked": None, "after": None}
    mats = weight_matrices(layouts["after"], config)
    weight_bytes = sum(w.nbytes for w, _ in mats)
    read, ws = weight_read_fn(mats), [w for w, _ in mats]
    x = jnp.ones((max(max(w.shape) for w in ws),), jnp.dtype(config.dtype))
    jax.block_until_ready(read(ws, x))
    in_major = target.prepare_for_decode(stacked, config, layout="in")["layers"][0]
    gemm, gemm_ws = gemm_fn(), [in_major[k] for k in ("w_qkv", "w_gate_up", "w_down")]
    gemm_x = jnp.ones((128, max(w.shape[0] for w in gemm_ws)), x.dtype)
    gemm_flops = sum(2 * 128 * w.size for w in gemm_ws)
    jax.block_until_ready(gemm(gemm_ws, gemm_x))

    zeros = KVCache.zeros(config, 1, capacity)
    caches = {c: KVCache(zeros.k, zeros.v, jnp.array([c], jnp.int32)) for c in contexts}
    trees = {T: chain_tree(config, T) for T in sizes}
    compiled, compile_s = {}, {}
    for name in variants:
        fn = jax.jit(functools.partial(_old_verify if name == "before" else _verify, config=config))
        for T in sizes:
            t = time.perf_counter()
            with _xla_block(blocks[name]):
                compiled[name, T] = fn.lower(layouts[name], trees[T], caches[contexts[0]]).compile()
            compile_s[name, T] = time.perf_counter() - t
            jax.block_until_ready(compiled[name, T](layouts[name], trees[T], caches[contexts[0]]))
        log(f"compiled {name}: " + ", ".join(f"{T} nodes {compile_s[name, T]:.1f} s" for T in sizes))

    read_times, gemm_times = [], []
    times = {(n, c, T): [] for n in variants for c in contexts for T in sizes}
    for _ in range(repeats):  # interleaved, so machine noise hits every variant alike
        t = time.perf_counter()
        jax.block_until_ready(read(ws, x))
        read_times.append(time.perf_counter() - t)
        t = time.perf_counter()
        jax.block_until_ready(gemm(gemm_ws, gemm_x))
        gemm_times.append(time.perf_counter() - t)
        # 1-node steps at every context back to back (the context growth compares them), then the trees.
        order = [(c, sizes[0]) for c in contexts] + [(c, T) for c in contexts for T in sizes[1:]]
        for c, T in order:
            for n in variants:
                t = time.perf_counter()
                jax.block_until_ready(compiled[n, T](layouts[n], trees[T], caches[c]))
                times[n, c, T].append(time.perf_counter() - t)

    weight_read = min(read_times)
    bandwidth = weight_bytes / weight_read
    flop_rate = gemm_flops / min(gemm_times)
    itemsize = jnp.dtype(config.dtype).itemsize
    kv_bytes_per_token = 2 * config.num_layers * config.num_kv_heads * config.head_dim * itemsize
    best = {key: min(v) for key, v in times.items()}
    c0, c1 = min(contexts), max(contexts)
    summary = {}
    for n in variants:
        s = {"step_vs_weight_read": best[n, c0, 1] / weight_read if 1 in sizes else None}
        if c1 > c0 and 1 in sizes:
            kv_time = (c1 - c0) * kv_bytes_per_token / bandwidth
            s["context_growth_vs_kv_read"] = (best[n, c1, 1] - best[n, c0, 1]) / kv_time
            s["ms_per_1k_context"] = (best[n, c1, 1] - best[n, c0, 1]) / (c1 - c0) * 1024 * 1e3
        if 1 in sizes and 8 in sizes:
            s["8_vs_1_at_max_context"] = best[n, c1, 8] / best[n, c1, 1]
        if 1 in sizes and max(sizes) > 1:
            # What the extra nodes cost over the time their FLOPs take at the GEMM rate (1 = compute-bound).
            for T in sizes[1:]:
                extra = (T - 1) * flops_per_node(config, c1) / flop_rate
                s[f"{T}_node_increment_vs_flops"] = (best[n, c1, T] - best[n, c1, 1]) / extra
        summary[n] = s
    return {
        "capacity": capacity,
        "weight_bytes": weight_bytes,
        "weight_read_s": weight_read,
        "bandwidth": bandwidth,
        "flop_rate": flop_rate,
        "kv_read_s_per_1k": 1024 * kv_bytes_per_token / bandwidth,
        "times": best,
        "compile_s": compile_s,
        "summary": summary,
    }


def report(res: dict, contexts: list[int], sizes: list[int], variants, log=print) -> None:
    log(
        f"weights {res['weight_bytes'] / 1e6:.0f} MB read by GEMV in {res['weight_read_s'] * 1e3:.1f} ms "
        f"({res['bandwidth'] / 1e9:.1f} GB/s); K/V read {res['kv_read_s_per_1k'] * 1e3:.2f} ms per 1K context; "
        f"GEMM {res['flop_rate'] / 1e9:.0f} GFLOP/s; cache capacity {res['capacity']}"
    )
    t = res["times"]
    head = "".join(f" {n + ' ms':>11} {'x 1-node':>9}" for n in variants)
    ratio = f" {variants[-1]}/{variants[0]}" if len(variants) > 1 else ""
    log(f"{'context':>8} {'nodes':>6}{head}{ratio}")
    for c in contexts:
        for T in sizes:
            row = "".join(f" {t[n, c, T] * 1e3:>11.1f} {t[n, c, T] / t[n, c, sizes[0]]:>8.2f}x" for n in variants)
            if len(variants) > 1:
                row += f" {t[variants[-1], c, T] / t[variants[0], c, T]:>9.2f}x"
            log(f"{c:>8} {T:>6}{row}")
    c0, c1 = min(contexts), max(contexts)
    names = {
        "step_vs_weight_read": f"1-token step / weight read at {c0} (goal <= 1.3)",
        "context_growth_vs_kv_read": f"step growth {c0}->{c1} / K/V read time (goal <= 2)",
        "ms_per_1k_context": "step growth, ms per 1K context",
        "8_vs_1_at_max_context": f"8-node / 1-node at {c1} (goal <= 1.3)",
    }
    for T in sizes[1:]:
        names[f"{T}_node_increment_vs_flops"] = f"{T}-node cost over 1-node / its FLOPs at GEMM rate"
    for key, label in names.items():
        vals = [res["summary"][n].get(key) for n in variants]
        if any(v is not None for v in vals):
            log(f"{label:>52}: " + "  ".join(f"{n} {v:.2f}" for n, v in zip(variants, vals) if v is not None))
    comp = "  ".join(f"{n} {res['compile_s'][n, sizes[0]]:.1f} s" for n in variants)
    log(f"{'compile, ' + str(sizes[0]) + '-node verify forward':>52}: {comp}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--context", type=int, nargs="+", default=[1024, 2048, 4096], help="committed tokens")
    p.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16], help="verified nodes (root incl.)")
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    p.add_argument("--capacity", type=int, default=None, help="cache slots (default: decode.py's for the max context)")
    args = p.parse_args(argv)
    from lsjax.loading import load_model

    model = load_model()
    contexts, sizes = sorted(args.context), sorted(args.sizes)
    print(f"device: {jax.devices()[0].device_kind}; model {model.config.name}")
    res = measure(
        model.config,
        model.params,
        contexts,
        sizes,
        repeats=args.repeats,
        variants=tuple(args.variants),
        capacity=args.capacity,
    )
    report(res, contexts, sizes, tuple(args.variants))


if __name__ == "__main__":
    main()
