"""TokenSwift's tree: Cartesian head levels plus n-gram chains merged as a trie (no duplicate siblings), and
the verifier's walk reaching a chain's continuation below a merged node."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lsjax.config import SamplingConfig
from lsjax.engine.verify import accept
from lsjax.methods.tokenswift.tree import build_tree, union_config


def paths_of(tree, b):
    toks, par, valid = (np.asarray(x[b]) for x in (tree.tokens, tree.parents, tree.valid))
    out = []
    for n in range(1, len(toks)):
        if not valid[n]:
            continue
        path, j = [], n
        while j > 0:
            assert valid[j]
            path.append(int(toks[j]))
            j = par[j]
        out.append(tuple(path[::-1]))
    return out


@pytest.mark.parametrize(
    "topk,K,Dc",
    [
        ((1, 3, 2, 2), 5, 4),
        ((2, 2), 4, 3),
        pytest.param((3, 1, 2), 0, 0, marks=pytest.mark.slow),
        pytest.param((2,), 3, 3, marks=pytest.mark.slow),
    ],
)
def test_union_tree_is_the_trie_of_every_proposal(topk, K, Dc):
    rng = np.random.RandomState(sum(topk) + K)
    B, V = 4, 4  # a small vocabulary: chains collide with heads and with each other
    root = jnp.asarray(rng.randint(0, V, size=B))
    cands = [jnp.asarray(np.stack([rng.permutation(V)[:k] for _ in range(B)])) for k in topk]
    chains = rng.randint(0, V, size=(B, K, Dc))
    if K:  # some chains start on the head's best token
        chains[:, ::2, 0] = np.asarray(cands[0])[:, :1]
    found = rng.rand(B, K) > 0.3
    tree = build_tree(root, cands, topk, jnp.asarray(chains) if K else None, jnp.asarray(found) if K else None)
    assert tree.tokens.shape[1] == union_config(topk, K, Dc).num_nodes
    for b in range(B):
        want = set()
        for combo in itertools.product(*[range(k) for k in topk]):
            path = tuple(int(cands[d][b, combo[d]]) for d in range(len(topk)))
            want |= {path[: i + 1] for i in range(len(path))}
        for c in range(K):
            if found[b, c]:
                want |= {tuple(chains[b, c, : i + 1].tolist()) for i in range(Dc)}
        got = paths_of(tree, b)
        assert len(got) == len(set(got)), "two valid nodes hold the same path"
        assert set(got) == want


def test_the_walk_follows_a_chain_below_a_merged_node():
    # Heads: root -> 5 -> {6, 7}. Chain (5, 8, 9): its 5 merges into the head node, 8 and 9 hang below it.
    root = jnp.asarray([1])
    tree = build_tree(
        root, [jnp.asarray([[5]]), jnp.asarray([[6, 7]])], (1, 2), jnp.asarray([[[5, 8, 9]]]), jnp.asarray([[True]])
    )
    V = 12
    logits = jnp.zeros((1, tree.tokens.shape[1], V))
    want = {1: 5, 5: 8, 8: 9, 9: 3}  # the target's greedy continuation after each token
    for n in range(tree.tokens.shape[1]):
        logits = logits.at[0, n, want.get(int(tree.tokens[0, n]), 0)].set(9.0)
    path, num, bonus = accept(tree, logits, SamplingConfig(), jax.random.key(0), 3)
    assert int(num[0]) == 3 and int(bonus[0]) == 3
    assert [int(tree.tokens[0, i]) for i in np.asarray(path[0])] == [1, 5, 8, 9]


def test_sampled_tree_marks_head_nodes_with_their_childrens_q():
    """Head nodes carry their children's level q and are marked sampled; chain nodes are deterministic; a draw
    past q's support (invalid) is not a node, and a chain holding that token becomes a node of its own."""
    topk = (2, 2)
    level_logq = jnp.log(jnp.asarray([[[0.5, 0.5, 0, 0, 0, 0], [0.1, 0.2, 0.3, 0.4, 0, 0]]]))  # [B, 2, V]
    cands = [jnp.asarray([[1, 0]]), jnp.asarray([[3, 5]])]
    ok = [jnp.asarray([[True, True]]), jnp.asarray([[True, False]])]  # token 5 has q = 0: an invalid draw
    chains = jnp.asarray([[[1, 5], [0, 2]]])
    tree = build_tree(jnp.asarray([4]), cands, topk, chains, jnp.asarray([[True, True]]), ok, level_logq)
    # Layout: level 1 = heads 1, 2 + chain slots 3, 4; level 2 = heads 5..8 + chain slots 9, 10.
    assert set(paths_of(tree, 0)) == {(1,), (0,), (1, 3), (0, 3), (1, 5), (0, 2)}
    valid, sampled = np.asarray(tree.valid[0]), np.asarray(tree.sampled[0])
    assert np.flatnonzero(valid).tolist() == [0, 1, 2, 5, 7, 9, 10]
    assert np.flatnonzero(sampled).tolist() == [1, 2, 5, 7]
    q = np.exp(np.asarray(tree.logq[0]))
    np.testing.assert_allclose(q[0], np.exp(level_logq[0, 0]), atol=1e-6)
    np.testing.assert_allclose(q[[1, 2]], np.exp(level_logq[0, [1, 1]]), atol=1e-6)
    assert np.all(q[[5, 7, 9, 10]] == 0)  # leaves and chain nodes have no sampled children
