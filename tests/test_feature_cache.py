"""The shared target-feature cache: every field equals the target's own forward; builds resume exactly."""

import filecmp
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lsjax import attention
from lsjax.cache import KVCache
from lsjax.config import ModelConfig
from lsjax.models import target as target_lib
from lsjax.models.layers import mlp, rms_norm
from lsjax.models.target import qkv_projection
from lsjax.rope import inverse_frequencies, rope_angles
from lsjax.train import feature_cache as fcm

CFG = ModelConfig(
    vocab_size=97, hidden_size=32, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=8, intermediate_size=64
)
SPEC = fcm.FeatureSpec(mid_layer=2, topk=4)


@pytest.fixture(scope="module")
def params():
    return target_lib.init_params(CFG, jax.random.PRNGKey(0), scale=0.2)


def _tokens(S, T, seed=1):
    return np.asarray(jax.random.randint(jax.random.PRNGKey(seed), (S, T), 0, CFG.vocab_size), np.int32)


# 520: three 256-query blocks, the last one partial (24, one partial block, in the slow set)
@pytest.mark.parametrize("T", [pytest.param(24, marks=pytest.mark.slow), 520])
def test_fields_equal_the_target_forward(params, T):
    toks = _tokens(2, T)
    out = jax.device_get(fcm.feature_pass(params, CFG, jnp.asarray(toks), SPEC))
    pos = jnp.broadcast_to(jnp.arange(T), (2, T))
    hidden, new_k, new_v = target_lib.forward_hidden(params, CFG, jnp.asarray(toks), pos, KVCache.zeros(CFG, 2, 0))
    f32 = lambda a: np.asarray(a, np.float32)  # noqa: E731
    np.testing.assert_allclose(f32(out["hidden"]), hidden, rtol=2e-3, atol=2e-3)
    np.testing.assert_allclose(fcm.rope_keys(out["k"], pos, CFG), new_k[-1].swapaxes(1, 2), rtol=2e-3, atol=2e-3)
    np.testing.assert_allclose(f32(out["v"]), new_v[-1].swapaxes(1, 2), rtol=2e-3, atol=2e-3)
    logp = jax.nn.log_softmax(target_lib.lm_head(params, CFG, hidden), -1)
    np.testing.assert_array_equal(out["topk_ids"][..., 0], np.argmax(logp, -1))
    np.testing.assert_allclose(
        f32(out["topk_logprobs"]), np.take_along_axis(np.asarray(logp), out["topk_ids"], -1), atol=5e-3
    )
    assert np.all(np.diff(f32(out["topk_logprobs"]), axis=-1) <= 0)

    # The top layers run from mid_hidden reproduce the final hidden state (what Speculative Streaming trains on).
    x = jnp.asarray(f32(out["mid_hidden"]))
    cos, sin = rope_angles(pos, inverse_frequencies(CFG))
    for i in range(SPEC.mid_layer, CFG.num_layers):
        lay = jax.tree.map(lambda a, i=i: a[i], params["layers"])
        q, k, v = qkv_projection(lay, CFG, rms_norm(x, lay["attn_norm"], CFG.rms_norm_eps), cos, sin)
        o, _ = attention.tree_attention_xla(q, k, v, causal=True)
        x = x + jnp.einsum("btnh,nhd->btd", o, lay["wo"])
        x = x + mlp(lay, rms_norm(x, lay["mlp_norm"], CFG.rms_norm_eps))
    np.testing.assert_allclose(x, hidden, rtol=5e-3, atol=5e-3)


def test_resumed_build_writes_identical_files(params, tmp_path):
    toks = _tokens(10, 16, seed=3)
    mask = (toks % 3 > 0).astype(np.uint8)
    kw = dict(spec=SPEC, shard_size=4, batch_size=2, progress=False, log=lambda *_: None)
    fcm.build(tmp_path / "whole", toks, mask, params, CFG, **kw)
    part = fcm.build(tmp_path / "resumed", toks, mask, params, CFG, max_shards=1, **kw)
    assert (part.num_sequences, part.complete) == (4, False)
    with pytest.raises(fcm.FeatureCacheError, match="incomplete"):
        fcm.FeatureCache.open(tmp_path / "resumed")
    (tmp_path / "resumed" / "shard-00001.tmp").mkdir()  # a shard killed mid-write is redone
    fcm.build(tmp_path / "resumed", toks, mask, params, CFG, **kw)
    for d in ("shard-00000", "shard-00001", "shard-00002"):
        names = [f"{f}.npy" for f in fcm.SHARD_FIELDS]
        whole, resumed = tmp_path / "whole" / d, tmp_path / "resumed" / d
        match, mismatch, errors = filecmp.cmpfiles(whole, resumed, names, shallow=False)
        assert mismatch == [] and errors == [] and len(match) == len(names)
    assert not (tmp_path / "resumed" / "shard-00001.tmp").exists()

    fc = fcm.FeatureCache.open(tmp_path / "whole")
    assert (fc.num_sequences, fc.seq_len, fc.mid_layer, fc.topk) == (10, 16, 2, 4)
    # Stored in a seeded shuffled order; each row's features are those of its own tokens.
    assert sorted(map(tuple, fc.tokens)) == sorted(map(tuple, toks))
    rows = fc.read(np.array([9, 0, 5]), ("tokens", "loss_mask", "hidden", "topk_ids"))
    assert rows["hidden"].shape == (3, 16, CFG.hidden_size) and rows["hidden"].dtype == np.float16
    direct = jax.device_get(fcm.feature_pass(params, CFG, jnp.asarray(rows["tokens"]), SPEC))
    np.testing.assert_array_equal(rows["topk_ids"], direct["topk_ids"])
    np.testing.assert_array_equal(rows["loss_mask"], (rows["tokens"] % 3 > 0).astype(np.uint8))


def test_named_errors(params, tmp_path):
    with pytest.raises(fcm.FeatureCacheError, match="no manifest"):
        fcm.FeatureCache.open(tmp_path / "nothing")
    toks = _tokens(4, 8)
    kw = dict(spec=SPEC, shard_size=2, batch_size=2, progress=False)
    fcm.build(tmp_path / "a", toks, np.ones_like(toks, np.uint8), params, CFG, **kw)
    with pytest.raises(fcm.FeatureCacheError, match="another set"):
        fcm.build(tmp_path / "a", toks[::-1], np.ones_like(toks, np.uint8), params, CFG, **kw)
    fc = fcm.FeatureCache.open(tmp_path / "a")
    with pytest.raises(fcm.FeatureCacheError, match="out of range"):
        fc.read(np.array([4]), ("tokens",))
    with pytest.raises(fcm.FeatureCacheError, match="unknown field"):
        fc.read(np.array([0]), ("logits",))
    with pytest.raises(fcm.FeatureCacheError, match="mid_layer"):
        fcm.build(tmp_path / "b", toks, toks, params, CFG, spec=fcm.FeatureSpec(mid_layer=9))
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    (tmp_path / "a" / "manifest.json").write_text(json.dumps({**manifest, "version": 0}))
    with pytest.raises(fcm.FeatureCacheError, match="version"):
        fcm.FeatureCache.open(tmp_path / "a")
