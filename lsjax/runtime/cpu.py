"""The host processor and the process-wide settings a CPU start tunes: its model and instruction-set flags, the
allocator, thread priorities and which GEMM a few-row dot runs through. Why each is set as it is, with the
measurements: docs/design/cpu-startup.md."""

from __future__ import annotations

import contextlib
import functools
import os
from pathlib import Path

import jax


@functools.cache
def info() -> tuple[str, frozenset[str]]:
    """(model name, flags) of the host CPU: Linux's `/proc/cpuinfo`; elsewhere the model from `platform` and no
    flags."""
    model, flags = "", frozenset()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name" and not model:
                model = value.strip()
            elif key == "flags" and not flags:
                flags = frozenset(value.split())
            if model and flags:
                break
    if not model:
        import platform

        model = platform.processor() or platform.machine()
    return model, flags


def no_fastbins() -> bool:
    """Turns off glibc malloc's fastbins for this process (`mallopt(M_MXFAST, 0)`); returns whether it did.
    Loading a stored XLA:CPU program builds and frees a great many small objects, and with fastbins much of the
    load goes to consolidating them. Process-wide and not undone, so only a program's entry point calls it
    (`Startup.for_process`), never the library. A no-op off glibc."""
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to tune
        return False
    return bool(mallopt(1, 0))  # M_MXFAST = 1; glibc returns 1 on success


COMPUTE_THREADS = "tf_XLAEigen"  # the name of XLA:CPU's compute pool threads, which run every program


def idle_priority() -> bool:
    """Gives every thread of this process but the main thread and XLA:CPU's compute pool the lowest CPU priority
    (nice 19), so that what they do (XLA deserializes a loaded program on the thread that asks) yields to the
    decode. For the whole process, and not undone: an unprivileged process cannot raise a priority again. Linux
    only; returns whether it applied."""
    tasks = "/proc/self/task"
    names = {}
    try:
        for tid in os.listdir(tasks):
            with contextlib.suppress(OSError), open(f"{tasks}/{tid}/comm") as f:  # (one that ended: skipped)
                names[int(tid)] = f.read().strip()
    except OSError:  # not Linux
        return False
    if not any(n.startswith(COMPUTE_THREADS) for n in names.values()):
        return False  # (another XLA's names: the decode's own threads must not be the ones slowed)
    main = os.getpid()
    for tid, name in names.items():
        if tid != main and not name.startswith(COMPUTE_THREADS):
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, tid, 19)
    return True


# A decode program whose every step verifies this many rows or more is compiled without XLA:CPU's YNNPACK
# fusions and reads the projections stored [in, out] (`wide_program`).
WIDE_ROWS = 3
WIDE_OPTIONS = {"xla_cpu_experimental_ynn_fusion_type": ""}


def xla_gemm_pays() -> bool:
    """Whether this CPU runs a few rows' fp32 dots faster through XLA's own GEMM than through YNNPACK: an x86
    CPU with AVX2 and without AVX-512 (with AVX-512, YNNPACK picks wider kernels at run time and wins). Where
    the flags are unknown, XLA's default stays."""
    flags = info()[1]
    return "avx2" in flags and "avx512f" not in flags


def wide_program(num_nodes: int, mesh=None, dtype: str = "float32") -> bool:
    """Whether a decode program whose steps verify `num_nodes` rows each is compiled with `WIDE_OPTIONS` (its
    dots through XLA's own GEMM) and given the projections [in, out] only (`InLayout`): on a CPU where that
    GEMM pays (`xla_gemm_pays`), for fp32 weights, `WIDE_ROWS` rows or more, one device (a mesh's projections
    are [in, out] already). One row keeps YNNPACK, as does the prefill."""
    return (
        jax.default_backend() == "cpu"
        and mesh is None
        and dtype == "float32"
        and num_nodes >= WIDE_ROWS
        and xla_gemm_pays()
    )


class WideLowered:
    """A lowered program whose `compile()` passes `WIDE_OPTIONS`; an XLA without that option compiles it as is."""

    def __init__(self, lowered: jax.stages.Lowered):
        self.lowered = lowered

    def compile(self) -> jax.stages.Compiled:
        try:
            return self.lowered.compile(WIDE_OPTIONS)
        except jax.errors.JaxRuntimeError as e:
            if "No such compile option" not in str(e):
                raise
            return self.lowered.compile()


class InLayout:
    """A compiled program lowered for params in another layout (the projections [in, out] only): called with
    the params as the generator holds them, it runs on `view(params)`, made once per params object."""

    def __init__(self, program, view):
        self.program, self.view = program, view
        self._seen = self._viewed = None

    def __call__(self, params, *args):
        if params is not self._seen:
            self._seen, self._viewed = params, self.view(params)
        return self.program(self._viewed, *args)
