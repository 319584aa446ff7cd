"""The engine: one exact verify engine every method drafts for (draft -> verify -> accept -> commit).

    types     DecodeState, DraftContext, Verdict, the Drafter contract and its optional host protocols
    verify    a tree -> its verdict: one target forward over the nodes, the walk, the path's K/V
    step      one step (`spec_step`: a fixed tree, or a variant chosen per step with `lax.switch`)
    loop      prefill, the first token, the on-device loop (`decode`, `start`, `run`), capacities
    host      the streaming driver (`Generator`): buckets, ahead-of-time compile, timings

Layers import downwards only (types < verify < step < loop < host); nothing here imports a method.
"""

from lsjax.engine.host import Generator, PromptError, check_prompt
from lsjax.engine.loop import (
    PREFILL_CHUNK,
    PROMPT_BUCKETS,
    CapacityError,
    begin,
    cache_capacity,
    check_capacity,
    check_inputs,
    decode,
    decode_jit,
    decode_loop,
    init_state,
    prefill,
    prefill_jit,
    prompt_bucket,
    required_capacity,
    run,
    start,
)
from lsjax.engine.step import (
    PathResult,
    chain_verdict,
    commit_phase,
    context,
    draft_phase,
    emit,
    fixed_step,
    spec_step,
    stop_ids,
    switched_step,
)
from lsjax.engine.types import (
    ARDrafter,
    DecodeState,
    DraftContext,
    Drafter,
    GenerationResult,
    HostRun,
    HostTuned,
    SpecConfig,
    Summarized,
    SwitchExtras,
    SwitchProfiled,
    Verdict,
    step_keys,
)
from lsjax.engine.verify import penalty_windows, verify_phase

__all__ = [
    "ARDrafter",
    "CapacityError",
    "DecodeState",
    "DraftContext",
    "Drafter",
    "GenerationResult",
    "Generator",
    "HostRun",
    "HostTuned",
    "PREFILL_CHUNK",
    "SpecConfig",
    "PROMPT_BUCKETS",
    "PathResult",
    "PromptError",
    "Summarized",
    "SwitchExtras",
    "SwitchProfiled",
    "Verdict",
    "begin",
    "cache_capacity",
    "chain_verdict",
    "check_capacity",
    "check_inputs",
    "check_prompt",
    "commit_phase",
    "context",
    "decode",
    "decode_jit",
    "decode_loop",
    "draft_phase",
    "emit",
    "fixed_step",
    "init_state",
    "penalty_windows",
    "prefill",
    "prefill_jit",
    "prompt_bucket",
    "required_capacity",
    "run",
    "spec_step",
    "start",
    "step_keys",
    "stop_ids",
    "switched_step",
    "verify_phase",
]
