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
