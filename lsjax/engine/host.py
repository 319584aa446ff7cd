"""Host-side driver: text in, text out, with compile / prefill / decode timed separately.

The jitted pieces live in `lsjax.engine.loop` (and, for speculative methods, the
engine); this module only pads prompts into buckets, compiles ahead of time so
compile time is not counted as decode time, streams text, and reports counters.
Used by `decode.py` and the benchmarks.
"""

from __future__ import annotations

import dataclasses
import functools
import time
import typing
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from lsjax import mesh as mesh_lib
from lsjax.config import GenerateConfig, ModelConfig
from lsjax.engine import loop
from lsjax.engine.step import PLAN, stop_ids, variant_groups
from lsjax.engine.types import ARDrafter, Drafter, GenerationResult, HostRun, HostTuned, SpecConfig, Summarized
from lsjax.errors import InputError, LsjaxError
from lsjax.models import target
from lsjax.runtime import Startup, beside
from lsjax.runtime.split import OneProgram


class PromptError(LsjaxError, ValueError):
    """The prompt is empty or does not fit the model's context window."""


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first index where two token lists differ (a length difference counts), None when equal."""
    i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    return i if i is not None or len(a) == len(b) else min(len(a), len(b))


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
    """`a` as a device array. A read-only host array (weights `lsjax.runtime.weights` keeps, made or mapped from
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


class ProgramReady(typing.NamedTuple):
    """A program a `Generator` made ready: its name (start, decode, or a split decode's `group_name`), how
    ("loaded" from the start-up's store, "jax-cache": traced and lowered with XLA's compile read from JAX's
    persistent cache, "compiled") and the seconds it took."""

    name: str
    how: str
    seconds: float


def group_name(drafter: Drafter, group: int) -> str:
    """A split decode program's name: the node count its group verifies."""
    return f"decode-{drafter.step_variants()[variant_groups(drafter)[group][0]].num_nodes}n"


class Generator:
    """Compiles prefill + decode for one model and one drafter (AR by default) and runs prompts through them.

    `params` may be the target's shapes alone (`target.abstract_params(config)`: its weights still loading):
    `compile` then makes the programs from them, and `give_weights` hands the weights over before the first
    `run` (decode.py compiles while the model loads). `startup` (`lsjax.runtime.Startup`) says where programs
    come from and when they are made; the default compiles each in this process."""

    def __init__(
        self,
        config: ModelConfig,
        params,
        drafter: Drafter = ARDrafter(),
        draft_params=None,
        *,
        backend: str = "auto",
        mesh=None,
        startup: Startup | None = None,
    ):
        self.config = config
        # Programs over a mesh are compiled anew: only one device's are kept.
        self.startup = startup if startup is not None and mesh is None else Startup()
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
        self._loaded_buckets: set[int] = set()  # prompt buckets whose decode program was loaded, not compiled
        self.loading_decode = False  # the decode program left to the background is loaded from disk, not compiled
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
        (a split decode's first group: AR's, for `auto`). What a start-up's store reads ahead next time."""
        return ("start", group_name(self.drafter, 0) if self.splits() else "decode")

    def splits(self) -> bool:
        """Whether the decode loop is one program per node-count group (`lsjax.runtime.split`): a switched
        drafter with more than one group, on one device, where programs load from a store rather than compile."""
        return (
            bool(self.drafter.step_variants())
            and len(variant_groups(self.drafter)) > 1
            and self.mesh is None
            and self.startup.stores
        )

    def partial(self, gen: GenerateConfig) -> bool:
        """Whether a split decode runs with the groups loaded so far while the others load:
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

            stored = self.startup.holds("decode", ar, (ar_args, kwargs))
            self.loading_decode = stored
            self._compiled[sig] = (ar_start, OneProgram(beside(ar_decode), stored), ar.drafter)
            return sig, time.perf_counter() - t0

        def build(name, lower, view=None):
            program = self._build(name, spec, (args, kwargs), lower, view)
            if name.startswith("decode") and self.program_log[-1].how == "loaded":
                self._loaded_buckets.add(bucket)
            return program

        start = build("start", lower_start)
        if self.splits():
            groups = variant_groups(drafter)
            names = [group_name(drafter, g) for g in range(len(groups))]
            nodes = [drafter.step_variants()[members[0]].num_nodes for members in groups]
            # A group the start-up lowers for the projections [in, out] only runs on that view of the params.
            view = functools.partial(target.prepare_for_decode, config=self.config, layout="in")
            dp = drafter.ready_params(self.draft_params, np.ones(len(drafter.step_variants()), bool))
            dp = self.draft_params if dp is None else dp
            flags = (jnp.int32(PLAN), jnp.bool_(True), jnp.int32(0))

            def build_group(g: int):
                in_layout = self.startup.in_layout(nodes[g], self.mesh, self.config.dtype)
                params = jax.eval_shape(view, self.params) if in_layout else self.params

                def lower():
                    return loop.group_decode_jit.lower(params, dp, spec, state_shape(), *flags, g)

                return build(names[g], lower, view if in_layout else None)

            split = self.startup.split(
                drafter,
                groups,
                names,
                build_group,
                plan=PLAN,
                partial=self.partial(gen),
                background=background,
                static=spec,
                args=(args, kwargs),
                trace=state_shape,
            )
            self.loading_decode = split.loading
            if split.loading:  # (`_host_run`: the programs come from disk, even those not loaded yet)
                self._loaded_buckets.add(bucket)
            self._compiled[sig] = (start, split, drafter)
            return sig, time.perf_counter() - t0
        stored = self.startup.holds("decode", spec, (args, kwargs))
        # What the background is doing, for a status line ("loading" reads from disk; else XLA compiles).
        self.loading_decode = background and stored
        if background:
            decode = OneProgram(beside(lambda: build("decode", lower_decode)), stored)
        else:
            decode = OneProgram(build("decode", lower_decode))
        self._compiled[sig] = (start, decode, drafter)
        return sig, time.perf_counter() - t0

    def _build(self, name: str, spec: SpecConfig, start_args, lower, view=None):
        """Program `name` from the start-up (loaded or compiled), logged. Every program is determined by the spec
        and the start arguments (the state the decode programs take is start's output)."""
        t = time.perf_counter()
        program, how = self.startup.make(name, spec, start_args, lower, view)
        self.program_log.append(ProgramReady(name, how, time.perf_counter() - t))
        return program

    def _stands_in(self, sig, spec: SpecConfig, args, kwargs, background: bool) -> bool:
        """Whether this start decodes with AR's own programs, its own made after the output (`finish`) for the
        next start: the first start at this width of a split decode that is not stored, where compiling it
        would take the decode's cores (`Startup.stands_in`). Only where the output cannot change (`partial`:
        T = 0, exact) and once per width and process."""
        if not (background and self.splits() and self.partial(spec.gen)) or self.warming_up or sig in self._stood_in:
            return False
        return self.startup.stands_in() and not self.startup.holds(group_name(self.drafter, 0), spec, (args, kwargs))

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
        determines the programs of a prompt bucket and output width (what keys a stored program)."""
        spec = SpecConfig(self.config, gen, self.drafter, capacity=capacity, backend=self.backend, mesh=self.mesh)
        tokens = jax.ShapeDtypeStruct((1, bucket), jnp.int32)
        lengths = jax.ShapeDtypeStruct((1,), jnp.int32)
        max_new = jax.ShapeDtypeStruct((1,), jnp.int32)
        kwargs = {"tokens": tokens, "lengths": lengths, "key": key, "max_new": max_new}
        return spec, (self.params, self.draft_params), kwargs

    @property
    def compiling(self) -> bool:
        """Whether a decode program is compiling (or loading) in the background (`compile(background=True)`)."""
        return any(c[1].busy for c in self._compiled.values())

    @property
    def first_pending(self) -> bool:
        """Whether the decode program a run begins with (a split decode's first group) is still being made in the
        background: a status line's "loading" or "compiling" until it is ready, then the prefill's."""
        return any(decode.first_pending for _, decode, _ in self._compiled.values())

    def _ready(self, sig) -> float:
        """Waits for a decode program compiled in the background; returns its compile seconds (0 if none)."""
        decode = self._compiled[sig][1]
        try:
            return decode.wait_first()
        except BaseException:
            del self._compiled[sig]  # the next call compiles again, in the foreground
            raise

    @property
    def owes(self) -> bool:
        """Whether `finish` has work: programs still being made in the background, or host params a run had to
        take before its programs were compiled."""
        return bool(self._finish) or any(c[1].compiling for c in self._compiled.values())

    def close(self) -> None:
        """Stops loading programs in the background once the one loading now is in (a process that is done
        with its runs need not read the rest; programs being compiled are finished and stored: `finish`)."""
        for _, decode, _ in self._compiled.values():
            if decode.from_disk:
                decode.close()

    def finish(self) -> float:
        """After a run's output: waits for the programs still being made in the background and finds the host
        params (`auto`: its cost profile at the run's width) a run had to take before they were, so the next
        start loads the one and reads the other. Returns the seconds it took (`decode.py` says so first)."""
        t0 = time.perf_counter()
        for sig, (_, decode, _) in list(self._compiled.items()):
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
        CPU). A split decode's groups keep their own rule (`lsjax.runtime.split.loading`).
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
        decode = self._compiled[sig][1]
        alongside = decode.busy
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
        if on_ready is not None:
            on_ready()
        waited = decode.waited
        draft_params = () if stand_in else self._draft_params(gen, buf.shape[1], state, decode)
        aside = time.perf_counter() - aside
        decode_at = time.perf_counter()
        decode.restricted_until, restricted, declined = None, decode.restricted_steps, decode.declined

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
        declined_loads = decode.declined - declined
        # Waiting for a group (a forced one, or one a call that cannot run restricted must run) is loading.
        compile_s += decode.waited - waited
        aside += decode.waited - waited
        # Steps the drafter ran restricted to the groups loaded so far, wanting another: AR's bridge.
        bridged = decode.restricted_steps - restricted
        if decode.restricted_until is not None:
            decode_at = max(decode_at, decode.restricted_until)
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
        decode, once per (bucket, sampling), and kept (with the decode program, which a split decode may still
        be loading: it waits only for a group it has to run)."""
        if not isinstance(self.drafter, HostTuned):
            return self.draft_params
        key = (bucket, gen.sampling)
        if key not in self._host_params and decode.compiling:
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
