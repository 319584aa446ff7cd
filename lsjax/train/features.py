"""The frozen target's features for draft training: computed in the step, or cached once on disk.

    feats = target_features(target_params, config, tokens, positions)    # live, inside the jitted step
    arrays = build_feature_cache(target_params, config, seqs, offsets, directory)   # once, resumable

The cache (npy memmaps) stores what every training stage reads from the target: last-layer K/V (post-RoPE),
the argmax of its logits and, for KL distillation, its final hidden state. Anchor offsets are then fixed per
sequence, so a cached run sees the same positions as the target did when the cache was built.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from lsjax.cache import KVCache
from lsjax.config import ModelConfig
from lsjax.models import target as target_lib
from lsjax.rope import anchor_offset_positions


def positions_from_offsets(seq_len: int, offset: jax.Array, num_anchors: int = 4) -> jax.Array:
    """offset [B] -> positions [B, T]: anchors [0, num_anchors) stay, later ones + offset (0 = plain)."""
    return anchor_offset_positions(seq_len, offset, num_anchors)


def target_features(target_params: dict, config: ModelConfig, tokens: jax.Array, positions: jax.Array) -> dict:
    """The frozen target on [B, T]: last-layer k, v [B, K, T, H] (k post-RoPE) and final hidden [B, T, D].

    A zero-capacity cache makes the prefix part of the hybrid attention empty, so this is a plain causal
    forward with no cache memory; the target's gradients are cut here.
    """
    B = tokens.shape[0]
    cache = KVCache.zeros(config, B, 0)
    target_params = jax.lax.stop_gradient(target_params)
    model = target_lib.Transformer(config)
    hidden, new_k, new_v = model.apply({"params": target_params}, tokens, positions, cache, method="hidden")
    hidden = hidden.astype(jnp.dtype(config.dtype))  # drafts train on the model's dtype (the stream is fp32)
    return {"k": new_k[-1].swapaxes(1, 2), "v": new_v[-1].swapaxes(1, 2), "hidden": hidden}


def target_logits(target_params: dict, config: ModelConfig, hidden: jax.Array, vocab_ids) -> jax.Array:
    h = target_lib.rms_norm(hidden, target_params["final_norm"], config.rms_norm_eps)
    if config.tie_embeddings:
        head = target_params["embed"] if vocab_ids is None else jnp.take(target_params["embed"], vocab_ids, axis=0)
        return jnp.einsum("...d,vd->...v", h, head).astype(jnp.float32)
    head = target_params["lm_head"] if vocab_ids is None else jnp.take(target_params["lm_head"], vocab_ids, axis=1)
    return jnp.einsum("...d,dv->...v", h, head).astype(jnp.float32)


FEATURES_VERSION = 1


def feature_shapes(config: ModelConfig, num_seqs: int, seq_len: int, with_hidden: bool) -> dict:
    K, H, D = config.num_kv_heads, config.head_dim, config.hidden_size
    shapes = {
        "target_k": ((num_seqs, K, seq_len, H), np.float32),
        "target_v": ((num_seqs, K, seq_len, H), np.float32),
        "target_argmax": ((num_seqs, seq_len), np.int32),
    }
    if with_hidden:
        shapes["target_hidden"] = ((num_seqs, seq_len, D), np.float32)
    return shapes


def build_feature_cache(
    target_params: dict,
    config: ModelConfig,
    tokens: np.ndarray,
    offsets: np.ndarray,
    directory: str | Path,
    *,
    num_anchors: int = 4,
    batch_size: int = 4,
    with_hidden: bool = False,
    fingerprint: str = "",
    log=print,
) -> dict[str, np.ndarray]:
    """Runs the target once over packed sequences tokens [S, T] at their fixed offsets [S] and stores its
    features in npy memmaps under `directory`; resumable (progress is recorded after every batch).

    Returns read-only memmaps {"target_k", "target_v" [S, K, T, H], "target_argmax" [S, T],
    "target_hidden" [S, T, D] (with_hidden)}.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    S, T = tokens.shape
    shapes = feature_shapes(config, S, T, with_hidden)
    meta = {
        "version": FEATURES_VERSION,
        "sequences": S,
        "seq_len": T,
        "with_hidden": with_hidden,
        "fingerprint": fingerprint,
        "tokens_sha": _sha(tokens),
        "offsets_sha": _sha(offsets),
    }
    meta_file, progress_file = directory / "meta.json", directory / "progress.json"
    fresh = not meta_file.exists() or json.loads(meta_file.read_text()) != meta
    done = 0 if fresh else json.loads(progress_file.read_text())["done"] if progress_file.exists() else 0
    arrays = {}
    for name, (shape, dtype) in shapes.items():
        path = directory / f"{name}.npy"
        mode = "w+" if fresh or not path.exists() else "r+"
        arrays[name] = np.lib.format.open_memmap(path, mode=mode, dtype=dtype, shape=shape)
    if fresh:
        meta_file.write_text(json.dumps(meta) + "\n")
        progress_file.write_text(json.dumps({"done": 0}))

    @jax.jit
    def run(tp, toks, offs):
        pos = positions_from_offsets(toks.shape[1], offs, num_anchors)
        f = target_features(tp, config, toks, pos)
        logits_argmax = jnp.argmax(target_logits(tp, config, f["hidden"], None), axis=-1).astype(jnp.int32)
        return f["k"], f["v"], logits_argmax, f["hidden"]

    t0, start = time.perf_counter(), done
    while done < S:
        n = min(batch_size, S - done)
        toks = np.zeros((batch_size, T), np.int32)
        offs = np.zeros((batch_size,), np.int32)
        toks[:n], offs[:n] = tokens[done : done + n], offsets[done : done + n]
        k, v, am, h = jax.device_get(run(target_params, toks, offs))
        arrays["target_k"][done : done + n] = k[:n]
        arrays["target_v"][done : done + n] = v[:n]
        arrays["target_argmax"][done : done + n] = am[:n]
        if with_hidden:
            arrays["target_hidden"][done : done + n] = h[:n]
        done += n
        for a in arrays.values():
            a.flush()
        progress_file.write_text(json.dumps({"done": done}))
        rate = (done - start) * T / max(time.perf_counter() - t0, 1e-9)
        log(f"features: {done}/{S} sequences ({rate:.0f} tok/s)")
    return {name: np.load(directory / f"{name}.npy", mmap_mode="r") for name in shapes}


def _sha(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()[:16]
