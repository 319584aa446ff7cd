"""A disk cache of compiled programs, found without tracing: a second `decode.py` of the same decode loads its
prefill and decode programs instead of tracing, lowering and compiling them again.

JAX's persistent compilation cache (`lsjax.runtime.cache`) spares XLA's compile, but JAX must still trace and
lower a program to find its cache key, a large share of a second start on a CPU (docs/design/cpu-startup.md). This cache
keys a program by what determines it, known before any tracing: lsjax's source, JAX's version and
configuration, `XLA_FLAGS`, the devices, the static configuration (the repr of a frozen dataclass such as
`SpecConfig`) and the arguments' tree structure, shapes and dtypes. It stores the executable serialized
(`jax.experimental.serialize_executable`); loading it costs what loading from JAX's cache costs.

Never cached (compiled as usual): a program whose static configuration holds code from outside lsjax (a
plugin method: its source is not in the key), one whose configuration's repr names an object by address,
and programs over a mesh. A program JAX found in its own persistent cache is stored as JAX's cache holds it
(the bytes of its fresh compile), not serialized again: XLA:CPU serializes a loaded executable without its
kernels (jaxlib 0.10.2: loaded again, it fails at its first run with "NOT_FOUND: Function ... not found"); where
those bytes cannot be had, such a program is not stored. A file that cannot be read or loaded is compiled
again and replaced; the newest `MAX_FILES` programs are kept.

Only a `lsjax.runtime.Startup` given one uses it, and only the command lines make one (next to JAX's cache): a
library writes nothing to disk unless asked.

Read ahead: a start notes the programs it needs first (`Generator.first_programs`: the prefill's and the first
decode program) under a tag (decode.py's: the model file and every flag but the prompt's), and the next start
with that tag reads them on a thread of their own while the model loads (`read_ahead`), before any key can be
computed (a key needs the params' shapes). A program read ahead is used only where a fetch computes its key,
so a tag that names the wrong files costs a read, never a wrong program.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import hashlib
import io
import json
import os
import pickle
import re
import sys
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import jax

from lsjax.runtime import cpu

MAX_FILES = 96  # a split `auto` keeps ~8 programs per prompt width, 3-5 MB each on a CPU
SUFFIX = ".lsjax-program"
HINTS = "first"  # the subdirectory of tag -> programs fetched first
_JAX_CACHE_HIT = "/jax/compilation_cache/cache_hits"
# Per thread, while this module compiles a program: JAX cache hits seen, and the executables JAX read.
_compiling = threading.local()
# Settings that move or describe caches and logs: the same program whatever they say.
_CONFIG_IGNORED = re.compile(r"cache|log|dump|pprint|traceback|explain")


@functools.cache
def _source_digest() -> str:
    """Every source file of the lsjax package: any edit makes every key new."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def _environment() -> str:
    import jaxlib

    devices = jax.devices()
    config = sorted((k, repr(v)) for k, v in jax.config.values.items() if not _CONFIG_IGNORED.search(k))
    return repr(
        (
            _source_digest(),
            jax.__version__,
            jaxlib.__version__,
            devices[0].platform,
            devices[0].client.platform_version,
            [d.device_kind for d in devices],
            # XLA:CPU compiles for the host's instruction set ("cpu" names no processor), and which programs keep
            # YNNPACK depends on it (`host.wide_program`): a cache shared by two kinds of CPU keeps each one's.
            (cpu.info()[0], sorted(cpu.info()[1])) if devices[0].platform == "cpu" else None,
            os.environ.get("XLA_FLAGS", ""),
            config,
        )
    )


def _foreign_code(obj, depth: int = 0) -> bool:
    """Whether a static configuration holds an object of a class defined outside lsjax (a plugin drafter)."""
    if depth > 8:
        return True
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        if not type(obj).__module__.startswith("lsjax."):
            return True
        return any(_foreign_code(getattr(obj, f.name), depth + 1) for f in dataclasses.fields(obj))
    if isinstance(obj, tuple | list):
        return any(_foreign_code(x, depth + 1) for x in obj)
    if isinstance(obj, dict):
        return any(_foreign_code(v, depth + 1) for v in obj.values())
    return not isinstance(obj, str | int | float | bool | type(None) | bytes)


def _leaf(x) -> str:
    return f"{tuple(x.shape)}:{x.dtype}:{getattr(x, 'weak_type', False)}"


def program_key(name: str, static, args) -> str | None:
    """The cache key of program `name` with static configuration `static` and arguments `args` (arrays or
    ShapeDtypeStructs); None when the program must not be cached (module docstring)."""
    text = repr(static)
    if _foreign_code(static) or re.search(r" at 0x[0-9a-f]+", text):
        return None
    h = hashlib.sha256()
    for part in (name, _environment(), text, str(jax.tree.structure(args)), *map(_leaf, jax.tree.leaves(args))):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def _on_event(event: str, **_kw) -> None:
    if event == _JAX_CACHE_HIT and getattr(_compiling, "hits", None) is not None:
        _compiling.hits += 1


@functools.cache
def _listen() -> None:
    jax.monitoring.register_event_listener(_on_event)
    _see_jax_cache_reads()


def _see_jax_cache_reads() -> None:
    """Keeps, per compiling thread, the serialized executable of each entry JAX reads from its persistent cache.

    Why: that is the only copy of the program with its kernels (above); JAX has no public way to hand it out,
    so its reader (`extract_executable_and_time`, called by `get_executable_and_time` through the module's
    globals in jax 0.10 and 0.11) is wrapped. If a JAX version moves it, nothing is kept and a program from
    JAX's cache is simply not stored."""
    try:
        from jax._src import compilation_cache as jax_cache
    except ImportError:
        return
    read = getattr(jax_cache, "extract_executable_and_time", None)
    if read is None or getattr(read, "_lsjax", False):
        return

    def extract(entry):
        serialized, compile_time = read(entry)
        seen = getattr(_compiling, "reads", None)
        if seen is not None:
            seen.append(serialized)
        return serialized, compile_time

    extract._lsjax = True
    jax_cache.extract_executable_and_time = extract


@dataclasses.dataclass
class _Compiled:
    program: jax.stages.Compiled
    from_jax_cache: bool
    jax_bytes: bytes | None  # the executable as JAX's cache holds it, where it came from there


def _compile(lower: Callable[[], jax.stages.Lowered]) -> _Compiled:
    """`lower().compile()`, and whether JAX loaded the program from its persistent cache, with the bytes it
    read. JAX compiles in the calling thread, so what this thread sees while compiling is this program's; the
    lowering is left out because it may compile and run small helpers of its own (a hit of 4 KB beside a
    2.4 MB program)."""
    _listen()
    lowered = lower()
    _compiling.hits, _compiling.reads = 0, []
    try:
        compiled = lowered.compile()
        reads = _compiling.reads
        from_jax_cache = _compiling.hits > 0
        return _Compiled(compiled, from_jax_cache, reads[0] if from_jax_cache and len(reads) == 1 else None)
    finally:
        _compiling.hits = _compiling.reads = None


def _serialize(compiled: jax.stages.Compiled, executable: bytes | None) -> tuple:
    """`serialize_executable.serialize(compiled)`: (payload, in_tree, out_tree); with `executable`, those bytes
    stand for the program's executable instead of the loaded one serialized again."""
    from jax.experimental import serialize_executable as se

    if executable is None:
        return se.serialize(compiled)
    # `serialize`'s own refusals (jax 0.10-0.11), checked without it: it would serialize the loaded executable
    # again, seconds for a large program, only to throw that away.
    unloaded = getattr(compiled._executable, "_unloaded_executable", None)
    if unloaded is None or (getattr(unloaded, "mut", None) and unloaded.mut.in_mut) or compiled._params.const_args:
        raise ValueError("this program cannot be serialized")

    class Pickler(se._JaxPjrtPickler):
        def persistent_id(self, obj):
            if isinstance(obj, se.xc.LoadedExecutable):
                return ("exec", executable)
            return super().persistent_id(obj)

    # The same payload `serialize` builds (and `deserialize_and_load` reads), with JAX's bytes for the program.
    args_info_flat, in_tree = jax.tree_util.tree_flatten(compiled.args_info)
    with io.BytesIO() as file:
        Pickler(file).dump((unloaded, args_info_flat, compiled._no_kwargs))
        return file.getvalue(), in_tree, compiled.out_tree


class ProgramCache:
    """Compiled programs under `root` (created on first write)."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.hits = 0  # programs loaded from disk (decode.py: whether a failing program came from here)
        self.read_ahead_hits = 0  # ... of which read ahead, while the model loaded (`read_ahead`)
        self._warned = False  # a store that failed said so once
        self._fetched: dict[str, str] = {}  # program name -> the file of the last fetched (`remember`)
        self._early: dict[str, concurrent.futures.Future] = {}  # file name -> the program read ahead, or None
        # (seconds, bytes) of each program read from disk in this process, read ahead or not: what a load costs
        # here (`seconds_per_byte`), which a program read ahead no longer shows where it is fetched.
        self.reads: list[tuple[float, int]] = []

    def _hint(self, tag: str) -> Path:
        return self.root / HINTS / f"{hashlib.sha256(tag.encode()).hexdigest()[:32]}.json"

    def read_ahead(self, tag: str) -> int:
        """Starts reading, on a thread of its own, the programs the last start tagged `tag` fetched first
        (`remember`); a fetch that computes one's key takes it from there. Returns how many it reads."""
        try:
            names = json.loads(self._hint(tag).read_text())["programs"]
            paths = [self.root / n for n in names if n.endswith(SUFFIX) and Path(n).name == n]
        except (OSError, ValueError, KeyError, TypeError, AttributeError):  # none yet, or not ours
            return 0
        paths = [p for p in paths if p.is_file()]
        if paths:
            # Imported here, not on the thread: two threads importing JAX's modules at once may be handed a
            # module still being initialized.
            from jax.experimental import serialize_executable  # noqa: F401

            pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="lsjax-read-ahead")
            for path in paths:
                self._early[path.name] = pool.submit(self._read, path)
            pool.shutdown(wait=False)
        return len(paths)

    def remember(self, tag: str, names: tuple[str, ...]) -> None:
        """Notes the files of programs `names` (the last fetched of each name), for the next start tagged `tag`."""
        files = [self._fetched[n] for n in names if n in self._fetched]
        if not files:
            return
        hint = self._hint(tag)
        with contextlib.suppress(OSError):  # (a cache that cannot be written has said so, or will)
            hint.parent.mkdir(parents=True, exist_ok=True)
            tmp = hint.with_name(f".{hint.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"programs": files}))
            tmp.replace(hint)

    def holds(self, name: str, static, args) -> bool:
        """Whether `get` would load program `name` from disk (it may still fail to load and compile)."""
        key = program_key(name, static, args)
        return key is not None and (self.root / f"{name}-{key}{SUFFIX}").is_file()

    def size(self, name: str, static, args) -> int | None:
        """Bytes of program `name`'s file, None where this cache does not hold it (what a load will read: a
        split decode prices a load by it)."""
        key = program_key(name, static, args)
        try:
            return None if key is None else (self.root / f"{name}-{key}{SUFFIX}").stat().st_size
        except OSError:
            return None

    def get(self, name: str, static, args, lower: Callable[[], jax.stages.Lowered]) -> jax.stages.Compiled:
        """Program `name` for `args`: loaded when this cache holds it, else `lower().compile()`, stored."""
        return self.fetch(name, static, args, lower)[0]

    def fetch(self, name: str, static, args, lower: Callable[[], jax.stages.Lowered]):
        """(`get`'s program, how it was had: "loaded" from this cache, "jax-cache" (traced and lowered, XLA's
        compile read from JAX's persistent cache) or "compiled")."""
        key = program_key(name, static, args)
        if key is None:
            made = _compile(lower)
            return made.program, "jax-cache" if made.from_jax_cache else "compiled"
        path = self.root / f"{name}-{key}{SUFFIX}"
        self._fetched[name] = path.name
        compiled = self._load(path)
        if compiled is not None:
            self.hits += 1
            return compiled, "loaded"
        made = _compile(lower)
        if not made.from_jax_cache or made.jax_bytes is not None:
            self._store(path, made.program, made.jax_bytes)
        return made.program, "jax-cache" if made.from_jax_cache else "compiled"

    def clear(self) -> None:
        """Removes every program this cache holds."""
        for path in self.root.glob(f"*{SUFFIX}"):
            path.unlink(missing_ok=True)

    def _load(self, path: Path) -> jax.stages.Compiled | None:
        early = self._early.pop(path.name, None)
        try:
            compiled = early.result() if early is not None else None
        except Exception:  # (whatever went wrong there: read here as if never read ahead)  # noqa: BLE001
            compiled = None
        if compiled is not None:
            self.read_ahead_hits += 1
        else:
            compiled = self._read(path)
        if compiled is not None:
            with contextlib.suppress(OSError):
                os.utime(path)  # kept as recently used
        return compiled

    def seconds_per_byte(self) -> float | None:
        """Seconds per stored byte of the programs read so far (None: none yet): what the next read will take, by
        its file's size (`size`). A read beside other work (the model loading, a decode) is timed as it ran."""
        reads = list(self.reads)
        total = sum(b for _, b in reads)
        return sum(s for s, _ in reads) / total if total else None

    def _read(self, path: Path) -> jax.stages.Compiled | None:
        from jax.experimental.serialize_executable import deserialize_and_load

        try:
            t = time.perf_counter()
            data = path.read_bytes()
            payload, in_tree, out_tree = pickle.loads(zlib.decompress(data))
            compiled = deserialize_and_load(payload, in_tree, out_tree)
            self.reads.append((time.perf_counter() - t, len(data)))
            return compiled
        except Exception:  # none yet, or damaged or foreign: compiled again and replaced  # noqa: BLE001
            return None

    def _store(self, path: Path, compiled: jax.stages.Compiled, executable: bytes | None = None) -> None:
        try:
            # Level 1: a 32 MB executable (auto on a CPU) becomes 5.5 MB in 0.2 s, read back in 0.1 s.
            data = zlib.compress(pickle.dumps(_serialize(compiled, executable)), 1)
        except Exception:  # a program JAX cannot serialize is simply not cached  # noqa: BLE001
            return
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_bytes(data)
            tmp.replace(path)  # atomic: a concurrent reader sees the old file or the new one
            self._evict()
        except OSError as e:  # full or read-only: this run decodes on, the next start compiles again
            with contextlib.suppress(OSError, NameError):
                tmp.unlink(missing_ok=True)
            if not self._warned:
                self._warned = True
                print(
                    f"[lsjax] warning: cannot store compiled programs in {self.root} ({e.strerror or e}); decoding "
                    "goes on, and the next start compiles them again",
                    file=sys.stderr,
                )

    def _evict(self) -> None:
        files = sorted(self.root.glob(f"*{SUFFIX}"), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in files[MAX_FILES:]:
            old.unlink(missing_ok=True)
