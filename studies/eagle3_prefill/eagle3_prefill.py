"""EAGLE-3's start with the prefill handing its streams to the draft (`engine.start`) against a plain prefill then
`init` recomputing them (`engine.begin`), and a plain prefill alone: SmolLM2, a random draft, a 2000-token prompt
in a 2048 buffer, compile excluded, interleaved, 3 rounds. Prints each variant's seconds and median.

    python -m studies.eagle3_prefill.eagle3_prefill
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from lsjax import engine
from lsjax.cache import KVCache
from lsjax.config import GenerateConfig
from lsjax.engine.loop import begin, prefill
from lsjax.loading import load_model
from lsjax.methods.eagle3.checkpoint import random_draft
from lsjax.methods.eagle3.drafter import Eagle3Drafter, parse_tree
from lsjax.models import target

P, LENGTH, ROUNDS = 2048, 2000, 3


def main() -> None:
    model = load_model()
    cfg = model.config
    dcfg, dp, _ = random_draft(cfg)
    dp = jax.tree.map(jnp.asarray, dp)
    drafter = Eagle3Drafter(dcfg, parse_tree("cpu"))
    params = jax.tree.map(jnp.asarray, target.prepare_for_decode(model.params, cfg))
    gen = GenerateConfig(max_new_tokens=8)
    toks = jnp.asarray(np.random.RandomState(0).randint(3, 40000, (1, P)), jnp.int32)
    lengths, key, cap = jnp.array([LENGTH]), jax.random.key(0), P + 256

    fused = jax.jit(lambda p, d, t, n, k: engine.start(p, d, cfg, drafter, gen, t, n, k, capacity=cap))
    plain_prefill = jax.jit(lambda p, t, n: prefill(p, cfg, t, n, KVCache.zeros(cfg, 1, cap)))
    plain_begin = jax.jit(lambda p, d, t, n, k, c, lg: begin(p, d, cfg, drafter, gen, t, n, k, c, lg))

    def recompute():
        logits, cache = plain_prefill(params, toks, lengths)
        return plain_begin(params, dp, toks, lengths, key, cache, logits)

    variants = {
        "fused": lambda: fused(params, dp, toks, lengths, key),
        "recompute": recompute,
        "prefill only": lambda: plain_prefill(params, toks, lengths),
    }
    for run in variants.values():  # compile outside the timing
        jax.block_until_ready(run())
    seconds = {name: [] for name in variants}
    for _ in range(ROUNDS):
        for name, run in variants.items():
            t0 = time.perf_counter()
            jax.block_until_ready(run())
            seconds[name].append(time.perf_counter() - t0)
    for name, s in seconds.items():
        print(f"{name:13s} {[round(x, 2) for x in s]} median {np.median(s):.2f} s")


if __name__ == "__main__":
    main()
