"""lsjax.artifacts: the one on-disk form of trained weights (model.safetensors + config.json), the old .npz
layout still read, and a bad file as one named line."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

from lsjax import artifacts
from lsjax.errors import CorruptFileError, ModelNotFoundError


def arrays():
    rng = np.random.default_rng(0)
    return {
        "w": rng.standard_normal((12, 7)).astype(np.float32),
        "norm": (1 + 0.1 * rng.standard_normal(7)).astype(np.float32),
        "unigram_logprior": np.log(rng.dirichlet(np.ones(50))).astype(np.float32),
        "vocab_ids": np.array([3, 1, 40000, 7], np.int64),
    }


def one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert "\n" not in msg and "allow_pickle" not in msg
    return msg


def test_round_trip_bf16_with_a_float32_override_and_exact_ints(tmp_path):
    a = arrays()
    meta = {"target": "tiny", "draft_config": {"window": 16}, "tree": [2, 1]}
    size = artifacts.save_weights(tmp_path / "d", a, meta, kind="longspec", overrides={"unigram_logprior": "float32"})
    assert size == (tmp_path / "d" / "model.safetensors").stat().st_size
    stored = json.loads((tmp_path / "d" / "config.json").read_text())
    assert stored["kind"] == "longspec" and stored["format"] == artifacts.FORMAT and stored["target"] == "tiny"
    got, cfg = artifacts.load_weights(tmp_path / "d", "longspec")
    assert cfg == meta  # format and kind are the file's, not the caller's
    assert {k: v.dtype for k, v in got.items()} == {
        "w": np.float32,
        "norm": np.float32,
        "unigram_logprior": np.float32,
        "vocab_ids": np.int32,
    }
    for k in ("w", "norm"):  # bf16 rounding: 8 bits of mantissa, round to nearest
        np.testing.assert_array_equal(got[k], a[k].astype(ml_dtypes.bfloat16).astype(np.float32))
        np.testing.assert_allclose(got[k], a[k], rtol=2**-8)
    np.testing.assert_array_equal(got["unigram_logprior"], a["unigram_logprior"])
    np.testing.assert_array_equal(got["vocab_ids"], a["vocab_ids"])
    assert artifacts.stored_kind(tmp_path / "d") == "longspec" and artifacts.has_weights(tmp_path / "d", "longspec")
    assert not artifacts.has_weights(tmp_path / "d", "block")
    with pytest.raises(ModelNotFoundError, match="it holds a LongSpec draft"):
        artifacts.load_weights(tmp_path / "d", "block")


def test_the_kind_sets_the_storage_dtype(tmp_path):
    """A local head is stored in float16 with its prior in float32; the rest in bfloat16."""
    from safetensors import safe_open

    a = arrays()
    artifacts.save_weights(tmp_path / "h", a, {}, kind="local_head")
    artifacts.save_weights(tmp_path / "s", a, {}, kind="streams")
    artifacts.save_weights(tmp_path / "f", a, {}, np.float32, kind="streams")
    for d, want in (("h", np.float16), ("s", ml_dtypes.bfloat16), ("f", np.float32)):
        with safe_open(tmp_path / d / "model.safetensors", framework="np") as f:
            assert f.get_tensor("w").dtype == want and f.get_tensor("vocab_ids").dtype == np.int32, d
            prior = f.get_tensor("unigram_logprior").dtype
            assert prior == (np.float32 if d in ("h", "f") else ml_dtypes.bfloat16), d
    got, _ = artifacts.load_weights(tmp_path / "f", "streams")
    np.testing.assert_array_equal(got["w"], a["w"])


@pytest.mark.parametrize(
    "kind, weights, config",
    [
        ("longspec", "params.npz", "draft.json"),
        ("block", "params.npz", "block.json"),
        ("local_head", "local_head.npz", "local_head.json"),
        ("streams", "params.npz", "streams.json"),
        ("tokenswift", "params.npz", "heads.json"),
    ],
)
def test_old_npz_layout_still_loads_and_converts(tmp_path, kind, weights, config):
    a = arrays()
    a["w"] = a["w"].astype(np.float16)
    np.savez(tmp_path / weights, **a)
    (tmp_path / config).write_text(json.dumps({"target": "tiny", "x": [1, 2]}))
    assert artifacts.stored_kind(tmp_path) == kind and artifacts.has_weights(tmp_path, kind)
    got, meta = artifacts.load_weights(tmp_path, kind)
    assert meta == {"target": "tiny", "x": [1, 2]}
    assert got["w"].dtype == np.float32 and np.array_equal(got["w"], a["w"].astype(np.float32))
    assert np.array_equal(got["norm"], a["norm"]) and got["vocab_ids"].dtype == np.int64
    artifacts.main(["--convert", str(tmp_path)])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    again, meta2 = artifacts.load_weights(tmp_path, kind)
    assert meta2 == meta and again["vocab_ids"].dtype == np.int32
    np.testing.assert_array_equal(again["vocab_ids"], a["vocab_ids"])


def test_truncated_safetensors_is_one_corrupt_file_line(tmp_path):
    d = tmp_path / "d"
    artifacts.save_weights(d, arrays(), {"target": "tiny"}, kind="tokenswift")
    raw = (d / "model.safetensors").read_bytes()
    for n in (0, 7, 100, len(raw) // 2, len(raw) - 1):
        (d / "model.safetensors").write_bytes(raw[:n])
        with pytest.raises(CorruptFileError) as e:
            artifacts.load_weights(d, "tokenswift")
        assert one_line(e).startswith(f"{d / 'model.safetensors'}: truncated or corrupt TokenSwift heads ("), n


def test_truncated_old_npz_is_one_corrupt_file_line(tmp_path):
    np.savez(tmp_path / "params.npz", **arrays())
    (tmp_path / "draft.json").write_text("{}")
    raw = (tmp_path / "params.npz").read_bytes()
    for n in (0, 100, len(raw) // 2, len(raw) - 10):
        (tmp_path / "params.npz").write_bytes(raw[:n])
        with pytest.raises(CorruptFileError) as e:
            artifacts.load_weights(tmp_path, "longspec")
        assert "params.npz: truncated or corrupt LongSpec draft" in one_line(e), n
    np.savez(tmp_path / "params.npz", w=np.array([{"a": 1}], dtype=object))  # pickled: never loaded
    with pytest.raises(CorruptFileError, match="Python objects") as e:
        artifacts.load_weights(tmp_path, "longspec")
    one_line(e)


def test_missing_dir_or_file_is_model_not_found(tmp_path):
    with pytest.raises(ModelNotFoundError, match="no stream checkpoint at .*model.safetensors and config.json"):
        artifacts.load_weights(tmp_path / "nothing", "streams")
    artifacts.save_weights(tmp_path / "d", arrays(), {}, kind="streams")
    (tmp_path / "d" / "model.safetensors").unlink()
    with pytest.raises(ModelNotFoundError):
        artifacts.load_weights(tmp_path / "d", "streams")
    assert artifacts.stored_kind(tmp_path / "nothing") is None
    assert not artifacts.has_weights(tmp_path / "d", "streams")


def test_corrupt_or_foreign_config_json(tmp_path):
    d = tmp_path / "d"
    artifacts.save_weights(d, arrays(), {"block": {"block_size": 8}}, kind="block")
    for text in ("{not json", "[1, 2]", "\xff\xfe"):
        (d / "config.json").write_bytes(text.encode("latin-1"))
        with pytest.raises(CorruptFileError) as e:
            artifacts.load_weights(d, "block")
        assert one_line(e).startswith(f"{d / 'config.json'}: not a block draft description ("), text
    assert artifacts.has_weights(d, "block")  # present but unreadable: loading names the problem
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))  # an HF model directory
    with pytest.raises(ModelNotFoundError, match="not an lsjax weights description"):
        artifacts.load_weights(d, "block")
    (d / "config.json").write_text(json.dumps({"format": artifacts.FORMAT, "kind": "block"}))
    with pytest.raises(CorruptFileError, match=r"config.json: not a block draft description \(missing 'block'\)"):
        artifacts.parse_config(d, "block", lambda: artifacts.read_config(d, "block")["block"])
