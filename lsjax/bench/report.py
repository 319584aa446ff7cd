"""Aggregates and the Markdown report of a harness run (rows are the per-prompt dicts `lsjax.bench.run` writes).

Aggregates pool tokens and seconds rather than averaging per-prompt rates: tok/s = sum(tokens after the
first) / sum(decode s), tau = sum(tokens after the first) / sum(decode forwards). Speedups divide a
method's pooled tok/s by the baseline's over the same prompts of the same run.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence

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
