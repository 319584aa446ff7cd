"""The TokenSwift drafter on the shared engine: greedy output == AR for every draft pass, with and without
n-gram reuse and the contextual penalty; constant partial-cache memory; one compile for every step.
(T > 0: tests/test_verify_sampling.py.)"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lsjax import engine
from lsjax.artifacts import BF16
from lsjax.config import ConfigError, GenerateConfig, SamplingConfig
from lsjax.engine.types import ARDrafter
from lsjax.methods.tokenswift import model as th
from lsjax.methods.tokenswift.drafter import TokenSwiftConfig, TokenSwiftDrafter
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
SLOW = {"partial-no-ngram", "full", "verified"}  # the default run keeps the paper's pass


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
    # Drafts get accepted. The penalty pushes the target off the repetitions these prompts are made of, which the
    # n-gram and heads propose (measured 1.14-2.14 with it, 1.49-2.56 without): nothing accepted would be 1.0.
    assert float(sp.mean_accepted) > (1.1 if penalty else 1.3)


@pytest.mark.slow
def test_one_compile_and_partial_cache_memory_is_the_budget():
    config, params = tiny_model()
    drafter = DRAFTERS["partial"]
    dp = heads_params(params, config, drafter)
    gen = GenerateConfig(max_new_tokens=30, ignore_eos=True)
    before = engine.decode._cache_size()
    sizes = []
    for prompt_len in (20, 60):  # one prompt bucket: the same compiled program
        prompt = jnp.asarray([list(np.resize([5, 9, 14, 20, 7], prompt_len)) + [0] * (64 - prompt_len)])
        state = engine.start(
            params, dp, config, drafter, gen, prompt, jnp.array([prompt_len]), jax.random.key(0), capacity=320, chunk=32
        )
        for limit in (2, 5, 9):
            state = engine.decode(params, dp, config, drafter, gen, state, jnp.int32(limit))
        sizes.append(state.draft.pcache.nbytes())
    assert engine.decode._cache_size() - before == 1
    slots = config.num_layers * config.num_kv_heads * drafter.cfg.kv_budget  # batch 1
    assert sizes[0] == sizes[1] == slots * (2 * config.head_dim * 4 + 4) + 4 + 4 + 1  # k, v, pos; counters


def test_heads_checkpoint_roundtrip_and_named_errors(tmp_path):
    from lsjax.errors import CorruptFileError, ModelNotFoundError, ShapeMismatchError
    from lsjax.methods.tokenswift.checkpoint import load_heads, load_tokenswift, save_heads

    config, params = tiny_model()
    hp = th.init_params(config, th.HeadsConfig(3), params, key=jax.random.key(0))
    save_heads(tmp_path / "h", hp, th.HeadsConfig(3), "tiny")
    got, hcfg, meta = load_heads(tmp_path / "h", config)
    assert hcfg == th.HeadsConfig(3) and meta["target"] == "tiny"
    np.testing.assert_array_equal(got["w"], np.asarray(hp["w"], BF16).astype(np.float32))  # stored in bf16
    model = type("Model", (), {"config": config, "params": params, "path": tmp_path / "tiny.gguf"})
    drafter, _ = load_tokenswift(model, str(tmp_path / "h"), TokenSwiftConfig())
    assert drafter.name == "tokenswift" and drafter.tree.depth == 4
    with pytest.raises(ModelNotFoundError, match="no TokenSwift heads"):
        load_tokenswift(model, str(tmp_path / "nothing"), TokenSwiftConfig())
    _, zero = load_tokenswift(model, None, TokenSwiftConfig())  # nothing shipped for "tiny": zero heads
    assert float(jnp.abs(zero["w"]).max()) == 0
    (tmp_path / "h" / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{truncated")
    with pytest.raises(CorruptFileError, match="model.safetensors"):
        load_heads(tmp_path / "h", config)
    save_heads(tmp_path / "w", hp, th.HeadsConfig(3), "tiny")
    with pytest.raises(ShapeMismatchError, match="do not fit"):
        load_heads(tmp_path / "w", dataclasses.replace(config, hidden_size=24))


@pytest.mark.slow
@pytest.mark.parametrize("draft_pass", ["partial", "verified"])
def test_real_smollm2_greedy_tokenswift_equals_ar(ours, draft_pass):
    """On the real model, a ~1K-token code prompt and a 256-entry partial cache (selection and rebuilds on a
    real context), untrained heads: the output is AR's."""
    from lsjax.engine.host import Generator
    from lsjax.methods.tokenswift.checkpoint import load_tokenswift
    from lsjax.prompts import stdlib_code_prompt

    ids = ours.tokenizer.encode(stdlib_code_prompt(ours.tokenizer, 1024).text)
    gen = GenerateConfig(max_new_tokens=48, ignore_eos=True)
    topk = (1, 2, 2, 1) if draft_pass == "partial" else (2, 2, 1)
    cfg = TokenSwiftConfig(draft_pass=draft_pass, topk=topk, kv_budget=256, ngram_topk=4)
    drafter, dp = load_tokenswift(ours, "zero", cfg)
    ar = Generator(ours.config, ours.params).run(ids, gen)
    sp = Generator(ours.config, ours.params, drafter, dp).run(ids, gen)
    assert sp.tokens == ar.tokens
    assert sp.mean_accepted > 1.2


def test_registry_options_reach_the_config():
    from lsjax.methods import registry

    config, params = tiny_model()
    model = type("Model", (), {"config": config, "params": params, "path": "tiny.gguf"})
    opts = dict(draft="zero", kv_budget=64, ngram_topk=2, ngram_n=6, draft_pass="verified", ts_topk=(2, 1))
    opts["ts_preset"] = "paper"
    drafter, dp = registry.build("tokenswift", model, **opts)
    assert drafter.cfg == TokenSwiftConfig("verified", (2, 1), 64, 16, 2, 6)
    assert drafter.tree.depth == 5 and set(dp) == {"w", "in_norm", "out_norm"}
    paper = dict(draft="zero", ts_preset="paper")
    assert registry.build("tokenswift", model, **paper)[0].cfg == TokenSwiftConfig()
    assert registry.build("tokenswift", model, **paper, draft_pass="verified")[0].cfg.topk == (3, 3, 3)
    cpu = registry.build("tokenswift", model, draft="zero", ts_preset="cpu", draft_pass="partial")[0].cfg
    assert cpu.topk == (1, 1, 1, 1) and cpu.draft_pass == "partial"


@pytest.mark.parametrize(
    "kw, says",
    [
        (dict(kv_budget=3), "tokenswift.kv_budget: must be > kv_sink=16 (the first positions always kept), got 3"),
        (dict(kv_sink=-1), "tokenswift.kv_sink: must be an integer >= 0, got -1"),
    ],
)
def test_a_budget_below_the_sink_names_the_budget(kw, says):
    """--kv-budget 3 is the flag a user set; the error names it, not the sink default they never saw."""
    with pytest.raises(ConfigError) as e:
        TokenSwiftConfig(**kw)
    assert str(e.value) == says
