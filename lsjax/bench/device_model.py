"""Parts c and d of the device check (`lsjax.bench.device`, whose docstring states each part's goal): one
decode step at Llama-3.1-8B shapes against the time to read its bytes, verification forwards of 1-128 nodes,
an EAGLE-3 step and DFlash steps as multiples of it; then SmolLM2 end to end, each method against AR.
"""

from __future__ import annotations

import dataclasses
import time
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from lsjax.bench import device_kernels
from lsjax.config import ModelConfig
from lsjax.engine.host import first_difference

LLAMA_8B = ModelConfig(
    arch="llama",
    vocab_size=128256,
    hidden_size=4096,
    intermediate_size=14336,
    num_layers=32,
    num_heads=32,
    num_kv_heads=8,
    head_dim=128,
    max_position=131072 + 512,
    rope_theta=500000.0,
    tie_embeddings=False,
    bos_token_id=128000,
    eos_token_ids=(128001,),
    pad_token_id=128001,
    dtype="bfloat16",
    name="Llama-3.1-8B (random weights)",
)

# The DFlash row's draft, shaped like z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat: Qwen3-style layers as wide as
# the target's, reading 5 target layers by the published rule, block 16. Its depth is the published Qwen3-8B
# draft's (5 layers): the Llama draft's config.json was not available here. The dry run keeps 2 layers, which
# compile faster and run the same code.
DFLASH_LAYERS = 5
DFLASH_BLOCK = 16
DFLASH_TREE = "gpu"  # the tree preset verified beside the chain: a GPU's
# Committed to the draft's context after each step: about what a trained DFlash draft accepts at block 16
# (its context K/V cost the same per token whatever the count).
DFLASH_ACCEPTED = 6


# ---------------------------------------------------------------------------
# c. one decode step at Llama-3.1-8B shapes


def step_config(dry: bool, layers: int | None = None) -> ModelConfig:
    if dry:
        return ModelConfig(
            vocab_size=512,
            hidden_size=64,
            intermediate_size=128,
            num_layers=2,
            num_heads=4,
            num_kv_heads=2,
            head_dim=16,
            max_position=4096,
            tie_embeddings=False,
            dtype="bfloat16",
            name="tiny (random weights)",
        )
    return LLAMA_8B if layers is None else dataclasses.replace(LLAMA_8B, num_layers=layers)


def weight_bytes(config: ModelConfig) -> int:
    """bf16 bytes a decode step reads of the weights: every layer, the final norm and the LM head (an untied
    embedding is a gather of one row per token, not a read of the table)."""
    untied_embedding = 0 if config.tie_embeddings else config.vocab_size * config.hidden_size
    return (config.num_params() - untied_embedding) * 2


def kv_bytes(config: ModelConfig, tokens: int) -> int:
    return 2 * config.num_layers * config.num_kv_heads * tokens * config.head_dim * 2


def dflash_config(config: ModelConfig, layers: int = DFLASH_LAYERS, block_size: int = DFLASH_BLOCK):
    """The DFlash row's draft for `config` (a DFlashConfig): `checkpoint.random_draft`'s shape, whose weights are
    drawn on the device instead (numpy would take seconds of the lease at 8B shapes)."""
    from lsjax.methods.dflash.checkpoint import random_config

    return random_config(config, layers, block_size)


def dflash_bytes(capacity: int) -> int:
    """The DFlash row's draft at Llama-3.1-8B shapes: its bf16 weights and its context cache at `capacity`."""
    from lsjax.methods.dflash import model as dm

    cfg = dflash_config(LLAMA_8B)
    weights = sum(int(np.prod(s.shape)) for s in dm.param_specs(cfg).values()) * 2
    return weights + kv_bytes(cfg.layer, capacity)


def layers_that_fit(capacity: int) -> int:
    """The most Llama-3.1-8B layers whose weights (twice: the random init and the decode layout), cache at
    `capacity`, the DFlash row's draft and 2 GiB of margin fit in 85% of this device's memory."""
    mem = device_kernels.device_memory()
    if mem is None:
        return LLAMA_8B.num_layers
    one, two = (weight_bytes(dataclasses.replace(LLAMA_8B, num_layers=n)) for n in (1, 2))
    per_layer = 2 * (two - one) + kv_bytes(dataclasses.replace(LLAMA_8B, num_layers=1), capacity)
    fixed = 2 * (one - (two - one)) + dflash_bytes(capacity) + 2 * 2**30
    return max(0, min(LLAMA_8B.num_layers, int((0.85 * mem - fixed) // per_layer)))


def check_step(rep, copy_bw: dict[int, float]) -> None:
    from lsjax.cache import KVCache
    from lsjax.engine.verify import tree_forward
    from lsjax.models import target
    from lsjax.tree import TreeConfig, chain_parents, make_tree, root_only

    cfg = rep.config
    sizes = sorted(set(cfg.step_sizes) | {1})
    # Room past the longest context for the widest tree any row verifies (DFlash's tree: 33 nodes).
    capacity = -(-(max(cfg.contexts) + max(*sizes, 64)) // 512) * 512
    layers = None if cfg.dry else layers_that_fit(capacity)
    if layers == 0:
        rep.skip("step", f"not one Llama-3.1-8B layer with a {capacity}-token cache fits this device")
        return
    config = step_config(cfg.dry, layers)
    rep.note("step", f"{config.name}: {config.num_layers} layers, bf16, cache capacity {capacity}")
    if not copy_bw:
        copy_bw = {0: device_kernels.copy_bandwidth(64 * 2**20 if not cfg.dry else 2**20, cfg.dry)}
    bw = float(np.median(list(copy_bw.values())))
    try:
        params = target.init_params(config, jax.random.key(0))
        params = jax.tree.map(jnp.asarray, target.prepare_for_decode(params, config))
        cache = KVCache.zeros(config, 1, capacity)
    except Exception as e:  # noqa: BLE001
        rep.skip("step", f"{config.name} does not fit: {device_kernels.first_line(e)}")
        return
    fwd = jax.jit(lambda params, tree, cache: tree_forward(params, config, tree, cache)[1])
    trees = {}
    rng = np.random.default_rng(0)
    for T in sizes:
        toks = jnp.asarray(rng.integers(0, config.vocab_size, (1, T)), jnp.int32)
        if T == 1:
            trees[T] = root_only(toks[:, 0])
        else:  # a chain: the cost depends on the node count, not the shape
            trees[T] = make_tree(
                toks, jnp.asarray(chain_parents(T))[None], jnp.ones((1, T), bool), TreeConfig((1,) * (T - 1))
            )
    repeats = 3 if cfg.dry else 10
    steps = {"eagle3": _eagle3_step(config, capacity)}
    try:
        dflash = dflash_config(config, DFLASH_LAYERS if not cfg.dry else 2)
        steps |= _dflash_steps(config, capacity, dflash)
        rep.note(
            "step",
            f"dflash: a random draft of {dflash.layer.num_layers} layers, block {dflash.block_size}, target layers "
            f"{list(dflash.target_layer_ids)}; {DFLASH_ACCEPTED} tokens committed to its context a step",
        )
    except Exception as e:  # noqa: BLE001 - the other rows do not need it
        rep.skip("step", f"dflash: {device_kernels.first_line(e)}")
    for ctx in cfg.contexts:
        if rep.over_budget("step", f"context {ctx}"):
            return
        cache = KVCache(cache.k, cache.v, jnp.array([ctx], jnp.int32))
        times: dict = {T: [] for T in sizes}
        try:
            for T in sizes:
                jax.block_until_ready(fwd(params, trees[T], cache))  # compiles once per size
        except Exception as e:  # noqa: BLE001
            rep.skip("step", f"context {ctx}: {device_kernels.first_line(e)}")
            continue
        ready, made = {}, {}  # a method's step that cannot run here is a skip line, not a lost row
        for name, step in steps.items():
            try:
                if step.args not in made:  # DFlash's steps share one draft cache
                    made[step.args] = step.args(ctx)
                args = made[step.args]
                jax.block_until_ready(step.fn(params, cache, *args))  # compiles once
                ready[name] = args
            except Exception as e:  # noqa: BLE001
                rep.skip("step", f"context {ctx}: the {name} step: {device_kernels.first_line(e)}")
        try:
            for _ in range(repeats):  # interleaved: machine noise hits every size and step alike
                for T in sizes:
                    t = time.perf_counter()
                    jax.block_until_ready(fwd(params, trees[T], cache))
                    times[T].append(time.perf_counter() - t)
                for name, args in ready.items():
                    t = time.perf_counter()
                    jax.block_until_ready(steps[name].fn(params, cache, *args))
                    times.setdefault(name, []).append(time.perf_counter() - t)
        except Exception as e:  # noqa: BLE001
            rep.skip("step", f"context {ctx}: {device_kernels.first_line(e)}")
            continue
        ar = float(np.median(times[1]))
        # bw counts a copy's reads and writes alike: the rate HBM moves bytes, which a pure read runs at too.
        read = (weight_bytes(config) + kv_bytes(config, ctx)) / bw
        ratios = {T: float(np.median(times[T])) / ar for T in sizes}
        methods = {n: float(np.median(times[n])) / ar if n in times else None for n in steps}
        said = [f"{n} step ({steps[n].what}) " + ("-" if r is None else f"{r:.2f}x") for n, r in methods.items()]
        rep.row(
            "step",
            dict(
                context=ctx,
                ar_ms=ar * 1e3,
                read_ms=read * 1e3,
                ar_vs_read=ar / read,
                eagle3_vs_ar=methods["eagle3"],
                dflash_draft_vs_ar=methods.get("dflash_draft"),
                dflash_vs_ar=methods.get("dflash"),
                dflash_tree_vs_ar=methods.get("dflash_tree"),
                vs_ar=ratios,
            ),
            f"{ctx:>6} ctx: 1-node step {ar * 1e3:.2f} ms = {ar / read:.2f}x its read ({read * 1e3:.2f} ms); "
            + " ".join(f"{T}:{r:.2f}x" for T, r in ratios.items())
            + "; "
            + "; ".join(said),
        )


@dataclasses.dataclass(frozen=True)
class _Step:
    """A method's step at the target's shapes, timed beside the 1-node step."""

    fn: object  # jitted (target params, target cache, *args) -> outputs
    args: object  # context -> the rest of fn's arguments at that context
    what: str


def _eagle3_step(config: ModelConfig, capacity: int) -> _Step:
    """An EAGLE-3 step at the target's shapes with random weights, as a published Llama-3.1-8B draft is shaped
    (one layer like the target's, a 32K draft vocabulary, EAGLE-3's 59-node, 8-level, top-10 tree): the draft's
    tree search, the verification forward with its three streams, and the draft over 4 accepted pairs after it.
    What `--method eagle3` pays per step beside the walk, to set against one AR step."""
    import flax.linen as nn

    from lsjax.cache import KVCache
    from lsjax.engine.types import DraftContext
    from lsjax.engine.verify import aux_tree_forward
    from lsjax.methods.eagle3 import model as em
    from lsjax.methods.eagle3.checkpoint import random_draft
    from lsjax.methods.eagle3.drafter import TREE_PRESETS, Eagle3Drafter, Eagle3State

    cfg = random_draft(dataclasses.replace(config, num_layers=max(config.num_layers, 1)))[0]
    aux = em.default_aux_layers(config.num_layers)
    cfg = dataclasses.replace(cfg, draft_vocab_size=min(32000, config.vocab_size), aux_layers=aux)
    drafter = Eagle3Drafter(cfg, TREE_PRESETS["eagle3"])
    dparams = nn.meta.unbox(em.Eagle3Draft(cfg).init(jax.random.key(1), method="weights")["params"])
    accepted = 4

    def fn(params, cache, dparams, dstate, root):
        ctx = DraftContext(params, dparams, config, capacity=capacity)
        tree = drafter.propose(ctx, types.SimpleNamespace(root=root), dstate)
        _, logits, _, _, streams = aux_tree_forward(params, config, tree, cache, aux)
        n = dstate.cache.lengths
        pos = n[:, None] + jnp.arange(accepted, dtype=jnp.int32)[None]
        h, _ = drafter._commit_pairs(
            ctx, dstate.cache, streams[:, :accepted], tree.tokens[:, 1 : accepted + 1], pos, n * 0 + accepted
        )
        return logits, h

    def args(ctx: int):
        dcache = KVCache.zeros(cfg.layer, 1, capacity)
        dcache = KVCache(dcache.k, dcache.v, jnp.array([ctx], jnp.int32))
        return dparams, Eagle3State(dcache, jnp.zeros((1, cfg.hidden_size), jnp.float32)), jnp.array([7], jnp.int32)

    b = drafter.budget
    return _Step(jax.jit(fn), args, f"{b.nodes + 1} nodes, depth {b.depth}, top-{b.top_k}")


def _dflash_steps(config: ModelConfig, capacity: int, cfg) -> dict[str, _Step]:
    """DFlash steps at the target's shapes with random weights for the draft `cfg` (`dflash_config`), each what
    `--method dflash` pays per step beside the walk, to set against one AR step:

    - `dflash_draft`: the draft alone: the block [root, MASK x 15] over its context cache, the target's head at
      the 15 drafted positions, and the context K/V of `DFLASH_ACCEPTED` committed tokens;
    - `dflash`: that and the verification of the block's chain (16 nodes: the root and 15 drafted) with the
      streams the draft reads, which the committed tokens' K/V are made from;
    - `dflash_tree`: the same with the `DFLASH_TREE` preset's tree instead of the chain.

    The K/V are returned, not written into the draft's cache: a decode writes them in place, where a returned
    cache here would be a copy of it that no step pays."""
    import flax.linen as nn

    from lsjax.cache import KVCache
    from lsjax.engine.types import DraftContext
    from lsjax.engine.verify import aux_tree_forward
    from lsjax.methods.dflash import model as dm
    from lsjax.methods.dflash.drafter import DFlashDrafter, DFlashState, parse_tree

    dparams = nn.meta.unbox(dm.DFlashDraft(cfg).init(jax.random.key(2), method="weights")["params"])
    chain = DFlashDrafter(cfg)
    tree = DFlashDrafter(cfg, parse_tree(DFLASH_TREE, cfg.block_size))
    A = DFLASH_ACCEPTED

    def step(drafter: DFlashDrafter, verify: bool):
        def fn(params, cache, dparams, dstate, root, streams):
            ctx = DraftContext(params, dparams, config, capacity=capacity)
            proposal = drafter.propose(ctx, types.SimpleNamespace(root=root), dstate)
            out = proposal.tokens
            if verify:  # the verification's own streams replace the stand-in ones
                _, out, _, _, streams = aux_tree_forward(params, config, proposal, cache, cfg.taps)
            pos = dstate.cache.lengths[:, None] + jnp.arange(A, dtype=jnp.int32)[None]
            k, v = drafter._draft(ctx)(drafter._hf_streams(ctx, streams[:, :A]), pos, method="context_kv")
            return out, k, v

        return jax.jit(fn)

    def args(ctx: int):
        dcache = KVCache.zeros(cfg.layer, 1, capacity)
        dcache = KVCache(dcache.k, dcache.v, jnp.array([ctx], jnp.int32))
        streams = jnp.ones((1, A, len(cfg.taps) * config.hidden_size), jnp.dtype(config.dtype))
        return dparams, DFlashState(dcache), jnp.array([7], jnp.int32), streams

    s = cfg.block_size
    n_tree = len(tree.shape.parents)
    return {
        "dflash_draft": _Step(step(chain, False), args, "the draft alone"),
        "dflash": _Step(step(chain, True), args, f"draft + {s}-node chain"),
        "dflash_tree": _Step(step(tree, True), args, f"draft + {n_tree}-node `{DFLASH_TREE}` tree"),
    }


# ---------------------------------------------------------------------------
# d. end to end on SmolLM2


GGUF_HINT = "path/to/SmolLM2-135M-Instruct.Q4_1.gguf"


def _e2e_model(cfg, dtype: str):
    """(model, prompts [ids], methods {name: build options}); the dry run builds a tiny random target."""
    from lsjax.loading import LoadedModel, load_model
    from lsjax.prompts import BUNDLED_SPEECH

    if cfg.dry:
        config = ModelConfig(
            vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
            head_dim=16, max_position=1024, name="tiny", dtype=dtype,
        )  # fmt: skip
        from lsjax.models import target

        params = jax.tree.map(lambda a: np.asarray(a.astype(dtype)), target.init_params(config, jax.random.key(0)))
        # repetitive: prompt lookup finds matches
        prompts = [np.resize(np.arange(3 + i, 40 + i), 120).tolist() for i in range(cfg.e2e_prompts)]
        model = LoadedModel(config, params, None, Path("tiny"))
        return model, prompts, {"longspec": dict(draft="random", tree="2,1"), "pld": {}, "auto": dict(draft="random")}
    model = load_model(cfg.model, dtype)
    tok = model.tokenizer
    text = BUNDLED_SPEECH.read_text()
    rendered = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
    prompts = [tok.encode(rendered, add_special_tokens=False)]
    doc = tok.encode(text, add_special_tokens=False)
    # Cuts of the document continued as plain text, every one longer than 2048 tokens: the bundled prompt's
    # bucket, so nothing recompiles per prompt.
    step = max(1, (len(doc) - 2100) // max(1, cfg.e2e_prompts - 1))
    prompts += [doc[: len(doc) - i * step] for i in range(cfg.e2e_prompts - 1)]
    return model, prompts, {"longspec": dict(tree="paper"), "pld": {}, "auto": {}}


def check_e2e(rep) -> None:
    temps = rep.config.e2e_temperatures
    for i, dtype in enumerate(rep.config.e2e_dtypes):
        mine = temps if i == 0 else tuple(t for t in temps if t == 0)
        if mine:  # a later dtype with sampled rows only has nothing to run: its model is not loaded
            _check_e2e(rep, dtype, mine)


def _invariant_attention_speed(rep, model, ar, prompts, gen) -> None:
    """Invariant AR on the default attention (the Pallas kernel on a GPU) against the same with XLA attention,
    interleaved: what the invariant kernel buys on this card. The two round differently, so their outputs may
    part at a near tie; each is exact against its own verification."""
    from lsjax.engine.host import Generator

    xla = Generator(model.config, model.params, backend="xla")
    xla.run(prompts[0], gen)  # compiles
    runs = [(ar.run(ids, gen), xla.run(ids, gen)) for ids in prompts]
    fast = float(np.median([a.tokens_per_s for a, _ in runs]))
    slow = float(np.median([x.tokens_per_s for _, x in runs]))
    same = sum(first_difference(a.tokens, x.tokens) is None for a, x in runs)
    rep.note(
        "e2e",
        f"invariant AR, default attention ({'kernel' if jax.default_backend() == 'gpu' else 'XLA here'}) vs XLA:"
        f" {fast:.1f} vs {slow:.1f} tok/s ({fast / max(slow, 1e-9):.2f}x); same output on {same}/{len(runs)}",
    )


def _check_e2e(rep, dtype: str, temperatures: tuple[float, ...]) -> None:
    from lsjax.config import GenerateConfig, SamplingConfig
    from lsjax.engine.host import Generator
    from lsjax.engine.profiling import time_split
    from lsjax.engine.types import invariant_rows_for
    from lsjax.errors import LsjaxError
    from lsjax.methods import registry

    cfg = rep.config
    t0 = time.perf_counter()
    try:
        model, prompts, methods = _e2e_model(cfg, dtype)
    except (LsjaxError, OSError) as e:
        rep.skip(
            "e2e",
            f"no SmolLM2 weights here ({device_kernels.first_line(e)}); pass --model {GGUF_HINT}",
        )
        return
    gen = GenerateConfig(max_new_tokens=cfg.max_new_tokens)
    lengths = "/".join(str(len(p)) for p in prompts)
    numerics = {0: "", "auto": ", batch-invariant over the rows each method fits"}.get(
        cfg.e2e_invariant_rows, f", batch-invariant over {cfg.e2e_invariant_rows} rows"
    )
    if 0 not in temperatures:
        numerics = ""
    elif numerics and any(temperatures):
        numerics += " at T = 0"
    rep.note(
        "e2e",
        f"{model.config.name} ({model.config.dtype}{numerics}), prompts of {lengths} tokens, {gen.max_new_tokens} new",
    )
    plain = Generator(model.config, model.params)  # the speed baseline: AR as fast as it runs
    ars = {0: plain}  # rows -> the output baseline: AR in those numerics

    def on_rows(rows: int):
        return model._replace(config=dataclasses.replace(model.config, invariant_rows=rows))

    def ar_at(rows: int):
        if rows not in ars:
            ars[rows] = Generator(on_rows(rows).config, model.params)
            ars[rows].run(prompts[0], gen)  # compiles
            if len(ars) == 2:  # once: what the kernel buys, at the first method's rows
                _invariant_attention_speed(rep, on_rows(rows), ars[rows], prompts, gen)
        return ars[rows]

    for t in temperatures:
        # T > 0 runs in plain numerics against plain AR: samples are not compared, only speed and tau are
        g_t = gen if t == 0 else dataclasses.replace(gen, sampling=SamplingConfig(temperature=float(t)))
        plain.run(prompts[0], g_t)  # compiles
        for name in cfg.e2e_methods:
            opts = methods[name]
            if rep.over_budget("e2e", f"{name} ({dtype}, T={t:g})"):
                return
            try:
                profile = "prior" if cfg.dry else "cached"  # auto's costs (other methods ignore it)
                drafter, draft_params = registry.build(name, model, **opts, cost_profile=profile)
                rows = cfg.e2e_invariant_rows if t == 0 else 0
                rows = invariant_rows_for(drafter) if rows == "auto" else rows
                ar = ar_at(rows)
                g = Generator(on_rows(rows).config, model.params, drafter, draft_params)
                t_case = time.perf_counter()
                g.run(prompts[0], g_t)  # compiles (and measures auto's costs once)
                # progress for the log only: a lease's timeout inside a case then says where it went
                took = time.perf_counter() - t_case
                rep.log(f"[e2e] {name} T={t:g}: compiled in {took:.0f} s, at {rep.elapsed():.0f} s")
                # interleaved with AR (and plain AR when the numerics are invariant); one seed per prompt
                runs = [
                    (ar.run(ids, g_t, seed=i), g.run(ids, g_t, seed=i), plain.run(ids, g_t) if rows else None)
                    for i, ids in enumerate(prompts)
                ]
                split = time_split(g, prompts[0], g_t)
            except (LsjaxError, ValueError) as e:
                rep.skip("e2e", f"{name} ({dtype}, T={t:g}): {device_kernels.first_line(e)}")
                continue
            _e2e_row(rep, name, dtype, float(t), rows, runs, split)
    rep.note("e2e", f"{dtype}: {time.perf_counter() - t0:.0f} s")


def _e2e_row(rep, name: str, dtype: str, t: float, rows: int, runs: list, split: dict) -> None:
    pairs = [(b, r) for b, r, _ in runs]
    diffs = [first_difference(b.tokens, r.tokens) for b, r in pairs] if t == 0 else []
    same = sum(d is None for d in diffs)
    base = [p or b for b, _, p in runs]  # the speed baseline: plain AR
    speed = float(np.median([r.tokens_per_s / max(b.tokens_per_s, 1e-9) for b, (_, r) in zip(base, pairs)]))
    row = dict(
        method=name,
        dtype=dtype,
        temperature=t,
        invariant_rows=rows,
        identical=same == len(pairs) if t == 0 else None,
        prompts_identical=f"{same}/{len(pairs)}" if t == 0 else "sampled",
        first_difference=min((d for d in diffs if d is not None), default=None),
        speedup=speed,
        tau=float(np.mean([r.mean_accepted for _, r in pairs])),
        tokens_per_s=float(np.median([r.tokens_per_s for _, r in pairs])),
        ar_tokens_per_s=float(np.median([b.tokens_per_s for b in base])),
        invariant_ar_tokens_per_s=float(np.median([b.tokens_per_s for b, _ in pairs])) if rows else None,
        new_tokens=sum(r.new_tokens for _, r in pairs),
        **split,
    )
    ms = " ".join(f"{k} {v:.2f}" for k, v in split.items() if isinstance(v, float))
    if t:
        verdict = f"T={t:g}    sampled on {len(pairs)} prompts"
    else:
        where = "" if row["identical"] else f", first at new token {row['first_difference']}"
        verdict = f"{'identical' if row['identical'] else 'DIFFERENT'} on {same}/{len(pairs)} prompts{where}"
    rep.row(
        "e2e",
        row,
        f"{name:<9} {dtype:<8} {verdict}; {speed:.2f}x AR ({row['tokens_per_s']:.1f} vs"
        f" {row['ar_tokens_per_s']:.1f} tok/s"
        + (f"; invariant AR {row['invariant_ar_tokens_per_s']:.1f} on {rows} rows" if rows else "")
        + f"), tau {row['tau']:.2f}"
        + (f"; {ms}" if ms else ""),
    )
