"""Prompt suites for the evaluation harness (`lsjax.bench.run`).

dev      build_prompts on the DEV split: summarization, code, dialogue x 1K-2K / 2K-4K / 4K-7K tokens
heldout  the same on the HELD-OUT split: dev documents nothing was ever trained or tuned on
         (`corpora.eval_split_of`); report it beside dev, never tune on it
quick  a handful of ~240-token prompts from sources that need no registry fetch (the interpreter's
       stdlib and the bundled speech), so CI can run the harness end to end offline in seconds
FILE   a user's `{"id", "prompt"[, "chat"]}` JSONL file (--prompts)
"""

from __future__ import annotations

from pathlib import Path

from lsjax.prompts import (
    BUCKETS,
    TASKS,
    Prompt,
    build_prompts,
    read_prompts_jsonl,
    render_chat,
    stdlib_code_prompt,
)

SUITES = ("dev", "heldout", "quick")
QUICK_TOKENS = 240  # under 256: the smallest prompt bucket, so prefill and the cache stay small
BUNDLED_SPEECH = Path(__file__).resolve().parents[1] / "assets" / "default_prompt.txt"


def bucket_of(num_tokens: int) -> str:
    """The dev bucket a length falls in, so user and quick prompts line up with the dev tables."""
    for name, (lo, hi) in BUCKETS.items():
        if lo <= num_tokens < hi:
            return name
    first, last = next(iter(BUCKETS.values())), list(BUCKETS.values())[-1]
    return f"<{first[0] // 1024}K" if num_tokens < first[0] else f"{last[1] // 1024}K+"


def encode(tokenizer, prompt: Prompt) -> list[int]:
    # The chat template already holds the special tokens; raw text gets the tokenizer's own (BOS).
    return tokenizer.encode(prompt.text, add_special_tokens=not prompt.chat)


def _speech_prompt(tokenizer, index: int, budget: int) -> Prompt:
    """Window `index` of the bundled speech, cut at sentence ends to ~budget tokens, + the instruction."""
    text = BUNDLED_SPEECH.read_text(encoding="utf-8")
    speech, _, instruction = text.rpartition("\n\n")
    sentences = [s.strip() + "." for s in speech.replace("\n", " ").split(". ") if s.strip()]
    # Windows start at spread-out sentences so the prompts differ; the count check is on the rendered text.
    start = (index * len(sentences)) // 4
    chosen, n = [], 0
    for s in sentences[start:]:
        trial = " ".join([*chosen, s])
        rendered = render_chat(tokenizer, [{"role": "user", "content": f"{trial}\n\n{instruction.strip()}"}])
        n_trial = len(tokenizer.encode(rendered, add_special_tokens=False))
        if chosen and n_trial > budget:
            break
        chosen, n, final = [*chosen, s], n_trial, rendered
    return Prompt(f"summarization/quick/{index:02d}", "summarization", bucket_of(n), final, True, n, {"start": start})


def quick_prompts(tokenizer, per_task: int = 2) -> list[Prompt]:
    out = [_speech_prompt(tokenizer, i, QUICK_TOKENS) for i in range(per_task)]
    for i in range(per_task):
        p = stdlib_code_prompt(tokenizer, QUICK_TOKENS, seed=i)
        out.append(Prompt(f"code/quick/{i:02d}", "code", bucket_of(p.num_tokens), p.text, False, p.num_tokens, p.meta))
    return out


def load_suite(
    tokenizer,
    suite: str,
    prompts_file: str | None = None,
    per_cell: int | None = None,
    tasks=TASKS,
    buckets=tuple(BUCKETS),
    seed: int = 0,
) -> list[Prompt]:
    if prompts_file:
        return [
            Prompt(p.id, p.task, bucket_of(p.num_tokens), p.text, p.chat, p.num_tokens, p.meta)
            for p in read_prompts_jsonl(prompts_file, tokenizer)
        ]
    if suite == "quick":
        return quick_prompts(tokenizer, per_cell or 2)
    if suite in ("dev", "heldout"):
        return build_prompts(tokenizer, tasks, buckets, per_cell or 2, seed, split=suite)
    raise ValueError(f"unknown suite {suite!r}; choose from {', '.join(SUITES)}")
