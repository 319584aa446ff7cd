"""Can a prompt say, before any output, whether prompt lookup will pay on it? Prompt lookup run over the prompt's
own second half (each position drafting from the tokens before it, as `pld` would: the longest of the last 3, 2, 1
tokens found earlier, its next 8 tokens proposed; accepted tokens skipped) gives a "self tau" per suite prompt;
beside it, the tau `auto` reached on that prompt's 200 generated tokens in a results file of
`scripts/checkout_ab.py` rows, and the rank correlation of the two.

    python scripts/lookup_from_prompt.py [--results docs/results/cpu-eager-two-groups-dev-2026-12-05.jsonl ...]

A predictor would let a CPU start skip loading prompt lookup's program where it will not repay its load (~1 CPU-s
on 2 cores; docs/CHANGELOG.md 2026-12-05).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RESULTS = [
    f"docs/results/{name}-2026-12-05.jsonl"
    for name in (
        "cpu-eager-two-groups-dev",
        "cpu-eager-two-groups-heldout",
        "cpu-default-4k7k-dev",
        "cpu-default-4k7k-heldout",
    )
]
AUTO = ("eager", "new")  # the rows' name for decode.py's default in those files


def self_tau(ids: list[int], start: int, chain: int = 8, ngram: int = 3) -> float:
    """Tokens per step of greedy prompt lookup over ids[start:], every step drafting from the tokens before it."""
    last: dict[tuple, int] = {}  # n-gram -> the index of its last token, latest occurrence

    def index(upto: int) -> None:  # n-grams ending before position `upto`
        for n in range(1, ngram + 1):
            if upto - n >= 0:
                last[tuple(ids[upto - n : upto])] = upto - 1

    for j in range(1, start + 1):
        index(j)
    j, steps, made = start, 0, 0
    while j < len(ids) - 1:
        # the context is ids[: j + 1]; its n-grams end at j, an earlier match ends before j
        match = next(
            (last[k] for n in range(ngram, 0, -1) if (k := tuple(ids[j - n + 1 : j + 1])) in last and last[k] < j),
            None,
        )
        accepted = 0
        if match is not None:
            for t, tok in enumerate(ids[match + 1 : match + 1 + chain]):
                if j + 1 + t < len(ids) and ids[j + 1 + t] == tok:
                    accepted += 1
                else:
                    break
        for k in range(j + 1, min(j + accepted + 1, len(ids) - 1) + 1):
            index(k)
        j, steps, made = j + accepted + 1, steps + 1, made + accepted + 1
    return made / steps if steps else 1.0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", nargs="+", default=RESULTS)
    args = p.parse_args(argv)
    from scipy.stats import spearmanr

    from lsjax.bench.suites import load_suite
    from lsjax.loading import load_model

    tau: dict[str, float] = {}
    for f in args.results:
        for line in Path(f).read_text().splitlines():
            row = json.loads(line)
            if row.get("variant") in AUTO and "mean_accepted" in row:
                tau.setdefault(row["source"], row["mean_accepted"])
    tok = load_model().tokenizer
    by_suite: dict[str, list[tuple[float, float]]] = {}
    print("prompt                              tokens  self tau  auto's tau")
    for suite in ("dev", "heldout"):
        buckets = sorted({s.split("/")[1] for s in tau if s.startswith(suite + ":")})
        for pr in load_suite(tok, suite, None, 1, ("code", "summarization", "dialogue"), tuple(buckets)):
            source = f"{suite}:{pr.id}"
            if source not in tau:
                continue
            ids = tok.encode(pr.text)
            mine = self_tau(ids, len(ids) // 2)
            by_suite.setdefault(suite, []).append((mine, tau[source]))
            print(f"{source:34s} {len(ids):6d}  {mine:8.2f}  {tau[source]:10.2f}")
    for suite, pairs in by_suite.items():
        print(
            f"{suite}: rank correlation of self tau and auto's tau over {len(pairs)} prompts: "
            f"{spearmanr(*zip(*pairs)).statistic:.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
