"""What a method adds to the target: extra parameters, and floating-point work per step and per token (the
shape of Speculative Streaming's Table 3).

    python -m lsjax.bench.flops --methods pld longspec streams tokenswift dels

FLOPs are XLA's own count (`cost_analysis`) of one whole decode step (draft, verification, commit, the
drafter's update) lowered for batch 1 at a 1024-slot cache. At that capacity every loop over the cache's
key blocks runs once (`lsjax.attention` reads 1024-key blocks), so the count is exact for a 1K context:
a loop XLA cannot unroll is counted once, and at longer contexts it would undercount the attention. Per
token divides by the tokens a step emits (tau, measured elsewhere: `lsjax.bench.repeat --flops` does both in
one run). Nothing runs: the step is lowered from abstract shapes.
"""

from __future__ import annotations

import argparse
import functools
import math
import sys

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


def table(costs: dict[str, dict], taus: dict[str, float], target_params: int) -> str:
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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--methods", nargs="+", default=["pld", "longspec", "streams"])
    args = p.parse_args(argv)

    import jax
    import jax.numpy as jnp

    from lsjax.loading import load_model
    from lsjax.models import target

    model = load_model()
    params = jax.tree.map(jnp.asarray, target.prepare_for_decode(model.params, model.config))
    costs = method_costs(model, params, args.methods)
    print(table(costs, {}, model.config.num_params()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
