"""What does one `auto` step cost? Each candidate forced inside auto's compiled loop vs the same drafter run as
a fixed method vs AR, per step, interleaved and repeated in one run.

    python -m studies.auto_step.auto_step                       # a 1K-2K dev code prompt, T=0
    python -m studies.auto_step.auto_step --temperature 1 --task dialogue --bucket 2K-4K
    python -m studies.auto_step.auto_step --variant probes=auto:shadow=0   # + the AR step of another policy
    python -m studies.auto_step.auto_step --ar-only --repeats 15           # all-AR auto vs --method ar only

Prints ms per step and the ratio to a plain AR step measured in the same round (median over rounds, min-max),
and the compile time of every program. An auto step that runs `ar` should cost ~1.0x an AR step, and one that
runs a tree about what that tree costs as a fixed method: the policy's bookkeeping (choosing, the sub-drafters'
updates, the statistics) is the difference. `auto:policy-ar` is the policy left to itself where only AR pays
(every other candidate priced 50x), from the start of a run: its AR stretches (`AutoPolicy.stretch`) growing
2, 4, 8, 16 with policy steps between; `auto:stretched` the same deep into an all-AR run (longest stretches).
Time those over a run's worth of steps: `--ar-only --steps 64`.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np

STEADY = -2  # `timed`: the policy's own all-AR steps from a state deep into an AR run


def main(argv=None) -> int:
    from lsjax.prompts import BUCKETS, TASKS

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", choices=TASKS, default="code")
    p.add_argument("--bucket", choices=list(BUCKETS), default="1K-2K")
    p.add_argument("--suite", choices=("dev", "heldout"), default="dev")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--steps", type=int, default=8, help="steps per timing")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="cpu: the process's CPU seconds (all threads), which a VM's stolen time does not inflate",
    )
    p.add_argument(
        "--ar-only",
        action="store_true",
        help="time only AR and auto forced to AR: what an all-AR auto step costs over --method ar",
    )
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=auto:key=value,...",
        help="another auto policy (as in lsjax.bench.repeat) whose AR step is timed too: its bookkeeping cost",
    )
    args = p.parse_args(argv)
    from lsjax.bench.methods import parse_variant

    try:
        variants = dict(parse_variant(v) for v in args.variant)
    except ValueError as e:
        p.error(f"--variant: {e}")

    import jax
    import jax.numpy as jnp

    from lsjax.config import GenerateConfig, SamplingConfig
    from lsjax.engine.host import Generator
    from lsjax.engine.profiling import prefilled
    from lsjax.engine.types import ARDrafter
    from lsjax.loading import load_model
    from lsjax.methods import registry
    from lsjax.models import target
    from lsjax.prompts import encode, load_suite

    model = load_model()
    # One device copy of the decode-layout weights for every program (a Generator given raw params makes its own).
    params = jax.tree.map(jnp.asarray, target.prepare_for_decode(model.params, model.config))
    prompt = load_suite(model.tokenizer, args.suite, None, 1, [args.task], [args.bucket])[0]
    ids = encode(model.tokenizer, prompt)
    # Long enough that no timed stretch reaches the end, whatever a step accepts.
    gen = GenerateConfig(
        args.steps * 10 * (args.repeats + 1), SamplingConfig(temperature=args.temperature), ignore_eos=True
    )
    auto, auto_params = registry.build("auto", model, draft="shipped")  # the draft's candidates too
    ls_params = auto_params.get("longspec")
    programs = {"ar": Generator(model.config, params, ARDrafter())}
    programs["auto"] = Generator(model.config, params, auto, auto_params)
    # The policy left to itself where nothing but AR pays (every other candidate priced 50x): its AR stretches.
    priced_out = jnp.asarray([1.0] + [50.0] * (len(auto.cost_names) - 1), jnp.float32)
    programs["auto-ar"] = Generator(model.config, params, auto, {**auto_params, "costs": priced_out})
    for c in () if args.ar_only else auto.candidates[1:]:
        programs[c.name] = Generator(model.config, params, c.drafter, ls_params if c.kind != "pld" else None)
    for name, (method, opts) in variants.items():
        programs[name] = Generator(model.config, params, *registry.build(method, model, **opts))

    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    states, compile_s = {}, {}
    for name, g in programs.items():
        compile_s[name] = g.compile(ids, gen)
        _, _, state, (_, decode, _) = prefilled(g, ids, gen)
        states[name] = (jax.block_until_ready(state), decode)

    def timed(name: str, force: int | None = None) -> float:
        g = programs[name]
        state, decode = states[name]
        s = jax.tree.map(jnp.copy, state)  # decode donates its state
        if force is not None and force >= 0:
            pol = dataclasses.replace(s.draft.policy, force=jnp.int32(force))
            s = dataclasses.replace(s, draft=dataclasses.replace(s.draft, policy=pol))
        elif force == STEADY:  # as deep into an all-AR run as stretches get: each is the longest
            pol = dataclasses.replace(s.draft.policy, ar_run=jnp.int32(1000))
            s = dataclasses.replace(s, draft=dataclasses.replace(s.draft, policy=pol))
        s0 = int(s.steps)
        jax.block_until_ready(s)
        t = clock()
        s = jax.block_until_ready(decode(g.params, g.draft_params, s, jnp.int32(s0 + args.steps)))
        return (clock() - t) / max(int(s.steps) - s0, 1)

    runs = [("ar", "ar", None), ("auto:policy-ar", "auto-ar", None), ("auto:stretched", "auto-ar", STEADY)]
    for i, c in enumerate(auto.candidates[:1] if args.ar_only else auto.candidates):
        runs.append((f"auto:{c.name}", "auto", i))
        if c.kind != "ar":
            runs.append((c.name, c.name, None))
    if auto.shadows and not args.ar_only:  # an AR step with a shadow draft after it: what exploring the draft costs
        runs.append(("auto:ar+shadow", "auto", len(auto.candidates)))
    runs += [(f"{name}:ar", name, 0) for name in variants]
    for _, name, force in runs:  # warm-up: first calls allocate
        timed(name, force)
    times: dict[str, list[float]] = {label: [] for label, _, _ in runs}
    ratios: dict[str, list[float]] = {label: [] for label, _, _ in runs}
    for _ in range(args.repeats):
        round_ = {label: timed(name, force) for label, name, force in runs}
        for label, t in round_.items():
            times[label].append(t)
            ratios[label].append(t / round_["ar"])
    print(
        f"{prompt.id} ({len(ids)} tokens), T={args.temperature:g}, {args.steps} steps x {args.repeats} rounds, "
        f"{args.clock} clock; "
        f"device {jax.devices()[0].device_kind}"
    )
    print(f"{'step':>16} {'ms':>8} {'vs AR':>20}")
    for label, _, _ in runs:
        r = ratios[label]
        print(f"{label:>16} {np.median(times[label]) * 1e3:>8.1f} {np.median(r):>7.2f}x ({min(r):.2f}-{max(r):.2f})")
    print("compile s: " + ", ".join(f"{k} {v:.1f}" for k, v in compile_s.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
