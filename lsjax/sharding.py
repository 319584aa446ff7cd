"""A (data, fsdp) mesh, logical-axis rules -> PartitionSpecs, and the train step jitted with them.

Parameters are FSDP-sharded: each leaf's logical axes (the Flax partitioning metadata its module declares) map
to mesh axes through `RULES`; a dimension not divisible by its mesh axis stays replicated, so every config runs on
any mesh. Batches are split over both axes (data and fsdp together form the batch parallelism, as in
ZeRO-3). The frozen target is sharded like the draft. On one device everything is replicated and the
step is the plain jitted one.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from lsjax.config import ConfigError, MeshConfig
from lsjax.errors import LsjaxError
from lsjax.models.module import Model, abstract_variables, logical_axes

BATCH = ("data", "fsdp")

# A leaf's logical axes are the Flax partitioning metadata its model declares (`lsjax.models.module`).

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


class DistributedInitError(LsjaxError):
    """The processes of a multi-host run did not all reach the coordinator within the timeout."""


# How long the processes of a multi-host run wait for each other at start (seconds).
DIST_TIMEOUT_ENV = "LSJAX_DIST_TIMEOUT_S"
DEFAULT_DIST_TIMEOUT_S = 300


@dataclasses.dataclass(frozen=True)
class DistributedEnv:
    """What a multi-host launcher told this process. None fields are left to jax's cluster detection
    (Cloud TPU VMs, Slurm, Open MPI), which knows them from the cluster, not from variables we read."""

    coordinator: str | None
    num_processes: int | None
    process_id: int | None
    timeout_s: int


def _int_env(environ, name: str, low: int) -> int | None:
    raw = environ.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or value < low:
        raise ConfigError(f"{name}: must be an integer >= {low}, got {raw!r}")
    return value


def distributed_env(environ=None) -> DistributedEnv | None:
    """The multi-host launch this process is part of, from its environment; None for a one-process run.

    Explicit: JAX_COORDINATOR_ADDRESS (host:port of process 0), JAX_NUM_PROCESSES, JAX_PROCESS_ID on every
    host. Detected by jax: LSJAX_DISTRIBUTED=1 (a Cloud TPU pod slice: each host learns its id from the VM's
    metadata), a multi-host TPU VM (TPU_WORKER_HOSTNAMES lists several hosts), Slurm (SLURM_NTASKS > 1) and
    Open MPI (OMPI_COMM_WORLD_SIZE > 1). LSJAX_DIST_TIMEOUT_S bounds the wait for the other processes."""
    env = os.environ if environ is None else environ
    timeout = _int_env(env, DIST_TIMEOUT_ENV, 1) or DEFAULT_DIST_TIMEOUT_S
    coordinator = env.get("JAX_COORDINATOR_ADDRESS") or None
    num = _int_env(env, "JAX_NUM_PROCESSES", 1)
    pid = _int_env(env, "JAX_PROCESS_ID", 0)
    if coordinator is not None or num is not None or pid is not None:
        missing = [
            name
            for name, v in (
                ("JAX_COORDINATOR_ADDRESS", coordinator),
                ("JAX_NUM_PROCESSES", num),
                ("JAX_PROCESS_ID", pid),
            )
            if v is None
        ]
        if missing:
            raise ConfigError(
                f"{missing[0]}: a multi-host launch sets all of JAX_COORDINATOR_ADDRESS, "
                "JAX_NUM_PROCESSES and JAX_PROCESS_ID on every host"
            )
        if ":" not in coordinator:
            raise ConfigError(f"JAX_COORDINATOR_ADDRESS: must be host:port (process 0's), got {coordinator!r}")
        if pid >= num:
            raise ConfigError(f"JAX_PROCESS_ID: must be below JAX_NUM_PROCESSES={num}, got {pid}")
        return DistributedEnv(coordinator, num, pid, timeout) if num > 1 else None
    detected = (
        env.get("LSJAX_DISTRIBUTED", "") not in ("", "0")
        or len([h for h in env.get("TPU_WORKER_HOSTNAMES", "").split(",") if h]) > 1
        or (_int_env(env, "SLURM_NTASKS", 1) or 1) > 1
        or (_int_env(env, "OMPI_COMM_WORLD_SIZE", 1) or 1) > 1
    )
    return DistributedEnv(None, None, None, timeout) if detected else None


def maybe_initialize_distributed(environ=None) -> bool:
    """jax.distributed.initialize() when a multi-host launcher set the variables `distributed_env` reads;
    True when this process is (now) part of a multi-process run. Idempotent; must run before anything
    touches a jax device.

    A process whose peers do not all arrive within LSJAX_DIST_TIMEOUT_S exits with status 2 and one line
    (`DistributedInitError`): jax itself would abort the process (SIGABRT and a C++ stack dump) a little
    later, from native code no Python handler can catch, so the line is printed from a watchdog first."""
    if jax.distributed.is_initialized():
        return True
    dist = distributed_env(environ)
    if dist is None:
        return False
    who = (
        f"process {dist.process_id} of {dist.num_processes} waited {dist.timeout_s} s at coordinator "
        f"{dist.coordinator} for all {dist.num_processes} processes"
        if dist.num_processes is not None
        else f"this process waited {dist.timeout_s} s for the processes the cluster announced"
    )
    error = DistributedInitError(
        f"distributed: {who} to connect; start every host with the same coordinator and process count "
        f"(or raise {DIST_TIMEOUT_ENV})"
    )
    watchdog = threading.Timer(dist.timeout_s, _exit_with, args=(error,))
    watchdog.daemon = True
    watchdog.start()
    try:
        # jax's own deadline comes later, so that the watchdog's line is what the user sees.
        jax.distributed.initialize(
            coordinator_address=dist.coordinator,
            num_processes=dist.num_processes,
            process_id=dist.process_id,
            initialization_timeout=dist.timeout_s + 60,
        )
    finally:
        watchdog.cancel()
    return True


def _exit_with(error: LsjaxError) -> None:
    sys.stderr.write(f"error: {error}\n")
    sys.stderr.flush()
    os._exit(2)


def is_primary() -> bool:
    """Whether this process writes the run's files that are not checkpoints (process 0 of a multi-host run)."""
    return jax.process_index() == 0


def barrier(name: str) -> None:
    """All processes wait here (a no-op in a one-process run): e.g. until process 0 has emptied a directory."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


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


def spec_for_axes(axes: tuple[str, ...], shape: tuple[int, ...], mesh: Mesh, rules=None) -> PartitionSpec:
    """PartitionSpec of a leaf with these logical axes (one per dimension of `shape`), through `rules`
    (default `RULES`)."""
    rules = RULES if rules is None else rules
    out = []
    used = set()
    for dim, logical in zip(shape, axes):
        mesh_axis = rules.get(logical)
        # A mesh axis may appear once per spec, and only on a dimension it divides.
        if mesh_axis is None or mesh_axis in used or dim % _axis_size(mesh, mesh_axis) != 0:
            out.append(None)
        else:
            out.append(mesh_axis)
            used.add(mesh_axis)
    return PartitionSpec(*out)


def model_axes(*models: Model) -> dict[str, tuple[str, ...]]:
    """{path: logical axes} of the models' parameters, read from the Flax partitioning metadata they declare."""
    out: dict[str, tuple[str, ...]] = {}
    for model in models:
        out |= logical_axes(model)
    return out


def module_shardings(model: Model, mesh: Mesh) -> dict:
    """NamedShardings for `model`'s params tree, from the logical axes on its declared variables."""
    boxed = abstract_variables(model)
    return jax.tree.map(
        lambda leaf: NamedSharding(mesh, spec_for_axes(tuple(leaf.names), tuple(leaf.value.shape), mesh)),
        boxed,
        is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned),
    )


def _dict_path(path) -> tuple[str, ...]:
    return tuple(str(entry.key) for entry in path if isinstance(entry, jax.tree_util.DictKey))


def tree_shardings(tree, mesh: Mesh, axes: dict[str, tuple[str, ...]]):
    """NamedShardings for a params / optimizer-state / target pytree. A leaf whose dict path ends with a
    parameter's path in `axes` (`model_axes`: an optimizer's moments repeat the params' paths under their own
    keys) and has its rank is sharded by that parameter's logical axes; anything else (counts, scalars) is
    replicated."""
    by_path = {tuple(path.split("/")): ax for path, ax in axes.items()}
    longest = max((len(p) for p in by_path), default=0)

    def one(path, x):
        keys, shape = _dict_path(path), tuple(np.shape(x))
        for n in range(min(longest, len(keys)), 0, -1):
            ax = by_path.get(keys[-n:])
            if ax is not None and len(ax) == len(shape):
                return NamedSharding(mesh, spec_for_axes(ax, shape, mesh))
        return NamedSharding(mesh, PartitionSpec())

    return jax.tree_util.tree_map_with_path(one, tree)


def batch_shardings(batch, mesh: Mesh):
    """Batch leaves are [A, B, ...]: split B over (data, fsdp)."""
    size = _axis_size(mesh, BATCH)

    def one(x):
        shape = tuple(x.shape) if hasattr(x, "shape") else np.shape(x)
        if len(shape) < 2 or shape[1] % size != 0:
            raise ConfigError(f"data.batch_size: {shape[1] if len(shape) > 1 else '?'} must be a multiple of {size}")
        return NamedSharding(mesh, PartitionSpec(None, BATCH))

    return jax.tree.map(one, batch)


def process_rows(mesh: Mesh, batch_size: int) -> tuple[int, int]:
    """[start, stop): the rows of a step batch's B axis that this process's devices hold under
    `batch_shardings` (all of them in a one-process run). Each process reads only these rows."""
    sharding = NamedSharding(mesh, PartitionSpec(None, BATCH))
    spans = sorted(
        {
            (idx[1].start or 0, batch_size if idx[1].stop is None else idx[1].stop)
            for idx in sharding.addressable_devices_indices_map((1, batch_size)).values()
        }
    )
    start, stop = spans[0][0], spans[-1][1]
    covered = sum(b - a for a, b in spans)
    # make_array_from_process_local_data takes one contiguous block per process; jax.devices() lists each
    # process's devices together, so a mesh built from it gives one (make_mesh).
    if covered != stop - start or any(a2 != b1 for (_, b1), (a2, _) in zip(spans, spans[1:])):
        raise ConfigError(f"mesh: process {jax.process_index()} holds batch rows {spans}, not one contiguous block")
    return start, stop


def global_batch(local: dict, shardings: dict, batch_size: int) -> dict:
    """This process's rows of a step batch ([A, b, ...] numpy) -> the global batch ([A, B, ...] jax Arrays
    laid out by `shardings`), without any process holding the others' rows."""

    def one(x, s):
        shape = (x.shape[0], batch_size, *x.shape[2:])
        return jax.make_array_from_process_local_data(s, x, shape)

    return {k: one(v, shardings[k]) for k, v in local.items()}


def shard_train_step(step, mesh: Mesh, state, target_params, batch, axes: dict[str, tuple[str, ...]]):
    """jit(step) with explicit in/out shardings on `mesh`; returns (jitted, placed state, placed target).

    `state`, `target_params`, `batch` are examples (arrays or ShapeDtypeStructs) for the shardings; `axes` the
    logical axes of the draft's and the target's parameters (`model_axes(draft, target)`).
    """
    state_sh = tree_shardings(state, mesh, axes)
    target_sh = tree_shardings(target_params, mesh, axes)
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
