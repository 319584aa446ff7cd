"""Hybrid tree attention: every backend of `lsjax.attention` against the naive masked attention.

The naive `hybrid_attention_reference` (concatenate cache and tree keys, full [T, S + T] mask, one softmax)
is the oracle. Each backend runs the same cases through a test class, the way jax's own Pallas tests do:
`TestXla`, `TestReference`, `TestPallasInterpret` (the Mosaic TPU variant of the kernels) and
`TestPallasGpuInterpret` (the Triton variant), both with INTERPRET = True since Pallas only runs in interpret
mode on CPU; on a TPU/GPU machine a subclass with INTERPRET = False runs the compiled kernels. Whether the
kernels lower for TPU and CUDA is tests/test_lowering.py.

    pytest tests/test_attention.py            # default grid, ~2 min on 2 CPU cores
    pytest tests/test_attention.py -m slow    # the full sweep: GQA 1/3/4/8 x head dim 64/128 x tree size
                                              # 1/5/16/69/128 x tree/chain x fp32/bf16 (interpret mode: ~10+ min)
"""

from __future__ import annotations

import dataclasses
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lsjax import attention
from pallas_kernels import prefix_attention as pk
from pallas_kernels import tree_attention as tk

ATOL = {jnp.float32: 1e-5, jnp.bfloat16: 2e-2}


def random_tree_masks(rng: np.random.Generator, batch: int, size: int) -> np.ndarray:
    """Ancestor masks (incl. self) of random trees whose parents precede their children. [B, T, T] bool."""
    masks = np.zeros((batch, size, size), bool)
    for b in range(batch):
        parent = [-1] + [int(rng.integers(0, i)) for i in range(1, size)]
        for i in range(size):
            masks[b, i, i] = True
            if parent[i] >= 0:
                masks[b, i] |= masks[b, parent[i]]
    return masks


@dataclasses.dataclass(frozen=True)
class Case:
    batch: int
    tree: int  # T
    heads: int  # N
    kv_heads: int  # K
    head_dim: int  # H
    capacity: int  # S
    lengths: tuple[int, ...]
    chain: bool = False  # causal=True instead of a random tree mask
    window: tuple[int, ...] | None = None
    dtype: type = jnp.float32

    def __str__(self):
        kind = "chain" if self.chain else "tree"
        win = f"-win{list(self.window)}" if self.window else ""
        return (
            f"B{self.batch}-T{self.tree}-N{self.heads}K{self.kv_heads}-H{self.head_dim}-S{self.capacity}"
            f"-len{list(self.lengths)}{win}-{kind}-{jnp.dtype(self.dtype).name}"
        )


def make_inputs(case: Case, seed: int = 0):
    rng = np.random.default_rng(seed)
    B, T, N, K, H, S = case.batch, case.tree, case.heads, case.kv_heads, case.head_dim, case.capacity

    def normal(*shape):
        return jnp.asarray(rng.standard_normal(shape, dtype=np.float32)).astype(case.dtype)

    q = normal(B, T, N, H)
    cache_k, cache_v = normal(B, K, S, H), normal(B, K, S, H)  # heads-major cache
    tree_k, tree_v = normal(B, T, K, H), normal(B, T, K, H)
    lengths = jnp.asarray(case.lengths, jnp.int32)
    window = None if case.window is None else jnp.asarray(case.window, jnp.int32)
    mask = None if case.chain else jnp.asarray(random_tree_masks(rng, B, T))
    return q, cache_k, cache_v, lengths, tree_k, tree_v, mask, window


# The default grid: every axis of the brief is hit at least once, each case costs ~1-3 s per backend.
FAST_CASES = [
    Case(2, 5, 4, 4, 64, 300, (0, 1)),  # GQA 1, empty and one-token caches
    Case(2, 16, 9, 3, 64, 1000, (777, 1000), chain=True, window=(0, 300)),  # GQA 3, rows differ, window
    Case(2, 69, 8, 2, 128, 8192, (8192, 5003)),  # GQA 4, 8K cache, not a multiple of any block
    Case(1, 128, 8, 1, 128, 600, (517,), chain=True),  # GQA 8, biggest tree
    Case(1, 1, 9, 3, 64, 8192, (8191,)),  # tree of size 1 over a long cache
    Case(2, 16, 9, 3, 64, 1000, (999, 130), window=(100, 0), dtype=jnp.bfloat16),
    Case(1, 69, 8, 2, 128, 2048, (1500,), chain=True, dtype=jnp.bfloat16),
]


def _slow_cases():
    gqa = [(4, 4), (9, 3), (8, 2), (8, 1)]
    length_sets = [((0, 0), 64), ((1, 0), 64), ((1000, 333), 1000), ((8192, 4097), 8192)]
    cases = []
    for i, ((n, k), h, t, chain, dtype) in enumerate(
        itertools.product(gqa, (64, 128), (1, 5, 16, 69, 128), (False, True), (jnp.float32, jnp.bfloat16))
    ):
        lengths, cap = length_sets[i % len(length_sets)]
        window = (min(lengths[0], 17), 0) if i % 3 == 0 else None
        cases.append(Case(2, t, n, k, h, cap, lengths, chain=chain, window=window, dtype=dtype))
    return cases


SLOW_CASES = _slow_cases()


@functools.cache
def _jit(fn, **static):
    return jax.jit(functools.partial(fn, **static))


def assert_close(actual, expected, atol, what=""):
    actual, expected = np.asarray(actual, np.float32), np.asarray(expected, np.float32)
    assert not np.isnan(actual).any(), f"{what}: NaN in output"
    np.testing.assert_allclose(actual, expected, atol=atol, rtol=0, err_msg=what)


def assert_lse_close(actual, expected, atol, what=""):
    actual, expected = np.asarray(actual), np.asarray(expected)
    np.testing.assert_array_equal(np.isneginf(actual), np.isneginf(expected), err_msg=f"{what}: -inf pattern")
    finite = np.isfinite(expected)
    np.testing.assert_allclose(actual[finite], expected[finite], atol=atol, rtol=0, err_msg=what)


class AttentionTestBase:
    """The same checks for every backend; subclasses pick the backend (and Pallas' interpret mode)."""

    BACKEND = "xla"
    INTERPRET = False
    PLATFORM = "tpu"  # the kernel variant (Pallas backends only)
    # Small Pallas blocks so that split-K, several key blocks per split and several query blocks all run.
    PREFIX_TUNING = pk.PrefixTuning(block_k=128, block_s=512)
    TREE_TUNING = tk.TreeTuning(block_rows=32, block_k=32)

    # Everything runs under jit: op-by-op dispatch compiles every primitive separately and costs more than the math.
    def prefix(self, q, k, v, lengths, window=None):
        if self.BACKEND == "pallas":
            return pk.prefix_attention(
                q, k, v, lengths, window, tuning=self.PREFIX_TUNING, platform=self.PLATFORM, interpret=self.INTERPRET
            )
        return _jit(attention.prefix_attention, backend=self.BACKEND)(q, k, v, lengths, window)

    def tree(self, q, k, v, mask, causal):
        if self.BACKEND == "pallas":
            return tk.tree_attention(
                q, k, v, mask, causal=causal, tuning=self.TREE_TUNING, platform=self.PLATFORM, interpret=self.INTERPRET
            )
        return _jit(attention.tree_attention, causal=causal, backend=self.BACKEND)(q, k, v, mask)

    def hybrid(self, q, cache_k, cache_v, lengths, tree_k, tree_v, mask, window, causal):
        out_p, lse_p = self.prefix(q, cache_k, cache_v, lengths, window)
        out_t, lse_t = self.tree(q, tree_k, tree_v, mask, causal)
        return _jit(attention.merge_attention)(out_p, lse_p, out_t, lse_t)

    def check_case(self, case: Case):
        q, ck, cv, lengths, tk_, tv, mask, window = make_inputs(case)
        atol = ATOL[case.dtype]
        want_out, want_lse = _jit(attention.hybrid_attention_reference, causal=case.chain)(
            q, ck, cv, lengths, tk_, tv, mask, window_start=window
        )
        out, lse = self.hybrid(q, ck, cv, lengths, tk_, tv, mask, window, case.chain)
        assert out.dtype == q.dtype and out.shape == q.shape
        assert lse.dtype == jnp.float32 and lse.shape == q.shape[:3]
        assert_close(out, want_out, atol, f"{self.BACKEND} {case} out")
        assert_lse_close(lse, want_lse, 1e-4 if case.dtype == jnp.float32 else 2e-2, f"{self.BACKEND} {case} lse")
        if self.BACKEND != "pallas":  # the public entry point (pallas: see test_dispatch_through_lsjax_attention)
            public = _jit(attention.hybrid_tree_attention, causal=case.chain, backend=self.BACKEND)(
                q, ck, cv, lengths, tk_, tv, mask, window_start=window
            )
            assert_close(public, want_out, atol, f"{self.BACKEND} {case} hybrid_tree_attention")
        # The prefix part alone against its own naive reference (tests lse and -inf rows of empty caches).
        p_out, p_lse = self.prefix(q, ck, cv, lengths, window)
        r_out, r_lse = _jit(pk.prefix_attention_reference)(q, ck, cv, lengths, window)
        assert_close(p_out, r_out, atol, f"{self.BACKEND} {case} prefix out")
        assert_lse_close(p_lse, r_lse, 1e-4 if case.dtype == jnp.float32 else 2e-2, f"{self.BACKEND} {case} prefix")

    @pytest.mark.parametrize("case", FAST_CASES, ids=str)
    def test_hybrid_matches_naive(self, case):
        self.check_case(case)

    @pytest.mark.slow
    @pytest.mark.parametrize("case", SLOW_CASES, ids=str)
    def test_hybrid_matches_naive_sweep(self, case):
        try:
            self.check_case(case)
        finally:
            # Hundreds of distinct shapes in one process: drop compiled executables as we go (a full sweep
            # that kept them all once died in XLA's compiler after ~400 cases).
            jax.clear_caches()

    def test_empty_cache_is_tree_only_exactly(self):
        case = Case(2, 16, 9, 3, 64, 256, (0, 0))
        q, ck, cv, lengths, tk_, tv, mask, _ = make_inputs(case, seed=1)
        out, lse = self.hybrid(q, ck, cv, lengths, tk_, tv, mask, None, False)
        t_out, t_lse = self.tree(q, tk_, tv, mask, False)
        # The prefix has lse = -inf everywhere: the merge must hand the tree part through bit for bit.
        np.testing.assert_array_equal(np.asarray(out), np.asarray(t_out))
        np.testing.assert_array_equal(np.asarray(lse), np.asarray(t_lse))
        want, _ = tk.tree_attention_reference(q, tk_, tv, mask)
        assert_close(out, want, 1e-5, "empty cache vs tree reference")

    def test_tree_of_one_is_decode_attention(self):
        case = Case(2, 1, 8, 2, 64, 777, (777, 300))
        q, ck, cv, lengths, tk_, tv, mask, _ = make_inputs(case, seed=2)
        out, _ = self.hybrid(q, ck, cv, lengths, tk_, tv, mask, None, False)
        # Plain decode: the new token's key appended at position `length`, one softmax over length + 1 keys.
        for b, n in enumerate(case.lengths):
            keys = jnp.concatenate([ck[b, :, :n].swapaxes(0, 1), tk_[b]], axis=0)  # [n + 1, K, H]
            vals = jnp.concatenate([cv[b, :, :n].swapaxes(0, 1), tv[b]], axis=0)
            kh = jnp.repeat(keys, 4, axis=1)  # [n + 1, N, H]
            vh = jnp.repeat(vals, 4, axis=1)
            p = jax.nn.softmax(jnp.einsum("nh,snh->ns", q[b, 0], kh) * 64**-0.5, axis=-1)
            assert_close(out[b, 0], jnp.einsum("ns,snh->nh", p, vh), 1e-5, f"decode row {b}")

    def test_tree_rows_that_see_nothing(self):
        case = Case(1, 24, 4, 2, 64, 64, (0,))
        q, _, _, _, tk_, tv, mask, _ = make_inputs(case, seed=3)
        mask = mask.at[:, 5, :].set(False).at[:, 17, :].set(False)
        out, lse = self.tree(q, tk_, tv, mask, False)
        assert np.all(np.asarray(out[:, [5, 17]]) == 0)
        assert np.all(np.isneginf(np.asarray(lse[:, [5, 17]])))
        want, want_lse = tk.tree_attention_reference(q, tk_, tv, mask)
        assert_close(out, want, 1e-5, "tree with blind rows")
        assert_lse_close(lse, want_lse, 1e-5, "tree with blind rows")

    def test_rectangular_mask(self):
        """The draft's frontier: T queries over Tk != T tree nodes (more keys, and fewer)."""
        rng = np.random.default_rng(9)
        for t, tk_len in ((16, 69), (37, 5)):
            q = jnp.asarray(rng.standard_normal((2, t, 9, 64), dtype=np.float32))
            k = jnp.asarray(rng.standard_normal((2, tk_len, 3, 64), dtype=np.float32))
            v = jnp.asarray(rng.standard_normal((2, tk_len, 3, 64), dtype=np.float32))
            mask = jnp.asarray(rng.random((2, t, tk_len)) < 0.3).at[:, 3, :].set(False)
            out, lse = self.tree(q, k, v, mask, False)
            want, want_lse = tk.tree_attention_reference(q, k, v, mask)
            assert out.shape == q.shape and lse.shape == q.shape[:3]
            assert_close(out, want, 1e-5, f"rectangular T={t} Tk={tk_len}")
            assert_lse_close(lse, want_lse, 1e-5, f"rectangular T={t} Tk={tk_len}")

    def test_window_excluding_all_keys(self):
        case = Case(2, 5, 4, 2, 64, 300, (100, 250), window=(100, 40))
        q, ck, cv, lengths, _, _, _, window = make_inputs(case, seed=4)
        out, lse = self.prefix(q, ck, cv, lengths, window)
        assert np.all(np.asarray(out[0]) == 0) and np.all(np.isneginf(np.asarray(lse[0])))
        r_out, r_lse = pk.prefix_attention_reference(q, ck, cv, lengths, window)
        assert_close(out, r_out, 1e-5, "window")
        assert_lse_close(lse, r_lse, 1e-5, "window")

    def test_zero_capacity_cache(self):
        case = Case(1, 4, 4, 2, 64, 0, (0,))
        q, ck, cv, lengths, tk_, tv, mask, _ = make_inputs(case)
        out, lse = self.prefix(q, ck, cv, lengths)
        assert np.all(np.asarray(out) == 0) and np.all(np.isneginf(np.asarray(lse)))
        out, _ = self.hybrid(q, ck, cv, lengths, tk_, tv, mask, None, False)
        assert_close(out, tk.tree_attention_reference(q, tk_, tv, mask)[0], 1e-5, "zero capacity")


class TestXla(AttentionTestBase):
    BACKEND = "xla"


class TestReference(AttentionTestBase):
    BACKEND = "reference"


class TestPallasInterpret(AttentionTestBase):
    """The Mosaic TPU variant of the kernels, run by the Pallas interpreter."""

    BACKEND = "pallas"
    INTERPRET = True
    PLATFORM = "tpu"
    # Block sizes that do not divide S, several splits, tiny blocks; rows in multiples of 32 (int8 mask tiles).
    PREFIX_TUNINGS = (pk.PrefixTuning(16, 16), pk.PrefixTuning(32, 96, splits=3), pk.PrefixTuning())
    TREE_TUNINGS = (tk.TreeTuning(32, 16), tk.TreeTuning(64, 8), tk.TreeTuning())

    def kernel(self, name, *args, **kwargs):
        fn = {"prefix": pk.prefix_attention, "tree": tk.tree_attention}[name]
        return fn(*args, platform=self.PLATFORM, interpret=True, **kwargs)

    def test_dispatch_through_lsjax_attention(self):
        """`backend="pallas"` in lsjax.attention reaches the kernels (in interpret mode on CPU), with layer=."""
        case = Case(1, 5, 9, 3, 64, 200, (150,))
        q, ck, cv, lengths, tk_, tv, mask, _ = make_inputs(case, seed=5)
        out = attention.hybrid_tree_attention(q, ck, cv, lengths, tk_, tv, mask, backend="pallas")
        want, _ = attention.hybrid_attention_reference(q, ck, cv, lengths, tk_, tv, mask)
        assert_close(out, want, 1e-5, "pallas dispatch")
        stacked_k, stacked_v = jnp.stack([cv, ck, cv]), jnp.stack([ck, cv, ck])  # layer 1 is (ck, cv)
        out = _jit(attention.hybrid_tree_attention, backend="pallas")(
            q, stacked_k, stacked_v, lengths, tk_, tv, mask, layer=jnp.int32(1)
        )
        assert_close(out, want, 1e-5, "pallas dispatch with layer=")

    def test_prefix_block_shapes(self):
        """Block sizes that do not divide S, splits past every row's length, a one-key cache."""
        for tuning in self.PREFIX_TUNINGS:
            for case in (Case(3, 3, 4, 2, 64, 203, (203, 1, 77), window=(5, 0, 70)), Case(1, 2, 2, 1, 64, 1, (1,))):
                q, ck, cv, lengths, _, _, _, window = make_inputs(case, seed=6)
                out, lse = self.kernel("prefix", q, ck, cv, lengths, window, tuning=tuning)
                r_out, r_lse = pk.prefix_attention_reference(q, ck, cv, lengths, window)
                assert_close(out, r_out, 1e-5, f"{tuning} {case}")
                assert_lse_close(lse, r_lse, 1e-5, f"{tuning} {case}")

    def test_tree_block_shapes(self):
        """Row and key blocks of different sizes, a tree size that is a multiple of neither."""
        for tuning, chain in itertools.product(self.TREE_TUNINGS, (False, True)):
            case = Case(1, 37, 4, 2, 64, 8, (0,), chain=chain)
            q, _, _, _, tk_, tv, mask, _ = make_inputs(case, seed=7)
            out, lse = self.kernel("tree", q, tk_, tv, mask, causal=chain, tuning=tuning)
            r_out, r_lse = tk.tree_attention_reference(q, tk_, tv, mask, causal=chain)
            assert_close(out, r_out, 1e-5, f"{tuning} chain={chain}")
            assert_lse_close(lse, r_lse, 1e-5, f"{tuning} chain={chain}")

    # Shapes from test_lowering's grid (heads shrunk to keep the interpreter quick). The default tuning walks
    # several key blocks (TPU: 2048 keys per grid step) or several splits (GPU: sized for 132 SMs).
    DEFAULT_TUNING_CASES = (
        Case(1, 69, 8, 2, 64, 32768, (30001,), window=(2,)),
        Case(4, 16, 8, 2, 64, 8200, (8200, 1, 4097, 0), dtype=jnp.bfloat16),
    )

    def test_default_tuning_on_the_full_cache(self):
        """Default blocks (more than one block or split), the whole [L, B, K, S, H] cache with a traced layer."""
        for case in self.DEFAULT_TUNING_CASES:
            self.check_default_tuning(case)

    def check_default_tuning(self, case):
        q, ck, cv, lengths, _, _, _, window = make_inputs(case, seed=10)
        stacked_k = jnp.stack([jnp.zeros_like(ck), ck, jnp.full_like(ck, jnp.nan)])  # the other layers must not leak
        stacked_v = jnp.stack([jnp.full_like(cv, jnp.nan), cv, jnp.zeros_like(cv)])
        out, lse = self.kernel("prefix", q, stacked_k, stacked_v, lengths, window, jnp.int32(1))
        r_out, r_lse = _jit(pk.prefix_attention_reference)(q, ck, cv, lengths, window)
        atol = ATOL[case.dtype]
        assert_close(out, r_out, atol, f"{case} layer=1")
        assert_lse_close(lse, r_lse, 1e-4 if case.dtype == jnp.float32 else 2e-2, f"{case} layer=1")


class TestPallasGpuInterpret(TestPallasInterpret):
    """The Triton variant of the kernels, run by the Pallas interpreter: power-of-2 blocks of 16+.

    Each interpreted kernel costs ~2 s of XLA compilation here, so the default run keeps the cases that
    exercise this variant's own code (row blocks, split sizing, masked loads) and leaves the generic edge
    cases, already run on the TPU variant, to `-m slow`.
    """

    PLATFORM = "gpu"
    PREFIX_TUNING = pk.PrefixTuning(block_k=128, block_s=512, block_rows=16)
    TREE_TUNING = tk.TreeTuning(block_rows=16, block_k=16)
    PREFIX_TUNINGS = (pk.PrefixTuning(16, 96, block_rows=16), pk.PrefixTuning())
    TREE_TUNINGS = (tk.TreeTuning(16, 16), tk.TreeTuning())
    DEFAULT_TUNING_CASES = (
        Case(1, 1, 8, 2, 64, 4100, (4001,), window=(2,)),  # 65 splits of 64 keys
        Case(4, 16, 8, 2, 64, 2056, (2056, 1, 1000, 0), dtype=jnp.bfloat16),  # 17 splits of 128 keys
    )

    @pytest.mark.parametrize("case", [FAST_CASES[2], FAST_CASES[6]], ids=str)
    def test_hybrid_matches_naive(self, case):
        self.check_case(case)

    @pytest.mark.slow
    @pytest.mark.parametrize("case", [c for i, c in enumerate(FAST_CASES) if i not in (2, 6)], ids=str)
    def test_hybrid_matches_naive_rest(self, case):
        self.check_case(case)

    def test_dispatch_through_lsjax_attention(self):
        pytest.skip("lsjax.attention runs the TPU variant on a CPU host")

    @pytest.mark.slow
    def test_empty_cache_is_tree_only_exactly(self):
        super().test_empty_cache_is_tree_only_exactly()

    @pytest.mark.slow
    def test_tree_of_one_is_decode_attention(self):
        super().test_tree_of_one_is_decode_attention()

    @pytest.mark.slow
    def test_window_excluding_all_keys(self):
        super().test_window_excluding_all_keys()

    @pytest.mark.slow
    def test_zero_capacity_cache(self):
        super().test_zero_capacity_cache()

    @pytest.mark.slow
    def test_rectangular_mask(self):
        super().test_rectangular_mask()


def test_merge_with_empty_parts_has_no_nan():
    rng = np.random.default_rng(8)
    out_a = jnp.asarray(rng.standard_normal((1, 3, 4, 8), dtype=np.float32))
    lse_a = jnp.asarray(rng.standard_normal((1, 3, 4), dtype=np.float32))
    zeros, empty = jnp.zeros_like(out_a), jnp.full_like(lse_a, -jnp.inf)
    out, lse = attention.merge_attention(zeros, empty, zeros, empty)  # both parts empty
    assert np.all(np.asarray(out) == 0) and np.all(np.isneginf(np.asarray(lse)))
    out, lse = attention.merge_attention(zeros, empty, out_a, lse_a)  # an empty part contributes nothing
    np.testing.assert_array_equal(np.asarray(out), np.asarray(out_a))
    np.testing.assert_array_equal(np.asarray(lse), np.asarray(lse_a))
    out, lse = attention.merge_attention(out_a, lse_a, zeros, empty)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(out_a))
    # Two equal halves: the merge is their average and the lse grows by log 2.
    out, lse = attention.merge_attention(out_a, lse_a, out_a, lse_a)
    np.testing.assert_allclose(np.asarray(out), np.asarray(out_a), atol=1e-6)
    np.testing.assert_allclose(np.asarray(lse), np.asarray(lse_a) + np.log(2.0), atol=1e-6)


@pytest.mark.parametrize(
    "make, field",
    [
        (lambda: pk.PrefixTuning(block_k=12), "block_k"),
        (lambda: pk.PrefixTuning(block_k=64, block_s=96), "block_s"),
        (lambda: tk.TreeTuning(block_rows=0), "block_rows"),
        (lambda: pk.PrefixTuning(block_rows=24), "block_rows"),
        (lambda: pk.PrefixTuning(splits=0), "splits"),
        (lambda: tk.TreeTuning(num_warps=0), "num_warps"),
        (lambda: tk.TreeTuning(block_k=20), "block_k"),
    ],
)
def test_tuning_validation_names_the_field(make, field):
    with pytest.raises(ValueError, match=field):
        make()


@pytest.mark.parametrize("block", [64, 128, None])
def test_xla_prefix_blocks_that_do_not_divide_the_capacity(block):
    """The XLA loop's last block is shifted back inside the cache when the capacity is not a multiple of the
    block: the keys it shares with the block before must count once (windows and row lengths in any block)."""
    B, T, N, K, H, S = 3, 4, 6, 2, 16, 300 if block else 1100  # None: the default block on a 1100-slot cache
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.standard_normal((B, T, N, H), dtype=np.float32))
    k, v = (jnp.asarray(rng.standard_normal((B, K, S, H), dtype=np.float32)) for _ in range(2))
    lengths = jnp.asarray([S, S - 13, S // 2], jnp.int32)
    window = jnp.asarray([S - 40, 5, 0], jnp.int32)
    for win in (None, window):
        out, lse = jax.jit(functools.partial(attention.prefix_attention_xla, block_size=block))(q, k, v, lengths, win)
        want_out, want_lse = pk.prefix_attention_reference(q, k, v, lengths, win)
        assert_close(out, want_out, 1e-5, f"block {block} window {win}")
        assert_lse_close(lse, want_lse, 1e-4, f"block {block} window {win}")


@pytest.mark.parametrize("T", [513, 777])  # past 2 blocks: the blocked causal path; 777: a partial last block
def test_long_causal_chain_equals_the_reference(T):
    """A long causal chain (prefill, training features) runs in 256x256 blocks that skip the keys a block
    cannot see: outputs and log-sum-exps equal dense attention's, alone and merged with a cache."""
    case = Case(2, T, 9, 3, 32, 300, (300, 17), chain=True)
    q, ck, cv, lengths, tk_, tv, _, _ = make_inputs(case, seed=T)
    out, lse = _jit(attention.tree_attention_xla, causal=True)(q, tk_, tv)
    empty = jnp.zeros((2,), jnp.int32)
    want_out, want_lse = attention.hybrid_attention_reference(q, ck, cv, empty, tk_, tv, causal=True)
    assert_close(out, want_out, 1e-5, f"T={T}")
    assert_lse_close(lse, want_lse, 1e-4, f"T={T}")
    got = _jit(attention.hybrid_tree_attention, causal=True, backend="xla")(q, ck, cv, lengths, tk_, tv, None)
    want = attention.hybrid_attention_reference(q, ck, cv, lengths, tk_, tv, causal=True)
    assert_close(got, want[0], 1e-5, f"T={T} with a cache")
