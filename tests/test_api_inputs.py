"""`lsjax.generate` and its configs check their inputs: a named one-line error for every bad argument where it
can be known (shapes and dtypes at trace time, values where concrete), and under the caller's jit an invalid row
yields no output rather than output computed from garbage."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lsjax
from lsjax.config import ConfigError, GenerateConfig
from lsjax.errors import InputError
from tests.tiny import tiny_model

CHUNK = 64


@pytest.fixture(scope="module")
def tiny():
    return tiny_model()


def cfg(config, max_new=4, **kw):
    return lsjax.SpecConfig(model=config, gen=GenerateConfig(max_new, ignore_eos=True), chunk=CHUNK, **kw)


def one_line(e) -> str:
    msg = str(e.value)
    assert "\n" not in msg
    return msg


@pytest.mark.parametrize(
    "prompt, lengths, message",
    [
        (np.ones((1, CHUNK), np.float32), None, "prompt_ids: expected integer token ids, got dtype float32"),
        (np.ones((CHUNK,), np.int32), None, "prompt_ids: expected shape [batch, width], got (64,)"),
        (
            np.ones((2, CHUNK), np.int32),
            np.array([3]),
            "prompt_lengths: expected shape (2,) (one per prompt row), got (1,)",
        ),
        (np.ones((1, CHUNK), np.int32), np.array([0]), "prompt_lengths[0]: 0 is outside [1, 64] (the prompt width)"),
        (np.ones((1, CHUNK), np.int32), np.array([65]), "prompt_lengths[0]: 65 is outside [1, 64] (the prompt width)"),
        (
            np.full((1, CHUNK), 97, np.int32),
            np.array([5]),
            "prompt_ids[0]: token id 97 is outside the vocabulary [0, 97)",
        ),
        (
            np.full((1, CHUNK), -1, np.int32),
            np.array([5]),
            "prompt_ids[0]: token id -1 is outside the vocabulary [0, 97)",
        ),
        (np.ones((1, CHUNK), np.int32), np.array([3.0]), "prompt_lengths: expected integers, got dtype float64"),
    ],
)
def test_bad_prompts_are_named(tiny, prompt, lengths, message):
    config, params = tiny
    with pytest.raises(InputError) as e:
        lsjax.generate(params, (), prompt, cfg(config), jax.random.key(0), lengths)
    assert one_line(e) == message


def test_padding_past_the_length_is_not_checked(tiny):
    """Ids past a row's length are padding: anything may stand there."""
    config, params = tiny
    prompt = np.full((1, CHUNK), -7, np.int32)
    prompt[0, :5] = [3, 4, 5, 6, 7]
    out = lsjax.generate(params, (), prompt, cfg(config), jax.random.key(0), np.array([5]))
    assert int(out.num_tokens[0]) == 4


def test_context_window_overflow_is_named(tiny):
    config, params = tiny
    prompt = np.ones((1, 2048), np.int32)
    with pytest.raises(InputError) as e:
        lsjax.generate(params, (), prompt, cfg(config, max_new=8), jax.random.key(0), np.array([2045]))
    assert one_line(e) == "prompt_lengths[0]: 2045 prompt tokens + max_new_tokens 8 exceed the context window of 2048"
    with pytest.raises(ConfigError, match="SpecConfig.gen.max_new_tokens: 2048 does not fit the model's context"):
        cfg(config, max_new=2048)


def test_under_jit_invalid_rows_return_nothing(tiny):
    """Values are data under the caller's jit: row 0 is fine, row 1 has length 0, row 2 an id outside the
    vocabulary; only row 0 returns tokens, and they are the tokens row 0 gets alone."""
    config, params = tiny
    prompt = np.ones((3, CHUNK), np.int32)
    prompt[2, 1] = 500
    lengths = np.array([5, 0, 5], np.int32)
    run = jax.jit(lsjax.generate, static_argnames="config")
    out = run(params, (), prompt, cfg(config), jax.random.key(0), lengths)
    assert np.asarray(out.num_tokens).tolist() == [4, 0, 0]
    alone = lsjax.generate(params, (), prompt[:1], cfg(config), jax.random.key(0), lengths[:1])
    np.testing.assert_array_equal(np.asarray(out.tokens[0]), np.asarray(alone.tokens[0]))


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(drafter="pld"), "SpecConfig.drafter: expected a Drafter (e.g. lsjax.PLDDrafter()), got 'pld'"),
        (dict(capacity=0), "SpecConfig.capacity: must be None or an integer >= 1, got 0"),
        (dict(backend="cuda"), "SpecConfig.backend: must be one of"),
    ],
)
def test_spec_config_checks_its_fields(tiny, kw, message):
    with pytest.raises(ConfigError) as e:
        cfg(tiny[0], **kw)
    assert one_line(e).startswith(message)


def test_pld_needs_a_token(tiny):
    with pytest.raises(ValueError, match=r"pld: num_tokens must be an integer >= 1 \(tokens per lookup chain\), got 0"):
        lsjax.PLDDrafter(num_tokens=0)


def test_valid_calls_still_run_under_jit(tiny):
    config, params = tiny
    out = jax.jit(lsjax.generate, static_argnames="config")(
        params, (), jnp.ones((1, CHUNK), jnp.int32), cfg(config, drafter=lsjax.PLDDrafter(2)), jax.random.key(0),
        jnp.array([9]),
    )  # fmt: skip
    assert int(out.num_tokens[0]) == 4
