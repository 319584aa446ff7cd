"""A tiny random Llama-family target shared by the engine tests (no checkpoint, compiles in seconds)."""

from __future__ import annotations

import jax

from lsjax.config import ModelConfig
from lsjax.models import target


def tiny_model(vocab: int = 97, seed: int = 3, scale: float = 0.3, arch: str = "llama"):
    """(config, params): 2 layers, 6 query heads over 2 kv heads (GQA 3), head dim 8. A large init `scale`
    makes the logits peaky, so greedy output loops and retrieval drafters get hits. `arch` "qwen3": with
    Qwen3's per-head q/k norms (weights perturbed from 1, so a method that skipped them would differ)."""
    config = ModelConfig(
        vocab_size=vocab,
        hidden_size=48,
        intermediate_size=64,
        num_layers=2,
        num_heads=6,
        num_kv_heads=2,
        head_dim=8,
        max_position=2048,
        rope_theta=10000.0,
        eos_token_ids=(2,),
        pad_token_id=0,
        arch=arch,
        qk_norm=arch == "qwen3",
    )
    params = target.init_params(config, jax.random.key(seed), scale=scale)
    if config.qk_norm:
        layers = params["layers"]
        for i, name in enumerate(("q_norm", "k_norm")):
            layers[name] = layers[name] + 0.3 * jax.random.normal(jax.random.key(seed + i), layers[name].shape)
    return config, params


def fake_loading(model) -> dict:
    """`lsjax.loading`'s `load_model` and `read_header` giving `model` (a LoadedModel) whatever the path: for
    decode.py run in-process on a tiny target (`lsjax.loading.__dict__.update(fake_loading(model))`)."""
    from lsjax.loading import ModelHeader

    return {
        "load_model": lambda path=None, dtype="auto", store=None, header=None: model,
        "read_header": lambda path=None, dtype="auto": ModelHeader(model.config, model.tokenizer, model.path),
    }
