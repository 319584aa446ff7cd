"""lsjax: LongSpec long-context lossless speculative decoding in JAX.

The public API — pure functions under `jax.jit`, frozen configs static:

    generate, SpecConfig, GenerateOutput          one call: prompts in, tokens out (api.py)
    pad_prompts                                   id lists -> ids padded to decode.py's widths, lengths
    prefill, spec_step, draft_phase, verify_phase, commit_phase, decode
    ModelConfig, GenerateConfig, SamplingConfig, DraftConfig, TreeConfig
    ARDrafter, PLDDrafter, LongSpecDrafter,       proposers on one verify engine
    HybridDrafter (LongSpec tree + PLD chain)
    AutoDrafter, auto_params                      per step, the candidate with the most expected tokens/s
    load_model                                    GGUF / HF safetensors -> config, params, tokenizer
    Transformer, load_variables                   the target as a Flax module; a checkpoint as its variables
    read_header                                   config and tokenizer alone, before the weights load
    invariant_rows_for                            the rows batch-invariant numerics need for a drafter
"""

from lsjax.api import GenerateOutput, SpecConfig, generate, pad_prompts
from lsjax.config import DraftConfig, GenerateConfig, ModelConfig, SamplingConfig
from lsjax.engine import DecodeState, commit_phase, decode, draft_phase, prefill, spec_step, verify_phase
from lsjax.engine.types import ARDrafter, Drafter, invariant_rows_for
from lsjax.loading import load_model, load_variables, read_header
from lsjax.methods.auto.drafter import AutoDrafter, auto_params
from lsjax.methods.hybrid.drafter import HybridDrafter
from lsjax.methods.longspec.drafter import LongSpecDrafter
from lsjax.methods.pld.drafter import PLDDrafter
from lsjax.models.target import Transformer
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
    "Transformer",
    "TreeConfig",
    "auto_params",
    "commit_phase",
    "decode",
    "draft_phase",
    "generate",
    "invariant_rows_for",
    "load_model",
    "load_variables",
    "pad_prompts",
    "prefill",
    "read_header",
    "spec_step",
    "verify_phase",
]
