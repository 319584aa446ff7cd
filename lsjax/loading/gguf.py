"""GGUF files -> (ModelConfig, params), dequantized with the `gguf` package.

`gguf.GGUFReader` builds a Python object per array element of the metadata, which costs ~2 s on a
49K-token vocabulary; `GGUFFile` parses the (simple, versioned) header itself and maps the tensor
data lazily, so opening a file costs milliseconds and loading is dominated by dequantization.
Layout of a GGUF v2/v3 file: magic, version, tensor count, metadata count, metadata key/values,
tensor infos (name, dims innermost-first, type, offset), padding to `general.alignment`, data.
"""

from __future__ import annotations

import math
import mmap
import struct
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

from lsjax.config import ModelConfig, RopeScaling
from lsjax.errors import MissingTensorError, ModelNotFoundError, UnsupportedModelError
from lsjax.loading import layout
from lsjax.models.target import host_empty

# GGUF metadata value types -> struct format of a scalar (8 = string, 9 = array are handled apart).
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8", 12: "<f8"}
_STRING, _ARRAY = 8, 9
_DEQUANT_BLOCKS = 1 << 15  # blocks per dequantize call: 4 MB of float32 for 32-value blocks

# Architectures whose attn_q/attn_k rows llama.cpp's converter permutes for its interleaved RoPE.
_ROPE_PERMUTED = {"llama": True, "qwen2": False}


class TensorInfo:
    __slots__ = ("name", "shape", "qtype", "offset", "nbytes")

    def __init__(self, name: str, shape: tuple[int, ...], qtype: int, offset: int, nbytes: int):
        self.name, self.shape, self.qtype, self.offset, self.nbytes = name, shape, qtype, offset, nbytes

    @property
    def type_name(self) -> str:
        try:
            return GGMLQuantizationType(self.qtype).name
        except ValueError:
            return f"type#{self.qtype}"


class GGUFFile:
    """Metadata (a dict) and tensor infos of a GGUF file; tensor bytes are read from a memory map on demand.

    `TensorInfo.shape` is in numpy/torch order (outermost first), i.e. GGUF's dims reversed.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.is_file():
            raise ModelNotFoundError(f"GGUF file not found: {self.path}")
        with open(self.path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        buf = self._map
        if buf[:4] != b"GGUF":
            raise UnsupportedModelError(f"{self.path} is not a GGUF file (bad magic {bytes(buf[:4])!r})")
        (version,) = struct.unpack_from("<I", buf, 4)
        if version not in (2, 3):
            raise UnsupportedModelError(f"{self.path}: GGUF version {version} is not supported (2 or 3)")
        n_tensors, n_kv = struct.unpack_from("<QQ", buf, 8)
        self._pos = 24
        self.metadata: dict = {}
        for _ in range(n_kv):
            key = self._string()
            (vtype,) = self._unpack("<I")
            self.metadata[key] = self._value(vtype)
        infos = []
        for _ in range(n_tensors):
            name = self._string()
            (n_dims,) = self._unpack("<I")
            dims = self._unpack(f"<{n_dims}Q")
            qtype, offset = self._unpack("<IQ")
            infos.append((name, tuple(int(d) for d in reversed(dims)), qtype, offset))
        align = int(self.metadata.get("general.alignment", 32))
        data_start = -(-self._pos // align) * align
        self.tensors: dict[str, TensorInfo] = {}
        for name, shape, qtype, offset in infos:
            block, type_size = GGML_QUANT_SIZES.get(qtype, (1, 0))
            nbytes = math.prod(shape) // block * type_size
            self.tensors[name] = TensorInfo(name, shape, qtype, data_start + offset, nbytes)

    # -- header parsing -------------------------------------------------------------------------
    def _unpack(self, fmt: str) -> tuple:
        out = struct.unpack_from(fmt, self._map, self._pos)
        self._pos += struct.calcsize(fmt)
        return out

    def _string(self) -> str:
        (n,) = struct.unpack_from("<Q", self._map, self._pos)
        start = self._pos + 8
        self._pos = start + n
        return self._map[start : start + n].decode("utf-8", errors="replace")

    def _value(self, vtype: int):
        if vtype == _STRING:
            return self._string()
        if vtype == _ARRAY:
            etype, n = self._unpack("<IQ")
            if etype in _NUMPY:  # numeric arrays in one go (token types, scores)
                arr = np.frombuffer(self._map, dtype=_NUMPY[etype], count=n, offset=self._pos)
                self._pos += arr.nbytes
                return arr.tolist()
            return [self._value(etype) for _ in range(n)]
        if vtype not in _SCALAR:
            raise UnsupportedModelError(f"{self.path}: unknown GGUF metadata type {vtype}")
        return self._unpack(_SCALAR[vtype])[0]

    # -- tensors --------------------------------------------------------------------------------
    def raw(self, name: str) -> np.ndarray:
        """The stored bytes of a tensor as uint8 `[rows, bytes_per_row]` (what `gguf.quants.dequantize` takes)."""
        info = self.tensors[name]
        if info.qtype not in GGML_QUANT_SIZES or info.nbytes == 0:
            raise UnsupportedModelError(f"tensor {name}: GGML type {info.type_name} is not supported")
        rows = math.prod(info.shape[:-1])
        return np.frombuffer(self._map, dtype=np.uint8, count=info.nbytes, offset=info.offset).reshape(rows, -1)

    def tensor(self, name: str) -> np.ndarray:
        """One tensor dequantized to float32, in its numpy shape (aligned: `lsjax.models.target.host_empty`)."""
        info = self.tensors[name]
        return _dequantize(self.raw(name), info, host_empty(info.shape, np.float32))

    def close(self) -> None:
        self._map.close()


def _dequantize(raw: np.ndarray, info: TensorInfo, out: np.ndarray | None = None) -> np.ndarray:
    """Dequantizes stored bytes `[..., bytes_per_row]` to float32 `[..., cols]`, into `out` if given.

    `gguf.quants.dequantize` works through 16 rows per Python call and holds every group's result beside its
    output (twice the tensor in fresh memory). Blocks are independent, so we hand it `_DEQUANT_BLOCKS` blocks
    at a time as one long row and copy each result into place: a few MB of scratch, reused, for any tensor.
    """
    block, type_size = GGML_QUANT_SIZES[info.qtype]
    flat = raw.reshape(-1)
    n_blocks = flat.size // type_size
    if out is None:
        out = np.empty((*raw.shape[:-1], raw.shape[-1] // type_size * block), np.float32)
    dst = out.reshape(-1)
    try:
        qtype = GGMLQuantizationType(info.qtype)
        for first in range(0, n_blocks, _DEQUANT_BLOCKS):
            last = min(n_blocks, first + _DEQUANT_BLOCKS)
            part = dequantize(flat[first * type_size : last * type_size].reshape(1, -1), qtype)
            dst[first * block : last * block] = part.reshape(-1)
    except (NotImplementedError, ValueError) as e:
        raise UnsupportedModelError(
            f"tensor {info.name}: quantization type {info.type_name} cannot be dequantized by the gguf package ({e})"
        ) from None
    return out


# ---------------------------------------------------------------------------------------------
# Config


def _llama3_divisors(theta: float, head_dim: int, rs: RopeScaling) -> np.ndarray:
    """The per-frequency divisors llama.cpp stores as `rope_freqs.weight` for llama3 scaling."""
    freqs = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * np.pi / freqs
    smooth = (rs.original_max_position / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor)
    mid = 1.0 / ((1 - smooth) / rs.factor + smooth)
    return np.where(
        wavelen < rs.original_max_position / rs.high_freq_factor,
        1.0,
        np.where(wavelen > rs.original_max_position / rs.low_freq_factor, rs.factor, mid),
    )


def _rope_scaling(f: GGUFFile, arch: str, theta: float, head_dim: int) -> RopeScaling:
    m = f.metadata
    kind = m.get(f"{arch}.rope.scaling.type", "none")
    if kind == "linear":
        return RopeScaling(kind="linear", factor=_f32_value(m[f"{arch}.rope.scaling.factor"]))
    if kind not in ("none", ""):
        raise UnsupportedModelError(f"{f.path}: rope scaling type {kind!r} is not supported (linear, llama3)")
    if "rope_freqs.weight" not in f.tensors:
        return RopeScaling()
    # llama3 scaling is stored only as precomputed divisors: recover the parameters by matching the
    # published Llama 3.x settings against them.
    stored = f.tensor("rope_freqs.weight").astype(np.float64)
    for factor in (8.0, 16.0, 32.0, 4.0, 2.0):
        for orig in (8192, 4096, 16384, 32768):
            rs = RopeScaling(kind="llama3", factor=factor, original_max_position=orig)
            if np.allclose(_llama3_divisors(theta, head_dim, rs), stored, rtol=1e-4):
                return rs
    raise UnsupportedModelError(f"{f.path}: rope_freqs.weight does not match any known llama3 rope scaling")


def _f32_value(x) -> float:
    """GGUF stores these as float32: 1e-5 reads back as 9.99999975e-06. The shortest decimal that
    round-trips through float32 is what the model's author wrote (and what HF's config.json holds)."""
    return float(np.format_float_positional(np.float32(x), unique=True, trim="-"))


def config_from_gguf(f: GGUFFile, dtype: str = "float32") -> ModelConfig:
    m = f.metadata
    arch = m.get("general.architecture", "?")
    if arch not in _ROPE_PERMUTED:
        raise UnsupportedModelError(
            f"{f.path}: GGUF architecture {arch!r} is not supported (supported: {', '.join(_ROPE_PERMUTED)})"
        )

    def get(key, default=None):
        value = m.get(f"{arch}.{key}", default)
        if value is None:
            raise UnsupportedModelError(f"{f.path}: GGUF metadata lacks {arch}.{key}")
        return value

    num_heads = int(get("attention.head_count"))
    hidden = int(get("embedding_length"))
    head_dim = int(
        m.get(f"{arch}.attention.key_length") or m.get(f"{arch}.rope.dimension_count") or hidden // num_heads
    )
    theta = _f32_value(get("rope.freq_base", 10000.0))
    tokens = m.get("tokenizer.ggml.tokens")
    if "token_embd.weight" not in f.tensors:
        raise MissingTensorError(f"{f.path}: tensor token_embd.weight is missing")
    vocab = len(tokens) if tokens else f.tensors["token_embd.weight"].shape[0]
    eos = [m[k] for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id") if k in m]
    eos = tuple(dict.fromkeys(int(t) for t in eos)) or (0,)
    pad = m.get("tokenizer.ggml.padding_token_id", eos[0])
    bos = m.get("tokenizer.ggml.bos_token_id")
    return ModelConfig(
        arch=arch,
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=int(get("feed_forward_length")),
        num_layers=int(get("block_count")),
        num_heads=num_heads,
        num_kv_heads=int(get("attention.head_count_kv", num_heads)),
        head_dim=head_dim,
        max_position=int(get("context_length", 4096)),
        rope_theta=theta,
        rope_scaling=_rope_scaling(f, arch, theta, head_dim),
        rms_norm_eps=_f32_value(get("attention.layer_norm_rms_epsilon", 1e-6)),
        tie_embeddings="output.weight" not in f.tensors,
        qkv_bias=arch == "qwen2",
        bos_token_id=None if bos is None else int(bos),
        eos_token_ids=eos,
        pad_token_id=int(pad),
        dtype=dtype,
        name=str(m.get("general.name") or f.path.stem),
    )


# ---------------------------------------------------------------------------------------------
# Params


def _unpermute_rope_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """Undoes llama.cpp's Q/K row order on one layer's `[heads*H, ...]`.

    llama.cpp's converter stores each head's rows as (H/2, 2) -- the two halves of HF's rotate_half
    interleaved -- so its RoPE can rotate adjacent pairs; HF order is (2, H/2).
    """
    rows, rest = w.shape[0], w.shape[1:]
    return w.reshape(heads, rows // heads // 2, 2, *rest).swapaxes(1, 2).reshape(rows, *rest)


def params_from_gguf(f: GGUFFile, cfg: ModelConfig, dtype: str = "float32") -> dict:
    slots = layout.slots(cfg)
    for slot in slots:  # every name and shape checked before the first tensor is dequantized
        names = [slot.gguf.format(i=i) for i in range(cfg.num_layers)] if slot.per_layer else [slot.gguf]
        for name in names:
            if name not in f.tensors:
                raise MissingTensorError(f"{f.path}: tensor {name} is missing")
            layout.check_shape(name, f.tensors[name].shape, slot.shape(cfg))
            f.raw(name)  # (an unsupported quantization type is named here)
    heads = {"wq": cfg.num_heads, "wk": cfg.num_kv_heads} if _ROPE_PERMUTED[cfg.arch] else {}

    def tensor(slot: layout.Slot, i: int | None) -> np.ndarray:
        if i is None:
            return f.tensor(slot.gguf)
        name = slot.gguf.format(i=i)
        w = _dequantize(f.raw(name), f.tensors[name]).reshape(f.tensors[name].shape)
        return _unpermute_rope_rows(w, heads[slot.key]) if slot.key in heads else w

    return layout.to_params(cfg, tensor, dtype)


def load_gguf(path: str | Path, dtype: str = "float32") -> tuple[ModelConfig, dict]:
    """Reads a GGUF file: its config from the metadata and its tensors dequantized into the lsjax layout."""
    f = GGUFFile(path)
    cfg = config_from_gguf(f, dtype)
    return cfg, params_from_gguf(f, cfg, dtype)
