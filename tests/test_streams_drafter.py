"""The Speculative Streaming drafter: greedy == AR, the drafted tree is the streams' top-k at the last
accepted node (checked against the training-time computation), pruning, checkpoints, no recompiles."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lsjax import engine
from lsjax.artifacts import BF16
from lsjax.cache import KVCache
from lsjax.config import ConfigError, GenerateConfig
from lsjax.engine.types import ARDrafter
from lsjax.errors import CorruptFileError, ShapeMismatchError
from lsjax.methods import registry
from lsjax.methods.streams import model as ss
from lsjax.methods.streams.checkpoint import load_streams, load_streams_drafter, save_streams
from lsjax.methods.streams.drafter import StreamsDrafter, prune_tree
from lsjax.models import target
from lsjax.tree import TreeConfig, make_tree
from tests.test_speculative import repetitive_prompts, run
from tests.tiny import tiny_model

SCFG = ss.StreamsConfig(num_streams=3, msa_layers=1, rank=4)


def stream_params(config, scfg=SCFG, seed=1):
    p = ss.init_params(config, scfg, jax.random.key(seed), scale=0.3)
    k1, k2 = jax.random.split(jax.random.key(seed + 1))
    p["adapter_up"] = 0.3 * jax.random.normal(k1, p["adapter_up"].shape)
    p["exit_up"] = 0.3 * jax.random.normal(k2, p["exit_up"].shape)
    return p


@pytest.mark.parametrize(
    "widths,prune_to,streams_at",
    [
        pytest.param((2, 2, 2), None, "accepted", marks=pytest.mark.slow, id="unpruned-accepted"),
        pytest.param((3, 4, 4), (2, 2, 1), "nodes", id="pruned-nodes"),
    ],
)
def test_greedy_streams_equal_ar(widths, prune_to, streams_at):
    config, params = tiny_model()
    drafter = StreamsDrafter.for_target(config, SCFG, widths, prune_to, streams_at)
    gen = GenerateConfig(max_new_tokens=24, ignore_eos=True)
    prompts = repetitive_prompts(config, 4, 40, seed=2) + [np.arange(3, 20)]
    ar = run(params, config, prompts, gen, ARDrafter())
    sp = run(params, config, prompts, gen, drafter, draft_params=stream_params(config))
    np.testing.assert_array_equal(np.asarray(sp.num_out), np.asarray(ar.num_out))
    np.testing.assert_array_equal(np.asarray(sp.out), np.asarray(ar.out))
    assert int(sp.active_steps) < int(ar.active_steps)  # some drafted nodes are accepted


def _reference_topk(params, config, sp, toks, k):
    """Stream top-k [B, T, S, k] at every position of `toks` [B, T], by the training-time computation (one
    causal pass; later positions do not affect earlier ones, so a padded buffer serves every length)."""
    B, n = toks.shape
    L = SCFG.first_layer(config)
    pos = jnp.broadcast_to(jnp.arange(n), (B, n))
    mid, _, _ = target.forward_hidden(params, config, toks, pos, KVCache.zeros(config, B, 0), layers=(0, L))
    _, mk, mv = ss.main_top_layers(params, config, SCFG, mid, pos)
    s = ss.stream_hidden(sp, params, config, SCFG, mid, pos, ss.causal_main_kv(mk, mv, pos, L))
    lp = jax.nn.log_softmax(ss.stream_logits(params, config, s), axis=-1)
    return jax.lax.top_k(lp, k)


@pytest.mark.parametrize("streams_at", ["accepted", pytest.param("nodes", marks=pytest.mark.slow)])
def test_draft_state_is_the_streams_at_the_last_accepted_node(streams_at):
    """After prefill and after each step, the drafter's state is the streams' top-k at the newest committed
    token, as the training-time pass over the committed text computes it: the verify-forward hand-off
    (taps -> verify_extras -> update) picks the right node and the right keys."""
    config, params = tiny_model()
    sp = stream_params(config)
    drafter = StreamsDrafter.for_target(config, SCFG, (2, 2, 2), streams_at=streams_at)
    gen = GenerateConfig(max_new_tokens=24, ignore_eos=True)
    prompts = repetitive_prompts(config, 4, 40, seed=2)
    B, P = len(prompts), 64
    buf = jnp.asarray(np.stack([np.pad(p, (0, P - len(p))) for p in prompts]))
    lengths = jnp.asarray([len(p) for p in prompts], jnp.int32)
    ctx = engine.context(params, sp, config, gen, 128)
    start = jax.jit(
        lambda: engine.start(params, sp, config, drafter, gen, buf, lengths, jax.random.key(0), capacity=128, chunk=32)
    )
    step = jax.jit(lambda s: engine.spec_step(ctx, drafter, gen, s))
    ref = jax.jit(_reference_topk, static_argnums=(1, 4))
    state = start()
    accepted = 0
    for _ in range(6):
        n = np.asarray(state.cache.lengths)
        text = np.zeros((B, 96), np.int32)
        for b, p in enumerate(prompts):
            row = np.concatenate([p, np.asarray(state.out[b, : int(state.num_out[b]) - 1])])[: n[b]]
            text[b, : n[b]] = row
        lp, ids = ref(params, config, sp, jnp.asarray(text), 2)
        at = jnp.asarray(n - 1)[:, None, None, None]
        np.testing.assert_allclose(
            np.asarray(state.draft.logprobs), np.asarray(jnp.take_along_axis(lp, at, 1)[:, 0]), atol=1e-4
        )
        np.testing.assert_array_equal(np.asarray(state.draft.tokens), np.asarray(jnp.take_along_axis(ids, at, 1)[:, 0]))
        old = np.asarray(state.num_out)
        state = step(state)
        accepted += int((np.asarray(state.num_out) - old - 1).sum())
    assert accepted > 0  # some steps accepted drafted nodes: the last accepted node was not always the root


def test_prune_tree_keeps_the_best_early_exit_paths():
    """Brute force over a small tree: the pruned tree is the beam of cumulative early-exit log-probs."""
    B, V = 1, 7
    full, kept = TreeConfig((3, 6)), TreeConfig((2, 2))
    parents = jnp.asarray([[-1, 0, 0, 0, 1, 1, 2, 2, 3, 3]], jnp.int32)
    tokens = jnp.asarray([[0, 1, 2, 3, 4, 5, 6, 1, 2, 3]], jnp.int32)
    tree = make_tree(tokens, parents, jnp.ones((B, 10), bool), full)
    logits = jax.random.normal(jax.random.key(0), (B, 10, V)) * 2
    sub, idx = prune_tree(tree, full, kept, logits)
    lp = np.asarray(jax.nn.log_softmax(logits, -1))[0]
    par, tok = np.asarray(parents)[0], np.asarray(tokens)[0]
    trans = np.array([0.0] + [lp[par[i], tok[i]] for i in range(1, 10)])
    lvl1 = sorted([1, 2, 3], key=lambda i: -trans[i])[:2]
    lvl2 = sorted([i for i in range(4, 10) if par[i] in lvl1], key=lambda i: -(trans[i] + trans[par[i]]))[:2]
    assert np.asarray(idx)[0].tolist() == [0] + lvl1 + lvl2
    sp = np.asarray(sub.parents)[0]
    assert [np.asarray(idx)[0][sp[j]] for j in range(3, 5)] == [par[i] for i in lvl2]  # parents remapped
    assert bool(jnp.all(sub.valid))


@pytest.mark.slow  # ~10 s; the loop's one-program property is checked in the default run with LongSpec
def test_no_recompilation_per_step():
    config, params = tiny_model()
    sp = stream_params(config)
    drafter = StreamsDrafter.for_target(config, SCFG, (3, 3, 2), (2, 2, 1))
    gen = GenerateConfig(max_new_tokens=30, ignore_eos=True)
    before = engine.decode._cache_size()
    prompt = jnp.asarray([list(np.resize([5, 9, 14, 20, 7], 20)) + [0] * 44])
    state = engine.start(
        params, sp, config, drafter, gen, prompt, jnp.array([20]), jax.random.key(0), capacity=320, chunk=32
    )
    for limit in (2, 5, 9, 14):  # state, step limit and draft state change; the program does not
        state = engine.decode(params, sp, config, drafter, gen, state, jnp.int32(limit))
    assert engine.decode._cache_size() - before == 1


@dataclasses.dataclass
class _Model:
    config: object
    params: object
    path: object


def test_checkpoints_and_registry(tmp_path):
    config, params = tiny_model()
    model = _Model(config, params, tmp_path / "tiny.gguf")
    sp = jax.tree.map(np.asarray, stream_params(config))
    save_streams(tmp_path / "s", sp, SCFG, {"tree": "3,3:2,2"})
    drafter, loaded = registry.build("streams", model, draft=str(tmp_path / "s"))
    assert isinstance(drafter, StreamsDrafter) and drafter.widths == (3, 3) and drafter.prune_to == (2, 2)
    assert drafter.layer == config.num_layers - 1
    stored = np.asarray(sp["stream_embed"][:2], BF16).astype(np.float32)  # a 2-level tree: 2 streams, in bf16
    np.testing.assert_array_equal(loaded["stream_embed"], stored)
    fewer, p2 = load_streams_drafter(model, str(tmp_path / "s"), num_streams=2, tree="2,2")
    assert fewer.streams.num_streams == 2 and p2["stream_embed"].shape[0] == 2
    with pytest.raises(ConfigError, match="streams"):
        load_streams_drafter(model, str(tmp_path / "s"), num_streams=4)
    with pytest.raises(ConfigError, match="msa_layers"):
        load_streams_drafter(model, str(tmp_path / "s"), msa_layers=2)
    save_streams(tmp_path / "bad", {**sp, "adapter_down": sp["adapter_down"][:, :5]}, SCFG)
    with pytest.raises(ShapeMismatchError, match="adapter_down"):
        registry.build("streams", model, draft=str(tmp_path / "bad"))
    (tmp_path / "s" / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{truncated")
    with pytest.raises(CorruptFileError, match="model.safetensors"):
        load_streams(tmp_path / "s")
    random, _ = registry.build("streams", model, draft="random", streams=2, msa_layers=1, tree="2,1")
    assert random.widths == (2, 1) and random.streams.num_streams == 2
    # A tree per device in the checkpoint; a tree shallower than the streams runs only the streams it reads.
    save_streams(tmp_path / "dev", sp, SCFG, {"tree": {"cpu": "1", "gpu": "4,4"}})
    one, p1 = registry.build("streams", model, draft=str(tmp_path / "dev"))
    assert one.widths == (1,) and one.streams.num_streams == 1 and p1["stream_embed"].shape[0] == 1
    with pytest.raises(ConfigError):
        StreamsDrafter.for_target(config, SCFG, (2, 2, 2, 2))  # deeper than the streams


@pytest.mark.slow
@pytest.mark.parametrize("tree", ["2,2,2", "3,4,4:2,2,2"])
def test_real_smollm2_streams_greedy_equals_ar(ours, tree):
    """On the real model (untrained streams: what is tested is the engine, not the drafts) at ~1K tokens."""
    from lsjax.engine.host import Generator
    from lsjax.prompts import stdlib_code_prompt

    ids = ours.tokenizer.encode(stdlib_code_prompt(ours.tokenizer, 1024).text)
    gen = GenerateConfig(max_new_tokens=32, ignore_eos=True)
    drafter, sp = load_streams_drafter(ours, "random", 3, 4, tree)
    ar = Generator(ours.config, ours.params).run(ids, gen)
    st = Generator(ours.config, ours.params, drafter, sp).run(ids, gen)
    assert st.tokens == ar.tokens
