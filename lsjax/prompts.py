"""Evaluation prompt sets cut from the DEV split of the real corpora (see lsjax/corpora.py).

Three tasks mirror the LongSpec paper's settings on text we can actually get here:
  summarization  a State of the Union speech + an instruction, in the chat template (GovReport-like);
  code           repository-level completion: sibling files of one stdlib package, then a long prefix of
                 the target file cut at a line boundary, raw text (LCC / RepoBench-P-like);
  dialogue       a ShareGPT conversation up to a user turn, in the chat template.
Each prompt is cut so that the tokenizer's count of the *final* prompt lands inside its length bucket.
Everything is driven by a seed, so the same tokenizer and seed give the same prompts.

Token counts: chat prompts are counted with `add_special_tokens=False` (the template already holds the
special tokens), raw prompts with `add_special_tokens=True`; decode.py should encode them the same way
(`encode`).

The benchmarks ask for prompts by suite (`load_suite`): `dev` and `heldout` (these sets on either split),
`quick` (a few short prompts that need no corpus fetch) or a user's JSONL file.
"""

from __future__ import annotations

import json
import os
import random
import re
import warnings
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from lsjax import corpora
from lsjax.corpora import Document

__all__ = [
    "BUCKETS",
    "SUITES",
    "TASKS",
    "Prompt",
    "PromptFileError",
    "bucket_of",
    "build_prompts",
    "code_prompts",
    "count_tokens",
    "dialogue_prompts",
    "encode",
    "load_suite",
    "quick_prompts",
    "read_prompts_jsonl",
    "render_chat",
    "stdlib_code_prompt",
    "summarization_prompts",
]

# Half-open token ranges [lo, hi); the top stays under 7K so an 8K-context model has room to generate.
BUCKETS: dict[str, tuple[int, int]] = {"1K-2K": (1024, 2048), "2K-4K": (2048, 4096), "4K-7K": (4096, 7168)}
TASKS = ("summarization", "code", "dialogue")


class Tokenizer(Protocol):
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str: ...


@dataclass(frozen=True)
class Prompt:
    id: str
    task: str
    bucket: str
    text: str  # the final text to encode (already rendered with the chat template when chat is True)
    chat: bool
    num_tokens: int  # -1 when unknown (a user file read without a tokenizer)
    meta: dict = field(default_factory=dict, compare=False)


class PromptFileError(ValueError):
    """A malformed user prompt file; the message names the file and line."""


# ----------------------------------------------------------------------------- tokenizer helpers


def render_chat(tokenizer: Tokenizer, messages: list[dict]) -> str:
    # HF tokenizers tokenize by default and need tokenize=False to return text; simpler adapters take no flag.
    try:
        out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    except TypeError:
        out = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    if not isinstance(out, str):
        raise TypeError(f"apply_chat_template must return text, got {type(out).__name__}")
    return out


def count_tokens(tokenizer: Tokenizer, text: str, chat: bool) -> int:
    return len(tokenizer.encode(text, add_special_tokens=not chat))


def _largest_fitting(lo: int, hi: int, cost: Callable[[int], int], budget: int) -> tuple[int, int] | None:
    """Largest k in [lo, hi] with cost(k) <= budget, for cost non-decreasing in k; (k, cost) or None.

    Gallops up from `lo` before bisecting, so the texts it measures stay within ~2x the budget even when
    [lo, hi] spans a whole package or speech (tokenizing those whole is what makes a plain bisection slow).
    """
    c = cost(lo)
    if c > budget:
        return None
    best, step = (lo, c), 1
    while best[0] < hi:
        probe = min(best[0] + step, hi)
        c = cost(probe)
        if c > budget:
            hi = probe - 1
            break
        best, step = (probe, c), step * 2
    lo = best[0] + 1
    while lo <= hi:
        mid = (lo + hi) // 2
        c = cost(mid)
        if c <= budget:
            best, lo = (mid, c), mid + 1
        else:
            hi = mid - 1
    return best


def _cell_rng(seed: int, task: str, bucket: str) -> random.Random:
    # String seeds hash deterministically (sha512) in random.Random, unlike hash() of a tuple.
    return random.Random(f"lsjax-prompts/{seed}/{task}/{bucket}")


def _target_length(rng: random.Random, lo: int, hi: int) -> int:
    # Aim strictly inside the bucket so cuts that undershoot by a sentence or a line still land in it.
    return rng.randint(lo + (hi - lo) // 8, hi - 1)


def _short_of(task: str, bucket: str, got: int, want: int) -> None:
    if got < want:
        warnings.warn(f"{task} {bucket}: only {got} of {want} prompts fit the bucket", stacklevel=3)


# ----------------------------------------------------------------------------- summarization

_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+")


def _sentences(text: str) -> list[str]:
    # SOTU texts carry no paragraph breaks, so sentence ends are the finest natural cut.
    out, start = [], 0
    for m in _SENTENCE_END.finditer(text):
        out.append(text[start : m.end()])
        start = m.end()
    if start < len(text):
        out.append(text[start:])
    return out


def _summary_instruction(doc: Document, truncated: bool) -> str:
    who = doc.meta.get("name")
    year = doc.meta.get("year")
    about = f" It is {'the opening part of ' if truncated else ''}the {year} State of the Union address by {who}."
    if who is None or year is None:
        about = " It is the opening part of a speech." if truncated else ""
    return f"Summarize the speech above in a few paragraphs, covering its main points.{about}"


def summarization_prompts(
    tokenizer: Tokenizer, docs: Sequence[Document], bucket: str, n: int, seed: int = 0
) -> list[Prompt]:
    lo, hi = BUCKETS[bucket]
    rng = _cell_rng(seed, "summarization", bucket)
    order = sorted(docs, key=lambda d: d.id)
    rng.shuffle(order)
    out = []
    for doc in order:
        if len(out) == n:
            break
        sents = _sentences(doc.text)
        target = _target_length(rng, lo, hi)

        def build(k: int, doc=doc, sents=sents) -> str:
            speech = "".join(sents[:k]).rstrip()
            content = f"{speech}\n\n{_summary_instruction(doc, k < len(sents))}"
            return render_chat(tokenizer, [{"role": "user", "content": content}])

        fit = _largest_fitting(1, len(sents), lambda k, b=build: count_tokens(tokenizer, b(k), True), target)
        if fit is None or fit[1] < lo:
            continue  # speech too short for this bucket, or its first sentence alone overshoots
        k, ntok = fit
        meta = {"doc": doc.id, "sentences": k, "truncated": k < len(sents), "target": target}
        out.append(
            Prompt(f"summarization/{bucket}/{len(out):02d}", "summarization", bucket, build(k), True, ntok, meta)
        )
    _short_of("summarization", bucket, len(out), n)
    return out


# ----------------------------------------------------------------------------- code


def _file_block(path: str, text: str) -> str:
    return f"# file: {path}\n{text.rstrip()}\n\n"


def _code_prompt_for(
    tokenizer: Tokenizer, target: Document, siblings: Sequence[Document], budget: int, rng: random.Random
) -> tuple[str, int, dict] | None:
    """Cross-file context + a long prefix of `target`, as close to `budget` tokens as fits (never above)."""
    lines = target.text.splitlines(keepends=True)
    # Keep at least a tenth of the file (>= 10 lines) after the cut: there must be something to complete.
    max_prefix = len(lines) - max(10, len(lines) // 10)
    min_prefix = 20
    if max_prefix < min_prefix:
        return None
    head = f"# file: {target.meta['path']}\n"
    ctx_lines = "".join(_file_block(d.meta["path"], d.text) for d in siblings).splitlines(keepends=True)

    def text(m: int, k: int) -> str:
        return "".join(ctx_lines[:m]) + head + "".join(lines[:k])

    def cost(m: int, k: int) -> int:
        return count_tokens(tokenizer, text(m, k), False)

    # The target's own prefix gets a random share of the budget; context fills the rest; if context runs
    # out, the prefix grows back into the remaining budget.
    share = rng.uniform(0.3, 0.6)
    first = _largest_fitting(min_prefix, max_prefix, lambda k: cost(0, k), int(budget * share))
    k = first[0] if first else min_prefix
    fit_m = _largest_fitting(0, len(ctx_lines), lambda m: cost(m, k), budget)
    if fit_m is None:
        return None
    m = fit_m[0]
    fit_k = _largest_fitting(k, max_prefix, lambda kk: cost(m, kk), budget)
    if fit_k is None:
        return None
    k, ntok = fit_k
    context_files = sum(1 for ln in ctx_lines[:m] if ln.startswith("# file: "))
    meta = {"doc": target.id, "prefix_lines": k, "context_lines": m, "context_files": context_files}
    meta["continuation"] = "".join(lines[k : k + 20])
    return text(m, k), ntok, meta


def _code_targets(docs: Sequence[Document]) -> list[tuple[Document, list[Document]]]:
    """(target, siblings) for every file of a package that has at least one other file."""
    by_pkg: dict[str, list[Document]] = defaultdict(list)
    for d in docs:
        if d.meta.get("package"):
            by_pkg[d.meta["package"]].append(d)
    out = []
    for pkg in sorted(by_pkg):
        files = sorted(by_pkg[pkg], key=lambda d: d.meta["path"])
        if len(files) < 2:
            continue
        for t in files:
            out.append((t, [d for d in files if d is not t]))
    if not out:  # no multi-file package in these documents (the held-out stdlib): single modules, no context
        out = [(d, []) for d in sorted(docs, key=lambda d: d.id)]
    return out


def _order_siblings(siblings: list[Document], rng: random.Random) -> list[Document]:
    # __init__ first (it names the package's API), the rest in a seeded order so prompts vary across cells.
    inits = [d for d in siblings if d.meta["path"].endswith("__init__.py")]
    rest = [d for d in siblings if d not in inits]
    rng.shuffle(rest)
    return inits + rest


def code_prompts(tokenizer: Tokenizer, docs: Sequence[Document], bucket: str, n: int, seed: int = 0) -> list[Prompt]:
    lo, hi = BUCKETS[bucket]
    rng = _cell_rng(seed, "code", bucket)
    targets = _code_targets(docs)
    rng.shuffle(targets)
    out = []
    for target, siblings in targets:
        if len(out) == n:
            break
        built = _code_prompt_for(tokenizer, target, _order_siblings(siblings, rng), _target_length(rng, lo, hi), rng)
        if built is None or built[1] < lo:
            continue
        text, ntok, meta = built
        out.append(Prompt(f"code/{bucket}/{len(out):02d}", "code", bucket, text, False, ntok, meta))
    _short_of("code", bucket, len(out), n)
    return out


def stdlib_code_prompt(tokenizer: Tokenizer, num_tokens: int, seed: int = 0, cache=None, tolerance=0.1) -> Prompt:
    """One repository-level code prompt of num_tokens*(1-tolerance) .. num_tokens tokens from the DEV stdlib."""
    docs = [d for d in corpora.load_stdlib(cache) if corpora.split_of(d.id) == "dev"]
    rng = random.Random(f"lsjax-stdlib-code/{seed}/{num_tokens}")
    targets = _code_targets(docs)
    rng.shuffle(targets)
    for target, siblings in targets:
        built = _code_prompt_for(tokenizer, target, _order_siblings(siblings, rng), num_tokens, rng)
        if built is not None and built[1] >= num_tokens * (1 - tolerance):
            text, ntok, meta = built
            return Prompt(f"code/~{num_tokens}/{seed}", "code", f"~{num_tokens}", text, False, ntok, meta)
    raise ValueError(f"no stdlib file yields a code prompt of ~{num_tokens} tokens")


# ----------------------------------------------------------------------------- dialogue


def _mostly_english(text: str, threshold: float = 0.95) -> bool:
    # A cheap script check: the chat template and the model are English-centric, and ShareGPT is not.
    if not text:
        return False
    return sum(ch.isascii() for ch in text) / len(text) >= threshold


def _window(messages: list[dict], start: int, end: int) -> list[dict]:
    # A leading system message stays when earlier turns are dropped: it frames the whole conversation.
    system = [messages[0]] if start > 0 and messages[0]["role"] == "system" else []
    return system + messages[start:end]


def _fit_dialogue(tokenizer: Tokenizer, messages: list[dict], ends: list[int], target: int):
    """(start, end, tokens) of a window that ends on a user turn and holds at most `target` tokens.

    First the longest history from the beginning; if the next user turn would overshoot (a long paste can
    jump past the whole bucket), end there instead and drop the earliest turns until it fits.
    """

    def cost(start: int, end: int) -> int:
        return count_tokens(tokenizer, render_chat(tokenizer, _window(messages, start, end)), True)

    fit = _largest_fitting(0, len(ends) - 1, lambda j: cost(0, ends[j] + 1), target)
    j = fit[0] if fit else -1
    if j + 1 < len(ends) and (fit is None or fit[1] < target * 0.9):
        end = ends[j + 1] + 1
        starts = [i for i in ends if i <= ends[j + 1]]  # windows start on a user turn
        # k counts kept user turns from the end; fewer dropped turns -> more tokens.
        tail = _largest_fitting(1, len(starts), lambda k: cost(starts[len(starts) - k], end), target)
        if tail is not None and (fit is None or tail[1] > fit[1]):
            return starts[len(starts) - tail[0]], end, tail[1]
    if fit is None:
        return None
    return 0, ends[j] + 1, fit[1]


def dialogue_prompts(
    tokenizer: Tokenizer, docs: Sequence[Document], bucket: str, n: int, seed: int = 0
) -> list[Prompt]:
    lo, hi = BUCKETS[bucket]
    rng = _cell_rng(seed, "dialogue", bucket)
    # Skip conversations that could not reach the bucket even in full (chars/2 is a generous token bound).
    order = sorted((d for d in docs if len(d.text) >= lo * 2 and _mostly_english(d.text)), key=lambda d: d.id)
    rng.shuffle(order)
    out = []
    for doc in order:
        if len(out) == n:
            break
        messages = doc.meta["messages"]
        ends = [i for i, m in enumerate(messages) if m["role"] == "user"]
        if not ends:
            continue
        target = _target_length(rng, lo, hi)
        fit = _fit_dialogue(tokenizer, messages, ends, target)
        if fit is None or fit[2] < lo:
            continue
        start, end, ntok = fit
        text = render_chat(tokenizer, _window(messages, start, end))
        meta = {"doc": doc.id, "first_message": start, "messages": end - start, "target": target}
        out.append(Prompt(f"dialogue/{bucket}/{len(out):02d}", "dialogue", bucket, text, True, ntok, meta))
    _short_of("dialogue", bucket, len(out), n)
    return out


# ----------------------------------------------------------------------------- everything


BUILDERS = {
    "summarization": (summarization_prompts, corpora.load_sotu),
    "code": (code_prompts, corpora.load_stdlib),
    "dialogue": (dialogue_prompts, corpora.load_sharegpt),
}


def build_prompts(
    tokenizer: Tokenizer,
    tasks: Sequence[str] = TASKS,
    buckets: Sequence[str] = tuple(BUCKETS),
    per_cell: int = 8,
    seed: int = 0,
    cache: str | os.PathLike | None = None,
    split_seed: int = 0,
    dev_fraction: float = 0.1,
    split: str = "dev",
) -> list[Prompt]:
    """per_cell prompts for every (task, bucket), all from `split` documents ("dev" or "heldout",
    `corpora.eval_split_of`); fixed by `seed`."""
    if split not in ("dev", "heldout"):
        raise ValueError(f"split must be dev or heldout, got {split!r}")
    out = []
    for task in tasks:
        if task not in BUILDERS:
            raise ValueError(f"unknown task {task!r}; choose from {', '.join(TASKS)}")
        builder, loader = BUILDERS[task]
        docs = [d for d in loader(cache) if corpora.eval_split_of(d.id, split_seed, dev_fraction) == split]
        for bucket in buckets:
            if bucket not in BUCKETS:
                raise ValueError(f"unknown bucket {bucket!r}; choose from {', '.join(BUCKETS)}")
            out.extend(builder(tokenizer, docs, bucket, per_cell, seed))
    return out


# ----------------------------------------------------------------------------- user files


def read_prompts_jsonl(path: str | os.PathLike, tokenizer: Tokenizer | None = None) -> list[Prompt]:
    """Read `{"id", "prompt"[, "chat": true]}` lines. Chat prompts are user messages: with a tokenizer they
    are rendered with its chat template (and counted); without one, text stays raw and meta['render'] is True."""
    out, seen = [], set()
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue

            def bad(msg: str, lineno=lineno) -> PromptFileError:
                return PromptFileError(f"{path}:{lineno}: {msg}")

            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise bad(f"invalid JSON ({e.msg})") from None
            if not isinstance(rec, dict):
                raise bad("expected a JSON object")
            if "id" not in rec or not isinstance(rec["id"], str | int) or isinstance(rec["id"], bool):
                raise bad('missing or non-string "id"')
            if not isinstance(rec.get("prompt"), str) or not rec["prompt"]:
                raise bad('missing or empty string "prompt"')
            chat = rec.get("chat", False)
            if not isinstance(chat, bool):
                raise bad('"chat" must be true or false')
            pid = str(rec["id"])
            if pid in seen:
                raise bad(f"duplicate id {pid!r}")
            seen.add(pid)
            text, ntok = rec["prompt"], -1
            if tokenizer is not None:
                if chat:
                    text = render_chat(tokenizer, [{"role": "user", "content": text}])
                ntok = count_tokens(tokenizer, text, chat)
            meta = {"line": lineno, "render": chat and tokenizer is None}
            out.append(Prompt(pid, "user", "", text, chat, ntok, meta))
    if not out:
        raise PromptFileError(f"{path}: no prompts")
    return out


# ----------------------------------------------------------------------------- suites
# The benchmarks' prompt sets by name:
#   dev      build_prompts on the DEV split: summarization, code, dialogue x 1K-2K / 2K-4K / 4K-7K tokens
#   heldout  the same on the HELD-OUT split: dev documents nothing was ever trained or tuned on
#            (`corpora.eval_split_of`); report it beside dev, never tune on it
#   quick    a handful of ~240-token prompts from sources that need no registry fetch (the interpreter's
#            stdlib and the bundled speech), so CI can run the harness end to end offline in seconds
#   FILE     a user's `{"id", "prompt"[, "chat"]}` JSONL file (`prompts_file`)

SUITES = ("dev", "heldout", "quick")
QUICK_TOKENS = 240  # under 256: the smallest prompt bucket, so prefill and the cache stay small
BUNDLED_SPEECH = Path(__file__).resolve().parent / "assets" / "default_prompt.txt"


def bucket_of(num_tokens: int) -> str:
    """The dev bucket a length falls in, so user and quick prompts line up with the dev tables."""
    for name, (lo, hi) in BUCKETS.items():
        if lo <= num_tokens < hi:
            return name
    first, last = next(iter(BUCKETS.values())), list(BUCKETS.values())[-1]
    return f"<{first[0] // 1024}K" if num_tokens < first[0] else f"{last[1] // 1024}K+"


def encode(tokenizer: Tokenizer, prompt: Prompt) -> list[int]:
    # The chat template already holds the special tokens; raw text gets the tokenizer's own (BOS).
    return tokenizer.encode(prompt.text, add_special_tokens=not prompt.chat)


def _speech_prompt(tokenizer: Tokenizer, index: int, budget: int) -> Prompt:
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


def quick_prompts(tokenizer: Tokenizer, per_task: int = 2) -> list[Prompt]:
    out = [_speech_prompt(tokenizer, i, QUICK_TOKENS) for i in range(per_task)]
    for i in range(per_task):
        p = stdlib_code_prompt(tokenizer, QUICK_TOKENS, seed=i)
        out.append(Prompt(f"code/quick/{i:02d}", "code", bucket_of(p.num_tokens), p.text, False, p.num_tokens, p.meta))
    return out


def load_suite(
    tokenizer: Tokenizer,
    suite: str,
    prompts_file: str | None = None,
    per_cell: int | None = None,
    tasks=TASKS,
    buckets=tuple(BUCKETS),
    seed: int = 0,
) -> list[Prompt]:
    """The prompts of a suite (`SUITES`), or of a user's JSONL file when `prompts_file` is given."""
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
