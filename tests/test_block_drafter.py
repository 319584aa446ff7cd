"""The block-parallel drafter and DeLS-Spec's fusion (lsjax.methods.dels.drafter) on a tiny random target:
the fusion formula, the in-block autoregression of the local head against a numpy reference, greedy == AR,
and one compiled program for every step. (T > 0: tests/test_verify_sampling.py.)"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lsjax import engine
from lsjax.config import BlockConfig, DraftConfig, GenerateConfig, LocalHeadConfig
from lsjax.engine.types import ARDrafter
from lsjax.methods.dels import local_head as lh
from lsjax.methods.dels.drafter import BlockDrafter, fuse, prepare_dels_params, short_logprobs, with_weights
from lsjax.methods.dels.model import init_block_params
from lsjax.methods.longspec.model import with_vocab_head
from lsjax.vocab import pruned_vocab
from tests.test_speculative import repetitive_prompts, run
from tests.tiny import tiny_model


def block_params(config, params, window=8, pruned=0, seed=0):
    """An untrained block draft: the target's last layer and a random mask embedding (pruned vocabulary
    optional)."""
    dp = init_block_params(config, DraftConfig(window=window, init_head_scale=1.0), params)
    dp["mask_embed"] = jax.random.normal(jax.random.key(seed), dp["mask_embed"].shape) * 0.5
    if pruned:
        counts = np.random.RandomState(seed).randint(0, 100, size=config.vocab_size)
        dp["vocab_ids"] = jnp.asarray(pruned_vocab(config, pruned, token_counts=counts))
        dp = with_vocab_head(dp, params, config)
    return dp


def local_head(config, kind="gru", head_vocab=None, seed=1):
    """A random local head strong enough to change the block's tokens, a random prior."""
    cfg = LocalHeadConfig(kind=kind, hidden=16, rank=8, block_size=8)
    hp = lh.init_params(cfg, config.hidden_size, jax.random.key(seed), embed_rms=0.3)
    hp["w_out"] = hp["w_out"] * 300
    prior = jax.nn.log_softmax(jax.random.normal(jax.random.key(seed + 1), (config.vocab_size,)) * 2)
    return cfg, hp, prior, head_vocab


def drafters(config, params, s=4, branches=1, kind="gru", alpha=0.3, beta=0.3, pruned=0, head_vocab=None, window=8):
    bp = block_params(config, params, window=window, pruned=pruned)
    cfg, hp, prior, hv = local_head(config, kind, head_vocab)
    dels_p = prepare_dels_params(bp, hp, prior, hv, params["embed"], alpha, beta)
    common = {"block": BlockConfig(s), "draft": DraftConfig(window=window), "branches": branches}
    return (
        BlockDrafter(**common),
        bp,
        BlockDrafter(**common, local=cfg),
        dels_p,
        (cfg, hp, prior, hv),
    )


def test_fusion_is_the_formula():
    """ℓ = ℓ_L + α ℓ_S − β ℓ_P with ℓ_S the head's log-softmax over its own vocabulary, the prior elsewhere."""
    rng = np.random.RandomState(0)
    Vd, R = 11, 4
    ll, r, table = rng.randn(3, Vd), rng.randn(3, R), rng.randn(Vd, R)
    prior = np.log(rng.dirichlet(np.ones(Vd)))
    in_head = rng.rand(Vd) > 0.3
    got = fuse(
        jnp.asarray(ll),
        short_logprobs(jnp.asarray(r), jnp.asarray(table), jnp.asarray(in_head), prior),
        prior,
        0.3,
        0.7,
    )
    raw = r @ table.T
    raw_in = np.where(in_head, raw, -np.inf)
    ls = np.where(in_head, raw - np.log(np.exp(raw_in - raw_in.max(1, keepdims=True)).sum(1, keepdims=True))
                  - raw_in.max(1, keepdims=True), prior)  # fmt: skip
    np.testing.assert_allclose(np.asarray(got), ll + 0.3 * ls - 0.7 * prior, rtol=1e-5, atol=1e-5)


@functools.cache
def _started(s, branches, kind, alpha, beta, pruned, head_vocab):
    config, params = tiny_model()
    hv = None if head_vocab is None else jnp.asarray(head_vocab)
    block, bp, dels, dp, head = drafters(config, params, s, branches, kind, alpha, beta, pruned, hv)
    prompt = jnp.asarray([np.resize([5, 9, 14, 20, 7, 33], 30).tolist() + [0] * 34])
    gen = GenerateConfig(max_new_tokens=8, ignore_eos=True)
    start = jax.jit(engine.start, static_argnames=("config", "drafter", "gen", "capacity", "chunk"))
    state = start(params, dp, config, dels, gen, prompt, jnp.array([30]), jax.random.key(0), capacity=96, chunk=32)
    return config, params, block, bp, dels, dp, head, state, gen


def _propose(drafter, params, dp, config, gen, state):
    ctx = engine.context(params, dp, config, gen, 96)
    return jax.jit(lambda st: drafter.propose(ctx, st, st.draft, jax.random.key(1)))(state)


@pytest.mark.parametrize(
    "kind,pruned,head_vocab",
    # ~13 s each; DeLS losslessness stays in the default run (test_greedy_block_and_dels_equal_ar)
    [
        pytest.param("gru", 0, None, marks=pytest.mark.slow),
        pytest.param("markov", 40, tuple(range(40, 97)), marks=pytest.mark.slow),
    ],
)
def test_dels_chain_is_the_fused_argmax_of_a_local_head_over_the_block_only(kind, pruned, head_vocab):
    """Token 1 is ℓ_L's argmax; token j > 1 the argmax of ℓ_L^(j) + α ℓ_S − β ℓ_P where ℓ_S comes from the
    numpy reference head run over the drafted tokens 1..j-1 alone (nothing before the block)."""
    config, params, block, bp, dels, dp, (hcfg, hp, prior, hv), state, gen = _started(
        5, 1, kind, 0.3, 0.3, pruned, head_vocab
    )
    tree = _propose(dels, params, dp, config, gen, state)
    ctx = engine.context(params, dp, config, gen, 96)
    ll = np.asarray(dels.long_logits(ctx, state, state.draft))[0]  # [s, Vd]
    ids = np.arange(config.vocab_size) if not pruned else np.asarray(bp.vocab_ids)
    in_head = np.ones(config.vocab_size, bool) if hv is None else np.isin(np.arange(config.vocab_size), hv)
    prior_d, in_d = np.asarray(prior)[ids], in_head[ids]
    chain = [int(ids[np.argmax(ll[0])])]
    block_tokens = [int(ids[np.argmax(ll[j])]) for j in range(5)]
    for j in range(1, 5):
        raw = lh.reference_block_logits(hp, hcfg, np.asarray(params["embed"]), np.asarray(chain))[-1][ids]
        m = raw[in_d].max()
        ls = np.where(in_d, raw - m - np.log(np.exp(raw[in_d] - m).sum()), prior_d)
        chain.append(int(ids[np.argmax(ll[j] + 0.3 * ls - 0.3 * prior_d)]))
    assert np.asarray(tree.tokens)[0, 1:].tolist() == chain
    assert chain != block_tokens  # the head changed the block's tokens: the comparison has power
    plain = _propose(block, params, bp, config, gen, state)
    assert np.asarray(plain.tokens)[0, 1:].tolist() == block_tokens


@pytest.mark.slow  # ~16 s; the block drafter's equality with AR stays in the default run
def test_alpha_beta_zero_is_the_plain_block_drafter():
    config, params, block, bp, dels, dp, _, state, gen = _started(6, 2, "gru", 0.0, 0.0, 0, None)
    fused = _propose(dels, params, dp, config, gen, state)
    plain = _propose(block, params, bp, config, gen, state)
    np.testing.assert_array_equal(np.asarray(fused.tokens), np.asarray(plain.tokens))
    np.testing.assert_array_equal(np.asarray(fused.parents), np.asarray(plain.parents))
    # Two chains: distinct first tokens (the top-2 of ℓ_L), each continued.
    toks = np.asarray(plain.tokens)[0]
    assert toks[1] != toks[2] and np.asarray(plain.parents)[0, 3:5].tolist() == [1, 2]


CASES = [
    dict(s=4, kind="gru", fused=True),
    pytest.param(dict(s=3), marks=pytest.mark.slow),
    pytest.param(dict(s=4, branches=2), marks=pytest.mark.slow),
    pytest.param(dict(s=3, kind="markov", fused=True, pruned=40), marks=pytest.mark.slow),
    pytest.param(dict(s=8, kind="gru", fused=True, branches=2, window=4), marks=pytest.mark.slow),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_greedy_block_and_dels_equal_ar(case):
    config, params = tiny_model()
    c = dict(case)
    fused = c.pop("fused", False)
    block, bp, dels, dp, _ = drafters(config, params, **c)
    drafter, draft_params = (dels, dp) if fused else (block, bp)
    gen = GenerateConfig(max_new_tokens=24, ignore_eos=True)
    prompts = repetitive_prompts(config, 3, 40, seed=2) + [np.arange(3, 20)]
    ar = run(params, config, prompts, gen, ARDrafter())
    sp = run(params, config, prompts, gen, drafter, draft_params=draft_params)
    np.testing.assert_array_equal(np.asarray(sp.num_out), np.asarray(ar.num_out))
    np.testing.assert_array_equal(np.asarray(sp.out), np.asarray(ar.out))
    assert int(sp.accepted) > int(sp.steps)  # the drafts were accepted sometimes: the chain was verified


@pytest.mark.slow  # ~10 s; the loop's one-program property is checked in the default run with LongSpec
def test_no_recompilation_per_step():
    config, params = tiny_model()
    _, _, dels, dp, _ = drafters(config, params, s=4)
    gen = GenerateConfig(max_new_tokens=30, ignore_eos=True)
    before = engine.decode._cache_size()
    for prompt_len in (20, 50):
        prompt = jnp.asarray([list(np.resize([5, 9, 14, 20, 7], prompt_len)) + [0] * (64 - prompt_len)])
        state = engine.start(
            params, dp, config, dels, gen, prompt, jnp.array([prompt_len]), jax.random.key(0), capacity=320, chunk=32
        )
        for limit, (a, b) in zip((2, 5, 9), ((0.3, 0.3), (0.0, 0.0), (1.0, 0.5))):  # α, β are arrays
            state = engine.decode(params, with_weights(dp, a, b), config, dels, gen, state, jnp.int32(limit))
    assert engine.decode._cache_size() - before == 1


@pytest.mark.slow
@pytest.mark.parametrize("method", ["block", "dels"])
def test_real_smollm2_greedy_equals_ar(ours, method):
    """On the real model, a ~1K-token dev code prompt and the shipped GRU local head, the block drafter (the
    LongSpec draft as a block draft) and DeLS-Spec reproduce AR exactly."""
    from lsjax.engine.host import Generator
    from lsjax.methods import registry
    from lsjax.prompts import stdlib_code_prompt

    ids = ours.tokenizer.encode(stdlib_code_prompt(ours.tokenizer, 1024).text)
    gen = GenerateConfig(max_new_tokens=48, ignore_eos=True)
    drafter, dp = registry.build(method, ours, draft="longspec", block_size=6, local_head="gru")
    ar = Generator(ours.config, ours.params).run(ids, gen)
    sp = Generator(ours.config, ours.params, drafter, dp).run(ids, gen)
    assert sp.tokens == ar.tokens


def test_cli_bad_block_size_is_one_line():
    from tests.test_decode_cli import decode, one_error_line

    assert "--block-size" in one_error_line(decode("--prompt", "hi", "--method", "dels", "--block-size", "0"))


@pytest.mark.slow
def test_cli_missing_block_draft_or_local_head_is_one_line(tmp_path):
    from tests.test_decode_cli import decode, one_error_line

    missing = str(tmp_path / "none")
    assert "no block draft" in one_error_line(decode("--prompt", "hi", "--method", "block", "--draft", missing))
    line = one_error_line(
        decode("--prompt", "hi", "--method", "dels", "--block-draft", "longspec", "--local-head", missing)
    )
    assert "no local head" in line
