"""EAGLE-3 (`lsjax.methods.eagle3`): parity with the reference implementation, losslessness, the published
layouts and their misuse."""

from __future__ import annotations

import json
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lsjax.cache import KVCache
from lsjax.config import ModelConfig
from lsjax.engine.types import DraftContext
from lsjax.methods.eagle3 import model as em
from lsjax.methods.eagle3.checkpoint import read_draft
from lsjax.methods.eagle3.drafter import Eagle3Drafter, Eagle3State, Eagle3Tree

FIXTURES = Path(__file__).parent / "fixtures" / "eagle3"


def fixture_target(name: str) -> ModelConfig:
    hf = json.loads((FIXTURES / name / "config.json").read_text())
    return ModelConfig(
        vocab_size=hf["vocab_size"],
        hidden_size=hf.get("target_hidden_size", hf["hidden_size"]),
        num_layers=8,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        eos_token_ids=(),
        pad_token_id=0,
    )


def _round(drafter, ctx, dcache, hidden, pairs, start):
    n = pairs.shape[0]
    pos = jnp.asarray(start + np.arange(n))[None]
    aux, pairs = jnp.asarray(hidden)[None], jnp.asarray(pairs)[None]
    h, dcache = drafter._commit_pairs(ctx, dcache, aux, pairs, pos, jnp.array([n]))
    return h, Eagle3State(dcache, h[:, -1])


@pytest.mark.parametrize("name", ["llama", "qwen"])
def test_draft_matches_the_reference_implementation(name):
    """Logits at every prompt pair, at the first draft step and at every expansion inside the tree, within
    1e-4 of SafeAILab/EAGLE's (`scripts/eagle3_reference_fixtures.py`), and the same trees, twice: after the
    prompt and after a round whose accepted pairs joined the draft's cache."""
    ref = np.load(FIXTURES / f"{name}.npz")
    target = fixture_target(name)
    cfg, params, info = read_draft(FIXTURES / name, target)
    assert info.format == "eagle"
    nodes, depth, top_k = (int(x) for x in ref["budget"])
    drafter = Eagle3Drafter(cfg, Eagle3Tree(nodes, depth, top_k))
    params = jax.tree.map(jnp.asarray, params)
    ctx = DraftContext({}, params, target, capacity=64)
    ids, n = ref["ids"], ref["hidden"].shape[0]
    h, ds = _round(drafter, ctx, KVCache.zeros(cfg.layer, 1, 64), ref["hidden"], ids[1:], 0)
    np.testing.assert_allclose(np.asarray(em.logits(params, cfg, h))[0], ref["logits_prompt"], atol=1e-4, rtol=0)
    for r, (root, hidden, pairs, start) in enumerate(
        [(ids[-1], None, None, None), (ref["ids2"][-1], ref["hidden2"], ref["ids2"][n + 1 :], n)], start=1
    ):
        if hidden is not None:
            _, ds = _round(drafter, ctx, ds.cache, hidden, pairs, start)
        _, _, _, heads = drafter.grow(ctx, ds)
        want = [ref[f"head_{r}_{i}"] for i in range(depth)]
        for i, (got, exp) in enumerate(zip(heads, want)):
            got = np.asarray(got)[0].reshape(exp.shape)
            np.testing.assert_allclose(got, exp, atol=1e-4, rtol=0, err_msg=f"step {i}")
        tree = drafter.propose(ctx, types.SimpleNamespace(root=jnp.array([root])), ds)
        assert bool(np.all(np.asarray(tree.valid)))
        np.testing.assert_array_equal(np.asarray(tree.tokens)[0], ref[f"tokens_{r}"])
        np.testing.assert_array_equal(np.asarray(tree.depth)[0], ref[f"positions_{r}"])
        np.testing.assert_array_equal(np.asarray(tree.mask)[0], ref[f"mask_{r}"])
