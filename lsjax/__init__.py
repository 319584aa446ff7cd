"""lsjax: LongSpec long-context lossless speculative decoding in JAX.

The public API — pure functions under `jax.jit`, frozen configs static:

    generate, SpecConfig, GenerateOutput          one call: prompts in, tokens out (api.py)
    prefill, spec_step, draft_phase, verify_phase, commit_phase, decode
    ModelConfig, GenerateConfig, SamplingConfig, DraftConfig, TreeConfig
    ARDrafter, PLDDrafter, LongSpecDrafter,       proposers on one verify engine
    HybridDrafter (LongSpec tree + PLD chain)
    AutoDrafter, auto_params                      per step, the candidate with the most expected tokens/s
    load_model                                    GGUF / HF safetensors -> config, params, tokenizer
"""

from lsjax.api import GenerateOutput, SpecConfig, generate
from lsjax.config import DraftConfig, GenerateConfig, ModelConfig, SamplingConfig
from lsjax.decoding import DecodeState, prefill
from lsjax.drafters.auto import AutoDrafter, auto_params
from lsjax.drafters.base import ARDrafter, Drafter
from lsjax.drafters.hybrid import HybridDrafter
from lsjax.drafters.longspec import LongSpecDrafter
from lsjax.drafters.pld import PLDDrafter
from lsjax.loading import load_model
from lsjax.speculative import commit_phase, decode, draft_phase, spec_step, verify_phase
from lsjax.tree import TreeConfig

__all__ = [
    "ARDrafter",
    "AutoDrafter",
    "DecodeState",
    "DraftConfig",
    "Drafter",
    "GenerateConfig",
    "GenerateOutput",
    "HybridDrafter",
    "LongSpecDrafter",
    "ModelConfig",
    "PLDDrafter",
    "SamplingConfig",
    "SpecConfig",
    "TreeConfig",
    "auto_params",
    "commit_phase",
    "decode",
    "draft_phase",
    "generate",
    "load_model",
    "prefill",
    "spec_step",
    "verify_phase",
]
