"""A switched drafter's decode loop as one program per node-count group, and the one rule for when each group's
program is made. Why split, and why this rule: docs/design/cpu-startup.md."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable

import jax.numpy as jnp
import numpy as np

from lsjax.errors import LsjaxError
from lsjax.runtime.cpu import idle_priority

# A split of this many groups or fewer, read from disk, loads them all at once: AR's group and the one
# speculative program of a draft-less `auto` (prompt lookup) load beside the prefill.
EAGER_GROUPS = 2


def loading(stored: bool, beside_device: bool, groups: int, one_decode: bool) -> dict:
    """How a split decode makes its groups after the first, as `SplitDecode`'s keyword arguments: the one rule.

    - Beside an accelerator (XLA compiles on a host thread the device does not wait for): every group, at once.
    - Compiling on a CPU: the first group only; the rest compile after the output (`Generator.finish`), since
      beside the decode they take the cores it runs on.
    - Read from disk on a CPU: every group at once where there are `EAGER_GROUPS` or fewer; else each group as
      the drafter asks for it, and in a process that runs one decode (`one_decode`: decode.py) at the lowest CPU
      priority, so that a load yields to the decode."""
    if beside_device:
        return {"eager": True}
    if not stored:
        return {"eager": False, "first_only": True}
    if groups <= EAGER_GROUPS:
        return {"eager": True}
    return {"eager": False, "idle": one_decode}


_idled: list = []  # `idle_priority` has run in this process (once is enough: new threads inherit it)


def pending(program) -> bool:
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

    Why: a single program holds every group's target forward (auto: six verification sizes), which takes many
    times one method's program to load or compile. Split, the first group (AR's, which also runs the
    stretches) is ready about as soon as one method's program, and the others come as the drafter asks.

    `groups`: the variants of each group (`lsjax.engine.step.variant_groups`); `plan`: the `nxt` a call begins
    with where the engine chooses (`lsjax.engine.step.PLAN`). `programs[g]`: a compiled program, or a Future
    of one. With `make` (g -> program), the groups are made on one background thread: the first at once, then
    each group the drafter asks for (a call that needs it, or the choice it would make with every group
    loaded: `wanted` in the program's info), and with `eager` the rest in `order` after those. Without `eager`
    a group nobody asks for is never made. `loading` gives these arguments by the one rule.

    With `partial`, a call runs the drafter restricted to the groups ready so far (`Drafter.ready_params`),
    looking again every `poll` steps; else it waits for each group it has to run (the choices, and so the
    output, never depend on what has loaded when). With `partial`, a group is not asked for where its load, at
    this run's seconds per token so far, would end after the last token: on a CPU it would take the decode's
    cores for nothing. With `idle`, the groups after the first load at the lowest CPU priority
    (`idle_priority`)."""

    poll = 8  # steps between looks at what has loaded, while something may still load

    def __init__(
        self,
        drafter,
        groups: list[list[int]],
        programs: list,
        partial: bool,
        *,
        plan: int,
        make: Callable[[int], object] | None = None,
        order: list[int] | None = None,
        eager: bool = True,
        sizes: list[int | None] | None = None,
        idle: bool = False,
        first_only: bool = False,
        load_rate: Callable[[], float | None] | None = None,
    ):
        self.drafter = drafter
        self.groups = groups
        self.plan = plan
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
        self.idle = idle
        self.first_only = first_only  # asks for no group but the first (`partial`: the drafter keeps to it)
        self.declined = 0  # times a wanted group was not asked for: its load would end after the last token
        self._make_s: dict[int, float] = {}  # group -> seconds its program took to make in the background
        self.sizes = sizes  # bytes of each group's stored program (None: unknown), to estimate its load
        # Seconds per stored byte that reading a program has taken in this process (`ProgramCache.reads`): the
        # price of a load where the first group's own was hidden (read ahead while the model loaded).
        self.load_rate = load_rate
        self._pace = [0.0, 0]  # [seconds, tokens] of this run's calls so far (`partial`)
        self._asked: list[int] = []  # groups asked for, made first come first served
        self._taken: set[int] = set()  # groups the background thread has begun to make
        self._lock = threading.Lock()
        self._worker: threading.Thread | None = None
        if make is not None:
            self.request(0)

    @property
    def loading(self) -> bool:
        """Whether the groups still to come are read from disk in the background (not compiled)."""
        return self._make is not None and self.from_disk

    @property
    def first_pending(self) -> bool:
        """Whether the program a run begins with (the first group's) is still being made."""
        return pending(self.programs[0])

    def wait_first(self) -> float:
        """What a run needs before its first step: nothing (a call waits for the group it must run); 0 seconds."""
        return 0.0

    @property
    def compiling(self) -> bool:
        """Whether programs are still being compiled (not loaded) in the background."""
        return not self.from_disk and not self.complete

    @property
    def complete(self) -> bool:
        """Whether every group's program is made (or failed, or given up: `close`)."""
        return not any(pending(p) for p in self.programs)

    @property
    def busy(self) -> bool:
        """Whether a program is being made in the background now (or asked for and not begun)."""
        if self._make is None:
            return not self.complete
        with self._lock:
            return any(pending(p) and (g in self._taken or g in self._asked) for g, p in enumerate(self.programs))

    def _to_make(self, g: int) -> bool:
        return pending(self.programs[g]) and g not in self._taken

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

    def _pays(self, g: int, left: int) -> bool:
        """Whether to make group g with `left` tokens to go: not where, at this run's seconds per token so far,
        it would be in only after the last. Yes where anything it needs is unknown."""
        if self.first_only:
            return False
        make_s = self._make_estimate(g)
        if make_s is None or self._pace[1] == 0:
            return True
        return left - make_s / (self._pace[0] / self._pace[1]) > 0

    def __call__(self, params, draft_params, state, step_limit):
        limit = int(step_limit)
        nxt, fresh, steps = self.plan, True, int(state.steps)
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
            state, info, _ = program(params, dp, state, jnp.int32(nxt), jnp.bool_(fresh), jnp.int32(bound))
            nxt, fresh, over, steps, wanted, left = (int(x) for x in np.asarray(info))
            fresh = bool(fresh)
            if left_before is not None and left_before > left:
                self._pace[0] += time.perf_counter() - t
                self._pace[1] += left_before - left
            left_before = left
            if wanted >= 0 and not ready[wanted]:
                wanted_g = int(self.group_of[wanted])
                if not over and self._make is not None and self._to_make(wanted_g) and wanted_g not in self._asked:
                    if self._pays(wanted_g, left):
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


class OneProgram:
    """A decode that is one program, made now or on a host thread beside the prefill (`beside`): the interface a
    `SplitDecode` has, for the host. `program`: a compiled program, or a Future of (program, seconds)."""

    waited = 0.0
    restricted_steps = declined = 0
    restricted_until = None

    def __init__(self, program, from_disk: bool = False):
        self.program, self.from_disk = program, from_disk

    @property
    def busy(self) -> bool:
        """Whether the program is made in the background and not yet waited for (`wait_first`)."""
        return isinstance(self.program, concurrent.futures.Future)

    @property
    def first_pending(self) -> bool:
        return pending(self.program)

    @property
    def loading(self) -> bool:
        return self.from_disk and pending(self.program)

    @property
    def compiling(self) -> bool:
        return not self.from_disk and pending(self.program)

    def wait_first(self) -> float:
        """Waits for a program made in the background; returns the seconds it took (0 if made already). Its
        error, if it failed, is raised here."""
        if not isinstance(self.program, concurrent.futures.Future):
            return 0.0
        self.program, seconds = self.program.result()
        return seconds

    def wait(self) -> None:
        self.wait_first()

    def close(self) -> None:
        pass

    def __call__(self, params, draft_params, state, step_limit):
        return self.program(params, draft_params, state, step_limit)
