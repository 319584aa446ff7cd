"""The draft-at-scale job for one accelerator lease: the target writes its own answers to train-split prompts,
and a draft of any registered training kind (the config's `kind:`; LongSpec by default) trains on them, within
one time budget.

    python -m tools.device.device_job --make-prompts .device/prompts.npz         # here: corpora + tokenizer
    python -m tools.device.device_job --prompts .device/prompts.npz --budget-minutes 9 --out OUT   # on the GPU
    python -m tools.device.device_job --prompts P --config configs/train/eagle3-smollm2.yaml --out OUT
    python -m tools.device.device_job --tiny --out DIR --budget-minutes 0.5      # a CPU: a tiny random target
    python -m tools.device.device_job --tiny --kind eagle3 --out DIR             # the same path for another kind

Phases, each against the one clock: (1) self-distillation (`lsjax.cli.distill.write_answers`, batched and
jitted, half greedy and half sampled at T=1 with min-p 0.1) until `--gen-share` of the budget is used; (2) the
stage of `--config` on those rows, through its kind's trainer (`lsjax.methods.registry`), with the target's
features computed in the step (an accelerator needs no feature cache), checkpointing as it goes and stopping at
the budget less the export margin; (3) the draft exported by its kind's exporter (LongSpec: bf16 safetensors,
well under the 16 MiB a lease returns per file; EAGLE-3 and DFlash: their published layouts) with a `job.json`
of what was done. A run cut short keeps its last checkpoint, and the export says how far it got.

The prompts travel as token ids (`--make-prompts`: uint16, compressed), made from the train split only, so the
GPU machine needs neither the corpora nor a network.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
import zipfile
from pathlib import Path

import jax
import numpy as np

from lsjax.config import ConfigError
from lsjax.errors import LsjaxError
from lsjax.methods import registry

DEFAULT_CONFIG = "configs/train/smollm2-device.yaml"
EXPORT_MARGIN_S = 45.0  # the export and the report after training stops (the draft is small)
PROMPT_FILE_VERSION = 1
TINY_GEN = (4, 8)  # --tiny's prompts per batch and answer tokens: its rows are 64 tokens


@dataclasses.dataclass(frozen=True)
class JobConfig:
    """One run of the job; `budget_minutes` covers all three phases."""

    budget_minutes: float = 9.0
    gen_share: float = 0.35  # of the budget for self-distillation; training gets the rest less the margin
    gen_batch: int = 128  # prompts per generation batch (one jitted program)
    max_new_tokens: int = 384
    seed: int = 0
    # Passes over the prompts while the generation share lasts: the first answers half greedily and half
    # sampled, the second each prompt the other way, later ones sampled with new seeds (what one pass takes on
    # an H200: docs/design/drafts.md).
    max_passes: int = 8
    # Optimizer steps per second that sizes the stage's total_steps to the time left for training, so that the
    # schedule decays over the budget (0: the config's total_steps); the default is an H200's rate at 32K tokens a
    # step on SmolLM2 (docs/design/drafts.md).
    steps_per_s: float = 7.0

    def __post_init__(self):
        if not self.budget_minutes > 0:
            raise ConfigError(f"budget_minutes: must be > 0, got {self.budget_minutes}")
        if not 0 < self.gen_share < 1:
            raise ConfigError(f"gen_share: must be in (0, 1), got {self.gen_share}")
        if not self.steps_per_s >= 0:
            raise ConfigError(f"steps_per_s: must be >= 0 (0 = the config's total_steps), got {self.steps_per_s}")
        for name in ("gen_batch", "max_new_tokens", "max_passes"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ConfigError(f"{name}: must be an int >= 1, got {getattr(self, name)!r}")


# ----------------------------------------------------------------------------------------------- prompts


@dataclasses.dataclass(frozen=True)
class PromptSet:
    ids: tuple[str, ...]  # prompt ids (task:doc:...)
    tasks: tuple[str, ...]
    tokens: tuple[np.ndarray, ...]  # token ids per prompt
    vocab_size: int  # of the tokenizer that encoded them

    @property
    def num_tokens(self) -> int:
        return int(sum(len(t) for t in self.tokens))


def make_prompts(path: str | Path, per_task: int, bucket: str, seed: int = 0, log=print) -> PromptSet:
    """Train-split prompts of every task kind, encoded with the default model's tokenizer, written to `path`."""
    from lsjax.cli.distill import encode, train_prompts
    from lsjax.loading import load_model

    tok = load_model(None).tokenizer
    prompts = train_prompts(tok, per_task, bucket, seed)
    order = np.random.default_rng(seed).permutation(len(prompts))  # every prefix covers all task kinds
    prompts = [prompts[i] for i in order]
    ps = PromptSet(
        tuple(p.id for p in prompts),
        tuple(p.task for p in prompts),
        tuple(np.asarray(encode(tok, p), np.int64) for p in prompts),
        int(tok.vocab_size),
    )
    write_prompts(path, ps)
    log(f"device job: {len(ps.ids)} prompts, {ps.num_tokens} tokens -> {path} ({Path(path).stat().st_size} bytes)")
    return ps


def write_prompts(path: str | Path, ps: PromptSet) -> None:
    lengths = np.array([len(t) for t in ps.tokens], np.int64)
    flat = np.concatenate(ps.tokens) if ps.tokens else np.zeros(0, np.int64)
    dtype = np.uint16 if ps.vocab_size <= 1 << 16 else np.int32
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez_compressed(
        tmp,
        version=np.int64(PROMPT_FILE_VERSION),
        tokens=flat.astype(dtype),
        offsets=np.concatenate([[0], np.cumsum(lengths)]),
        ids=np.array(ps.ids),
        tasks=np.array(ps.tasks),
        vocab_size=np.int64(ps.vocab_size),
    )
    tmp.replace(path)


def read_prompts(path: str | Path) -> PromptSet:
    """The prompt file, checked whole: one LsjaxError line for a missing, truncated or inconsistent file."""
    path = Path(path)
    if not path.is_file():
        raise LsjaxError(f"prompts file not found: {path} (python -m tools.device.device_job --make-prompts builds it)")
    try:
        with np.load(path) as z:
            if int(z["version"]) != PROMPT_FILE_VERSION:
                raise LsjaxError(f"prompts file {path}: version {int(z['version'])}, expected {PROMPT_FILE_VERSION}")
            flat, offsets = z["tokens"].astype(np.int64), z["offsets"]
            ids, tasks, vocab = tuple(z["ids"].tolist()), tuple(z["tasks"].tolist()), int(z["vocab_size"])
    except LsjaxError:
        raise
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
        raise LsjaxError(f"prompts file {path} is damaged or truncated ({type(e).__name__}: {e})") from None
    if len(offsets) != len(ids) + 1 or offsets[-1] != len(flat) or len(tasks) != len(ids):
        raise LsjaxError(f"prompts file {path}: its index does not match its tokens (truncated?)")
    if len(flat) and int(flat.max()) >= vocab:
        raise LsjaxError(f"prompts file {path}: token ids reach {int(flat.max())}, past its vocabulary of {vocab}")
    tokens = tuple(flat[a:b] for a, b in zip(offsets[:-1], offsets[1:], strict=True))
    return PromptSet(ids, tasks, tokens, vocab)


def tiny_prompts(vocab: int, n: int, length: int, seed: int = 0) -> PromptSet:
    """Looping random prompts for the tiny target (the CPU test mode)."""
    rng = np.random.default_rng(seed)
    tokens = tuple(np.resize(rng.integers(3, vocab, rng.integers(4, 12)), length).astype(np.int64) for _ in range(n))
    return PromptSet(tuple(f"tiny:{i}" for i in range(n)), ("tiny",) * n, tokens, vocab)


# ------------------------------------------------------------------------------------------------- the job


TINY_MODEL = {
    "vocab_size": 128, "hidden_size": 32, "intermediate_size": 64, "num_layers": 2, "num_heads": 4,
    "num_kv_heads": 2, "head_dim": 8, "max_position": 512, "name": "tiny", "eos_token_ids": [2], "pad_token_id": 0,
}  # fmt: skip
# Each kind's own sections at the tiny target's size. LongSpec's keeps the device stage's loss
# (configs/train/smollm2-device.yaml), so the dry run takes the path the GPU will.
TINY_SECTIONS = {
    "longspec": {
        "draft": {"window": 16},
        "positions": {"anchor_offset": False},
        "loss": {"distill": "argmax", "distill_weight": 1.0, "distill_on": "text", "chunk_size": 32},
    },
    "dflash": {"draft": {"num_layers": 1, "block_size": 4}, "loss": {"num_anchors": 8, "chunk_blocks": 8}},
    "eagle3": {"draft": {"aux_layers": [1, 1, 0], "draft_vocab_size": 64}, "loss": {"ttt_steps": 3, "chunk_size": 32}},
}


def tiny_train_config(out: Path, kind: str = "longspec"):
    """The tiny target and a stage of `kind` sized for seconds on a CPU."""
    from lsjax.config import from_dict

    if kind not in TINY_SECTIONS:
        raise ConfigError(f"--kind: no tiny stage for kind {kind!r}; choose from {', '.join(TINY_SECTIONS)}")
    raw = {
        "kind": kind,
        "name": "device-job-tiny",
        "run_dir": str(out / "run"),
        "target": {"model": TINY_MODEL, "random_init": True},
        "data": {"sources": ["synthetic"], "seq_len": 64, "batch_size": 4},
        "optim": {"lr": 1e-3, "warmup_steps": 2, "total_steps": 100000},
        "checkpoint": {"every": 20, "keep": 2},
        "log": {"every": 10, "eval_every": 0, "progress": False},
    } | TINY_SECTIONS[kind]
    return from_dict(registry.get_kind(kind).config_class, raw)


def load_config(path: str, overrides: list[str]):
    """The stage's config from its YAML, as the class of the kind it names (LongSpec's when it names none)."""
    import yaml

    from lsjax.config import apply_overrides, from_dict

    if not Path(path).is_file():
        raise ConfigError(f"--config: {path}: no such file")
    raw = yaml.safe_load(Path(path).read_text()) or {}
    apply_overrides(raw, overrides)
    return from_dict(registry.get_kind(registry.kind_of(raw)).config_class, raw)


def sized_schedule(optim, seconds: float, steps_per_s: float):
    """`optim` with total_steps what `seconds` of training reach at `steps_per_s` (warmup kept below it)."""
    total = max(2, int(seconds * steps_per_s))
    return dataclasses.replace(optim, total_steps=total, warmup_steps=min(optim.warmup_steps, total - 1))


def run(
    cfg,
    job: JobConfig,
    prompts: PromptSet | None,
    out: str | Path,
    *,
    tiny: bool = False,
    log=print,
    config_path: str | None = None,
) -> dict:
    """The three phases (module docstring) against one clock started now; returns what `job.json` holds.
    `config_path` (the stage's YAML) goes into the draft's config.json after the lineage of the draft it
    continues."""
    from lsjax.cli.distill import write_answers
    from lsjax.train import inputs

    t0 = time.monotonic()
    deadline = t0 + job.budget_minutes * 60
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    distilled = out / "distilled"
    seq_len = cfg.data.seq_len
    config, target_params, _ = inputs.load_target(cfg)
    if prompts is None:
        prompts = tiny_prompts(config.vocab_size, 3 * job.gen_batch, seq_len // 2, job.seed)
    if prompts.vocab_size > config.vocab_size:
        raise LsjaxError(
            f"prompts: encoded for a vocabulary of {prompts.vocab_size}, the target has {config.vocab_size}"
        )
    report: dict = {
        "budget_minutes": job.budget_minutes,
        "device": f"{jax.devices()[0].device_kind} ({jax.default_backend()})",
        "prompts": len(prompts.ids),
        "seq_len": seq_len,
    }

    # 1. the target's own answers, until the generation share of the budget is used
    gen_end = t0 + job.budget_minutes * 60 * job.gen_share
    light = [_Named(i, t) for i, t in zip(prompts.ids, prompts.tasks, strict=True)]
    passes = 0
    while passes < job.max_passes and (passes == 0 or time.monotonic() < gen_end):
        write_answers(
            distilled / f"pass-{passes:02d}" if passes else distilled,
            target_params,
            config,
            None,
            light,
            seq_len=seq_len,
            max_new_tokens=job.max_new_tokens,
            batch_size=job.gen_batch,
            seed=job.seed + passes,
            log=log,
            token_ids=prompts.tokens,
            deadline=gen_end,
            parity=passes % 2,
            sampled_only=passes >= 2,
        )
        passes += 1
    from lsjax.train.data import load_distilled

    try:
        rows, mask = load_distilled(distilled)
    except LsjaxError:
        raise LsjaxError(
            f"device job: no batch of answers finished within {job.gen_share:.0%} of {job.budget_minutes} min; "
            "give a larger --budget-minutes or a smaller --gen-batch"
        ) from None
    report |= {
        "passes": passes,
        "distilled_rows": int(len(rows)),
        "answer_tokens": int(mask.sum()),
        "generate_s": round(time.monotonic() - t0, 1),
    }
    log(f"device job: {len(rows)} rows, {int(mask.sum())} answer tokens in {report['generate_s']} s")

    # 2. the LongSpec stage on those rows, features in the step, until the budget less the export margin
    margin = min(EXPORT_MARGIN_S, 0.1 * job.budget_minutes * 60)
    left_min = (deadline - time.monotonic() - margin) / 60
    if left_min <= 0.05:
        raise LsjaxError("device job: no time left to train after generating; give a larger --budget-minutes")
    if job.steps_per_s and not tiny:
        cfg = dataclasses.replace(cfg, optim=sized_schedule(cfg.optim, left_min * 60, job.steps_per_s))
        report["total_steps"] = cfg.optim.total_steps
    cfg = dataclasses.replace(
        cfg,
        run_dir=str(out / "run"),
        max_minutes=left_min,
        data=dataclasses.replace(cfg.data, distilled=str(distilled)),
    )
    if hasattr(cfg, "features"):
        cfg = dataclasses.replace(cfg, features=dataclasses.replace(cfg.features, enabled=False, set=""))
    kind = registry.get_kind(getattr(cfg, "kind", None) or registry.default_kind())
    report["kind"] = kind.name

    t1 = time.monotonic()
    summary = kind.fit(cfg, overwrite=True, progress=not tiny, log=log)
    steps = int(summary["steps"])
    tokens_per_step = cfg.data.batch_size * cfg.data.grad_accum * seq_len
    report |= {
        "train_steps": steps,
        "tokens_trained": steps * tokens_per_step,
        "train_s": round(time.monotonic() - t1, 1),
        "train_tokens_per_s": round(float(summary["tokens_per_s"]), 1),
        "final": {k: v for k, v in summary["final"].items() if isinstance(v, int | float)},
    }

    # 3. the draft, exported by its kind (LongSpec's records the job's report in its config.json)
    if kind.name == "longspec":
        from lsjax.methods.longspec.export import export_run

        export_run(cfg, out / "draft", extra={"train_config": config_path, "device_job": dict(report)})
    else:
        kind.export(cfg, out / "draft", config_path=config_path)
    report["draft_bytes"] = sum(f.stat().st_size for f in (out / "draft").iterdir() if f.is_file())
    report["total_s"] = round(time.monotonic() - t0, 1)
    report["within_budget"] = report["total_s"] <= job.budget_minutes * 60
    (out / "job.json").write_text(json.dumps(report, indent=1) + "\n")
    if steps < cfg.num_steps:
        log(f"device job: the budget ended the stage after {steps} of its {cfg.num_steps} steps; exported those")
    log(
        f"device job: {steps} steps, {report['tokens_trained']} tokens trained, draft in {out / 'draft'} "
        f"({report['draft_bytes']} bytes), {report['total_s']} s of {job.budget_minutes * 60:.0f}"
    )
    return report


@dataclasses.dataclass(frozen=True)
class _Named:  # what write_answers' manifest records of a prompt
    id: str
    task: str
    meta: dict = dataclasses.field(default_factory=dict)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.device.device_job", description=__doc__.split("\n")[0])
    p.add_argument("--make-prompts", metavar="FILE", help="build the prompt file here (corpora + tokenizer) and stop")
    p.add_argument("--per-task", type=int, default=600, help="--make-prompts: prompts per task kind")
    p.add_argument("--bucket", default="2K-4K", help="--make-prompts: prompt length bucket (1K-2K, 2K-4K, 4K-7K)")
    p.add_argument("--prompts", metavar="FILE", help="the prompt file (from --make-prompts)")
    p.add_argument("--config", default=DEFAULT_CONFIG, help="the stage to train (a configs/train YAML, any kind)")
    p.add_argument("--kind", default="longspec", help="with --tiny: the training kind of the tiny stage")
    p.add_argument("--set", action="append", default=[], metavar="a.b=value", help="override a field of --config")
    p.add_argument("--out", help="where the distilled rows, the run, the draft and job.json go")
    p.add_argument("--budget-minutes", type=float, default=9.0)
    p.add_argument("--gen-share", type=float, default=0.35)
    p.add_argument("--gen-batch", type=int, help=f"default {JobConfig.gen_batch} ({TINY_GEN[0]} with --tiny)")
    p.add_argument("--max-new-tokens", type=int, help=f"default {JobConfig.max_new_tokens} ({TINY_GEN[1]} with --tiny)")
    p.add_argument("--max-passes", type=int, default=JobConfig.max_passes, help="passes over the prompts at most")
    p.add_argument(
        "--steps-per-s",
        type=float,
        default=JobConfig.steps_per_s,
        help="sizes total_steps to the time left for training (0: the config's)",
    )
    p.add_argument("--tiny", action="store_true", help="a tiny random target and prompts (runs anywhere, seconds)")
    p.add_argument("--allow-cpu", action="store_true", help="run the real job without an accelerator (slow)")
    args = p.parse_args(argv)

    def fail(msg: str) -> int:
        print(f"device job: error: {msg}", file=sys.stderr)
        return 2

    try:
        if args.make_prompts:
            make_prompts(args.make_prompts, args.per_task, args.bucket)
            return 0
        if not args.out:
            return fail("--out is required")
        gen_batch, max_new = TINY_GEN if args.tiny else (JobConfig.gen_batch, JobConfig.max_new_tokens)
        job = JobConfig(
            args.budget_minutes,
            args.gen_share,
            args.gen_batch or gen_batch,
            args.max_new_tokens or max_new,
            max_passes=args.max_passes,
            steps_per_s=args.steps_per_s,
        )
        if args.tiny:
            cfg, prompts = tiny_train_config(Path(args.out), args.kind), None
        else:
            if not args.prompts:
                return fail("--prompts is required (or --tiny)")
            prompts = read_prompts(args.prompts)  # before the target is loaded: a bad file costs nothing
            if jax.default_backend() == "cpu" and not args.allow_cpu:
                return fail(
                    "no accelerator here (JAX sees only a CPU): the job is sized for a GPU or TPU; "
                    "--tiny runs it end to end on a tiny target, --allow-cpu runs it anyway"
                )
            cfg = load_config(args.config, args.set)
        run(cfg, job, prompts, args.out, tiny=args.tiny, config_path=None if args.tiny else args.config)
    except (LsjaxError, ValueError, OSError) as e:
        return fail(str(e).splitlines()[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
