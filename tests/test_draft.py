"""The LongSpec draft model: training mode == inference mode, window, ring cache, flash noisy training,
init from the target, pruned vocabulary. Tiny configs built here; ~30 s on 2 CPU cores."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lsjax import attention
from lsjax.band_attention import band_attention
from lsjax.cache import KVCache, RingCache, ring_write
from lsjax.config import DraftConfig, ModelConfig
from lsjax.methods.longspec import model as draft
from lsjax.models import target
from lsjax.rope import anchor_offset_positions
from lsjax.vocab import pruned_vocab

TINY = ModelConfig(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=48,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    max_position=4096,
    rope_theta=10000.0,
    eos_token_ids=(2, 5),
    pad_token_id=2,
    name="tiny",
)
W = 5
DCFG = DraftConfig(window=W)
T = 24

# Jitted once per static config: eager dispatch of the blocked loops dominates the test time otherwise.
forward_train = jax.jit(draft.draft_forward_train, static_argnums=(2, 3), static_argnames=("block_q",))
cross_train = jax.jit(draft.cross_attention_train, static_argnums=(1,), static_argnames=("block_q",))
self_train = jax.jit(draft.self_attention_train, static_argnums=(2, 3), static_argnames=("block_q",))
target_hidden = jax.jit(target.forward_hidden, static_argnums=(1,))
step_jit = jax.jit(draft.draft_step, static_argnums=(2, 3), static_argnames=("layer", "backend"))


def normal(seed, shape):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def host_params(init_fn, config, seed, scale=0.2):
    """Random params in init_fn's layout, drawn with numpy: shapes from eval_shape, so no per-shape compile
    (a dozen tiny XLA compiles cost more than the rest of a test on a loaded CPU). Norms are 1 + noise and
    biases nonzero, so a mix-up of norm / bias tensors would show."""
    rng = np.random.default_rng(seed)
    shapes = jax.eval_shape(lambda k: init_fn(config, k), jax.random.key(0))

    def draw(path, sd):
        base = 1.0 if "norm" in jax.tree_util.keystr(path) else 0.0
        return jnp.asarray(base + scale * rng.standard_normal(sd.shape), sd.dtype)

    return jax.tree_util.tree_map_with_path(draw, shapes)


@pytest.fixture(scope="module")
def setup():
    """A tiny target, a random draft, two rows of tokens at anchor-offset positions, the target's K/V."""
    config = TINY
    tparams = host_params(target.init_params, config, 0)
    dparams = host_params(draft.random_draft_params, config, 1)
    tokens = jnp.asarray(np.random.default_rng(2).integers(0, config.vocab_size, (2, T)), jnp.int32)
    # Anchor-offset positions (a different offset per row): masks must not read them.
    positions = anchor_offset_positions(T, jnp.array([0, 1000]))
    cache = KVCache.zeros(config, 2, T)
    _, new_k, new_v = target_hidden(tparams, config, tokens, positions, cache)
    tk, tv = new_k[-1].swapaxes(1, 2), new_v[-1].swapaxes(1, 2)  # [B, K, T, H]
    full_cache = KVCache(new_k.swapaxes(2, 3), new_v.swapaxes(2, 3), jnp.full((2,), T, jnp.int32))
    return dict(config=config, tp=tparams, dp=dparams, tokens=tokens, pos=positions, tk=tk, tv=tv, cache=full_cache)


# ---------------------------------------------------------------------------
# A naive dense reference: full [T, T] masks, one softmax, kv heads repeated.


def dense_attention(q, k, v, allowed):
    """q [B, T, N, H], k/v [B, K, S, H], allowed [T, S] bool; rows that see nothing give zero."""
    N, K, H = q.shape[2], k.shape[1], q.shape[3]
    kr = jnp.repeat(k, N // K, axis=1)
    vr = jnp.repeat(v, N // K, axis=1)
    s = jnp.einsum("btnh,bnsh->bnts", q, kr) * H**-0.5
    s = jnp.where(allowed, s, -jnp.inf)
    any_ = allowed.any(-1)[:, None]
    p = jax.nn.softmax(jnp.where(any_, s, 0.0), axis=-1) * any_
    return jnp.einsum("bnts,bnsh->btnh", p, vr)


def reference_forward(s, j, window=W, tokens=None):
    config, dp, tp = s["config"], s["dp"], s["tp"]
    tokens = s["tokens"] if tokens is None else tokens
    cos, sin = draft._rope(config, s["pos"])
    x = target.embed(tp, tokens)
    q, k, v = draft._self_qkv(dp, config, x, cos, sin)
    t, u = np.arange(T)[:, None], np.arange(T)[None, :]
    o = dense_attention(q, k.swapaxes(1, 2), v.swapaxes(1, 2), jnp.asarray((u <= t) & (u >= t - window)))
    self_out = jnp.einsum("btnh,nhd->btd", o, dp["self_wo"])
    x = x + self_out
    qc = draft._query(dp, config, x, cos, sin, "cross")
    oc = dense_attention(qc, s["tk"], s["tv"], jnp.asarray(u <= t - j))
    cross_out = jnp.einsum("btnh,nhd->btd", oc, dp["cross_wo"])
    x = x + cross_out
    return x + target.mlp(dp, target.rms_norm(x, dp["mlp_norm"], config.rms_norm_eps)), self_out, cross_out


def train(s, j, block_q=512, tokens=None):
    tokens = s["tokens"] if tokens is None else tokens
    return forward_train(
        s["dp"], s["tp"], s["config"], DCFG, tokens, s["pos"], s["tk"], s["tv"], jnp.int32(j), block_q=block_q
    )


# ---------------------------------------------------------------------------
# (a) training mode == inference mode


@pytest.mark.parametrize("j", [1, 2, 4])
def test_train_equals_step_prefilled_ring(setup, j):
    """Hidden of token t from draft_step (ring = the window before t, tree = t itself, target cache
    [0, t - j + 1)) equals draft_forward_train at t with shift j — for t < j, t around W and t > W."""
    s = setup
    config, dp, tp = s["config"], s["dp"], s["tp"]
    hidden = train(s, j)
    k_all, v_all = draft.draft_self_kv(dp, tp, config, s["tokens"], s["pos"])

    @jax.jit
    def step_at(t):
        # Writing the whole sequence with count = t puts positions [0, t) in the ring (T > W: a prefill).
        ring = ring_write(RingCache.zeros(config, 2, W), k_all, v_all, jnp.zeros(2, jnp.int32), jnp.full(2, t))
        tok = jax.lax.dynamic_slice_in_dim(s["tokens"], t, 1, axis=1)
        pos = jax.lax.dynamic_slice_in_dim(s["pos"], t, 1, axis=1)
        tree_k, tree_v = draft.draft_self_kv(dp, tp, config, tok, pos)
        mask = jnp.ones((2, 1, 1), bool)
        target_len = jnp.full((2,), jnp.maximum(t - j + 1, 0), jnp.int32)
        return draft.draft_step(
            dp, tp, config, DCFG, tok, pos, ring, tree_k, tree_v, mask, s["tk"], s["tv"], target_len
        )[:, 0]

    for t in (0, 1, j - 1, j, W - 1, W, W + 1, 13, T - 1):
        np.testing.assert_allclose(step_at(jnp.int32(t)), hidden[:, t], atol=2e-5, rtol=1e-5, err_msg=f"t={t}")


def test_train_equals_step_incremental_ring(setup):
    """The drafter's real use: one ring_write per committed token (wrapping many times), the target cache
    given whole ([L, B, K, S, H], last layer read in place) with a per-row lag."""
    s = setup
    config, dp, tp = s["config"], s["dp"], s["tp"]
    j = 3
    hidden = train(s, j)

    @jax.jit
    def step(ring, t):
        tok = jax.lax.dynamic_slice_in_dim(s["tokens"], t, 1, axis=1)
        pos = jax.lax.dynamic_slice_in_dim(s["pos"], t, 1, axis=1)
        k, v = draft.draft_self_kv(dp, tp, config, tok, pos)
        target_len = jnp.full((2,), jnp.maximum(t - j + 1, 0), jnp.int32)
        c = s["cache"]
        h = draft.draft_step(
            dp, tp, config, DCFG, tok, pos, ring, k, v, jnp.ones((2, 1, 1), bool), c.k, c.v, target_len
        )
        return h[:, 0], ring_write(ring, k, v, jnp.full((2,), t), jnp.ones((2,), jnp.int32))

    ring = RingCache.zeros(config, 2, W)
    for t in range(T):
        h, ring = step(ring, jnp.int32(t))
        np.testing.assert_allclose(h, hidden[:, t], atol=2e-5, rtol=1e-5, err_msg=f"t={t}")
    assert step._cache_size() == 1


def test_step_tree_rectangular_mask_backends(setup):
    """A frontier of 3 queries over 6 tree nodes (rectangular mask) plus a full ring: xla == reference ==
    a naive single-softmax over ring + tree keys (pallas: test_rectangular_tree_attention_backends)."""
    s = setup
    config, dp, tp = s["config"], s["dp"], s["tp"]
    k_all, v_all = draft.draft_self_kv(dp, tp, config, s["tokens"], s["pos"])
    n = 12
    ring = ring_write(RingCache.zeros(config, 2, W), k_all, v_all, jnp.zeros(2, jnp.int32), jnp.full(2, n))
    # Tree nodes: root n (depth 0), two children (depth 1), three grandchildren (depth 2); frontier = nodes 3..5.
    parent = [-1, 0, 0, 1, 1, 2]
    depth = np.array([0, 1, 1, 2, 2, 2])
    anc = np.zeros((6, 6), bool)
    for i, p in enumerate(parent):
        anc[i, i] = True
        if p >= 0:
            anc[i] |= anc[p]
    tree_tokens = jnp.asarray(np.random.default_rng(9).integers(0, config.vocab_size, (2, 6)), jnp.int32)
    tree_pos = s["pos"][:, n : n + 1] + jnp.asarray(depth)[None]
    tree_k, tree_v = draft.draft_self_kv(dp, tp, config, tree_tokens, tree_pos)
    mask = jnp.broadcast_to(jnp.asarray(anc[3:]), (2, 3, 6))
    tl = jnp.array([n - 1, n - 3], jnp.int32)
    args = (dp, tp, config, DCFG, tree_tokens[:, 3:], tree_pos[:, 3:], ring, tree_k, tree_v, mask, s["tk"], s["tv"], tl)
    out = {b: step_jit(*args, backend=b) for b in ("xla", "reference")}
    np.testing.assert_allclose(out["reference"], out["xla"], atol=2e-5)

    # Naive: self-attention over [ring slots, tree nodes] in one softmax.
    cos, sin = draft._rope(config, tree_pos[:, 3:])
    x = target.embed(tp, tree_tokens[:, 3:])
    q = draft._query(dp, config, x, cos, sin, "self")
    keys = jnp.concatenate([ring.k, tree_k.swapaxes(1, 2)], axis=2)
    vals = jnp.concatenate([ring.v, tree_v.swapaxes(1, 2)], axis=2)
    allowed = jnp.concatenate([jnp.ones((3, W), bool), jnp.asarray(anc[3:])], axis=1)
    x = x + jnp.einsum("btnh,nhd->btd", dense_attention(q, keys, vals, allowed), dp["self_wo"])
    qc = draft._query(dp, config, x, cos, sin, "cross")
    oc = jnp.stack(
        [
            dense_attention(qc[b : b + 1], s["tk"][b : b + 1], s["tv"][b : b + 1], jnp.arange(T)[None] < tl[b])
            for b in range(2)
        ]
    )
    x = x + jnp.einsum("btnh,nhd->btd", oc[:, 0], dp["cross_wo"])
    x = x + target.mlp(dp, target.rms_norm(x, dp["mlp_norm"], config.rms_norm_eps))
    np.testing.assert_allclose(out["xla"], x, atol=2e-5)


# ---------------------------------------------------------------------------
# (b) window


@pytest.mark.parametrize("block_q", [512, 20, 8, 7])  # one block; key blocks + skips; sliced window; ragged
def test_train_matches_dense_reference(setup, block_q):
    # j = 6, 7 put a block's last visible key on a key-block boundary (block 7, 8): the skip test's edge.
    for j in (1, 3, 6, 7):
        ref, _, _ = reference_forward(setup, j)
        np.testing.assert_allclose(train(setup, j, block_q=block_q), ref, atol=2e-5, rtol=1e-5)


def test_band_attention_grid():
    """band_attention == dense masked attention over block / window / lag shapes that hit every path and the
    edges of the key-block skip (T=9, block 4, W=5: a block's first visible key ends key block 0)."""
    cases = [  # T, block_q, block_k, window, shifts
        (9, 4, None, 5, (0, 1)),
        (24, 8, 5, None, (0, 1, 3)),
        (24, 20, None, 5, (0, 2)),
        (17, 4, 3, 6, (0, 4)),
        (17, 3, None, 4, (0,)),
    ]
    for T_, bq, bk, w, shifts in cases:
        q = normal(10, (2, T_, 4, 8))
        k, v = normal(11, (2, 2, T_, 8)), normal(12, (2, 2, T_, 8))
        f = jax.jit(
            lambda q, k, v, j, bq=bq, bk=bk, w=w: band_attention(q, k, v, shift=j, window=w, block_q=bq, block_k=bk)
        )
        t, u = np.arange(T_)[:, None], np.arange(T_)[None, :]
        for j in shifts:
            allowed = (u <= t - j) & ((u >= t - w) if w is not None else True)
            want = dense_attention(q, k, v, jnp.asarray(allowed))
            np.testing.assert_allclose(f(q, k, v, jnp.int32(j)), want, atol=2e-5, err_msg=f"{T_, bq, bk, w, j}")


@pytest.mark.parametrize("block_q", [512, 8])
def test_window_ignores_old_tokens(setup, block_q):
    """Tokens older than the window change nothing at later rows: self-attention output and (target K/V
    fixed) the whole hidden state are bit-identical there."""
    s = setup
    t0 = 15
    changed = s["tokens"].at[:, : t0 - W].set((s["tokens"][:, : t0 - W] + 7) % TINY.vocab_size)
    args = (s["dp"], s["tp"], TINY, DCFG)
    a = self_train(*args, s["tokens"], s["pos"], block_q=block_q)
    b = self_train(*args, changed, s["pos"], block_q=block_q)
    np.testing.assert_array_equal(a[:, t0:], b[:, t0:])
    assert not np.allclose(a[:, t0 - 1], b[:, t0 - 1])  # the row that still sees a changed token does change
    np.testing.assert_array_equal(train(s, 2, block_q)[:, t0:], train(s, 2, block_q, tokens=changed)[:, t0:])
    _, ref_self, _ = reference_forward(s, 2, tokens=changed)
    np.testing.assert_allclose(b, ref_self, atol=2e-5)


# ---------------------------------------------------------------------------
# (c) ring cache


def test_ring_cache_constant_size_holds_last_window():
    config, w, B = TINY, 16, 2
    K, H = config.num_kv_heads, config.head_dim
    chunk = 37

    def encoded(start, n):  # k = v = the absolute position, so each slot says which position it holds
        p = (start + jnp.arange(n, dtype=jnp.float32))[None, :, None, None]
        return jnp.broadcast_to(p, (B, n, K, H))

    # A fresh function object: jit's compile cache is per function, and other test modules jit ring_write too.
    write = jax.jit(lambda *args: ring_write(*args))
    sizes = {}
    for total in (10, 10_000):
        ring = RingCache.zeros(config, B, w)
        for start in range(0, total, chunk):
            n = min(chunk, total - start)
            kv = encoded(start, chunk)
            ring = write(ring, kv, kv, jnp.full((B,), start), jnp.full((B,), n))
        sizes[total] = ring.nbytes()
        held = np.arange(max(0, total - w), total)
        np.testing.assert_array_equal(ring.lengths, min(total, w))
        for p in held:
            np.testing.assert_array_equal(ring.k[:, :, p % w], p)
            np.testing.assert_array_equal(ring.v[:, :, p % w], p)
        if total < w:
            np.testing.assert_array_equal(ring.k[:, :, total:], 0)  # slots past the count untouched
    assert sizes[10] == sizes[10_000] == RingCache.zeros(config, B, w).nbytes()
    assert write._cache_size() == 1

    # One prefill write longer than the ring, with different counts per row.
    kv = encoded(0, 100)
    ring = ring_write(RingCache.zeros(config, B, w), kv, kv, jnp.zeros(B, jnp.int32), jnp.array([100, 7]))
    np.testing.assert_array_equal(ring.lengths, [w, 7])
    for p in range(100 - w, 100):
        np.testing.assert_array_equal(ring.k[0, :, p % w], p)
    for p in range(7):
        np.testing.assert_array_equal(ring.k[1, :, p], p)
    np.testing.assert_array_equal(ring.k[1, :, 7:], 0)


# ---------------------------------------------------------------------------
# (d) flash noisy training


def test_flash_noisy_zero_rows_and_paper_slicing(setup):
    s = setup
    x = normal(5, (2, T, TINY.hidden_size))
    for j in (1, 2, 5):
        out = cross_train(s["dp"], TINY, x, s["pos"], s["tk"], s["tv"], jnp.int32(j), block_q=8)
        assert np.all(np.asarray(out[:, :j]) == 0.0), j  # exactly zero, not merely small
        assert np.all(np.abs(np.asarray(out[:, j:])).max(-1) > 0)
        # The paper's formulation (Appendix G): O[j:] = causal attn(Q[j:], K[:-j], V[:-j]).
        cos, sin = draft._rope(TINY, s["pos"])
        q = draft._query(s["dp"], TINY, x, cos, sin, "cross")
        o = dense_attention(q[:, j:], s["tk"][:, :, :-j], s["tv"][:, :, :-j], jnp.tril(jnp.ones((T - j, T - j), bool)))
        np.testing.assert_allclose(out[:, j:], jnp.einsum("btnh,nhd->btd", o, s["dp"]["cross_wo"]), atol=2e-5)


def test_shift_is_traced_no_retrace(setup):
    s = setup
    traces = {"n": 0}

    def fwd(dp, j):
        traces["n"] += 1
        return draft.draft_forward_train(dp, s["tp"], TINY, DCFG, s["tokens"], s["pos"], s["tk"], s["tv"], j)

    f = jax.jit(fwd)
    outs = [f(s["dp"], jnp.int32(j)) for j in (1, 2, 3, 4)]
    assert traces["n"] == 1
    assert not np.allclose(outs[0], outs[1])

    # Gradients flow and are finite even with fully masked rows (t < j).
    g = jax.jit(jax.grad(lambda dp, j: jnp.sum(fwd(dp, j) ** 2)))(s["dp"], jnp.int32(3))
    assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(g))
    assert float(jnp.abs(g["cross_wq"]).max()) > 0


# ---------------------------------------------------------------------------
# (e) init from the target, pruned vocabulary


@pytest.mark.parametrize("layer", [-1, 0])
@pytest.mark.parametrize("qkv_bias", [False, True])
def test_init_from_target_layer(layer, qkv_bias):
    config = dataclasses.replace(TINY, qkv_bias=qkv_bias)
    tp = host_params(target.init_params, config, 0)
    dp = draft.init_draft_params(config, DraftConfig(init_from_target_layer=layer, zero_init_outputs=False), tp)
    zeroed = draft.init_draft_params(config, DraftConfig(init_from_target_layer=layer, zero_init_outputs=True), tp)
    for name in ("self_wo", "cross_wo", "w_down"):  # the option: an identity draft at step 0
        assert not np.any(np.asarray(zeroed[name])) and np.any(np.asarray(dp[name]))
    lt = {k: v[layer] for k, v in tp["layers"].items()}
    expect = {
        "self_norm": lt["attn_norm"],
        "self_wq": lt["wq"],
        "self_wk": lt["wk"],
        "self_wv": lt["wv"],
        "self_wo": lt["wo"],
        "cross_norm": lt["attn_norm"],
        "cross_wq": lt["wq"],
        "cross_wo": lt["wo"],
        "mlp_norm": lt["mlp_norm"],
        "w_gate": lt["w_gate"],
        "w_up": lt["w_up"],
        "w_down": lt["w_down"],
        "final_norm": tp["final_norm"] * DraftConfig().init_head_scale,  # the tempered head
    }
    if qkv_bias:
        expect |= {"self_bq": lt["bq"], "self_bk": lt["bk"], "self_bv": lt["bv"], "cross_bq": lt["bq"]}
    assert set(dp) == set(expect)  # no embedding, no LM head
    for name, want in expect.items():
        np.testing.assert_array_equal(dp[name], want, err_msg=name)
    other = 1 if layer in (0, -2) else 0  # a different layer really differs: the index is honoured
    assert not np.array_equal(dp["self_wq"], tp["layers"]["wq"][other])
    rand = jax.eval_shape(lambda k: draft.init_draft_params(config, DCFG, key=k, from_target=False), jax.random.key(7))
    assert jax.tree.map(jnp.shape, rand) == jax.tree.map(jnp.shape, dp)
    with pytest.raises(ValueError):
        draft.init_draft_params(config, DraftConfig(init_from_target_layer=config.num_layers), tp)


@pytest.mark.parametrize("tie", [True, False])
def test_pruned_vocab_logits(setup, tie):
    config = dataclasses.replace(TINY, tie_embeddings=tie)
    tp = host_params(target.init_params, config, 0)
    counts = np.zeros(config.vocab_size, np.int64)
    counts[[10, 20, 30, 40]] = [5, 50, 7, 50]  # EOS ids 2 and 5 never occur
    ids = pruned_vocab(config, 4, token_counts=counts)
    assert set(config.eos_token_ids) <= set(ids.tolist()) and len(ids) == 4
    np.testing.assert_array_equal(ids, [20, 40, 2, 5])  # by frequency, ties by id; EOS displace 10 and 30
    corpus = np.repeat(np.arange(config.vocab_size), counts)
    np.testing.assert_array_equal(pruned_vocab(config, 4, corpus_ids=corpus[::-1]), ids)
    ids8 = pruned_vocab(config, 8, token_counts=counts)
    assert ids8.tolist()[:4] == [20, 40, 30, 10]
    with pytest.raises(ValueError):
        pruned_vocab(config, 1, token_counts=counts)

    hidden = normal(6, (2, 3, config.hidden_size))
    full = draft.draft_logits(setup["dp"], tp, config, hidden)
    pruned = draft.draft_logits(setup["dp"], tp, config, hidden, jnp.asarray(ids8))
    assert full.shape == (2, 3, config.vocab_size) and pruned.shape == (2, 3, 8) and pruned.dtype == jnp.float32
    np.testing.assert_allclose(pruned, full[..., ids8], atol=1e-6)
    # the head gathered once at load gives the same logits, and is not saved with the draft
    with_head = draft.with_vocab_head({**setup["dp"], "vocab_ids": ids8}, tp, config)
    assert with_head.vocab_head.shape == (8, config.hidden_size)
    np.testing.assert_allclose(draft.draft_logits(with_head, tp, config, hidden, jnp.asarray(ids8)), pruned, atol=1e-6)


def test_rectangular_tree_attention_backends():
    """lsjax.attention.tree_attention accepts a [B, T, Tk] mask on every backend (pallas pads to square)."""
    q = normal(0, (1, 3, 4, 8))
    for tk in (7, 2):
        k, v = normal(1, (1, tk, 2, 8)), normal(2, (1, tk, 2, 8))
        mask = jnp.asarray(np.random.default_rng(3).random((1, 3, tk)) < 0.6).at[:, 0].set(False)  # row 0: no keys
        outs = {b: attention.tree_attention(q, k, v, mask, backend=b) for b in ("xla", "reference", "pallas")}
        for b in ("reference", "pallas"):
            np.testing.assert_allclose(outs[b][0], outs["xla"][0], atol=1e-5, err_msg=b)
            np.testing.assert_allclose(outs[b][1], outs["xla"][1], atol=1e-5, err_msg=b)
        assert np.all(np.isneginf(outs["xla"][1][:, 0]))


def test_shipped_smollm2_draft_is_complete():
    """The draft in lsjax/drafts/ loads, fits SmolLM2-135M's shapes and records how it was trained."""
    from lsjax.methods.longspec.checkpoint import DRAFTS_DIR, load_draft

    path = DRAFTS_DIR / "SmolLM2-135M-Instruct"
    params, dcfg, meta = load_draft(path)
    D, N, K, H, V = 576, 9, 3, 64, 49152
    assert params["cross_wq"].shape == (D, N, H) and params["self_wk"].shape == (D, K, H)
    ids = params["vocab_ids"]
    assert len(ids) == dcfg.draft_vocab_size == 8192 and len(np.unique(ids)) == len(ids) and ids.max() < V
    assert all(np.isfinite(v).all() for v in params.values())
    from lsjax.methods.longspec.checkpoint import shipped_tree

    assert shipped_tree(meta, "cpu").widths == (1,)  # fastest on dev, every task (docs/methods/longspec.md)
    assert shipped_tree(meta, "gpu").num_nodes > 10  # other devices: the device preset
    assert shipped_tree({"tree": [2, 1]}, "tpu").widths == (2, 1) and shipped_tree({}, "cpu").widths
    assert meta["training"]["steps"] > 0 and (path / "MODEL_CARD.md").is_file()
