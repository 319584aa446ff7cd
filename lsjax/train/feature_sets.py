"""Reading the shared target-feature cache (`lsjax.train.feature_cache` builds it; its docstring has the
layout): random access to one set (`FeatureCache`), several sets of one sequence length read as one
(`FeatureSets`), one field as a lazily read per-sequence array (`FieldView`).

The trainers read through this module; `feature_cache` re-exports its names.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from pathlib import Path

import numpy as np

from lsjax.errors import LsjaxError

VERSION = 1
FIELDS = ("tokens", "loss_mask", "k", "v", "hidden", "mid_hidden", "topk_ids", "topk_logprobs", "aux_hidden")
# Every set's shard fields; `aux_hidden` is stored only by a set built with aux layers (its manifest's
# "aux_layers"), so sets built before it existed stay readable as they are.
SHARD_FIELDS = FIELDS[2:-1]


class FeatureCacheError(LsjaxError, ValueError):
    """A missing, incomplete or mismatched feature cache."""


def cache_root() -> Path:
    return Path(os.environ.get("LSJAX_FEATURES") or Path.home() / ".cache" / "lsjax" / "features").expanduser()


def _shard_name(i: int) -> str:
    return f"shard-{i:05d}"


class FeatureCache:
    """Random access to a built (or partly built) set; memory-maps shards on demand."""

    def __init__(self, directory: Path, manifest: dict, complete_shards: int, first: int | None = None):
        """`first`: only the set's first sequences (a uniform sample: sets are stored shuffled)."""
        self.directory = directory
        self.manifest = manifest
        self.seq_len = manifest["seq_len"]
        self.mid_layer = manifest["mid_layer"]
        self.topk = manifest["topk"]
        self.aux_layers = tuple(manifest.get("aux_layers", ()))
        self.shard_size = manifest["shard_size"]
        self.total_sequences = manifest["sequences"]
        built = min(self.total_sequences, complete_shards * self.shard_size)
        self.complete = built == self.total_sequences
        if first is not None and not 1 <= first <= self.total_sequences:
            raise FeatureCacheError(
                f"feature cache: {directory.name}:{first}: N must be in [1, {self.total_sequences}] (the set's size)"
            )
        if first is not None and first > built:
            raise FeatureCacheError(
                f"feature cache: {directory.name}:{first} asks for {first} sequences, {built} are built; "
                "resume its build"
            )
        self.num_sequences = built if first is None else first
        self.tokens = np.load(directory / "tokens.npy", mmap_mode="r")[: self.num_sequences]
        self.loss_mask = np.load(directory / "loss_mask.npy", mmap_mode="r")[: self.num_sequences]
        self._open: OrderedDict[tuple[int, str], np.ndarray] = OrderedDict()

    @classmethod
    def open(cls, directory: str | Path, *, allow_partial: bool = False, first: int | None = None) -> FeatureCache:
        directory = Path(directory).expanduser()
        mfile = directory / "manifest.json"
        if not mfile.exists():
            raise FeatureCacheError(
                f"feature cache: no manifest in {directory}; build it with python -m lsjax.train.feature_cache"
            )
        try:
            manifest = json.loads(mfile.read_text())
        except json.JSONDecodeError as e:
            raise FeatureCacheError(f"feature cache: {mfile} is not valid JSON ({e.msg})") from None
        if manifest.get("version") != VERSION:
            raise FeatureCacheError(f"feature cache: {directory} has version {manifest.get('version')}, need {VERSION}")
        shards = 0
        while (directory / _shard_name(shards)).is_dir():
            shards += 1
        fc = cls(directory, manifest, shards, first)
        if not fc.complete and not allow_partial:
            raise FeatureCacheError(
                f"feature cache: {directory} is incomplete ({fc.num_sequences}/{fc.total_sequences} sequences); "
                "finish the build or open with allow_partial"
            )
        if fc.num_sequences == 0 and allow_partial is False:
            raise FeatureCacheError(f"feature cache: {directory} has no complete shard")
        return fc

    def _field(self, shard: int, field: str) -> np.ndarray:
        key = (shard, field)
        if key not in self._open:
            self._open[key] = np.load(self.directory / _shard_name(shard) / f"{field}.npy", mmap_mode="r")
            if len(self._open) > 256:  # bounded: a long run touches every shard
                self._open.popitem(last=False)
        self._open.move_to_end(key)
        return self._open[key]

    @property
    def fields(self) -> tuple[str, ...]:
        """The fields this set holds."""
        return FIELDS[:-1] + (("aux_hidden",) if self.aux_layers else ())

    def read(self, indices, fields: tuple[str, ...] | None = None) -> dict[str, np.ndarray]:
        """Rows `indices` (any order, repeats allowed) of each field (default: every field the set holds), as
        in-memory arrays."""
        idx = np.asarray(indices, np.int64).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= self.num_sequences):
            raise FeatureCacheError(f"feature cache: index out of range [0, {self.num_sequences})")
        out = {}
        for f in self.fields if fields is None else fields:
            if f not in FIELDS:
                raise FeatureCacheError(f"feature cache: unknown field {f!r}; fields are {', '.join(FIELDS)}")
            if f not in self.fields:
                raise FeatureCacheError(
                    f"feature cache: {self.directory.name} has no {f} (build it with --aux-layers to store the "
                    "hidden states entering those layers)"
                )
            if f == "tokens":
                out[f] = np.asarray(self.tokens[idx])
            elif f == "loss_mask":
                out[f] = np.asarray(self.loss_mask[idx])
            else:
                out[f] = np.stack([self._field(i // self.shard_size, f)[i % self.shard_size] for i in idx])
        return out


class FeatureSets:
    """Several sets of one sequence length read as one (e.g. dialogue + self-distilled answers)."""

    def __init__(self, caches: list[FeatureCache], limit: int = 0):
        lengths = {c.seq_len for c in caches}
        if len(lengths) != 1:
            raise FeatureCacheError(f"feature cache: sets of different sequence lengths {sorted(lengths)} in one run")
        self.caches = caches
        self.seq_len = lengths.pop()
        # The aux streams only where every set holds the same layers' (None: the sets differ).
        aux = {c.aux_layers for c in caches}
        self.aux_layers = aux.pop() if len(aux) == 1 else None
        self.starts = np.cumsum([0] + [c.num_sequences for c in caches])
        self.num_sequences = int(self.starts[-1]) if not limit else min(int(self.starts[-1]), limit)
        self.tokens = np.concatenate([np.asarray(c.tokens) for c in caches])[: self.num_sequences]
        self.loss_mask = np.concatenate([np.asarray(c.loss_mask) for c in caches])[: self.num_sequences]

    @classmethod
    def open(cls, names: str, limit: int = 0) -> FeatureSets:
        """`names`: comma-separated sets, each optionally `name:N`, its first N sequences (sets are stored in a
        seeded shuffled order, so that is a uniform sample, and a run that read a set while it was being built
        is reproducible from the finished set)."""
        caches = []
        for spec in names.split(","):
            name, sep, first = spec.strip().rpartition(":")
            if not (sep and first.isdigit()):
                name, first = spec.strip(), None
            caches.append(FeatureCache.open(resolve_set(name), allow_partial=True, first=first and int(first)))
        return cls(caches, limit)

    def describe(self) -> str:
        return ", ".join(f"{c.directory.name} {c.num_sequences}/{c.total_sequences}" for c in self.caches)

    def read(self, indices, fields: tuple[str, ...] | None = None) -> dict[str, np.ndarray]:
        fields = self.caches[0].fields if fields is None else fields
        idx = np.asarray(indices, np.int64).reshape(-1)
        which = np.searchsorted(self.starts, idx, side="right") - 1
        rows = [self.caches[w].read(np.array([i - self.starts[w]]), fields) for w, i in zip(which, idx, strict=True)]
        return {f: np.concatenate([r[f] for r in rows]) for f in fields}


class FieldView:
    """One field of a cache as a lazily read per-sequence array (what `data.batches` takes as `extra`)."""

    def __init__(self, cache: FeatureCache | FeatureSets, field: str, num_sequences: int, first_only: bool = False):
        self.cache, self.field, self.n, self.first_only = cache, field, num_sequences, first_only

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i) -> np.ndarray:
        row = self.cache.read(np.array([i]), (self.field,))[self.field][0]
        return row[..., 0] if self.first_only else row


def resolve_set(name: str) -> Path:
    """A set name under the cache root, or a path to a set directory."""
    p = Path(name).expanduser()
    return p if p.is_absolute() or (p / "manifest.json").exists() else cache_root() / name
