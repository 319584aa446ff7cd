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
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from lsjax import mesh as mesh_lib
from lsjax.config import GenerateConfig, ModelConfig
from lsjax.engine import loop
from lsjax.engine.programs import ProgramCache
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

    def _compile(self, bucket: int, capacity: int, gen: GenerateConfig, key):
        sig = (bucket, capacity, gen)
        if sig in self._compiled:
            return self._compiled[sig], 0.0
        t0 = time.perf_counter()
        drafter = self.drafter
        tokens = jax.ShapeDtypeStruct((1, bucket), jnp.int32)
        lengths = jax.ShapeDtypeStruct((1,), jnp.int32)
        spec = SpecConfig(self.config, gen, drafter, capacity=capacity, backend=self.backend, mesh=self.mesh)
        start_fn = functools.partial(loop.start, config=spec)
        args = (self.params, self.draft_params)
        kwargs = {"tokens": tokens, "lengths": lengths, "key": key}

        def lower_start():
            return jax.jit(start_fn).lower(*args, **kwargs)

        def lower_decode():
            state_shape = jax.eval_shape(start_fn, *args, **kwargs)
            return loop.decode_jit.lower(*args, spec, state_shape, jnp.int32(0))

        if self.programs is None:
            start, decode = lower_start().compile(), lower_decode().compile()
        else:
            # Both programs are determined by the spec and the start arguments (decode's state is start's output).
            start = self.programs.get("start", spec, (args, kwargs), lower_start)
            decode = self.programs.get("decode", spec, (args, kwargs), lower_decode)
        self._compiled[sig] = (start, decode, drafter)
        return self._compiled[sig], time.perf_counter() - t0

    def _prepare(self, prompt_ids: list[int], gen: GenerateConfig, seed: int):
        """Validates the prompt, caps max_new_tokens to the context, pads the prompt into its bucket and
        compiles (once per bucket). Returns (gen, P, buf [1, bucket], key, compiled, compile_s)."""
        max_new = check_prompt(self.config, prompt_ids, gen.max_new_tokens)
        if max_new != gen.max_new_tokens:
            gen = dataclasses.replace(gen, max_new_tokens=max_new)
        P = len(prompt_ids)
        bucket = loop.prompt_bucket(P)
        capacity = loop.required_capacity(bucket, gen, self.drafter)
        key = jax.random.key(seed)
        compiled, compile_s = self._compile(bucket, capacity, gen, key)
        buf = np.zeros((1, bucket), np.int32)
        buf[0, :P] = prompt_ids
        return gen, P, buf, key, compiled, compile_s

    def compile(self, prompt_ids: list[int], gen: GenerateConfig, seed: int = 0) -> float:
        """Compiles what `run` needs for this prompt (once per prompt bucket) ahead of it; returns the seconds
        it took (0 when already compiled, and `run` then reports compile_s 0). For a caller that shows
        progress while compiling (`decode.py`)."""
        return self._prepare(prompt_ids, gen, seed)[-1]

    def run(
        self,
        prompt_ids: list[int],
        gen: GenerateConfig,
        seed: int = 0,
        on_tokens: Callable[[list[int]], None] | None = None,
        stream_every: int = 8,
    ) -> GenerationResult:
        gen, P, buf, key, (start, decode, _), compile_s = self._prepare(prompt_ids, gen, seed)
        t0 = time.perf_counter()
        state = start(
            self.params, self.draft_params, tokens=jnp.asarray(buf), lengths=jnp.array([P], jnp.int32), key=key
        )
        jax.block_until_ready(state.num_out)
        prefill_s = time.perf_counter() - t0
        draft_params = self._draft_params(gen, buf.shape[1], state, decode)

        t0 = time.perf_counter()
        emitted = 0
        if on_tokens is None:
            state = decode(self.params, draft_params, state, jnp.int32(gen.max_new_tokens))
        else:
            limit = 0
            while True:
                n = int(state.num_out[0])
                if n > emitted:
                    on_tokens(np.asarray(state.out[0, emitted:n]).tolist())
                    emitted = n
                if bool(state.done[0]):
                    break
                limit += stream_every
                state = decode(self.params, draft_params, state, jnp.int32(limit))
        jax.block_until_ready(state.num_out)
        decode_s = time.perf_counter() - t0

        n = int(state.num_out[0])
        tokens = np.asarray(state.out[0, :n]).tolist()
        stops = set(stop_ids(self.config, gen))
        return GenerationResult(
            tokens=tokens,
            prompt_tokens=P,
            compile_s=compile_s,
            prefill_s=prefill_s,
            decode_s=decode_s,
            target_forwards=1 + int(state.steps),
            stop_reason="eos" if tokens and tokens[-1] in stops else "max_new_tokens",
            method=self.drafter.name,
            drafter_stats=self.drafter.summary(state.draft) if isinstance(self.drafter, Summarized) else None,
        )

    def _draft_params(self, gen: GenerateConfig, bucket: int, state, decode):
        """The draft params for this prompt: a `HostTuned` drafter's are found on the host before the timed
        decode, once per (bucket, sampling), and kept."""
        if not isinstance(self.drafter, HostTuned):
            return self.draft_params
        key = (bucket, gen.sampling)
        if key not in self._host_params:
            run = HostRun(
                self.config.name,
                self.backend,
                self.params,
                self.draft_params,
                gen,
                bucket,
                state,
                decode,
                self.config.signature(),
            )
            self._host_params[key] = self.drafter.host_params(run)
        return self._host_params[key]
