"""Methods vs AR with repeats: each round runs every method once per prompt, back to back, and each method's
speed is divided by AR's from the same round (so machine noise between rounds cancels).

    python -m lsjax.bench.repeat --suite dev --per-cell 1 --max-new-tokens 64 --repeats 2 --temperatures 0 1

Each round prefills the prompt once and starts every method from a copy of that cache (`engine.begin`):
prefill is the same target computation for every method and is not what is compared, and on a long prompt it
would take most of the run. Only the decode loop is timed: wall time (tok/s, the speedup) and this process's
CPU time (a check that moves less when other jobs share the machine). Compiles and auto's cost profile happen
in an unrecorded warm-up round per prompt bucket and temperature.

Prints per prompt and temperature the median (min-max) speedup over AR of every method, then per temperature
each method's mean speedup, auto's share of the best fixed method's mean and its worst prompt (every row,
with auto's choices, goes to --out; `--report FILE...` prints that summary again from saved rows, decoding
nothing: the tables in docs/ are made with it). Prompts come from a suite (`lsjax.prompts.load_suite`: dev, or
heldout, which nothing is tuned on) or a JSONL file (--prompts).

What a method adds to the target, the shape of Speculative Streaming's Table 3: extra parameters, and
floating-point work per step and per token (`--flops` after a run, with its tau; `--flops-only` alone):

    python -m lsjax.bench.repeat --flops-only --methods pld longspec streams tokenswift dels

FLOPs are XLA's own count (`cost_analysis`) of one whole decode step (draft, verification, commit, the
drafter's update) lowered for batch 1 at a 1024-slot cache. At that capacity every loop over the cache's
key blocks runs once (`lsjax.attention` reads 1024-key blocks), so the count is exact for a 1K context:
a loop XLA cannot unroll is counted once, and at longer contexts it would undercount the attention. Per
token divides by the tokens a step emits (tau); nothing runs for the count: the step is lowered from
abstract shapes.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import time

import numpy as np


def main(argv=None) -> int:
    from lsjax.prompts import BUCKETS, TASKS

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--methods", nargs="+", default=["auto", "pld", "longspec", "hybrid"])
    p.add_argument("--suite", choices=("dev", "heldout"), default="dev")
    p.add_argument("--prompts", help='a JSONL file of {"id", "prompt"[, "chat"]} instead of a suite')
    p.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS))
    p.add_argument("--buckets", nargs="+", choices=list(BUCKETS), default=list(BUCKETS))
    p.add_argument("--per-cell", type=int, default=1)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    p.add_argument(
        "--cost-profile", choices=("cached", "measure", "prior"), default="measure", help="auto's (see decode.py)"
    )
    p.add_argument("--out", help="write every measurement here (JSON)")
    p.add_argument(
        "--report",
        nargs="+",
        metavar="FILE",
        help="decode nothing: print the summary of runs written by --out (several files: their rows together)",
    )
    p.add_argument(
        "--flops",
        action="store_true",
        help="also print each method's extra parameters and FLOPs per step and per token",
    )
    p.add_argument(
        "--flops-only",
        action="store_true",
        help="decode nothing: print each method's extra parameters and FLOPs per step",
    )
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=METHOD:key=value,...",
        help="also run a registry method with build options, e.g. auto-free=auto:budget=1,initial_slack=1e6",
    )
    args = p.parse_args(argv)
    if args.report:
        return report_files(args.report, p)
    if args.flops_only:
        return flops_only(args.methods)
    if args.out:  # before the run, not after it: a run takes most of an hour
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    from lsjax.bench.methods import parse_variant

    variants = {}
    for spec in args.variant:
        try:
            name, built_as = parse_variant(spec)
        except ValueError as e:
            p.error(f"--variant {spec!r}: {e}")
        variants[name] = built_as

    import jax
    import jax.numpy as jnp

    from lsjax import engine
    from lsjax.config import GenerateConfig, SamplingConfig
    from lsjax.engine.host import check_prompt
    from lsjax.loading import load_model
    from lsjax.methods import registry
    from lsjax.methods.auto.profile import profile_costs
    from lsjax.models import target
    from lsjax.prompts import encode, load_suite

    model = load_model()
    config = model.config
    params = jax.tree.map(jnp.asarray, target.prepare_for_decode(model.params, config))
    prompts = load_suite(model.tokenizer, args.suite, args.prompts, args.per_cell, args.tasks, args.buckets)
    methods = ["ar", *[m for m in args.methods if m != "ar"], *variants]
    cache: dict = {}
    specs = {m: variants.get(m, (m, {})) for m in methods}  # name -> (registry method, build options)
    built = {m: registry.build(method, model, cache=cache, **opts) for m, (method, opts) in specs.items()}
    drafters = {m: d for m, (d, _) in built.items()}
    base_params = {m: jax.tree.map(jnp.asarray, dp) if dp is not None else () for m, (_, dp) in built.items()}
    begin = jax.jit(engine.begin, static_argnames=("config",))
    auto_costs: dict = {}  # (method, bucket, T) -> that auto's measured costs (variants differ in candidates)
    warmed: set = set()

    def run(spec, state, draft_params):
        """Decode to the end; returns (state, wall s, cpu s)."""
        jax.block_until_ready(state)
        t, c = time.perf_counter(), time.process_time()
        state = engine.decode(params, draft_params, spec, state, jnp.int32(spec.gen.max_new_tokens))
        jax.block_until_ready(state)
        return state, time.perf_counter() - t, time.process_time() - c

    rows = []
    for prompt in prompts:
        ids = encode(model.tokenizer, prompt)
        P, bucket = len(ids), engine.prompt_bucket(len(ids))
        tokens = jnp.asarray(np.pad(np.asarray(ids, np.int32), (0, bucket - P))[None])
        lengths = jnp.asarray([P], jnp.int32)
        for t in args.temperatures:
            max_new = check_prompt(config, ids, args.max_new_tokens)
            gen = GenerateConfig(max_new, SamplingConfig(temperature=t), ignore_eos=True)
            capacity = max(engine.required_capacity(bucket, gen, d) for d in drafters.values())
            warm = (bucket, t) not in warmed
            warmed.add((bucket, t))
            for r in range(-1 if warm else 0, args.repeats):  # round -1: compile and profile, not recorded
                logits, kv = engine.prefill_jit(params, config, tokens, lengths, capacity)
                key = jax.random.key(max(r, 0))
                outs = {}
                for m in methods:
                    spec = engine.SpecConfig(config, gen, drafters[m])
                    begun = (params, base_params[m], spec, tokens, lengths, key)
                    dp = base_params[m]
                    if isinstance(dp, dict) and "costs" in dp:  # auto: this bucket's cost profile, measured once
                        if (m, bucket, t) not in auto_costs:
                            decode = functools.partial(_decode, spec)
                            state = _begin(begin, begun, kv, logits)
                            found = profile_costs(
                                drafters[m],
                                config.name,
                                "auto",
                                params,
                                dp,
                                gen,
                                bucket,
                                state,
                                decode,
                                args.cost_profile,
                                config.signature(),
                            )
                            auto_costs[(m, bucket, t)] = jnp.asarray(found, jnp.float32)
                        dp = {**dp, "costs": auto_costs[(m, bucket, t)]}
                    outs[m] = run(spec, _begin(begin, begun, kv, logits), dp)
                if r < 0:
                    continue
                ar_state, ar_s, ar_cpu = outs["ar"]
                ar_tokens = np.asarray(ar_state.out[0, : int(ar_state.num_out[0])]).tolist()
                for m, (state, wall, cpu) in outs.items():
                    n = int(state.num_out[0])
                    out = np.asarray(state.out[0, :n]).tolist()
                    summary = getattr(drafters[m], "summary", None)
                    rows.append(
                        {
                            "prompt": prompt.id,
                            "tokens": P,
                            "T": t,
                            "round": r,
                            "method": m,
                            "tok_s": (n - 1) / wall,
                            "speedup": ar_s / wall,
                            "cpu_speedup": ar_cpu / cpu,
                            "tau": (n - 1) / max(int(state.steps), 1),
                            "equal_to_ar": out == ar_tokens if t == 0 else None,
                            "stats": summary(state.draft) if summary else None,
                        }
                    )
                    print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"command": portable_command(sys.argv[1:]), "rows": rows}, f, indent=1)
    report(rows, methods, args.temperatures)
    if args.flops:
        costs = method_costs(model, params, specs, cache=cache)
        for t in args.temperatures:
            taus = {m: float(np.mean([r["tau"] for r in rows if r["T"] == t and r["method"] == m])) for m in methods}
            print(f"\nT={t:g}, extra work per emitted token (mean tau of this run):")
            print(flops_table(costs, taus, config.num_params()))
    return 0


def _begin(begin, begun: tuple, kv, logits):
    """A method's decode state from its own copy of the round's prefilled cache (decode donates it)."""
    import jax
    import jax.numpy as jnp

    return begin(*begun, jax.tree.map(jnp.copy, kv), logits)


def _decode(spec, params, draft_params, state, step_limit):
    from lsjax import engine

    return engine.decode(params, draft_params, spec, state, step_limit)


def portable_command(args: list[str]) -> list[str]:
    """The command as a user would type it, with no path of this machine: the module, not the script's path,
    and the --out file by its name (saved rows go into docs/, which holds no machine paths)."""
    out = ["python", "-m", "lsjax.bench.repeat"]
    for prev, arg in zip([None, *args], args):
        out.append(os.path.basename(arg) if prev == "--out" else arg)
    return out


def report_files(paths: list[str], parser) -> int:
    """`--report`: the summary of saved runs, as the run printed it (the tables in docs/ are made with this)."""
    rows, commands = [], []
    for path in paths:
        try:
            with open(path) as f:
                saved = json.load(f)
            got = saved["rows"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            parser.error(f"--report {path}: not a file written by --out ({type(e).__name__}: {e})")
        rows += got
        commands.append(" ".join(saved.get("command", [])))
    if not rows:
        parser.error(f"--report: no rows in {' '.join(paths)}")
    methods = list(dict.fromkeys(["ar", *(r["method"] for r in rows)]))
    for c in commands:
        print(f"run: {c}")
    report(rows, methods, sorted({r["T"] for r in rows}))
    return 0


def report(rows: list[dict], methods: list[str], temperatures) -> None:
    print(f"| prompt | T | {' | '.join(methods[1:])} |")
    print("|---|---|" + "---|" * (len(methods) - 1))
    for pid, t in dict.fromkeys((r["prompt"], r["T"]) for r in rows):
        cells = []
        for m in methods[1:]:
            got = [r for r in rows if r["prompt"] == pid and r["T"] == t and r["method"] == m]
            if not got:
                cells.append("-")
                continue
            s = [r["speedup"] for r in got]
            cells.append(f"{np.median(s):.2f}x ({min(s):.2f}-{max(s):.2f}), tau {np.mean([r['tau'] for r in got]):.2f}")
        print(f"| {pid} | {t:g} | {' | '.join(cells)} |")
    for t in temperatures:
        print(f"\nT={t:g}: | method | mean tau | mean tok/s | mean x AR |")
        for m in methods:
            got = [r for r in rows if r["T"] == t and r["method"] == m]
            tau, tok_s, x = (np.mean([r[k] for r in got]) for k in ("tau", "tok_s", "speedup"))
            print(f"| {m} | {tau:.2f} | {tok_s:.1f} | {x:.2f}x |")
        for key, label in (("speedup", "wall"), ("cpu_speedup", "cpu")):
            means = {m: np.mean([r[key] for r in rows if r["T"] == t and r["method"] == m]) for m in methods[1:]}
            print(f"mean speedup ({label}) T={t:g}: " + ", ".join(f"{m} {v:.3f}x" for m, v in means.items()))
            fixed = {m: v for m, v in means.items() if not m.startswith("auto")}  # auto's variants are not fixed
            for a in (m for m in means if m.startswith("auto") and fixed):
                best = max(fixed, key=fixed.get)
                auto_rows = [r for r in rows if r["T"] == t and r["method"] == a]
                per_prompt = {
                    pid: np.median([r[key] for r in auto_rows if r["prompt"] == pid])
                    for pid in dict.fromkeys(r["prompt"] for r in auto_rows)
                }
                worst = min(per_prompt, key=per_prompt.get)
                print(
                    f"  {a} = {means[a] / fixed[best]:.1%} of the best fixed method ({best}); "
                    f"worst prompt {worst} {per_prompt[worst]:.2f}x"
                )
    unequal = {(r["prompt"], r["method"]) for r in rows if r["equal_to_ar"] is False}
    if unequal:
        print(f"T=0 outputs different from AR: {sorted(unequal)}")


# ----------------------------------------------------------------------------- FLOPs (--flops)

CONTEXT = 1024  # cache slots; one attention block (see the module doc)
PROMPT = 512


def extra_params(draft_params) -> int:
    """Trained numbers a method adds to the target (its draft params; a cost profile or a lookup table is not
    counted: `auto` carries a float per candidate, PLD nothing)."""
    import jax

    leaves = jax.tree.leaves(
        draft_params.get("draft", draft_params) if isinstance(draft_params, dict) else draft_params
    )
    return sum(math.prod(getattr(x, "shape", ())) for x in leaves if getattr(x, "ndim", 0) >= 1)


def step_flops(params, draft_params, config, drafter, max_new_tokens: int = 64, temperature: float = 0.0) -> float:
    """XLA's FLOP count for one decode step at a 1K context (batch 1)."""
    import jax
    import jax.numpy as jnp

    from lsjax import engine
    from lsjax.config import GenerateConfig, SamplingConfig

    gen = GenerateConfig(max_new_tokens, SamplingConfig(temperature=temperature), ignore_eos=True)
    tokens = jax.ShapeDtypeStruct((1, PROMPT), jnp.int32)
    lengths = jax.ShapeDtypeStruct((1,), jnp.int32)
    key = jax.eval_shape(lambda: jax.random.key(0))
    start = functools.partial(engine.start, config=engine.SpecConfig(config, gen, drafter, capacity=CONTEXT))
    state = jax.eval_shape(start, params, draft_params, tokens=tokens, lengths=lengths, key=key)

    def one(tp, dp, s):
        ctx = engine.context(tp, dp, config, gen, CONTEXT)
        return engine.spec_step(ctx, drafter, gen, s)

    cost = jax.jit(one).lower(params, draft_params, state).cost_analysis()
    if isinstance(cost, (list, tuple)):  # older jax: one dict per computation
        cost = cost[0]
    return float(cost["flops"])


def method_costs(model, params, methods, cache: dict | None = None) -> dict[str, dict]:
    """{label: {"params", "step_flops"}} for AR (the reference) and `methods`: registry names, or a dict
    label -> (registry method, build options) for variants."""
    from lsjax.methods import registry

    specs = methods if isinstance(methods, dict) else {m: (m, {}) for m in methods}
    specs = {"ar": ("ar", {}), **specs}
    out = {}
    for label, (name, opts) in specs.items():
        drafter, dp = registry.build(name, model, cache=cache if cache is not None else {}, **opts)
        dp = dp if dp is not None else ()
        out[label] = {"params": extra_params(dp), "step_flops": step_flops(params, dp, model.config, drafter)}
    return out


def flops_table(costs: dict[str, dict], taus: dict[str, float], target_params: int) -> str:
    """Markdown: extra params, GFLOP per step, FLOPs per emitted token relative to AR (needs each method's tau)."""
    ar = costs["ar"]["step_flops"]
    lines = [
        "| method | extra params | % of target | GFLOP per step (1K) | x AR step | tau | FLOPs per token x AR |",
        "|---|---|---|---|---|---|---|",
    ]
    for m, c in costs.items():
        tau = taus.get(m, 1.0 if m == "ar" else None)
        per_token = "n/a" if tau is None else f"{c['step_flops'] / tau / ar:.2f}x"
        lines.append(
            f"| {m} | {c['params']:,} | {100 * c['params'] / target_params:.2f}% | {c['step_flops'] / 1e9:.3f} | "
            f"{c['step_flops'] / ar:.2f}x | {'n/a' if tau is None else f'{tau:.2f}'} | {per_token} |"
        )
    return "\n".join(lines)


def flops_only(methods: list[str]) -> int:
    """`--flops-only`: the table of extra parameters and FLOPs per step, without decoding."""
    import jax
    import jax.numpy as jnp

    from lsjax.loading import load_model
    from lsjax.models import target

    model = load_model()
    params = jax.tree.map(jnp.asarray, target.prepare_for_decode(model.params, model.config))
    print(flops_table(method_costs(model, params, methods), {}, model.config.num_params()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
