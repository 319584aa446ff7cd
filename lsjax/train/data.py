"""Training data for the draft: corpora -> tokens (cached as npy) -> packed [T] sequences -> grain batches.

    stream  = token_stream(data_cfg, tokenizer, ...)     # (tokens [N] int32, mask [N] uint8), cached on disk
    seqs    = pack(stream, seq_len)                        # tokens, mask [S, T]
    ds      = batches(seqs, run_cfg, max_position)          # grain MapDataset of step batches
    it      = iter(ds.to_iter_dataset())                    # it.get_state() / it.set_state(): checkpointable

A step batch is {"tokens": [A, B, T] int32, "loss_mask": [A, B, T] float32, "offset": [A, B] int32,
"index": [A, B] int32} with A = grad_accum micro-batches of B sequences. `loss_mask[t]` weighs token t
as a prediction *target* (the step predicts token t + 1 from position t). Documents are joined with EOS
and packed without padding, so every position trains. For dialogue SFT, only assistant turns (their
content and end-of-turn marker) carry loss.

Offsets (anchor-offset indices) are drawn here, not in the step, so a batch fully determines its
positions: resuming from a checkpointed iterator replays the same positions, and a target-feature cache
can hold keys that were roped at exactly those positions.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import grain
import numpy as np

from lsjax import corpora
from lsjax.errors import LsjaxError
from lsjax.train.config import DataConfig, PositionConfig

_FORMAT = 2  # bump when the tokenization below changes: old caches are then ignored


class Packed(Protocol):
    """What `batches` reads of a run's config: any kind's config with these two sections."""

    @property
    def data(self) -> DataConfig: ...

    @property
    def positions(self) -> PositionConfig: ...


def tokens_cache_dir(cfg: DataConfig) -> Path:
    path = cfg.cache_dir or os.environ.get("LSJAX_TOKENS") or Path.home() / ".cache" / "lsjax" / "tokens"
    return Path(path).expanduser()


def _tokenizer_fingerprint(tokenizer) -> str:
    # The serialized backend covers vocab, merges, pre-tokenizer and specials; the template covers chat rendering.
    h = hashlib.sha256()
    backend = getattr(tokenizer, "backend", None)
    h.update(backend.to_str().encode() if backend is not None else repr(type(tokenizer)).encode())
    h.update((getattr(tokenizer, "chat_template", None) or "").encode())
    return h.hexdigest()[:16]


# ----------------------------------------------------------------------------- tokenization


def _encode_batch(tokenizer, texts: list[str]) -> list[list[int]]:
    backend = getattr(tokenizer, "backend", None)
    if backend is not None and hasattr(backend, "encode_batch"):
        return [e.ids for e in backend.encode_batch(texts, add_special_tokens=False)]
    return [tokenizer.encode(t, add_special_tokens=False) for t in texts]


def _render(tokenizer, messages: list[dict], add_generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)


def dialogue_tokens(tokenizer, messages: list[dict]) -> tuple[list[int], list[int]] | None:
    """A dialogue rendered with the chat template: (ids, mask) with mask 1 on assistant-turn tokens.

    Assistant spans are found in characters by rendering growing prefixes (the template must render a
    prefix of the dialogue as a prefix of the text; otherwise the dialogue is skipped: None), then mapped
    to tokens through the tokenizer's offsets.
    """
    full = _render(tokenizer, messages, add_generation_prompt=False)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        start_text = _render(tokenizer, messages[:i], add_generation_prompt=True) if i else ""
        end_text = _render(tokenizer, messages[: i + 1], add_generation_prompt=False)
        if not (full.startswith(end_text) and end_text.startswith(start_text)):
            return None
        spans.append((len(start_text), len(end_text)))
    if not spans:
        return None
    enc = tokenizer.backend.encode(full, add_special_tokens=False)
    starts = np.array([a for a, _ in enc.offsets], np.int64)
    mask = np.zeros(len(enc.ids), np.uint8)
    for a, b in spans:
        mask[(starts >= a) & (starts < b)] = 1
    return list(enc.ids), mask.tolist()


def _documents(source: str, cfg: DataConfig) -> list[corpora.Document]:
    # "dev" is the tunable part of the dev split: the held-out documents are for final evaluation only.
    split_of = corpora.eval_split_of if cfg.split == "dev" else corpora.split_of
    docs = [d for d in corpora.load(source) if split_of(d.id, cfg.split_seed, cfg.dev_fraction) == cfg.split]
    return docs[: cfg.max_docs] if cfg.max_docs else docs


def _synthetic(cfg: DataConfig, vocab_size: int, eos_id: int) -> tuple[np.ndarray, np.ndarray]:
    """A learnable stream for tests and smoke runs: mostly t -> (5 t + 3) mod V, 10% random jumps."""
    rng = np.random.default_rng(cfg.seed + (0 if cfg.split == "train" else 1_000_003))
    n = cfg.synthetic_tokens
    jumps = rng.random(n) < 0.1
    rand = rng.integers(0, vocab_size, n)
    out = np.empty(n, np.int64)
    out[0] = rand[0]
    for t in range(1, n):
        out[t] = rand[t] if jumps[t] else (5 * out[t - 1] + 3) % vocab_size
    out[rng.random(n) < 0.005] = eos_id
    return out.astype(np.int32), np.ones(n, np.uint8)


def source_tokens(
    source: str, cfg: DataConfig, tokenizer, eos_id: int, vocab_size: int, *, log=print
) -> tuple[np.ndarray, np.ndarray]:
    """One source's documents as a single EOS-joined stream (tokens [N] int32, mask [N] uint8), cached as npy."""
    if source == "synthetic":
        return _synthetic(cfg, vocab_size, eos_id)
    key = json.dumps(
        {
            "format": _FORMAT,
            "source": source,
            "split": cfg.split,
            "split_seed": cfg.split_seed,
            "dev_fraction": cfg.dev_fraction,
            "max_docs": cfg.max_docs,
            "chat": cfg.chat,
            "eos": eos_id,
            **({"without_heldout": True} if cfg.split == "dev" else {}),
            "tokenizer": _tokenizer_fingerprint(tokenizer),
        },
        sort_keys=True,
    )
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    root = tokens_cache_dir(cfg) / f"{source}-{cfg.split}-{digest}"
    if (root / "tokens.npy").exists() and (root / "mask.npy").exists():
        return np.load(root / "tokens.npy"), np.load(root / "mask.npy")

    docs = _documents(source, cfg)
    log(f"tokenizing {len(docs)} {source}/{cfg.split} documents (cached in {root}) ...")
    ids: list[np.ndarray] = []
    masks: list[np.ndarray] = []
    if cfg.chat:
        for d in docs:
            messages = d.meta.get("messages")
            got = dialogue_tokens(tokenizer, messages) if messages else None
            if got is None:
                continue
            ids += [np.asarray(got[0], np.int32), np.asarray([eos_id], np.int32)]
            masks += [np.asarray(got[1], np.uint8), np.zeros(1, np.uint8)]
    else:
        for i in range(0, len(docs), 256):
            for row in _encode_batch(tokenizer, [d.text for d in docs[i : i + 256]]):
                ids += [np.asarray(row, np.int32), np.asarray([eos_id], np.int32)]
        masks = [np.ones(len(a), np.uint8) for a in ids]
    tokens = np.concatenate(ids) if ids else np.zeros(0, np.int32)
    mask = np.concatenate(masks) if masks else np.zeros(0, np.uint8)
    root.mkdir(parents=True, exist_ok=True)
    # Write-then-rename: a killed run never leaves a truncated cache that later runs would trust.
    for name, arr in (("mask", mask), ("tokens", tokens)):
        tmp = root / f"{name}.tmp.npy"
        np.save(tmp, arr)
        tmp.replace(root / f"{name}.npy")
    (root / "key.json").write_text(key + "\n")
    return tokens, mask


def token_stream(cfg: DataConfig, tokenizer, eos_id: int, vocab_size: int, *, log=print):
    """Every source of `cfg` as one stream; sources are interleaved at sequence level later by shuffling."""
    parts = [source_tokens(s, cfg, tokenizer, eos_id, vocab_size, log=log) for s in cfg.sources]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


# ----------------------------------------------------------------------------- packing and batches


def pack(tokens: np.ndarray, mask: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """[N] streams -> [S, T] sequences (the incomplete tail is dropped)."""
    s = len(tokens) // seq_len
    return tokens[: s * seq_len].reshape(s, seq_len), mask[: s * seq_len].reshape(s, seq_len)


def max_offset(pos: PositionConfig, seq_len: int, max_position: int) -> int:
    """Largest anchor offset: the last position (seq_len - 1 + offset) stays below max_len."""
    if not pos.anchor_offset:
        return 0
    max_len = pos.max_len or max_position
    return max(0, max_len - seq_len)


def offsets_for(seed: int, keys: np.ndarray, high: int) -> np.ndarray:
    """Offsets ~ U[0, high] (inclusive) from a counter-based hash of (seed, key): order-independent."""
    if high == 0:
        return np.zeros(len(keys), np.int32)
    out = np.empty(len(keys), np.int32)
    for i, k in enumerate(np.asarray(keys).tolist()):
        out[i] = np.random.default_rng([seed, 0x0FF5E7, int(k)]).integers(0, high + 1)
    return out


class PackedSource:
    """Random-access grain source over packed sequences; elements carry their sequence index."""

    def __init__(self, tokens: np.ndarray, mask: np.ndarray, extra: dict[str, np.ndarray] | None = None):
        self.tokens, self.mask, self.extra = tokens, mask, dict(extra or {})

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict:
        out = {"tokens": self.tokens[i], "loss_mask": self.mask[i], "index": np.int32(i)}
        for name, arr in self.extra.items():  # per-sequence features (memmaps are read here, lazily)
            out[name] = np.asarray(arr[i])
        return out


def batches(
    tokens: np.ndarray,
    mask: np.ndarray,
    cfg: Packed,
    max_position: int,
    *,
    shuffle: bool = True,
    fixed_offsets: bool = False,
    extra: dict[str, np.ndarray] | None = None,
    rows: tuple[int, int] | None = None,
) -> grain.MapDataset:
    """Packed sequences -> an endless grain MapDataset of step batches (see module docstring).

    Shuffling is per epoch (grain reseeds each repeat) from data.seed. Offsets hash the element's global
    position in the endless stream, so each epoch sees a sequence at new offsets; with `fixed_offsets` (the
    target-feature cache) they hash the sequence index, so features computed once stay valid. `extra`
    holds per-sequence arrays [S, ...] (cached target features) passed through as [A, B, ...].

    `rows` = [start, stop) keeps only those rows of every step batch's B axis ([A, stop - start, ...]): a
    process of a multi-host run reads its share (`lsjax.sharding.process_rows`), and the processes' shares
    put side by side are the one-process batch, element for element (same shuffle, same offsets).
    """
    d = cfg.data
    if len(tokens) < d.batch_size:
        raise ValueError(
            f"data: only {len(tokens)} sequences of {d.seq_len} tokens, fewer than data.batch_size={d.batch_size}"
        )
    high = max_offset(cfg.positions, d.seq_len, max_position)
    seed = d.seed

    def with_offset(i, x):
        key = x["index"] if fixed_offsets else i
        return {**x, "offset": offsets_for(seed, np.array([key]), high)[0]}

    ds = grain.MapDataset.source(PackedSource(tokens, mask, extra))
    if shuffle:
        ds = ds.shuffle(seed=seed)
    ds = ds.repeat(None).map_with_index(with_offset)
    A, B = d.grad_accum, d.batch_size
    if rows is not None:
        ds = grain.MapDataset.source(_Rows(ds, A, B, *rows))
        B = rows[1] - rows[0]
    ds = ds.batch(B * A, drop_remainder=True)

    def to_step(b):
        out = {
            "tokens": b["tokens"].astype(np.int32).reshape(A, B, -1),
            "loss_mask": b["loss_mask"].astype(np.float32).reshape(A, B, -1),
            "offset": b["offset"].astype(np.int32).reshape(A, B),
            "index": b["index"].astype(np.int32).reshape(A, B),
        }
        for name in extra or {}:
            out[name] = b[name].reshape(A, B, *b[name].shape[1:])
        return out

    return ds.map(to_step)


class _Rows:
    """Random access to the elements of rows [start, stop) of every step batch of an endless element
    dataset whose step k is elements [k A B, (k + 1) A B) read as [A, B]. Only those elements are read: a
    host never loads (or memory-maps in) the other hosts' sequences and features."""

    def __init__(self, elements, A: int, B: int, start: int, stop: int):
        if not 0 <= start < stop <= B:
            raise ValueError(f"rows: [{start}, {stop}) is not inside a batch of {B}")
        self.elements, self.A, self.B, self.start, self.width = elements, A, B, start, stop - start

    def __len__(self) -> int:
        return len(self.elements) // (self.A * self.B) * self.A * self.width

    def __getitem__(self, i: int):
        step, r = divmod(int(i), self.A * self.width)
        a, b = divmod(r, self.width)
        return self.elements[step * self.A * self.B + a * self.B + self.start + b]


def load_sequences(d: DataConfig, tokenizer, eos_id: int, vocab_size: int, *, split: str | None = None, log=print):
    """Packed (tokens, mask) [S, T] for the data section's sources, on its split (or `split`)."""
    if split is not None and split != d.split:
        import dataclasses

        d = dataclasses.replace(d, split=split)
    toks, mask = token_stream(d, tokenizer, eos_id, vocab_size, log=log)
    if len(toks) and int(toks.max()) >= vocab_size:
        raise ValueError(f"data: token id {int(toks.max())} >= the target's vocab_size {vocab_size}")
    seqs, mask = pack(toks, mask, d.seq_len)
    if d.max_sequences and len(seqs) > d.max_sequences:
        # A fixed subset (same seed -> same sequences), kept in stream order.
        keep = np.sort(np.random.default_rng(d.seed).permutation(len(seqs))[: d.max_sequences])
        seqs, mask = seqs[keep], mask[keep]
    return seqs, mask


def describe(tokens: np.ndarray, mask: np.ndarray) -> dict:
    return {"sequences": int(tokens.shape[0]), "tokens": int(tokens.size), "loss_tokens": int(mask.sum())}


__all__: Sequence[str] = (
    "Packed",
    "PackedSource",
    "batches",
    "describe",
    "dialogue_tokens",
    "load_sequences",
    "max_offset",
    "offsets_for",
    "pack",
    "source_tokens",
    "token_stream",
    "tokens_cache_dir",
)


def load_distilled(out_dir: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """A self-distilled set (`lsjax.cli.distill`): every finished part's (tokens, loss_mask)
    [N, seq_len], in part order, then those of its later passes (`pass-N/`, the device job's) in pass order."""
    pattern = "part-[0-9][0-9][0-9][0-9][0-9].npz"
    parts = sorted(Path(out_dir).glob(pattern)) + sorted(Path(out_dir).glob(f"pass-[0-9]*/{pattern}"))
    if not parts:
        raise LsjaxError(f"self-distill: no finished parts in {out_dir}")
    toks, masks = [], []
    for p in parts:
        with np.load(p) as z:
            toks.append(z["tokens"])
            masks.append(z["loss_mask"])
    return np.concatenate(toks), np.concatenate(masks)
