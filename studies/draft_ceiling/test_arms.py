"""studies.draft_ceiling.arms: every arm starts as the draft it grows (its new outputs are zero), and each new
weight changes the forward once it is non-zero, so the arms differ only by what training puts there."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lsjax.config import DraftConfig, ModelConfig
from lsjax.methods.longspec.model import draft_forward_train, random_draft_params
from lsjax.models import target
from studies.draft_ceiling.arms import ARMS, arm_forward, grow

CONFIG = ModelConfig(
    vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
    max_position=256, name="tiny",
)  # fmt: skip
DRAFT = DraftConfig(window=8)


@pytest.fixture(scope="module")
def setup():
    tp = target.init_params(CONFIG, jax.random.key(0))
    dp = random_draft_params(CONFIG, jax.random.key(1), draft=DRAFT)
    tokens = jax.random.randint(jax.random.key(2), (2, 24), 0, CONFIG.vocab_size)
    pos = jnp.broadcast_to(jnp.arange(24)[None], (2, 24))
    k = jax.random.normal(jax.random.key(3), (2, 2, 24, 8))
    v = jax.random.normal(jax.random.key(4), (2, 2, 24, 8))
    h = jax.random.normal(jax.random.key(5), (2, 24, 32))
    return tp, dp, (tokens, pos, k, v, h)


@pytest.mark.parametrize("arm", ARMS)
def test_every_arm_starts_as_the_draft_it_grows(setup, arm):
    tp, dp, (tokens, pos, k, v, h) = setup
    shift = jnp.int32(2)
    want = draft_forward_train(dp, tp, CONFIG, DRAFT, tokens, pos, k, v, shift)
    p = grow(dp, arm, CONFIG, jax.random.key(6))
    got = arm_forward(p, tp, CONFIG, DRAFT, tokens, pos, k, v, h, shift)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
    new = sorted(set(p) - set(dp))
    assert bool(new) == (arm not in ("base", "lag1"))
    for name in new:  # a zero output projection made non-zero moves the forward: the new path is wired in
        if float(jnp.abs(p[name]).max()) == 0.0:
            moved = dict(p, **{name: jnp.full_like(p[name], 0.05)})
            out = arm_forward(moved, tp, CONFIG, DRAFT, tokens, pos, k, v, h, shift)
            assert float(jnp.abs(out - got).max()) > 1e-3, name


def test_the_feature_reads_the_target_state_the_lag_allows(setup):
    """At lag j, position t reads the target's hidden state at t - j and nothing later: changing the states at
    and after t - j + 1 leaves position t alone."""
    tp, dp, (tokens, pos, k, v, h) = setup
    p = grow(dp, "feature", CONFIG, jax.random.key(6))
    p["feat_w"] = 0.1 * jax.random.normal(jax.random.key(7), p["feat_w"].shape)
    j, t = 3, 12
    a = arm_forward(p, tp, CONFIG, DRAFT, tokens, pos, k, v, h, jnp.int32(j))
    h2 = h.at[:, t - j + 1 :].add(1.0)
    b = arm_forward(p, tp, CONFIG, DRAFT, tokens, pos, k, v, h2, jnp.int32(j))
    np.testing.assert_allclose(np.asarray(a[:, : t + 1]), np.asarray(b[:, : t + 1]), atol=1e-6)
    h3 = h.at[:, t - j].add(1.0)
    c = arm_forward(p, tp, CONFIG, DRAFT, tokens, pos, k, v, h3, jnp.int32(j))
    assert float(jnp.abs(c[:, t] - a[:, t]).max()) > 1e-3
