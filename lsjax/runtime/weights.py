"""Weights made from a model file, kept on disk so that the next start maps them instead of making them again:
a GGUF's params as `load_model` makes them, and decode.py's params prepared for decoding.

Why: making them (a GGUF's dequantization, transposes into lsjax's layout, and `prepare_for_decode`'s per-layer
fused and transposed copies) takes seconds of every start on a CPU; mapped back, the same arrays take a
fraction of that (docs/design/cpu-startup.md). Only `decode.py` keeps them (in its compile cache's directory, off
with `--compile-cache off`): a library writes nothing to disk unless asked.

An entry is keyed by what made it: the model file as it is on disk (path, size, modification time), what the
caller names (the dtype, the layout) and the source of the code that makes weights (this package, the config
and the models: a change there makes every entry new). Entries of more than `MAX_BYTES` are not kept, and only
the newest `MAX_ENTRIES`. An entry that cannot be read is made again; one that cannot be written is skipped
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
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

MAX_BYTES = 4 << 30  # an 8B model in bf16 (16 GB) is made from its file each time rather than kept twice
MAX_ENTRIES = 4  # two models, each as loaded and as prepared
INDEX = "index.json"
_warned: list = []  # one warning line per process
_writers: list[threading.Thread] = []  # writes under way (`defer_writes`)
_defer: list = []  # non-empty: `kept` leaves its writes to a thread begun later (`defer_writes`)


def defer_writes() -> None:
    """From now on in this process, an entry `kept` makes is written later, on a thread of its own, once
    `start_writes` (or `wait`) is called: decode.py, after its output. Written beside a first start's prefill
    and decode, even at the lowest CPU priority, they delay its first and last token
    (docs/design/cpu-startup.md)."""
    _defer.append(True)


def start_writes() -> None:
    """Begins the writes `defer_writes` has held back."""
    for writer in _writers:
        if writer.ident is None:
            writer.start()


def pending() -> bool:
    """Whether writes `defer_writes` left are held back or under way."""
    return any(writer.ident is None or writer.is_alive() for writer in _writers)


def wait() -> None:
    """Begins the writes `defer_writes` has held back and waits for them."""
    start_writes()
    while _writers:
        _writers.pop().join()


@functools.cache
def _source_digest() -> str:
    package = Path(__file__).resolve().parents[1]
    files = [*package.glob("loading/*.py"), *package.glob("models/*.py"), package / "config.py"]
    h = hashlib.sha256()
    for path in sorted(files):
        h.update(str(path.relative_to(package)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def model_file(path: str | Path) -> tuple | None:
    """What identifies a model file (or an HF directory) as it is on disk; None where it cannot be stat'ed."""
    try:
        path = Path(path).resolve()
        files = sorted(path.iterdir()) if path.is_dir() else [path]  # (a directory's own time misses edits)
        return (str(path), *((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files if f.is_file()))
    except OSError:
        return None


def kept(root: str | Path | None, what: tuple, make: Callable[[], object]):
    """`make()` (a tree of dicts and tuples of numpy arrays), or the copy kept under `root` by an earlier call
    with the same `what` (its arrays mapped from their files); read-only either way. `root` None: `make()`, as
    made, nothing kept."""
    if root is None:
        return make()
    root = Path(root)
    entry = hashlib.sha256(repr((what, _source_digest())).encode()).hexdigest()[:32]
    tree = _read(root / entry)
    if tree is None:
        # Read-only as a mapped copy is: the same tree whether made or mapped.
        tree = read_only(make())
        if _defer:
            _writers.append(threading.Thread(target=_write_later, args=(root, entry, tree), name="lsjax-keep-weights"))
        else:
            _write(root, entry, tree)
    return tree


def read_only(tree):
    """`tree` with its numpy arrays made read-only (in place), which a CPU device then uses without a copy
    (`lsjax.engine.host.on_device`), sparing a first start the copy (fresh memory for the whole model). Only
    for arrays nothing else will change."""
    for _, array in _flat(tree):
        if isinstance(array, np.ndarray):
            array.flags.writeable = False
    return tree


def _dtype(name: str) -> np.dtype:
    try:
        return np.dtype(name)
    except TypeError:
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))


def _flat(tree, path=()) -> list[tuple[tuple, np.ndarray]]:
    """(path, array) of every leaf; a path step is a dict key (str) or a tuple index (int)."""
    if isinstance(tree, dict):
        return [leaf for k, v in tree.items() for leaf in _flat(v, (*path, k))]
    if isinstance(tree, tuple):
        return [leaf for i, v in enumerate(tree) for leaf in _flat(v, (*path, i))]
    return [(path, tree)]


def _unflat(leaves: list[tuple[list, np.ndarray]]):
    root: dict = {}
    for path, array in leaves:
        node = root
        for step in path[:-1]:
            node = node.setdefault(step, {})
        node[path[-1]] = array

    def build(node):
        if not isinstance(node, dict):
            return node
        if node and all(isinstance(k, int) for k in node):
            return tuple(build(node[i]) for i in range(len(node)))
        return {k: build(v) for k, v in node.items()}

    return build(root)


def _read(where: Path):
    try:
        index = json.loads((where / INDEX).read_text())
        leaves = []
        for i, (path, shape, dtype) in enumerate(index["arrays"]):
            # Stored as unsigned ints of the element's size: .npy has no bfloat16.
            array = np.load(where / f"{i}.npy", mmap_mode="r").view(_dtype(dtype))
            if list(array.shape) != shape:
                return None
            leaves.append((path, array))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # none yet, damaged or another version's
        return None
    with contextlib.suppress(OSError):
        os.utime(where)  # kept as recently used
    return _unflat(leaves)


def _write_later(root: Path, entry: str, tree) -> None:
    """`_write` at the lowest CPU priority (this thread only, Linux): the ~1.4 GB a first start keeps waits for
    the cores its compile and prefill leave free rather than sharing them."""
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    _write(root, entry, tree)


def _write(root: Path, entry: str, tree) -> None:
    leaves = [(path, np.asarray(a)) for path, a in _flat(tree)]
    if sum(a.nbytes for _, a in leaves) > MAX_BYTES:
        return
    tmp = root / f".{entry}.{os.getpid()}.tmp"
    try:
        tmp.mkdir(parents=True, exist_ok=True)
        for i, (_, a) in enumerate(leaves):
            np.save(tmp / f"{i}.npy", a.view(f"u{a.dtype.itemsize}"), allow_pickle=False)
        index = {"arrays": [(list(path), list(a.shape), str(a.dtype)) for path, a in leaves]}
        (tmp / INDEX).write_text(json.dumps(index))
        shutil.rmtree(root / entry, ignore_errors=True)
        tmp.rename(root / entry)  # whole or not at all: a reader never sees half an entry
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if not _warned:
            _warned.append(1)
            print(
                f"[lsjax] warning: cannot keep the loaded weights in {root} ({e.strerror or e}); the next start "
                "makes them from the model file again",
                file=sys.stderr,
            )
        return
    entries = [p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")]
    for old in sorted(entries, key=lambda p: p.stat().st_mtime, reverse=True)[MAX_ENTRIES:]:
        shutil.rmtree(old, ignore_errors=True)
    for stale in root.glob(".*.tmp"):  # a write a killed process left half done, an hour ago or more
        with contextlib.suppress(OSError):
            if time.time() - stale.stat().st_mtime > 3600:
                shutil.rmtree(stale, ignore_errors=True)
