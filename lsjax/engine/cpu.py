"""The host processor: its model name and instruction-set flags, read once (Linux `/proc/cpuinfo`; elsewhere
the model from `platform` and no flags)."""

from __future__ import annotations

import contextlib
import functools
from pathlib import Path


@functools.cache
def info() -> tuple[str, frozenset[str]]:
    """(model name, flags) of the host CPU."""
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


MALLOC_ENV = "LSJAX_MALLOC"  # "default": leave glibc's malloc as it is (`no_fastbins`)


def no_fastbins() -> bool:
    """Turns off glibc malloc's fastbins for this process (`mallopt(M_MXFAST, 0)`), unless `$LSJAX_MALLOC` is
    "default"; returns whether it did. For a process that loads stored XLA:CPU programs (decode.py): a load
    builds and frees a great many small objects (the program's HLO from its proto, twice, and a thunk per
    kernel), and with fastbins a quarter of its time went to glibc consolidating them (`malloc_consolidate`,
    `unlink_chunk`). Without, auto's two decode programs loaded in 0.87 and 0.63-0.66 s against 0.93-0.96 and
    0.71-0.72 alone, and in 0.94-0.99 and 0.56-0.57 s against 1.12-1.24 and 0.72-0.73 beside decode.py's prefill
    (docs/CHANGELOG.md 2026-12-05). Process-wide and not undone, so only a program's entry point calls it, never
    the library. A no-op off glibc."""
    import ctypes
    import os

    if os.environ.get(MALLOC_ENV, "") == "default":
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to tune
        return False
    return bool(mallopt(1, 0))  # M_MXFAST = 1; glibc returns 1 on success
