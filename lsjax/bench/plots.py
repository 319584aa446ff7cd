"""PNG figures of a harness run (matplotlib, Agg): the paper's Table 1 / Table 5 / Figure 5 views and a
histogram of accepted lengths. Every function takes the run's result dict and writes one file."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)
import numpy as np  # noqa: E402

from lsjax.bench.report import ordered  # noqa: E402


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
