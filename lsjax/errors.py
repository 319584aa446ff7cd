"""Named exceptions raised by lsjax, so callers (and decode.py) can report one clear line."""

from __future__ import annotations


class LsjaxError(Exception):
    """Base class of every error lsjax raises on purpose."""


class ModelNotFoundError(LsjaxError, FileNotFoundError):
    """A model file or directory does not exist (or lacks the files a model needs)."""


class UnsupportedModelError(LsjaxError):
    """The checkpoint uses an architecture, tokenizer or quantization type lsjax cannot load."""


class ShapeMismatchError(LsjaxError):
    """A tensor's shape disagrees with the shape the model config implies."""


class MissingTensorError(LsjaxError, KeyError):
    """A tensor the model config requires is absent from the checkpoint."""

    def __str__(self) -> str:  # KeyError would repr() the message, quotes and all
        return str(self.args[0]) if self.args else ""


class CorruptFileError(LsjaxError):
    """A file is truncated or not in the format its name promises (GGUF, safetensors, a draft's weights or config)."""


class InputError(LsjaxError, ValueError):
    """An argument of an API call has the wrong type, shape or value; the message names the argument, its value
    and what is allowed."""


class WeightsPending(LsjaxError):
    """A model's params were used before they were loaded (`lsjax.loading.ModelHeader.pending`)."""


class MethodNote(UserWarning):
    """Something a method's builder tells the user about what it will run (e.g. `auto` without a draft for
    this model runs AR and prompt lookup only). decode.py prints each as one `[lsjax]` line; a library caller
    sees a warning it can filter."""
