"""A (data, fsdp) mesh, logical-axis rules -> PartitionSpecs, and the train step jitted with them.

Parameters are FSDP-sharded: each leaf's logical axes (by its name in the params dict) map to mesh axes
through `RULES`; a dimension not divisible by its mesh axis stays replicated, so every config runs on
any mesh. Batches are split over both axes (data and fsdp together form the batch parallelism, as in
ZeRO-3). The frozen target is sharded like the draft. On one device everything is replicated and the
step is the plain jitted one.
"""

from __future__ import annotations

import os

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from lsjax.config import ConfigError, MeshConfig
from lsjax.models.layers import LOGICAL_AXES, ParamSpec

BATCH = ("data", "fsdp")

# A named leaf's logical axes come from the models' schemas (`lsjax.models.layers.LOGICAL_AXES`, which each
# model module declares beside its `param_specs`); target layer leaves carry a leading "layers" axis.

# Logical axis -> mesh axis. FSDP shards the model width of every matrix (and the vocabulary rows of the
# embedding through "embed"); the small per-head axes and norms stay whole.
RULES: dict[str, str | tuple[str, ...] | None] = {
    "batch": BATCH,
    "embed": "fsdp",
    "vocab": None,
    "mlp": None,
    "heads": None,
    "kv_heads": None,
    "head_dim": None,
    "norm": None,
    "layers": None,
}


def maybe_initialize_distributed() -> bool:
    """jax.distributed.initialize() when a multi-host launcher set the usual variables; True if it ran."""
    markers = ("JAX_COORDINATOR_ADDRESS", "COORDINATOR_ADDRESS", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE")
    multi = (
        any(os.environ.get(m) for m in markers)
        and int(
            os.environ.get(
                "SLURM_NTASKS", os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("JAX_NUM_PROCESSES", 2))
            )
        )
        > 1
    )
    if multi:
        jax.distributed.initialize()
    return bool(multi)


def make_mesh(cfg: MeshConfig, devices=None) -> Mesh:
    """A (data, fsdp) Mesh over `devices` (default all); -1 takes the remaining devices."""
    devices = list(jax.devices() if devices is None else devices)
    n = len(devices)
    data, fsdp = cfg.data, cfg.fsdp
    if data == -1:
        data = n // fsdp if n % fsdp == 0 else 0
    if fsdp == -1:
        fsdp = n // data if n % data == 0 else 0
    if data * fsdp != n:
        raise ConfigError(f"mesh: data x fsdp = {cfg.data} x {cfg.fsdp} does not match the {n} devices")
    # Mesh built directly has Auto axis types: sharding propagates through ops that Explicit would reject.
    return Mesh(np.asarray(devices).reshape(data, fsdp), ("data", "fsdp"))


def _axis_size(mesh: Mesh, axis) -> int:
    if axis is None:
        return 1
    names = axis if isinstance(axis, tuple) else (axis,)
    return int(np.prod([mesh.shape[a] for a in names]))


def spec_for(name: str | None, shape: tuple[int, ...], mesh: Mesh) -> PartitionSpec:
    """PartitionSpec of a parameter-like leaf named `name` (its dict key) with `shape`."""
    axes = LOGICAL_AXES.get(name or "")
    if axes is None or len(shape) not in (len(axes), len(axes) + 1):
        return PartitionSpec()  # scalars (optimizer counts), unknown leaves: replicated
    if len(shape) == len(axes) + 1:
        axes = ("layers", *axes)
    return spec_for_axes(axes, shape, mesh)


def spec_for_axes(axes: tuple[str, ...], shape: tuple[int, ...], mesh: Mesh) -> PartitionSpec:
    """PartitionSpec of a leaf with these logical axes (one per dimension of `shape`), through `RULES`."""
    out = []
    used = set()
    for dim, logical in zip(shape, axes):
        mesh_axis = RULES.get(logical)
        # A mesh axis may appear once per spec, and only on a dimension it divides.
        if mesh_axis is None or mesh_axis in used or dim % _axis_size(mesh, mesh_axis) != 0:
            out.append(None)
        else:
            out.append(mesh_axis)
            used.add(mesh_axis)
    return PartitionSpec(*out)


def spec_shardings(specs: dict[str, ParamSpec], mesh: Mesh) -> dict[str, NamedSharding]:
    """{path: NamedSharding} straight from a model's `param_specs` (no guessing from names or ranks)."""
    return {path: NamedSharding(mesh, spec_for_axes(s.logical_axes, s.shape, mesh)) for path, s in specs.items()}


def _last_name(path) -> str | None:
    for entry in reversed(path):
        if isinstance(entry, jax.tree_util.DictKey):
            return str(entry.key)
    return None


def tree_shardings(tree, mesh: Mesh):
    """NamedShardings for a params / optimizer-state / target pytree (by each leaf's last dict key)."""
    return jax.tree_util.tree_map_with_path(
        lambda path, x: NamedSharding(mesh, spec_for(_last_name(path), tuple(np.shape(x)), mesh)), tree
    )


def batch_shardings(batch, mesh: Mesh):
    """Batch leaves are [A, B, ...]: split B over (data, fsdp)."""
    size = _axis_size(mesh, BATCH)

    def one(x):
        shape = np.shape(x)
        if len(shape) < 2 or shape[1] % size != 0:
            raise ConfigError(f"data.batch_size: {shape[1] if len(shape) > 1 else '?'} must be a multiple of {size}")
        return NamedSharding(mesh, PartitionSpec(None, BATCH))

    return jax.tree.map(one, batch)


def shard_train_step(step, mesh: Mesh, state, target_params, batch):
    """jit(step) with explicit in/out shardings on `mesh`; returns (jitted, placed state, placed target).

    `state`, `target_params`, `batch` are examples (arrays or ShapeDtypeStructs) for the shardings.
    """
    state_sh = tree_shardings(state, mesh)
    target_sh = tree_shardings(target_params, mesh)
    batch_sh = batch_shardings(batch, mesh)
    replicated = NamedSharding(mesh, PartitionSpec())
    jitted = jax.jit(
        step,
        in_shardings=(state_sh, target_sh, batch_sh, replicated),
        out_shardings=(state_sh, replicated),
        donate_argnums=(0,),
    )
    return jitted, state_sh, target_sh, batch_sh


def place(tree, shardings):
    return jax.tree.map(lambda x, s: jax.device_put(x, s), tree, shardings)
