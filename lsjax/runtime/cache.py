"""JAX's persistent compilation cache for the command-line tools: a second `decode.py` run of the same
decode reads its compiled programs from disk instead of compiling them again (docs/design/cpu-startup.md).

Only the CLIs call `enable`. It changes JAX's global configuration (`jax_compilation_cache_dir` and the
thresholds for what is cached), which a library must not do behind its caller's back: `lsjax.generate`,
`Generator` and `load_model` leave it as the caller set it. A program using lsjax turns the cache on itself,
`jax.config.update("jax_compilation_cache_dir", path)`.

Where (`resolve`): `--compile-cache DIR|off`, else `$LSJAX_COMPILE_CACHE` (same values), else JAX's own
setting when the caller made one (`$JAX_COMPILATION_CACHE_DIR`), else `$XDG_CACHE_HOME/lsjax/jax-cache`
(`~/.cache/lsjax/jax-cache`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ENV = "LSJAX_COMPILE_CACHE"
OFF = "off"
# Cache every program that took this long to compile: the decode loop's pieces take seconds on a CPU, and
# JAX's default (1 s) would skip the smaller ones.
MIN_COMPILE_S = 0.5


def cache_root() -> Path:
    """lsjax's folder of caches: `$XDG_CACHE_HOME/lsjax` (`~/.cache/lsjax`)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lsjax"


def default_dir() -> Path:
    return cache_root() / "jax-cache"


def _requested(flag: str | None) -> str | None:
    """What the user asked for: the flag, else the environment variable, else None."""
    return flag if flag is not None else os.environ.get(ENV) or None


def _is_off(spec: str) -> bool:
    return spec.strip().lower() == OFF


def resolve(flag: str | None) -> Path | None:
    """The cache directory for `--compile-cache` value `flag` (None: not given); None when it is off or JAX
    already has one (set by the caller's environment)."""
    spec = _requested(flag)
    if spec is not None:
        return None if _is_off(spec) else Path(spec).expanduser()
    import jax

    return None if jax.config.jax_compilation_cache_dir else default_dir()


def enable(flag: str | None, prog: str = "lsjax") -> Path | None:
    """Turns the persistent cache on in `resolve(flag)`; returns the directory (None: off, or JAX's own). A
    directory that cannot be created costs one warning line and the cache, nothing more."""
    path = resolve(flag)
    if path is None:
        return None
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        print(f"{prog}: warning: compile cache off: cannot create {path}: {e.strerror or e}", file=sys.stderr)
        return None
    import jax

    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_S)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return path


def programs_dir(flag: str | None) -> Path | None:
    """Where the CLIs keep whole compiled programs (`lsjax.runtime.programs`, found without tracing): a folder
    in JAX's cache directory, wherever that is; None when `--compile-cache off` (or the variable) says off."""
    spec = _requested(flag)
    if spec is not None and _is_off(spec):
        return None
    import jax

    root = jax.config.jax_compilation_cache_dir
    return Path(root) / "lsjax-programs" if root else None


def weights_dir(flag: str | None) -> Path | None:
    """Where the CLIs keep a GGUF model's loaded params (`lsjax.runtime.weights`): beside `programs_dir`."""
    programs = programs_dir(flag)
    return programs.with_name("lsjax-weights") if programs is not None else None
