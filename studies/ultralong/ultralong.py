"""Ultra-long generation (TokenSwift's Table 3 / Figure 3 shape): AR vs TokenSwift and its ablations while
the output grows, EOS ignored.

    python -m studies.ultralong.ultralong --lengths 1024 2048 4096 6000 --prompt-tokens 1536 --heads DIR
    python -m studies.ultralong.ultralong --lengths 1024 3000 --temperature 1 --min-p 0.1 --penalties 1.0 1.2
    python -m studies.ultralong.ultralong --model tiny --lengths 32 64 --prompt-tokens 48    # a dry run in seconds

Each method generates max(lengths) tokens once per (prompt, repeat); its decode loop is stepped from the
host every `--stream-every` steps, which stamps (tokens so far, seconds, steps) along the way, so one run
gives the time to reach every length. Methods run back to back in an order rotated every repeat (machine
noise hits them alike); speedups are AR time / method time at the same length, prompt and repeat, then the
median over prompts and repeats. Prompts: the opening of dev-split State of the Union speeches, raw text
(the paper continues PG-19 books with base models). At T = 0 every method must reproduce AR (same penalty)
token for token; a mismatch is recorded and makes the exit status 1.

Outputs in --out: results.json (curves, per-length aggregates, Distinct-n per method, machine), results.md
and speedup_vs_length.png / tau_vs_length.png (one panel per penalty value).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np

# name -> (registry method, build options); the TokenSwift options given on the command line apply to every
# tokenswift variant unless the variant fixes them.
VARIANTS: dict[str, tuple[str, dict]] = {
    "ar": ("ar", {}),
    "pld": ("pld", {}),
    "tokenswift": ("tokenswift", {}),  # the device's preset (lsjax.methods.tokenswift.drafter.TS_PRESETS)
    "tokenswift-no-ngram": ("tokenswift", {"ngram_topk": 0}),
    "tokenswift-partial": ("tokenswift", {"draft_pass": "partial"}),  # the paper's self-drafting pass
    "tokenswift-full-cache": ("tokenswift", {"draft_pass": "full"}),  # ... without the partial cache
    "tokenswift-verified": ("tokenswift", {"draft_pass": "verified"}),
    "tokenswift-paper": ("tokenswift", {"ts_preset": "paper"}),
}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="a .gguf file or HF directory (default SmolLM2-135M-Instruct); 'tiny': random")
    p.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 6000])
    p.add_argument("--prompt-tokens", type=int, default=1536)
    p.add_argument("--prompts", type=int, default=1, help="number of speeches")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument(
        "--split", choices=("dev", "heldout"), default="dev", help="speeches to prompt with: dev, or never tuned on"
    )
    p.add_argument(
        "--methods", nargs="+", default=["ar", "tokenswift", "tokenswift-no-ngram"], help=", ".join(VARIANTS)
    )
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=METHOD:key=value,...",
        help="an extra method for a sweep, e.g. v8=tokenswift:draft_pass=verified,ts_topk=1/1/1,ngram_n=8 "
        "(registry options; tuples with '/'); it runs when NAME is in --methods (added at the end otherwise)",
    )
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--penalties", type=float, nargs="+", default=[1.0], help="contextual penalty values to run")
    p.add_argument("--penalty-window", type=int, default=1024)
    p.add_argument("--heads", help="TokenSwift heads dir, or 'zero' (default: the shipped heads, else zero)")
    p.add_argument("--ts-preset", choices=("paper", "cpu"), help="TokenSwift preset (default: by device)")
    p.add_argument("--kv-budget", type=int)
    p.add_argument("--ngram-topk", type=int)
    p.add_argument("--ts-topk", help="candidates per logit set, e.g. 1,2,2,1")
    p.add_argument("--stream-every", type=int, default=32, help="decode steps between host stamps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, help="output directory (default bench_results/ultralong-<time>)")
    p.add_argument("--ngram-n", type=int, help="tokenswift: n-gram length (default 4 = gamma)")
    args = p.parse_args(argv)
    if min(args.lengths) < 2:
        p.error("--lengths must be >= 2")
    from lsjax.bench.methods import parse_variant

    args.variants = dict(VARIANTS)
    for spec in args.variant:
        try:
            args.variants.update([parse_variant(spec)])
        except ValueError as e:
            p.error(f"--variant {spec!r}: {e}")
        if spec.split("=", 1)[0] not in args.methods:
            args.methods.append(spec.split("=", 1)[0])
    unknown = [m for m in args.methods if m not in args.variants]
    if unknown:
        p.error(f"--methods: unknown {', '.join(unknown)} (known: {', '.join(args.variants)})")
    return args


# --------------------------------------------------------------------------------------------- prompts


def speech_prompts(
    tokenizer, n: int, num_tokens: int, seed: int = 0, split: str = "dev"
) -> list[tuple[str, list[int]]]:
    """The first `num_tokens` tokens of `n` speeches of `split` (dev | heldout) long enough to fill them (raw
    text, BOS)."""
    from lsjax import corpora

    docs = [d for d in corpora.load_sotu() if corpora.eval_split_of(d.id) == split and len(d.text) > 5 * num_tokens]
    rng = np.random.default_rng(seed)
    out = []
    for i in rng.permutation(len(docs))[:n]:
        ids = tokenizer.encode(docs[i].text)[:num_tokens]
        out.append((docs[i].id, ids))
    return out


def tiny_model():
    """(config, params) of a small random Llama for dry runs (no checkpoint, compiles in seconds)."""
    import jax

    from lsjax.config import ModelConfig
    from lsjax.models import target

    config = ModelConfig(
        vocab_size=257,
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        max_position=4096,
        rope_theta=10000.0,
        name="tiny",
    )
    return config, target.init_params(config, jax.random.key(0), scale=0.3)


# ----------------------------------------------------------------------------------------------- runs


@dataclasses.dataclass
class Curve:
    tokens: list[int]  # cumulative new tokens at each stamp (the first stamp: the prefill's token, 0 s)
    seconds: list[float]
    steps: list[int]

    def at(self, length: int) -> tuple[float, float]:
        """(seconds, decode steps) to reach `length` tokens, interpolated between stamps."""
        toks = np.asarray(self.tokens, float)
        return float(np.interp(length, toks, self.seconds)), float(np.interp(length, toks, self.steps))


def run_one(generator, ids: list[int], gen, seed: int, stream_every: int) -> tuple[list[int], Curve]:
    stamps: list[tuple[int, float]] = []
    t0 = [0.0]

    def on_tokens(new):
        now = time.perf_counter()
        if not stamps:
            t0[0] = now
        stamps.append((len(new) + (stamps[-1][0] if stamps else 0), now - t0[0]))

    r = generator.run(ids, gen, seed=seed, on_tokens=on_tokens, stream_every=stream_every)
    steps = [min(i * stream_every, r.target_forwards - 1) for i in range(len(stamps))]
    return r.tokens, Curve([s[0] for s in stamps], [s[1] for s in stamps], steps)


def distinct_n(tokens: list[int], n: int) -> float:
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return len(set(grams)) / max(len(grams), 1)


def build_methods(args, model, params) -> dict:
    from lsjax.engine.host import Generator
    from lsjax.methods import registry

    heads = args.heads  # None: the shipped heads, else zero heads
    topk = tuple(int(k) for k in args.ts_topk.split(",")) if args.ts_topk else None
    out = {}
    for name in args.methods:
        method, fixed = args.variants[name]
        opts = {"draft": heads, "kv_budget": args.kv_budget, "ngram_topk": args.ngram_topk, "ngram_n": args.ngram_n}
        opts |= {"ts_topk": topk, "ts_preset": args.ts_preset}
        drafter, dp = registry.build(method, model, **{**opts, **fixed})
        out[name] = Generator(model.config, params, drafter, dp)
    return out


def run(argv=None) -> dict:
    import jax
    import jax.numpy as jnp

    from lsjax.bench.run import machine_info
    from lsjax.config import GenerateConfig, SamplingConfig
    from lsjax.models import target

    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    out_dir = args.out or Path("bench_results") / f"ultralong-{time.strftime('%Y%m%d-%H%M%S')}"
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.model == "tiny":
        config, params = tiny_model()
        model = type("Tiny", (), {"config": config, "params": params, "path": Path("tiny"), "tokenizer": None})
        rng = np.random.default_rng(args.seed)
        prompts = [
            (f"random/{i}", rng.integers(3, config.vocab_size, args.prompt_tokens).tolist())
            for i in range(args.prompts)
        ]
    else:
        from lsjax.loading import load_model

        model = load_model(args.model)
        prompts = speech_prompts(model.tokenizer, args.prompts, args.prompt_tokens, args.seed, args.split)
    params = jax.tree.map(jnp.asarray, target.prepare_for_decode(model.params, model.config))
    methods = build_methods(args, model, params)
    L = max(args.lengths)
    rows, mismatches = [], []
    for penalty in args.penalties:
        sampling = SamplingConfig(
            temperature=args.temperature, min_p=args.min_p, penalty=penalty, penalty_window=args.penalty_window
        )
        gen = GenerateConfig(max_new_tokens=L, sampling=sampling, ignore_eos=True)
        for pid, ids in prompts:
            for rep in range(args.repeats):
                names = list(methods)
                names = names[rep % len(names) :] + names[: rep % len(names)]
                outputs = {}
                for name in names:
                    toks, curve = run_one(methods[name], ids, gen, args.seed + rep, args.stream_every)
                    outputs[name] = toks
                    rows.append(
                        dict(
                            penalty=penalty,
                            prompt=pid,
                            repeat=rep,
                            method=name,
                            curve=dataclasses.asdict(curve),
                            tokens=toks,
                        )
                    )
                    print(
                        f"[ultralong] penalty {penalty} {pid} rep {rep} {name}: {len(toks)} tokens in "
                        f"{curve.seconds[-1]:.1f}s ({curve.steps[-1]} steps)",
                        file=sys.stderr,
                    )
                if args.temperature == 0 and "ar" in outputs:
                    for name, toks in outputs.items():
                        if toks != outputs["ar"]:
                            mismatches.append(f"{name} differs from ar on {pid} (penalty {penalty}, repeat {rep})")
    result = {
        "meta": {
            "argv": list(sys.argv[1:] if argv is None else argv),
            "machine": machine_info(),
            **{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "prompt_ids": [p for p, _ in prompts],
            "model": str(model.path),
        },
        "aggregates": aggregate(rows, args.lengths),
        "mismatches": mismatches,
        "rows": rows,
    }
    (out_dir / "results.json").write_text(json.dumps(result))
    (out_dir / "results.md").write_text(markdown(result))
    plot(result, out_dir)
    print(markdown(result))
    return result


# -------------------------------------------------------------------------------------------- results


def aggregate(rows: list[dict], lengths: list[int]) -> list[dict]:
    """Per (penalty, method, length): median seconds, tokens/s, speedup vs AR (paired by prompt and repeat),
    tau (tokens per decode step) and Distinct-1..4 of the first `length` tokens (mean over runs)."""
    out = []
    ar = {(r["penalty"], r["prompt"], r["repeat"]): Curve(**r["curve"]) for r in rows if r["method"] == "ar"}
    for penalty in sorted({r["penalty"] for r in rows}):
        for method in dict.fromkeys(r["method"] for r in rows if r["penalty"] == penalty):
            runs = [r for r in rows if r["penalty"] == penalty and r["method"] == method]
            for length in sorted(lengths):
                secs, taus, speedups, distinct = [], [], [], []
                for r in runs:
                    s, steps = Curve(**r["curve"]).at(length)
                    secs.append(s)
                    taus.append((length - 1) / max(steps, 1e-9))
                    base = ar.get((penalty, r["prompt"], r["repeat"]))
                    if base is not None:
                        speedups.append(base.at(length)[0] / s)
                    distinct.append([distinct_n(r["tokens"][:length], n) for n in (1, 2, 3, 4)])
                out.append(
                    {
                        "penalty": penalty,
                        "method": method,
                        "length": length,
                        "seconds": float(np.median(secs)),
                        "tokens_per_s": float(np.median([(length - 1) / max(s, 1e-9) for s in secs])),
                        "tau": float(np.median(taus)),
                        "speedup_vs_ar": float(np.median(speedups)) if speedups else None,
                        "distinct": [round(float(x), 4) for x in np.mean(distinct, axis=0)],
                        "runs": len(runs),
                    }
                )
    return out


def markdown(result: dict) -> str:
    lines = [
        "| penalty | method | length | s | tok/s | tau | x AR | Distinct-1/2/3/4 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for a in result["aggregates"]:
        sp = "" if a["speedup_vs_ar"] is None else f"{a['speedup_vs_ar']:.2f}"
        d = "/".join(f"{x:.2f}" for x in a["distinct"])
        lines.append(
            f"| {a['penalty']} | {a['method']} | {a['length']} | {a['seconds']:.1f} | {a['tokens_per_s']:.1f} | "
            f"{a['tau']:.2f} | {sp} | {d} |"
        )
    if result["mismatches"]:
        lines += ["", "**T=0 mismatches:** " + "; ".join(result["mismatches"])]
    return "\n".join(lines) + "\n"


def plot(result: dict, out_dir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    aggs = result["aggregates"]
    penalties = sorted({a["penalty"] for a in aggs})
    for key, label, fname in (
        ("speedup_vs_ar", "speedup vs AR", "speedup_vs_length.png"),
        ("tau", "tau", "tau_vs_length.png"),
    ):
        fig, axes = plt.subplots(1, len(penalties), figsize=(5.5 * len(penalties), 3.8), squeeze=False)
        for ax, penalty in zip(axes[0], penalties):
            for method in dict.fromkeys(a["method"] for a in aggs if a["penalty"] == penalty):
                pts = [(a["length"], a[key]) for a in aggs if a["penalty"] == penalty and a["method"] == method]
                if all(v is not None for _, v in pts):
                    ax.plot(*zip(*pts), "o-", label=method)
            ax.set_xlabel("generated tokens")
            ax.set_ylabel(label)
            ax.set_title(f"penalty {penalty}, T={result['meta']['temperature']}")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out_dir / fname, dpi=110)
        plt.close(fig)


def main(argv=None) -> int:
    result = run(argv)
    return 1 if result["mismatches"] else 0


if __name__ == "__main__":
    sys.exit(main())
