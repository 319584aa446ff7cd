"""The speculative engine: trees, acceptance, and greedy losslessness for every drafter.

Greedy: speculative output == AR output token for token (sampling: tests/test_verify_sampling.py; the
engine's edge cases: tests/test_engine_edges.py).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lsjax import engine
from lsjax.config import DraftConfig, GenerateConfig, SamplingConfig
from lsjax.engine.types import ARDrafter, DraftContext, Drafter
from lsjax.engine.verify import accept
from lsjax.methods.hybrid.drafter import HybridDrafter, union_layout
from lsjax.methods.longspec.drafter import LongSpecDrafter
from lsjax.methods.longspec.model import init_draft_params
from lsjax.methods.pld.drafter import PLDDrafter, find_continuation
from lsjax.tree import Tree, TreeConfig, ancestor_mask, make_tree, parse_tree
from lsjax.vocab import pruned_vocab
from tests.tiny import tiny_model

spec_run = jax.jit(engine.run, static_argnames=("config", "gen", "drafter", "capacity", "chunk", "backend"))


@dataclasses.dataclass(frozen=True)
class RandomTreeDrafter(Drafter):
    """Test drafter: a random beam-shaped tree (random parents on the level above, random tokens),
    seeded by the step count, never by the verification key."""

    tree: TreeConfig = TreeConfig((3, 4, 2))
    vocab: int = 8
    seed: int = 0
    name = "random-tree"

    def propose(self, ctx: DraftContext, state, draft_state, key) -> Tree:
        B = state.root.shape[0]
        key = jax.random.fold_in(jax.random.key(self.seed), state.steps)
        k_tok, k_par = jax.random.split(key)
        T = self.tree.num_nodes
        offsets = self.tree.level_offsets()
        parents = [jnp.full((1,), -1, jnp.int32)]
        for d, w in enumerate(self.tree.widths):
            lo, hi = offsets[d], offsets[d] + (1 if d == 0 else self.tree.widths[d - 1])
            parents.append(jax.random.randint(jax.random.fold_in(k_par, d), (w,), lo, hi, jnp.int32))
        parents = jnp.broadcast_to(jnp.concatenate(parents), (B, T))
        tokens = jax.random.randint(k_tok, (B, T), 0, self.vocab).at[:, 0].set(state.root)
        return make_tree(tokens, parents, jnp.ones((B, T), bool), self.tree)


def run(params, config, prompts, gen, drafter, key=0, chunk=64, capacity=None, draft_params=None):
    B = len(prompts)
    P = max(64, -(-max(len(p) for p in prompts) // chunk) * chunk)
    buf = np.zeros((B, P), np.int32)
    for b, p in enumerate(prompts):
        buf[b, : len(p)] = p
    lengths = jnp.array([len(p) for p in prompts], jnp.int32)
    if isinstance(drafter, LongSpecDrafter | HybridDrafter) and draft_params is None:
        draft_params = longspec_params(params, config, getattr(drafter, "longspec", drafter))
    dp = () if draft_params is None else draft_params
    return spec_run(
        params, dp, config, jnp.asarray(buf), lengths, gen, jax.random.key(key), drafter, chunk=chunk, capacity=capacity
    )


def longspec_params(params, config, drafter, pruned=0):
    """An untrained draft: the target's last layer, optionally with a pruned vocabulary."""
    # The full last layer (not the zero-output default), so the tree depends on attention over the context.
    dp = init_draft_params(config, dataclasses.replace(drafter.draft, zero_init_outputs=False), params)
    if pruned:
        counts = np.random.RandomState(0).randint(0, 100, size=config.vocab_size)
        dp["vocab_ids"] = jnp.asarray(pruned_vocab(config, pruned, token_counts=counts))
    return dp


# ---------------------------------------------------------------------------------------------- trees


def brute_force_ancestors(parents, valid):
    T = len(parents)
    mask = np.zeros((T, T), bool)
    for i in range(T):
        j = i
        while j >= 0:
            mask[i, j] = valid[i] and valid[j]
            j = parents[j]
    return mask


def test_ancestor_mask_matches_brute_force():
    rng = np.random.RandomState(0)
    tree = TreeConfig((3, 5, 4, 2))
    offsets = tree.level_offsets()
    for _ in range(5):
        parents = [-1]
        for d, w in enumerate(tree.widths):
            lo, hi = offsets[d], offsets[d] + (1 if d == 0 else tree.widths[d - 1])
            parents += list(rng.randint(lo, hi, size=w))
        parents = np.array(parents)
        assert all(parents[i] < i for i in range(1, len(parents)))  # parents precede children
        valid = rng.rand(len(parents)) > 0.2
        valid[0] = True
        for i in range(1, len(parents)):  # invalid parents have invalid children
            valid[i] &= valid[parents[i]]
        got = np.asarray(ancestor_mask(jnp.asarray(parents)[None], jnp.asarray(valid)[None], tree.depth))[0]
        np.testing.assert_array_equal(got, brute_force_ancestors(parents, valid))


def test_tree_presets_and_parsing():
    assert parse_tree("paper").num_nodes == 69
    assert parse_tree("4,8").widths == (4, 8)
    assert parse_tree((1, 1)).widths == (1, 1) and parse_tree(3).widths == (3,)  # bench variants: tree=1/1, tree=3
    with pytest.raises(ValueError, match="tree.widths"):
        parse_tree((2, 0))
    with pytest.raises(ValueError, match="tree"):
        parse_tree("wide")
    with pytest.raises(ValueError, match="tree.widths"):
        TreeConfig((2, 0))


def test_hybrid_union_layout():
    """PLD chain first on every level it reaches, LongSpec's nodes after it, parents remapped."""
    union, pld_at, ls_at, pld_parent = union_layout(3, (2, 1))
    assert union.widths == (3, 2, 1)  # (PLD + 2, PLD + 1, PLD)
    np.testing.assert_array_equal(pld_at, [1, 4, 6])
    np.testing.assert_array_equal(pld_parent, [0, 1, 4])
    np.testing.assert_array_equal(ls_at, [0, 2, 3, 5])  # LongSpec root, its level 1 (2 nodes), its level 2
    union, pld_at, ls_at, _ = union_layout(1, (1, 1, 1))
    assert union.widths == (2, 1, 1) and pld_at.tolist() == [1] and ls_at.tolist() == [0, 2, 3, 4]


def test_accept_walks_matching_children():
    # root -> {a=5, b=6}; a -> {c=7}; b -> {d=8}. Target argmax: root->6, b->8, d->9.
    tokens = jnp.array([[1, 5, 6, 7, 8]])
    parents = jnp.array([[-1, 0, 0, 1, 2]])
    tree = make_tree(tokens, parents, jnp.ones((1, 5), bool), TreeConfig((2, 2)))
    logits = jnp.full((1, 5, 12), -5.0)
    for node, tok in [(0, 6), (1, 3), (2, 8), (3, 3), (4, 9)]:
        logits = logits.at[0, node, tok].set(5.0)
    path, n, bonus = accept(tree, logits, SamplingConfig(), jax.random.key(0), 2)
    assert path.tolist() == [[0, 2, 4]] and n.tolist() == [2] and bonus.tolist() == [9]
    # An invalid node is never accepted.
    tree = make_tree(tokens, parents, jnp.array([[True, True, True, True, False]]), TreeConfig((2, 2)))
    path, n, bonus = accept(tree, logits, SamplingConfig(), jax.random.key(0), 2)
    assert n.tolist() == [1] and bonus.tolist() == [8]


def test_pld_finds_most_recent_match():
    hist = jnp.array([[4, 5, 6, 9, 4, 5, 7, 1, 4, 5, 0, 0]])
    found, start = find_continuation(hist, jnp.array([10]), 2, 3)  # last 2-gram (4, 5): latest earlier at 4..5
    assert bool(found[0]) and int(start[0]) == 6
    found, _ = find_continuation(hist, jnp.array([10]), 3, 3)  # (1, 4, 5) never occurred before
    assert not bool(found[0])


# ---------------------------------------------------------------------------------------------- greedy


def repetitive_prompts(config, n, length, seed):
    rng = np.random.RandomState(seed)
    out = []
    for _ in range(n):
        motif = rng.randint(3, config.vocab_size, size=rng.randint(3, 9))
        out.append(np.resize(motif, length) if rng.rand() < 0.7 else rng.randint(3, config.vocab_size, size=length))
    return out


DRAFTERS = [
    # ~15 s; the 5-token lookup chain below covers prompt lookup in the default run.
    pytest.param(PLDDrafter(num_tokens=1, ngram_max=1), marks=pytest.mark.slow, id="pld-(1,)"),
    PLDDrafter(num_tokens=5, ngram_max=3),
    RandomTreeDrafter(TreeConfig((1,)), vocab=97),
    # The slow set adds a wide random tree and a LongSpec chain; the default run keeps a deep LongSpec tree.
    pytest.param(
        RandomTreeDrafter(TreeConfig((4, 4, 3)), vocab=97), marks=pytest.mark.slow, id="random-tree-(4, 4, 3)"
    ),
    pytest.param(
        LongSpecDrafter(TreeConfig((1, 1, 1)), DraftConfig(window=16)), marks=pytest.mark.slow, id="longspec-(1, 1, 1)"
    ),
    LongSpecDrafter(TreeConfig((3, 4, 4)), DraftConfig(window=8)),
    HybridDrafter(LongSpecDrafter(TreeConfig((2, 1)), DraftConfig(window=8)), PLDDrafter(num_tokens=4)),
]


@pytest.mark.parametrize("drafter", DRAFTERS, ids=lambda d: f"{d.name}-{d.tree.widths}")
def test_greedy_speculative_equals_ar(drafter):
    config, params = tiny_model()
    gen = GenerateConfig(max_new_tokens=24, ignore_eos=True)
    prompts = repetitive_prompts(config, 4, 40, seed=1) + [np.arange(3, 20)]
    ar = run(params, config, prompts, gen, ARDrafter())
    sp = run(params, config, prompts, gen, drafter)
    np.testing.assert_array_equal(np.asarray(sp.num_out), np.asarray(ar.num_out))
    np.testing.assert_array_equal(np.asarray(sp.out), np.asarray(ar.out))
    if isinstance(drafter, PLDDrafter | HybridDrafter) and drafter.tree.depth > 1:  # PLD hits on a looping row
        looping = [np.resize(np.array([5, 9, 14, 20]), 40)]
        assert int(run(params, config, looping, gen, drafter).steps) < int(
            run(params, config, looping, gen, ARDrafter()).steps
        )


@pytest.mark.slow  # stop tokens: tests/test_engine_edges.py's batched rows
def test_greedy_with_stop_tokens_and_a_perfect_drafter():
    """A drafter that proposes the target's own greedy continuation: every node is accepted, and a stop
    token inside an accepted path still ends the row exactly where AR ends it."""
    config, params = tiny_model()
    prompt = repetitive_prompts(config, 1, 40, seed=4)[0]
    free = run(params, config, [prompt], GenerateConfig(max_new_tokens=30, ignore_eos=True), ARDrafter())
    greedy = np.asarray(free.out[0]).tolist()

    @dataclasses.dataclass(frozen=True)
    class Oracle(Drafter):
        tree: TreeConfig = TreeConfig((1, 1, 1, 1))
        name = "oracle"

        def propose(self, ctx, state, draft_state, key):
            B, T = state.root.shape[0], self.tree.num_nodes
            future = jnp.asarray(greedy + [0] * T)
            toks = jax.lax.dynamic_slice_in_dim(future, state.num_out[0], T - 1)
            tokens = jnp.concatenate([state.root[:, None], toks[None]], axis=1)
            parents = jnp.arange(-1, T - 1)[None]
            return make_tree(tokens, parents, jnp.ones((B, T), bool), self.tree)

    sp = run(params, config, [prompt], GenerateConfig(max_new_tokens=30, ignore_eos=True), Oracle())
    assert np.asarray(sp.out[0]).tolist() == greedy
    assert int(sp.steps) == -(-29 // 5)  # 4 accepted + 1 bonus per step
    stop = greedy[11]
    gen = GenerateConfig(max_new_tokens=30, stop_token_ids=(stop,), ignore_eos=True)
    ar = run(params, config, [prompt], gen, ARDrafter())
    sp = run(params, config, [prompt], gen, Oracle())
    assert int(sp.num_out[0]) == int(ar.num_out[0]) == greedy.index(stop) + 1
    np.testing.assert_array_equal(np.asarray(sp.out[0, : int(sp.num_out[0])]), greedy[: greedy.index(stop) + 1])


# Sampling (T > 0) losslessness for every drafter, at depth >= 3 with an independent reference for the
# filters, lives in tests/test_verify_sampling.py.


def test_longspec_pruned_vocab_is_lossless_and_draft_memory_is_constant():
    config, params = tiny_model()
    drafter = LongSpecDrafter(TreeConfig((2, 2, 2)), DraftConfig(window=16))
    gen = GenerateConfig(max_new_tokens=20, ignore_eos=True)
    prompts = repetitive_prompts(config, 3, 60, seed=2)
    ar = run(params, config, prompts, gen, ARDrafter())
    sp = run(params, config, prompts, gen, drafter, draft_params=longspec_params(params, config, drafter, pruned=40))
    np.testing.assert_array_equal(np.asarray(sp.out), np.asarray(ar.out))
    short = run(params, config, [prompts[0][:20]], gen, drafter)
    long = run(params, config, [np.resize(prompts[0], 300)], gen, drafter)
    assert short.draft.nbytes() == long.draft.nbytes()  # the ring does not grow with the context
    assert short.cache.capacity < long.cache.capacity


@pytest.mark.slow  # ~38 s; the tree's shape, not losslessness (any tree verifies exactly)
def test_longspec_beam_matches_brute_force():
    """Each level holds the global top-w children by cumulative draft log-prob."""
    from lsjax.engine.types import DraftContext
    from lsjax.methods.longspec.model import draft_logits, draft_self_kv, draft_step

    config, params = tiny_model(vocab=11, scale=0.6)
    drafter = LongSpecDrafter(TreeConfig((3, 4)), DraftConfig(window=8))
    dp = longspec_params(params, config, drafter)
    gen = GenerateConfig(max_new_tokens=2, ignore_eos=True)
    prompt = [3, 4, 5, 6, 7, 8, 9, 3, 4]
    state = engine.start(
        params,
        dp,
        config,
        drafter,
        gen,
        jnp.asarray([prompt + [0] * 7]),
        jnp.array([9]),
        jax.random.key(0),
        capacity=64,
        chunk=16,
    )
    ctx = DraftContext(params, dp, config, capacity=64)
    tree = drafter.propose(ctx, state, state.draft, jax.random.key(0))
    # Brute force: score every (depth-1, depth-2) pair with the draft directly.
    n, root = int(state.cache.lengths[0]), int(state.root[0])

    @jax.jit
    def chain_logp(toks):  # the draft's log-probs after a chain [1, t] starting at the root
        t = toks.shape[1]
        pos = n + jnp.arange(t)[None]
        k, v = draft_self_kv(dp, params, config, toks, pos)
        mask = jnp.tril(jnp.ones((t, t), bool))[None]
        h = draft_step(
            dp,
            params,
            config,
            drafter.draft,
            toks,
            pos,
            state.draft,
            k,
            v,
            mask,
            state.cache.k,
            state.cache.v,
            state.cache.lengths,
        )
        return jax.nn.log_softmax(draft_logits(dp, params, config, h), -1)[0, -1]

    def logp_after(path):
        return np.asarray(chain_logp(jnp.asarray([[root, *path]])))

    lp1 = logp_after([])
    level1 = sorted(range(11), key=lambda t: -lp1[t])[:3]
    assert sorted(np.asarray(tree.tokens[0, 1:4]).tolist()) == sorted(level1)
    cands = sorted(((lp1[a] + logp_after([a])[b], a, b) for a in level1 for b in range(11)), reverse=True)[:4]
    got = {(int(tree.tokens[0, int(tree.parents[0, i])]), int(tree.tokens[0, i])) for i in range(4, 8)}
    assert got == {(a, b) for _, a, b in cands}


def test_public_generate_jits_inside_user_code():
    """Research-code style: lsjax.generate inside the user's own jitted function, twice without retracing."""
    import lsjax

    config, params = tiny_model()
    cfg = lsjax.SpecConfig(
        model=config,
        gen=GenerateConfig(max_new_tokens=10, ignore_eos=True),
        drafter=lsjax.PLDDrafter(num_tokens=4),
        chunk=32,
    )
    traces = []

    @jax.jit
    def user_fn(params, prompts, key):
        traces.append(1)
        out = lsjax.generate(params, (), prompts, cfg, key)
        return out.tokens, out.num_tokens, out.mean_accepted

    prompts = jnp.asarray(np.stack([np.resize([5, 9, 14, 20], 64), np.arange(3, 67)]), jnp.int32)
    toks, n, tau = user_fn(params, prompts, jax.random.key(0))
    ar = run(params, config, list(np.asarray(prompts)), cfg.gen, ARDrafter(), chunk=32)
    np.testing.assert_array_equal(np.asarray(toks), np.asarray(ar.out))
    user_fn(params, prompts + 1, jax.random.key(1))
    assert len(traces) == 1 and float(tau) >= 1.0


@pytest.mark.slow  # the equality tests above catch a draft reading uncommitted K/V
def test_draft_sees_only_committed_target_kv():
    """Garbage in the target cache past the committed length must not change the tree the draft builds."""
    from lsjax.engine.types import DraftContext

    config, params = tiny_model()
    drafter = LongSpecDrafter(TreeConfig((2, 3)), DraftConfig(window=8))
    dp = longspec_params(params, config, drafter)
    gen = GenerateConfig(max_new_tokens=4, ignore_eos=True)
    prompt = jnp.asarray([list(range(3, 30)) + [0] * 5])
    state = engine.start(
        params, dp, config, drafter, gen, prompt, jnp.array([27]), jax.random.key(0), capacity=64, chunk=32
    )
    ctx = DraftContext(params, dp, config, capacity=64)
    clean = drafter.propose(ctx, state, state.draft, jax.random.key(0))
    n = int(state.cache.lengths[0])
    noise = jax.random.normal(jax.random.key(9), state.cache.k.shape) * 5
    past_n = (jnp.arange(state.cache.capacity) >= n)[None, None, None, :, None]
    dirty_cache = dataclasses.replace(
        state.cache, k=jnp.where(past_n, noise, state.cache.k), v=jnp.where(past_n, -noise, state.cache.v)
    )
    dirty = drafter.propose(ctx, dataclasses.replace(state, cache=dirty_cache), state.draft, jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(dirty.tokens), np.asarray(clean.tokens))
    np.testing.assert_array_equal(np.asarray(dirty.parents), np.asarray(clean.parents))


@pytest.mark.parametrize(
    "drafter",
    # The loop is one program whatever the drafter: the default run checks it with LongSpec's (~20 s each).
    [
        pytest.param(PLDDrafter(num_tokens=4), marks=pytest.mark.slow),
        LongSpecDrafter(TreeConfig((3, 4, 4)), DraftConfig(window=8)),
    ],
    ids=lambda d: d.name,
)
def test_no_recompilation_per_step(drafter):
    config, params = tiny_model()
    dp = longspec_params(params, config, drafter) if isinstance(drafter, LongSpecDrafter) else ()
    gen = GenerateConfig(max_new_tokens=30, ignore_eos=True)
    before = engine.decode._cache_size()
    for prompt_len in (20, 50):  # one prompt bucket: the same compiled program
        prompt = jnp.asarray([list(np.resize([5, 9, 14, 20, 7], prompt_len)) + [0] * (64 - prompt_len)])
        state = engine.start(
            params, dp, config, drafter, gen, prompt, jnp.array([prompt_len]), jax.random.key(0), capacity=320, chunk=32
        )
        for limit in (2, 5, 9):
            state = engine.decode(params, dp, config, drafter, gen, state, jnp.int32(limit))
    assert engine.decode._cache_size() - before == 1


@pytest.mark.slow
@pytest.mark.parametrize("method", ["pld", "longspec"])
def test_real_smollm2_greedy_speculative_equals_ar(ours, method):
    """On the real model and a dev code prompt (~1K tokens), every drafter reproduces AR exactly."""
    from lsjax.engine.host import Generator
    from lsjax.methods.longspec.checkpoint import load_longspec
    from lsjax.prompts import stdlib_code_prompt

    ids = ours.tokenizer.encode(stdlib_code_prompt(ours.tokenizer, 1024).text)
    gen = GenerateConfig(max_new_tokens=48, ignore_eos=True)
    if method == "pld":
        drafter, dp = PLDDrafter(num_tokens=6), None
    else:
        drafter, dp = load_longspec(ours, "random", "2,2,2")
    ar = Generator(ours.config, ours.params).run(ids, gen)
    sp = Generator(ours.config, ours.params, drafter, dp).run(ids, gen)
    assert sp.tokens == ar.tokens


@pytest.mark.slow  # the shipped draft equals AR in make test-jax011's decode smoke
def test_trained_draft_greedy_equals_ar(tmp_path):
    """A draft trained by lsjax.train (tiny target, synthetic data, 30 steps) is as lossless as any other."""
    from lsjax import train as tr
    from lsjax.config import from_dict, to_dict
    from lsjax.methods.longspec import train as ls_train
    from lsjax.methods.longspec.train_config import LongSpecTrainConfig

    tiny_cfg, _ = tiny_model()
    cfg = from_dict(
        LongSpecTrainConfig,
        {
            "name": "tiny-draft",
            "run_dir": str(tmp_path / "run"),
            "target": {"random_init": True, "model": to_dict(tiny_cfg)},
            "draft": {"window": 16},
            "data": {"sources": ["synthetic"], "seq_len": 32, "batch_size": 4, "synthetic_tokens": 8192},
            "optim": {"lr": 1e-2, "warmup_steps": 1, "total_steps": 30},
            "checkpoint": {"every": 30},
            "log": {"progress": False, "plot": False, "tensorboard": False},
        },
    )
    out = ls_train.fit(cfg, log=lambda *_: None)
    assert np.mean(out["losses"][-5:]) < np.mean(out["losses"][:5])  # it did learn something
    config, target_params, _ = tr.load_target(cfg)
    drafter = LongSpecDrafter(TreeConfig((2, 2, 2)), cfg.draft)
    gen = GenerateConfig(max_new_tokens=20, ignore_eos=True)
    prompts = repetitive_prompts(config, 3, 40, seed=7)
    ar = run(target_params, config, prompts, gen, ARDrafter())
    sp = run(target_params, config, prompts, gen, drafter, draft_params=out["state"].params)
    np.testing.assert_array_equal(np.asarray(sp.out), np.asarray(ar.out))


# ------------------------------------------------------------------------------ switched steps: SwitchExtras


@dataclasses.dataclass(frozen=True)
class _Guess(Drafter):
    """A fixed 2-token chain (root + 1, root + 2): a variant with nodes beyond the root."""

    tree: TreeConfig = TreeConfig((1, 1))
    name = "guess"

    def propose(self, ctx, state, draft_state, key):
        B, V = state.root.shape[0], ctx.config.vocab_size
        toks = jnp.stack([state.root, (state.root + 1) % V, (state.root + 2) % V], axis=1)
        parents = jnp.broadcast_to(jnp.asarray([-1, 0, 1], jnp.int32), (B, 3))
        return make_tree(toks, parents, jnp.ones((B, 3), bool), self.tree)


@dataclasses.dataclass(frozen=True)
class _Recorder(Drafter):
    """Alternates AR and `_Guess`; keeps each step's SwitchExtras.root_logp, root position and first token."""

    tree: TreeConfig = TreeConfig((1, 1))
    name = "recorder"

    def step_variants(self):
        return (ARDrafter(), _Guess())

    def choose(self, ctx, state):
        return (state.steps % 2).astype(jnp.int32)

    def root_logp_wanted(self, ctx, state):
        return state.steps % 4 < 3  # one step in four goes without

    def init(self, ctx, state):
        B = state.root.shape[0]
        return jnp.zeros((B, 32), jnp.float32), jnp.full((B, 32), -1, jnp.int32), jnp.zeros((B, 32), jnp.int32)

    def update(self, ctx, state, ds, verdict):
        lp, pos, tok = ds
        s = state.steps - 1
        root_at = jnp.where(verdict.count > 0, state.cache.lengths - verdict.count, -1)
        return (
            lp.at[:, s].set(verdict.extras.root_logp),
            pos.at[:, s].set(root_at),
            tok.at[:, s].set(verdict.emitted()[:, 0]),
        )


@pytest.mark.parametrize(
    "sampling",
    [
        pytest.param(SamplingConfig(temperature=0.7), marks=pytest.mark.slow),  # ~50 s; a diagnostic, not the output
        pytest.param(SamplingConfig(temperature=1.3, top_k=20), marks=pytest.mark.slow),  # 10 s
    ],
)
def test_switched_step_reports_the_targets_logprob_of_the_first_token(sampling):
    """`SwitchExtras.root_logp` is the target's processed log-probability of the token emitted after the root,
    as a full forward over the finished sequence computes it (whichever variant ran)."""
    from lsjax.cache import KVCache
    from lsjax.models import target
    from lsjax.sampling import processed_logprobs

    config, params = tiny_model()

    prompts = [list(range(5, 25)), list(range(40, 52))]
    gen = GenerateConfig(max_new_tokens=14, sampling=sampling)
    out = run(params, config, prompts, gen, _Recorder(), key=3)
    lp, pos, tok = (np.asarray(a) for a in out.draft)
    checked = 0
    for b, prompt in enumerate(prompts):
        seq = prompt + np.asarray(out.out[b, : int(out.num_out[b])]).tolist()
        t = jnp.asarray([seq])
        h, _, _ = target.forward_hidden(params, config, t, jnp.arange(len(seq))[None], KVCache.zeros(config, 1, 0))
        ref = np.asarray(processed_logprobs(target.lm_head(params, config, h)[0], sampling))
        for s in range(int(out.steps)):
            if pos[b, s] < 0:
                continue
            if s % 4 == 3:
                assert lp[b, s] == 0.0
                continue
            assert seq[pos[b, s] + 1] == tok[b, s]
            np.testing.assert_allclose(lp[b, s], ref[pos[b, s], tok[b, s]], atol=2e-4)
            checked += 1
    assert checked >= 8
    greedy = run(params, config, prompts, dataclasses.replace(gen, sampling=SamplingConfig()), _Recorder())
    assert not np.asarray(greedy.draft[0]).any()  # nothing needs it at T = 0
