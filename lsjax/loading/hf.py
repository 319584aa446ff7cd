"""HF safetensors directories (single file or sharded with an index) -> (ModelConfig, params).

Tensors are read straight from memory-mapped safetensors files. The format is an 8-byte header
length, a JSON header `{name: {dtype, shape, data_offsets}}` and raw little-endian data; reading it
ourselves handles bf16 (which `safetensors.numpy` cannot return, numpy having no bf16) through
ml_dtypes, and copies nothing until the layer stacking does.
"""

from __future__ import annotations

import dataclasses
import json
import mmap
import struct
from pathlib import Path

import numpy as np

from lsjax.config import ARCHITECTURES, ConfigError, ModelConfig, RopeScaling
from lsjax.errors import MissingTensorError, ModelNotFoundError, UnsupportedModelError
from lsjax.loading import layout
from lsjax.loading.corrupt import reading


def _np_dtype(name: str) -> np.dtype:
    if name == "BF16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    table = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1", "U8": "u1"}
    if name not in table:
        raise UnsupportedModelError(f"safetensors dtype {name} is not supported")
    return np.dtype(table[name])


class SafetensorsFile:
    """Header and memory map of one `.safetensors` file; `get` returns zero-copy numpy views."""

    def __init__(self, path: Path):
        self.path = path
        with open(path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        (n,) = struct.unpack_from("<Q", self._map, 0)
        header = json.loads(self._map[8 : 8 + n])
        header.pop("__metadata__", None)
        self._base = 8 + n
        self.entries: dict[str, dict] = header

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.entries[name]["shape"])

    def get(self, name: str) -> np.ndarray:
        e = self.entries[name]
        begin, end = e["data_offsets"]
        dt = _np_dtype(e["dtype"])
        return np.frombuffer(
            self._map, dtype=dt, count=(end - begin) // dt.itemsize, offset=self._base + begin
        ).reshape(e["shape"])


class SafetensorsDir:
    """All tensors of a checkpoint directory, by name, across shards."""

    def __init__(self, path: Path):
        index = path / "model.safetensors.index.json"
        if index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            files = sorted(set(weight_map.values()))
        else:
            files = sorted(p.name for p in path.glob("*.safetensors"))
        if not files:
            raise ModelNotFoundError(f"no *.safetensors files in {path}")
        self.where: dict[str, SafetensorsFile] = {}
        for name in files:
            if not (path / name).is_file():
                raise ModelNotFoundError(f"shard {path / name} listed in the index is missing")
            shard = SafetensorsFile(path / name)
            for key in shard.entries:
                self.where[key] = shard

    def __contains__(self, name: str) -> bool:
        return name in self.where

    def shape(self, name: str) -> tuple[int, ...]:
        return self.where[name].shape(name)

    def get(self, name: str) -> np.ndarray:
        return self.where[name].get(name)

    def names(self) -> list[str]:
        return list(self.where)

    def file_of(self, name: str) -> Path:
        """The shard holding tensor `name` (a damaged one is named by its file)."""
        return self.where[name].path


class TorchBin:
    """A `pytorch_model.bin` through torch's weights-only loader, as the SafetensorsDir interface (floats as
    float32)."""

    def __init__(self, path: Path):
        try:
            import torch
        except ImportError:
            raise UnsupportedModelError(
                f"{path} is a PyTorch pickle and torch is not installed; install torch, or convert it to "
                "model.safetensors (safetensors.torch.save_file(torch.load(path, weights_only=True), ...))"
            ) from None
        self.path = path
        state = torch.load(path, map_location="cpu", weights_only=True)
        self.tensors = {k: v.float().numpy() if v.is_floating_point() else v.numpy() for k, v in state.items()}

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.tensors[name].shape)

    def get(self, name: str) -> np.ndarray:
        return self.tensors[name]

    def names(self) -> list[str]:
        return list(self.tensors)

    def file_of(self, name: str) -> Path:
        return self.path


def checkpoint_tensors(path: Path, what: str) -> SafetensorsDir | TorchBin:
    """The tensors of a draft checkpoint directory as published: single or sharded safetensors (through
    `model.safetensors.index.json`), else a `pytorch_model.bin` (torch's weights-only loader, when torch is
    installed). `what` names the weights in a damaged file's message."""
    path = Path(path)
    if any(path.glob("*.safetensors")) or (path / "model.safetensors.index.json").is_file():
        for file in sorted(path.glob("*.safetensors")):  # a damaged header is named by its file
            with reading(file, what):
                SafetensorsFile(file)
        return SafetensorsDir(path)
    if (path / "pytorch_model.bin").is_file():
        return TorchBin(path / "pytorch_model.bin")
    raise ModelNotFoundError(f"{path}: no model.safetensors (or shards with their index) and no pytorch_model.bin")


def config_json(path) -> dict | None:
    """A directory's config.json as a dict, or None (no file, unreadable, not a JSON object): for telling kinds
    of checkpoint directories apart before reading any weights."""
    f = Path(path) / "config.json"
    try:
        hf = json.loads(f.read_text()) if f.is_file() else None
    except (OSError, ValueError):
        return None
    return hf if isinstance(hf, dict) else None


def config_from_hf(hf: dict, name: str = "model") -> ModelConfig:
    """A ModelConfig from an HF `config.json` dict (transformers 4.x and 5.x layouts)."""
    model_type = hf.get("model_type", "?")
    if model_type not in ARCHITECTURES:
        raise ConfigError(f"model_type: unsupported architecture {model_type!r}; supported: {', '.join(ARCHITECTURES)}")
    rope_params = dict(hf.get("rope_parameters") or {})  # transformers 5.x
    rope_theta = rope_params.get("rope_theta", hf.get("rope_theta", 10000.0))
    scaling = hf.get("rope_scaling") or rope_params
    rope_type = scaling.get("rope_type", scaling.get("type", "default")) if scaling else "default"
    if rope_type not in ("default", "linear", "llama3"):
        raise ConfigError(f"rope_scaling.kind: unsupported rope type {rope_type!r} (default|linear|llama3)")
    rs = RopeScaling(
        kind=rope_type,
        factor=float(scaling.get("factor", 1.0)) if rope_type != "default" else 1.0,
        low_freq_factor=float(scaling.get("low_freq_factor", 1.0)),
        high_freq_factor=float(scaling.get("high_freq_factor", 4.0)),
        original_max_position=int(scaling.get("original_max_position_embeddings", 8192)),
    )
    eos = hf.get("eos_token_id")
    eos = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
    num_heads = hf["num_attention_heads"]
    pad = hf.get("pad_token_id")
    return ModelConfig(
        arch=model_type,
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        intermediate_size=hf["intermediate_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=num_heads,
        num_kv_heads=hf.get("num_key_value_heads") or num_heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // num_heads,
        max_position=hf.get("max_position_embeddings", 4096),
        rope_theta=float(rope_theta),
        rope_scaling=rs,
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        qkv_bias=model_type == "qwen2" or bool(hf.get("attention_bias", False)),
        qk_norm=model_type == "qwen3",
        bos_token_id=hf.get("bos_token_id"),
        eos_token_ids=eos,
        pad_token_id=pad if pad is not None else (eos[0] if eos else 0),
        name=name,
    )


def config_from_hf_dir(path: Path, dtype: str = "float32") -> ModelConfig:
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise ModelNotFoundError(f"no config.json in model directory {path}")
    hf = json.loads(cfg_file.read_text())
    model_type = hf.get("model_type", "?")
    if model_type not in ARCHITECTURES:
        raise UnsupportedModelError(
            f"{path}: architecture {model_type!r} is not supported (supported: {', '.join(ARCHITECTURES)})"
        )
    try:
        cfg = config_from_hf(hf, name=path.name)
    except ConfigError as e:
        raise UnsupportedModelError(f"{path}: {e}") from None
    return dataclasses.replace(cfg, dtype=dtype)


def params_from_safetensors(st: SafetensorsDir, cfg: ModelConfig, dtype: str = "float32") -> dict:
    for slot in layout.slots(cfg):  # every name and shape checked before the first tensor is read
        names = [slot.hf.format(i=i) for i in range(cfg.num_layers)] if slot.per_layer else [slot.hf]
        for name in names:
            if name not in st:
                raise MissingTensorError(f"tensor {name} is missing from the checkpoint")
            layout.check_shape(name, st.shape(name), slot.shape(cfg))

    def tensor(slot: layout.Slot, i: int | None) -> np.ndarray:
        # Through float32, as before: bf16/f16 -> f32 is exact, so the cast to `dtype` rounds once.
        return st.get(slot.hf if i is None else slot.hf.format(i=i)).astype(np.float32, copy=False)

    return layout.to_params(cfg, tensor, dtype)


def load_hf(path: str | Path, dtype: str = "float32") -> tuple[ModelConfig, dict]:
    """Reads an HF checkpoint directory (config.json + safetensors) into the lsjax layout."""
    path = Path(path)
    if not path.is_dir():
        raise ModelNotFoundError(f"model directory not found: {path}")
    with reading(path, "HF checkpoint (config.json or safetensors)"):
        cfg = config_from_hf_dir(path, dtype)
        return cfg, params_from_safetensors(SafetensorsDir(path), cfg, dtype)
