"""Every engine entry point takes one `SpecConfig` (start, begin, run, decode), and the loose form written
before it (ModelConfig, drafter, GenerateConfig, capacity/chunk/backend keywords) builds the same one."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lsjax import engine
from lsjax.config import ConfigError, GenerateConfig
from lsjax.engine import SpecConfig
from lsjax.methods.pld.drafter import PLDDrafter
from lsjax.models import target
from tests.tiny import tiny_model


@pytest.fixture(scope="module")
def setup():
    config, params = tiny_model()
    params = target.prepare_for_decode(params, config)
    tokens = jnp.asarray(np.resize(np.arange(3, 20), (2, 64)), jnp.int32)
    lengths = jnp.array([64, 40], jnp.int32)
    gen = GenerateConfig(max_new_tokens=20, ignore_eos=True)
    return config, params, tokens, lengths, gen


@pytest.mark.parametrize(
    "drafter",
    [pytest.param(d, marks=pytest.mark.slow) for d in (engine.ARDrafter(), PLDDrafter(num_tokens=4))],  # ~40 s each
    ids=["ar", "pld"],
)
def test_spec_and_loose_forms_decode_alike(setup, drafter):
    config, params, tokens, lengths, gen = setup
    key = jax.random.key(0)
    spec = SpecConfig(config, gen, drafter, capacity=256, chunk=32)
    a = engine.start(params, (), spec, tokens, lengths, key)
    a = engine.decode(params, (), spec, a, jnp.int32(gen.max_new_tokens))
    b = engine.start(params, (), config, drafter, gen, tokens, lengths, key, capacity=256, chunk=32)
    b = engine.decode(params, (), config, drafter, gen, b, jnp.int32(gen.max_new_tokens))
    np.testing.assert_array_equal(np.asarray(a.out), np.asarray(b.out))
    np.testing.assert_array_equal(np.asarray(a.num_out), np.asarray(b.num_out))
    # run, jitted with the spec static, gives the same tokens
    run = jax.jit(functools.partial(engine.run, config=spec))
    c = run(params, (), tokens=tokens, lengths=lengths, key=key)
    np.testing.assert_array_equal(np.asarray(c.out), np.asarray(a.out))
    run = jax.jit(engine.run, static_argnames="config")  # the spec form, positional, under the caller's jit
    np.testing.assert_array_equal(np.asarray(run(params, (), spec, tokens, lengths, key).out), np.asarray(a.out))
    d = engine.run(params, (), config, tokens, lengths, gen, key, drafter, capacity=256, chunk=32)
    np.testing.assert_array_equal(np.asarray(d.out), np.asarray(a.out))


def test_begin_from_a_shared_prefill(setup):
    config, params, tokens, lengths, gen = setup
    spec = SpecConfig(config, gen, PLDDrafter(num_tokens=4), capacity=256, chunk=32)
    logits, cache = engine.prefill_jit(params, config, tokens, lengths, 256, chunk=32)
    key = jax.random.key(1)
    a = engine.begin(params, (), spec, tokens, lengths, key, cache, logits)
    b = engine.start(params, (), spec, tokens, lengths, key)
    np.testing.assert_array_equal(np.asarray(a.out), np.asarray(b.out))
    np.testing.assert_array_equal(np.asarray(a.cache.k), np.asarray(b.cache.k))


def test_capacity_defaults_to_what_the_run_needs(setup):
    config, params, tokens, lengths, gen = setup
    state = engine.start(params, (), SpecConfig(config, gen, chunk=32), tokens, lengths, jax.random.key(0))
    assert state.cache.capacity == engine.required_capacity(64, gen, engine.ARDrafter())


def test_wrong_arguments_are_named(setup):
    config, params, tokens, lengths, gen = setup
    spec = SpecConfig(config, gen)
    with pytest.raises(TypeError, match=r"^start: missing 'key' after the SpecConfig \(takes tokens, lengths, key\)$"):
        engine.start(params, (), spec, tokens, lengths)
    with pytest.raises(TypeError, match=r"^start: capacity belong in the SpecConfig, not beside it$"):
        engine.start(params, (), spec, tokens, lengths, jax.random.key(0), capacity=256)
    with pytest.raises(ConfigError, match=r"SpecConfig\.drafter: expected a Drafter"):
        SpecConfig(config, gen, "pld")
    with pytest.raises(ConfigError, match=r"SpecConfig\.gen\.max_new_tokens"):
        SpecConfig(config, GenerateConfig(max_new_tokens=config.max_position))
