"""A GGUF model's params as `load_model` made them, kept on disk so that the next start maps them instead of
dequantizing again.

Why: `decode.py` on the bundled SmolLM2 spent ~2.3 s in `load_model` on a 2-core CPU before its prefill (1.1 s
of the `gguf` package's dequantization, 0.6 s of transposes into lsjax's layout, 0.3 s parsing), every start
and every method; mapped back, the same arrays take a fraction of that. Only `decode.py` keeps them (in its
compile cache's directory, off with `--compile-cache off`): a library writes nothing to disk unless asked.

Keyed by the file as it is on disk (path, size, modification time), the dtype and this package's source (a
change to how a GGUF is read makes every entry new). Models of more than `MAX_BYTES` are not kept, and only
the newest `MAX_MODELS`. An entry that cannot be read is made again; one that cannot be written is skipped
with one line, and the load goes on.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np

MAX_BYTES = 4 << 30  # an 8B model in bf16 (16 GB) is read from its GGUF each time rather than kept twice
MAX_MODELS = 2
INDEX = "index.json"


@functools.cache
def _source_digest() -> str:
    here = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for path in sorted([*here.glob("*.py"), here.parent / "config.py"]):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def key(path: Path, dtype: str) -> str | None:
    """The entry of `path` loaded as `dtype`; None where the file cannot be stat'ed."""
    try:
        stat = Path(path).resolve().stat()
    except OSError:
        return None
    text = repr((str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns, dtype, _source_digest()))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _dtype(name: str) -> np.dtype:
    try:
        return np.dtype(name)
    except TypeError:
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))


def _flat(params: dict, prefix: str = "") -> list[tuple[str, np.ndarray]]:
    out = []
    for k, v in params.items():
        if isinstance(v, dict):
            out += _flat(v, f"{prefix}{k}/")
        else:
            out.append((f"{prefix}{k}", v))
    return out


def read(root: Path, entry: str) -> dict | None:
    """The params kept as `entry`, each array mapped read-only from its file; None where there is none (or it
    cannot be read)."""
    where = Path(root) / entry
    try:
        index = json.loads((where / INDEX).read_text())
        params: dict = {}
        for i, (name, shape, dtype) in enumerate(index["arrays"]):
            # Stored as unsigned ints of the element's size: .npy has no bfloat16.
            array = np.load(where / f"{i}.npy", mmap_mode="r").view(_dtype(dtype))
            if list(array.shape) != shape:
                return None
            *parents, leaf = name.split("/")
            node = params
            for p in parents:
                node = node.setdefault(p, {})
            node[leaf] = array
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # none yet, damaged or another version's
        return None
    with contextlib.suppress(OSError):
        os.utime(where)  # kept as recently used
    return params


def write(root: Path, entry: str, params: dict) -> None:
    """Keeps `params` as `entry` (skipped above `MAX_BYTES`; one warning line where the disk refuses)."""
    arrays = _flat(params)
    if sum(a.nbytes for _, a in arrays) > MAX_BYTES:
        return
    root = Path(root)
    tmp = root / f".{entry}.{os.getpid()}.tmp"
    try:
        tmp.mkdir(parents=True, exist_ok=True)
        for i, (_, a) in enumerate(arrays):
            np.save(tmp / f"{i}.npy", np.asarray(a).view(f"u{a.dtype.itemsize}"), allow_pickle=False)
        (tmp / INDEX).write_text(json.dumps({"arrays": [(n, list(a.shape), str(a.dtype)) for n, a in arrays]}))
        shutil.rmtree(root / entry, ignore_errors=True)
        tmp.rename(root / entry)  # whole or not at all: a reader never sees half an entry
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        print(
            f"[lsjax] warning: cannot keep the loaded weights in {root} ({e.strerror or e}); the next start "
            "reads the model file again",
            file=sys.stderr,
        )
        return
    entries = [p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")]
    for old in sorted(entries, key=lambda p: p.stat().st_mtime, reverse=True)[MAX_MODELS:]:
        shutil.rmtree(old, ignore_errors=True)
