"""How much does verifying a tree cost on this device? Target forward time vs tree size.

    python -m studies.tree_cost.tree_cost                       # default model, contexts 1K and 4K
    python -m studies.tree_cost.tree_cost --context 4096 --sizes 1 4 8 16 32 69

Prints ms per verification forward (tree forward + LM head on every node) and
its ratio to a 1-token forward measured in the same run, interleaved. The right
tree for a device is the one whose expected accepted length per forward beats
that ratio by the most: on a 2-core CPU a 16-node tree costs ~2x one token,
on a GPU the paper's 69 nodes cost about the same as one.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from lsjax.cache import KVCache
from lsjax.engine.verify import tree_forward
from lsjax.loading import load_model
from lsjax.models import target
from lsjax.tree import TreeConfig, chain_parents, make_tree, root_only


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--context", type=int, nargs="+", default=[1024, 4096], help="committed tokens in the cache")
    p.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 69], help="tree nodes (root incl.)")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument(
        "--layout",
        nargs="+",
        choices=("default", *target.LAYOUTS),
        default=["default"],
        help="the projections' storage: [in, out], [out, in], both (picked by row count), or what "
        "prepare_for_decode picks on this backend; several are timed interleaved, ratios to the first's 1 node",
    )
    args = p.parse_args(argv)

    model = load_model()
    config = model.config
    layouts = {  # as Generator runs them
        name: jax.tree.map(
            jnp.asarray,
            target.prepare_for_decode(model.params, config, layout=None if name == "default" else name),
        )
        for name in dict.fromkeys(args.layout)
    }
    fwd = jax.jit(lambda params, tree, cache: tree_forward(params, config, tree, cache)[0])
    print(f"device: {jax.devices()[0].device_kind}; model {config.name}")
    print(f"{'context':>8} {'layout':>8} {'nodes':>6} {'ms':>9} {'vs 1 token':>11}")
    for ctx in args.context:
        cache = KVCache.zeros(config, 1, -(-(ctx + max(args.sizes)) // 256) * 256)
        cache = KVCache(cache.k, cache.v, jnp.array([ctx], jnp.int32))
        trees = {}
        for T in args.sizes:  # a chain of T nodes: the cost depends on the node count, not the shape
            toks = jnp.asarray(np.random.RandomState(T).randint(0, config.vocab_size, (1, T)), jnp.int32)
            if T == 1:
                trees[T] = root_only(toks[:, 0])
            else:
                parents = jnp.asarray(chain_parents(T))[None]
                trees[T] = make_tree(toks, parents, jnp.ones((1, T), bool), TreeConfig((1,) * (T - 1)))
            for params in layouts.values():
                jax.block_until_ready(fwd(params, trees[T], cache))  # compile
        times = {(name, T): [] for name in layouts for T in args.sizes}
        for _ in range(args.repeats):  # interleaved so machine noise hits every size and layout alike
            for T in args.sizes:
                for name, params in layouts.items():
                    t = time.perf_counter()
                    jax.block_until_ready(fwd(params, trees[T], cache))
                    times[name, T].append(time.perf_counter() - t)
        base = np.median(times[next(iter(layouts)), args.sizes[0]])
        for name in layouts:
            for T in args.sizes:
                med = np.median(times[name, T])
                print(f"{ctx:>8} {name:>8} {T:>6} {med * 1e3:>9.1f} {med / base:>10.2f}x")


if __name__ == "__main__":
    main()
