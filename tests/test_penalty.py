"""The contextual penalty (TokenSwift §3.4): lsjax's masks and filters against numpy references, and AR and
speculative decoding sampling from the same penalized distribution (greedy here; T > 0 in
tests/test_verify_sampling.py)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lsjax.config import ConfigError, DraftConfig, GenerateConfig, SamplingConfig
from lsjax.engine.types import ARDrafter, Drafter
from lsjax.methods.hybrid.drafter import HybridDrafter
from lsjax.methods.longspec.drafter import LongSpecDrafter
from lsjax.methods.pld.drafter import PLDDrafter
from lsjax.models import target
from lsjax.sampling import processed_logprobs, sample, tree_penalty_mask
from lsjax.tree import TreeConfig, make_tree
from tests.filters_ref import reference_probs
from tests.test_sampling_filters import tied_logits
from tests.test_speculative import RandomTreeDrafter, repetitive_prompts, run
from tests.tiny import tiny_model

CONFIGS = [
    SamplingConfig(temperature=1.0, penalty=1.3),
    SamplingConfig(temperature=0.7, top_k=5, penalty=2.0),
    SamplingConfig(temperature=1.0, min_p=0.1, penalty=1.2),
    SamplingConfig(temperature=1.3, top_p=0.8, penalty=0.7),  # < 1 favours repeats: allowed, as in HF
    SamplingConfig(temperature=0.0, penalty=1.5),
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_penalized_distribution_matches_the_numpy_reference(cfg):
    rng = np.random.default_rng(0)
    logits = tied_logits(rng)
    mask = rng.random(logits.shape) < 0.3
    ours = np.exp(np.asarray(processed_logprobs(jnp.asarray(logits), cfg, jnp.asarray(mask)), np.float64))
    for row, m, got in zip(logits, mask, ours):
        ref = reference_probs(row, cfg.temperature, cfg.top_k, cfg.top_p, cfg.min_p, cfg.penalty, np.flatnonzero(m))
        np.testing.assert_allclose(got, ref, atol=2e-6)
    if cfg.greedy:  # sample() agrees with the one-hot distribution
        toks = np.asarray(sample(jax.random.key(0), jnp.asarray(logits), cfg, jnp.asarray(mask)))
        np.testing.assert_array_equal(toks, ours.argmax(-1))
    # The penalty changes something (so the comparison above can fail).
    plain = np.exp(np.asarray(processed_logprobs(jnp.asarray(logits), dataclasses.replace(cfg, penalty=1.0))))
    assert not np.allclose(plain, ours, atol=1e-3)


def test_penalty_needs_the_window_and_validates():
    with pytest.raises(ValueError, match="penalty"):
        processed_logprobs(jnp.zeros((2, 5)), SamplingConfig(temperature=1.0, penalty=1.2))
    with pytest.raises(ConfigError, match="penalty:"):
        SamplingConfig(penalty=0.0)
    with pytest.raises(ConfigError, match="penalty_window"):
        SamplingConfig(penalty=1.2, penalty_window=0)
    processed_logprobs(jnp.zeros((2, 5)), SamplingConfig(temperature=1.0))  # off: no window needed


def brute_force_windows(history, length, tokens, parents, valid, window, vocab):
    """[T, V] for one row: the last `window` tokens of (generation, path from the root's child to the node)."""
    T = len(tokens)
    out = np.zeros((T, vocab), bool)
    for n in range(T):
        if not valid[n]:
            continue
        path, j = [], n
        while j > 0:
            path.append(tokens[j])
            j = parents[j]
        seq = list(history[:length]) + path[::-1]
        out[n, seq[-window:] if window <= len(seq) else seq] = True
    return out


@pytest.mark.parametrize("window", [1, 2, 3, 7, 40])
def test_tree_penalty_mask_matches_brute_force(window):
    rng = np.random.RandomState(window)
    V, B, M = 13, 3, 24
    tree_cfg = TreeConfig((3, 4, 4, 2))
    offsets = tree_cfg.level_offsets()
    T = tree_cfg.num_nodes
    history = rng.randint(0, V, size=(B, M))
    length = np.array([1, 9, M])
    parents = np.full((B, T), -1)
    for b in range(B):
        for d, w in enumerate(tree_cfg.widths):
            lo, hi = offsets[d], offsets[d] + (1 if d == 0 else tree_cfg.widths[d - 1])
            parents[b, offsets[d + 1] : offsets[d + 1] + w] = rng.randint(lo, hi, size=w)
    tokens = rng.randint(0, V, size=(B, T))
    tokens[:, 0] = history[np.arange(B), length - 1]  # the root is the last generated token
    valid = rng.rand(B, T) > 0.15
    valid[:, 0] = True
    for i in range(1, T):
        valid[:, i] &= valid[np.arange(B), parents[:, i]]
    tree = make_tree(jnp.asarray(tokens), jnp.asarray(parents), jnp.asarray(valid), tree_cfg)
    got = tree_penalty_mask(
        jnp.asarray(history), jnp.asarray(length), tree.tokens, tree.mask, tree.depth, window, V, tree_cfg.depth
    )
    for b in range(B):
        want = brute_force_windows(history[b], length[b], tokens[b], parents[b], valid[b], window, V)
        np.testing.assert_array_equal(np.asarray(got[b])[valid[b]], want[valid[b]])


def numpy_greedy_ar(params, config, prompt, n, penalty, window):
    """Greedy AR with the penalty, re-running the whole sequence each step and penalizing in numpy."""

    def logits_of(t):
        h, _, _ = target.forward_hidden(params, config, t, jnp.arange(t.shape[1])[None], _cache(config))
        return target.lm_head(params, config, h)

    fwd = jax.jit(logits_of)
    seq, gen = list(prompt), []
    for _ in range(n):
        logits = np.asarray(fwd(jnp.asarray([seq + [0] * (96 - len(seq))]))[0, len(seq) - 1], np.float64)
        probs = reference_probs(logits, 0.0, penalty=penalty, penalized=gen[-window:])
        gen.append(int(np.argmax(probs)))
        seq.append(gen[-1])
    return gen


def _cache(config):
    from lsjax.cache import KVCache

    return KVCache.zeros(config, 1, 0)


PENALTY = SamplingConfig(penalty=1.8, penalty_window=5)
DRAFTERS = [
    PLDDrafter(num_tokens=5, ngram_max=3),
    RandomTreeDrafter(TreeConfig((4, 4, 3)), vocab=97),
    LongSpecDrafter(TreeConfig((3, 4, 4)), DraftConfig(window=8)),
    HybridDrafter(LongSpecDrafter(TreeConfig((2, 1)), DraftConfig(window=8)), PLDDrafter(num_tokens=4)),
]


@pytest.mark.slow
@pytest.mark.parametrize("drafter", DRAFTERS, ids=lambda d: f"{d.name}-{d.tree.widths}")
def test_greedy_speculative_with_the_penalty_equals_ar(drafter):
    config, params = tiny_model()
    gen = GenerateConfig(max_new_tokens=24, ignore_eos=True, sampling=PENALTY)
    prompts = repetitive_prompts(config, 4, 40, seed=1)
    ar = run(params, config, prompts, gen, ARDrafter())
    sp = run(params, config, prompts, gen, drafter)
    np.testing.assert_array_equal(np.asarray(sp.out), np.asarray(ar.out))


@dataclasses.dataclass(frozen=True)
class OracleDrafter(Drafter):
    """Proposes AR's own continuation (`future` [B, N], precomputed) as a chain, each node with a decoy
    sibling: every oracle node is accepted, so the bonus tokens come from windows deep in the tree."""

    future: tuple = ()
    depth: int = 4
    vocab: int = 97
    name = "oracle"

    @property
    def tree(self) -> TreeConfig:
        return TreeConfig((2,) * self.depth)

    def propose(self, ctx, state, draft_state, key):
        B, D = state.root.shape[0], self.depth
        fut = jnp.asarray(self.future + ((0,) * D,) * 0, jnp.int32)
        fut = jnp.concatenate([fut, jnp.zeros((B, D), jnp.int32)], axis=1)
        good = jax.vmap(lambda f, i: jax.lax.dynamic_slice_in_dim(f, i, D))(fut, state.num_out)  # [B, D]
        tokens = jnp.stack([good, (good + 1) % self.vocab], axis=2).reshape(B, 2 * D)
        tokens = jnp.concatenate([state.root[:, None], tokens], axis=1)
        parents = np.concatenate([[-1, 0, 0], np.repeat(1 + 2 * np.arange(D - 1), 2)])
        parents = jnp.broadcast_to(jnp.asarray(parents, jnp.int32), tokens.shape)
        return make_tree(tokens, parents, jnp.ones(tokens.shape, bool), self.tree)


def _oracle_run(window: int):
    config, params = tiny_model()
    sampling = SamplingConfig(penalty=1.8, penalty_window=window)
    gen = GenerateConfig(max_new_tokens=24, ignore_eos=True, sampling=sampling)
    prompts = repetitive_prompts(config, 3, 40, seed=2)
    ar = run(params, config, prompts, gen, ARDrafter())
    future = tuple(tuple(int(t) for t in row) for row in np.asarray(ar.out))
    sp = run(params, config, prompts, gen, OracleDrafter(future))
    return ar, sp


@pytest.mark.parametrize("window", [5, pytest.param(2, marks=pytest.mark.slow)])
def test_penalty_windows_follow_the_path_inside_the_tree(window):
    """AR with the penalty equals a numpy reference; an oracle tree then has every oracle node accepted (5
    tokens per step), so most tokens are sampled at depth >= 1 with a window that ends inside the tree
    (window 2 < depth 4 even drops all committed tokens), and the output is still AR's."""
    ar, sp = _oracle_run(window)
    config, params = tiny_model()
    prompt = repetitive_prompts(config, 3, 40, seed=2)[0]
    assert np.asarray(ar.out[0]).tolist() == numpy_greedy_ar(params, config, list(prompt), 24, 1.8, window)
    np.testing.assert_array_equal(np.asarray(sp.out), np.asarray(ar.out))
    assert int(sp.steps) == -(-23 // 5)
    plain = GenerateConfig(max_new_tokens=24, ignore_eos=True)
    assert np.asarray(run(params, config, [prompt], plain, ARDrafter()).out[0]).tolist() != ar.out[0].tolist()


@pytest.mark.slow
def test_a_window_that_ignores_the_path_is_caught(monkeypatch):
    """The test above can fail: verification that penalizes only the committed tokens (the official code's
    shortcut) diverges from AR."""
    from lsjax.engine import verify

    real = verify.tree_penalty_mask

    def committed_only(history, length, tokens, ancestors, depth, window, vocab, max_depth, query_depth=None):
        return real(history, length, tokens, ancestors & False, depth, window, vocab, max_depth, jnp.zeros_like(depth))

    monkeypatch.setattr(verify, "tree_penalty_mask", committed_only)
    jax.clear_caches()  # the jitted engine traced with the real windows must not be reused (nor kept after)
    try:
        ar, sp = _oracle_run(5)
    finally:
        jax.clear_caches()
    assert not np.array_equal(np.asarray(sp.out), np.asarray(ar.out))
