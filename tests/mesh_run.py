"""Run in a fresh process with N fake CPU devices (tests/test_mesh.py starts it): decoding on a mesh against
one device. Prints one JSON line per case.

    python tests/mesh_run.py greedy DEVICES SHAPE MESH METHOD[,METHOD...]
    python tests/mesh_run.py sampled DEVICES MESH ROWS
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":  # imported, it only lends its models and drafters (before jax is imported)
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={int(sys.argv[2])}"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import dataclasses  # noqa: E402
import json  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from lsjax import engine  # noqa: E402
from lsjax import mesh as mesh_lib  # noqa: E402
from lsjax.config import DraftConfig, GenerateConfig, ModelConfig, SamplingConfig  # noqa: E402
from lsjax.engine.types import ARDrafter, Drafter, SpecConfig  # noqa: E402
from lsjax.methods.auto.drafter import AutoDrafter, AutoPolicy, auto_params  # noqa: E402
from lsjax.methods.longspec.drafter import LongSpecDrafter  # noqa: E402
from lsjax.methods.longspec.model import init_draft_params  # noqa: E402
from lsjax.methods.pld.drafter import PLDDrafter  # noqa: E402
from lsjax.models import target  # noqa: E402
from lsjax.tree import TreeConfig, make_tree  # noqa: E402

# Tiny configs with the head shapes of the real models: SmolLM2 (9 query heads over 3 KV heads) and
# Llama-3.1-8B (32 over 8). Vocabularies divisible by the model axis, so the LM head is split too.
SHAPES = {
    "smollm2": dict(num_heads=9, num_kv_heads=3, hidden_size=36, intermediate_size=48, vocab_size=99),
    "llama8b": dict(num_heads=32, num_kv_heads=8, hidden_size=64, intermediate_size=128, vocab_size=128),
    # Qwen3's per-head q/k norms (each shard normalises its own heads), 8 query over 4 KV heads.
    "qwen3": dict(
        arch="qwen3", qk_norm=True, num_heads=8, num_kv_heads=4, hidden_size=32, intermediate_size=48, vocab_size=96
    ),
}
LS = DraftConfig(window=8)


def model(shape: str):
    dtype = os.environ.get("MESH_DTYPE", "float32")  # bfloat16: weights and K/V cache in bf16
    config = ModelConfig(
        num_layers=2, head_dim=8, max_position=2048, rope_theta=10000.0, eos_token_ids=(2,), pad_token_id=0,
        dtype=dtype, **SHAPES[shape],
    )  # fmt: skip
    return config, target.init_params(config, jax.random.key(3), scale=0.3)


@dataclasses.dataclass(frozen=True)
class Oracle(Drafter):
    """Two children per level down a 5-deep path: the first is the target's own greedy token (`future`, per
    row), except at levels a pattern of the step count corrupts, the second a wrong token. Steps accept 0-5
    tokens at varying depths, so committing many tokens' K/V into the split cache gets exercised (a random
    tiny model accepts ~1 token from pld or an untrained draft)."""

    future: tuple = ()
    depth: int = 5
    name = "oracle"

    @property
    def tree(self) -> TreeConfig:
        return TreeConfig((2,) * self.depth)

    def propose(self, ctx, state, draft_state, key):
        B = state.root.shape[0]
        table = jnp.asarray(self.future, jnp.int32)
        table = jnp.concatenate([table, jnp.zeros((B, self.depth + 1), jnp.int32)], axis=1)
        right = jax.vmap(lambda row, n: jax.lax.dynamic_slice_in_dim(row, n, self.depth))(table, state.num_out)
        level = jnp.arange(self.depth)
        corrupt = (state.steps * 3 + level) % 5 == 0
        right = jnp.where(corrupt[None], (right + 1) % ctx.config.vocab_size, right)
        wrong = (right + 2) % ctx.config.vocab_size
        tokens = jnp.concatenate([state.root[:, None], jnp.stack([right, wrong], -1).reshape(B, -1)], axis=1)
        # Level d's nodes are 2d+1 (right) and 2d+2; both hang from level d-1's right node.
        parents = jnp.concatenate([jnp.array([-1, 0, 0]), jnp.repeat(jnp.arange(1, 2 * self.depth - 1, 2), 2)])
        T = tokens.shape[1]
        return make_tree(tokens, jnp.broadcast_to(parents[None], (B, T)), jnp.ones((B, T), bool), self.tree)


def drafter_and_params(method: str, config, params, future=()):
    longspec = LongSpecDrafter(TreeConfig((2, 2, 2)), LS)
    # The draft is the target's last layer (not the zero-output default), so its trees depend on the context.
    ls_params = init_draft_params(config, dataclasses.replace(LS, zero_init_outputs=False), params)
    if method == "ar":
        return ARDrafter(), ()
    if method == "oracle":
        return Oracle(future), ()
    if method == "pld":
        return PLDDrafter(num_tokens=4, ngram_max=2), ()
    if method == "longspec":
        return longspec, ls_params
    if method == "longspec-deep":  # two blocks, the second live (its output projections random, not grown zero)
        deep = dataclasses.replace(LS, depth=2)
        dp = init_draft_params(config, dataclasses.replace(deep, zero_init_outputs=False), params)
        rng = np.random.RandomState(5)
        for name in ("deep_cross_wo", "deep_w_down"):
            dp[name] = jnp.asarray(0.1 * rng.standard_normal(dp[name].shape), dp[name].dtype)
        return LongSpecDrafter(TreeConfig((2, 2, 2)), deep), dp
    if method == "eagle3":  # an untrained EAGLE-3 draft: its own cache, and the target's streams at 3 layers
        from lsjax.methods.eagle3.checkpoint import random_draft
        from lsjax.methods.eagle3.drafter import Eagle3Drafter, Eagle3Tree

        cfg, dp, _ = random_draft(config, seed=2)
        return Eagle3Drafter(cfg, Eagle3Tree(8, 3, 3)), jax.tree.map(jnp.asarray, dp)
    if method == "auto":
        policy = AutoPolicy(shadow=False)
        auto = AutoDrafter(longspec, pld_tokens=(3,), pld_ngram=2, chains=(2,), hybrid_pld=3, policy=policy)
        # AR priced out, so the policy drafts from the first step on and every candidate gets steps.
        costs = [10.0] + [1.0] * (len(auto.cost_names) - 2) + [10.0]
        return auto, auto_params(auto, ls_params, costs)
    raise SystemExit(f"unknown method {method}")


def prompts(config, rows: int, width: int = 128):
    """Rows that repeat themselves, so prompt lookup and the draft find continuations."""
    rng = np.random.RandomState(0)
    toks = rng.randint(3, config.vocab_size, size=(rows, width)).astype(np.int32)
    toks[:, width // 2 :] = toks[:, : width // 2]
    lengths = np.array([width - 3 - 7 * b for b in range(rows)], np.int32)
    return jnp.asarray(toks), jnp.asarray(lengths)


def greedy(shape: str, mesh_text: str, methods: list[str]) -> None:
    config, params = model(shape)
    mesh = mesh_lib.make(mesh_text)
    rows = 2 * mesh_lib.shape_of(mesh).data
    tokens, lengths = prompts(config, rows)
    gen = GenerateConfig(max_new_tokens=48, ignore_eos=True)
    run = jax.jit(engine.run, static_argnames="config")
    backend = os.environ.get("MESH_BACKEND", "auto")  # pallas: the kernels (interpreted here) per device
    one_params = target.prepare_for_decode(params, config)
    key = jax.random.key(0)
    one_ar = run(one_params, (), SpecConfig(config, gen, ARDrafter(), chunk=64, backend=backend), tokens, lengths, key)
    future = tuple(tuple(row) for row in np.asarray(one_ar.out).tolist())
    for method in methods:
        drafter, dp = drafter_and_params(method, config, params, future)
        one = run(one_params, dp, SpecConfig(config, gen, drafter, chunk=64, backend=backend), tokens, lengths, key)
        mp, mdp = mesh_lib.place(params, dp, config, mesh)
        on_mesh = run(
            mp, mdp, SpecConfig(config, gen, drafter, chunk=64, backend=backend, mesh=mesh), tokens, lengths, key
        )
        ar = run(
            mp, mdp, SpecConfig(config, gen, ARDrafter(), chunk=64, backend=backend, mesh=mesh), tokens, lengths, key
        )
        a, b, c = (np.asarray(s.out) for s in (one, on_mesh, ar))
        split = [x for x in jax.tree.leaves(mp) if not x.sharding.is_fully_replicated]
        print(
            json.dumps(
                {
                    "method": method,
                    "equal_one_device": bool((a == b).all()),
                    "equal_ar_on_mesh": bool((b == c).all()),
                    "tau": float(on_mesh.mean_accepted),
                    "cache_spec": str(on_mesh.cache.k.sharding.spec),
                    "split_params": len(split),
                    "tokens": b.shape[0] * b.shape[1],
                }
            ),
            flush=True,
        )


def sampled(mesh_text: str, rows: int) -> None:
    """Samples of the first K tokens at T=1 on the mesh, for tests/test_mesh.py to compare with the exact law."""
    from tests.test_verify_sampling import PROMPT, K, V

    config, params = sampling_model()
    mesh = mesh_lib.make(mesh_text)
    drafter = LongSpecDrafter(TreeConfig((2, 3, 2)), DraftConfig(window=4))
    dp = init_draft_params(config, dataclasses.replace(drafter.draft, zero_init_outputs=False), params)
    mp, mdp = mesh_lib.place(params, dp, config, mesh)
    gen = GenerateConfig(max_new_tokens=K, sampling=SamplingConfig(temperature=1.0), ignore_eos=True)
    spec = SpecConfig(config, gen, drafter, capacity=32, chunk=8, mesh=mesh)
    run = jax.jit(engine.run, static_argnames="config")
    outs, taus = [], []
    for c in range(rows // 25_000):
        tokens = jnp.asarray(np.tile(np.array(PROMPT + [0] * 3, np.int32), (25_000, 1)))
        lengths = jnp.full((25_000,), len(PROMPT), jnp.int32)
        state = run(mp, mdp, spec, tokens, lengths, jax.random.fold_in(jax.random.key(7), c))
        outs.append(np.asarray(state.out[:, :K]))
        taus.append(float(state.mean_accepted))
    assert config.vocab_size == V
    np.save(os.environ["MESH_SAMPLES"], np.concatenate(outs))
    row = {"rows": rows, "tau": float(np.mean(taus)), "cache_spec": str(state.cache.k.sharding.spec)}
    print(json.dumps(row), flush=True)


def sampling_model():
    """tests/test_verify_sampling.py's model with two KV heads (one would not split over model=2)."""
    from tests.test_verify_sampling import model as base

    config, _ = base()
    config = dataclasses.replace(config, num_heads=4, num_kv_heads=2)
    return config, target.init_params(config, jax.random.key(1), scale=0.8)


if __name__ == "__main__":
    assert jax.device_count() == int(sys.argv[2]), jax.devices()
    if sys.argv[1] == "greedy":
        greedy(sys.argv[3], sys.argv[4], sys.argv[5].split(","))
    else:
        sampled(sys.argv[3], int(sys.argv[4]))
