"""A memory and roofline plan from the compiler, for chips that are not here.

    python -m lsjax.bench.plan --model llama-3.1-8b --mesh model=4 --context 32768 --platform tpu-v5e
    python -m lsjax.bench.plan --model llama-3.1-8b --mesh model=1 --context 32768 --platform gpu-h100
    python -m lsjax.bench.plan --model llama-3.1-8b --platform tpu-v5e --no-decode \
        --train configs/train/llama3.1-8b-stage1-v5e16.yaml --train-mesh data=1,fsdp=16
    ... --json | --markdown

Decoding: the verify step of a tree (`--tree`: a preset such as `paper`, the 69-node tree, widths such as
4,16,16, or a node count T for a chain) and the AR step (one node) of the target over a K/V cache holding
`--context` tokens, the target grouped and split over a ("data", "model") mesh as `lsjax.mesh.place` does.
Training (`--train`): the LongSpec train step of that config over a ("data", "fsdp") mesh (`--train-mesh`, default
the config's own) as `lsjax.sharding.shard_train_step` jits it.

Each step is
* compiled for the mesh's devices, by the platform's own compiler where this host has that platform and
  enough devices, else by XLA's CPU compiler on as many fake CPU devices (the process re-executes itself with
  `--xla_force_host_platform_device_count`): `Compiled.memory_analysis()` gives the per-device argument,
  output and temporary bytes, `Compiled.cost_analysis()` the per-device FLOPs and bytes accessed, and
  `Lowered.cost_analysis()` the same for the whole program before partitioning;
* exported for the real platform (`jax.export`, platforms=("tpu",) or ("cuda",), the Pallas attention for
  that chip, under an abstract mesh of that chip's devices): proof that it lowers there, no numbers;
* counted by hand from the shardings: every leaf's shard shape x its dtype's size, for the weights, the
  K/V cache, the draft, the optimizer state and the batch.

The roofline time of a step is max(bytes / bandwidth, FLOPs / peak) with the chip's numbers (`CHIPS`). Two byte
counts give two times: the bytes the step must read (weights and the filled K/V cache, from the shardings) and the
compiler's `bytes accessed`. The CPU compiler's count is an upper bound: it charges a per-layer slice of the
stacked K/V cache with the whole cache, so at long contexts it lands an order of magnitude above the real traffic
(docs/plan.md shows both counts). XLA's cost analysis counts a loop body once, so the decode plan traces the
prefix attention as one block over the cache (its FLOPs are then all counted); the train step's loops (layers
under `lax.scan`, micro-batches, LM-head chunks) stay loops and its compiler FLOPs are one iteration's, so its
roofline uses the model FLOPs count (6 x trained + 2 x frozen parameters per token) and the whole target read once
per micro-batch (what FSDP gathers onto every chip) instead.

A step FITS when its per-device peak (the compiler's arguments + outputs + temporaries - aliased outputs, plus
the draft for decoding, which the verify step does not take) and the exact sum both stay within the chip's
memory. The CPU compiler's temporaries stand in for the chip's (XLA's TPU and GPU compilers schedule and fuse
differently; the Pallas kernels hold less than the XLA attention the CPU compiles)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from lsjax import attention
from lsjax import mesh as mesh_lib
from lsjax.bench.lowering import DEVICE_PLATFORM, TRITON_CALL, _num_cores
from lsjax.cache import KVCache
from lsjax.config import ConfigError, DraftConfig, MeshConfig, ModelConfig, load_yaml
from lsjax.engine import cache_capacity, prompt_bucket
from lsjax.engine.verify import tree_forward
from lsjax.errors import LsjaxError
from lsjax.models import target
from lsjax.models.layers import unflatten
from lsjax.tree import TREE_PRESETS, TreeConfig, make_tree, parse_tree, root_only

ROOT = Path(__file__).resolve().parents[2]
MODELS_DIR = ROOT / "configs" / "models"
GB = 1e9
DEVICES_FLAG = "--xla_force_host_platform_device_count"
CHILD_ENV = "LSJAX_PLAN_CHILD"


@dataclasses.dataclass(frozen=True)
class Chip:
    """A chip's peak HBM bandwidth (bytes/s), dense bf16 FLOP/s and HBM capacity (bytes), as its vendor
    states them (decimal GB: 16 GB on a v5e, slightly under the 16 GiB the HBM holds, so a plan errs tight)."""

    name: str
    platform: str  # jax.export's: tpu | cuda
    kind: str  # the runtime's device_kind, which the Pallas lowerings read
    bandwidth: float
    flops: float
    memory: float

    def __post_init__(self):
        if self.platform not in DEVICE_PLATFORM:
            raise ValueError(f"Chip.platform must be one of {sorted(DEVICE_PLATFORM)}, got {self.platform!r}")
        for name in ("bandwidth", "flops", "memory"):
            if not getattr(self, name) > 0:
                raise ValueError(f"Chip.{name} must be > 0, got {getattr(self, name)!r}")


# Cloud TPU's v5e and v5p pages (197 / 459 TFLOP/s bf16, 16 GB at 819 GB/s / 95 GB at 2765 GB/s) and the
# H100 SXM datasheet (989 TFLOP/s dense bf16, 80 GB at 3.35 TB/s).
CHIPS = {
    "tpu-v5e": Chip("tpu-v5e", "tpu", "TPU v5 lite", 819 * GB, 197e12, 16 * GB),
    "tpu-v5p": Chip("tpu-v5p", "tpu", "TPU v5p", 2765 * GB, 459e12, 95 * GB),
    "gpu-h100": Chip("gpu-h100", "cuda", "NVIDIA H100 80GB HBM3", 3350 * GB, 989e12, 80 * GB),
}
KERNELS = {"tpu": "pallas:tpu", "cuda": "pallas:cuda"}


class PlanError(LsjaxError, ValueError):
    """Bad input to the plan: one line naming the option and the values that would work."""


def models() -> dict[str, Path]:
    """{name: YAML}: each configs/models file by its stem and by its stem less '-instruct'."""
    out = {}
    for path in sorted(MODELS_DIR.glob("*.yaml")):
        out[path.stem] = path
        out.setdefault(path.stem.removesuffix("-instruct"), path)
    return out


def load_model_config(name: str, layers: int | None = None) -> ModelConfig:
    """A configs/models YAML by name (or a path to one), optionally cut to `layers` layers."""
    known = models()
    path = known.get(name) or (Path(name) if name.endswith((".yaml", ".yml")) and Path(name).is_file() else None)
    if path is None:
        short = sorted(k for k in known if not k.endswith("-instruct"))
        raise PlanError(f"--model: unknown model {name!r}; one of {', '.join(short)} (or a configs/models YAML)")
    config = load_yaml(ModelConfig, path)
    if layers is not None:
        if not 1 <= layers <= config.num_layers:
            raise PlanError(f"--layers: must be in 1..{config.num_layers} for {config.name}, got {layers}")
        config = dataclasses.replace(config, num_layers=layers)
    return config


def parse_tree_arg(text: str) -> TreeConfig:
    """'paper' (any `TREE_PRESETS` name), '4,16,16' (widths), or 'T' (a chain of T nodes, the root included)."""
    if text in TREE_PRESETS:
        return TREE_PRESETS[text]
    if text.isdigit():
        T = int(text)
        if T < 2:
            raise PlanError(f"--tree: a node count must be >= 2 (the AR step, 1 node, is planned anyway), got {T}")
        return TreeConfig((1,) * (T - 1))
    try:
        return parse_tree(text)
    except (ConfigError, ValueError) as e:
        raise PlanError(f"--tree: {text!r} is not a preset ({', '.join(TREE_PRESETS)}), widths or a node count") from e


def parse_train_mesh(text: str) -> MeshConfig:
    sizes = {}
    for part in text.replace(" ", "").split(","):
        name, eq, value = part.partition("=")
        if not eq or name not in ("data", "fsdp") or not value.isdigit() or int(value) < 1:
            raise PlanError(f"--train-mesh: {part!r} is not data=D or fsdp=F with D, F >= 1 (e.g. data=2,fsdp=8)")
        sizes[name] = int(value)
    return MeshConfig(**sizes)


# ------------------------------------------------------------------------------------------------ pieces
def abstract_params(config: ModelConfig) -> dict:
    """The target's stacked params as ShapeDtypeStructs (nothing allocated)."""
    specs = target.param_specs(config)
    return unflatten({p: jax.ShapeDtypeStruct(s.shape, jnp.dtype(s.dtype)) for p, s in specs.items()})


def shard_bytes(tree, shardings) -> int:
    """Bytes one device holds of `tree` under `shardings`: each leaf's shard shape x its dtype's size (the
    largest shard where a dimension splits unevenly)."""
    leaves = jax.tree.leaves(tree)
    shs = jax.tree.leaves(shardings, is_leaf=lambda x: isinstance(x, jax.sharding.Sharding))
    total = 0
    for x, sh in zip(leaves, shs, strict=True):
        total += math.prod(sh.shard_shape(tuple(x.shape))) * jnp.dtype(x.dtype).itemsize
    return int(total)


def tree_of(tree_cfg: TreeConfig, vocab: int, batch: int):
    """A tree of that shape (random tokens; every level's node i hangs from node i mod width of the level
    above): the verify step's cost depends on its shape, not its tokens."""
    offsets = tree_cfg.level_offsets()
    parents = [-1]
    for d, w in enumerate(tree_cfg.widths):
        above = tree_cfg.widths[d - 1] if d else 1
        parents += [offsets[d] + i % above for i in range(w)]
    T = tree_cfg.num_nodes
    toks = np.random.RandomState(T).randint(0, vocab, (batch, T)).astype(np.int32)
    par = np.broadcast_to(np.asarray(parents, np.int32), (batch, T))
    return make_tree(jnp.asarray(toks), jnp.asarray(par), jnp.ones((batch, T), bool), tree_cfg)


def compiler_numbers(lowered, compiled) -> dict:
    mem = compiled.memory_analysis()
    cost = compiled.cost_analysis() or {}
    low = lowered.cost_analysis() or {}
    out = {
        "flops": float(cost.get("flops", 0.0)),
        "bytes_accessed": float(cost.get("bytes accessed", 0.0)),
        "global_flops": float(low.get("flops", 0.0)),
        "global_bytes_accessed": float(low.get("bytes accessed", 0.0)),
    }
    if mem is not None:
        out |= {
            "arguments": int(mem.argument_size_in_bytes),
            "outputs": int(mem.output_size_in_bytes),
            "temporaries": int(mem.temp_size_in_bytes),
            "aliased": int(mem.alias_size_in_bytes),
        }
        out["peak"] = out["arguments"] + out["outputs"] + out["temporaries"] - out["aliased"]
    return out


def compile_step(fn, args, scope=contextlib.nullcontext()) -> tuple[dict, float]:
    t = time.perf_counter()
    with scope:
        lowered = fn.lower(*args)
        compiled = lowered.compile()
    return compiler_numbers(lowered, compiled), time.perf_counter() - t


def export_step(fn, args, chip: Chip, axes: tuple[str, ...], sizes: tuple[int, ...]) -> dict:
    """jax.export of the jitted `fn` for the chip's platform, under an abstract mesh of its devices (what the
    Pallas lowerings read the chip from). {"ok": bool, "seconds", "error"?}."""
    device = jax.sharding.AbstractDevice(
        device_kind=chip.kind, num_cores=_num_cores(chip.platform, chip.kind), platform=DEVICE_PLATFORM[chip.platform]
    )
    auto = (jax.sharding.AxisType.Auto,) * len(axes)
    mesh = jax.sharding.AbstractMesh(sizes, axes, axis_types=auto, abstract_device=device)
    checks = [jax.export.DisabledSafetyCheck.custom_call(TRITON_CALL)] if chip.platform == "cuda" else []
    t = time.perf_counter()
    try:
        with jax.sharding.use_abstract_mesh(mesh):
            exported = jax.export.export(fn, platforms=(chip.platform,), disabled_checks=checks)(*args)
        text = exported.mlir_module()
        calls = text.count("tpu_custom_call") + text.count("xla.gpu.triton")
        return {"ok": True, "seconds": time.perf_counter() - t, "devices": exported.nr_devices, "kernel_calls": calls}
    except Exception as e:  # noqa: BLE001 - the report says what failed instead of stopping the plan
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return {"ok": False, "seconds": time.perf_counter() - t, "error": f"{type(e).__name__}: {first[:300]}"}


@contextlib.contextmanager
def one_block(size: int):
    """The XLA prefix attention as one block over the cache: its loop then runs once, so XLA's cost analysis
    (which counts a loop body once) counts all of its FLOPs and bytes."""
    saved = attention.XLA_BLOCK
    attention.XLA_BLOCK = size
    try:
        yield
    finally:
        attention.XLA_BLOCK = saved


def roofline(chip: Chip, flops: float, read_bytes: float) -> dict:
    t_mem, t_flop = read_bytes / chip.bandwidth, flops / chip.flops
    return {"ms": 1e3 * max(t_mem, t_flop), "memory_ms": 1e3 * t_mem, "compute_ms": 1e3 * t_flop,
            "bound": "memory" if t_mem >= t_flop else "compute"}  # fmt: skip


def compile_devices(chip: Chip, n: int):
    """(devices, compiler name): the chip's own platform where this host has n of them, else n CPU devices."""
    platform = DEVICE_PLATFORM[chip.platform]
    with contextlib.suppress(RuntimeError):
        here = jax.devices(platform)
        if len(here) >= n:
            return here[:n], f"XLA {platform.upper()} ({here[0].device_kind})"
    cpus = jax.devices("cpu")
    if len(cpus) < n:
        raise RuntimeError(f"{n} CPU devices needed, {len(cpus)} here (run without {DEVICES_FLAG} set)")
    return cpus[:n], "XLA CPU (fake devices)"


# ------------------------------------------------------------------------------------------------ decode
def plan_decode(config: ModelConfig, shape: mesh_lib.MeshShape, chip: Chip, *, context: int, tree_cfg: TreeConfig,
                batch: int = 1, new_tokens: int = 1024, export: bool = True) -> dict:  # fmt: skip
    """The verify step of `tree_cfg` and the AR step on `shape`'s mesh: compiler and exact numbers per device."""
    devices, compiler = compile_devices(chip, shape.size)
    mesh = mesh_lib.make(shape, devices)
    mesh_lib.check(config, mesh, batch)
    M = shape.model
    params = jax.eval_shape(lambda p: target.group_for_shards(p, config, M), abstract_params(config))
    p_sh = jax.tree.map(lambda s: NamedSharding(mesh, s), mesh_lib.param_specs(params, mesh),
                        is_leaf=lambda x: isinstance(x, PartitionSpec))  # fmt: skip
    capacity = cache_capacity(prompt_bucket(context), new_tokens)
    cache = jax.eval_shape(lambda: KVCache.zeros(config, batch, capacity))
    rep = NamedSharding(mesh, PartitionSpec())
    kv = NamedSharding(mesh, mesh_lib.cache_spec())
    c_sh = KVCache(kv, kv, rep)
    draft = jax.eval_shape(lambda p: _draft_params(config, p), abstract_params(config))
    d_sh = jax.tree.map(lambda _: rep, draft)
    itemsize = jnp.dtype(config.dtype).itemsize
    kv_per_token = 2 * config.num_layers * config.num_kv_heads * config.head_dim * itemsize
    exact = {
        "weights": shard_bytes(params, p_sh),
        "draft": shard_bytes(draft, d_sh),
        "kv_cache": shard_bytes((cache.k, cache.v), (kv, kv)),
        "kv_read": batch // shape.data * context * kv_per_token // M,  # the filled part: what a step reads
    }
    exact["total"] = exact["weights"] + exact["draft"] + exact["kv_cache"]
    steps = {}
    for name, tcfg in (("verify", tree_cfg), ("ar", None)):
        tree = tree_of(tcfg, config.vocab_size, batch) if tcfg else root_only(jnp.zeros((batch,), jnp.int32))
        t_sh = jax.tree.map(lambda _: rep, tree)
        T = int(tree.tokens.shape[1])

        def step(p, tr, c, backend="auto"):
            return tree_forward(p, config, tr, c, backend=backend)[1]

        fn = jax.jit(step, in_shardings=(p_sh, t_sh, c_sh))
        with one_block(capacity):
            numbers, seconds = compile_step(fn, (params, tree, cache), mesh_lib.scope(mesh))
        numbers["compile_s"] = seconds
        numbers["peak_with_draft"] = numbers.get("peak", 0) + exact["draft"]
        floor = exact["weights"] + exact["kv_read"]
        out = {"nodes": T, "compiler": numbers, "floor_bytes": floor,
               "roofline": roofline(chip, numbers["flops"], floor),
               "roofline_compiler_bytes": roofline(chip, numbers["flops"], numbers["bytes_accessed"])}  # fmt: skip
        if export:

            def chip_step(p, tr, c):
                return step(p, tr, c, KERNELS[chip.platform])

            chip_fn = jax.jit(chip_step, in_shardings=(p_sh, t_sh, c_sh))
            out["export"] = export_step(chip_fn, (params, tree, cache), chip, mesh_lib.AXES, (shape.data, shape.model))
        out["fits"] = max(numbers["peak_with_draft"], exact["total"]) <= chip.memory
        steps[name] = out
    return {"kind": "decode", "model": config.name, "layers": config.num_layers, "mesh": str(shape),
            "devices": shape.size, "chip": chip.name, "compiler": compiler, "context": context,
            "capacity": capacity, "batch": batch, "tree": list(tree_cfg.widths), "exact": exact, "steps": steps,
            "fits": all(s["fits"] for s in steps.values())}  # fmt: skip


def _draft_params(config: ModelConfig, target_params: dict) -> dict:
    from lsjax.methods.longspec.model import init_draft_params

    return init_draft_params(config, DraftConfig(), target_params)


# ------------------------------------------------------------------------------------------------ train
def load_train(path: str, mesh_text: str | None, layers: int | None):
    import yaml

    from lsjax.methods import registry
    from lsjax.methods.longspec.train_config import KIND, LongSpecTrainConfig

    if not Path(path).is_file():
        raise PlanError(f"--train: no such config file {path!r}")
    kind = registry.kind_of(yaml.safe_load(Path(path).read_text()))
    if kind != KIND:
        raise PlanError(f"--train: plans the LongSpec train step; {path} has kind {kind!r}")
    cfg = load_yaml(LongSpecTrainConfig, path)
    if mesh_text:
        cfg = dataclasses.replace(cfg, mesh=parse_train_mesh(mesh_text))
    if cfg.mesh.data < 1 or cfg.mesh.fsdp < 1:
        raise PlanError(f"--train-mesh: {path} leaves mesh.data or mesh.fsdp to the device count (-1); give both")
    n = cfg.mesh.data * cfg.mesh.fsdp
    if cfg.data.batch_size % n:
        ok = [d for d in range(1, cfg.data.batch_size + 1) if cfg.data.batch_size % d == 0]
        raise PlanError(
            f"--train-mesh: data x fsdp = {n} does not divide data.batch_size={cfg.data.batch_size}; "
            f"data x fsdp must be one of {ok}"
        )
    if cfg.target.model is None and not cfg.target.preset:
        raise PlanError(f"--train: {path} names no target.preset (configs/models YAML) for the target's shapes")
    preset = cfg.target.model or load_yaml(ModelConfig, ROOT / cfg.target.preset)
    config = dataclasses.replace(preset, dtype=cfg.target.dtype)
    if layers is not None:
        config = dataclasses.replace(config, num_layers=min(layers, config.num_layers))
    return cfg, config


def plan_train(cfg, config: ModelConfig, chip: Chip, *, export: bool = True) -> dict:
    """The LongSpec train step of `cfg` on its (data, fsdp) mesh: compiler and exact numbers per device."""
    from lsjax import sharding
    from lsjax import train as tr
    from lsjax.methods.longspec import model as draft_lib
    from lsjax.methods.longspec import step as ls_step

    n = cfg.mesh.data * cfg.mesh.fsdp
    devices, compiler = compile_devices(chip, n)
    mesh = sharding.make_mesh(cfg.mesh, devices)
    tp = abstract_params(config)
    dp = jax.eval_shape(lambda t: draft_lib.init_draft_params(config, cfg.draft, t), tp)
    opt = tr.make_optimizer(cfg.optim)
    state = jax.eval_shape(lambda d: tr.init_state(d, opt), dp)
    A, B, T = cfg.data.grad_accum, cfg.data.batch_size, cfg.data.seq_len
    batch = {
        "tokens": jax.ShapeDtypeStruct((A, B, T), jnp.int32),
        "loss_mask": jax.ShapeDtypeStruct((A, B, T), jnp.float32),
        "offset": jax.ShapeDtypeStruct((A, B), jnp.int32),
    }
    key = jax.ShapeDtypeStruct((2,), jnp.uint32)
    step = ls_step.make_train_step(config, cfg)
    axes = sharding.model_axes(target.Transformer(config), draft_lib.LongSpecDraft(config, cfg.draft))
    jitted, s_sh, t_sh, b_sh = sharding.shard_train_step(step, mesh, state, tp, batch, axes)
    numbers, seconds = compile_step(jitted, (state, tp, batch, key))
    numbers["compile_s"] = seconds
    exact = {
        "target_weights": shard_bytes(tp, t_sh),
        "draft": shard_bytes(state.params, s_sh.params),
        "optimizer": shard_bytes(state.opt_state, s_sh.opt_state),
        "batch": shard_bytes(batch, b_sh),
    }
    exact["total"] = sum(exact.values())
    # Model FLOPs: forward + backward of the draft and the LM head it trains through (6 per parameter per
    # token), forward of the frozen target (2 per parameter per token); attention left out.
    tokens = A * B * T
    draft_n = sum(math.prod(x.shape) for x in jax.tree.leaves(dp))
    target_n = sum(math.prod(x.shape) for x in jax.tree.leaves(tp))
    head_n = config.hidden_size * config.vocab_size
    model_flops = tokens * (6 * (draft_n + head_n) + 2 * target_n) / n
    # FSDP gathers every target layer onto every chip for each micro-batch: A reads of the whole target.
    must_read = A * sum(math.prod(x.shape) * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(tp))
    out = {"kind": "train", "config": cfg.name, "model": config.name, "layers": config.num_layers,
           "mesh": f"data={cfg.mesh.data},fsdp={cfg.mesh.fsdp}", "devices": n, "chip": chip.name,
           "compiler": compiler, "seq_len": T, "batch_size": B, "grad_accum": A, "tokens_per_step": tokens,
           "exact": exact, "step": {"compiler": numbers, "model_flops": model_flops, "floor_bytes": must_read,
                                    "roofline": roofline(chip, model_flops, must_read)}}  # fmt: skip
    if export:
        out["step"]["export"] = export_step(jitted, (state, tp, batch, key), chip, ("data", "fsdp"),
                                            (cfg.mesh.data, cfg.mesh.fsdp))  # fmt: skip
    out["fits"] = max(numbers.get("peak", 0), exact["total"]) <= chip.memory
    return out


# ------------------------------------------------------------------------------------------------ report
def _gb(x) -> str:
    return f"{x / GB:.2f} GB"


def render(plans: list[dict], chip: Chip, markdown: bool = False, note: bool = True) -> str:
    lines = []
    say = lines.append
    for plan in plans:
        head = (f"{plan['kind']}: {plan['model']} ({plan['layers']} layers) on {plan['devices']} x {chip.name} "
                f"({_gb(chip.memory)}, {chip.bandwidth / GB:.0f} GB/s, {chip.flops / 1e12:.0f} TFLOP/s), "
                f"mesh {plan['mesh']}")  # fmt: skip
        if plan["kind"] == "decode":
            head += (f", context {plan['context']} (cache {plan['capacity']} slots), batch {plan['batch']}, "
                     f"tree {plan['tree']} ({plan['steps']['verify']['nodes']} nodes)")  # fmt: skip
        else:
            head += (f", {plan['config']}: batch {plan['batch_size']} x seq {plan['seq_len']} x accum "
                     f"{plan['grad_accum']}")  # fmt: skip
        verdict = "FITS" if plan["fits"] else "DOES NOT FIT"
        say(f"### {head}" if markdown else head)
        say("")
        steps = plan["steps"] if plan["kind"] == "decode" else {"train": plan["step"]}
        exports = [s["export"] for s in steps.values() if "export" in s]
        if not exports:
            lowered = f"not lowered for {chip.platform} (--no-export)"
        elif all(e["ok"] for e in exports):
            lowered = f"every step lowers for {chip.platform} (jax.export, {chip.kind})"
        else:
            lowered = f"a step does NOT lower for {chip.platform}: see below"
        say(f"{verdict} in {_gb(chip.memory)} per chip. Compiled by {plan['compiler']}; {lowered}.")
        say("")
        ex = plan["exact"]
        say("| per chip | exact (shard shapes x dtype) | compiler (memory_analysis) |" if markdown else "per chip:")
        if markdown:
            say("|---|---|---|")
        rows = [(k.replace("_", " "), _gb(v)) for k, v in ex.items() if k not in ("total", "kv_read")]
        rows.append(("total", _gb(ex["total"])))
        comp_rows = {}
        for name, s in steps.items():
            c = s["compiler"]
            comp_rows[name] = (f"{name}: arguments {_gb(c['arguments'])}, outputs {_gb(c['outputs'])}, "
                               f"temporaries {_gb(c['temporaries'])}, peak {_gb(c['peak'])}"
                               + (f" (+ draft {_gb(c['peak_with_draft'] - c['peak'])})" if "peak_with_draft" in c
                                  else ""))  # fmt: skip
        comp = list(comp_rows.values())
        for i, (k, v) in enumerate(rows):
            right = comp[i] if i < len(comp) else ""
            say(f"| {k} | {v} | {right} |" if markdown else f"  {k:<16} {v:>10}   {right}")
        say("")
        if markdown:
            say(
                "| step | FLOPs per chip (compiler) | bytes per chip: must read / compiler's | roofline ms "
                "(must-read bytes) | roofline ms (compiler's bytes) | compile s | lowers for " + chip.platform + " |"
            )
            say("|---|---|---|---|---|---|---|")
        for name, s in steps.items():
            c = s["compiler"]
            exp = s.get("export")
            lowers = "not tried" if exp is None else ("yes" if exp["ok"] else f"NO: {exp['error']}")
            if plan["kind"] == "decode":
                r, rc = s["roofline"], s["roofline_compiler_bytes"]
                must = _gb(s["floor_bytes"])
                flops = f"{c['flops'] / 1e12:.3f} T"
                r1, r2 = f"{r['ms']:.2f} ({r['bound']})", f"{rc['ms']:.2f} ({rc['bound']})"
            else:
                r = s["roofline"]
                must = _gb(s["floor_bytes"])
                flops = f"{s['model_flops'] / 1e12:.1f} T model ({c['flops'] / 1e12:.1f} T compiler, loops once)"
                r1, r2 = f"{r['ms']:.0f} ({r['bound']})", "- (loops counted once)"
            label = f"{name} ({s['nodes']} nodes)" if "nodes" in s else name
            if markdown:
                say(f"| {label} | {flops} | {must} / {_gb(c['bytes_accessed'])} | {r1} | {r2} | "
                    f"{c['compile_s']:.0f} | {lowers} |")  # fmt: skip
            else:
                say(f"  {label}: FLOPs {flops}; bytes must read {must}, compiler's {_gb(c['bytes_accessed'])}; "
                    f"roofline {r1} ms (must-read) / {r2} ms (compiler's bytes); compiled in "
                    f"{c['compile_s']:.0f} s; lowers for {chip.platform}: {lowers}")  # fmt: skip
        say("")
    if note:
        say(NOTE_MD if markdown else NOTE)
    return "\n".join(lines)


# docs/plan.md (`make plan`): the configs of docs/kernels.md's roofline and the Llama-3.1-8B training configs.
DOC_RUNS = (
    ("Decoding on a TPU v5e-4", "--platform tpu-v5e --mesh model=4 --context 32768"),
    ("Decoding on one H100", "--platform gpu-h100 --mesh model=1 --context 32768"),
    ("LongSpec stage-1 training on a TPU v5e-16",
     "--platform tpu-v5e --no-decode --train configs/train/llama3.1-8b-stage1-v5e16.yaml"),
    ("LongSpec stage-1 training on a TPU v5p-8 (4 chips)",
     "--platform tpu-v5p --no-decode --train configs/train/llama3.1-8b-stage1-v5p8.yaml"),
    ("For comparison: the paper's stage-1 config as it is, on a TPU v5e-16",
     "--platform tpu-v5e --no-decode --no-export --train configs/train/llama3.1-8b-stage1-short.yaml "
     "--train-mesh data=1,fsdp=16"),
)  # fmt: skip


def _summary_row(title: str, plan: dict) -> str:
    if plan["kind"] == "decode":
        steps = plan["steps"]
        peak = max(s["compiler"]["peak_with_draft"] for s in steps.values())
        ms = f"verify {steps['verify']['roofline']['ms']:.2f} ms, AR {steps['ar']['roofline']['ms']:.2f} ms"
    else:
        peak = plan["step"]["compiler"]["peak"]
        ms = f"step {plan['step']['roofline']['ms'] / 1e3:.1f} s"
    verdict = "**fits**" if plan["fits"] else "**does not fit**"
    return (f"| {title} | {plan['devices']} x {plan['chip']} | {verdict} | {_gb(peak)} | {_gb(plan['exact']['total'])} "
            f"| {ms} |")  # fmt: skip


def _header_comment(path: str) -> list[str]:
    """The leading comment lines of a YAML file, without their '#'."""
    lines = []
    for line in (ROOT / path).read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    return lines


def doc(results: list[tuple[str, str, list[dict], Chip]], seconds: float) -> str:
    out = [
        "# The plan: Llama-3.1-8B per chip, from the compiler",
        "",
        "Generated by `make plan` (`python -m lsjax.bench.plan --doc > docs/plan.md`) on a CPU host with JAX "
        f"{jax.__version__}, in {seconds:.0f} s; each section's command reproduces it alone. What the numbers are "
        "and where they come from: `lsjax/bench/plan.py`'s docstring and the note at the end.",
        "",
        "| config | chips | fits | per-chip peak (compiler) | per-chip exact (weights, cache, draft, optimizer) "
        "| roofline |",
        "|---|---|---|---|---|---|",
    ]
    out += [_summary_row(title, p) for title, _, plans, _ in results for p in plans]
    out += [
        "",
        "The decode plans stand for `python decode.py --model DIR --method longspec --draft DIR --tree paper --dtype "
        "bf16 --mesh model=4 --prompt-file FILE` on a v5e-4 (`--mesh model=1` on an H100), with a prompt of up to "
        "32K tokens and the default 256 new tokens (the plan leaves room for 1024). The train configs are the "
        "paper's stage 1 (`configs/train/llama3.1-8b-stage1-short.yaml`, batch 256 x 2048 tokens on 8 GPUs) "
        "resized for the slice; each YAML's header, quoted in its section, says what changed and why.",
        "",
    ]
    for title, cmd, plans, chip in results:
        out += [f"## {title}", "", f"    python -m lsjax.bench.plan {cmd}", ""]
        for p in plans:
            if p["kind"] == "train":
                out += [f"> {line}" for line in _header_comment(cmd.split("--train ")[1].split()[0])] + [""]
        out.append(render(plans, chip, True, False))
    out.append(NOTE_MD)
    return "\n".join(out)


NOTE = (
    "FLOPs, bytes accessed and the memory_analysis columns come from the compiler named above on that mesh of "
    "devices (per device); the exact columns from the shardings. The CPU compiler runs the XLA attention where "
    "the chip runs the Pallas kernels, and its bytes accessed charge each layer's slice of the cache with the "
    "whole cache (an upper bound). jax.export for the chip only proves the step lowers there: it gives no "
    "numbers. XLA CPU's temporaries stand in for the chip's (its AR step's are about twice the bf16 weights it "
    "holds, as if it made fp32 copies for its matrix-vector products). Train: XLA counts a loop body once, so the "
    "roofline uses the model FLOPs (6 per trained and 2 per frozen parameter per token) and the whole target "
    "read once per micro-batch (FSDP gathers it)."
)
NOTE_MD = "_" + NOTE + "_\n"


# ------------------------------------------------------------------------------------------------ CLI
class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, status 2, as decode.py and train.py fail on bad input
        raise PlanError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m lsjax.bench.plan", description=__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--model", default="llama-3.1-8b", help="a configs/models name (or YAML path)")
    p.add_argument("--platform", default="tpu-v5e", help=f"one of {', '.join(CHIPS)}")
    p.add_argument("--mesh", default="model=1", help="decode mesh: model=M[,data=D]")
    p.add_argument("--context", type=int, default=32768, help="committed tokens in the K/V cache")
    p.add_argument("--new-tokens", type=int, default=1024, help="generation room in the cache (decode.py's rule)")
    p.add_argument("--batch", type=int, default=1, help="prompt rows")
    p.add_argument("--tree", default="paper", help="verify tree: a preset, widths (4,16,16) or a node count T")
    p.add_argument("--layers", type=int, default=None, help="plan only the first N layers (quick checks, tests)")
    p.add_argument("--train", default=None, help="a configs/train YAML: plan its LongSpec train step too")
    p.add_argument("--train-mesh", default=None, help="data=D,fsdp=F (default: the config's mesh)")
    p.add_argument("--no-decode", action="store_true", help="plan only the train step")
    p.add_argument("--no-export", action="store_true", help="skip lowering for the chip's platform")
    p.add_argument("--json", action="store_true", help="one JSON object")
    p.add_argument("--markdown", action="store_true", help="Markdown")
    p.add_argument("--doc", action="store_true", help="docs/plan.md: every config of DOC_RUNS (other flags ignored)")
    return p


def _checked(args) -> tuple[Chip, ModelConfig, mesh_lib.MeshShape | None, TreeConfig, tuple | None]:
    """Everything the plan needs, validated before any compile (PlanError / MeshError / ConfigError)."""
    if args.platform not in CHIPS:
        raise PlanError(f"--platform: unknown {args.platform!r}; one of {', '.join(CHIPS)}")
    chip = CHIPS[args.platform]
    config = load_model_config(args.model, args.layers)
    for name in ("context", "batch", "new_tokens"):
        if getattr(args, name) < 1:
            raise PlanError(f"--{name.replace('_', '-')}: must be >= 1, got {getattr(args, name)}")
    if args.context > config.max_position:
        raise PlanError(f"--context: {config.name} takes at most {config.max_position} tokens, got {args.context}")
    shape = None
    if not args.no_decode:
        shape = mesh_lib.MeshShape.parse(args.mesh)
        abstract = jax.sharding.AbstractMesh((shape.data, shape.model), mesh_lib.AXES)
        mesh_lib.check(config, abstract, args.batch)
    train = load_train(args.train, args.train_mesh, args.layers) if args.train else None
    if args.no_decode and train is None:
        raise PlanError("--no-decode: needs --train CONFIG (nothing else to plan)")
    return chip, config, shape, parse_tree_arg(args.tree), train


def _devices_needed(shape, train) -> int:
    return max(shape.size if shape else 1, train[0].mesh.data * train[0].mesh.fsdp if train else 1)


def _reexec(argv: list[str], n: int) -> int:
    """This command again in a process with n fake CPU devices (the flag must precede jax's start)."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {DEVICES_FLAG}={n}".strip()
    env[CHILD_ENV] = "1"
    return subprocess.run([sys.executable, "-m", "lsjax.bench.plan", *argv], env=env).returncode


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)
        runs = [(t, c, build_parser().parse_args(c.split())) for t, c in DOC_RUNS] if args.doc else [("", "", args)]
        checked = [(t, c, a, _checked(a)) for t, c, a in runs]
    except (LsjaxError, ValueError) as e:
        print(f"plan: {e}".splitlines()[0], file=sys.stderr)
        return 2
    n = max(_devices_needed(ch[2], ch[4]) for *_, ch in checked)
    chip = checked[0][3][0]
    has_chip = False
    with contextlib.suppress(RuntimeError):
        has_chip = len(jax.devices(DEVICE_PLATFORM[chip.platform])) >= n
    if not has_chip and len(jax.devices("cpu")) < n:
        if os.environ.get(CHILD_ENV):
            print(f"plan: {n} devices needed, {len(jax.devices('cpu'))} here", file=sys.stderr)
            return 2
        return _reexec(argv, n)
    t0 = time.perf_counter()
    results = []
    for title, cmd, a, (chip, config, shape, tree_cfg, train) in checked:
        plans = []
        if shape is not None:
            plans.append(plan_decode(config, shape, chip, context=a.context, tree_cfg=tree_cfg, batch=a.batch,
                                     new_tokens=a.new_tokens, export=not a.no_export))  # fmt: skip
        if train is not None:
            plans.append(plan_train(*train, chip, export=not a.no_export))
        results.append((title, cmd, plans, chip))
    if args.doc:
        print(doc(results, time.perf_counter() - t0))
    elif args.json:
        print(json.dumps({"chip": dataclasses.asdict(chip), "plans": plans}, indent=1))
    else:
        print(render(plans, chip, markdown=args.markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
