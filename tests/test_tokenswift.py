"""The TokenSwift drafter on the shared engine: greedy output == AR for every draft pass, with and without
n-gram reuse and the contextual penalty; constant partial-cache memory; one compile for every step.
(T > 0: tests/test_verify_sampling.py.)"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lsjax import speculative
from lsjax.config import GenerateConfig, SamplingConfig
from lsjax.drafters.base import ARDrafter
from lsjax.drafters.tokenswift import TokenSwiftConfig, TokenSwiftDrafter
from lsjax.models import tokenswift_heads as th
from tests.test_speculative import repetitive_prompts, run
from tests.tiny import tiny_model


def heads_params(params, config, drafter, seed=0):
    """Untrained heads with a small random W, so the levels differ from the target's own head."""
    return th.init_params(config, drafter.heads, params, key=jax.random.key(seed))


def ts(**kw):
    return TokenSwiftDrafter(TokenSwiftConfig(**kw))


DRAFTERS = {
    "partial": ts(topk=(1, 2, 2, 1), kv_budget=24, kv_sink=4, ngram_topk=4),
    "partial-no-ngram": ts(topk=(2, 2, 1), kv_budget=24, kv_sink=4, ngram_topk=0),
    "full": ts(draft_pass="full", topk=(1, 2, 2), ngram_topk=3, ngram_n=3),
    "verified": ts(draft_pass="verified", topk=(2, 2, 1), ngram_topk=4),
}
SLOW = {"partial-no-ngram", "full"}


@pytest.mark.parametrize(
    "name,penalty",
    [pytest.param(n, p, marks=[pytest.mark.slow] if n in SLOW or p else []) for n in DRAFTERS for p in (False, True)],
)
def test_greedy_tokenswift_equals_ar(name, penalty):
    config, params = tiny_model()
    drafter = DRAFTERS[name]
    sampling = SamplingConfig(penalty=1.3, penalty_window=6) if penalty else SamplingConfig()
    gen = GenerateConfig(max_new_tokens=40, ignore_eos=True, sampling=sampling)
    prompts = repetitive_prompts(config, 3, 40, seed=1) + [np.arange(3, 20)]
    dp = heads_params(params, config, drafter)
    ar = run(params, config, prompts, gen, ARDrafter())
    sp = run(params, config, prompts, gen, drafter, draft_params=dp)
    np.testing.assert_array_equal(np.asarray(sp.num_out), np.asarray(ar.num_out))
    np.testing.assert_array_equal(np.asarray(sp.out), np.asarray(ar.out))
    assert float(sp.mean_accepted) > 1.3  # drafts get accepted
