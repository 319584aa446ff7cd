"""The target model against HF transformers (tiny random configs built here, and the real SmolLM2 GGUF),
plus invariances: prefill + step decode == full forward, padding / bucket size changes nothing,
bounded traces."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lsjax import engine
from lsjax.cache import KVCache
from lsjax.config import ConfigError, GenerateConfig
from lsjax.engine.types import ARDrafter
from lsjax.models import target
from tests.tiny import tiny_model

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TINY = dict(
    vocab_size=160,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=1024,
    rms_norm_eps=1e-6,
)
ROPES = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 2.0},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    },
}


def tiny_hf(tmp_path, kind: str, tie: bool, rope: str = "default", seed: int = 0):
    """A tiny random HF model saved with save_pretrained and loaded back through lsjax."""
    torch.manual_seed(seed)
    cfg_cls, model_cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
    }[kind]
    extra = {"rope_scaling": ROPES[rope]} if ROPES[rope] else {}
    model = model_cls(cfg_cls(**TINY, tie_word_embeddings=tie, bos_token_id=1, eos_token_id=2, **extra)).eval()
    with torch.no_grad():  # norms init to 1 and biases to 0: perturb them so a mix-up would show
        for name, p in model.named_parameters():
            if "norm" in name or "bias" in name:
                p.add_(0.1 * torch.randn_like(p))
    path = tmp_path / f"{kind}-{rope}-{tie}"
    model.save_pretrained(path)
    from lsjax.loading.hf import load_hf

    config, params = load_hf(path)
    return model, config, jax.tree.map(jnp.asarray, params)


forward = jax.jit(target.forward, static_argnames=("config", "backend"))
prefill = jax.jit(engine.prefill, static_argnames=("config", "chunk", "backend"))
_spec_run = jax.jit(engine.run, static_argnames=("config", "gen", "drafter", "capacity", "chunk", "backend"))


def generate_ar(params, config, tokens, lengths, gen, key):
    return _spec_run(params, (), config, tokens, lengths, gen, key)


# Every family and both tyings in the default run; the slow set adds the remaining combinations.
CASES = [
    pytest.param("llama", False, "llama3", marks=pytest.mark.slow),
    ("llama", True, "linear"),
    pytest.param("qwen2", True, "default", marks=pytest.mark.slow),  # qwen2 untied and its bias stay by default
    ("qwen2", False, "llama3"),
    # per-head q/k RMSNorm (perturbed from 1 by `tiny_hf`), no q/k/v bias
    pytest.param("qwen3", False, "default", marks=pytest.mark.slow),
    ("qwen3", True, "llama3"),
]


@pytest.mark.parametrize("kind,tie,rope", CASES)
def test_parity_with_transformers(tmp_path, kind, tie, rope):
    model, config, params = tiny_hf(tmp_path, kind, tie, rope)
    assert config.rope_scaling.kind == rope
    assert (config.qk_norm, config.qkv_bias) == (kind == "qwen3", kind == "qwen2")
    B, P, extra = 2, 300, 12
    toks = np.random.RandomState(1).randint(0, config.vocab_size, size=(B, P + extra))
    with torch.no_grad():
        ref = model(torch.tensor(toks)).logits.numpy()  # [B, P + extra, V]

    # No cache: one causal forward over everything.
    pos = jnp.broadcast_to(jnp.arange(P + extra), (B, P + extra))
    logits, _ = target.forward(params, config, jnp.asarray(toks), pos, KVCache.zeros(config, B, 1024))
    np.testing.assert_allclose(np.asarray(logits), ref, atol=1e-4, rtol=0)

    # With cache: chunked prefill then one token at a time.
    buf = np.zeros((B, 512), np.int32)
    buf[:, :P] = toks[:, :P]
    last, cache = prefill(
        params, config, jnp.asarray(buf), jnp.full((B,), P), KVCache.zeros(config, B, 1024), chunk=128
    )
    np.testing.assert_allclose(np.asarray(last), ref[:, P - 1], atol=1e-4, rtol=0)
    prepared = target.prepare_for_decode(params, config)  # the decode layout: fused, per layer
    for t in range(P, P + extra):
        step, _ = forward(prepared, config, jnp.asarray(toks[:, t : t + 1]), cache.lengths[:, None], cache)
        np.testing.assert_allclose(np.asarray(step[:, 0]), ref[:, t], atol=1e-4, rtol=0)
        step, cache = forward(params, config, jnp.asarray(toks[:, t : t + 1]), cache.lengths[:, None], cache)
        np.testing.assert_allclose(np.asarray(step[:, 0]), ref[:, t], atol=1e-4, rtol=0)


@pytest.fixture(scope="module")
def tiny():
    return tiny_model()


def full_logits(params, config, toks, pad_to=None):
    """Logits of one causal forward; right-padding to `pad_to` keeps one compiled shape (causal: no effect)."""
    B, T = toks.shape
    P = pad_to or T
    buf = np.zeros((B, P), np.int32)
    buf[:, :T] = toks
    pos = jnp.broadcast_to(jnp.arange(P), (B, P))
    logits, _ = forward(params, config, jnp.asarray(buf), pos, KVCache.zeros(config, B, 1024))
    return np.asarray(logits)[:, :T]


def test_prefill_then_decode_equals_full_forward(tiny):
    config, params = tiny
    toks = np.random.RandomState(0).randint(0, config.vocab_size, size=(1, 90))
    ref = full_logits(params, config, toks)
    buf = np.zeros((1, 256), np.int32)
    buf[:, :50] = toks[:, :50]
    last, cache = prefill(params, config, jnp.asarray(buf), jnp.array([50]), KVCache.zeros(config, 1, 512), chunk=32)
    np.testing.assert_allclose(np.asarray(last), ref[:, 49], atol=5e-5, rtol=1e-5)
    for t in range(50, 90):
        step, cache = forward(params, config, jnp.asarray(toks[:, t : t + 1]), cache.lengths[:, None], cache)
        np.testing.assert_allclose(np.asarray(step[:, 0]), ref[:, t], atol=5e-5, rtol=1e-5)
    assert int(cache.lengths[0]) == 90


def test_decode_layout_equals_training_layout(tiny):
    """prepare_for_decode's layout (per-layer, fused q/k/v and gate/up) runs the same model: a tree forward over
    a cache gives the same logits and K/V as the stacked layout, with and without qkv biases."""
    import dataclasses

    from lsjax.engine.verify import tree_forward
    from lsjax.tree import TreeConfig, make_tree

    config, params = tiny
    for cfg in (dataclasses.replace(config, qkv_bias=True),):  # biases: the fused b_qkv too
        p = target.init_params(cfg, jax.random.key(1), scale=0.3)
        prepared = target.prepare_for_decode(p, cfg)
        assert target.is_prepared(prepared) and not target.is_prepared(p)
        assert target.prepare_for_decode(prepared, cfg) is prepared  # idempotent
        assert len(prepared["layers"]) == cfg.num_layers and "wq" not in prepared["layers"][0]
        assert target.layout_of(prepared) == "both"  # this CPU's default: see target.default_layout
        # Every storage of the projections, and each made from another, runs the same model.
        layouts = {name: target.prepare_for_decode(p, cfg, layout=name) for name in target.LAYOUTS}
        assert {target.layout_of(v) for v in layouts.values()} == set(target.LAYOUTS)
        converted = target.prepare_for_decode(layouts["out"], cfg, layout="in")
        np.testing.assert_array_equal(converted["layers"][1]["w_qkv"], layouts["in"]["layers"][1]["w_qkv"])
        rng = np.random.RandomState(0)
        kv = [jnp.asarray(rng.randn(cfg.num_layers, 2, cfg.num_kv_heads, 96, cfg.head_dim), jnp.float32)] * 2
        cache = KVCache(*kv, jnp.array([64, 40], jnp.int32))  # rows of different lengths
        parents = jnp.asarray([[-1, 0, 0, 1, 2]] * 2)
        tree = make_tree(
            jnp.asarray(rng.randint(0, cfg.vocab_size, (2, 5))), parents, jnp.ones((2, 5), bool), TreeConfig((2, 2))
        )
        run = jax.jit(tree_forward, static_argnums=1)
        ref = run(p, cfg, tree, cache)
        runs = [run(v, cfg, tree, cache) for v in (prepared, converted, *layouts.values())]
        for a, b in [pair for out in runs for pair in zip(ref, out)]:
            # fp32, two summation orders (fused vs separate projections): tolerance relative to the array's scale
            # (logits reach ~25 here; a 1.6e-5 difference on a -0.1 logit failed a fixed 1e-5 once).
            scale = float(np.max(np.abs(np.asarray(a))))
            np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=2e-6 * scale, rtol=1e-5)
    host = target.prepare_for_decode(jax.tree.map(np.asarray, params), config)
    assert isinstance(host["layers"][0]["w_qkv"], np.ndarray)  # numpy in, numpy out: one device copy later


def test_a_projection_stored_both_ways_uses_out_major_rows_from_three_rows():
    """`project` multiplies the [out, in] copy for 3+ rows (cheaper on XLA CPU) and the [in, out] one below;
    a layer holding only one copy uses it whatever the rows. Made visible by two copies that disagree."""
    w = jnp.asarray(np.random.RandomState(0).randn(4, 6), jnp.float32)
    both = {"w_down": w, "w_down_t": -w.T}
    for rows, sign in ((1, 1), (2, 1), (3, -1), (8, -1)):
        x = jnp.ones((1, rows, 4), jnp.float32)
        np.testing.assert_allclose(target.project(both, "w_down", x), sign * (x @ w), rtol=1e-6)
        np.testing.assert_allclose(target.project({"w_down_t": w.T}, "w_down", x), x @ w, rtol=1e-6)
        np.testing.assert_allclose(target.project({"w_down": w}, "w_down", x), x @ w, rtol=1e-6)
    config, params = tiny_model()
    with pytest.raises(ConfigError, match="layout: expected one of in, out, both, got 'rows'"):
        target.prepare_for_decode(params, config, layout="rows")


@pytest.mark.slow  # the default run compares stacked prefills with AR through every decode test
def test_a_prefill_over_stacked_layers_is_the_unrolled_one():
    """`target.stack_layers` (the prefill's layers under `lax.scan`, which compiles ~4x faster) runs the same
    layer code: the prefill's logits and cache, and a forward's tapped streams, equal the unrolled layers' to
    the bit, from either storage of the projections; only the copy `project` reads for the rows is stacked."""
    import dataclasses

    config, params = tiny_model(arch="qwen3")
    config = dataclasses.replace(config, qkv_bias=True)  # per-head q/k norms and the fused bias, stacked too
    params = target.init_params(config, jax.random.key(4), scale=0.3)
    rng = np.random.RandomState(1)
    lengths = jnp.array([70, 5])
    buf = jnp.asarray(rng.randint(0, config.vocab_size, (2, 128)), jnp.int32)
    for layout in ("in", "both"):  # ("out" is "both" at 64 rows)
        prepared = target.prepare_for_decode(params, config, layout=layout)
        stacked = target.stack_layers(prepared, rows=64)
        assert target.is_stacked(stacked) and not target.is_stacked(prepared)
        assert stacked["layers"]["w_down" if layout == "in" else "w_down_t"].shape[0] == config.num_layers
        assert ("w_down" in stacked["layers"]) != ("w_down_t" in stacked["layers"])
        if layout == "both":
            assert "w_down" in target.stack_layers(prepared, rows=1)["layers"]
        outs = [
            jax.jit(lambda p, scan: engine.prefill(p, config, buf, lengths, KVCache.zeros(config, 2, 256), chunk=32,
                                            scan_layers=scan), static_argnums=1)(prepared, scan)
            for scan in (False, True)
        ]  # fmt: skip
        for a, b in zip(jax.tree.leaves(outs[0]), jax.tree.leaves(outs[1])):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        cache = outs[0][1]
        toks, pos = buf[:, 70:73], cache.lengths[:, None] + jnp.arange(3)
        run = jax.jit(lambda p, t, x, c: target.forward_streams(p, config, t, x, c, (0, 1, 2)))
        for a, b in zip(run(prepared, toks, pos, cache), run(stacked, toks, pos, cache)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert target.stack_layers(params, rows=64) is params  # the training layout scans already


@pytest.mark.parametrize("bucket,chunk", [pytest.param(128, 32, marks=pytest.mark.slow), (256, 64), (512, 256)])
def test_padding_and_bucket_size_do_not_change_logits(tiny, bucket, chunk):
    """Rows of different lengths, padded with garbage, in buckets and chunks of several sizes."""
    config, params = tiny
    rng = np.random.RandomState(0)
    lengths = [37, 100, 1]
    rows = [rng.randint(0, config.vocab_size, size=n) for n in lengths]
    buf = rng.randint(0, config.vocab_size, size=(3, bucket)).astype(np.int32)  # padding is random tokens
    for b, r in enumerate(rows):
        buf[b, : len(r)] = r
    last, cache = prefill(
        params, config, jnp.asarray(buf), jnp.array(lengths), KVCache.zeros(config, 3, 1024), chunk=chunk
    )
    for b, r in enumerate(rows):
        np.testing.assert_allclose(
            np.asarray(last[b]), full_logits(params, config, r[None], pad_to=128)[0, -1], atol=5e-5, rtol=1e-5
        )
    np.testing.assert_array_equal(np.asarray(cache.lengths), lengths)


def greedy_reference(params, config, prompt, n):
    toks = list(prompt)
    for _ in range(n):
        toks.append(int(np.argmax(full_logits(params, config, np.array([toks]), pad_to=128)[0, -1])))
    return toks[len(prompt) :]


def test_generate_ar_matches_naive_greedy(tiny):
    config, params = tiny
    prompt = np.random.RandomState(5).randint(3, config.vocab_size, size=40)
    gen = GenerateConfig(max_new_tokens=12, ignore_eos=True)
    buf = np.zeros((1, 256), np.int32)
    buf[0, :40] = prompt
    state = generate_ar(params, config, jnp.asarray(buf), jnp.array([40]), gen, jax.random.key(0))
    assert int(state.num_out[0]) == 12
    assert np.asarray(state.out[0]).tolist() == greedy_reference(params, config, prompt, 12)


def test_stop_tokens_end_generation(tiny):
    config, params = tiny
    prompt = np.random.RandomState(5).randint(3, config.vocab_size, size=40)
    free = greedy_reference(params, config, prompt, 12)
    stop = free[4]
    first = free.index(stop)
    gen = GenerateConfig(max_new_tokens=12, stop_token_ids=(stop,), ignore_eos=True)
    buf = np.zeros((1, 256), np.int32)
    buf[0, :40] = prompt
    state = generate_ar(params, config, jnp.asarray(buf), jnp.array([40]), gen, jax.random.key(0))
    n = int(state.num_out[0])
    assert n == first + 1  # the stop token is emitted, then the row ends
    assert np.asarray(state.out[0, :n]).tolist() == free[: first + 1]
    assert bool(state.done[0])


def test_no_recompilation_per_token_or_prompt_length(tiny):
    config, params = tiny
    traces = {"n": 0}

    def counted(params, tokens, lengths):
        traces["n"] += 1
        return engine.prefill(params, config, tokens, lengths, KVCache.zeros(config, 1, 512), chunk=64)

    counted_prefill = jax.jit(counted)
    gen = GenerateConfig(max_new_tokens=40, ignore_eos=True)
    drafter = ARDrafter()
    decode_traces_before = engine.decode._cache_size()
    for n in (5, 64, 65, 200):  # one bucket (256): one trace whatever the length
        buf = np.zeros((1, 256), np.int32)
        buf[0, :n] = 7
        last, cache = counted_prefill(params, jnp.asarray(buf), jnp.array([n]))
        state = engine.init_state(config, gen, cache, last, jax.random.key(0), gen.max_new_tokens)
        for limit in (3, 10, 25):  # streaming: raising the step limit must not retrace
            state = engine.decode(params, (), config, drafter, gen, state, jnp.int32(limit))
    assert traces["n"] == 1
    assert engine.decode._cache_size() - decode_traces_before == 1


# ---------------------------------------------------------------------------------------------
# The real default model against transformers' own GGUF loading


@pytest.fixture(scope="module")
def real(ours, hf_gguf):  # session fixtures from conftest.py
    return ours, hf_gguf


@pytest.mark.slow  # ~100 s; the tiny HF-parity configs above run by default
def test_real_smollm2_matches_transformers(real):
    import sysconfig
    from pathlib import Path

    ours, hf = real
    text = (Path(sysconfig.get_paths()["stdlib"]) / "json" / "decoder.py").read_text()[:2500]
    ids = ours.tokenizer.encode(text)
    P = len(ids)
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].numpy()
        hf_out = hf.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False)[0, P:].tolist()
    params = jax.tree.map(jnp.asarray, ours.params)
    config = ours.config
    logits = full_logits(params, config, np.array([ids]))[0]
    assert np.abs(logits - ref).max() <= 1e-3

    bucket = engine.prompt_bucket(P)
    buf = np.zeros((1, bucket), np.int32)
    buf[0, :P] = ids
    gen = GenerateConfig(max_new_tokens=32, ignore_eos=True)
    state = generate_ar(params, config, jnp.asarray(buf), jnp.array([P]), gen, jax.random.key(0))
    assert np.asarray(state.out[0]).tolist() == hf_out


@pytest.mark.slow
def test_real_smollm2_decode_layout_matches_transformers(real):
    """The decode layout on the real model (by default, test_speculative runs it through Generator; the tiny HF
    parity tests check it against transformers): 30 unrolled layers take a while to compile."""
    import sysconfig
    from pathlib import Path

    ours, hf = real
    ids = ours.tokenizer.encode((Path(sysconfig.get_paths()["stdlib"]) / "json" / "decoder.py").read_text()[:2500])
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].numpy()
    prepared = target.prepare_for_decode(jax.tree.map(jnp.asarray, ours.params), ours.config)
    logits = full_logits(prepared, ours.config, np.array([ids]))[0]
    assert np.abs(logits - ref).max() <= 1e-3  # as the stacked layout (fp32 rounding over 30 layers: ~1e-4)


@pytest.mark.slow  # bf16 against fp32: tests/test_precision.py in the default run
def test_bfloat16_model_runs_close_to_float32(tiny):
    """bf16 weights/cache (the accelerator setting): same program, bf16 storage, logits within bf16 error."""
    import dataclasses

    config, params = tiny
    c16 = dataclasses.replace(config, dtype="bfloat16")
    p16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
    toks = jnp.asarray(np.random.RandomState(0).randint(0, config.vocab_size, (1, 40)))
    pos = jnp.arange(40)[None]
    l32, _ = forward(params, config, toks, pos, KVCache.zeros(config, 1, 64))
    l16, cache = forward(p16, c16, toks, pos, KVCache.zeros(c16, 1, 64))
    assert cache.k.dtype == jnp.bfloat16 and l16.dtype == jnp.float32
    assert float(jnp.abs(l32 - l16).max()) < 0.05 * float(jnp.abs(l32).max())
    assert float(jnp.mean(jnp.argmax(l32, -1) == jnp.argmax(l16, -1))) > 0.9
