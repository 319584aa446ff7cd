"""What varies per call is data: the number of new tokens (`start`'s `max_new`, `generate`'s `max_new_tokens`)
and every prompt up to its padded width run one compiled program, and write what a program compiled for that
exact length writes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lsjax
from lsjax.config import GenerateConfig
from lsjax.engine import loop
from lsjax.engine.host import Generator
from lsjax.engine.types import SpecConfig
from lsjax.errors import InputError
from lsjax.methods.pld.drafter import PLDDrafter
from tests.tiny import tiny_model

PROMPTS = ([5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [9, 10, 11, 9, 10, 11, 9, 10, 11, 9, 10, 11, 9, 10] * 3)


def test_the_output_width_ladder():
    assert loop.new_tokens_bucket(1, 8192) == loop.new_tokens_bucket(256, 8192) == 256
    assert loop.new_tokens_bucket(257, 8192) == 512 and loop.new_tokens_bucket(200, 8192) == 256
    assert loop.new_tokens_bucket(3000, 4096) == 4095  # below the context window
    assert loop.new_tokens_bucket(5000, 4096) == 5000  # never below the count itself


@pytest.mark.slow  # one program per width: the API test below
def test_a_generator_compiles_once_for_every_length_and_prompt_of_a_bucket():
    config, params = tiny_model()
    ar = Generator(config, params)
    spec = Generator(config, params, PLDDrafter(num_tokens=4))
    for ids in PROMPTS:
        full = ar.run(ids, GenerateConfig(max_new_tokens=40, ignore_eos=True)).tokens
        for n in (3, 17, 40):
            out = spec.run(ids, GenerateConfig(max_new_tokens=n, ignore_eos=True))
            assert out.tokens == full[:n] and out.stop_reason == "max_new_tokens"
    # One program pair for two prompt lengths and three counts (the width is 256 for all), in both generators.
    assert len(spec._compiled) == 1 and len(ar._compiled) == 1


def test_a_runtime_count_equals_a_program_compiled_for_it():
    """The limit is exact mid-step: a step that accepts past it emits only up to it, as a static width would."""
    config, params = tiny_model()
    tokens, lengths = lsjax.pad_prompts(PROMPTS)
    key = jax.random.key(0)
    wide = SpecConfig(config, GenerateConfig(max_new_tokens=32, ignore_eos=True), PLDDrafter(num_tokens=6))
    out = lsjax.generate(params, (), tokens, wide, key, lengths, max_new_tokens=jnp.array([5, 11]))
    assert np.asarray(out.num_tokens).tolist() == [5, 11]
    for b, n in enumerate((5, 11)):
        exact = SpecConfig(config, GenerateConfig(max_new_tokens=n, ignore_eos=True), PLDDrafter(num_tokens=6))
        ref = lsjax.generate(params, (), tokens[b : b + 1], exact, key, lengths[b : b + 1])
        np.testing.assert_array_equal(np.asarray(out.tokens[b, :n]), np.asarray(ref.tokens[0, :n]))


def test_generate_under_jit_reuses_its_program_for_every_count():
    config, params = tiny_model()
    tokens, lengths = lsjax.pad_prompts(PROMPTS[:1])
    cfg = SpecConfig(config, GenerateConfig(max_new_tokens=16, ignore_eos=True), PLDDrafter(num_tokens=4))
    run = jax.jit(lsjax.generate)
    counts = [int(run(params, (), tokens, cfg, jax.random.key(0), lengths, jnp.int32(n)).num_tokens[0]) for n in (2, 9)]
    assert counts == [2, 9] and run._cache_size() == 1


def test_pad_prompts_pads_to_the_bucket_of_the_longest():
    ids, lengths = lsjax.pad_prompts([[1, 2, 3], list(range(300))])
    assert ids.shape == (2, 512) and ids.dtype == np.int32 and lengths.tolist() == [3, 300]
    assert ids[0, :4].tolist() == [1, 2, 3, 0] and lsjax.pad_prompts([[4]])[0].shape == (1, 256)
    with pytest.raises(InputError, match="non-empty lists"):
        lsjax.pad_prompts([[]])


@pytest.mark.parametrize(
    "bad, says",
    [
        (jnp.array([1, 2, 3]), r"max_new_tokens: expected shape \(\) or \(1,\)"),
        (jnp.float32(3), "expected integers"),
        (jnp.int32(17), r"max_new_tokens: \[17\] must lie in \[1, 16\]"),
        (jnp.int32(0), r"must lie in \[1, 16\]"),
    ],
)
def test_a_bad_count_is_one_named_error(bad, says):
    config, params = tiny_model()
    tokens, lengths = lsjax.pad_prompts(PROMPTS[:1])
    cfg = SpecConfig(config, GenerateConfig(max_new_tokens=16), PLDDrafter(num_tokens=4))
    with pytest.raises(InputError, match=says):
        lsjax.generate(params, (), tokens, cfg, jax.random.key(0), lengths, bad)
