"""The shared target-feature cache: one pass of the frozen target, read by every drafter's training.

The target is the most expensive thing training runs, so its features are computed once per token and shared:
every drafter's training that reads the target's features reads the same files.

    python -m lsjax.train.feature_cache --set chat-2048 --sources sharegpt --chat --seq-len 2048
    fc = FeatureCache.open(cache_root() / "chat-2048")
    batch = fc.read(np.array([3, 17]), ("tokens", "hidden"))

A set holds S packed sequences of T tokens (documents joined by EOS), run by the target at plain positions
0..T-1. Fields (float features in float16: half the disk, and far below the draft's own training noise):

    tokens [S, T] int32, loss_mask [S, T] uint8      the text; 1 where a token is a training target
    k, v [S, Kh, T, H]                              last layer K *before* RoPE (each stage ropes it at the
                                                    positions it trains at, e.g. anchor offsets) and V
    hidden [S, T, D]                                final hidden state before the final norm
    mid_hidden [S, T, D]                            residual stream entering layer `mid_layer`
    aux_hidden [S, T, A D]                          only with `aux_layers` (--aux-layers): the residual streams
                                                    entering those layers, concatenated in their order (the
                                                    embeddings for layer 0; EAGLE-3's draft input)
    topk_ids [S, T, k] int32, topk_logprobs [S, T, k] top-k of log_softmax(target logits); [..., 0] = argmax

Layout: `manifest.json` (what was run on what), `tokens.npy`/`loss_mask.npy` for the whole set (in a seeded
shuffled order, so any prefix of the set is a uniform sample), and one directory per shard of `shard_size`
sequences with one `.npy` per field (memory-mapped by the reader). A shard is written under a temporary name
and renamed when complete: an interrupted build loses at most the shard in flight, and a resumed build
writes files identical to an uninterrupted one (batches never straddle shards).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import shutil
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from lsjax import attention
from lsjax.config import ModelConfig
from lsjax.errors import LsjaxError
from lsjax.models.layers import embed, mlp, rms_norm
from lsjax.models.target import lm_head, qkv_projection
from lsjax.rope import apply_rope, inverse_frequencies, rope_angles

# The reading side lives in feature_sets; its names stay importable from here (trainers and tests use both).
from lsjax.train.feature_sets import (  # noqa: F401
    FIELDS,
    SHARD_FIELDS,
    VERSION,
    FeatureCache,
    FeatureCacheError,
    FeatureSets,
    FieldView,
    _shard_name,
    cache_root,
    resolve_set,
)


@dataclasses.dataclass(frozen=True)
class FeatureSpec:
    """What one pass stores: the middle layer whose input is kept, how many logits per token, and the layers
    whose input streams are kept side by side (`aux_hidden`; () = none)."""

    mid_layer: int
    topk: int = 8
    aux_layers: tuple[int, ...] = ()

    def check(self, config: ModelConfig) -> None:
        if not 0 < self.mid_layer < config.num_layers:
            raise FeatureCacheError(
                f"feature cache: mid_layer must be in [1, {config.num_layers - 1}], got {self.mid_layer}"
            )
        if not 1 <= self.topk <= min(64, config.vocab_size):
            raise FeatureCacheError(f"feature cache: topk must be in [1, 64], got {self.topk}")
        for i in self.aux_layers:
            if not (isinstance(i, int) and 0 <= i < config.num_layers):
                raise FeatureCacheError(
                    f"feature cache: aux_layers must be layer indices in [0, {config.num_layers - 1}], "
                    f"got {self.aux_layers}"
                )


def default_spec(config: ModelConfig) -> FeatureSpec:
    # Speculative Streaming runs its top N_s <= 4 layers from here; fewer layers are a prefix of these.
    return FeatureSpec(mid_layer=max(1, config.num_layers - 4))


# ----------------------------------------------------------------------------- the pass


def feature_pass(params: dict, config: ModelConfig, tokens: jax.Array, spec: FeatureSpec) -> dict:
    """The frozen target over tokens [B, T] at positions 0..T-1 (stacked-layer params) -> every field.

    Plain causal attention with no cache; the last layer is unrolled so its K is read before RoPE.
    """
    B, T = tokens.shape
    eps = config.rms_norm_eps
    positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    cos, sin = rope_angles(positions, inverse_frequencies(config))
    x = embed(params, tokens).astype(jnp.dtype(config.dtype))

    def decoder_layer(x, layer):
        h = rms_norm(x, layer["attn_norm"], eps)
        q, k, v = qkv_projection(layer, config, h, cos, sin)
        # Long chains run in causal blocks that skip unseen keys (the attention was ~3/4 of a 2048-token pass).
        o, _ = attention.tree_attention_xla(q, k, v, causal=True)
        x = x + jnp.einsum("btnh,nhd->btd", o, layer["wo"])
        return x + mlp(layer, rms_norm(x, layer["mlp_norm"], eps))

    def run(x, lo, hi):
        layers = jax.tree.map(lambda a: a[lo:hi], params["layers"])
        return jax.lax.scan(lambda c, lay: (decoder_layer(c, lay), None), x, layers)[0]

    L = config.num_layers
    entering, lo = {}, 0
    for cut in sorted({spec.mid_layer, *spec.aux_layers, L - 1}):
        x = run(x, lo, cut) if cut > lo else x
        entering[cut], lo = x, cut
    mid = entering[spec.mid_layer]
    last = jax.tree.map(lambda a: a[L - 1], params["layers"])
    h = rms_norm(x, last["attn_norm"], eps)
    k_pre = jnp.einsum("btd,dkh->btkh", h, last["wk"])
    v = jnp.einsum("btd,dkh->btkh", h, last["wv"])
    if config.qkv_bias:
        k_pre, v = k_pre + last["bk"], v + last["bv"]
    hidden = decoder_layer(x, last)
    logp = jax.nn.log_softmax(lm_head(params, config, hidden), axis=-1)
    top_lp, top_ids = jax.lax.top_k(logp, spec.topk)
    half = jnp.float16
    out = {
        "k": k_pre.swapaxes(1, 2).astype(half),  # [B, Kh, T, H]
        "v": v.swapaxes(1, 2).astype(half),
        "hidden": hidden.astype(half),
        "mid_hidden": mid.astype(half),
        "topk_ids": top_ids.astype(jnp.int32),
        "topk_logprobs": top_lp.astype(half),
    }
    if spec.aux_layers:
        out["aux_hidden"] = jnp.concatenate([entering[i] for i in spec.aux_layers], axis=-1).astype(half)
    return out


def spec_fields(spec: FeatureSpec) -> tuple[str, ...]:
    """The shard fields a pass of `spec` writes."""
    return SHARD_FIELDS + (("aux_hidden",) if spec.aux_layers else ())


def rope_keys(k: jax.Array, positions: jax.Array, config: ModelConfig) -> jax.Array:
    """Cached pre-RoPE keys k [B, Kh, T, H] roped at positions [B, T] (e.g. anchor offsets), in float32."""
    cos, sin = rope_angles(positions, inverse_frequencies(config))
    return apply_rope(k.astype(jnp.float32).swapaxes(1, 2), cos, sin).swapaxes(1, 2)


# ----------------------------------------------------------------------------- building


def _sha(*arrays: np.ndarray) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


def build(
    directory: str | Path,
    tokens: np.ndarray,
    loss_mask: np.ndarray,
    params: dict,
    config: ModelConfig,
    *,
    spec: FeatureSpec | None = None,
    shard_size: int = 16,
    batch_size: int = 2,
    seed: int = 0,
    source: dict | None = None,
    max_shards: int | None = None,
    progress: bool = True,
    log=print,
) -> FeatureCache:
    """Runs the target over tokens [S, T] and writes the set into `directory`; resumable.

    A directory holding another set (different tokens, model or spec) is refused, never mixed.
    `max_shards` stops early (a time budget); calling again continues.
    """
    spec = spec or default_spec(config)
    spec.check(config)
    if shard_size % batch_size:
        raise FeatureCacheError(f"feature cache: shard_size {shard_size} must be a multiple of batch_size {batch_size}")
    directory = Path(directory)
    S, T = tokens.shape
    order = np.random.default_rng(seed).permutation(S)
    tokens, loss_mask = np.asarray(tokens, np.int32)[order], np.asarray(loss_mask, np.uint8)[order]
    manifest = {
        "version": VERSION,
        "sequences": int(S),
        "seq_len": int(T),
        "shard_size": int(shard_size),
        "mid_layer": spec.mid_layer,
        "topk": spec.topk,
        # Written only when set: a manifest from before aux layers existed stays equal (its build resumes).
        **({"aux_layers": list(spec.aux_layers)} if spec.aux_layers else {}),
        "model": _model_fingerprint(config, params),
        "tokens_sha": _sha(tokens, loss_mask),
        "source": source or {},
        "shapes": {
            "k": [config.num_kv_heads, T, config.head_dim],
            "hidden": [T, config.hidden_size],
        },
    }
    mfile = directory / "manifest.json"
    if mfile.exists():
        old = json.loads(mfile.read_text())
        if {k: v for k, v in old.items() if k != "source"} != {k: v for k, v in manifest.items() if k != "source"}:
            raise FeatureCacheError(
                f"feature cache: {directory} holds another set (manifest differs); choose another --set or delete it"
            )
    else:
        directory.mkdir(parents=True, exist_ok=True)
        for name, arr in (("tokens", tokens), ("loss_mask", loss_mask)):
            np.save(directory / f"{name}.tmp.npy", arr)
            (directory / f"{name}.tmp.npy").replace(directory / f"{name}.npy")
        mfile.write_text(json.dumps(manifest, indent=1) + "\n")

    num_shards = -(-S // shard_size)
    todo = [i for i in range(num_shards) if not (directory / _shard_name(i)).is_dir()]
    if max_shards is not None:
        todo = todo[:max_shards]
    run = jax.jit(lambda p, t: feature_pass(p, config, t, spec))
    bar = _bar(len(todo) * shard_size * T, progress)
    t0, done_tokens = time.perf_counter(), 0
    for i in todo:
        lo, hi = i * shard_size, min(S, (i + 1) * shard_size)
        fields = spec_fields(spec)
        parts: dict[str, list[np.ndarray]] = {f: [] for f in fields}
        for b in range(lo, hi, batch_size):
            batch = np.zeros((batch_size, T), np.int32)
            n = min(batch_size, hi - b)
            batch[:n] = tokens[b : b + n]
            out = jax.device_get(run(params, batch))
            for f in fields:
                parts[f].append(out[f][:n])
            if bar is not None:
                bar.update(n * T)
        tmp = directory / (_shard_name(i) + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        for f in fields:
            np.save(tmp / f"{f}.npy", np.concatenate(parts[f]))
        tmp.rename(directory / _shard_name(i))
        done_tokens += (hi - lo) * T
        if bar is None:
            rate = done_tokens / max(time.perf_counter() - t0, 1e-9)
            log(f"features {directory.name}: shard {i + 1}/{num_shards} ({rate:.0f} tok/s)")
    if bar is not None:
        bar.close()
    return FeatureCache.open(directory, allow_partial=True)


def _model_fingerprint(config: ModelConfig, params: dict) -> str:
    # Config plus a sample of the weights: a cache of one checkpoint is never read as another's.
    leaves = jax.tree.leaves(params)
    sample = [np.asarray(leaf).ravel()[:64].astype(np.float32) for leaf in leaves[:8]]
    return hashlib.sha256((repr(config) + _sha(*sample)).encode()).hexdigest()[:16]


def _bar(total: int, enabled: bool):
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="tok", unit_scale=True, dynamic_ncols=True)


# ----------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lsjax.train.feature_cache", description=__doc__.split("\n")[0])
    p.add_argument("--set", required=True, help="name of the set (a directory under the cache root)")
    p.add_argument("--root", default="", help="cache root (default: $LSJAX_FEATURES or ~/.cache/lsjax/features)")
    p.add_argument("--sources", nargs="+", default=["sharegpt"])
    p.add_argument("--chat", action="store_true", help="render dialogues with the chat template (loss on assistant)")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--max-sequences", type=int, default=0, help="a seeded subset (0 = all)")
    p.add_argument("--shard-size", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--max-shards", type=int, default=None, help="stop after this many new shards (resume later)")
    p.add_argument("--from-distilled", default="", help="a lsjax.cli.distill directory instead of corpora")
    p.add_argument("--model", default="", help="target .gguf or HF dir (default: the bundled SmolLM2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--aux-layers",
        type=int,
        nargs="+",
        default=(),
        metavar="L",
        help="also store the hidden states entering these target layers (aux_hidden; EAGLE-3 reads 2, L//2, L-3)",
    )
    args = p.parse_args(argv)
    try:
        return _run(args)
    except LsjaxError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _run(args) -> int:
    from lsjax.loading import load_model
    from lsjax.train.config import DataConfig
    from lsjax.train.data import load_sequences

    loaded = load_model(args.model or None)
    config = loaded.config
    data = DataConfig(
        sources=tuple(args.sources),
        chat=args.chat,
        seq_len=args.seq_len,
        batch_size=1,
        max_sequences=args.max_sequences,
        seed=args.seed,
    )
    eos = config.eos_token_ids[0] if config.eos_token_ids else config.pad_token_id
    if args.from_distilled:
        from lsjax.train.data import load_distilled

        tokens, mask = load_distilled(args.from_distilled)
        source = {"self_distill": Path(args.from_distilled).name, "split": "train"}
    else:
        tokens, mask = load_sequences(data, loaded.tokenizer, eos, config.vocab_size)
        source = {"sources": list(args.sources), "chat": args.chat, "split": "train"}
    source["max_sequences"] = args.max_sequences
    root = Path(args.root).expanduser() if args.root else cache_root()
    params = jax.tree.map(jnp.asarray, loaded.params)
    print(f"feature cache {args.set}: {tokens.shape[0]} sequences x {tokens.shape[1]} tokens -> {root / args.set}")
    fc = build(
        root / args.set,
        tokens,
        mask,
        params,
        config,
        spec=dataclasses.replace(default_spec(config), aux_layers=tuple(args.aux_layers)),
        shard_size=args.shard_size,
        batch_size=args.batch_size,
        seed=args.seed,
        source=source,
        max_shards=args.max_shards,
    )
    print(f"feature cache {args.set}: {fc.num_sequences}/{fc.total_sequences} sequences done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
