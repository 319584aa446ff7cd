"""Configs: every YAML preset parses, validation names the field, overrides apply, unknown keys fail."""

from __future__ import annotations

from pathlib import Path

import pytest

from lsjax.config import ConfigError, GenerateConfig, ModelConfig, SamplingConfig, from_dict, load_yaml, to_dict

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


@pytest.mark.parametrize("path", sorted((CONFIGS / "models").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_model_preset_parses(path):
    cfg = load_yaml(ModelConfig, path)
    assert cfg.num_heads % cfg.num_kv_heads == 0
    assert from_dict(ModelConfig, to_dict(cfg)) == cfg  # round trip
    hash(cfg)  # static under jit


def test_smollm2_preset_matches_the_gguf():
    from lsjax.loading import load_model

    loaded = load_model().config
    preset = load_yaml(ModelConfig, CONFIGS / "models" / "smollm2-135m-instruct.yaml")
    fields = (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_layers",
        "num_heads",
        "num_kv_heads",
        "head_dim",
        "max_position",
        "rope_theta",
        "rms_norm_eps",
        "tie_embeddings",
        "bos_token_id",
    )
    assert {f: getattr(preset, f) for f in fields} == {f: getattr(loaded, f) for f in fields}
    assert preset.num_params() == 134_515_008


@pytest.mark.parametrize(
    "kwargs,field",
    [
        (dict(num_heads=9, num_kv_heads=2), "num_kv_heads"),
        (dict(head_dim=63), "head_dim"),
        (dict(arch="gpt2"), "arch"),
        (dict(num_layers=0), "num_layers"),
        (dict(dtype="float64"), "dtype"),
        (dict(eos_token_ids=(60000,)), "eos_token_ids"),
    ],
)
def test_model_config_errors_name_the_field(kwargs, field):
    with pytest.raises(ConfigError, match=f"^{field}"):
        ModelConfig(**kwargs)


@pytest.mark.parametrize(
    "kwargs,field",
    [
        (dict(temperature=-1.0), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(min_p=1.0), "min_p"),
        (dict(top_k=-3), "top_k"),
    ],
)
def test_sampling_config_errors_name_the_field(kwargs, field):
    with pytest.raises(ConfigError, match=f"^{field}"):
        SamplingConfig(**kwargs)


def test_generate_config_rejects_zero_tokens():
    with pytest.raises(ConfigError, match="^max_new_tokens"):
        GenerateConfig(max_new_tokens=0)


def test_unknown_keys_and_overrides(tmp_path):
    path = CONFIGS / "models" / "smollm2-135m-instruct.yaml"
    cfg = load_yaml(ModelConfig, path, ["rope_theta=5e5", "rope_scaling.kind=linear", "rope_scaling.factor=2"])
    assert cfg.rope_theta == 5e5 and cfg.rope_scaling.kind == "linear" and cfg.rope_scaling.factor == 2.0
    with pytest.raises(ConfigError, match="hiden_size: unknown key"):
        load_yaml(ModelConfig, path, ["hiden_size=3"])
    with pytest.raises(ConfigError, match="rope_scaling.kindd: unknown key"):
        load_yaml(ModelConfig, path, ["rope_scaling.kindd=x"])
    with pytest.raises(FileNotFoundError):
        load_yaml(ModelConfig, tmp_path / "nope.yaml")
