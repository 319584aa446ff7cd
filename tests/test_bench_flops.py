"""The FLOP count behind the methods' cost table: one decode step, lowered (nothing runs)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lsjax.bench import flops
from lsjax.config import ModelConfig
from lsjax.engine.types import ARDrafter
from lsjax.methods.pld.drafter import PLDDrafter
from lsjax.models import target

CFG = ModelConfig(
    vocab_size=97, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=128
)


def test_a_step_costs_more_with_more_verified_nodes():
    params = target.prepare_for_decode(target.init_params(CFG, jax.random.PRNGKey(0)), CFG)
    params = jax.tree.map(jnp.asarray, params)
    ar = flops.step_flops(params, (), CFG, ARDrafter())
    chain4 = flops.step_flops(params, (), CFG, PLDDrafter(num_tokens=4))
    chain8 = flops.step_flops(params, (), CFG, PLDDrafter(num_tokens=8))
    # The layers' matmuls alone (2 * params per token) bound each count from below.
    per_token = 2 * 2 * CFG.num_layers * CFG.hidden_size * (CFG.hidden_size * 2 + CFG.intermediate_size * 3 // 2)
    assert ar > per_token
    assert ar < chain4 < chain8
    assert flops.extra_params(()) == 0
    assert flops.extra_params({"w": jnp.zeros((3, 4)), "b": jnp.zeros(5)}) == 17
