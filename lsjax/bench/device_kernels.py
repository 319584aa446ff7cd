"""Parts a and b of the device check (`lsjax.bench.device`, whose docstring states each part's goal): every
Pallas kernel against its reference, and the prefix kernel's bandwidth against a copy of the same bytes. Also
what the other parts share: the tolerances, the head shapes, the device's memory and a failure's one line.
Each part writes its rows, skip lines and notes to the check's `Report` (`rep`).
"""

from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

TOLERANCE = {"bfloat16": 1e-2, "float32": 1e-5}
HEADS = {"SmolLM2": (9, 3, 64), "Llama-3.1-8B": (32, 8, 128)}  # (query heads N, kv heads K, head dim H)


def device_memory() -> int | None:
    """Bytes the first device lets JAX allocate, where it says (GPU/TPU); None on a CPU."""
    try:
        stats = jax.devices()[0].memory_stats() or {}
    except Exception:  # noqa: BLE001 - some backends raise instead of returning None
        return None
    return stats.get("bytes_limit")


def fits(nbytes: int, margin: float = 0.85) -> bool:
    mem = device_memory()
    return mem is None or nbytes <= margin * mem


def is_oom(e: Exception) -> bool:
    return "RESOURCE_EXHAUSTED" in str(e) or "out of memory" in str(e).lower()


def first_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200]}" if text else type(e).__name__


def random_tree_mask(rng: np.random.Generator, size: int) -> np.ndarray:
    """Ancestor mask (incl. self) of a random tree whose parents precede their children. [T, T] bool."""
    parent = np.full(size, -1)
    parent[1:] = [rng.integers(0, i) for i in range(1, size)]
    mask = np.eye(size, dtype=bool)
    for i in range(1, size):
        mask[i] |= mask[parent[i]]
    return mask


# ---------------------------------------------------------------------------
# a. kernels against their references


def _poison(shape, dtype) -> None:
    """Fills freshly allocated device memory of the output's size with NaN and frees it, so the kernel's output
    buffer (the allocator hands the same block back) holds NaN wherever the kernel does not write."""
    jax.block_until_ready(jnp.full(shape, jnp.nan, dtype)).delete()


def rel_err(out, ref) -> float:
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    if not np.isfinite(out).all():
        return float("inf")
    return float(np.max(np.abs(out - ref)) / max(np.max(np.abs(ref)), 1e-30))


def lse_err(lse, ref) -> float:
    lse, ref = np.asarray(lse, np.float64), np.asarray(ref, np.float64)
    if not (np.isfinite(lse) == np.isfinite(ref)).all():
        return float("inf")
    fin = np.isfinite(ref)
    if not fin.any():
        return 0.0
    return float(np.max(np.abs(lse[fin] - ref[fin])) / max(1.0, np.max(np.abs(ref[fin]))))


def _normal(key, shape, dtype):
    return jax.random.normal(key, shape, jnp.float32).astype(dtype)


def kernel_target(dry: bool) -> tuple[str, bool]:
    """(platform, interpret) the kernels build for: this device's, or the interpreter in a dry run."""
    host = jax.default_backend()
    if dry or host == "cpu":
        return "gpu" if host == "gpu" else "tpu", True
    return ("tpu" if host == "tpu" else "gpu"), False


def check_kernels(rep) -> None:
    from pallas_kernels import invariant_attention as ik
    from pallas_kernels import prefix_attention as pk
    from pallas_kernels import tree_attention as tk

    cfg = rep.config
    platform, interpret = kernel_target(cfg.dry)
    lowering = {"gpu": "Pallas Triton", "tpu": "Mosaic TPU"}[platform]
    rep.note("kernels", f"{lowering} variants, {'interpreted' if interpret else 'compiled for this device'}")
    if platform == "tpu" and not interpret:
        rep.note("kernels", "invariant: no Mosaic variant; batch-invariant numerics run the XLA version here")
    S, L, layer = (200, 3, 2) if cfg.dry else (5000, 3, 2)
    case = 0
    for heads, (N, K, H) in HEADS.items():
        if platform == "gpu" and H & (H - 1):
            rep.skip("kernels", f"{heads}: head_dim {H} is not a power of 2 (Triton); lsjax runs XLA there")
            continue
        for T in cfg.kernel_T:
            for dtype in ("bfloat16", "float32"):
                for kernel in ("prefix", "tree", "tree-causal", "invariant"):
                    if rep.over_budget("kernels", f"{kernel} {heads} T={T} {dtype}"):
                        return
                    if kernel == "invariant" and platform == "tpu" and not interpret:
                        continue  # no Mosaic variant: a TPU runs the XLA version (noted once below)
                    case += 1
                    rng = np.random.default_rng(case)  # the tree masks
                    kq, kk, kv = jax.random.split(jax.random.key(case), 3)  # drawn on the device: fast at 5K
                    jd = jnp.dtype(dtype)
                    B = 2
                    q = _normal(kq, (B, T, N, H), jd)
                    try:
                        bits = ""
                        if kernel == "invariant":
                            k = _normal(kk, (L, B, K, S, H), jd)
                            v = _normal(kv, (L, B, K, S, H), jd)
                            bounds = jnp.asarray(rng.integers(0, S + 1, (B, T)), jnp.int32)
                            _poison(q.shape, jd)
                            state = ik.invariant_cache_attention(q, k, v, bounds, layer, interpret=interpret)
                            out, lse = ik.output_of(*state)
                            with jax.default_matmul_precision("highest"):
                                ref, ref_lse = ik.invariant_cache_attention_reference(q, k, v, bounds, layer)
                            # Batch invariance on this device: the rows rolled into other tiles, same bits.
                            shift = T // 2 + 1
                            rolled = ik.invariant_cache_attention(
                                jnp.roll(q, shift, 1), k, v, jnp.roll(bounds, shift, 1), layer, interpret=interpret
                            )
                            same = all(
                                np.array_equal(np.roll(np.asarray(a), shift, 1), np.asarray(b))
                                for a, b in zip(state, rolled, strict=True)
                            )
                            bits = "" if same else "rows moved to other tiles changed bits"
                        elif kernel == "prefix":
                            k = _normal(kk, (L, B, K, S, H), jd)
                            v = _normal(kv, (L, B, K, S, H), jd)
                            lengths = jnp.array([S - 3, S // 3 + 1], jnp.int32)
                            start = jnp.array([0, S // 5], jnp.int32)  # a sliding window on row 1
                            _poison(q.shape, jd)
                            out, lse = pk.prefix_attention(
                                q, k, v, lengths, start, layer, platform=platform, interpret=interpret
                            )
                            with jax.default_matmul_precision("highest"):
                                ref, ref_lse = pk.prefix_attention_reference(q, k[layer], v[layer], lengths, start)
                        else:
                            causal = kernel == "tree-causal"
                            k = _normal(kk, (B, T, K, H), jd)
                            v = _normal(kv, (B, T, K, H), jd)
                            mask = (
                                None if causal else jnp.asarray(np.stack([random_tree_mask(rng, T) for _ in range(B)]))
                            )
                            _poison(q.shape, jd)
                            out, lse = tk.tree_attention(
                                q, k, v, mask, causal=causal, platform=platform, interpret=interpret
                            )
                            with jax.default_matmul_precision("highest"):
                                ref, ref_lse = tk.tree_attention_reference(q, k, v, mask, causal=causal)
                        jax.block_until_ready(out)
                    except Exception as e:  # noqa: BLE001 - a compile error is a result to report, not a crash
                        if is_oom(e):
                            rep.skip("kernels", f"{kernel} {heads} T={T} {dtype}: does not fit ({first_line(e)})")
                            continue
                        err, ok, detail = float("inf"), False, first_line(e)
                    else:
                        # The reference's inputs are the kernel's (bf16 included), upcast: it is the exact answer.
                        err = max(rel_err(out, ref.astype(jnp.float32)), lse_err(lse, ref_lse))
                        ok, detail = err <= TOLERANCE[dtype] and not bits, bits
                    rep.row(
                        "kernels",
                        dict(kernel=kernel, heads=heads, T=T, dtype=dtype, rel_err=err, ok=ok, error=detail),
                        f"{kernel:<11} {heads:<12} T={T:<4} {dtype:<8} rel err {err:.1e} "
                        f"{'ok' if ok else 'FAIL'}{' ' + detail if detail else ''}",
                    )


# ---------------------------------------------------------------------------
# b. bandwidth: the prefix kernel vs a copy of the same bytes


@functools.partial(jax.jit, static_argnames=("step",))
def _loop(x, iters, *args, step):
    """`iters` applications of `step` inside one program, each reading the last one's result (so neither can
    be hoisted out of the loop): the time per iteration without launch overhead."""
    return jax.lax.fori_loop(0, iters, lambda i, x: step(x, *args), x)


def time_loop(step, x, args, iters: int, repeats: int = 3) -> float:
    """Seconds per iteration of `step` (median of `repeats` runs of `iters` iterations, after a warm-up)."""
    jax.block_until_ready(_loop(x, 1, *args, step=step))
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(_loop(x, iters, *args, step=step))
        times.append((time.perf_counter() - t) / iters)
    return float(np.median(times))


def _copy_step(x):
    return -x  # one read and one write of every byte; XLA cannot fold it away across iterations


def _prefix_step(q, k, v, lengths, *, attend):
    out, _ = attend(q, k, v, lengths)
    return (q + out * 1e-3).astype(q.dtype)  # the next query depends on this output


def copy_bandwidth(nbytes: int, dry: bool) -> float:
    """Bytes moved per second (read + write) by an elementwise pass over `nbytes` of bf16."""
    x = jnp.ones((nbytes // 2,), jnp.bfloat16)
    t = time_loop(_copy_step, x, (), _bandwidth_iters(nbytes, dry))
    return 2 * nbytes / t


def _bandwidth_iters(kv_bytes: int, dry: bool) -> int:
    # Tens of milliseconds of reads per timing at HBM bandwidth: a timing of a few milliseconds left clock and
    # launch jitter in the figures (docs/hardware/README.md).
    return 3 if dry else max(50, int(6e10 // kv_bytes))


def check_bandwidth(rep) -> dict[int, float]:
    """Per context, the copy bandwidth (bytes/s) it measured; part c reads it."""
    from lsjax.attention import prefix_attention_xla, prefix_tuning
    from pallas_kernels import prefix_attention as pk

    cfg = rep.config
    platform, interpret = kernel_target(cfg.dry)
    N, K, H = HEADS["Llama-3.1-8B"]
    copy_bw: dict[int, float] = {}
    for S in cfg.contexts:
        if rep.over_budget("bandwidth", f"{S} tokens"):
            break
        kv_bytes = 2 * K * S * H * 2
        if not fits(4 * kv_bytes):
            rep.skip("bandwidth", f"{S} tokens: {4 * kv_bytes / 2**30:.1f} GiB do not fit this device")
            continue
        try:
            bw = copy_bandwidth(kv_bytes, cfg.dry)
            copy_bw[S] = bw
            kk, kv, kq = jax.random.split(jax.random.key(S), 3)
            k, v = _normal(kk, (1, K, S, H), jnp.bfloat16), _normal(kv, (1, K, S, H), jnp.bfloat16)
            q = _normal(kq, (1, 1, N, H), jnp.bfloat16)
            lengths = jnp.array([S], jnp.int32)
            iters = _bandwidth_iters(kv_bytes, cfg.dry)
            # The tuning lsjax decodes with on this device (`lsjax.attention.prefix_tuning`), not the kernel's.
            pallas = functools.partial(
                pk.prefix_attention, platform=platform, interpret=interpret, tuning=prefix_tuning(platform, interpret)
            )
            xla = prefix_attention_xla
            t = {
                name: time_loop(functools.partial(_prefix_step, attend=fn), q, (k, v, lengths), iters)
                for name, fn in (("pallas", pallas), ("xla", xla))
            }
        except Exception as e:  # noqa: BLE001
            rep.skip("bandwidth", f"{S} tokens: {first_line(e)}")
            continue
        row = dict(context=S, kv_mb=kv_bytes / 1e6, copy_gbs=bw / 1e9)
        for name, sec in t.items():
            row[f"{name}_us"] = sec * 1e6
            row[f"{name}_gbs"] = kv_bytes / sec / 1e9
            row[f"{name}_of_copy"] = kv_bytes / sec / bw
        rep.row(
            "bandwidth",
            row,
            f"{S:>6} tokens ({kv_bytes / 1e6:.0f} MB K/V): copy {bw / 1e9:.0f} GB/s; pallas {row['pallas_us']:.0f} us "
            f"= {row['pallas_gbs']:.0f} GB/s ({row['pallas_of_copy']:.0%} of copy); xla {row['xla_us']:.0f} us "
            f"({row['xla_of_copy']:.0%})",
        )
    if cfg.sweep and copy_bw:
        _sweep_prefix(rep, copy_bw)
    return copy_bw


def _sweep_prefix(rep, copy_bw: dict[int, float]) -> None:
    """Times PrefixTuning variants of the prefix kernel at the middle measured context, one note each."""
    from pallas_kernels import prefix_attention as pk

    cfg = rep.config
    platform, interpret = kernel_target(cfg.dry)
    N, K, H = HEADS["Llama-3.1-8B"]
    S = sorted(copy_bw)[len(copy_bw) // 2]
    kv_bytes = 2 * K * S * H * 2
    kk, kv, kq = jax.random.split(jax.random.key(S), 3)
    k, v = _normal(kk, (1, K, S, H), jnp.bfloat16), _normal(kv, (1, K, S, H), jnp.bfloat16)
    q = _normal(kq, (1, 1, N, H), jnp.bfloat16)
    lengths = jnp.array([S], jnp.int32)
    iters = _bandwidth_iters(kv_bytes, cfg.dry)
    rows = rep.parts["bandwidth"].setdefault("sweep", [])
    for variant in cfg.sweep:
        if rep.over_budget("bandwidth", f"sweep {dict(variant)}"):
            return
        try:
            tuning = pk.PrefixTuning(**dict(variant))
            fn = functools.partial(pk.prefix_attention, platform=platform, interpret=interpret, tuning=tuning)
            sec = time_loop(functools.partial(_prefix_step, attend=fn), q, (k, v, lengths), iters)
        except Exception as e:  # noqa: BLE001 - a variant the compiler refuses is a line, not the end
            rep.skip("bandwidth", f"sweep {dict(variant) or 'default'}: {first_line(e)}")
            continue
        rows.append(dict(context=S, tuning=dict(variant), us=sec * 1e6, of_copy=kv_bytes / sec / copy_bw[S]))
        rep.note(
            "bandwidth",
            f"sweep at {S}: {dict(variant) or 'kernel default'}: {sec * 1e6:.0f} us = "
            f"{kv_bytes / sec / copy_bw[S]:.0%} of copy",
        )
