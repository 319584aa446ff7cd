"""Self-distilled training data: the target's own answers to prompts built from *train-split* documents.

A draft is judged by what verification accepts, i.e. by how well it predicts the target's own continuations.
Training on text the target wrote (EAGLE, Medusa-2) aligns it with exactly that. The prompts are made by the
benchmark's own builders (`lsjax.prompts`: summarise a speech, continue code, answer in a dialogue), on
documents of the train split only, so no evaluation document is ever seen.

    python -m lsjax.cli.distill --out DIR --per-task 64 --max-new-tokens 192         # resumable
    python -m lsjax.train.feature_cache --set self-distill --from-distilled DIR      # then its features

Each example is one row of `seq_len` tokens: prompt, the target's answer, EOS, then padding. The loss mask
covers the answer and its end (what the draft must predict at decode time). Half the batches are greedy
(T = 0), half sampled (T = 1, min-p 0.1), so the draft also sees the target's sampled text.
Batches are written as `part-XXXXX.npz` under a temporary name and renamed: a killed run resumes where it
stopped and writes the same files.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from lsjax.errors import LsjaxError
from lsjax.train.data import load_distilled as load  # noqa: F401  (the reader of what this writes)

TASK_SOURCES = {"summarization": "sotu", "code": "stdlib", "dialogue": "sharegpt"}


def train_prompts(tokenizer, per_task: int, bucket: str, seed: int = 0) -> list:
    """per_task prompts per task kind from train-split documents, in a fixed order."""
    from lsjax import corpora
    from lsjax import prompts as bp

    out = []
    for task in bp.TASKS:
        builder, loader = bp.BUILDERS[task]
        docs = [d for d in loader(None) if corpora.split_of(d.id) == "train"]
        out.extend(builder(tokenizer, docs, bucket, per_task, seed))
    return out


def encode(tokenizer, prompt) -> list[int]:
    return list(tokenizer.encode(prompt.text, add_special_tokens=not prompt.chat))


def rows_from_answers(prompt_ids, answers, lengths, seq_len: int, eos: int, pad: int):
    """Prompt + answer (+ EOS when the answer stopped) in a row of seq_len tokens; mask on the answer."""
    B = len(prompt_ids)
    tokens = np.full((B, seq_len), pad, np.int32)
    mask = np.zeros((B, seq_len), np.uint8)
    for b in range(B):
        p, a = prompt_ids[b], list(answers[b][: lengths[b]])
        row = (p + a)[:seq_len]
        tokens[b, : len(row)] = row
        mask[b, len(p) : len(row)] = 1
    return tokens, mask


@functools.cache
def _jitted_generate():
    """One jitted generator for the process: the device job's later passes reuse the programs the first
    compiled (the config, static and hashable, keys them) instead of compiling them again per pass."""
    from lsjax import api

    return jax.jit(api.generate, static_argnames="config")


def sampling_index(part: int, parity: int = 0, sampled_only: bool = False) -> int:
    """0 (greedy) or 1 (sampled) for a part of `write_answers`."""
    return 1 if sampled_only else (part + parity) % 2


def write_answers(
    out_dir: str | Path,
    params,
    config,
    tokenizer,
    prompts: list,
    *,
    seq_len: int = 2048,
    max_new_tokens: int = 192,
    batch_size: int = 8,
    seed: int = 0,
    log=print,
    token_ids: list | None = None,
    deadline: float | None = None,
    parity: int = 0,
    sampled_only: bool = False,
) -> dict:
    """Writes one part per batch of prompts (resumable); returns the manifest. `token_ids`: the prompts already
    encoded (then `tokenizer` is not used); `deadline` (`time.monotonic()`): start no part after it. Parts
    alternate greedy and sampled answers, the first greedy; `parity=1` starts with a sampled one (a second pass
    then answers each prompt the other way), `sampled_only` samples every part (later passes: a greedy answer
    would repeat one already written)."""
    from lsjax import api
    from lsjax.config import GenerateConfig, SamplingConfig
    from lsjax.engine import PREFILL_CHUNK

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    eos = config.eos_token_ids[0] if config.eos_token_ids else config.pad_token_id
    ids = [encode(tokenizer, p) for p in prompts] if token_ids is None else [list(t) for t in token_ids]
    keep = [i for i, p in enumerate(ids) if len(p) + max_new_tokens + 1 <= seq_len]
    if not keep:
        raise LsjaxError(
            f"self-distill: no prompt leaves room for {max_new_tokens} answer tokens in a row of {seq_len} "
            f"(shortest prompt: {min(map(len, ids), default=0)} tokens); lower max_new_tokens or raise seq_len"
        )
    manifest = {
        "version": 1,
        "seq_len": seq_len,
        "max_new_tokens": max_new_tokens,
        "batch_size": batch_size,
        "seed": seed,
        "prompts": [{"id": prompts[i].id, "task": prompts[i].task, "doc": prompts[i].meta.get("doc")} for i in keep],
    }
    mfile = out_dir / "manifest.json"
    if mfile.exists() and json.loads(mfile.read_text())["prompts"] != manifest["prompts"]:
        raise LsjaxError(f"self-distill: {out_dir} holds another prompt set; choose another --out")
    mfile.write_text(json.dumps(manifest, indent=1) + "\n")
    P = -(-max(len(ids[i]) for i in keep) // PREFILL_CHUNK) * PREFILL_CHUNK
    samplings = (SamplingConfig(), SamplingConfig(temperature=1.0, min_p=0.1))
    generate = _jitted_generate()
    t0, made = time.perf_counter(), 0
    for part, lo in enumerate(range(0, len(keep), batch_size)):
        path = out_dir / f"part-{part:05d}.npz"
        if path.exists():
            continue
        if deadline is not None and time.monotonic() > deadline:
            log(f"self-distill: time is up after {part} of {-(-len(keep) // batch_size)} parts")
            break
        sel = keep[lo : lo + batch_size]
        sampling = samplings[sampling_index(part, parity, sampled_only)]
        cfg = api.SpecConfig(model=config, gen=GenerateConfig(max_new_tokens, sampling=sampling))
        batch = np.zeros((batch_size, P), np.int32)
        lengths = np.ones((batch_size,), np.int32)
        for r, i in enumerate(sel):
            batch[r, : len(ids[i])], lengths[r] = ids[i], len(ids[i])
        key = jax.random.fold_in(jax.random.PRNGKey(seed), part)
        out = jax.device_get(generate(params, (), jnp.asarray(batch), cfg, key, jnp.asarray(lengths)))
        n = len(sel)
        tokens, mask = rows_from_answers(
            [ids[i] for i in sel], out.tokens[:n], out.num_tokens[:n], seq_len, eos, config.pad_token_id
        )
        tmp = out_dir / f"part-{part:05d}.tmp.npz"
        np.savez(
            tmp,
            tokens=tokens,
            loss_mask=mask,
            prompt=np.asarray(sel, np.int32),
            temperature=np.float32(sampling.temperature),
        )
        tmp.replace(path)
        made += int(out.num_tokens[:n].sum())
        rate = made / max(time.perf_counter() - t0, 1e-9)
        log(f"self-distill: part {part + 1}/{-(-len(keep) // batch_size)}, {made} answer tokens ({rate:.1f} tok/s)")
    return manifest


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lsjax.cli.distill", description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--per-task", type=int, default=64, help="prompts per task kind (summarization, code, dialogue)")
    p.add_argument("--bucket", default="1K-2K")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--max-new-tokens", type=int, default=192)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    try:
        from lsjax.loading import load_model

        loaded = load_model(None)
        prompts = train_prompts(loaded.tokenizer, args.per_task, args.bucket, args.seed)
        # Shuffled, so every prefix of the run covers all three task kinds.
        order = np.random.default_rng(args.seed).permutation(len(prompts))
        prompts = [prompts[i] for i in order]
        write_answers(
            args.out,
            jax.tree.map(jnp.asarray, loaded.params),
            loaded.config,
            loaded.tokenizer,
            prompts,
            seq_len=args.seq_len,
            max_new_tokens=args.max_new_tokens,
            batch_size=args.batch_size,
            seed=args.seed,
        )
    except LsjaxError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
