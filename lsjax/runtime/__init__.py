"""How programs and weights become ready when a process starts: the one layer that knows the host's start-up
machinery. The engine's host (`lsjax.engine.host.Generator`) asks a `Startup` for each program and for its
split decode, and never names what is behind it; a command line (`lsjax.cli.decode`) makes the one for its
process with `Startup.for_process`.

    cpu       the host processor; the allocator, thread priorities and the GEMM a few-row dot runs through
    cache     where the command lines keep JAX's persistent compilation cache, programs and weights
    programs  the program store: whole compiled programs on disk, found without tracing
    weights   the weight store: a model file's params as loaded and as prepared, mapped back by later starts
    split     a switched drafter's decode as one program per node-count group, and when each group is made

Why each mechanism is there, with its measurements: docs/design/cpu-startup.md. A `Startup()` with no store
compiles every program in this process, as a library should by default: it writes nothing to disk.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import jax

from lsjax.runtime import cpu
from lsjax.runtime.programs import ProgramCache
from lsjax.runtime.split import SplitDecode, loading


def beside_device() -> bool:
    """Whether XLA compiles on other hardware than the programs run on (an accelerator, not the host CPU)."""
    return jax.default_backend() != "cpu"


def host_cores() -> int:
    """The CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def host_threads() -> int:
    """The threads host-side numpy work runs on (`lsjax.models.target.host_map`): one per core, up to 8."""
    return min(8, host_cores())


def compile_beside_load() -> bool:
    """Whether a start's programs compile while the target's weights load (from the target's shapes): only where
    the host has cores the load leaves free; with fewer, the two share the cores and the first token comes
    later."""
    return host_cores() > host_threads()


def beside(make: Callable[[], object]) -> concurrent.futures.Future:
    """`make()` on a host thread of its own: a Future of (its result, the seconds it took), an error raised where
    the result is waited for. A decode program made while the start program prefills: XLA compiles on one
    host thread while the device (or a CPU's other cores) prefill, which ends sooner than one after the other
    even where the two share 2 CPU cores."""
    future = concurrent.futures.Future()

    def work():
        t = time.perf_counter()
        try:
            result = make()
        except BaseException as e:  # raised where the program is waited for  # noqa: BLE001
            future.set_exception(e)
        else:
            future.set_result((result, time.perf_counter() - t))

    threading.Thread(target=work, name="lsjax-compile").start()
    return future


class Startup:
    """Where a generator's programs come from and when they are made.

    `store`: a program store (`ProgramCache`) to load programs from and keep them in; None compiles each in
    this process. `one_decode`: the process runs one decode (decode.py), so a split decode's later groups may
    load at the lowest CPU priority (`split.loading`); it lowers the priority of the process's other threads
    for good. `workers`: threads compiling a split decode's groups side by side (0: one per core)."""

    def __init__(self, store: ProgramCache | None = None, *, one_decode: bool = False, workers: int = 0):
        self.store = store
        self.one_decode = one_decode
        self.workers = workers

    @classmethod
    def for_process(cls, cache: str | None, prog: str, tag: str | None = None) -> tuple[Startup, Path | None]:
        """The start-up of a command line that is its own process: glibc's fastbins off (before any program
        loads), JAX's persistent compilation cache on (`--compile-cache` value `cache`), a program store beside
        it that reads ahead what the last start with `tag` fetched first, and the weight store's directory
        (None: off), whose writes wait until `weights.start_writes` (after the output). Process-wide: only a
        program's entry point calls it."""
        from lsjax.runtime import cache as cache_dirs
        from lsjax.runtime import weights

        cpu.no_fastbins()
        cache_dirs.enable(cache, prog)
        where, kept = cache_dirs.programs_dir(cache), cache_dirs.weights_dir(cache)
        if kept is not None:
            weights.defer_writes()
        store = ProgramCache(where) if where is not None else None
        if store is not None and tag is not None:
            store.read_ahead(tag)
        return cls(store, one_decode=True), kept

    # What the host asks for a program.
    def make(self, name: str, static, args, lower: Callable[[], jax.stages.Lowered], view=None) -> tuple[object, str]:
        """(program `name`, how it was made): loaded from the store ("loaded", or "jax-cache" where XLA's compile
        came from JAX's persistent cache) or compiled (and kept there). With `view` (a decode group that
        `in_layout` names, lowered for `view(params)`): compiled through XLA's own GEMM and run on that view of
        the params it is called with."""
        if view is not None:
            lower_plain = lower
            lower = lambda: cpu.WideLowered(lower_plain())  # noqa: E731
        if self.store is None:
            program, how = lower().compile(), "compiled"
        else:
            program, how = self.store.fetch(name, static, args, lower)
        return (program if view is None else cpu.InLayout(program, view)), how

    def holds(self, name: str, static, args) -> bool:
        """Whether program `name` is in the store (it loads rather than compiles)."""
        return self.store is not None and self.store.holds(name, static, args)

    @property
    def stores(self) -> bool:
        """Whether programs load from a store: a switched drafter's decode is then split into groups."""
        return self.store is not None

    def stands_in(self) -> bool:
        """Whether a first start at a width, where its split decode is not stored, decodes with AR's own programs
        and compiles its own after the output: where compiling would take the decode's cores (a CPU)."""
        return not beside_device()

    def in_layout(self, num_nodes: int, mesh, dtype: str) -> bool:
        """Whether a decode group verifying `num_nodes` rows is lowered for the projections [in, out] only and
        compiled through XLA's own GEMM (`cpu.wide_program`)."""
        return cpu.wide_program(num_nodes, mesh, dtype)

    def split(
        self,
        drafter,
        groups: list[list[int]],
        names: list[str],
        make_group: Callable[[int], object],
        *,
        plan: int,
        partial: bool,
        background: bool,
        static,
        args,
        trace: Callable[[], object] = lambda: None,
    ) -> SplitDecode:
        """A split decode of `groups` (program `names[g]` made by `make_group(g)`). In the foreground: every
        group now, side by side. In the background: the first group at once, the others by the one loading rule
        (`split.loading`), smallest trees first where it makes them unasked. A stored split's groups are read
        beside the prefill and the decode; a CPU compiles in the background only where decoding can start with
        the first group alone (`partial`). `trace` runs once before threads make groups side by side."""
        sizes = [self.store.size(n, static, args) if self.store is not None else None for n in names]
        stored = all(s is not None for s in sizes[1:])
        background = background and (stored or beside_device() or partial)
        if not background:
            trace()
            workers = max(1, min(len(names), self.workers or os.cpu_count() or 1))
            with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="lsjax-compile") as pool:
                programs = list(pool.map(make_group, range(len(names))))
            return SplitDecode(drafter, groups, programs, partial, plan=plan)
        nodes = [drafter.step_variants()[members[0]].num_nodes for members in groups]
        split = SplitDecode(
            drafter,
            groups,
            [concurrent.futures.Future() for _ in names],
            partial,
            plan=plan,
            make=make_group,
            order=sorted(range(len(names)), key=lambda g: nodes[g]),
            sizes=sizes,
            load_rate=self.store.seconds_per_byte if self.store is not None else None,
            **loading(stored, beside_device(), len(names), self.one_decode),
        )
        split.from_disk = stored
        return split


__all__ = ["ProgramCache", "SplitDecode", "Startup", "beside", "beside_device", "compile_beside_load"]
