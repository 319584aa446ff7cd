"""Parts c and d of the device check (`lsjax.bench.device`, whose docstring states each part's goal): one
decode step at Llama-3.1-8B shapes against the time to read its bytes, verification forwards of 1-128 nodes
and an EAGLE-3 step as multiples of it; then SmolLM2 end to end, each method against AR.
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


def layers_that_fit(capacity: int) -> int:
    """The most Llama-3.1-8B layers whose weights (twice: the random init and the decode layout), cache at
    `capacity` and 2 GiB of margin fit in 85% of this device's memory."""
    mem = device_kernels.device_memory()
    if mem is None:
        return LLAMA_8B.num_layers
    one, two = (weight_bytes(dataclasses.replace(LLAMA_8B, num_layers=n)) for n in (1, 2))
    per_layer = 2 * (two - one) + kv_bytes(dataclasses.replace(LLAMA_8B, num_layers=1), capacity)
    fixed = 2 * (one - (two - one)) + 2 * 2**30
    return max(0, min(LLAMA_8B.num_layers, int((0.85 * mem - fixed) // per_layer)))


def check_step(rep, copy_bw: dict[int, float]) -> None:
    from lsjax.cache import KVCache
    from lsjax.engine.verify import tree_forward
    from lsjax.models import target
    from lsjax.tree import TreeConfig, chain_parents, make_tree, root_only

    cfg = rep.config
    sizes = sorted(set(cfg.step_sizes) | {1})
    capacity = -(-(max(cfg.contexts) + max(sizes)) // 512) * 512
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
    e3 = _eagle3_step(config, capacity)
    for ctx in cfg.contexts:
        if rep.over_budget("step", f"context {ctx}"):
            return
        cache = KVCache(cache.k, cache.v, jnp.array([ctx], jnp.int32))
        times: dict[int, list[float]] = {T: [] for T in sizes}
        try:
            for T in sizes:
                jax.block_until_ready(fwd(params, trees[T], cache))  # compiles once per size
            e3_args = e3.args(ctx)
            jax.block_until_ready(e3.fn(params, cache, *e3_args))
            times["eagle3"] = []
            for _ in range(repeats):  # interleaved: machine noise hits every size alike
                for T in sizes:
                    t = time.perf_counter()
                    jax.block_until_ready(fwd(params, trees[T], cache))
                    times[T].append(time.perf_counter() - t)
                t = time.perf_counter()
                jax.block_until_ready(e3.fn(params, cache, *e3_args))
                times["eagle3"].append(time.perf_counter() - t)
        except Exception as e:  # noqa: BLE001
            rep.skip("step", f"context {ctx}: {device_kernels.first_line(e)}")
            continue
        ar = float(np.median(times[1]))
        # bw counts a copy's reads and writes alike: the rate HBM moves bytes, which a pure read runs at too.
        read = (weight_bytes(config) + kv_bytes(config, ctx)) / bw
        ratios = {T: float(np.median(times[T])) / ar for T in sizes}
        e3_ratio = float(np.median(times["eagle3"])) / ar
        rep.row(
            "step",
            dict(
                context=ctx,
                ar_ms=ar * 1e3,
                read_ms=read * 1e3,
                ar_vs_read=ar / read,
                eagle3_vs_ar=e3_ratio,
                vs_ar=ratios,
            ),
            f"{ctx:>6} ctx: 1-node step {ar * 1e3:.2f} ms = {ar / read:.2f}x its read ({read * 1e3:.2f} ms); "
            + " ".join(f"{T}:{r:.2f}x" for T, r in ratios.items())
            + f"; eagle3 step ({e3.what}) {e3_ratio:.2f}x",
        )


@dataclasses.dataclass(frozen=True)
class _E3Step:
    fn: object  # jitted (target params, target cache, *args) -> logits
    args: object  # context -> the draft's params, state and root at that context
    what: str


def _eagle3_step(config: ModelConfig, capacity: int) -> _E3Step:
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
    return _E3Step(jax.jit(fn), args, f"{b.nodes + 1} nodes, depth {b.depth}, top-{b.top_k}")


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
