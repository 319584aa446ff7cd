"""Helpers shared by the Pallas kernels: backend-specific knobs kept out of the kernels."""

from __future__ import annotations

import jax
from jax.experimental import pallas as pl


def round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def on_tpu(interpret: bool) -> bool:
    return not interpret and jax.default_backend() == "tpu"


def scalar_spec(interpret: bool) -> pl.BlockSpec:
    """Whole-array spec for the small int32 per-sequence bounds ([B] lengths / window starts).

    Mosaic TPU can only index scalars out of SMEM; Triton and interpret mode read them from the default space.
    """
    if on_tpu(interpret):
        from jax.experimental.pallas import tpu as pltpu

        return pl.BlockSpec(memory_space=pltpu.SMEM)
    return pl.BlockSpec()


def compiler_params(num_grid_dims: int, interpret: bool):
    """Every grid axis of our kernels is independent (reductions happen inside a program or in the wrapper)."""
    if on_tpu(interpret):
        from jax.experimental.pallas import tpu as pltpu

        return pltpu.CompilerParams(dimension_semantics=("parallel",) * num_grid_dims)
    return None
