"""What a harness run's results become: pooled aggregates, its results.md and PNG figures (written by
`lsjax.bench.run`), and the Markdown tables of the README and docs/results/.

    python -m lsjax.bench.tables bench_results/heldout/results.json                  # print every section
    python -m lsjax.bench.tables docs/results/heldout.json --out docs/results/headline.md
    python -m lsjax.bench.tables A/results.json B/results.json --section task       # one section, two runs

Aggregates pool tokens and seconds rather than averaging per-prompt rates: tok/s = sum(tokens after the
first) / sum(decode s), tau = sum(tokens after the first) / sum(decode forwards). Speedups divide a
method's pooled tok/s by the baseline's over the same prompts of the same run.

Each results file given to the command gives one block: a short list naming the suite, the date, the commit,
the machine and the command that produced the results, then the tables: `task` (speedup over lsjax-ar and tau
per method x task, plus all prompts pooled, one table per temperature), `bucket` (the same per prompt-length
bucket) and `equality` (the share of T=0 outputs equal to lsjax-ar's). A field the results do not record
(older runs have no commit) is written as 'unknown'. The numbers are pooled by `aggregates` from the
per-prompt rows, the same aggregates the harness's own results.md shows.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

# ----------------------------------------------------------------------------- aggregates

BASELINES = ("lsjax-ar", "hf-ar")
GROUPINGS = {
    "cell": ("method", "task", "bucket", "temperature"),
    "task": ("method", "task", "temperature"),  # Table 1
    "bucket": ("method", "bucket", "temperature"),  # Table 5
    "method": ("method", "temperature"),
}


def _pooled(rows: Sequence[dict]) -> dict:
    gen = sum(r["new_tokens"] - 1 for r in rows)
    dec = sum(r["decode_s"] for r in rows)
    known = [r for r in rows if r["target_forwards"] is not None]
    fwd = sum(r["target_forwards"] - 1 for r in known)
    out = {
        "prompts": len(rows),
        "tokens_per_s": gen / dec if dec > 0 else None,
        "tau": sum(r["new_tokens"] - 1 for r in known) / fwd if known and len(known) == len(rows) and fwd else None,
    }
    eq = [r["equal_to_lsjax_ar"] for r in rows if r.get("equal_to_lsjax_ar") is not None]
    out["equal_to_lsjax_ar"] = sum(eq) / len(eq) if eq else None
    for k in ("draft_ms", "verify_ms", "commit_ms"):
        vals = [r[k] for r in rows if r.get(k) is not None]
        out[k] = sum(vals) / len(vals) if vals else None
    for k in ("draft_state_bytes", "kv_cache_bytes"):  # peak over the group
        vals = [r[k] for r in rows if r.get(k) is not None]
        out[k] = max(vals) if vals else None
    steps = Counter(n for r in rows for n in r.get("step_tokens") or ())
    out["step_tokens_hist"] = {str(k): steps[k] for k in sorted(steps)} if steps else None
    return out


def aggregate(rows: Sequence[dict], keys: Sequence[str]) -> list[dict]:
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[tuple(r[k] for k in keys)].append(r)
    out = []
    for key, members in groups.items():
        agg = dict(zip(keys, key)) | _pooled(members)
        for base in BASELINES:
            # The baseline's rows over the very same prompts (and temperature) as this group.
            ids = {(r["prompt_id"], r["temperature"]) for r in members}
            base_rows = [r for r in rows if r["method"] == base and (r["prompt_id"], r["temperature"]) in ids]
            b = _pooled(base_rows)["tokens_per_s"] if len(base_rows) == len(ids) else None
            agg[f"speedup_vs_{base.replace('-', '_')}"] = agg["tokens_per_s"] / b if b and agg["tokens_per_s"] else None
        out.append(agg)
    return out


def aggregates(rows: Sequence[dict]) -> dict[str, list[dict]]:
    return {name: aggregate(rows, keys) for name, keys in GROUPINGS.items()}


# ----------------------------------------------------------------------------- results.md


def _fmt(v, spec: str = ".2f", suffix: str = "") -> str:
    if v is None:
        return "n/a"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    return f"{v:{spec}}{suffix}"


def _mib(v) -> str:
    return "n/a" if v is None else f"{v / 2**20:.2f}"


def ordered(values: Iterable, order: Sequence) -> list:
    vals = set(values)
    return [v for v in order if v in vals] + sorted(v for v in vals if v not in order)


def table1(aggs: dict, methods: Sequence[str], temperature: float) -> list[str]:
    """Method x task: tau, tok/s, speedup vs lsjax AR and vs HF AR (the paper's Table 1 layout)."""
    by = {(a["method"], a["task"]): a for a in aggs["task"] if a["temperature"] == temperature}
    tasks = ordered((t for _, t in by), ("summarization", "code", "dialogue"))
    head = "| method | " + " | ".join(f"{t}: tau | tok/s | x lsjax-ar | x hf-ar" for t in tasks) + " |"
    lines = [head, "|---|" + "---|---|---|---|" * len(tasks)]
    for m in methods:
        cells = []
        for t in tasks:
            a = by.get((m, t))
            if a is None:
                cells.append("| | |")
                continue
            cells.append(
                f"{_fmt(a['tau'])} | {_fmt(a['tokens_per_s'], '.1f')} | "
                f"{_fmt(a['speedup_vs_lsjax_ar'], '.2f', 'x')} | {_fmt(a['speedup_vs_hf_ar'], '.2f', 'x')}"
            )
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return lines


def table5(aggs: dict, methods: Sequence[str], buckets: Sequence[str], temperature: float) -> list[str]:
    """Prompt-length bucket x method: tok/s, tau, per-step draft / verify / commit ms, draft state size."""
    by = {(a["method"], a["bucket"]): a for a in aggs["bucket"] if a["temperature"] == temperature}
    lines = [
        "| bucket | method | tok/s | tau | x lsjax-ar | draft ms | verify ms | commit ms | draft state MiB | KV MiB |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for b in buckets:
        for m in methods:
            a = by.get((m, b))
            if a is None:
                continue
            lines.append(
                f"| {b} | {m} | {_fmt(a['tokens_per_s'], '.1f')} | {_fmt(a['tau'])} | "
                f"{_fmt(a['speedup_vs_lsjax_ar'], '.2f', 'x')} | {_fmt(a['draft_ms'], '.1f')} | "
                f"{_fmt(a['verify_ms'], '.1f')} | {_fmt(a['commit_ms'], '.1f')} | "
                f"{_mib(a['draft_state_bytes'])} | {_mib(a['kv_cache_bytes'])} |"
            )
    return lines


def markdown(result: dict) -> str:
    meta, aggs = result["meta"], result["aggregates"]
    methods, temps = meta["methods"], meta["temperatures"]
    buckets = ordered({r["bucket"] for r in result["rows"]}, meta["bucket_order"])
    m = meta["machine"]
    out = [
        f"# lsjax evaluation: suite `{meta['suite']}`",
        "",
        f"- date: {meta['date']}",
        f"- command: `{meta['command']}`",
        f"- machine: {m['cpu']}, {m['cores']} cores (load average {m['loadavg_start']} at start, "
        f"{m.get('loadavg_end', 'n/a')} at end), jax {m['jax']} ({m['backend']})",
        f"- prompts: {meta['num_prompts']}, {meta['max_new_tokens']} new tokens"
        f"{' (EOS ignored)' if meta['ignore_eos'] else ''}, temperatures {', '.join(map(str, temps))}",
        f"- LongSpec draft: {meta['draft']}; tree {meta['tree']}",
        f"- T=0 equality of lossless methods with lsjax-ar: **{'PASS' if result['passed'] else 'FAIL'}**",
        "",
        "tok/s counts decode only (prefill and compile excluded); speedups are against baselines measured in "
        "this run on the same prompts. tau = tokens per target forward; n/a where the method does not expose it.",
    ]
    for t in temps:
        out += ["", f"## Methods x task, T={t}", "", *table1(aggs, methods, t)]
    for t in temps:
        out += ["", f"## By prompt length, T={t}", "", *table5(aggs, methods, buckets, t)]
    eq = [a for a in aggs["method"] if a["equal_to_lsjax_ar"] is not None]
    if eq:
        out += ["", "## T=0 output equal to lsjax-ar (share of prompts)", "", "| method | equal | enforced |"]
        out += ["|---|---|---|"]
        out += [
            f"| {a['method']} | {a['equal_to_lsjax_ar']:.0%} | {'yes' if a['method'] in meta['lossless'] else 'no'} |"
            for a in eq
        ]
    if result["failures"]:
        out += ["", "## FAILURES", ""] + [f"- {f}" for f in result["failures"]]
    return "\n".join(out) + "\n"


# ----------------------------------------------------------------------------- figures


def _pyplot():
    # Agg: figures are written to files, on machines with no display; imported here so the tables alone
    # (`python -m lsjax.bench.tables`) never load matplotlib.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _bars(ax, groups: list[str], series: dict[str, list], ylabel: str) -> None:
    width = 0.8 / max(len(series), 1)
    x = np.arange(len(groups))
    for i, (name, vals) in enumerate(series.items()):
        ax.bar(x + i * width, [np.nan if v is None else v for v in vals], width, label=name)
    ax.set_xticks(x + width * (len(series) - 1) / 2, groups)
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)


def _legend(fig, ax) -> None:
    # One legend for the figure, above the panels, so it never covers a bar.
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=max(len(labels), 1), fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.93))


def table1_png(result: dict, path: Path) -> None:
    """Method x task: tau, tok/s, speedup vs lsjax AR; one row of panels per temperature."""
    plt = _pyplot()
    meta, rows = result["meta"], result["aggregates"]["task"]
    temps, methods = meta["temperatures"], meta["methods"]
    tasks = ordered({a["task"] for a in rows}, ("summarization", "code", "dialogue"))
    fig, axes = plt.subplots(len(temps), 3, figsize=(14, 3.6 * len(temps)), squeeze=False)
    for i, t in enumerate(temps):
        by = {(a["method"], a["task"]): a for a in rows if a["temperature"] == t}
        for j, (key, label) in enumerate(
            [("tau", "tau (tokens / forward)"), ("tokens_per_s", "decode tok/s"), ("speedup_vs_lsjax_ar", "x lsjax-ar")]
        ):
            series = {m: [by.get((m, k), {}).get(key) for k in tasks] for m in methods}
            _bars(axes[i, j], tasks, series, label)
            axes[i, j].set_title(f"{label}, T={t}")
    _legend(fig, axes[0, 0])
    fig.savefig(path, dpi=110)
    plt.close(fig)


def table5_png(result: dict, path: Path) -> None:
    """By prompt-length bucket: tok/s, tau, draft ms, verify ms (T = the first temperature run)."""
    plt = _pyplot()
    meta, rows = result["meta"], result["aggregates"]["bucket"]
    t = meta["temperatures"][0]
    buckets = ordered({a["bucket"] for a in rows}, meta["bucket_order"])
    by = {(a["method"], a["bucket"]): a for a in rows if a["temperature"] == t}
    fig, axes = plt.subplots(1, 4, figsize=(17, 3.8))
    for ax, (key, label) in zip(
        axes,
        [
            ("tokens_per_s", "decode tok/s"),
            ("tau", "tau"),
            ("draft_ms", "draft ms/step"),
            ("verify_ms", "verify ms/step"),
        ],
    ):
        methods = [m for m in meta["methods"] if any(by.get((m, b), {}).get(key) is not None for b in buckets)]
        _bars(ax, buckets, {m: [by.get((m, b), {}).get(key) for b in buckets] for m in methods}, label)
        ax.set_title(f"{label}, T={t}")
        ax.set_xlabel("prompt tokens")
    _legend(fig, axes[0])
    fig.savefig(path, dpi=110)
    plt.close(fig)


def latency_png(result: dict, path: Path) -> None:
    """Figure-5 style: one stacked bar (draft / verify / commit ms per step) per method, per bucket."""
    plt = _pyplot()
    meta, rows = result["meta"], result["aggregates"]["bucket"]
    t = meta["temperatures"][0]
    buckets = ordered({a["bucket"] for a in rows}, meta["bucket_order"])
    by = {(a["method"], a["bucket"]): a for a in rows if a["temperature"] == t and a["verify_ms"] is not None}
    methods = [m for m in meta["methods"] if any((m, b) in by for b in buckets)]
    fig, axes = plt.subplots(1, len(buckets), figsize=(4.5 * len(buckets), 3.8), squeeze=False, sharey=True)
    colors = {"draft_ms": "tab:blue", "verify_ms": "tab:orange", "commit_ms": "tab:green"}
    for ax, b in zip(axes[0], buckets):
        bottom = np.zeros(len(methods))
        for key, c in colors.items():
            vals = np.array([by[(m, b)][key] or 0.0 if (m, b) in by else 0.0 for m in methods])
            ax.bar(methods, vals, bottom=bottom, color=c, label=key.removesuffix("_ms"))
            bottom += vals
        ax.set_title(f"{b} prompt tokens, T={t}")
        ax.tick_params(axis="x", rotation=20)
        ax.grid(axis="y", alpha=0.3)
    axes[0, 0].set_ylabel("ms per step")
    axes[0, 0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def accepted_png(result: dict, path: Path) -> None:
    """Histogram of tokens emitted per target forward (accepted drafts + bonus) for the speculative methods."""
    plt = _pyplot()
    meta = result["meta"]
    hists: dict[tuple, Counter] = {}
    for r in result["rows"]:
        if r.get("step_tokens"):
            hists.setdefault((r["method"], r["temperature"]), Counter()).update(r["step_tokens"])
    keys = sorted(hists, key=lambda k: (meta["methods"].index(k[0]) if k[0] in meta["methods"] else 99, k[1]))
    fig, axes = plt.subplots(1, max(len(keys), 1), figsize=(4.2 * max(len(keys), 1), 3.4), squeeze=False)
    for ax, key in zip(axes[0], keys):
        h = hists[key]
        total = sum(h.values())
        xs = range(1, max(h) + 1)
        ax.bar(xs, [h[x] / total for x in xs])
        mean = sum(k * v for k, v in h.items()) / total
        ax.set_title(f"{key[0]}, T={key[1]} (mean {mean:.2f}, {total} steps)", fontsize=9)
        ax.set_xlabel("tokens per step")
        ax.set_xticks(list(xs))
    if not keys:
        axes[0, 0].text(0.5, 0.5, "no speculative method in this run", ha="center", va="center")
    axes[0, 0].set_ylabel("share of steps")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


FIGURES = {
    "table1.png": table1_png,
    "table5.png": table5_png,
    "latency.png": latency_png,
    "accepted.png": accepted_png,
}


def write_all(result: dict, out_dir: Path) -> list[Path]:
    paths = []
    for name, fn in FIGURES.items():
        fn(result, out_dir / name)
        paths.append(out_dir / name)
    return paths


# ----------------------------------------------------------------------------- tables for the docs


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
    return aggregates(rows) if rows else result.get("aggregates") or {}


def _methods(result: dict, aggs: dict) -> list[str]:
    seen = [a["method"] for a in aggs.get("method", [])]
    return ordered(seen, (result.get("meta") or {}).get("methods", ()))


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
        tasks = ordered({a["task"] for a in aggs.get("task", [])}, TASK_ORDER)
        for t in temps:
            out += ["", f"By task, T = {_temp(t)}:", "", *by_group(aggs, methods, t, "task", tasks)]
            out += _baseline_speed(aggs, t)
    if "bucket" in sections:
        order = meta.get("bucket_order", ())
        buckets = ordered({a["bucket"] for a in aggs.get("bucket", [])}, order)
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
