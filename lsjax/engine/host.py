"""Host-side driver: text in, text out, with compile / prefill / decode timed separately.

The jitted pieces live in `lsjax.engine.loop` (and, for speculative methods, the
engine); this module only pads prompts into buckets, compiles ahead of time so
compile time is not counted as decode time, streams text, and reports counters.
Used by `decode.py` and the benchmarks.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import threading
import time
import typing
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from lsjax import mesh as mesh_lib
from lsjax.config import GenerateConfig, ModelConfig
from lsjax.engine import loop
from lsjax.engine.programs import ProgramCache, program_key
from lsjax.engine.step import stop_ids
from lsjax.engine.types import ARDrafter, Drafter, HostRun, HostTuned, SpecConfig, Summarized
from lsjax.errors import LsjaxError
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
    # Plain AR steps the bridge program ran while the drafter's decode program was still loading (`Generator`);
    # they are part of decode_s and target_forwards.
    bridged_steps: int = 0
    # `time.perf_counter()` when the drafter's own decode program took over (after any bridged steps and its
    # host tuning): a launcher's "seconds until the speculative program is in use" (`decode.py --json`).
    decode_program_at: float = 0.0
    first_token_at: float = 0.0  # `time.perf_counter()` when the first new token was ready (after the prefill)

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


def exact_on(config: ModelConfig) -> bool:
    """Whether every method's greedy output equals AR's token for token on this backend, whatever the steps'
    shapes: fp32 on a CPU (the lossless tests' setting) or batch-invariant numerics (`invariant_rows`)."""
    return config.invariant_rows > 0 or (jax.default_backend() == "cpu" and config.dtype == "float32")


def compiler_beside_device() -> bool:
    """Whether XLA compiles on other hardware than the programs run on (an accelerator, not the host CPU)."""
    return jax.default_backend() != "cpu"


class ProgramReady(typing.NamedTuple):
    """A program a `Generator` made ready: its name (start, decode, bridge), how ("loaded" from the program
    cache, "jax-cache": traced and lowered with XLA's compile read from JAX's persistent cache, "compiled")
    and the seconds it took."""

    name: str
    how: str
    seconds: float


class Generator:
    """Compiles prefill + decode for one model and one drafter (AR by default) and runs prompts through them."""

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
        if mesh is not None:
            draft_params = () if draft_params is None else draft_params
            self.params, self.draft_params = mesh_lib.place(params, draft_params, config, mesh)
        else:
            self.params = jax.tree.map(jnp.asarray, target.prepare_for_decode(params, config))
            self.draft_params = jax.tree.map(jnp.asarray, draft_params) if draft_params is not None else ()
        self.drafter = drafter
        self.backend = backend
        self._host_params: dict = {}  # (bucket, sampling) -> a HostTuned drafter's params
        self._compiled: dict = {}
        self._bridges: dict = {}  # sig -> the bridge program (`bridges`), where there is one
        self._for_next_start: list = []  # (`store_for_next_start`)
        self.program_log: list[ProgramReady] = []  # every program this generator made ready, in order
        self.warming_up = False  # a warm-up (`decode.py --precompile`): host params measured, never borrowed
        self._loaded_buckets: set[int] = set()  # prompt buckets whose decode program came from the program cache
        self.loading_decode = False  # the decode program left to the background is loaded from disk, not compiled

    def bridges(self, gen: GenerateConfig) -> bool:
        """Whether plain AR steps (`loop.bridge_jit`, a small program) decode while the drafter's decode program
        loads or compiles in the background, so tokens come before it is ready. Only where that cannot change
        the output: a drafter with AR stretches (`auto`), greedy decoding and exact numerics (`exact_on`); when
        the bridge hands over depends on the clock, so at T > 0 the same seed would give another sample, and
        without exact numerics a near tie could go another way."""
        return (
            self.drafter.stretch_limit > 0
            and gen.sampling.greedy
            and self.mesh is None
            and self.programs is not None
            and exact_on(self.config)
        )

    def _compile(self, bucket: int, capacity: int, gen: GenerateConfig, key, background: bool = False):
        sig = (bucket, capacity, gen)
        if sig in self._compiled:
            return sig, 0.0
        t0 = time.perf_counter()
        drafter = self.drafter
        tokens = jax.ShapeDtypeStruct((1, bucket), jnp.int32)
        lengths = jax.ShapeDtypeStruct((1,), jnp.int32)
        spec = SpecConfig(self.config, gen, drafter, capacity=capacity, backend=self.backend, mesh=self.mesh)
        start_fn = functools.partial(loop.start, config=spec)
        args = (self.params, self.draft_params)
        max_new = jax.ShapeDtypeStruct((1,), jnp.int32)
        kwargs = {"tokens": tokens, "lengths": lengths, "key": key, "max_new": max_new}

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

        def lower_bridge():
            return loop.bridge_jit.lower(*args, spec, state_shape(), jnp.int32(0))

        def build(name, lower):
            t = time.perf_counter()
            if self.programs is None:
                program, how = lower().compile(), "compiled"
            else:
                # Every program is determined by the spec and the start arguments (the state the decode program
                # and the bridge take is start's output).
                program, how = self.programs.fetch(name, spec, (args, kwargs), lower)
            self.program_log.append(ProgramReady(name, how, time.perf_counter() - t))
            if name == "decode" and how == "loaded":
                self._loaded_buckets.add(bucket)
            return program

        def timed_decode():
            t = time.perf_counter()
            return build("decode", lower_decode), time.perf_counter() - t

        start = build("start", lower_start)
        stored = self.programs is not None and self.programs.holds("decode", spec, (args, kwargs))
        if background and not compiler_beside_device():
            # On a CPU, XLA's compile uses the cores the prefill runs on (the demo's first run side by side on 2
            # cores: 20 s slower in one pair of runs, 4 s faster in the next); loading from disk is one thread.
            background = stored
        # What the background is doing, for a status line ("loading" reads from disk; else XLA compiles).
        self.loading_decode = background and stored
        # A bridge that cannot be stored (`program_key` None) would be compiled again on every start: none.
        bridge = self.bridges(gen) and program_key("bridge", spec, (args, kwargs)) is not None
        held = bridge and self.programs.holds("bridge", spec, (args, kwargs))
        # A bridge not yet stored is compiled now only beside an accelerator, where it decodes while the decode
        # program compiles; on a CPU compiling it first would delay this run's first token by about what it
        # saves, so it is stored for the next start after this run's output (`store_for_next_start`).
        later = functools.partial(build, "bridge", lower_bridge)
        held = held or (bridge and background and compiler_beside_device())
        if background:
            if held:  # small: it loads in about a second, and decodes while the decode program loads
                self._bridges[sig] = build("bridge", lower_bridge)
            elif bridge:  # on a CPU, background means the decode program is stored: the next start loads it
                self._for_next_start.append(later)
            # XLA compiles (or loads) on one host thread while the device, or the other CPU cores, prefill.
            decode = concurrent.futures.Future()

            def work():
                try:
                    decode.set_result(timed_decode())
                except BaseException as e:  # raised where the program is waited for  # noqa: BLE001
                    decode.set_exception(e)

            # Not a daemon: a process that ends meanwhile waits for XLA (a daemon thread still inside XLA at
            # exit aborts the process, "terminate called ..."); Ctrl-C in decode.py exits at once regardless.
            threading.Thread(target=work, name="lsjax-compile").start()
            self._compiled[sig] = (start, decode, drafter)
            return sig, time.perf_counter() - t0
        self._compiled[sig] = (start, build("decode", lower_decode), drafter)
        if bridge and not held and self.programs.holds("decode", spec, (args, kwargs)):
            # Only where the decode program was stored (not one JAX took from its own cache): the next start
            # loads it in the background, which is when a bridge runs.
            self._for_next_start.append(later)
        return sig, time.perf_counter() - t0

    @property
    def for_next_start(self) -> bool:
        """Whether `store_for_next_start` has something to compile."""
        return bool(self._for_next_start)

    def store_for_next_start(self) -> float:
        """Compiles and stores in the program cache what a later start of the same run loads beside the decode
        program but this one did not need (the bridge, when this run compiled its decode program in the
        foreground); returns the seconds it took (0: nothing to do). `decode.py` calls it after its output,
        so the first run's first token does not wait for it."""
        t0 = time.perf_counter()
        while self._for_next_start:
            self._for_next_start.pop()()
        return time.perf_counter() - t0

    @property
    def compiling(self) -> bool:
        """Whether a decode program is compiling (or loading) in the background (`compile(background=True)`)."""
        return any(isinstance(c[1], concurrent.futures.Future) for c in self._compiled.values())

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

    def _prepare(self, prompt_ids: list[int], gen: GenerateConfig, seed: int, wait=True, background=False):
        """Validates the prompt, caps max_new_tokens to the context, pads the prompt into its bucket and
        compiles (once per prompt bucket and output width: `loop.new_tokens_bucket`; the count itself is data,
        `start`'s `max_new`). Returns (gen, P, buf [1, bucket], key, sig, compile_s), the programs in
        `self._compiled[sig]`; `wait=False` leaves a decode program compiling in the background as it is, and
        `background=True` compiles a new one there."""
        max_new = check_prompt(self.config, prompt_ids, gen.max_new_tokens)
        if max_new != gen.max_new_tokens:
            gen = dataclasses.replace(gen, max_new_tokens=max_new)
        P = len(prompt_ids)
        bucket = loop.prompt_bucket(P)
        width = dataclasses.replace(gen, max_new_tokens=loop.new_tokens_bucket(max_new, self.config.max_position))
        capacity = loop.required_capacity(bucket, width, self.drafter)
        key = jax.random.key(seed)
        sig, compile_s = self._compile(bucket, capacity, width, key, background)
        if wait:
            compile_s += self._ready(sig)
        buf = np.zeros((1, bucket), np.int32)
        buf[0, :P] = prompt_ids
        return gen, P, buf, key, sig, compile_s

    def programs_for(self, prompt_ids: list[int], gen: GenerateConfig, seed: int = 0):
        """(gen capped to the context, P, buf [1, bucket], key, (start, decode, drafter), compile_s): the
        compiled programs for this prompt, compiled now if they are not yet."""
        gen, P, buf, key, sig, compile_s = self._prepare(prompt_ids, gen, seed)
        return gen, P, buf, key, self._compiled[sig], compile_s

    def compile(self, prompt_ids: list[int], gen: GenerateConfig, seed: int = 0, background: bool = False) -> float:
        """Compiles what `run` needs for this prompt (once per prompt bucket) ahead of it; returns the seconds
        it took (0 when already compiled, and `run` then reports compile_s 0). For a caller that shows
        progress while compiling (`decode.py`). `background=True` compiles the prefill program and returns,
        leaving the decode program compiling on a host thread: the next `run` prefills meanwhile and waits
        for it (its compile seconds are then added to that run's `compile_s`). On a CPU only a program loaded
        from the program cache is left to the background: XLA's compile would share the prefill's cores."""
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
    ) -> GenerationResult:
        """Prefills and decodes `prompt_ids`; `on_tokens` gets the new tokens every `stream_every` steps (else
        the decode runs in one call), `on_ready` is called once the programs are compiled and decoding starts.
        `max_new`: stop after this many new tokens, running the programs `gen`'s length compiles (a warm-up
        that makes them, and a `HostTuned` drafter's params, ready for later runs of `gen`)."""
        gen, P, buf, key, sig, compile_s = self._prepare(prompt_ids, gen, seed, wait=False)
        if max_new is not None and max_new < gen.max_new_tokens:
            gen = dataclasses.replace(gen, max_new_tokens=max(max_new, 1))
        start = self._compiled[sig][0]
        t0 = time.perf_counter()
        state = start(self.params, self.draft_params, **start_args(buf, P, key, gen))
        jax.block_until_ready(state.num_out)
        first_token_at = time.perf_counter()  # the prefill emits the first token
        prefill_s = first_token_at - t0
        pending = self._compiled[sig][1]
        alongside = isinstance(pending, concurrent.futures.Future)
        bridge = self._bridges.get(sig) if alongside else None
        emitted = 0

        def stream(state):
            nonlocal emitted
            n = int(state.num_out[0])
            if on_tokens is not None and n > emitted:
                on_tokens(np.asarray(state.out[0, emitted:n]).tolist())
                emitted = n

        t0 = time.perf_counter()
        aside = 0.0  # seconds inside the decode that ran no decode step: waiting for the program, host tuning
        if bridge is not None:
            if on_ready is not None:
                on_ready()
            early = self._draft_params(gen, buf.shape[1], state, None)
            stream(state)
            # Stretch by stretch, until the decode program is ready, every row is done, or one token is left
            # (`ar_stretch` leaves it to the decode program: a stretch that runs no step).
            while not pending.done() and not bool(state.done[0]):
                steps = int(state.steps)
                state = bridge(self.params, early, state, jnp.int32(steps + max(stream_every, 1)))
                stream(state)
                if int(state.steps) == steps:
                    break
        bridged = int(state.steps)
        t_aside = time.perf_counter()
        compile_s += self._ready(sig)
        decode = self._compiled[sig][1]
        if on_ready is not None and bridge is None:
            on_ready()
        draft_params = self._draft_params(gen, buf.shape[1], state, decode)
        aside += time.perf_counter() - t_aside
        decode_at = time.perf_counter()

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
        decode_s = time.perf_counter() - t0 - aside

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
            decode_program_at=decode_at,
            first_token_at=first_token_at,
            decode_s=decode_s,
            target_forwards=1 + int(state.steps),
            stop_reason="eos" if tokens and tokens[-1] in stops else "max_new_tokens",
            method=self.drafter.name,
            drafter_stats=self.drafter.summary(state.draft) if isinstance(self.drafter, Summarized) else None,
        )

    def _draft_params(self, gen: GenerateConfig, bucket: int, state, decode):
        """The draft params for this prompt: a `HostTuned` drafter's are found on the host before the timed
        decode, once per (bucket, sampling), and kept. `decode` None: there is no decode program yet (the bridge
        runs first), so the params are what the drafter knows without running one, and are not kept."""
        if not isinstance(self.drafter, HostTuned):
            return self.draft_params
        key = (bucket, gen.sampling)
        if key not in self._host_params and decode is None:
            return self.drafter.host_params(self._host_run(gen, bucket, state, None))
        if key not in self._host_params:
            self._host_params[key] = self.drafter.host_params(self._host_run(gen, bucket, state, decode))
        return self._host_params[key]

    def _host_run(self, gen: GenerateConfig, bucket: int, state, decode) -> HostRun:
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
        )
