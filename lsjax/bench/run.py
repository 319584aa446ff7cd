"""The evaluation harness: every method on the same prompts, in one run, with tables and plots.

    python -m lsjax.bench.run --suite quick                       # CI: 4 short prompts, lsjax methods, seconds
    python -m lsjax.bench.run --suite dev --per-cell 1 --max-new-tokens 64
    python -m lsjax.bench.run --prompts mine.jsonl --methods lsjax-ar lsjax-pld --temperatures 0

Per prompt and temperature the methods run back to back (so machine noise hits all of them alike) with
the same seed and max tokens. At T=0 every lossless method's output must equal lsjax-ar's: a mismatch is
reported as it happens and makes the run exit with status 1 (after the results are written), naming the
prompt. Outputs in --out: results.json (per-prompt rows + aggregates + machine/command), results.md and
PNGs (table1, table5, latency, accepted).

    python -m lsjax.bench.run --suite dev --per-cell 1 --write-prompts DIR   # the prompts as files, no run

writes each prompt of the suite as `DIR/<task>-<bucket>-<i>.txt` for `decode.py --prompt-file` and
`lsjax.bench.launch` (chat prompts already rendered: pass no `--chat`).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import shlex
import sys
import zlib
from collections.abc import Callable
from pathlib import Path


def _lsjax(name: str, method, draft_sampling: str | None = None, options: dict | None = None):
    """The bench method for registry entry `method`: its drafter on the shared device params, built with the
    registry's defaults updated by `options` (a `--variant`)."""

    def factory(ctx):
        from lsjax.bench.methods import LsjaxMethod
        from lsjax.engine.host import Generator
        from lsjax.methods import registry
        from lsjax.methods.longspec.config import LongSpecOptions

        # --draft names a LongSpec draft: for the methods whose `draft` option is one (their options are
        # LongSpec's); a method with weights of its own kind finds its own.
        own = {"draft": ctx["draft"]} if issubclass(method.options_class, LongSpecOptions) else {}
        opts = {**own, "tree": ctx["tree"], **(options or {})}
        drafter, draft_params = registry.build(method.name, ctx["model"], cache=ctx["drafts"], **opts)
        gen = Generator(ctx["model"].config, ctx["params"], drafter, draft_params)
        return LsjaxMethod(name, gen, method.speculative, draft_sampling=draft_sampling)

    return factory


def _hf(name: str, lookup: int):
    def factory(ctx):
        from lsjax.bench.methods import HFMethod

        return HFMethod(name, ctx["hf"](), lookup)

    return factory


# name -> factory(ctx) -> Method, besides the lsjax methods (one per drafter registry entry, "lsjax-<name>").
# Tests add fakes here.
METHODS: dict[str, Callable] = {
    "hf-ar": _hf("hf-ar", 0),
    "hf-pld": _hf("hf-pld", 10),
}
# One factory per registry entry, kept while the entry stays registered: the method cache keys on it.
_FACTORIES: dict[str, tuple] = {}


def available_methods() -> dict[str, Callable]:
    """Every method the harness can run: the drafter registry's (in its order), then METHODS. Read at call time,
    so a drafter registered after this module was imported is offered too."""
    from lsjax.methods import registry

    out, variants = {}, {}
    for n in registry.names():
        entry, key = registry.get(n), f"lsjax-{n}"
        if key not in _FACTORIES or _FACTORIES[key][0] is not entry:
            _FACTORIES[key] = (entry, _lsjax(key, entry))
        out[key] = _FACTORIES[key][1]
        if entry.uses_draft:  # the same draft with its deterministic tree at T > 0 (sample-and-match)
            gkey = f"{key}:greedy-draft"
            if gkey not in _FACTORIES or _FACTORIES[gkey][0] is not entry:
                _FACTORIES[gkey] = (entry, _lsjax(gkey, entry, "greedy"))
            variants[gkey] = _FACTORIES[gkey][1]
    return {**out, **variants, **METHODS}


def _uses_draft(name: str) -> bool:
    from lsjax.methods import registry

    return name.startswith("lsjax-") and name[6:] in registry.names() and registry.get(name[6:]).uses_draft


SUITE_DEFAULTS = {  # max new tokens, methods (None: all), profiled temperatures (None: all)
    "dev": (128, None, None),
    "heldout": (128, None, None),  # dev's never-trained, never-tuned half: report beside dev
    # Quick profiles the step split at T=0 only: each profiled temperature compiles three more programs.
    "quick": (16, ["lsjax-ar", "lsjax-longspec", "lsjax-pld"], (0.0,)),
}


class EqualityError(RuntimeError):
    pass


def parse_args(argv):
    from lsjax.prompts import BUCKETS, SUITES, TASKS

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", choices=SUITES, default="quick")
    p.add_argument("--prompts", help='a JSONL file of {"id", "prompt"[, "chat": true]} instead of the suite prompts')
    p.add_argument(
        "--methods", nargs="+", choices=list(available_methods()), help="default: all (quick: the lsjax ones)"
    )
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=METHOD:key=value,...",
        help="one more lsjax method: a registry method with build options, e.g. dels-markov=dels:local_head=markov",
    )
    p.add_argument("--no-hf", action="store_true", help="drop the HF transformers peers")
    p.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    p.add_argument("--max-new-tokens", type=int, help="default 128 (dev), 16 (quick)")
    p.add_argument("--stop-at-eos", action="store_true", help="stop at EOS (default: ignore it, equal lengths)")
    p.add_argument("--per-cell", type=int, help="prompts per (task, bucket) (dev, default 2) or per task (quick, 2)")
    p.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS), help="dev suite tasks")
    p.add_argument("--buckets", nargs="+", choices=list(BUCKETS), default=list(BUCKETS), help="dev suite buckets")
    p.add_argument("--limit", type=int, help="keep only the first N prompts")
    p.add_argument("--seed", type=int, default=0, help="prompt selection and sampling seed")
    p.add_argument("--draft", help="LongSpec draft dir or 'random' (default: the shipped draft, else random)")
    p.add_argument(
        "--draft-b",
        help="a second LongSpec draft dir: every draft-based method also runs on it as '<method>@b', same prompts",
    )
    p.add_argument("--tree", help="LongSpec tree preset or widths (default: the draft's own, else the CPU preset)")
    p.add_argument("--split-steps", type=int, default=8, help="steps profiled for the draft/verify/commit split")
    p.add_argument("--hf-threads", type=int, default=2)
    p.add_argument("--out", type=Path, help="output directory (default bench_results/<suite>-<time>)")
    p.add_argument("--write-prompts", type=Path, metavar="DIR", help="write the prompts as text files, run nothing")
    args = p.parse_args(argv)
    if args.max_new_tokens is not None and args.max_new_tokens < 2:
        p.error("--max-new-tokens must be >= 2 (the first token comes from prefill)")
    from lsjax.bench.methods import parse_variant
    from lsjax.methods import registry

    args.variants = {}
    for spec in args.variant:
        try:
            name, (method, options) = parse_variant(spec)
        except ValueError as e:
            p.error(f"--variant {spec!r}: {e}")
        if method not in registry.names():
            p.error(f"--variant {spec!r}: unknown method {method!r} (known: {', '.join(registry.names())})")
        known = registry.get(method).options()
        if unknown := sorted(set(options) - known):
            known_list = ", ".join(sorted(known))
            p.error(f"--variant {spec!r}: {method} has no option {', '.join(unknown)} (its options: {known_list})")
        try:
            registry.get(method).make_options(**options)
        except ValueError as e:
            p.error(f"--variant {spec!r}: {e}")
        args.variants[name] = (method, options)
    return args


def source_commit() -> str | None:
    """The lsjax commit the run measured (`+dirty` with uncommitted changes), None outside a git checkout."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True)
    except OSError:
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def machine_info() -> dict:
    import jax

    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    info = {
        "cpu": cpu,
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "loadavg_start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "backend": jax.default_backend(),
    }
    for mod in ("torch", "transformers"):
        if mod in sys.modules:
            info[mod] = sys.modules[mod].__version__
    return info


def prompt_seed(seed: int, prompt_id: str) -> int:
    # Stable across processes (unlike hash()), so a prompt samples the same way in every run.
    return zlib.crc32(f"{seed}/{prompt_id}".encode()) & 0x7FFFFFFF


def first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


# In-process reuse across runs (the tests run the harness several times): the model, the shared context
# and the methods with their compiled programs. A CLI run fills it once.
_SHARED: dict = {}


def _shared(key, make):
    if key not in _SHARED:
        _SHARED[key] = make()
    return _SHARED[key]


def _context(model, args):
    """Lazy shared resources: device params once for every lsjax method, the HF model only if asked for."""
    import functools

    import jax
    import jax.numpy as jnp

    from lsjax.bench.methods import load_hf
    from lsjax.methods.longspec.checkpoint import default_draft_path

    draft = args.draft
    if draft is None:
        shipped = default_draft_path(model.path)
        draft = str(shipped) if shipped else "random"
    params = jax.tree.map(jnp.asarray, model.params)
    # "drafts" caches loaded drafts, so methods built on one draft (longspec, hybrid) load it once.
    ctx = {"model": model, "params": params, "draft": draft, "tree": args.tree, "drafts": {}}
    ctx["hf"] = functools.cache(lambda: load_hf(model, args.hf_threads))
    return ctx


def run(argv=None) -> dict:
    """Runs the harness; returns the result dict (also written to disk). Raises EqualityError at the end
    when a lossless method's T=0 output differs from lsjax-ar's."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.write_prompts:
        return write_prompts(args)

    from tqdm import tqdm

    from lsjax.bench import tables
    from lsjax.config import GenerateConfig, SamplingConfig
    from lsjax.loading import load_model
    from lsjax.prompts import BUCKETS, encode, load_suite

    suite = "file" if args.prompts else args.suite
    default_new, default_methods, split_temps = SUITE_DEFAULTS[args.suite]
    max_new = args.max_new_tokens or default_new
    variants = getattr(args, "variants", {})
    names = [*(args.methods or default_methods or list(available_methods())), *variants]
    if args.no_hf:
        names = [n for n in names if not n.startswith("hf-")]
    # lsjax-ar is the reference for equality and the first baseline: always run it, first.
    names = ["lsjax-ar", *[n for n in dict.fromkeys(names) if n != "lsjax-ar"]]
    temps = sorted(set(args.temperatures))
    started = datetime.datetime.now(datetime.UTC)
    out_dir = args.out or Path("bench_results") / f"{suite}-{started:%Y%m%d-%H%M%S}"
    out_dir.mkdir(parents=True, exist_ok=True)

    machine = machine_info()
    model = _shared("model", load_model)
    tok = model.tokenizer
    prompts = load_suite(tok, args.suite, args.prompts, args.per_cell, args.tasks, args.buckets, args.seed)
    prompts = prompts[: args.limit] if args.limit else prompts
    ctx_key = ("ctx", args.draft, args.tree, args.hf_threads)
    ctx = _shared(ctx_key, lambda: _context(model, args))
    factories = available_methods()
    for vname, (method, options) in variants.items():
        from lsjax.methods import registry

        factories[vname] = _lsjax(vname, registry.get(method), options=options)
    from lsjax.errors import LsjaxError

    methods = {}
    for n in names:
        try:
            methods[n] = _shared(("method", n, factories[n], ctx_key), lambda n=n: factories[n](ctx))
        except LsjaxError as e:  # e.g. a drafter whose trained checkpoint is not shipped yet
            if args.methods:
                raise
            print(f"[bench] skipping {n}: {e}", file=sys.stderr)
    names = list(methods)
    if args.draft_b:  # A/B of two drafts: the second one's methods run right after the first's, same prompts
        ctx_b = _shared(("ctx-b", args.draft_b, ctx_key), lambda: {**ctx, "draft": args.draft_b, "drafts": {}})
        for n in [n for n in names if _uses_draft(n)]:
            make = lambda n=n: dataclasses.replace(factories[n](ctx_b), name=f"{n}@b")  # noqa: E731
            methods[f"{n}@b"] = _shared(("method-b", n, args.draft_b, ctx_key), make)
        names = list(methods)
    lossless = [n for n, m in methods.items() if m.lossless]
    uses_longspec = any(_uses_draft(n) for n in methods)
    draft_note = f"; LongSpec draft {ctx['draft']}" if uses_longspec else ""
    print(
        f"[bench] suite {suite}: {len(prompts)} prompts x {len(names)} methods x T={temps}, {max_new} new tokens"
        f"{draft_note} -> {out_dir}",
        file=sys.stderr,
    )

    rows, failures, nbytes_cache = [], [], {}
    # Rows are appended here as they are measured, so a long run that dies still leaves its data behind.
    partial = out_dir / "rows.partial.jsonl"
    partial.unlink(missing_ok=True)
    bar = tqdm(total=len(prompts) * len(temps) * len(names), desc="bench", unit="run", file=sys.stderr)
    for prompt in prompts:
        ids = encode(tok, prompt)
        seed = prompt_seed(args.seed, prompt.id)
        for t in temps:
            gen = GenerateConfig(
                max_new_tokens=max_new, sampling=SamplingConfig(temperature=t), ignore_eos=not args.stop_at_eos
            )
            group = {}
            for name, method in methods.items():
                bar.set_postfix_str(f"{prompt.id} T={t} {name}")
                o = method.run(ids, gen, seed)
                row = {
                    "prompt_id": prompt.id,
                    "task": prompt.task,
                    "bucket": prompt.bucket,
                    "prompt_tokens": len(ids),
                    "method": name,
                    "temperature": t,
                    "seed": seed,
                    "new_tokens": len(o.tokens),
                    "prefill_s": o.prefill_s,
                    "decode_s": o.decode_s,
                    "compile_s": o.compile_s,
                    "target_forwards": o.target_forwards,
                    "tokens_per_s": (len(o.tokens) - 1) / o.decode_s if o.decode_s > 0 else None,
                    "tau": (len(o.tokens) - 1) / (o.target_forwards - 1)
                    if o.target_forwards and o.target_forwards > 1
                    else None,
                    "tokens": o.tokens,
                }
                if hasattr(method, "split") and (split_temps is None or t in split_temps):
                    row.update(method.split(ids, gen, seed, args.split_steps))
                if hasattr(method, "state_nbytes"):
                    key = (name, prompt.bucket, gen)
                    if key not in nbytes_cache:
                        nbytes_cache[key] = method.state_nbytes(len(ids), gen)
                    row["draft_state_bytes"] = nbytes_cache[key]["draft"]
                    row["kv_cache_bytes"] = nbytes_cache[key]["kv_cache"]
                if method.speculative and hasattr(method, "step_tokens"):
                    steps, stepped = method.step_tokens(ids, gen, seed)
                    row["step_tokens"] = steps
                    # The host-stepped rerun is the same computation: at T=0 it is held to AR's output too.
                    row["stepped_tokens"] = stepped if stepped != o.tokens else None
                group[name] = row
                bar.update()
            ref = group["lsjax-ar"]
            for name, row in group.items():
                row["equal_to_lsjax_ar"] = row["tokens"] == ref["tokens"] if t == 0 and name != "lsjax-ar" else None
                for base in ("lsjax-ar", "hf-ar"):
                    b = group.get(base, {}).get("tokens_per_s")
                    row[f"speedup_vs_{base.replace('-', '_')}"] = (
                        row["tokens_per_s"] / b if b and row["tokens_per_s"] else None
                    )
                if t == 0 and name in lossless and name != "lsjax-ar":
                    runs = [("", row["tokens"])] + [(" (step-by-step rerun)", row.get("stepped_tokens"))]
                    for what, toks in runs:
                        if toks is not None and toks != ref["tokens"]:
                            i = first_difference(toks, ref["tokens"])
                            msg = f"{name}{what} differs from lsjax-ar at T=0 on prompt {prompt.id} (new token {i})"
                            failures.append(msg)
                            tqdm.write(f"[bench] EQUALITY FAILURE: {msg}", file=sys.stderr)
                rows.append(row)
                with partial.open("a") as f:
                    f.write(json.dumps(row, default=float) + "\n")
    bar.close()

    machine["loadavg_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    result = {
        "meta": {
            "suite": suite,
            "date": started.isoformat(timespec="seconds"),
            "commit": source_commit(),
            "command": "python -m lsjax.bench.run " + shlex.join(argv),
            "machine": machine,
            "model": Path(model.path).name if model.path else None,  # a name: results are shared, paths are not
            "methods": names,
            "lossless": lossless,
            "temperatures": temps,
            "max_new_tokens": max_new,
            "ignore_eos": not args.stop_at_eos,
            "num_prompts": len(prompts),
            "draft": _draft_name(ctx["draft"]) if uses_longspec else "n/a",
            "tree": _tree_name(methods) if uses_longspec else "n/a",
            "bucket_order": ["<1K", *BUCKETS, "7K+"],
            "prompts": [{"id": p.id, "task": p.task, "bucket": p.bucket, "tokens": p.num_tokens} for p in prompts],
        },
        "rows": rows,
        "aggregates": tables.aggregates(rows),
        "passed": not failures,
        "failures": failures,
    }
    _write(result, out_dir, tables)
    partial.unlink(missing_ok=True)
    if failures:
        raise EqualityError("; ".join(failures))
    return result


def write_prompts(args) -> dict:
    """`--write-prompts DIR`: the suite's prompts as text files, one per prompt; returns {"files": [...]}."""
    from lsjax.loading import load_model
    from lsjax.prompts import load_suite

    tok = _shared("model", load_model).tokenizer
    prompts = load_suite(tok, args.suite, args.prompts, args.per_cell, args.tasks, args.buckets, args.seed)
    args.write_prompts.mkdir(parents=True, exist_ok=True)
    files = []
    for prompt in prompts[: args.limit] if args.limit else prompts:
        path = args.write_prompts / f"{prompt.id.replace('/', '-')}.txt"
        path.write_text(prompt.text, encoding="utf-8")
        print(f"{path}  {prompt.num_tokens} tokens")
        files.append(str(path))
    return {"files": files}


def _draft_name(draft: str) -> str:
    """The draft as results and READMEs show it: a shipped draft by its path inside the package, so no
    machine's directory layout ends up in published tables."""
    from lsjax.methods.longspec.checkpoint import DRAFTS_DIR

    path = Path(draft)
    return f"lsjax/drafts/{path.name}" if path.parent.resolve() == DRAFTS_DIR.resolve() else draft


def _tree_name(methods) -> str:
    name = next(n for n in methods if _uses_draft(n))
    drafter = methods[name].generator.drafter
    return ",".join(map(str, getattr(drafter, "longspec", drafter).tree.widths))


def _write(result: dict, out_dir: Path, tables) -> None:
    (out_dir / "results.json").write_text(json.dumps(result, indent=1, default=float))
    (out_dir / "results.md").write_text(tables.markdown(result))
    tables.write_all(result, out_dir)
    print(f"[bench] wrote {out_dir}/results.json, results.md, {', '.join(tables.FIGURES)}", file=sys.stderr)


def main(argv=None) -> int:
    try:
        run(argv)
    except EqualityError as e:
        print(f"[bench] FAILED: T=0 output not equal to lsjax-ar: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
