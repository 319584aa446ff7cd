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

from lsjax.config import ARCHITECTURES, ConfigError, ModelConfig
from lsjax.errors import MissingTensorError, ModelNotFoundError, UnsupportedModelError
from lsjax.loading import layout


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
        cfg = ModelConfig.from_hf(hf, name=path.name)
    except ConfigError as e:
        raise UnsupportedModelError(f"{path}: {e}") from None
    return dataclasses.replace(cfg, dtype=dtype)


def params_from_safetensors(st: SafetensorsDir, cfg: ModelConfig, dtype: str = "float32") -> dict:
    torch_layout = {}
    for slot in layout.slots(cfg):
        expected = slot.shape(cfg)
        names = [slot.hf.format(i=i) for i in range(cfg.num_layers)] if slot.per_layer else [slot.hf]
        for name in names:
            if name not in st:
                raise MissingTensorError(f"tensor {name} is missing from the checkpoint")
            layout.check_shape(name, st.shape(name), expected)
        if not slot.per_layer:
            torch_layout[slot.key] = st.get(names[0]).astype(np.float32, copy=False)
            continue
        out = np.empty((cfg.num_layers, *expected), np.float32)
        for i, name in enumerate(names):
            out[i] = st.get(name)  # casts bf16/f16 -> f32 while copying
        torch_layout[slot.key] = out
    return layout.to_params(cfg, torch_layout, dtype)


def load_hf(path: str | Path, dtype: str = "float32") -> tuple[ModelConfig, dict]:
    """Reads an HF checkpoint directory (config.json + safetensors) into the lsjax layout."""
    path = Path(path)
    if not path.is_dir():
        raise ModelNotFoundError(f"model directory not found: {path}")
    cfg = config_from_hf_dir(path, dtype)
    return cfg, params_from_safetensors(SafetensorsDir(path), cfg, dtype)
