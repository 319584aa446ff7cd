"""Orbax checkpoints of a draft-training run: params, optimizer state, step, RNG and data-iterator state.

    ckpt = Checkpointer(run_dir / "checkpoints", keep=3)
    ckpt.save(step, state, rng_key, data_state, meta)       # async-safe: waits before returning
    state, rng_key, data_state, meta = ckpt.restore(abstract_state)   # the latest step
    params = load_draft_params(path)                        # a stage's params to start the next stage
    latest_step(run_dir / "checkpoints")                    # the newest saved step, or None

A run resumed from step k replays exactly: the step's key is fold_in(rng_key, step), the grain iterator
continues from its saved position (which also fixes the anchor offsets), and the optimizer state is
restored bit for bit.

Multi-host: every process calls save and restore (orbax writes each array's shards from the processes that
hold them into one checkpoint on a shared file system; process 0 finalizes it). The data position is each
process's own (its iterator reads its rows): all of them are gathered into the checkpoint, one per process
index. Restore lays the arrays out as the given state's shardings ask, whatever mesh wrote them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from lsjax.errors import LsjaxError
from lsjax.models.draft_params import DraftParams
from lsjax.train.step import TrainState


class CheckpointMeshError(LsjaxError):
    """A checkpoint whose per-process data positions cannot be given to this run's processes."""


class Checkpointer:
    def __init__(self, directory: str | Path, keep: int = 3):
        self.directory = Path(directory).absolute()
        self.manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True),
        )

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state: TrainState, rng_key: jax.Array, data_state: dict, meta: dict) -> None:
        tree = {
            "step": state.step,
            "params": state.params,
            "opt_state": state.opt_state,
            # Host numpy: the same on every process, written once (a per-process device array is not one array).
            "rng": np.asarray(jax.random.key_data(rng_key) if _is_typed_key(rng_key) else rng_key),
        }
        self.manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(tree),
                data=ocp.args.JsonSave({"per_process": gather_json(_jsonable(data_state))}),
                meta=ocp.args.JsonSave(meta),
            ),
        )
        # Waiting here keeps "the latest checkpoint" meaning a complete one if the run dies right after.
        self.manager.wait_until_finished()

    def restore(self, abstract_state: TrainState, rng_key: jax.Array, step: int | None = None):
        """-> (state, rng_key, data_state, meta) at `step` (default: the latest), the arrays laid out like
        `abstract_state`'s (their shardings, when they have them: a checkpoint of another mesh is resharded),
        and this process's data position."""
        step = self.manager.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        target = {
            "step": abstract_state.step,
            "params": abstract_state.params,
            "opt_state": abstract_state.opt_state,
            "rng": np.asarray(rng_key),
        }
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
        out = self.manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract), data=ocp.args.JsonRestore(), meta=ocp.args.JsonRestore()
            ),
        )
        tree = out["state"]
        state = TrainState(tree["step"], tree["params"], tree["opt_state"])
        rng = jax.numpy.asarray(tree["rng"])
        return state, rng, process_data_state(out["data"], jax.process_index(), jax.process_count()), out["meta"]

    def close(self) -> None:
        self.manager.close()


def _is_typed_key(key) -> bool:
    return jax.dtypes.issubdtype(getattr(key, "dtype", np.float32), jax.dtypes.prng_key)


def _jsonable(x: Any):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    return x


def gather_json(obj) -> list:
    """Every process's JSON-able `obj`, in process order (every process gets the list)."""
    if jax.process_count() == 1:
        return [obj]
    import json

    from jax.experimental import multihost_utils

    raw = np.frombuffer(json.dumps(obj).encode(), np.uint8)
    sizes = np.asarray(multihost_utils.process_allgather(np.int32(raw.size)))
    padded = np.zeros(int(sizes.max()), np.uint8)
    padded[: raw.size] = raw
    rows = np.asarray(multihost_utils.process_allgather(padded))
    return [json.loads(bytes(row[:n]).decode()) for row, n in zip(rows, sizes.tolist())]


def process_data_state(saved, index: int, count: int):
    """This process's data position from a checkpoint's `data` item.

    The positions are per process; a run with another process count can take them only when they all agree
    (every trainer's iterator counts steps, and a step's rows are cut from the same global batch whatever the
    split, so the position means the same on any number of processes)."""
    if not (isinstance(saved, dict) and set(saved) == {"per_process"}):
        return saved  # written before positions were per process: one process's
    states = saved["per_process"]
    if len(states) == count:
        return states[index]
    if all(s == states[0] for s in states):
        return states[0]
    raise CheckpointMeshError(
        f"checkpoint: written by {len(states)} processes whose data positions differ; resume it with "
        f"{len(states)} processes, not {count}"
    )


def latest_step(directory: str | Path) -> int | None:
    """The newest finalized checkpoint step in a checkpoints directory (None: none, or no such directory),
    without opening (or creating) a manager."""
    directory = Path(directory)
    steps = ocp.utils.checkpoint_steps(directory.absolute()) if directory.is_dir() else []
    return max(steps, default=None)


def checkpoint_dir(path: str | Path) -> Path:
    """A run dir (with checkpoints/) or a checkpoints dir -> the checkpoints dir."""
    path = Path(path)
    return path / "checkpoints" if (path / "checkpoints").is_dir() else path


def load_draft_params(path: str | Path, step: int | None = None) -> dict:
    """The draft params of a run's latest (or given) checkpoint, as numpy arrays (no optimizer needed)."""
    directory = checkpoint_dir(path)
    if not directory.is_dir():
        raise FileNotFoundError(f"no checkpoints at {path}")
    manager = ocp.CheckpointManager(directory.absolute())
    step = manager.latest_step() if step is None else step
    if step is None:
        raise FileNotFoundError(f"no checkpoint in {directory}")
    # As host numpy, whatever mesh wrote them (orbax would otherwise rebuild the writer's device layout, which
    # a one-host export of a multi-host run does not have); the optimizer state is not read at all.
    meta = ocp.StandardCheckpointer().metadata(directory.absolute() / str(step) / "state").item_metadata
    abstract = {"params": jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype), meta["params"])}
    as_numpy = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), abstract)
    args = ocp.args.PyTreeRestore(item=abstract, restore_args=as_numpy, partial_restore=True)
    out = manager.restore(step, args=ocp.args.Composite(state=args))
    manager.close()
    return jax.tree.map(np.asarray, out["state"]["params"])


def run_draft_params(cfg) -> DraftParams:
    """A run's latest checkpointed weights (numpy) with the run's pruned vocabulary (vocab_ids.npy), if any."""
    run_dir = Path(cfg.resolved_run_dir)
    weights = {k: np.asarray(v) for k, v in load_draft_params(run_dir).items()}
    vocab = run_dir / "vocab_ids.npy"
    return DraftParams(weights, np.load(vocab) if vocab.is_file() else None)
