"""Fits a bias over a small vocabulary to a fixed token stream with the shared step loop and optimizer."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from lsjax.train.config import CheckpointConfig, LogConfig, OptimConfig, RunConfig
from lsjax.train.runner import Job, fit
from lsjax.train.step import apply_grads, init_state, make_optimizer

VOCAB = 16


@dataclasses.dataclass(frozen=True)
class EchoTrainConfig(RunConfig):  # the run section every trainer shares: name, run_dir, seed, steps, optim, ...
    name: str = "echo"
    optim: OptimConfig = OptimConfig(lr=0.1, warmup_steps=1, total_steps=4)
    checkpoint: CheckpointConfig = CheckpointConfig(every=2)
    log: LogConfig = LogConfig(progress=False, plot=False, tensorboard=False)
    kind: str = "echo-bias"


class Stream:
    """The same batch of tokens every step (a resumable position, as the loop asks)."""

    def __init__(self):
        self.i = 0

    def next(self) -> dict:
        self.i += 1
        return {"tokens": jnp.asarray(np.arange(32) % 4, jnp.int32)}

    def get_state(self) -> dict:
        return {"i": self.i}

    def set_state(self, state: dict) -> None:
        self.i = state["i"]


def fit_bias(cfg: EchoTrainConfig, **run) -> dict:
    return fit(cfg, _setup, **run)


def _setup(cfg: EchoTrainConfig, open_run_dir, log) -> Job:
    open_run_dir()
    optimizer = make_optimizer(cfg.optim)

    def step(state, consts, batch, key):
        def loss(params):
            logp = jax.nn.log_softmax(params["bias"])
            return -jnp.mean(logp[batch["tokens"]])

        value, grads = jax.value_and_grad(loss)(state.params)
        return apply_grads(state, grads, optimizer), {"loss": value}

    state = init_state({"bias": jnp.zeros((VOCAB,), jnp.float32)}, optimizer)
    return Job(state, step, (), Stream(), jax.random.key(0), tokens_per_step=32)


def export(cfg: EchoTrainConfig, out_dir, *, config_path=None, tree=None) -> dict:
    from lsjax.train.checkpoint import load_draft_params

    bias = np.asarray(load_draft_params(Path(cfg.resolved_run_dir))["bias"])
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    (Path(out_dir) / "bias.json").write_text(json.dumps(bias.tolist()))
    return {"tensors": 1}
