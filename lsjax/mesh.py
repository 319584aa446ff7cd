"""Decoding on a mesh: the target tensor-parallel over a `model` axis, prompt rows over a `data` axis.

    mesh = lsjax.mesh.make("model=4")                       # or make(MeshShape(model=4, data=2))
    params, draft_params = lsjax.mesh.place(params, draft_params, config, mesh)
    spec = lsjax.SpecConfig(model=config, drafter=..., gen=..., mesh=mesh)
    out = jax.jit(lsjax.generate)(params, draft_params, prompts, spec, key)

The split is Megatron's: each device holds N/M query heads and K/M KV heads of every layer (their columns of
the fused q/k/v projection and rows of the output projection), the same KV heads' slice of the K/V cache,
F/M columns of the MLP's gate/up and rows of its down projection, and V/M rows of the embedding and the LM
head; norms and the drafts are replicated. A layer then needs two all-reduces (after the attention's and the
MLP's output projections) and attention runs per device on its own heads and cache slice
(`lsjax.attention.head_shards`), which is how the Pallas kernels run on a mesh. The engine enters the mesh
(`scope`) in every entry point that takes a `SpecConfig` with one, so nothing below it takes a mesh argument.

Exact: a mesh changes only the order in which a contraction over heads or MLP columns is summed (per-device
partial sums, then an all-reduce), the same kind of difference a different row count makes on one device.
tests/test_mesh.py checks mesh output against one-device output token for token on fake CPU devices.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from lsjax import attention, sharding
from lsjax.config import ModelConfig
from lsjax.errors import LsjaxError
from lsjax.models import target

AXES = ("data", "model")


class MeshError(LsjaxError, ValueError):
    """A mesh that does not fit the devices, the model's heads, or the batch."""


@dataclasses.dataclass(frozen=True)
class MeshShape:
    """Devices per axis: `model`-way tensor parallelism times `data`-way batch parallelism."""

    model: int = 1
    data: int = 1

    def __post_init__(self):
        for name in ("model", "data"):
            value = getattr(self, name)
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
                raise MeshError(f"mesh: {name} must be an integer >= 1, got {value!r}")

    @property
    def size(self) -> int:
        return self.model * self.data

    @classmethod
    def parse(cls, text: str) -> MeshShape:
        """'model=4', 'model=2,data=4' -> MeshShape (what `decode.py --mesh` takes)."""
        sizes = {}
        for part in str(text).replace(" ", "").split(","):
            name, eq, value = part.partition("=")
            if not eq or name not in AXES or not value.isdigit():
                raise MeshError(f"--mesh: {part!r} is not AXIS=SIZE with AXIS one of {'|'.join(AXES)} (e.g. model=4)")
            if name in sizes:
                raise MeshError(f"--mesh: {name} is given twice")
            sizes[name] = int(value)
        return cls(**sizes)

    def __str__(self) -> str:
        return f"model={self.model},data={self.data}"


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def make(shape: MeshShape | str, devices=None) -> Mesh:
    """A ("data", "model") Mesh over the first data x model devices (default: `jax.devices()`)."""
    shape = MeshShape.parse(shape) if isinstance(shape, str) else shape
    devices = list(jax.devices() if devices is None else devices)
    n = len(devices)
    if shape.size > n:
        raise MeshError(
            f"mesh {shape}: needs {shape.size} devices, {n} {devices[0].platform} device{'s' * (n > 1)} here; "
            f"model x data must be one of {_divisors(n)}"
        )
    if n % shape.size:
        raise MeshError(
            f"mesh {shape}: {shape.size} devices do not divide the {n} {devices[0].platform} devices here; "
            f"model x data must be one of {_divisors(n)}"
        )
    # model is the minor axis: its all-reduces, one per layer and two per step, stay between neighbours.
    return Mesh(np.asarray(devices[: shape.size]).reshape(shape.data, shape.model), AXES)


def shape_of(mesh: Mesh) -> MeshShape:
    return MeshShape(model=int(mesh.shape.get("model", 1)), data=int(mesh.shape.get("data", 1)))


def check(config: ModelConfig, mesh: Mesh, batch: int | None = None) -> None:
    """Raises MeshError unless the model axis divides the heads and MLP width and the data axis the batch."""
    if tuple(mesh.axis_names) != AXES:
        raise MeshError(f"mesh: axes must be {AXES} (lsjax.mesh.make builds one), got {tuple(mesh.axis_names)}")
    M, D = int(mesh.shape["model"]), int(mesh.shape["data"])
    fits = math.gcd(config.num_kv_heads, config.intermediate_size)
    if fits % M:
        raise MeshError(
            f"mesh model={M}: {config.name} has {config.num_kv_heads} KV heads, {config.num_heads} query heads and "
            f"an MLP of {config.intermediate_size}, which model={M} does not divide; model must be one of "
            f"{_divisors(fits)}"
        )
    if batch is not None and batch % D:
        raise MeshError(
            f"mesh data={D}: the batch of {batch} prompt rows does not split over it; data must divide the batch "
            f"(one of {_divisors(batch)}) or the batch be a multiple of {D}"
        )


# Logical axis -> mesh axis when decoding: tensor parallelism, each "model" shard holding its heads, its MLP
# columns and its rows of the vocabulary (training's rules are `lsjax.sharding.RULES`).
DECODE_RULES = {"heads": "model", "kv_heads": "model", "mlp": "model", "vocab": "model"}


def param_specs(params: dict, mesh: Mesh) -> dict:
    """PartitionSpecs for target params in the grouped inference layout (`target.group_for_shards`): each leaf's
    logical axes (`target.decode_axes`, derived from the ones the module declares) through `DECODE_RULES`."""
    M = int(mesh.shape["model"])
    axes = target.decode_axes(params)

    def one(ax, leaf):
        return sharding.spec_for_axes(ax, tuple(leaf.shape), mesh, DECODE_RULES)

    out = {name: one(axes[name], leaf) for name, leaf in params.items() if name != "layers"}
    # M = 1 keeps the flat layout (`group_for_shards`), replicated.
    out["layers"] = tuple(
        {k: one(ax[k], layer[k]) if M > 1 else PartitionSpec() for k in layer}
        for ax, layer in zip(axes["layers"], params["layers"])
    )
    return out


def place(params: dict, draft_params, config: ModelConfig, mesh: Mesh):
    """(target params grouped and split over the mesh, draft params replicated on it)."""
    check(config, mesh)
    params = target.group_for_shards(params, config, int(mesh.shape["model"]))
    specs = param_specs(params, mesh)
    params = jax.tree.map(lambda x, s: jax.device_put(x, NamedSharding(mesh, s)), params, specs)
    replicated = NamedSharding(mesh, PartitionSpec())
    draft_params = jax.tree.map(lambda x: jax.device_put(x, replicated), draft_params)
    return params, draft_params


def cache_spec(ndim: int = 5) -> PartitionSpec:
    """The K/V cache [L, B, K, S, H]: rows over data, KV heads over model."""
    return PartitionSpec(None, "data", "model", None, None) if ndim == 5 else PartitionSpec("data")


def scope(mesh: Mesh | None):
    """The mesh as the context of what is traced inside (a no-op for None)."""
    return contextlib.nullcontext() if mesh is None else jax.sharding.use_abstract_mesh(mesh.abstract_mesh)


def constrain_cache(cache):
    """The target cache pinned to its mesh layout inside a traced function under `scope`, so the compiler
    never chooses another (e.g. gathering it) for the decode loop's carry."""
    mesh = attention.model_mesh()
    if mesh is None:
        return cache
    D = int(mesh.shape["data"])
    batch_ok = cache.k.shape[1] % D == 0
    k_spec = cache_spec() if batch_ok else PartitionSpec(None, None, "model", None, None)
    return dataclasses.replace(
        cache,
        k=jax.lax.with_sharding_constraint(cache.k, k_spec),
        v=jax.lax.with_sharding_constraint(cache.v, k_spec),
    )
