"""The weight store (`lsjax.runtime.weights`): a model file's params as loaded and as prepared for decoding, kept
by a first start and mapped back read-only by later ones, used in place by a CPU device; a damaged entry is made
again, and a store that cannot be written is one line."""

from __future__ import annotations

import gguf
import numpy as np

from lsjax.loading import load_gguf, load_model
from tests.test_loading import _state_dict_np, _tiny_hf_model, _write_gguf


def test_loaded_weights_are_aligned_and_a_kept_tree_is_used_in_place(tmp_path, monkeypatch):
    """Loaded and prepared host arrays start on 64-byte boundaries, and a store's tree is read-only whether made or
    mapped, so a CPU device takes it in place (`on_device`): a first start copies no weights to the device."""
    import jax

    from lsjax.cli import decode
    from lsjax.engine.host import on_device
    from lsjax.loading import LoadedModel
    from lsjax.models import target
    from lsjax.runtime import weights as stored

    model = _tiny_hf_model("llama", False)
    _write_gguf(tmp_path / "m.gguf", "llama", model.config, _state_dict_np(model), quant=gguf.GGMLQuantizationType.Q8_0)
    for dtype in ("float32", "bfloat16"):
        cfg, params = load_gguf(tmp_path / "m.gguf", dtype)
        prepared = target.prepare_for_decode(params, cfg, layout="both")
        for tree in (params, prepared):
            for path, a in jax.tree_util.tree_flatten_with_path(tree)[0]:
                assert a.ctypes.data % target.HOST_ALIGN == 0, (dtype, jax.tree_util.keystr(path))
    monkeypatch.setattr(stored, "_defer", [])
    cfg, _ = load_gguf(tmp_path / "m.gguf")
    kept = stored.kept(tmp_path / "weights", ("params",), lambda: load_gguf(tmp_path / "m.gguf")[1])
    loaded = LoadedModel(cfg, kept, None, tmp_path / "m.gguf")  # as `load_model(store=...)` makes it
    made = decode.prepared(loaded, tmp_path / "weights")
    mapped = decode.prepared(loaded, tmp_path / "weights")
    for tree in (loaded.params, made, mapped):
        assert not any(a.flags.writeable for a in jax.tree.leaves(tree))
    for tree in (made, mapped):
        w = tree["layers"][1]["w_gate_up"]
        assert on_device(w).unsafe_buffer_pointer() == w.ctypes.data  # the device's array is the host's memory
    w = params["layers"]["w_up"]  # a caller's own (writeable) array is copied
    assert on_device(w).unsafe_buffer_pointer() != w.ctypes.data


def test_a_store_keeps_the_loaded_params_and_maps_them_back(tmp_path, ours, capsys, monkeypatch):
    """decode.py's store (`lsjax.runtime.weights`): the first load keeps what it made, later ones map it back
    (the same arrays, bf16 too); a damaged entry is made again, a store that cannot be written is one line."""

    def same(a, b):
        assert set(a) == set(b)
        for k in a:
            if isinstance(a[k], dict):
                same(a[k], b[k])
            else:
                assert a[k].dtype == b[k].dtype and np.array_equal(np.asarray(a[k]), np.asarray(b[k])), k

    from lsjax.runtime import weights as stored

    monkeypatch.setattr(stored, "_defer", [])  # written before load_model returns (decode.py's defer is its own)
    store = tmp_path / "weights"
    made = load_model(store=store)
    same(made.params, ours.params)
    mapped = load_model(store=store)
    same(mapped.params, ours.params)
    assert isinstance(mapped.params["embed"], np.memmap) and not isinstance(made.params["embed"], np.memmap)
    bf16 = load_model(dtype="bf16", store=store)
    bf16_mapped = load_model(dtype="bf16", store=store)
    same(bf16_mapped.params, bf16.params)
    assert str(bf16_mapped.params["embed"].dtype) == "bfloat16" and len(list(store.iterdir())) == 2
    for entry in store.iterdir():
        (entry / "0.npy").write_bytes(b"damaged")
    same(load_model(store=store).params, ours.params)  # made again (and kept again)
    assert isinstance(load_model(store=store).params["embed"], np.memmap)
    (tmp_path / "a file").write_text("")
    same(load_model(store=tmp_path / "a file" / "weights").params, ours.params)
    err = capsys.readouterr().err
    assert err.count("warning: cannot keep the loaded weights") == 1 and "Traceback" not in err


def test_decode_py_keeps_the_params_prepared_for_decoding_and_decodes_the_same_with_them(tmp_path, monkeypatch):
    import jax

    from lsjax.cli import decode
    from lsjax.config import GenerateConfig
    from lsjax.engine.host import Generator
    from lsjax.loading import LoadedModel
    from lsjax.models import target
    from tests.tiny import tiny_model

    config, params = tiny_model()
    (tmp_path / "tiny.gguf").write_bytes(b"a model file")
    model = LoadedModel(config, params, None, tmp_path / "tiny.gguf")
    from lsjax.runtime import weights as stored

    monkeypatch.setattr(stored, "_defer", [True])  # decode.py's: written on a thread, waited for before exit
    monkeypatch.setattr(stored, "_writers", [])  # (this test's own: none left to another test)
    made = decode.prepared(model, tmp_path / "weights")
    # Held back until the output is out (`start_writes`; `wait` begins what is held back too).
    assert not list((tmp_path / "weights").glob("*")) and stored._writers
    stored.wait()
    assert list((tmp_path / "weights").glob("*")) and not stored._writers
    mapped = decode.prepared(model, tmp_path / "weights")
    assert target.is_prepared(mapped) and isinstance(mapped["layers"][0]["w_qkv"], np.memmap)
    assert jax.tree.all(jax.tree.map(np.array_equal, made, mapped))
    ids, gen = [5, 6, 7, 8, 5, 6], GenerateConfig(max_new_tokens=8, ignore_eos=True)
    on_mapped, on_copied = Generator(config, mapped), Generator(config, params)
    assert on_mapped.run(ids, gen).tokens == on_copied.run(ids, gen).tokens
    # The mapped weights are used where they lie (a CPU device aliases a read-only host array: no copy per
    # start); a caller's writable arrays are copied, so changing them later leaves the generator as it was.
    used = on_mapped.params["layers"][0]["w_qkv"]
    if jax.default_backend() == "cpu":  # (an accelerator copies it to its memory, as it must)
        assert used.unsafe_buffer_pointer() == mapped["layers"][0]["w_qkv"].ctypes.data
    mine = np.array(mapped["layers"][0]["w_qkv"])
    copied = Generator(config, {**mapped, "layers": ({**mapped["layers"][0], "w_qkv": mine}, *mapped["layers"][1:])})
    before = np.array(copied.params["layers"][0]["w_qkv"])
    mine += 1.0
    np.testing.assert_array_equal(copied.params["layers"][0]["w_qkv"], before)
    (tmp_path / "tiny.gguf").write_bytes(b"another model file")  # a changed file is prepared afresh
    assert not isinstance(decode.prepared(model, tmp_path / "weights")["layers"][0]["w_qkv"], np.memmap)
    unkept = decode.prepared(model, None)  # no store (`--compile-cache off`): prepared here, nothing kept
    assert target.is_prepared(unkept) and jax.tree.all(jax.tree.map(np.array_equal, unkept, made))
    stored.wait()  # (the changed file's entry, held back: written here, inside this test's directory)
