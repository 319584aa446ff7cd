"""TokenSwift's released heads (`model.medusa_layers.*` in a full-model checkpoint) read as released: parity with
the reference's `MedusaModel` (tests/fixtures/make/tokenswift_reference_fixtures.py), lossless decoding,
`--draft` and its deprecated alias, and the checkpoints that are neither layout."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lsjax.config import GenerateConfig, ModelConfig
from lsjax.engine.types import ARDrafter
from lsjax.errors import MethodNote, MissingTensorError, ShapeMismatchError
from lsjax.methods.tokenswift import model as th
from lsjax.methods.tokenswift.checkpoint import draft_info, load_heads, write_released
from lsjax.methods.tokenswift.config import TokenSwiftOptions
from lsjax.methods.tokenswift.drafter import TokenSwiftConfig, TokenSwiftDrafter
from tests.test_speculative import repetitive_prompts, run
from tests.tiny import tiny_model

FIXTURES = Path(__file__).parent / "fixtures" / "tokenswift"


@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_released_heads_match_the_reference(name):
    """Each head's logits within 1e-4 of the reference `MedusaModel` chain (Llama-3.1 and Qwen2.5 releases)."""
    ref = np.load(FIXTURES / f"{name}.npz")
    hf = json.loads((FIXTURES / name / "config.json").read_text())
    config = ModelConfig(
        vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], num_heads=4, num_kv_heads=2, head_dim=8,
        rms_norm_eps=hf["rms_norm_eps"], tie_embeddings=False, eos_token_ids=(), pad_token_id=0,
    )  # fmt: skip
    params, hcfg, meta = load_heads(FIXTURES / name, config)
    assert hcfg.num_heads == 3 and meta["format"] == "tokenswift-release"
    tp = {"lm_head": jnp.asarray(ref["lm_head"].T)}
    got = th.heads_logits(jax.tree.map(jnp.asarray, params), tp, config, jnp.asarray(ref["h0"]))
    np.testing.assert_allclose(np.asarray(got), ref["logits"], atol=1e-4, rtol=0)


@pytest.mark.slow  # tokenswift equals AR in tests/test_tokenswift.py; the heads load as released in the tests above
def test_greedy_equals_ar_with_released_heads(tmp_path):
    """Random heads written in the released layout decode exactly AR's tokens through `--draft`, and `--json`
    names the layout."""
    from lsjax.methods import registry

    config, params = tiny_model()
    hp = th.init_params(config, th.HeadsConfig(), params, key=jax.random.key(2))
    path = write_released(tmp_path / "release", hp, config.hidden_size, config.vocab_size)
    model = type("Model", (), {"config": config, "params": params, "path": "tiny.gguf"})
    opts = dict(draft=str(path), ts_preset="cpu", ngram_topk=2, ngram_n=6, ts_topk=(2, 2, 1))
    drafter, dp = registry.build("tokenswift", model, **opts)
    for k in hp:
        np.testing.assert_allclose(np.asarray(dp[k]), np.asarray(hp[k]), atol=1e-7)
    assert draft_info(TokenSwiftOptions(draft=str(path))) == {"dir": str(path), "format": "tokenswift-release"}
    gen = GenerateConfig(max_new_tokens=24, ignore_eos=True)
    prompts = repetitive_prompts(config, 3, 40, seed=1)
    ar = run(params, config, prompts, gen, ARDrafter())
    sp = run(params, config, prompts, gen, drafter, draft_params=jax.tree.map(jnp.asarray, dp))
    np.testing.assert_array_equal(np.asarray(sp.out), np.asarray(ar.out))
    assert isinstance(drafter, TokenSwiftDrafter) and float(sp.mean_accepted) > 1.0


def test_heads_is_a_deprecated_alias_of_draft():
    from lsjax.methods import registry

    config, params = tiny_model()
    model = type("Model", (), {"config": config, "params": params, "path": "tiny.gguf"})
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        old = registry.build("tokenswift", model, heads="zero", ts_preset="cpu")
    notes = [str(w.message) for w in seen if issubclass(w.category, MethodNote)]
    assert notes == ["--heads is deprecated (it goes in the next release): use --draft"]
    new = registry.build("tokenswift", model, draft="zero", ts_preset="cpu")
    assert old[0] == new[0] and old[0].cfg == TokenSwiftConfig("verified", (1, 1, 1), ngram_topk=1, ngram_n=8)
    with pytest.raises(Exception, match="give one"):
        TokenSwiftOptions(draft="a", heads="b")


def test_neither_layout_and_other_targets_are_one_line(tmp_path):
    from safetensors.numpy import save_file

    config, params = tiny_model()
    full = tmp_path / "full"
    full.mkdir()
    (full / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 48}))
    save_file({"model.norm.weight": np.ones(48, np.float32)}, str(full / "model.safetensors"))
    with pytest.raises(MissingTensorError, match="neither lsjax's TokenSwift heads .* nor a TokenSwift release"):
        load_heads(full, config)
    (full / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 48, "medusa_heads": 3}))
    with pytest.raises(MissingTensorError, match="a full-model checkpoint without TokenSwift heads"):
        load_heads(full, config)
    hp = th.init_params(config, th.HeadsConfig(), params)
    other = write_released(tmp_path / "other", hp, config.hidden_size, 500)
    with pytest.raises(ShapeMismatchError, match="hidden size 48 and vocabulary 500; .* has 48 and 97") as e:
        load_heads(other, config)
    assert "\n" not in str(e.value)


@pytest.mark.slow  # ~15 s
def test_draft_accept_first_level_is_head_one_on_the_accepted_node():
    """`lsjax.bench.draft_accept.tokenswift_first_level`: at each root, head 1 on the target's hidden state at
    the node before it: what the `verified` draft pass proposes there after a decode reached that root."""
    from lsjax import engine
    from lsjax.bench.draft_accept import tokenswift_first_level
    from lsjax.engine.types import DraftContext

    config, params = tiny_model()
    hp = jax.tree.map(jnp.asarray, th.init_params(config, th.HeadsConfig(), params, key=jax.random.key(3)))
    drafter = TokenSwiftDrafter(TokenSwiftConfig(draft_pass="verified", topk=(3, 1), ngram_topk=0))
    prompt, new = [3, 5, 7, 9, 11, 4, 6, 8], 8
    out = run(params, config, [np.array(prompt)], GenerateConfig(max_new_tokens=new, ignore_eos=True), ARDrafter())
    seq = prompt + [int(t) for t in np.asarray(out.out)[0, :new]]
    got = tokenswift_first_level(params, config, hp, drafter.heads, jnp.asarray([seq]), new - 1, 0.0)
    first = len(seq) - (new - 1) - 1
    for r in (first, len(seq) - 2):
        toks = jnp.zeros((1, 32), jnp.int32).at[0, :r].set(jnp.asarray(seq[:r]))
        gen = GenerateConfig(max_new_tokens=4)
        state = engine.start(params, hp, config, drafter, gen, toks, jnp.array([r]), jax.random.key(0), chunk=32)
        assert int(state.root[0]) == seq[r]
        tree = drafter.propose(DraftContext(params, hp, config, capacity=state.cache.capacity), state, state.draft)
        np.testing.assert_array_equal(np.asarray(got["top_ids"])[r - first, :3], np.asarray(tree.tokens)[0, 1:4])
