"""Batch-invariant numerics (`ModelConfig.invariant_rows`): a verification forward gives each node the same
logits, bit for bit, as AR computing that token alone, in fp32 and bf16. Without them the two differ in the
last bits (other GEMM row counts, another cache/tree split of the attention sum), which in bf16 on a GPU turned
near-tied greedy choices apart (docs/hardware/README.md)."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lsjax import attention
from lsjax.cache import KVCache, commit
from lsjax.config import ConfigError, DraftConfig, GenerateConfig, ModelConfig
from lsjax.engine import loop
from lsjax.engine.types import ARDrafter, invariant_rows_for
from lsjax.engine.verify import tapped_tree_forward, tree_forward
from lsjax.methods.auto.config import AutoPolicy
from lsjax.methods.auto.drafter import AutoDrafter
from lsjax.methods.longspec.drafter import LongSpecDrafter
from lsjax.methods.pld.drafter import PLDDrafter
from lsjax.models import target
from lsjax.tree import Tree, TreeConfig, ancestor_mask, parse_tree, root_only
from tests.test_speculative import repetitive_prompts, run
from tests.tiny import tiny_model

CHAIN = 6  # tokens AR decodes one by one and the tree holds on one path


def small(dtype: str, rows: int) -> tuple[ModelConfig, dict]:
    config = ModelConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=3, num_heads=4, num_kv_heads=2,
        head_dim=16, max_position=1024, name="tiny", dtype=dtype, invariant_rows=rows,
    )  # fmt: skip
    params = jax.tree.map(lambda a: a.astype(dtype), target.init_params(config, jax.random.key(0), scale=0.3))
    return config, target.prepare_for_decode(params, config)


def chain_in_a_tree(chain, rng) -> tuple[Tree, list[int]]:
    """The chain as one path of a tree whose other nodes sit between its nodes (so chain node d is not row d),
    and the rows of the chain's nodes."""
    toks, parents = [], []

    def add(tok, parent):
        toks.append(int(tok))
        parents.append(parent)
        return len(toks) - 1

    rows = [add(chain[0], -1)]
    for d in range(1, len(chain)):
        add(rng.integers(0, 256), rows[-1])  # a sibling of chain node d
        rows.append(add(chain[d], rows[-1]))
        add(rng.integers(0, 256), rows[-1] - 1)  # a child of that sibling
    T = len(toks)
    par = jnp.array([parents], jnp.int32)
    valid = jnp.ones((1, T), bool)
    mask = ancestor_mask(par, valid, T)
    depth = (jnp.sum(mask, -1) - 1).astype(jnp.int32)
    return Tree(jnp.array([toks], jnp.int32), par, depth, valid, mask), rows


def ar_and_verify_logits(dtype: str, rows: int, tapped: bool = False, backend: str = "auto"):
    config, params = small(dtype, rows)
    rng = np.random.default_rng(0)
    prompt = jnp.asarray(rng.integers(0, 256, (1, 256)), jnp.int32)
    cache = KVCache.zeros(config, 1, 512)
    _, cache = jax.jit(loop.prefill, static_argnames=("config",))(params, config, prompt, jnp.array([37]), cache)
    chain = rng.integers(0, 256, CHAIN)
    fwd = jax.jit(functools.partial(tree_forward, backend=backend), static_argnames=("config",))
    ar, c = [], cache
    for tok in chain:
        _, logits, k, v = fwd(params, config, root_only(jnp.array([tok], jnp.int32)), c)
        c = commit(c, k, v, jnp.array([1]))
        ar.append(np.asarray(logits[0, 0]))
    tree, at = chain_in_a_tree(chain, rng)
    if tapped:  # the forward cut between layers (what the streams drafter verifies with)
        tapped_fwd = jax.jit(
            functools.partial(tapped_tree_forward, layer=1, backend=backend), static_argnames=("config",)
        )
        logits = tapped_fwd(params, config, tree, cache)[2]
    else:
        logits = fwd(params, config, tree, cache)[1]
    return np.stack(ar), np.asarray(logits[0, np.array(at)])


@pytest.mark.parametrize("dtype", [pytest.param("float32", marks=pytest.mark.slow), "bfloat16"])
def test_verification_gives_each_node_ar_logits_bit_for_bit(dtype):
    ar, verified = ar_and_verify_logits(dtype, rows=24)
    np.testing.assert_array_equal(verified, ar)


@pytest.mark.parametrize("chunk", [pytest.param(64, marks=pytest.mark.slow), 16])  # 8 unrolled; 32 in a scan
def test_a_cache_read_in_chunks_keeps_ar_bits(chunk, monkeypatch):
    monkeypatch.setattr(attention, "INVARIANT_CHUNK", chunk)
    ar, verified = ar_and_verify_logits("float32", rows=24)
    np.testing.assert_array_equal(verified, ar)
    plain_ar, _ = ar_and_verify_logits("float32", rows=0)
    np.testing.assert_allclose(ar, plain_ar, rtol=0, atol=2e-4 * np.abs(plain_ar).max())


def test_the_bitwise_check_catches_plain_numerics():
    """The same comparison without invariant numerics: equal to ~1e-5, not bit for bit (what the test above
    would see from an attention or matmul whose bits depend on the step)."""
    ar, verified = ar_and_verify_logits("float32", rows=0)
    assert not np.array_equal(verified, ar)
    np.testing.assert_allclose(verified, ar, atol=1e-3)


def test_invariant_numerics_compute_the_same_model():
    """The invariant forward is the same function as the plain one up to fp32 rounding (equal bits between AR
    and verification alone would also hold for a wrong attention used by both)."""
    ar, verified = ar_and_verify_logits("float32", rows=24)
    plain_ar, plain_verified = ar_and_verify_logits("float32", rows=0)
    np.testing.assert_allclose(ar, plain_ar, rtol=0, atol=2e-4 * np.abs(plain_ar).max())
    np.testing.assert_allclose(verified, plain_verified, rtol=0, atol=2e-4 * np.abs(plain_ar).max())


def test_a_forward_cut_between_layers_keeps_ar_bits():
    ar, verified = ar_and_verify_logits("float32", rows=16, tapped=True)
    np.testing.assert_array_equal(verified, ar)


# auto exploring freely: its prompt-lookup candidates run too, not only its AR stretches
FREE_AUTO = AutoDrafter(pld_tokens=(3, 8), policy=AutoPolicy(budget=1.0, initial_slack=1e6), cost_profile="prior")


@pytest.mark.parametrize(
    "drafter",
    [
        PLDDrafter(num_tokens=5, ngram_max=3),
        FREE_AUTO,
        pytest.param(LongSpecDrafter(TreeConfig((3, 4, 4)), DraftConfig(window=8)), marks=pytest.mark.slow),
    ],
    ids=lambda d: d.name,
)
def test_bf16_speculative_output_equals_invariant_ar(drafter):
    """On the fewest rows the method fits (`--invariant-rows auto`), every forward it runs fits them (auto's
    candidates and stretches too) and its output is AR's on that count."""
    config, params = tiny_model()
    config = dataclasses.replace(config, dtype="bfloat16", invariant_rows=invariant_rows_for(drafter))
    params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
    gen = GenerateConfig(max_new_tokens=24, ignore_eos=True)
    prompts = repetitive_prompts(config, 3, 40, seed=1)
    ar = run(params, config, prompts, gen, ARDrafter())
    sp = run(params, config, prompts, gen, drafter)
    np.testing.assert_array_equal(np.asarray(sp.out), np.asarray(ar.out))
    assert config.invariant_rows == 16 and float(sp.mean_accepted) > 1.0


def test_invariant_rows_for_is_the_fewest_power_of_2_a_method_fits():
    assert invariant_rows_for(None) == invariant_rows_for(ARDrafter()) == 16
    assert invariant_rows_for(PLDDrafter(num_tokens=8)) == 16  # 9 nodes
    assert invariant_rows_for(PLDDrafter(num_tokens=16)) == 32  # 17 nodes
    paper = LongSpecDrafter(parse_tree("paper"), DraftConfig(window=8))
    assert paper.num_nodes == 69 and invariant_rows_for(paper) == 128
    auto = AutoDrafter(longspec=LongSpecDrafter(TreeConfig((2, 1, 1)), DraftConfig(window=8)))
    assert auto.num_nodes <= invariant_rows_for(auto) == 16


def test_a_tree_larger_than_the_rows_is_one_config_error():
    config, params = small("float32", rows=4)
    tree, _ = chain_in_a_tree(np.arange(3, 6), np.random.default_rng(0))  # 7 nodes
    cache = KVCache.zeros(config, 1, 64)
    with pytest.raises(ConfigError, match=r"^invariant_rows: a forward over 7 tree nodes does not fit 4 rows"):
        tree_forward(params, config, tree, cache)


@pytest.mark.parametrize("bad", [-1, 2000, 1.5])
def test_invariant_rows_is_validated(bad):
    with pytest.raises(ConfigError, match=r"^invariant_rows: must be an int in \[0, 1024\]"):
        ModelConfig(invariant_rows=bad)


def test_off_keeps_the_signature():
    """Profiles keyed by `ModelConfig.signature` before the fields existed (invariant_rows, qk_norm) stay valid."""
    config = ModelConfig()
    assert config.signature() != dataclasses.replace(config, invariant_rows=8).signature()
    assert config.signature() != dataclasses.replace(config, qk_norm=True).signature()
    import hashlib

    old_repr = repr(config).replace(", invariant_rows=0", "").replace(", qk_norm=False", "")
    assert "qk_norm" not in old_repr and "invariant_rows" not in old_repr
    assert config.signature() == hashlib.sha1(old_repr.encode()).hexdigest()[:12]


@pytest.mark.slow  # ~40 s (bf16 on a CPU)
def test_bf16_speculative_sampling_keeps_the_target_law_under_invariant_numerics():
    """The T=1 joint law of 4 tokens (tests/test_verify_sampling.py's check) with bf16 weights and invariant
    numerics: the LongSpec drafter's sampled trees padded to 16 rows sample the invariant target's law."""
    from lsjax.config import SamplingConfig
    from tests.test_verify_sampling import (
        DRAFTERS,
        PROMPT,
        N,
        distribution_pvalue,
        draft_params_for,
        exact_joint,
        sample_joint,
    )
    from tests.test_verify_sampling import model as sampling_model

    config, params = sampling_model()
    config = dataclasses.replace(config, dtype="bfloat16", invariant_rows=16)
    params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
    drafter, sampling = DRAFTERS["longspec"], SamplingConfig(temperature=1.0)
    probs = exact_joint(params, config, PROMPT, sampling)
    samples, hist = sample_joint(params, config, drafter, sampling, draft_params_for(params, config, drafter), n=N)
    assert hist[1:].sum() >= 0.2 * N, f"accepted-depth histogram {hist.tolist()}"
    p = distribution_pvalue(samples, probs)
    assert p > 1e-4, f"invariant bf16 speculative samples deviate from the target distribution (p={p:.2e})"


def test_a_spec_whose_tree_does_not_fit_the_rows_is_refused_before_tracing():
    """`SpecConfig` names the rows and the method's largest tree, so nothing is traced or compiled first
    (decode.py says the same of `--invariant-rows`, tests/test_decode_matrix.py)."""
    config, _ = tiny_model()
    rows8 = dataclasses.replace(config, invariant_rows=8)
    with pytest.raises(
        ConfigError, match=r"^SpecConfig.model.invariant_rows: 8 rows do not fit pld's largest tree of 9"
    ):
        loop.SpecConfig(rows8, GenerateConfig(8), PLDDrafter(num_tokens=8))
    loop.SpecConfig(rows8, GenerateConfig(8), PLDDrafter(num_tokens=7))  # 8 nodes fit 8 rows
