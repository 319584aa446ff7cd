"""Host-side driver: text in, text out, with compile / prefill / decode timed separately.

The jitted pieces live in `lsjax.engine.loop` (and, for speculative methods, the
engine); this module only pads prompts into buckets, compiles ahead of time so
compile time is not counted as decode time, streams text, and reports counters.
Used by `decode.py` and the benchmarks.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import os
import threading
import time
import typing
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from lsjax import mesh as mesh_lib
from lsjax.config import GenerateConfig, ModelConfig
from lsjax.engine import cpu, loop
from lsjax.engine.programs import ProgramCache
from lsjax.engine.step import stop_ids, variant_groups
from lsjax.engine.types import ARDrafter, Drafter, HostRun, HostTuned, SpecConfig, Summarized
from lsjax.errors import InputError, LsjaxError
from lsjax.models import target


class PromptError(LsjaxError, ValueError):
    """The prompt is empty or does not fit the model's context window."""


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first index where two token lists differ (a length difference counts), None when equal."""
    i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    return i if i is not None or len(a) == len(b) else min(len(a), len(b))


@dataclasses.dataclass
class GenerationResult:
    tokens: list[int]
    prompt_tokens: int
    compile_s: float
    prefill_s: float
    decode_s: float
    target_forwards: int  # prefill counts as one
    stop_reason: str  # "eos" | "max_new_tokens"
    method: str = "ar"
    # Drafter diagnostics (auto: steps run by each candidate), from `drafter.summary(draft_state)` if it has one.
    drafter_stats: dict | None = None
    # The prefill ran while the decode program compiled (`Generator.compile(background=True)`): prefill_s then
    # includes sharing the host with XLA.
    prefill_alongside_compile: bool = False
    # Steps a split decode ran with the drafter restricted to the groups loaded so far while it wanted another
    # (`SplitDecode`: AR, or a smaller tree, bridging); they are part of decode_s and target_forwards.
    bridged_steps: int = 0
    # Times a split decode did not load a group its drafter wanted: it would have been in only after the last
    # token, or (`SplitDecode.priced`) what it would save over the tokens left did not pay for loading it.
    declined_loads: int = 0
    # `time.perf_counter()` when the speculative program could first run as it would with everything loaded
    # (after its host tuning; for a split decode, after the last step the drafter ran restricted): "seconds
    # until the speculative program is in use" (`decode.py --json`).
    decode_program_at: float = 0.0
    first_token_at: float = 0.0  # `time.perf_counter()` when the first new token was ready (after the prefill)
    # The run decoded with AR's own programs while the method's were not compiled (`Generator.stands_in`): its
    # steps all count as bridged, and `decode_program_at` stays 0.
    ar_stand_in: bool = False

    @property
    def new_tokens(self) -> int:
        return len(self.tokens)

    @property
    def tokens_per_s(self) -> float:
        """Decode throughput: tokens after the first (which prefill produces) per decode second."""
        return (self.new_tokens - 1) / self.decode_s if self.decode_s > 0 and self.new_tokens > 1 else 0.0

    @property
    def mean_accepted(self) -> float:
        """tau: tokens emitted per target forward during decoding (1.0 for AR)."""
        steps = self.target_forwards - 1
        return (self.new_tokens - 1) / steps if steps > 0 else 0.0


def check_prompt(config: ModelConfig, prompt_ids: list[int], max_new_tokens: int) -> int:
    """Validates the prompt length; returns the number of new tokens that fit the context window."""
    if not prompt_ids:
        raise PromptError("the prompt is empty: give text with --prompt or --prompt-file")
    if len(prompt_ids) >= config.max_position:
        raise PromptError(
            f"the prompt has {len(prompt_ids)} tokens but the model's context window is {config.max_position}"
        )
    return min(max_new_tokens, config.max_position - len(prompt_ids))


def start_args(buf, P: int, key, gen: GenerateConfig) -> dict:
    """The arrays a `Generator`'s compiled start program takes for one prompt: its padded ids, length, key and
    the run's new-token count."""
    return {
        "tokens": jnp.asarray(buf),
        "lengths": jnp.array([P], jnp.int32),
        "key": key,
        "max_new": jnp.array([gen.max_new_tokens], jnp.int32),
    }


def on_device(a):
    """`a` as a device array. A read-only host array (weights `lsjax.loading.stored` keeps, made or mapped from
    their files) is handed to `jax.device_put`, which a CPU device uses in place where it starts on a 64-byte
    boundary (`lsjax.models.target.host_empty`): nobody can change it, and jnp.asarray's copy cost every
    decode.py start 0.6-0.9 s for SmolLM2's 0.9 GB. Anything else is copied, so that a caller's own arrays,
    changed later, never change the generator's."""
    if isinstance(a, np.ndarray) and not a.flags.writeable:
        return jax.device_put(np.asarray(a))
    return jnp.asarray(a)


def exact_on(config: ModelConfig) -> bool:
    """Whether every method's greedy output equals AR's token for token on this backend, whatever the steps'
    shapes: fp32 on a CPU (the lossless tests' setting) or batch-invariant numerics (`invariant_rows`)."""
    return config.invariant_rows > 0 or (jax.default_backend() == "cpu" and config.dtype == "float32")


def shapes_only(tree) -> bool:
    """Whether `tree` holds shapes where arrays would be (`jax.ShapeDtypeStruct` leaves: weights still to come)."""
    return any(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in jax.tree.leaves(tree))


def compiler_beside_device() -> bool:
    """Whether XLA compiles on other hardware than the programs run on (an accelerator, not the host CPU)."""
    return jax.default_backend() != "cpu"


def compile_beside_load() -> bool:
    """Whether a start's programs compile while the target's weights load (decode.py's `Ahead`: from the
    target's shapes, `Generator.give_weights`): where the host has cores the load leaves free
    (`target.host_threads` make the weights). On 2 cores it costs more than it hides: cold AR starts after 45 s
    idle (2026-12-05, 2-core Xeon VM, dev code cut to 600 tokens) loaded in 5.8-6.3 s instead of 4.2-4.3 s
    beside the start program's compile (1.5-3 s), and their first token came 1.2-1.3 s later (docs/CHANGELOG.md)."""
    return target.host_cores() > target.host_threads()


def beside(make: Callable[[], object]) -> concurrent.futures.Future:
    """`make()` on a host thread of its own: a Future of (its result, the seconds it took), an error raised where
    the result is waited for. For a decode program compiled (or loaded) while the start program prefills: XLA
    compiles on one host thread while the device, or on a CPU the other cores, prefill. On 2 CPU cores the two
    share the cores (the prefill of a 1165-token prompt 4.2 -> 7.4-8.4 s, AR's decode program 6.1 -> 8.9-9.5 s)
    and still end sooner than one after the other: `decode.py --method ar`, 200 tokens, fresh caches, three
    interleaved rounds (2026-12-03), first token 12.0-13.2 s against 14.9-16.3 s, last 21.5-22.6 s against
    23.2-25.0 s. (With the start program's layers unrolled, before `target.stack_layers`, the same pairing
    measured 20 s slower once and 4 s faster once.)"""
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


class ProgramReady(typing.NamedTuple):
    """A program a `Generator` made ready: its name (start, decode, or a split decode's `group_name`), how
    ("loaded" from the program cache, "jax-cache": traced and lowered with XLA's compile read from JAX's
    persistent cache, "compiled") and the seconds it took."""

    name: str
    how: str
    seconds: float


def group_name(drafter: Drafter, group: int) -> str:
    """A split decode program's name (`SplitDecode`): the node count its group verifies."""
    return f"decode-{drafter.step_variants()[variant_groups(drafter)[group][0]].num_nodes}n"


# A decode program whose every step verifies this many rows or more is compiled without XLA:CPU's YNNPACK
# fusions and reads the projections stored [in, out] (`wide_program`).
WIDE_ROWS = 3
WIDE_OPTIONS = {"xla_cpu_experimental_ynn_fusion_type": ""}


def wide_program(num_nodes: int, mesh=None, dtype: str = "float32") -> bool:
    """Whether a decode program whose steps verify `num_nodes` rows each is compiled with `WIDE_OPTIONS` (its
    dots through XLA's own GEMM instead of YNNPACK) and given the projections [in, out] only (`InLayout`).

    Why, measured on a 2-core AVX2 CPU (SmolLM2 at 1K context, `python -m lsjax.bench.tree_cost --layout in
    out`, with and without the option): a verification forward of 5 nodes took 47 ms against 63 today's way
    (YNNPACK, projections [out, in]), 9 nodes 59 against 77, 16 nodes 76 against 100; 2 nodes the same (43);
    one node 8-10% slower (29 against 26), and so AR's program keeps YNNPACK, as does the prefill (~5% slower
    without). Without YNNPACK the [out, in] copies are the slow ones (9 nodes: 97 ms). Such a program also
    loads faster: XLA:CPU rebuilds every YNNPACK fusion of a program it loads (docs/bad-input.md). A CPU
    only; fp32 weights only (bf16 dots of 9 rows ran 2.7x slower without YNNPACK); and not on a mesh, whose
    projections are [in, out] already and whose programs are compiled anew.

    And only on a CPU without AVX-512 (`xla_gemm_pays`): on a 2-core Xeon with AVX-512 and AMX (2026-12-05)
    the same forward of 9 nodes at 2K context took 97 ms without YNNPACK against 89 with it (tree_cost), and
    auto's whole prompt-lookup step (decode-9n, its cost profile, 3 measurements each) 127-131 ms against
    93-99: 2.9x an AR step instead of 2.1x."""
    return (
        jax.default_backend() == "cpu"
        and mesh is None
        and dtype == "float32"
        and num_nodes >= WIDE_ROWS
        and xla_gemm_pays()
    )


def xla_gemm_pays() -> bool:
    """Whether this CPU runs a few rows' fp32 dots faster through XLA's own GEMM than through YNNPACK: an x86
    CPU with AVX2 and without AVX-512 (an AMD EPYC measured so; a Xeon with AVX-512, where YNNPACK picks its
    wider kernels at run time, measured the other way: `wide_program`). Where the flags are unknown (no
    /proc/cpuinfo), XLA's default stays."""
    flags = cpu.info()[1]
    return "avx2" in flags and "avx512f" not in flags


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
    """A compiled program lowered for prepared params with the projections [in, out] only
    (`target.prepare_for_decode(..., layout="in")`, the same arrays without the [out, in] copies): called with
    the params in any prepared layout, it runs on that view of them."""

    def __init__(self, program, config: ModelConfig):
        self.program, self.config = program, config
        self._seen = self._view = None

    def __call__(self, params, *args):
        if params is not self._seen:
            self._seen, self._view = params, target.prepare_for_decode(params, self.config, layout="in")
        return self.program(self._view, *args)


LOAD_ENV = "LSJAX_SPLIT_LOAD"  # how a split decode loads its groups (`LOADINGS`), to time one against another
LOADINGS = ("idle", "priced", "asked", "eager", "first")


# A split decode of this many groups or fewer, loading from disk on a CPU, loads them all at once ("eager").
EAGER_GROUPS = 2


def split_loading(stored: bool, idle: bool = False, groups: int | None = None) -> str:
    """How a split decode makes its groups (`SplitDecode`): "eager", every group, when compiling (the next start
    loads them) beside an accelerator (a host thread the device does not wait for); "first" when compiling on a
    CPU: AR's group only, the rest compiled after the output (`Generator.finish`: beside the decode, XLA took the
    cores it runs on, and a tree compiled during a 200-token run never repaid it). Loading from disk on a CPU:
    "eager" too where the split has `groups` <= `EAGER_GROUPS` (None: not known, as many as any): AR's group and
    one more, the draft-less default's prompt lookup, the one speculative program it has; else
    "asked", every group the drafter asks for, and with `idle` (`Generator.idle_loads`: decode.py) "idle", those
    after the first in the CPU time the decode leaves unused (`idle_priority`). "priced": only where running a
    group pays for loading it, by the drafter's own estimates (no better than "asked" on dev prompts). "first"
    is also, with everything stored, a timing baseline (greedy: what the drafter costs with no tree loaded).

    Why eager for two groups, measured on a 2-core CPU (docs/CHANGELOG.md 2026-12-05, warm `decode.py`, 200
    tokens): asked for, prompt lookup's program came 0.9-9.5 s after the first token on 1K-4K prompts (it loads
    in 1.8-3.6 s beside the decode); loaded at once it loads beside the prefill (~1 s; the prefill ~0.5 s
    longer) and is in use from the first token, none bridged: the last token 0.81x and 0.84x AR's on average on
    dev and held-out prompts against 0.87x and 0.88x. Other loadings: docs/CHANGELOG.md 2026-12-02 and 12-03.
    `$LSJAX_SPLIT_LOAD` overrides."""
    how = os.environ.get(LOAD_ENV, "")
    if how and how not in LOADINGS:
        raise LsjaxError(f"${LOAD_ENV}: expected one of {', '.join(LOADINGS)}, got {how!r}")
    if how:
        return how
    if compiler_beside_device():
        return "eager"
    if not stored:
        return "first"
    if groups is not None and groups <= EAGER_GROUPS:
        return "eager"
    return "idle" if idle else "asked"


COMPUTE_THREADS = "tf_XLAEigen"  # the name of XLA:CPU's compute pool threads, which run every program


def idle_priority() -> bool:
    """Gives every thread of this process but the main thread and XLA:CPU's compute pool the lowest CPU priority
    (nice 19), so that what they do (XLA deserializes a loaded program on the thread that asks) yields to the
    decode (not fully: `SplitDecode` says what it still costs on a 2-core VM). For the whole process, and not
    undone: an unprivileged process cannot raise a priority again. Linux only; returns whether it applied."""
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


_idled: list = []  # `idle_priority` has run in this process (once is enough: new threads inherit it)


def _pending(program) -> bool:
    """Whether a program is a Future of one still to come (being made, asked for, or not begun)."""
    return isinstance(program, concurrent.futures.Future) and not program.done()


def _made(program) -> bool:
    """Whether a program (or a Future of one) is ready to run: not one still being made, nor one that failed or
    was never made (`Generator.close`)."""
    if not isinstance(program, concurrent.futures.Future):
        return True
    return program.done() and program.exception() is None


class SplitDecode:
    """A switched drafter's decode loop as one program per node-count group (`loop.group_decode_jit`), the host
    switching between them where the next step is another group's; called as the single decode program is,
    `(params, draft_params, state, step_limit) -> state`, and runs the same steps with the same choices.

    Why: a single program holds every group's target forward (auto: six verification sizes, 31 MB on a CPU,
    11 s to load and 44 s to compile for SmolLM2, where one method's is 3-5 MB and ~1 s). Split, the first
    group (AR's, which also runs the stretches) is ready about as soon as one method's program, and the others
    come as the drafter asks for them.

    `programs[g]`: a compiled program, or a Future of one. With `make` (g -> program), the groups are made on
    one background thread: the first at once, then each group the drafter asks for (a call that needs it, or
    the choice it would make with every group loaded: `wanted` in the program's info), and with `eager` the
    rest in `order` after those. Without `eager` a group nobody asks for is never made: on a CPU a load takes
    the cores the decode runs on (~1.2 s per group for SmolLM2), so a prompt where auto keeps to AR and one
    tree loads two programs, not six.

    With `partial`, a call runs the drafter restricted to the groups ready so far (`Drafter.ready_params`),
    looking again every `poll` steps; else it waits for each group it has to run (the choices, and so the
    output, never depend on what has loaded when).

    With `idle` (a CPU, loading from disk), the groups after the first load at the lowest CPU priority
    (`idle_priority`), meant to take only the cycles the decode leaves unused. On 2 cores a load at normal
    priority took ~1.2-3.7 s of a core from the decode, which on a prompt where the trees pay little cost more
    than they saved; at nice 19 (or SCHED_IDLE) on the 2-core VM measured since, a loading thread still slowed
    the decode ~1.2x and a prefill ~1.5x while it ran (`scripts/idle_load_cost.py`, docs/CHANGELOG.md
    2026-12-04), so a load is never free there: ask for fewer.

    With `priced` (and `partial`), a group the drafter wants is asked for only where what running it would save
    over the tokens left pays for making it: the drafter's own rates (`Drafter.choice_rates`: the wanted
    variant's against the best ready one's) at this run's seconds per token so far, over the share of the
    looks so far that wanted the group (a rate is the step's: prompt lookup's after a match holds for that
    step, not for the rest of the run), against the seconds its load will take by its stored size (`sizes`)
    at the seconds per byte this process's program reads took (`load_rate`; else those of the groups made so
    far), which on a CPU are taken from the decode's cores.

    Whatever the loading, with `partial` a group is not asked for where that load, at this run's seconds per
    token so far, would end after the last token: on a CPU it would take the decode's cores for nothing."""

    poll = 8  # steps between looks at what has loaded, while something may still load

    def __init__(
        self,
        drafter: Drafter,
        programs: list,
        partial: bool,
        make: Callable[[int], object] | None = None,
        order: list[int] | None = None,
        eager: bool = True,
        priced: bool = False,
        sizes: list[int | None] | None = None,
        idle: bool = False,
        first_only: bool = False,
        load_rate: Callable[[], float | None] | None = None,
    ):
        self.drafter = drafter
        self.groups = variant_groups(drafter)
        self.programs = list(programs)
        self.partial = partial
        self.group_of = np.zeros(len(drafter.step_variants()), np.int32)
        for g, members in enumerate(self.groups):
            self.group_of[members] = g
        self.waited = 0.0  # seconds calls spent waiting for a group to load
        self.restricted_steps = 0  # steps run while the drafter wanted a group that was not ready (`partial`)
        self.restricted_until: float | None = None  # perf_counter when the last such call ended
        self._params: dict = {}  # (id of the draft params, ready) -> those params restricted
        self.from_disk = True  # the programs still to come are read from the program cache, not compiled
        self.stop = threading.Event()  # set: the background thread makes no more programs (`close`)
        self._make = make
        self.order = list(order) if order is not None else list(range(len(self.programs)))
        self.eager = eager
        self.priced = priced
        self.idle = idle
        self.first_only = first_only  # asks for no group but the first (`partial`: the drafter keeps to it)
        self.declined = 0  # times a wanted group was not asked for: too late, or (`priced`) not worth its load
        self._make_s: dict[int, float] = {}  # group -> seconds its program took to make in the background
        self.sizes = sizes  # bytes of each group's stored program (None: unknown), to price its load
        # Seconds per stored byte that reading a program has taken in this process (`ProgramCache.reads`): the
        # price of a load where the first group's own was hidden (read ahead while the model loaded).
        self.load_rate = load_rate
        self._pace = [0.0, 0]  # [seconds, tokens] of this run's calls so far (`partial`)
        self._looks = np.zeros(len(self.groups), np.int64)  # calls that ended wanting each group (`priced`)
        self._asked: list[int] = []  # groups asked for, made first come first served
        self._taken: set[int] = set()  # groups the background thread has begun to make
        self._lock = threading.Lock()
        self._worker: threading.Thread | None = None
        if make is not None:
            self.request(0)

    @property
    def compiling(self) -> bool:
        """Whether programs are still being compiled (not loaded) in the background."""
        return not self.from_disk and not self.complete

    @property
    def complete(self) -> bool:
        """Whether every group's program is made (or failed, or given up: `close`)."""
        return not any(_pending(p) for p in self.programs)

    @property
    def busy(self) -> bool:
        """Whether a program is being made in the background now (or asked for and not begun)."""
        if self._make is None:
            return not self.complete
        with self._lock:
            return any(_pending(p) and (g in self._taken or g in self._asked) for g, p in enumerate(self.programs))

    def _to_make(self, g: int) -> bool:
        return _pending(self.programs[g]) and g not in self._taken

    def request(self, g: int) -> None:
        """Asks for group g's program next (before the rest of `order`); a no-op once it is made or begun."""
        if self._make is None or self.stop.is_set():
            return
        with self._lock:
            if not self._to_make(g) or g in self._asked:
                return
            self._asked.append(g)
            if self._worker is None:
                self._worker = threading.Thread(target=self._work, name="lsjax-load")
                # Not a daemon: a process that ends meanwhile waits for XLA (a daemon thread still inside XLA
                # at exit aborts the process, "terminate called ..."); Ctrl-C in decode.py exits at once
                # regardless. It ends when nothing is asked for (or, `eager`, nothing is left).
                self._worker.start()

    def _next(self) -> int | None:
        while self._asked:
            g = self._asked.pop(0)
            if self._to_make(g):
                return g
        if self.eager:
            return next((g for g in self.order if self._to_make(g)), None)
        return None

    def _work(self) -> None:
        while True:
            with self._lock:
                g = None if self.stop.is_set() else self._next()
                if g is None:
                    self._worker = None
                    return
                self._taken.add(g)
            try:
                if self.idle and g != 0 and not _idled:
                    _idled.append(idle_priority())
                t = time.perf_counter()
                program = self._make(g)
                self._make_s[g] = time.perf_counter() - t
                self.programs[g].set_result(program)
            except BaseException as e:  # raised where the program is waited for  # noqa: BLE001
                self.programs[g].set_exception(e)
                self._give_up(e)

    def _give_up(self, error: BaseException) -> None:
        """The groups not begun fail with `error` (waiting for them raises it; none is chosen), and no more is
        made."""
        self.stop.set()
        with self._lock:
            for g in range(len(self.programs)):
                if self._to_make(g):
                    self._taken.add(g)
                    self.programs[g].set_exception(error)

    def close(self) -> None:
        """Makes no more programs once the one being made now is in (`Generator.close`)."""
        if self._make is not None:
            self._give_up(LsjaxError("not loaded: Generator.close() stopped the loading"))

    def _program(self, g: int):
        p = self.programs[g]
        if isinstance(p, concurrent.futures.Future):
            self.request(g)
            t = time.perf_counter()
            p = self.programs[g] = p.result()
            self.waited += time.perf_counter() - t
        return p

    def ready(self) -> np.ndarray:
        """[V] bool: the variants whose group's program is loaded (the first group's counts as loaded: a call
        waits for it)."""
        loaded = [g == 0 or _made(p) for g, p in enumerate(self.programs)]
        return np.asarray(loaded)[self.group_of]

    def wait(self) -> None:
        """Waits for every group's program (asking for each one not made)."""
        for g in range(len(self.programs)):
            self._program(g)

    def _restricted(self, draft_params, ready: np.ndarray):
        key = (id(draft_params), ready.tobytes())
        if key not in self._params:
            restricted = self.drafter.ready_params(draft_params, ready)
            self._params = {key: (draft_params, draft_params if restricted is None else restricted)}
        return self._params[key][1]

    def _make_estimate(self, g: int) -> float | None:
        """Seconds group g's program will take to make (None: nothing to go by). Loading from disk with its size
        known: at the seconds per byte this process's reads have taken (`load_rate`), else at those of the
        groups made so far (AR's group is the largest and loads beside the prefill); else as long as those
        took."""
        rate = self.load_rate() if self.load_rate is not None and self.from_disk else None
        if self.sizes and self.sizes[g] and rate:
            return self.sizes[g] * rate
        sized = [h for h in self._make_s if self.sizes and self.sizes[h]]
        if self.sizes and self.sizes[g] and sized:
            return self.sizes[g] * sum(self._make_s[h] for h in sized) / sum(self.sizes[h] for h in sized)
        return float(np.mean(list(self._make_s.values()))) if self._make_s else None

    def _pays(self, g: int, left: int, rates: np.ndarray, ready: np.ndarray, wanted: int) -> bool:
        """Whether to make group g (for variant `wanted`) with `left` tokens to go: never where, at this run's
        seconds per token so far, it would be in only after the last (its load takes the decode's cores for
        nothing: held-out code asked for a tree with 17-57 steps left, docs/CHANGELOG.md 2026-12-04); `priced`,
        only where it saves more seconds over the tokens after it than it costs. Yes where anything it needs
        is unknown."""
        if self.first_only:
            return False
        make_s = self._make_estimate(g)
        if make_s is None or self._pace[1] == 0:
            return True
        per_token = self._pace[0] / self._pace[1]
        left_after = left - make_s / per_token  # the tokens still to come once it is made
        if left_after <= 0:
            return False
        if not self.priced:
            return True
        usable = ready & np.isfinite(rates)
        best = float(np.max(rates[usable])) if usable.any() else 0.0
        if not (best > 0 and np.isfinite(rates[wanted])):
            return True
        share = self._looks[g] / max(int(self._looks.sum()), 1)  # of the steps to come, those that would run it
        saved = left_after * per_token * share * (1.0 - best / float(rates[wanted]))
        return saved > make_s

    def __call__(self, params, draft_params, state, step_limit):
        from lsjax.engine.step import PLAN

        limit = int(step_limit)
        nxt, fresh, steps = PLAN, True, int(state.steps)
        every = np.ones(len(self.group_of), bool)
        left_before = None
        if self.partial:  # the pace counts from here
            live = ~np.asarray(state.done)
            left_before = int(np.max(np.where(live, np.asarray(state.limit) - np.asarray(state.num_out), 0)))
        while True:
            watch = self.partial and not self.complete  # a group may still come: look again every `poll` steps
            ready = self.ready() if self.partial else every
            g = 0 if nxt < 0 else int(self.group_of[nxt])
            bound = min(limit, steps + self.poll) if watch else limit
            dp = self._restricted(draft_params, ready)
            before, program = steps, self._program(g)
            t = time.perf_counter()
            state, info, rates = program(params, dp, state, jnp.int32(nxt), jnp.bool_(fresh), jnp.int32(bound))
            nxt, fresh, over, steps, wanted, left = (int(x) for x in np.asarray(info))
            fresh = bool(fresh)
            if left_before is not None and left_before > left:
                self._pace[0] += time.perf_counter() - t
                self._pace[1] += left_before - left
            left_before = left
            if wanted >= 0 and self.priced:
                self._looks[self.group_of[wanted]] += 1
            if wanted >= 0 and not ready[wanted]:
                wanted_g = int(self.group_of[wanted])
                if not over and self._make is not None and self._to_make(wanted_g) and wanted_g not in self._asked:
                    if self._pays(wanted_g, left, np.asarray(rates), ready, wanted):
                        self.request(wanted_g)  # made beside the decode
                    else:
                        self.declined += 1
                # It is coming (made here, or by whoever gave the Futures): these steps bridged until it does.
                if self._make is None or wanted_g in self._taken or wanted_g in self._asked:
                    self.restricted_steps += steps - before
                    self.restricted_until = time.perf_counter()
            elif wanted >= 0 and not over:
                self.request(int(self.group_of[wanted]))  # (not `partial`: made before a call needs it)
            if fresh and (over or steps >= limit):
                return state


class Generator:
    """Compiles prefill + decode for one model and one drafter (AR by default) and runs prompts through them.

    `params` may be the target's shapes alone (`target.abstract_params(config)`: its weights still loading):
    `compile` then makes the programs from them, and `give_weights` hands the weights over before the first
    `run` (decode.py compiles while the model loads)."""

    def __init__(
        self,
        config: ModelConfig,
        params,
        drafter: Drafter = ARDrafter(),
        draft_params=None,
        *,
        backend: str = "auto",
        mesh=None,
        program_cache: ProgramCache | None = None,
    ):
        self.config = config
        # Compiled programs on disk, found without tracing (`lsjax.engine.programs`); never over a mesh.
        self.programs = program_cache if mesh is None else None
        self.mesh = mesh  # a ("data", "model") Mesh (lsjax.mesh.make): the target split over it
        if shapes_only(params) and mesh is not None:
            raise InputError("params: shapes alone (weights still to come) on a mesh; give the weights")
        if mesh is not None:
            draft_params = () if draft_params is None else draft_params
            self.params, self.draft_params = mesh_lib.place(params, draft_params, config, mesh)
        else:
            self.params = self._prepared(params)
            self.draft_params = jax.tree.map(on_device, draft_params) if draft_params is not None else ()
        self.drafter = drafter
        self.backend = backend
        self._host_params: dict = {}  # (bucket, sampling) -> a HostTuned drafter's params
        self._compiled: dict = {}
        self.program_log: list[ProgramReady] = []  # every program this generator made ready, in order
        self.warming_up = False  # a warm-up (`decode.py --precompile`): host params measured, never borrowed
        self._loaded_buckets: set[int] = set()  # prompt buckets whose decode program came from the program cache
        self.loading_decode = False  # the decode program left to the background is loaded from disk, not compiled
        self.compile_workers = 0  # threads compiling a split decode's programs side by side (0: one per core)
        # A split decode's later groups load in the CPU time its decode leaves unused (`split_loading`): lowers
        # the priority of the process's other threads for good, so only for a process that runs one decode
        # (decode.py).
        self.idle_loads = False
        self._unsettled: set = set()  # (bucket, sampling) whose host params were taken before their programs were
        self._finish: list = []  # (prompt_ids, gen, seed) of runs that left something to `finish`
        self._stood_in: set = set()  # sigs whose first run decoded with AR's programs (`stands_in`)

    def _prepared(self, params):
        """`params` in the inference layout on the device, or their shapes in it where they are shapes alone."""
        if shapes_only(params):
            return jax.eval_shape(functools.partial(target.prepare_for_decode, config=self.config), params)
        return jax.tree.map(on_device, target.prepare_for_decode(params, self.config))

    @property
    def weights_pending(self) -> bool:
        """Whether this generator was made from the target's shapes alone and still waits for `give_weights`."""
        return shapes_only(self.params)

    def give_weights(self, params) -> None:
        """The target's weights, for a generator made from their shapes (`target.abstract_params`): programs
        compiled meanwhile run with them. Raises InputError where they are not the shapes it was made for."""
        if not self.weights_pending:
            raise InputError("give_weights: this generator has its weights already")
        if shapes_only(params):
            raise InputError("give_weights: params are shapes alone; give the loaded weights")
        prepared = self._prepared(params)
        want, got = jax.tree.structure(self.params), jax.tree.structure(prepared)
        if want != got:
            raise InputError(f"give_weights: params have another structure than the shapes given ({got} != {want})")
        for (path, w), g in zip(jax.tree_util.tree_flatten_with_path(self.params)[0], jax.tree.leaves(prepared)):
            if (tuple(w.shape), w.dtype) != (tuple(g.shape), g.dtype):
                name = jax.tree_util.keystr(path)
                raise InputError(f"give_weights: {name} is {g.dtype}{list(g.shape)}, expected {w.dtype}{list(w.shape)}")
        self.params = prepared

    def _check_weights(self, what: str) -> None:
        if self.weights_pending:
            raise InputError(f"{what}: the target's weights are still to come (give them with give_weights)")

    def first_programs(self) -> tuple[str, ...]:
        """The programs a run needs before its first decode step: the prefill's and the first decode program
        (a split decode's first group: AR's, for `auto`). What `ProgramCache.read_ahead` reads next time."""
        return ("start", group_name(self.drafter, 0) if self.splits() else "decode")

    def splits(self) -> bool:
        """Whether the decode loop is one program per node-count group (`SplitDecode`): a switched drafter with
        more than one group, on one device, with a program cache (where programs load rather than compile)."""
        return (
            bool(self.drafter.step_variants())
            and len(variant_groups(self.drafter)) > 1
            and self.mesh is None
            and self.programs is not None
        )

    def partial(self, gen: GenerateConfig) -> bool:
        """Whether a split decode runs with the groups loaded so far while the others load (`SplitDecode`):
        only where that cannot change the output. Which groups are loaded when depends on the clock, so at
        T > 0 the same seed would give another sample, and without exact numerics (`exact_on`) a near tie could
        go another way; and only for a drafter that can be restricted (`Drafter.ready_params`)."""
        return gen.sampling.greedy and exact_on(self.config) and self._restrictable

    @functools.cached_property
    def _restrictable(self) -> bool:
        """Whether the drafter's choice can be restricted to some of its variants (`Drafter.ready_params`)."""
        variants = self.drafter.step_variants()
        return bool(variants) and self.drafter.ready_params((), np.ones(len(variants), bool)) is not None

    def _compile(self, bucket: int, capacity: int, gen: GenerateConfig, key, background: bool = False):
        sig = (bucket, capacity, gen)
        if sig in self._compiled:
            return sig, 0.0
        t0 = time.perf_counter()
        drafter = self.drafter
        spec, args, kwargs = self._start_spec(bucket, capacity, gen, key)
        start_fn = functools.partial(loop.start, config=spec)

        def lower_start():
            return jax.jit(start_fn).lower(*args, **kwargs)

        @functools.cache
        def state_shape():
            return jax.eval_shape(start_fn, *args, **kwargs)

        def lower_decode():
            if self.mesh is None:
                return loop.decode_jit.lower(*args, spec, state_shape(), jnp.int32(0))
            # On a mesh: for the state as `start` lays it out over the devices (`loop.decode_pinned`).
            shardings = start.output_shardings
            placed = jax.tree.map(
                lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), state_shape(), shardings
            )
            return loop.decode_pinned(shardings).lower(*args, spec, placed, jnp.int32(0))

        if self._stands_in(sig, spec, args, kwargs, background):
            # AR's own programs, as `--method ar` makes them.
            ar = dataclasses.replace(spec, drafter=ARDrafter())
            ar_fn, ar_args = functools.partial(loop.start, config=ar), (self.params, ())
            ar_state = jax.eval_shape(ar_fn, *ar_args, **kwargs)
            ar_start = self._build("start", ar, (ar_args, kwargs), lambda: jax.jit(ar_fn).lower(*ar_args, **kwargs))

            def ar_decode():
                lower = lambda: loop.decode_jit.lower(*ar_args, ar, ar_state, jnp.int32(0))  # noqa: E731
                return self._build("decode", ar, (ar_args, kwargs), lower)

            self.loading_decode = self.programs.holds("decode", ar, (ar_args, kwargs))
            self._compiled[sig] = (ar_start, beside(ar_decode), ar.drafter)
            return sig, time.perf_counter() - t0

        def wide(g: int) -> bool:
            members = variant_groups(drafter)[g]
            return wide_program(drafter.step_variants()[members[0]].num_nodes, self.mesh, self.config.dtype)

        def lower_group(g: int):
            from lsjax.engine.step import PLAN

            dp = drafter.ready_params(self.draft_params, np.ones(len(drafter.step_variants()), bool))
            dp = self.draft_params if dp is None else dp
            flags = (jnp.int32(PLAN), jnp.bool_(True), jnp.int32(0))
            if not wide(g):
                return loop.group_decode_jit.lower(self.params, dp, spec, state_shape(), *flags, g)
            params = jax.eval_shape(
                functools.partial(target.prepare_for_decode, config=self.config, layout="in"), self.params
            )
            return WideLowered(loop.group_decode_jit.lower(params, dp, spec, state_shape(), *flags, g))

        def build(name, lower):
            program = self._build(name, spec, (args, kwargs), lower)
            if name.startswith("decode") and self.program_log[-1].how == "loaded":
                self._loaded_buckets.add(bucket)
            return program

        start = build("start", lower_start)
        if self.splits():
            groups = variant_groups(drafter)
            names = [group_name(drafter, g) for g in range(len(groups))]

            def build_group(g: int):
                program = build(names[g], functools.partial(lower_group, g))
                return InLayout(program, self.config) if wide(g) else program

            sizes = [self.programs.size(n, spec, (args, kwargs)) for n in names]
            stored = all(s is not None for s in sizes[1:])
            # Loading from disk is one thread, beside the prefill and the decode. Compiling uses the cores they
            # run on (on a CPU), so it goes there only where decoding can start with AR's group alone (`partial`):
            # the run's tokens come at about AR's pace instead of after every group (~70 s on 2 cores).
            background = background and (stored or compiler_beside_device() or self.partial(gen))
            self.loading_decode = background and stored
            if not background:
                # Each program compiles on one core for most of its time: side by side they take about as long
                # as the single program (2 cores, SmolLM2: 6 programs, 87 s of compiling, ~45 s apart).
                workers = max(1, min(len(names), self.compile_workers or os.cpu_count() or 1))
                with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="lsjax-compile") as pool:
                    state_shape()  # traced once, before the threads need it
                    programs = list(pool.map(build_group, range(len(names))))
                self._compiled[sig] = (start, SplitDecode(drafter, programs, self.partial(gen)), drafter)
                return sig, time.perf_counter() - t0
            if stored:  # (`_host_run`: the programs come from disk, even those not loaded yet)
                self._loaded_buckets.add(bucket)
            # AR's group first (beside the prefill; it decodes while the others come), then each group the
            # drafter asks for; compiling (for the next start too), or beside an accelerator (a host thread the
            # device does not wait for), also the rest, smallest trees first: the cheapest steps are the ones a
            # CPU runs most (ls-chain1 on prose); the same for a split of two groups read from disk. Otherwise, on a
            # CPU, a group nobody asks for is never read from disk.
            order = sorted(range(len(names)), key=lambda g: drafter.step_variants()[groups[g][0]].num_nodes)
            loading = split_loading(stored, self.idle_loads, len(names))
            split = SplitDecode(
                drafter,
                [concurrent.futures.Future() for _ in names],
                self.partial(gen),
                make=build_group,
                order=order,
                eager=loading == "eager",
                priced=loading == "priced",
                sizes=sizes,
                idle=loading == "idle" or (loading == "priced" and self.idle_loads),
                first_only=loading == "first",
                load_rate=self.programs.seconds_per_byte,
            )
            split.from_disk = stored
            self._compiled[sig] = (start, split, drafter)
            return sig, time.perf_counter() - t0
        stored = self.programs is not None and self.programs.holds("decode", spec, (args, kwargs))
        # What the background is doing, for a status line ("loading" reads from disk; else XLA compiles).
        self.loading_decode = background and stored
        decode = beside(lambda: build("decode", lower_decode)) if background else build("decode", lower_decode)
        self._compiled[sig] = (start, decode, drafter)
        return sig, time.perf_counter() - t0

    def _build(self, name: str, spec: SpecConfig, start_args, lower):
        """Program `name`, loaded from the program cache or compiled (and stored there), logged."""
        t = time.perf_counter()
        if self.programs is None:
            program, how = lower().compile(), "compiled"
        else:
            # Every program is determined by the spec and the start arguments (the state the decode programs
            # take is start's output).
            program, how = self.programs.fetch(name, spec, start_args, lower)
        self.program_log.append(ProgramReady(name, how, time.perf_counter() - t))
        return program

    def _stands_in(self, sig, spec: SpecConfig, args, kwargs, background: bool) -> bool:
        """Whether this start decodes with AR's own programs (the first at this width, greedy, on a CPU), its own
        programs compiled after the output (`finish`) for the next start: a split decode's first program (AR's
        group with the stretches and the policy) compiles ~2.3x as long as AR's decode program, and the trees
        after it, on the cores the decode runs on (a first start at a new width was 1.4-1.8x AR's wall time
        for the same tokens, 2026-12-02). Only where the output cannot change (`partial`: T = 0, exact) and
        once per width and process; `$LSJAX_SPLIT_LOAD` other than "first" keeps the method's own programs."""
        if not (background and self.splits() and self.partial(spec.gen)) or self.warming_up or sig in self._stood_in:
            return False
        if split_loading(stored=False, idle=self.idle_loads) != "first":
            return False
        return self.programs.size(group_name(self.drafter, 0), spec, (args, kwargs)) is None

    def stands_in(self, prompt_ids: list[int], gen: GenerateConfig, seed: int = 0) -> bool:
        """Whether `compile(..., background=True)` and the next `run` of this prompt decode with AR's own
        programs (`_stands_in`), for a caller that says what it is compiling (`decode.py`)."""
        _, bucket, capacity, width = self._shapes(prompt_ids, gen)
        sig = (bucket, capacity, width)
        if sig in self._compiled:
            return self._compiled[sig][2] is not self.drafter
        return self._stands_in(sig, *self._start_spec(bucket, capacity, width, jax.random.key(seed)), True)

    def _start_spec(self, bucket: int, capacity: int, gen: GenerateConfig, key):
        """(the spec, the start program's positional and keyword arguments, abstract where they vary): what
        determines the programs of a prompt bucket and output width (the program cache's key)."""
        spec = SpecConfig(self.config, gen, self.drafter, capacity=capacity, backend=self.backend, mesh=self.mesh)
        tokens = jax.ShapeDtypeStruct((1, bucket), jnp.int32)
        lengths = jax.ShapeDtypeStruct((1,), jnp.int32)
        max_new = jax.ShapeDtypeStruct((1,), jnp.int32)
        kwargs = {"tokens": tokens, "lengths": lengths, "key": key, "max_new": max_new}
        return spec, (self.params, self.draft_params), kwargs

    @property
    def compiling(self) -> bool:
        """Whether a decode program is compiling (or loading) in the background (`compile(background=True)`)."""
        return any(
            isinstance(c[1], concurrent.futures.Future) or (isinstance(c[1], SplitDecode) and c[1].busy)
            for c in self._compiled.values()
        )

    @property
    def first_pending(self) -> bool:
        """Whether the decode program a run begins with (a split decode's first group) is still being made in the
        background: a status line's "loading" or "compiling" until it is ready, then the prefill's."""
        for _, decode, _ in self._compiled.values():
            if _pending(decode.programs[0] if isinstance(decode, SplitDecode) else decode):
                return True
        return False

    def _ready(self, sig) -> float:
        """Waits for a decode program compiled in the background; returns its compile seconds (0 if none)."""
        start, decode, drafter = self._compiled[sig]
        if not isinstance(decode, concurrent.futures.Future):
            return 0.0
        try:
            decode, seconds = decode.result()
        except BaseException:
            del self._compiled[sig]  # the next call compiles again, in the foreground
            raise
        self._compiled[sig] = (start, decode, drafter)
        return seconds

    @property
    def owes(self) -> bool:
        """Whether `finish` has work: programs still being made in the background, or host params a run had to
        take before its programs were compiled."""
        return bool(self._finish) or any(
            isinstance(c[1], SplitDecode) and c[1].compiling for c in self._compiled.values()
        )

    def close(self) -> None:
        """Stops loading programs in the background once the one loading now is in (a process that is done
        with its runs need not read the rest; programs being compiled are finished and stored: `finish`)."""
        for _, decode, _ in self._compiled.values():
            if isinstance(decode, SplitDecode) and decode.from_disk:
                decode.close()

    def finish(self) -> float:
        """After a run's output: waits for the programs still being made in the background and finds the host
        params (`auto`: its cost profile at the run's width) a run had to take before they were, so the next
        start loads the one and reads the other. Returns the seconds it took (`decode.py` says so first)."""
        t0 = time.perf_counter()
        for sig, (_, decode, _) in list(self._compiled.items()):
            if isinstance(decode, SplitDecode):
                if decode.compiling:  # (what is only loaded need not be: it is on disk)
                    decode.wait()
            else:
                self._ready(sig)
        while self._finish:
            self._check_weights("finish")
            prompt_ids, gen, seed = self._finish.pop()
            gen, P, buf, key, sig, _ = self._prepare(prompt_ids, gen, seed)
            start, decode, _ = self._compiled[sig]
            self._unsettled.discard((buf.shape[1], gen.sampling))
            state = start(self.params, self.draft_params, **start_args(buf, P, key, gen))
            self._draft_params(gen, buf.shape[1], state, decode)
        return time.perf_counter() - t0

    def _prepare(self, prompt_ids: list[int], gen: GenerateConfig, seed: int, wait=True, background=False):
        """Validates the prompt, caps max_new_tokens to the context, pads the prompt into its bucket and
        compiles (once per prompt bucket and output width: `loop.new_tokens_bucket`; the count itself is data,
        `start`'s `max_new`). Returns (gen, P, buf [1, bucket], key, sig, compile_s), the programs in
        `self._compiled[sig]`; `wait=False` leaves a decode program compiling in the background as it is, and
        `background=True` compiles a new one there."""
        gen, bucket, capacity, width = self._shapes(prompt_ids, gen)
        P = len(prompt_ids)
        key = jax.random.key(seed)
        sig, compile_s = self._compile(bucket, capacity, width, key, background)
        if wait:
            compile_s += self._ready(sig)
        buf = np.zeros((1, bucket), np.int32)
        buf[0, :P] = prompt_ids
        return gen, P, buf, key, sig, compile_s

    def _shapes(self, prompt_ids: list[int], gen: GenerateConfig):
        """(gen capped to the context, the prompt's bucket, the cache capacity, gen at its output width): what
        a prompt compiles for (once per prompt bucket and output width)."""
        max_new = check_prompt(self.config, prompt_ids, gen.max_new_tokens)
        if max_new != gen.max_new_tokens:
            gen = dataclasses.replace(gen, max_new_tokens=max_new)
        bucket = loop.prompt_bucket(len(prompt_ids))
        width = dataclasses.replace(gen, max_new_tokens=loop.new_tokens_bucket(max_new, self.config.max_position))
        return gen, bucket, loop.required_capacity(bucket, width, self.drafter), width

    def programs_for(self, prompt_ids: list[int], gen: GenerateConfig, seed: int = 0):
        """(gen capped to the context, P, buf [1, bucket], key, (start, decode, drafter), compile_s): the
        compiled programs for this prompt, compiled now if they are not yet."""
        self._check_weights("programs_for")
        gen, P, buf, key, sig, compile_s = self._prepare(prompt_ids, gen, seed)
        return gen, P, buf, key, self._compiled[sig], compile_s

    def compile(self, prompt_ids: list[int], gen: GenerateConfig, seed: int = 0, background: bool = False) -> float:
        """Compiles what `run` needs for this prompt (once per prompt bucket) ahead of it; returns the seconds
        it took (0 when already compiled, and `run` then reports compile_s 0). For a caller that shows
        progress while compiling (`decode.py`). `background=True` compiles the prefill program and returns,
        leaving the decode program compiling on a host thread: the next `run` prefills meanwhile and waits
        for it (its compile seconds are then added to that run's `compile_s`; `beside` says what it saves on a
        CPU). A split decode's groups keep their own rule (`split_loading`).
        The target's shapes alone (`give_weights` later) are enough: nothing here reads the weights."""
        return self._prepare(prompt_ids, gen, seed, wait=not background, background=background)[-1]

    def run(
        self,
        prompt_ids: list[int],
        gen: GenerateConfig,
        seed: int = 0,
        on_tokens: Callable[[list[int]], None] | None = None,
        stream_every: int = 8,
        on_ready: Callable[[], None] | None = None,
        max_new: int | None = None,
        on_prefilled: Callable[[], None] | None = None,
    ) -> GenerationResult:
        """Prefills and decodes `prompt_ids`; `on_tokens` gets the new tokens every `stream_every` steps (else
        the decode runs in one call), the first as soon as the prefill has made it (before a decode program
        still being made is waited for); `on_prefilled` is called then, before it, and `on_ready` once the
        programs are compiled and decoding starts.
        `max_new`: stop after this many new tokens, running the programs `gen`'s length compiles (a warm-up
        that makes them, and a `HostTuned` drafter's params, ready for later runs of `gen`)."""
        self._check_weights("run")
        gen, P, buf, key, sig, compile_s = self._prepare(prompt_ids, gen, seed, wait=False)
        if max_new is not None and max_new < gen.max_new_tokens:
            gen = dataclasses.replace(gen, max_new_tokens=max(max_new, 1))
        start, _, drafter = self._compiled[sig]
        stand_in = drafter is not self.drafter  # AR's programs (`_stands_in`)
        t0 = time.perf_counter()
        state = start(self.params, () if stand_in else self.draft_params, **start_args(buf, P, key, gen))
        jax.block_until_ready(state.num_out)
        first_token_at = time.perf_counter()  # the prefill emits the first token
        prefill_s = first_token_at - t0
        pending = self._compiled[sig][1]
        split = pending if isinstance(pending, SplitDecode) else None
        alongside = isinstance(pending, concurrent.futures.Future) or (split is not None and split.busy)
        emitted = 0

        def stream(state):
            nonlocal emitted
            n = int(state.num_out[0])
            if on_tokens is not None and n > emitted:
                on_tokens(np.asarray(state.out[0, emitted:n]).tolist())
                emitted = n

        if on_prefilled is not None:
            on_prefilled()
        stream(state)
        t0 = time.perf_counter()
        # Seconds inside the decode that ran no decode step: waiting for a program, host tuning.
        aside = time.perf_counter()
        compile_s += self._ready(sig)
        decode = self._compiled[sig][1]
        if on_ready is not None:
            on_ready()
        waited = split.waited if split is not None else 0.0
        draft_params = () if stand_in else self._draft_params(gen, buf.shape[1], state, decode)
        aside = time.perf_counter() - aside
        decode_at = time.perf_counter()
        if split is not None:
            split.restricted_until, restricted, declined = None, split.restricted_steps, split.declined

        if on_tokens is None:
            state = decode(self.params, draft_params, state, jnp.int32(gen.max_new_tokens))
        else:
            limit = int(state.steps)
            while True:
                stream(state)
                if bool(state.done[0]):
                    break
                limit += stream_every
                state = decode(self.params, draft_params, state, jnp.int32(limit))
        jax.block_until_ready(state.num_out)
        bridged = declined_loads = 0
        if split is not None:
            declined_loads = split.declined - declined
            # Waiting for a group (a forced one, or one a call that cannot run restricted must run) is loading.
            compile_s += split.waited - waited
            aside += split.waited - waited
            # Steps the drafter ran restricted to the groups loaded so far, wanting another: AR's bridge.
            bridged = split.restricted_steps - restricted
            if split.restricted_until is not None:
                decode_at = max(decode_at, split.restricted_until)
        decode_s = time.perf_counter() - t0 - aside

        if (buf.shape[1], gen.sampling) in self._unsettled:
            self._finish.append((prompt_ids, gen, seed))
        if stand_in:  # the method's own programs next: compiled by `finish`, or by the next run
            del self._compiled[sig]
            self._stood_in.add(sig)
            self._finish.append((prompt_ids, gen, seed))
            bridged = int(state.steps)
        n = int(state.num_out[0])
        tokens = np.asarray(state.out[0, :n]).tolist()
        stops = set(stop_ids(self.config, gen))
        return GenerationResult(
            tokens=tokens,
            prompt_tokens=P,
            compile_s=compile_s,
            prefill_s=prefill_s,
            prefill_alongside_compile=alongside,
            bridged_steps=bridged,
            declined_loads=declined_loads,
            decode_program_at=0.0 if stand_in else decode_at,
            first_token_at=first_token_at,
            decode_s=decode_s,
            target_forwards=1 + int(state.steps),
            stop_reason="eos" if tokens and tokens[-1] in stops else "max_new_tokens",
            method=self.drafter.name,
            drafter_stats=self.drafter.summary(state.draft) if isinstance(drafter, Summarized) else None,
            ar_stand_in=stand_in,
        )

    def known_draft_params(self, prompt_ids: list[int], gen: GenerateConfig):
        """A `HostTuned` drafter's params a run of this prompt's bucket and sampling found, or None (not found
        yet, or found before the programs were all made: `finish` finds them)."""
        return self._host_params.get((loop.prompt_bucket(len(prompt_ids)), gen.sampling))

    def _draft_params(self, gen: GenerateConfig, bucket: int, state, decode):
        """The draft params for this prompt: a `HostTuned` drafter's are found on the host before the timed
        decode, once per (bucket, sampling), and kept (with the decode program, which a `SplitDecode` may still
        be loading: it waits only for a group it has to run)."""
        if not isinstance(self.drafter, HostTuned):
            return self.draft_params
        key = (bucket, gen.sampling)
        if key not in self._host_params and isinstance(decode, SplitDecode) and decode.compiling:
            # Measuring would wait for every program: what is known now, and `finish` measures after the output.
            self._unsettled.add(key)
            return self.drafter.host_params(self._host_run(gen, bucket, state, decode, settled=False))
        if key not in self._host_params:
            self._host_params[key] = self.drafter.host_params(self._host_run(gen, bucket, state, decode))
        return self._host_params[key]

    def _host_run(self, gen: GenerateConfig, bucket: int, state, decode, settled: bool = True) -> HostRun:
        return HostRun(
            self.config.name,
            self.backend,
            self.params,
            self.draft_params,
            gen,
            bucket,
            state,
            decode,
            self.config.signature(),
            str(mesh_lib.shape_of(self.mesh)) if self.mesh is not None else "",
            # A start that loaded its programs borrows a neighbour's costs rather than wait to measure; one that
            # compiled (its first at this width) measures, so later starts at the width read their own.
            not self.warming_up and bucket in self._loaded_buckets,
            settled,
        )
