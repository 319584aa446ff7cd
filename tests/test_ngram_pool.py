"""TokenSwift's n-gram pool against a plain Python reference (dict of counts, first-appearance order)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from lsjax.methods.tokenswift.ngram_pool import history_append, history_init, pool_topk


class RefPool:
    def __init__(self, n):
        self.n, self.counts, self.order = n, {}, []

    def add(self, gram, capacity):
        gram = tuple(gram)
        if gram in self.counts:
            self.counts[gram] += 1
        elif len(self.order) < capacity:
            self.counts[gram] = 1
            self.order.append(gram)

    def topk(self, first, k):
        cands = [g for g in self.order if g[0] == first]
        cands.sort(key=lambda g: (-self.counts[g], self.order.index(g)))
        return cands[:k]


def ref_history(tokens, n, lag, capacity):
    """The pool after feeding `tokens` with the lag: every n-gram ending >= lag tokens before the end."""
    pool = RefPool(n)
    for s in range(max(len(tokens) - n - lag + 1, 0)):
        pool.add(tokens[s : s + n], capacity)
    return pool


def check(hist, refs, n, k, vocab):
    for first in range(vocab):
        grams, found = pool_topk(hist.pool, jnp.full((len(refs),), first, jnp.int32), k)
        for b, ref in enumerate(refs):
            got = [tuple(g) for g, f in zip(np.asarray(grams[b]).tolist(), np.asarray(found[b])) if f]
            assert got == ref.topk(first, k), (b, first)


def test_pool_matches_the_python_reference():
    rng = np.random.RandomState(0)
    V, n, k, B, P, M = 6, 3, 4, 3, 40, 200
    # Small vocabularies and motifs: many repeats, many ties.
    rows = [rng.randint(0, V, size=M), np.resize(rng.randint(0, V, size=7), M), np.resize([1, 2, 3], M)]
    lengths = np.array([P, 25, 2])
    capacity = 64
    for lag in (0, 5):
        prompt = jnp.asarray(np.stack([r[:P] for r in rows]), jnp.int32)
        hist = history_init(prompt, jnp.asarray(lengths, jnp.int32), n, lag, M, capacity)
        seen = [list(r[:L]) for r, L in zip(rows, lengths)]
        check(hist, [ref_history(s, n, lag, capacity) for s in seen], n, k, V)
        step = jax.jit(lambda h, new, c, lag=lag: history_append(h, new, c, n, lag))
        for _ in range(12):
            count = rng.randint(1, 5, size=B)
            new = np.zeros((B, 4), np.int32)
            for b in range(B):
                L = len(seen[b])
                new[b, : count[b]] = rows[b][L : L + count[b]]
                seen[b] += list(rows[b][L : L + count[b]])
            hist = step(hist, jnp.asarray(new), jnp.asarray(count, jnp.int32))
        check(hist, [ref_history(s, n, lag, capacity) for s in seen], n, k, V)
        assert np.asarray(hist.length).tolist() == [len(s) for s in seen]


def test_a_full_pool_keeps_counting_known_ngrams():
    n, capacity = 2, 3
    tokens = [0, 1, 0, 1, 2, 3, 4, 0, 1]  # (0,1) x3, (1,0), (1,2), then (2,3) (3,4) (4,0) do not fit
    hist = history_init(jnp.asarray([tokens]), jnp.asarray([len(tokens)]), n, 0, 16, capacity)
    ref = ref_history(tokens, n, 0, capacity)
    check(hist, [ref], n, 3, 5)
    assert int(hist.pool.size[0]) == 3 and int(hist.pool.counts[0, 0]) == 3
