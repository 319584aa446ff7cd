"""Trained weights on disk: one directory per artifact, `model.safetensors` (the tensors by name) beside
`config.json` (the metadata dict, plus `"format"` and `"kind"` naming which artifact it is).

    kind          what                       stored as                       old layout (still read)
    longspec      a LongSpec draft           bfloat16                        params.npz + draft.json
    block         a DeLS block draft         bfloat16                        params.npz + block.json
    local_head    a DeLS local head          float16, unigram_logprior fp32  local_head.npz + local_head.json
    streams       a stream checkpoint        bfloat16                        params.npz + streams.json
    tokenswift    TokenSwift heads           bfloat16                        params.npz + heads.json

Floating tensors are stored in the kind's storage dtype (a per-tensor override keeps e.g. a log-prior in
float32) and read back as float32 numpy (decoding on a CPU computes in fp32); integer tensors (`vocab_ids`)
are int32 on disk and come back as they are. Directories written before the change (the old layout, fp32 or
fp16 `.npz` + the kind's own json) still load: the fallback lives here, once. A missing file is a
`ModelNotFoundError`, a truncated or corrupt one a one-line `CorruptFileError` naming the file and the reason.

This module imports numpy, ml_dtypes and safetensors only (no jax): the loaders of every kind use it.
`python -m lsjax.artifacts --convert DIR...` rewrites old-layout directories in place.
"""

from __future__ import annotations

import json
import os
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import ml_dtypes
import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

from lsjax.errors import CorruptFileError, ModelNotFoundError

WEIGHTS, CONFIG = "model.safetensors", "config.json"
FORMAT = "lsjax-weights/1"
BF16 = np.dtype(ml_dtypes.bfloat16)
_FLOATS = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64), BF16)


@dataclass(frozen=True)
class Kind:
    what: str  # for messages: "no {what} at DIR"
    old_weights: str
    old_config: str
    dtype: str = "bfloat16"  # storage dtype of floating tensors
    overrides: dict = field(default_factory=dict)  # tensor name -> storage dtype


KINDS = {
    "longspec": Kind("LongSpec draft", "params.npz", "draft.json"),
    "block": Kind("block draft", "params.npz", "block.json"),
    "local_head": Kind("local head", "local_head.npz", "local_head.json", "float16", {"unigram_logprior": "float32"}),
    "streams": Kind("stream checkpoint", "params.npz", "streams.json"),
    "tokenswift": Kind("TokenSwift heads", "params.npz", "heads.json"),
}

# What np.load / NpzFile raise on a truncated or damaged archive (zip directory, deflate stream, npy header).
_NPZ_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, ValueError, OSError, KeyError)
_ST_ERRORS = (SafetensorError, OSError, ValueError, KeyError, TypeError)


def _kind(kind: str) -> Kind:
    if kind not in KINDS:
        raise ValueError(f"unknown artifact kind {kind!r}; one of {'|'.join(KINDS)}")
    return KINDS[kind]


def _reason(e: Exception) -> str:
    text = str(e).splitlines()[0] if str(e).strip() else type(e).__name__
    if "allow_pickle" in text:  # numpy's advice would load arbitrary code; the file is simply not plain arrays
        return "it holds Python objects, not plain arrays"
    return text


def _storage(dtype) -> np.dtype:
    return BF16 if str(dtype) in ("bfloat16", "bf16") else np.dtype(dtype)


def files(path, kind: str) -> tuple[Path, Path]:
    """(weights file, config file) of the layout present in `path`: the new one unless only the old one is
    complete (both names of the new layout when neither is)."""
    path, k = Path(path), _kind(kind)
    new, old = (path / WEIGHTS, path / CONFIG), (path / k.old_weights, path / k.old_config)
    if not all(p.is_file() for p in new) and all(p.is_file() for p in old):
        return old
    return new


def _read_json(file: Path, what: str) -> dict:
    try:
        meta = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, OSError) as e:
        raise CorruptFileError(f"{file}: not a {what} description ({_reason(e)})") from None
    if not isinstance(meta, dict):
        raise CorruptFileError(f"{file}: not a {what} description (a JSON {type(meta).__name__}, not an object)")
    return meta


def stored_kind(path) -> str | None:
    """Which artifact directory `path` holds: its config.json's kind (new layout), the kind whose old file
    pair is there (old layout), or None."""
    path = Path(path)
    if (path / WEIGHTS).is_file() and (path / CONFIG).is_file():
        kind = _read_json(path / CONFIG, "weights").get("kind")
        return kind if kind in KINDS else None
    for name, k in KINDS.items():
        if (path / k.old_weights).is_file() and (path / k.old_config).is_file():
            return name
    return None


def has_weights(path, kind: str) -> bool:
    """Whether `path` holds a `kind` artifact, in either layout (a corrupt config.json counts: loading it
    names the problem)."""
    try:
        return stored_kind(path) == kind
    except CorruptFileError:
        return all((Path(path) / f).is_file() for f in (WEIGHTS, CONFIG))


def read_config(path, kind: str) -> dict:
    """The metadata dict of a `kind` directory (without "format" and "kind"), its weights left unread."""
    path, k = Path(path), _kind(kind)
    weights, config = files(path, kind)
    if not (weights.is_file() and config.is_file()):
        raise ModelNotFoundError(f"no {k.what} at {path} (expected {WEIGHTS} and {CONFIG})")
    meta = _read_json(config, k.what)
    if config.name == CONFIG:
        if meta.get("format") != FORMAT or meta.get("kind") not in KINDS:
            raise ModelNotFoundError(f"no {k.what} at {path}: its {CONFIG} is not an lsjax weights description")
        if meta["kind"] != kind:
            raise ModelNotFoundError(f"no {k.what} at {path}: it holds a {KINDS[meta['kind']].what}")
        meta = {key: v for key, v in meta.items() if key not in ("format", "kind")}
    return meta


def parse_config(path, kind: str, parse):
    """`parse()` (reads fields of a loaded config, e.g. `from_dict`), a missing or malformed field (KeyError,
    TypeError, ValueError: a ConfigError is one) a CorruptFileError naming the config file."""
    try:
        return parse()
    except (KeyError, TypeError, ValueError) as e:
        reason = f"missing {e}" if isinstance(e, KeyError) else _reason(e)
        raise CorruptFileError(f"{files(path, kind)[1]}: not a {_kind(kind).what} description ({reason})") from None


def _as_loaded(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, np.float32) if a.dtype in _FLOATS else np.asarray(a)


def load_weights(path, kind: str) -> tuple[dict[str, np.ndarray], dict]:
    """(tensors {name: numpy array}: floating ones as float32, integers as stored; the metadata dict) of a
    `kind` directory, new layout or old."""
    path, k = Path(path), _kind(kind)
    meta = read_config(path, kind)
    weights, _ = files(path, kind)
    try:
        if weights.name == WEIGHTS:
            arrays = {name: _as_loaded(a) for name, a in load_file(weights).items()}
        else:
            with np.load(weights) as z:
                arrays = {name: _as_loaded(z[name]) for name in z.files}
    except (*_ST_ERRORS, *_NPZ_ERRORS) as e:
        raise CorruptFileError(f"{weights}: truncated or corrupt {k.what} ({_reason(e)})") from None
    return arrays, meta


def _replace(file: Path, write) -> None:
    """`write(tmp)` then rename over `file`, readable as any new file (safetensors writes its files 0600)."""
    tmp = file.with_name(f".{file.name}.tmp")
    try:
        write(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, file)
    finally:
        tmp.unlink(missing_ok=True)


def save_weights(path, arrays: dict, config: dict, dtype=None, *, kind: str, overrides: dict | None = None) -> int:
    """Writes a `kind` directory: `arrays` in model.safetensors (floating tensors in `dtype`, default the
    kind's storage dtype: bfloat16, float16 for a local head; `overrides` {name: dtype} on top of the kind's
    own; integer tensors as int32) and `config` (+ format and kind) in config.json. An old-layout pair of the
    same kind in `path` is removed (this write supersedes it). Returns the size of model.safetensors in bytes."""
    path, k = Path(path), _kind(kind)
    path.mkdir(parents=True, exist_ok=True)
    per_tensor = {**k.overrides, **(overrides or {})}
    stored = {}
    for name, value in arrays.items():
        a = np.asarray(value)
        if a.dtype in _FLOATS:
            a = a.astype(_storage(per_tensor.get(name, dtype or k.dtype)))
        elif np.issubdtype(a.dtype, np.integer):
            a = a.astype(np.int32)
        stored[name] = np.ascontiguousarray(a)
    meta = {"format": FORMAT, "kind": kind, **{key: v for key, v in config.items() if key not in ("format", "kind")}}
    _replace(path / WEIGHTS, lambda f: save_file(stored, f, metadata={"format": FORMAT, "kind": kind}))
    _replace(path / CONFIG, lambda f: f.write_text(json.dumps(meta, indent=2) + "\n"))
    for old in (k.old_weights, k.old_config):
        (path / old).unlink(missing_ok=True)
    return (path / WEIGHTS).stat().st_size


def convert(path, kind: str | None = None) -> tuple[str, int, int]:
    """Rewrites an old-layout directory in the new one, in the kind's storage dtype; returns (kind, old bytes,
    new bytes)."""
    path = Path(path)
    kind = kind or stored_kind(path)
    if kind is None:
        raise ModelNotFoundError(f"no lsjax weights at {path}")
    old_weights, _ = files(path, kind)
    before = old_weights.stat().st_size
    arrays, meta = load_weights(path, kind)
    return kind, before, save_weights(path, arrays, meta, kind=kind)


def main(argv=None) -> None:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m lsjax.artifacts", description=__doc__.split("\n\n")[0])
    ap.add_argument("--convert", nargs="+", metavar="DIR", required=True, help="old-layout directories to rewrite")
    ap.add_argument("--kind", choices=list(KINDS), help="default: found from the directory's files")
    args = ap.parse_args(argv)
    for d in args.convert:
        kind, before, after = convert(d, args.kind)
        print(f"{d}: {kind}, {before / 1e6:.2f} MB -> {after / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
