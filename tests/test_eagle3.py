"""EAGLE-3 (`lsjax.methods.eagle3`): parity with the reference implementation, losslessness, the published
layouts and their misuse."""

from __future__ import annotations

import dataclasses
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
    hf = hf.get("transformer_layer_config", hf)
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


@pytest.mark.parametrize("name", [pytest.param("llama", marks=pytest.mark.slow), "qwen"])
def test_draft_matches_the_reference_implementation(name):
    """Logits at every prompt pair, at the first draft step and at every expansion inside the tree, within
    1e-4 of SafeAILab/EAGLE's (`tests/fixtures/make/eagle3_reference_fixtures.py`), and the same trees, twice: after the
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


@pytest.mark.parametrize("name", ["spec-llama", "spec-qwen3"])
def test_speculators_layout_matches_its_reference_layer(name):
    """The speculators layout: the draft's logits at every prompt pair within 1e-4 of vllm-project/speculators'
    first layer (`tests/fixtures/make/eagle3_speculators_fixtures.py`): norm_before_residual and the aux layer
    ids it names (Llama), the layer's per-head q/k norms (Qwen3)."""
    ref = np.load(FIXTURES / f"{name}.npz")
    target = fixture_target(name)
    cfg, params, info = read_draft(FIXTURES / name, target)
    assert info.format == "speculators"
    assert cfg.norm_before_residual == (name == "spec-llama") and cfg.layer.qk_norm == (name == "spec-qwen3")
    assert cfg.aux_layers == ((1, 3, 6) if name == "spec-llama" else (2, 4, 5))
    drafter = Eagle3Drafter(cfg, Eagle3Tree(4, 2, 2))
    params = jax.tree.map(jnp.asarray, params)
    ctx = DraftContext({}, params, target, capacity=64)
    ids = ref["ids"]
    h, _ = _round(drafter, ctx, KVCache.zeros(cfg.layer, 1, 64), ref["hidden"], ids[1:], 0)
    np.testing.assert_allclose(np.asarray(em.logits(params, cfg, h))[0], ref["logits_prompt"], atol=1e-4, rtol=0)


# ----------------------------------------------------------------------------------------------- lossless


def small_target():
    """A 4-layer tiny target with a 13-token vocabulary: a random draft's 6-15 node trees hit often enough that
    multi-node acceptances happen in a 24-token generation."""
    from lsjax.models import target
    from tests.tiny import tiny_model

    config, _ = tiny_model(vocab=13)
    config = dataclasses.replace(config, num_layers=4)
    return config, target.init_params(config, jax.random.key(3), scale=0.3)


@pytest.mark.parametrize(
    "fmt,budget,nbr",
    [
        pytest.param("eagle", Eagle3Tree(6, 4, 2), False, marks=pytest.mark.slow),  # the layouts load alike
        ("speculators", Eagle3Tree(15, 5, 4), True),
    ],
    ids=["eagle-6-nodes", "speculators-15-nodes-norm-before-residual"],
)
def test_greedy_equals_ar_through_either_published_layout(tmp_path, fmt, budget, nbr):
    """A random draft written in a published layout (sharded for speculators) reads back to the same weights
    and decodes exactly AR's tokens, with fewer target forwards than AR."""
    from lsjax.config import GenerateConfig
    from lsjax.engine.types import ARDrafter
    from lsjax.methods.eagle3.checkpoint import random_draft, write_draft
    from tests.test_speculative import repetitive_prompts, run

    config, params = small_target()
    cfg, dp, _ = random_draft(config, seed=1)
    if fmt == "speculators":  # the EAGLE layout always reads layers 2, L // 2, L - 3
        cfg = dataclasses.replace(cfg, norm_before_residual=nbr, aux_layers=(0, 2, 3))
    write_draft(tmp_path, cfg, dp, fmt, shards=2 if fmt == "speculators" else 1)
    got_cfg, got, info = read_draft(tmp_path, config)
    assert info.format == fmt and got_cfg == cfg
    for name in dp:
        np.testing.assert_array_equal(got[name], dp[name], err_msg=name)
    drafter = Eagle3Drafter(got_cfg, budget)
    assert drafter.check_params(got, config) is None
    gen = GenerateConfig(max_new_tokens=24, ignore_eos=True)
    prompts = repetitive_prompts(config, 3, 40, seed=1) + [np.arange(3, 12)]
    ar = run(params, config, prompts, gen, ARDrafter())
    sp = run(params, config, prompts, gen, drafter, draft_params=jax.tree.map(jnp.asarray, got))
    np.testing.assert_array_equal(np.asarray(sp.num_out), np.asarray(ar.num_out))
    np.testing.assert_array_equal(np.asarray(sp.out), np.asarray(ar.out))
    assert int(sp.steps) < int(ar.steps)


def test_tree_selection_keeps_parents_and_depths():
    """`_select` on a hand-made pool: the best `nodes` by score in pool order, each node's parent its tree
    index, a node whose parent lost a tie left out with its subtree."""
    target, _ = small_target()
    from lsjax.methods.eagle3.checkpoint import random_draft

    drafter = Eagle3Drafter(random_draft(target)[0], Eagle3Tree(4, 3, 2))
    # pool: level 1 = [0, 1]; expansion 1 children of pool 0 -> [2, 3], of pool 1 -> [4, 5]; expansion 2: 6..9
    score = jnp.array([[-0.1, -0.5, -0.2, -0.9, -0.6, -0.7, -0.3, -1.0, -2.0, -2.0]])
    tok = jnp.arange(10)[None] + 20
    parent = jnp.array([[-1, -1, 0, 0, 1, 1, 2, 2, 3, 3]])
    tree = drafter._select(jnp.array([7]), score, tok, parent)
    np.testing.assert_array_equal(tree.tokens[0], [7, 20, 21, 22, 26])
    np.testing.assert_array_equal(tree.parents[0], [-1, 0, 0, 1, 3])
    np.testing.assert_array_equal(tree.depth[0], [0, 1, 1, 2, 3])
    assert bool(tree.valid.all())
    # Pool 3 (score -0.9) does not make the cut but its child 8 would, on a higher score (which a real
    # search never gives a child): it is left out.
    score = score.at[0, 8].set(-0.05)
    tree = drafter._select(jnp.array([7]), score, tok, parent)
    np.testing.assert_array_equal(tree.tokens[0], [7, 20, 22, 26, 28])
    np.testing.assert_array_equal(tree.valid[0], [True, True, True, True, False])


# ----------------------------------------------------------------------------------------------- bad input


@pytest.fixture
def written(tmp_path):
    """(target config, a random draft for it written in the EAGLE layout)."""
    from lsjax.methods.eagle3.checkpoint import random_draft, write_draft

    config, _ = small_target()
    cfg, dp, _ = random_draft(config)
    return config, write_draft(tmp_path / "draft", cfg, dp, "eagle")


def test_a_draft_for_another_target_is_one_line_naming_both(written):
    from lsjax.errors import ShapeMismatchError
    from lsjax.methods.eagle3.checkpoint import load_eagle3

    config, path = written
    other = dataclasses.replace(config, vocab_size=31, hidden_size=40)
    with pytest.raises(ShapeMismatchError, match=r"vocabulary 13 and hidden size 48; .* has 31 and 40") as e:
        load_eagle3(types.SimpleNamespace(config=other), str(path), None)
    assert "\n" not in str(e.value)


def test_files_of_neither_layout_are_named(written, tmp_path):
    from safetensors.numpy import save_file

    from lsjax.errors import MissingTensorError, ModelNotFoundError, UnsupportedModelError

    config, path = written
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text((path / "config.json").read_text())
    save_file({"model.layers.0.mlp.up_proj.weight": np.zeros((2, 2), np.float32)}, str(bad / "model.safetensors"))
    with pytest.raises(UnsupportedModelError, match=r"expected tensors midlayer\.\* .* or layers\.0\.\*"):
        read_draft(bad, config)
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        read_draft(tmp_path, config)
    from safetensors.numpy import load_file

    tensors = load_file(str(path / "model.safetensors"))
    del tensors["fc.weight"]
    save_file(tensors, str(bad / "model.safetensors"))
    with pytest.raises(MissingTensorError, match="tensor fc.weight is missing"):
        read_draft(bad, config)


def test_unsupported_speculators_flags_and_trees_are_refused(written, tmp_path):
    from lsjax.config import ConfigError
    from lsjax.errors import UnsupportedModelError
    from lsjax.methods.eagle3.checkpoint import random_draft, write_draft
    from lsjax.methods.eagle3.drafter import parse_tree

    config, _ = written
    cfg, dp, _ = random_draft(config)
    path = write_draft(tmp_path / "spec", cfg, dp, "speculators")
    hf = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(hf | {"norm_output": True}))
    with pytest.raises(UnsupportedModelError, match="sets norm_output"):
        read_draft(path, config)
    assert parse_tree("7,3,2") == Eagle3Tree(7, 3, 2) and parse_tree("eagle2") == Eagle3Tree(59, 6, 8)
    with pytest.raises(ConfigError, match="neither a preset"):
        parse_tree("wide")
    with pytest.raises(ConfigError, match="more than the 6 candidates"):
        Eagle3Tree(7, 2, 2)


def test_a_pytorch_bin_reads_through_torch(written, tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.numpy import load_file

    config, path = written
    binned = tmp_path / "bin"
    binned.mkdir()
    (binned / "config.json").write_text((path / "config.json").read_text())
    state = {k: torch.from_numpy(v) for k, v in load_file(str(path / "model.safetensors")).items()}
    torch.save(state, binned / "pytorch_model.bin")
    cfg_a, a, _ = read_draft(path, config)
    cfg_b, b, info = read_draft(binned, config)
    assert cfg_a == cfg_b and info.format == "eagle"
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])


@pytest.mark.slow  # ~30 s
def test_draft_accept_first_level_is_what_propose_drafts_there():
    """`lsjax.bench.draft_accept.eagle3_first_level` (teacher-forced, one pass) gives at each root the first level
    `propose` grows there after a decode reached it, and scores T = 0 hits against the next token."""
    from lsjax import engine
    from lsjax.bench.draft_accept import eagle3_first_level
    from lsjax.config import GenerateConfig
    from lsjax.engine.types import ARDrafter
    from lsjax.methods.eagle3.checkpoint import random_draft
    from tests.test_speculative import run

    config, params = small_target()
    cfg, dp, _ = random_draft(config, seed=4)
    dp = jax.tree.map(jnp.asarray, dp)
    drafter = Eagle3Drafter(cfg, Eagle3Tree(6, 3, 3))
    prompt, new = [3, 5, 7, 9, 11, 4, 6], 8
    out = run(params, config, [np.array(prompt)], GenerateConfig(max_new_tokens=new, ignore_eos=True), ARDrafter())
    seq = prompt + [int(t) for t in np.asarray(out.out)[0, :new]]
    got = eagle3_first_level(params, config, dp, cfg, jnp.asarray([seq]), new - 1, 0.0)
    first = len(seq) - (new - 1) - 1
    for r in (first, first + 3, len(seq) - 2):
        gen = GenerateConfig(max_new_tokens=4)
        toks = jnp.zeros((1, 16), jnp.int32).at[0, :r].set(jnp.asarray(seq[:r]))
        state = engine.start(params, dp, config, drafter, gen, toks, jnp.array([r]), jax.random.key(0), chunk=16)
        assert int(state.root[0]) == seq[r]
        ctx = DraftContext(params, dp, config, capacity=state.cache.capacity)
        _, tok, _, _ = drafter.grow(ctx, state.draft)
        np.testing.assert_array_equal(np.asarray(got["top_ids"])[r - first, :3], np.asarray(tok)[0, :3])
    hits = np.asarray(got["top_ids"])[:, 0] == np.asarray(seq[first + 1 : first + new])
    np.testing.assert_array_equal(np.asarray(got["first"]), hits.astype(np.float32))


def test_draft_accept_chains_are_what_a_chain_drafts_there():
    """`chain2`/`chain4` of an EAGLE-3 draft (teacher-forced, one unrolled pass): at a root, the draft's logits at
    each depth are those of the 4-token chain `propose` grows there; with the continuation written as that chain,
    cut after its first m tokens, chain4 = 1 + m (and chain2 = 1 + min(m, 2))."""
    from lsjax import engine
    from lsjax.bench.draft_accept import eagle3_first_level
    from lsjax.config import GenerateConfig
    from lsjax.methods.eagle3.checkpoint import random_draft

    config, params = small_target()
    cfg, dp, _ = random_draft(config, seed=4)
    dp = jax.tree.map(jnp.asarray, dp)
    drafter = Eagle3Drafter(cfg, Eagle3Tree(4, 4, 1))
    prefix = [3, 5, 7, 9, 11, 4, 6, 8, 10, 12]
    r = len(prefix)  # the root: the target's greedy token after the prefix
    toks = jnp.zeros((1, 16), jnp.int32).at[0, :r].set(jnp.asarray(prefix))
    gen = GenerateConfig(max_new_tokens=4)
    state = engine.start(params, dp, config, drafter, gen, toks, jnp.array([r]), jax.random.key(0), chunk=16)
    prefix = prefix + [int(state.root[0])]
    _, tok, _, heads = drafter.grow(DraftContext(params, dp, config, capacity=state.cache.capacity), state.draft)
    chain = [int(t) for t in np.asarray(tok)[0, :4]]
    want = np.stack([np.asarray(heads[0])[0]] + [np.asarray(h)[0, 0] for h in heads[1:]])  # [depth, Vd]
    for m in range(5):
        wrong = [(t + 1) % config.vocab_size for t in chain]  # differs from the chain's token at depth m + 1
        seq = prefix + chain[:m] + wrong[m:] + [0, 0]
        got = eagle3_first_level(params, config, dp, cfg, jnp.asarray([seq]), len(seq) - r - 1, 0.0)
        assert float(got["chain4"][0]) == 1 + m, (m, chain, np.asarray(got["chain4"]))
        assert float(got["chain2"][0]) == 1 + min(m, 2)
        # The depths up to the first miss saw the chain's own tokens: their logits are the chain's.
        seen = min(m + 1, 4)
        top = np.sort(want, axis=-1)[:, ::-1][:, :5]
        np.testing.assert_allclose(np.asarray(got["chain_top_logits"])[0, :seen], top[:seen], rtol=1e-4, atol=1e-4)
    assert [int(t) for t in np.asarray(got["chain_top_ids"])[0, :, 0]] == chain


def test_the_prefill_hands_its_streams_to_the_draft():
    """`engine.start` runs the draft over the prompt's pairs inside the prefill (`prefill_hook`); `engine.begin`
    after a plain prefill recomputes them in `init`: the same draft state either way, over several chunks and
    rows of different lengths."""
    from lsjax import engine
    from lsjax.config import GenerateConfig
    from lsjax.methods.eagle3.checkpoint import random_draft

    config, params = small_target()
    cfg, dp, _ = random_draft(config, seed=5)
    dp = jax.tree.map(jnp.asarray, dp)
    drafter = Eagle3Drafter(cfg, Eagle3Tree(6, 3, 2))
    gen = GenerateConfig(max_new_tokens=4)
    rng = np.random.RandomState(0)
    toks = jnp.asarray(rng.randint(3, 13, (2, 48)), jnp.int32)
    lengths, key = jnp.array([37, 9]), jax.random.key(0)
    fused = engine.start(params, dp, config, drafter, gen, toks, lengths, key, capacity=64, chunk=16)
    logits, cache = engine.prefill_jit(params, config, toks, lengths, 64, chunk=16)
    plain = engine.begin(params, dp, config, drafter, gen, toks, lengths, key, cache, logits)
    np.testing.assert_array_equal(np.asarray(fused.draft.cache.lengths), np.asarray(plain.draft.cache.lengths))
    np.testing.assert_allclose(np.asarray(fused.draft.out), np.asarray(plain.draft.out), rtol=1e-5, atol=1e-4)
    for a, b, n in zip(np.asarray(fused.draft.cache.k)[0], np.asarray(plain.draft.cache.k)[0], [37, 9]):
        np.testing.assert_allclose(a[:, :n], b[:, :n], rtol=1e-5, atol=1e-4)


def test_aux_layers_d2t_and_truncated_files_are_one_line(written, tmp_path):
    from safetensors.numpy import load_file, save_file

    from lsjax.errors import CorruptFileError, ShapeMismatchError
    from lsjax.methods.eagle3.checkpoint import load_eagle3, random_draft, write_draft

    config, path = written
    shallow = dataclasses.replace(config, num_layers=2)  # the draft reads target layer 3 (L - 3 of 4 is 1, L // 2 2)
    cfg, dp, _ = random_draft(config)
    spec = write_draft(tmp_path / "spec", dataclasses.replace(cfg, aux_layers=(1, 2, 3)), dp, "speculators")
    with pytest.raises(ShapeMismatchError, match=r"reads target layers \(1, 2, 3\); .* has 2 layers"):
        load_eagle3(types.SimpleNamespace(config=shallow), str(spec), None)
    tensors = load_file(str(path / "model.safetensors"))
    tensors["d2t"] = tensors["d2t"] + 5
    save_file(tensors, str(path / "model.safetensors"))
    with pytest.raises(ShapeMismatchError, match="d2t maps draft ids outside the target's vocabulary of 13"):
        read_draft(path, config)
    data = (spec / "model.safetensors").read_bytes()
    (spec / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CorruptFileError, match="truncated or corrupt EAGLE-3 draft weights") as e:
        read_draft(spec, config)
    assert str(spec / "model.safetensors") in str(e.value) and "\n" not in str(e.value)
