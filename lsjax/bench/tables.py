"""Markdown tables from the evaluation harness's results.json, for the README and docs/results/.

    python -m lsjax.bench.tables bench_results/heldout/results.json                  # print every section
    python -m lsjax.bench.tables docs/results/heldout.json --out docs/results/headline.md
    python -m lsjax.bench.tables A/results.json B/results.json --section task       # one section, two runs

Each results file gives one block: a short list naming the suite, the date, the commit, the machine and the
command that produced the results, then the tables: `task` (speedup over lsjax-ar and tau per method x task, plus all
prompts pooled, one table per temperature), `bucket` (the same per prompt-length bucket) and `equality` (the
share of T=0 outputs equal to lsjax-ar's). A field the results do not record (older runs have no commit) is
written as 'unknown'. The numbers are pooled by `lsjax.bench.report.aggregates` from the per-prompt rows, the
same aggregates the harness's own results.md shows.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from lsjax.bench import report

SECTIONS = ("task", "bucket", "equality")
TASK_ORDER = ("summarization", "code", "dialogue")
UNKNOWN = "unknown"


def _temp(t) -> str:
    return f"{float(t):g}"


def _cell(agg: dict | None) -> str:
    """'1.07x, tau 1.58': speed over lsjax-ar in the same run, then tokens per target forward."""
    if agg is None:
        return ""
    s, tau = agg.get("speedup_vs_lsjax_ar"), agg.get("tau")
    speed = "n/a" if s is None else f"{s:.2f}x"
    return speed if tau is None else f"{speed}, tau {tau:.2f}"


def _machine(meta: dict) -> str:
    m = meta.get("machine") or {}
    if not m:
        return UNKNOWN
    parts = [f"{m.get('cpu', UNKNOWN)}, {m.get('cores', '?')} cores"]
    if m.get("backend") or m.get("jax"):
        parts.append(f"{m.get('backend', UNKNOWN)} backend, jax {m.get('jax', UNKNOWN)}")
    if m.get("loadavg_start"):
        parts.append(f"load average {m['loadavg_start']} at start, {m.get('loadavg_end', UNKNOWN)} at end")
    return "; ".join(parts)


def header(result: dict) -> list[str]:
    meta = result.get("meta") or {}
    date = meta.get("date") or UNKNOWN
    commit = meta.get("commit") or meta.get("git_commit") or UNKNOWN
    command = meta.get("command")
    temps = ", ".join(_temp(t) for t in meta.get("temperatures", [])) or UNKNOWN
    model = Path(meta["model"]).name if meta.get("model") else UNKNOWN
    eos = " (EOS ignored)" if meta.get("ignore_eos") else ""
    return [
        f"- Suite `{meta.get('suite', UNKNOWN)}`: {meta.get('num_prompts', UNKNOWN)} prompts, "
        f"{meta.get('max_new_tokens', UNKNOWN)} new tokens{eos}, T = {temps}; target {model}; "
        f"LongSpec draft {meta.get('draft', UNKNOWN)}, tree {meta.get('tree', UNKNOWN)}",
        f"- Date: {date}; commit: {commit}",
        f"- Machine: {_machine(meta)}",
        f"- Results made by: `{command}`" if command else f"- Results made by: {UNKNOWN}",
    ]


def _aggs(result: dict) -> dict:
    rows = result.get("rows") or []
    return report.aggregates(rows) if rows else result.get("aggregates") or {}


def _methods(result: dict, aggs: dict) -> list[str]:
    seen = [a["method"] for a in aggs.get("method", [])]
    return report.ordered(seen, (result.get("meta") or {}).get("methods", ()))


def _temps(aggs: dict) -> list:
    return sorted({a["temperature"] for a in aggs.get("method", [])})


def by_group(aggs: dict, methods, temperature, grouping: str, columns) -> list[str]:
    """Method x `grouping` (task or bucket) at one temperature, plus the pooled 'all prompts' column."""
    by = {(a["method"], a[grouping]): a for a in aggs.get(grouping, []) if a["temperature"] == temperature}
    pooled = {a["method"]: a for a in aggs.get("method", []) if a["temperature"] == temperature}
    lines = [
        "| method | " + " | ".join(columns) + " | all prompts |",
        "|---|" + "---|" * (len(columns) + 1),
    ]
    for m in methods:
        if m not in pooled:
            continue
        cells = [_cell(by.get((m, c))) for c in columns]
        lines.append(f"| {m} | " + " | ".join(cells) + f" | {_cell(pooled[m])} |")
    return lines


def _baseline_speed(aggs: dict, temperature) -> list[str]:
    ar = next(
        (a for a in aggs.get("method", []) if a["method"] == "lsjax-ar" and a["temperature"] == temperature), None
    )
    if ar is None or ar.get("tokens_per_s") is None:
        return []
    return ["", f"lsjax-ar itself: {ar['tokens_per_s']:.1f} tok/s over all prompts ({ar['prompts']} prompts)."]


def equality(result: dict, aggs: dict, methods) -> list[str]:
    lossless = set((result.get("meta") or {}).get("lossless", ()))
    by = {a["method"]: a for a in aggs.get("method", []) if a.get("equal_to_lsjax_ar") is not None}
    lines = ["| method | T=0 outputs equal to lsjax-ar | held to it |", "|---|---|---|"]
    for m in methods:
        if m in by:
            lines.append(f"| {m} | {by[m]['equal_to_lsjax_ar']:.0%} | {'yes' if m in lossless else 'no'} |")
    return lines if len(lines) > 2 else []


def tables(result: dict, sections=SECTIONS) -> str:
    aggs = _aggs(result)
    methods = _methods(result, aggs)
    temps = _temps(aggs)
    meta = result.get("meta") or {}
    out = header(result)
    out += [
        "",
        "Each cell: decode speed over lsjax-ar's on the same prompts in the same run, then tau (tokens per "
        "target forward). Decode only: prefill and compile excluded.",
    ]
    if "task" in sections:
        tasks = report.ordered({a["task"] for a in aggs.get("task", [])}, TASK_ORDER)
        for t in temps:
            out += ["", f"By task, T = {_temp(t)}:", "", *by_group(aggs, methods, t, "task", tasks)]
            out += _baseline_speed(aggs, t)
    if "bucket" in sections:
        order = meta.get("bucket_order", ())
        buckets = report.ordered({a["bucket"] for a in aggs.get("bucket", [])}, order)
        for t in temps:
            out += [
                "",
                f"By prompt length (tokens), T = {_temp(t)}:",
                "",
                *by_group(aggs, methods, t, "bucket", buckets),
            ]
    if "equality" in sections:
        eq = equality(result, aggs, methods)
        if eq:
            out += ["", *eq]
    if result.get("failures"):
        out += ["", "T=0 equality FAILED:", ""] + [f"- {f}" for f in result["failures"]]
    return "\n".join(out) + "\n"


def render(paths, sections=SECTIONS) -> str:
    blocks = []
    for p in paths:
        result = json.loads(Path(p).read_text(encoding="utf-8"))
        blocks.append(tables(result, sections))
    return "\n".join(blocks)


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="python -m lsjax.bench.tables",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("results", nargs="+", help="results.json written by python -m lsjax.bench.run")
    p.add_argument("--out", type=Path, help="write the Markdown here (default: print it)")
    p.add_argument(
        "--section",
        action="append",
        choices=SECTIONS,
        help="only this section (repeatable; default: all of " + ", ".join(SECTIONS) + ")",
    )
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    for p in args.results:
        if not Path(p).is_file():
            print(f"tables: no such file: {p}", file=sys.stderr)
            return 2
    try:
        text = render(args.results, tuple(args.section or SECTIONS))
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        print(f"tables: not a results.json of lsjax.bench.run: {e}", file=sys.stderr)
        return 2
    if args.out:
        made_by = shlex.join(["python", "-m", "lsjax.bench.tables", *(sys.argv[1:] if argv is None else argv)])
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(f"<!-- generated by `{made_by}`: edit the command, not this file -->\n\n{text}", "utf-8")
        print(f"tables: wrote {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
