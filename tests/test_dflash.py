"""DFlash (`lsjax.methods.dflash`): parity with the reference implementation, losslessness at T = 0, the
published layout and its misuse. The law at T > 0 is tested with every other drafter's, in
tests/test_verify_sampling.py."""

from __future__ import annotations

import dataclasses
import json
import shutil
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lsjax.cache import KVCache, commit
from lsjax.config import ConfigError, ModelConfig
from lsjax.errors import MissingTensorError, ShapeMismatchError, UnsupportedModelError
from lsjax.methods.dflash.checkpoint import load_dflash, random_draft, read_draft
from lsjax.methods.dflash.drafter import DFlashDrafter, DFlashTree, TreeShape, parse_tree
from lsjax.methods.dflash.model import DFlashDraft, default_layer_ids

FIXTURES = Path(__file__).parent / "fixtures" / "dflash"


def fixture_target(name: str) -> ModelConfig:
    """A target the fixture's draft fits: its hidden size and vocabulary, `num_target_layers` layers."""
    hf = json.loads((FIXTURES / name / "config.json").read_text())
    return ModelConfig(
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        num_layers=hf["num_target_layers"],
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        eos_token_ids=(),
        pad_token_id=0,
    )


# llama in the slow set (~10 s): the same module on Llama-3.1-8B's shapes; qwen3 is the published drafts' target
@pytest.mark.parametrize("name", ["qwen3", pytest.param("llama", marks=pytest.mark.slow)])
def test_draft_matches_the_reference_implementation(name):
    """The block's final states and the logits at block positions 1 .. s - 1 within 1e-4 (fp32) of z-lab/dflash's
    `DFlashDraftModel` (`tests/fixtures/make/dflash_reference_fixtures.py`), twice: over a first context, then
    with that context in the draft's cache and new context positions after it. "llama" reads sharded files,
    uses llama3 RoPE scaling and takes its target layers from the default rule."""
    ref = np.load(FIXTURES / f"{name}.npz")
    cfg, params, info = read_draft(FIXTURES / name, fixture_target(name))
    assert info.format == "dflash"
    assert cfg.target_layer_ids == tuple(int(i) for i in ref["target_layer_ids"])
    draft, variables = DFlashDraft(cfg), {"params": jax.tree.map(jnp.asarray, params)}
    cache = KVCache.zeros(cfg.layer, 1, 32)
    s, at = cfg.block_size, 0
    for r in (1, 2):
        ctx = ref[f"ctx_{r}"]
        k, v = draft.apply(variables, ctx[None], (at + jnp.arange(len(ctx)))[None], method="context_kv")
        cache = commit(cache, k, v, jnp.array([len(ctx)]))
        at += len(ctx)
        hidden = draft.apply(variables, ref[f"noise_{r}"][None], (at + jnp.arange(s))[None], cache)
        logits = draft.apply(variables, hidden[:, 1:], None, ref["lm_head"], method="logits")
        np.testing.assert_allclose(np.asarray(hidden)[0], ref[f"hidden_{r}"], atol=1e-4, rtol=0, err_msg=f"{r}")
        np.testing.assert_allclose(np.asarray(logits)[0], ref[f"logits_{r}"], atol=1e-4, rtol=0, err_msg=f"{r}")


def test_default_layer_ids_follow_the_published_rule():
    assert default_layer_ids(36, 5) == (1, 9, 17, 25, 33)  # z-lab/Qwen3-8B-DFlash-b16's
    assert default_layer_ids(30, 1) == (15,)


# ----------------------------------------------------------------------------------------------- lossless


def small_target():
    """A 4-layer tiny target with a 13-token vocabulary (a random draft's blocks hit often enough)."""
    from lsjax.models import target
    from tests.tiny import tiny_model

    config, _ = tiny_model(vocab=13)
    config = dataclasses.replace(config, num_layers=4)
    return config, target.init_params(config, jax.random.key(3), scale=0.3)


@pytest.mark.parametrize("budget", [None, DFlashTree(8, 3)], ids=["chain", "tree-8-top3"])
def test_greedy_equals_ar(budget):
    """A random draft's chain and tree decode exactly AR's tokens (T = 0), several rows of different lengths."""
    from lsjax.config import GenerateConfig
    from lsjax.engine.types import ARDrafter
    from tests.test_speculative import repetitive_prompts, run

    config, params = small_target()
    cfg, dp, _ = random_draft(config, layers=2, block_size=5, seed=1)
    drafter = DFlashDrafter(cfg, budget)
    dp = jax.tree.map(jnp.asarray, dp)
    assert drafter.check_params(dp, config) is None
    gen = GenerateConfig(max_new_tokens=24, ignore_eos=True)
    prompts = repetitive_prompts(config, 3, 40, seed=1) + [np.arange(3, 12)]
    ar = run(params, config, prompts, gen, ARDrafter())
    sp = run(params, config, prompts, gen, drafter, draft_params=dp)
    np.testing.assert_array_equal(np.asarray(sp.num_out), np.asarray(ar.num_out))
    np.testing.assert_array_equal(np.asarray(sp.out), np.asarray(ar.out))
    if budget is not None:
        assert int(sp.steps) < int(ar.steps)


def test_the_prefill_hands_its_streams_to_the_draft():
    """`engine.start` fills the draft's context cache inside the prefill (`prefill_hook`); `engine.begin` after a
    plain prefill recomputes it in `init`: the same cache either way, over several chunks and rows of
    different lengths."""
    from lsjax import engine
    from lsjax.config import GenerateConfig

    config, params = small_target()
    cfg, dp, _ = random_draft(config, layers=2, block_size=4, seed=5)
    dp = jax.tree.map(jnp.asarray, dp)
    drafter = DFlashDrafter(cfg)
    gen = GenerateConfig(max_new_tokens=4)
    toks = jnp.asarray(np.random.RandomState(0).randint(3, 13, (2, 48)), jnp.int32)
    lengths, key = jnp.array([37, 9]), jax.random.key(0)
    fused = engine.start(params, dp, config, drafter, gen, toks, lengths, key, capacity=64, chunk=16)
    logits, cache = engine.prefill_jit(params, config, toks, lengths, 64, chunk=16)
    plain = engine.begin(params, dp, config, drafter, gen, toks, lengths, key, cache, logits)
    np.testing.assert_array_equal(np.asarray(fused.draft.cache.lengths), [37, 9])
    np.testing.assert_array_equal(np.asarray(plain.draft.cache.lengths), [37, 9])
    for a, b, n in zip(np.asarray(fused.draft.cache.k)[1], np.asarray(plain.draft.cache.k)[1], [37, 9]):
        np.testing.assert_allclose(a[:, :n], b[:, :n], rtol=1e-5, atol=1e-4)


def test_tree_shapes_keep_the_chain_ranks_and_parents_in_order():
    shape = TreeShape.grow(DFlashTree(8, 3), 5)
    assert shape.widths == (2, 3, 2, 1) and sum(shape.widths) == 8
    depth = shape.depths
    for i, (p, r) in enumerate(zip(shape.parents, shape.ranks)):
        if i:
            assert p < i and depth[p] == depth[i] - 1
            siblings = [j for j in range(1, i) if shape.parents[j] == p]
            assert r == len(siblings)  # ranks 0, 1, ... in order: the draw order at T > 0
    chain = [0]
    while (kids := [j for j, p in enumerate(shape.parents) if p == chain[-1] and shape.ranks[j] == 0]) != []:
        chain.append(kids[0])
    assert len(chain) == 5  # the rank-0 chain reaches the block's last position
    assert TreeShape.chain(3) == TreeShape((-1, 0, 1, 2), (0, 0, 0, 0), (1, 1, 1))
    assert parse_tree("cpu", 16) == DFlashTree(8, 2, 4) and parse_tree("gpu", 4) == DFlashTree(32, 4, 3)
    assert parse_tree(None, 16) is None and parse_tree("9,2", 16) == DFlashTree(9, 2)


def test_a_tree_deeper_than_the_block_or_too_small_for_its_chain_names_both():
    config, _ = small_target()
    cfg, _, _ = random_draft(config, block_size=8)
    with pytest.raises(ConfigError, match=r"--dflash-tree 20,2,9: 9 levels, but a block of 8 tokens drafts 7") as e:
        DFlashDrafter(cfg, parse_tree("20,2,9", 8))
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=r"5 nodes cannot hold the block's 7-token chain \(block size 8\)"):
        DFlashDrafter(cfg, parse_tree("5,2", 8))
    with pytest.raises(ConfigError, match="neither a preset"):
        parse_tree("wide", 8)


# ----------------------------------------------------------------------------------------------- bad input


@pytest.fixture
def written(tmp_path):
    """(the "qwen3" fixture's target config, a copy of its draft directory)."""
    path = tmp_path / "draft"
    shutil.copytree(FIXTURES / "qwen3", path)
    return fixture_target("qwen3"), path


@pytest.mark.parametrize(
    "change,match",
    [
        ({"hidden_size": 40}, r"for a target of hidden size 32 \(its own 32\); .* has 40"),
        ({"vocab_size": 90}, r"for a target with vocabulary 67; .* has 90"),
        ({"num_layers": 4}, r"reads target layers \[1, 2, 4\] \(target_layer_ids\); .* has 4 layers"),
    ],
    ids=["hidden", "vocabulary", "depth"],
)
def test_a_draft_for_another_target_is_one_line_naming_both(written, change, match):
    config, path = written
    other = dataclasses.replace(config, **change)
    with pytest.raises(ShapeMismatchError, match=match) as e:
        load_dflash(types.SimpleNamespace(config=other), str(path))
    assert "\n" not in str(e.value) and str(path) in str(e.value)


def test_a_mask_token_outside_the_vocabulary_names_both(written):
    config, path = written
    hf = json.loads((path / "config.json").read_text())
    hf["dflash_config"]["mask_token_id"] = 80
    (path / "config.json").write_text(json.dumps(hf))
    with pytest.raises(ShapeMismatchError, match=r"mask token 80 is outside .* vocabulary of 67"):
        load_dflash(types.SimpleNamespace(config=config), str(path))


def test_an_unknown_layout_lists_the_layouts_recognised(written, tmp_path):
    from safetensors.numpy import load_file, save_file

    config, path = written
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text((path / "config.json").read_text())
    save_file({"model.layers.0.mlp.up_proj.weight": np.zeros((2, 2), np.float32)}, str(bad / "model.safetensors"))
    with pytest.raises(UnsupportedModelError, match=r"recognised: dflash: z-lab/dflash's DFlashDraftModel .*found"):
        read_draft(bad, config)
    tensors = load_file(str(path / "model.safetensors"))
    del tensors["layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(bad / "model.safetensors"))
    with pytest.raises(MissingTensorError, match=r"tensor layers\.1\.mlp\.up_proj\.weight is missing"):
        read_draft(bad, config)
    hf = json.loads((path / "config.json").read_text())
    sliding = {"use_sliding_window": True, "layer_types": ["sliding_attention"]}
    (path / "config.json").write_text(json.dumps(hf | sliding))
    with pytest.raises(UnsupportedModelError, match="sliding-window layers"):
        read_draft(path, config)


def test_a_block_size_option_overrides_the_drafts(written):
    config, path = written
    drafter, _ = load_dflash(types.SimpleNamespace(config=config), str(path), "2,2", block_size=3)
    assert drafter.draft.block_size == 3 and drafter.tree.widths == (1, 1)
    with pytest.raises(ConfigError, match="a block of 3 tokens drafts 2"):
        load_dflash(types.SimpleNamespace(config=config), str(path), "4,2,3", block_size=3)


@pytest.mark.slow  # the bench's view of the drafter; the drafter itself is tested against AR in the default run
def test_draft_accept_blocks_are_what_propose_drafts_there():
    """`lsjax.bench.draft_accept --method dflash` reads, at every root of a known continuation, the block the
    drafter proposes there: its teacher-forced blocks (`teacher_forced_blocks`) equal `propose` after a prefill of
    everything before the root, and its `first`/`chain` keys are those blocks' matches."""
    from lsjax import engine
    from lsjax.bench.draft_accept import dflash_first_level
    from lsjax.config import GenerateConfig
    from lsjax.engine.types import DraftContext
    from lsjax.methods.dflash.drafter import teacher_forced_blocks

    config, params = small_target()
    cfg, dp, _ = random_draft(config, layers=2, block_size=5, seed=2)
    dp = jax.tree.map(jnp.asarray, dp)
    drafter = DFlashDrafter(cfg)
    gen = GenerateConfig(max_new_tokens=12, ignore_eos=True)
    prompt = np.array([3, 5, 7, 3, 5, 7, 9, 4, 3, 5], np.int32)
    toks = jnp.asarray(np.pad(prompt, (0, 22))[None])
    ar, key = engine.ARDrafter(), jax.random.key(0)
    state = engine.start(params, dp, config, ar, gen, toks, jnp.array([10]), key, chunk=16)
    state = engine.decode(params, dp, config, ar, gen, state, jnp.int32(20))
    seq = np.concatenate([prompt, np.asarray(state.out)[0, :12]])
    tokens = jnp.asarray(seq[None])
    first, new = 12, 6
    logits, _ = teacher_forced_blocks(params, config, dp, cfg, tokens, first, new)
    for i, r in enumerate(range(first, first + new)):
        buf = jnp.asarray(np.pad(seq[:r], (0, 32 - r))[None])
        st = engine.start(params, dp, config, drafter, gen, buf, jnp.array([r]), key, chunk=16)
        assert int(st.root[0]) == seq[r]
        ctx = DraftContext(params, dp, config, capacity=st.cache.capacity)
        tree = drafter.propose(ctx, st, st.draft, jax.random.key(1))
        np.testing.assert_array_equal(np.asarray(tree.tokens)[0, 1:], np.argmax(np.asarray(logits)[i], axis=-1))
    # its roots are the last `new` but one of `length` tokens: the same roots as `logits`
    got = dflash_first_level(params, config, dp, cfg, tokens, new, 0.0, length=jnp.int32(first + new + 1))
    top1 = np.argmax(np.asarray(logits), axis=-1)  # [new, 4]
    np.testing.assert_array_equal(np.asarray(got["first"]), (top1[:, 0] == seq[first + 1 : first + 1 + new]))
    assert np.all(np.asarray(got["chain2"]) >= 1) and np.all(np.asarray(got["chain4"]) <= 4)
    # What `--dump` writes at every block position: the block's top proposals there, position 1's as `top_ids`
    ids = np.asarray(got["block_top_ids"])
    assert ids.shape == (new, cfg.block_size - 1, 5)
    np.testing.assert_array_equal(ids[:, :, 0], top1)
    np.testing.assert_array_equal(ids[:, 0], np.asarray(got["top_ids"]))
    np.testing.assert_allclose(np.asarray(got["block_top_logits"])[:, :, 0], np.max(np.asarray(logits), -1), rtol=1e-6)


def test_a_pytorch_bin_reads_through_torch_and_a_config_without_dflash_keys_is_named(written, tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.numpy import load_file

    config, path = written
    binned = tmp_path / "bin"
    binned.mkdir()
    (binned / "config.json").write_text((path / "config.json").read_text())
    state = {k: torch.from_numpy(v) for k, v in load_file(str(path / "model.safetensors")).items()}
    torch.save(state, binned / "pytorch_model.bin")
    cfg_a, a, _ = read_draft(path, config)
    cfg_b, b, _ = read_draft(binned, config)
    assert cfg_a == cfg_b
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(x, y)
    hf = json.loads((path / "config.json").read_text())
    (binned / "config.json").write_text(json.dumps({k: v for k, v in hf.items() if k != "dflash_config"}))
    with pytest.raises(UnsupportedModelError, match="no dflash_config.mask_token_id"):
        read_draft(binned, config)
    (binned / "config.json").write_text(json.dumps({k: v for k, v in hf.items() if k != "block_size"}))
    with pytest.raises(UnsupportedModelError, match="no block_size"):
        read_draft(binned, config)
