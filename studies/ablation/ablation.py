"""The paper's training ablations (LongSpec Table 2 / Figure 4) on our setting: three arms, one factor each.

    python -m studies.ablation.ablation              # configs/train/smollm2-ablation.yaml, every arm
    python -m studies.ablation.ablation --resume     # reuse finished (or continue killed) arm runs
    python -m studies.ablation.ablation --arms anchor plain --set steps=100 --eval-len 2048 --out bench_results/abl-100

Every arm trains from the base config (same initialisation, data, steps and seed) in <run_dir>/<arm>
(default runs/ablation/<arm>); arms differ only in:
  anchor    positions.anchor_offset=true,  loss.flash_noisy=true   the reference
  plain     positions.anchor_offset=false, loss.flash_noisy=true   -> what anchor-offset indices buy
  no-noisy  positions.anchor_offset=true,  loss.flash_noisy=false  -> what flash noisy training buys
With the feature cache on, `features.dir` gets a -anchor / -plain suffix: the two anchor arms share a cache.

Metrics, after training:
  by position  each arm's draft on --eval-seqs DEV sequences of --eval-len tokens at plain positions and lag
               j=1 (what inference sees); the target runs once for every arm (cached). Per position bucket:
               CE on the data, and accuracy against the target's argmax (what acceptance needs; a token outside
               a pruned draft vocabulary counts as a miss). `plain` trained on positions < data.seq_len only.
  tau          tokens per target forward and decode tok/s of greedy LongSpec decoding with each arm's exported
               draft (<run_dir>/<arm>/draft) at one --tree, on --tau-prompts DEV code prompts of ~--tau-len
               tokens (lsjax.prompts; dev token sequences when the target has no tokenizer).
Outputs in --out: ablation.json (configs, metrics, wall times, date, command), ablation.md (printed) and
ablation.png (accuracy by position bucket; tau per arm).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import shlex
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CONFIG = ROOT / "configs" / "train" / "smollm2-ablation.yaml"
ARMS = {"anchor": (True, True), "plain": (False, True), "no-noisy": (True, False)}  # (anchor_offset, flash_noisy)


# ----------------------------------------------------------------------------- configs


def load_base(path: str | Path, overrides: list[str]):
    """The base LongSpec training config: the YAML file with `a.b=value` overrides applied."""
    import yaml

    from lsjax.config import apply_overrides, from_dict
    from lsjax.methods.longspec.train_config import LongSpecTrainConfig

    raw = yaml.safe_load(Path(path).read_text()) or {}
    return from_dict(LongSpecTrainConfig, apply_overrides(raw, overrides))


def run_root(base) -> Path:
    return Path(base.run_dir or "runs/ablation")


def arm_config(base, arm: str):
    """The base config with the arm's one factor set, its own name and run dir, and a feature cache per
    position scheme (anchor-offset features are roped at other positions than plain ones)."""
    anchor, noisy = ARMS[arm]
    features = base.features
    if features.enabled:
        scheme = "anchor" if anchor else "plain"
        features = dataclasses.replace(features, dir=f"{features.dir or run_root(base) / 'features'}-{scheme}")
    return dataclasses.replace(
        base,
        name=f"{base.name}-{arm}",
        run_dir=str(run_root(base) / arm),
        positions=dataclasses.replace(base.positions, anchor_offset=anchor),
        loss=dataclasses.replace(base.loss, flash_noisy=noisy),
        features=features,
    )


# ----------------------------------------------------------------------------- data


def dev_sequences(cfg, tokenizer, eos: int, vocab_size: int, seq_len: int, n: int, log=print):
    """n DEV sequences of seq_len tokens, evenly spaced over the packed sources: tokens, mask [n, T]."""
    from lsjax.config import ConfigError
    from lsjax.train import data as data_lib

    d = dataclasses.replace(cfg.data, split="dev", seq_len=seq_len, max_sequences=0)
    seqs, mask = data_lib.load_sequences(d, tokenizer, eos, vocab_size, log=log)
    if len(seqs) == 0:
        raise ConfigError(f"data.sources: the dev split of {', '.join(d.sources)} has no sequence of {seq_len} tokens")
    keep = np.unique(np.linspace(0, len(seqs) - 1, min(n, len(seqs))).round().astype(int))
    return seqs[keep], mask[keep]


def tau_prompts(cfg, tokenizer, eos: int, vocab_size: int, n: int, length: int) -> list[list[int]]:
    """n real DEV code-completion prompts of ~length tokens (lsjax.prompts); without a tokenizer (a
    random target), DEV token sequences of `length` tokens."""
    if tokenizer is None:
        return [row.tolist() for row in dev_sequences(cfg, None, eos, vocab_size, length, n)[0]]
    from lsjax.prompts import encode, stdlib_code_prompt

    return [encode(tokenizer, stdlib_code_prompt(tokenizer, length, seed=i)) for i in range(n)]


# ----------------------------------------------------------------------------- loss by position


def make_position_eval(config, draft_cfg, edges: tuple[int, ...], chunk_size: int):
    """jitted (draft_params, target_params, vocab_ids | None, seq) -> sums per bucket [nb].

    seq: tokens, loss_mask [B, T], target_k, target_v [B, K, T, H] (plain positions), target_argmax [B, T].
    The draft runs once over the whole sequence at lag 1; the LM-head losses run per bucket [lo, hi) of the
    predicting position, in chunks (no [B, T, V] logits).
    """
    import jax
    import jax.numpy as jnp

    from lsjax.methods.longspec import losses as ls_losses
    from lsjax.methods.longspec import model as draft_lib

    def evaluate(draft_params, target_params, vocab_ids, seq):
        tokens = seq["tokens"]
        B, T = tokens.shape
        positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
        hidden = draft_lib.LongSpecDraft(config, draft_cfg).apply(
            {"params": draft_params},
            target_params,
            tokens,
            positions,
            seq["target_k"],
            seq["target_v"],
            jnp.int32(1),
            method="forward_train",
        )  # [B, T, D]
        labels, weights = ls_losses.next_token_targets(tokens, seq["loss_mask"])
        rows = []
        for lo, hi in zip(edges[:-1], edges[1:]):
            w = weights[:, lo:hi]

            def sums(y, lo=lo, hi=hi, w=w):
                return ls_losses.lm_losses(
                    draft_params,
                    target_params,
                    config,
                    hidden[:, lo:hi],
                    y[:, lo:hi],
                    w,
                    chunk_size=chunk_size,
                    vocab_ids=vocab_ids,
                )

            data, target = sums(labels), sums(seq["target_argmax"])
            rows.append(
                {
                    "tokens": jnp.sum(w),
                    "ce": data["ce"],
                    "ce_tokens": data["weight"],
                    "correct": data["correct"],
                    "target_ce": target["ce"],
                    "target_tokens": target["weight"],
                    "target_correct": target["correct"],
                }
            )
        return jax.tree.map(lambda *x: jnp.stack(x), *rows)

    return jax.jit(evaluate)


def _rates(s: dict) -> dict:
    """Sums -> means: CE over in-vocabulary tokens; accuracies over all tokens (out of vocabulary = miss)."""
    n = max(s["tokens"], 1.0)
    return {
        "tokens": int(s["tokens"]),
        "ce": s["ce"] / max(s["ce_tokens"], 1.0),
        "acc": s["correct"] / n,
        "target_ce": s["target_ce"] / max(s["target_tokens"], 1.0),
        "target_acc": s["target_correct"] / n,
        "coverage": s["target_tokens"] / n,  # target argmaxes inside the draft vocabulary
    }


def position_metrics(evaluate, draft_params: dict, target_params, seqs: list[dict], edges) -> dict:
    """{"overall": rates, "buckets": [{"lo", "hi", **rates}]} pooled over the sequences."""
    import jax

    from lsjax.methods.longspec.drafter import split_vocab

    params, vocab_ids = split_vocab(draft_params)
    total = None
    for seq in seqs:
        s = jax.device_get(evaluate(params, target_params, vocab_ids, seq))
        total = s if total is None else jax.tree.map(np.add, total, s)
    total = {k: np.asarray(v, np.float64) for k, v in total.items()}
    buckets = [
        {"lo": lo, "hi": hi, **_rates({k: float(v[i]) for k, v in total.items()})}
        for i, (lo, hi) in enumerate(zip(edges[:-1], edges[1:]))
    ]
    return {"overall": _rates({k: float(v.sum()) for k, v in total.items()}), "buckets": buckets}


# ----------------------------------------------------------------------------- tau


def measure_tau(config, target_params, drafts: dict[str, Path], tree, prompts: list[list[int]], max_new: int, log):
    """Greedy LongSpec decoding of every prompt with every arm's draft: {arm: {"tau", "tokens_per_s", "prompts"}}.

    One Generator serves all arms when their drafts have equal configs: the compiled programs take the draft's
    weights as an argument, so only the weights change between arms. An untimed run of the first prompt
    compiles and warms it up, so no arm's tok/s pays for that.
    """
    import types

    import jax
    import jax.numpy as jnp

    from lsjax.config import GenerateConfig
    from lsjax.engine.host import Generator
    from lsjax.methods import registry

    gen = GenerateConfig(max_new_tokens=max_new, ignore_eos=True)  # equal lengths for every arm
    target = types.SimpleNamespace(config=config, params=target_params, path=None)
    generator, out = None, {}
    for arm, path in drafts.items():
        drafter, params = registry.build("longspec", target, draft=str(path), tree=tree)
        t0, compile_s = time.perf_counter(), 0.0
        if generator is None or generator.drafter != drafter:
            generator = Generator(config, target_params, drafter, params)
            compile_s = generator.run(prompts[0], gen).compile_s
        else:
            generator.draft_params = jax.tree.map(jnp.asarray, params)
        rows = []
        for i, ids in enumerate(prompts):
            r = generator.run(ids, gen)
            rows.append(
                {
                    "prompt_tokens": r.prompt_tokens,
                    "new_tokens": r.new_tokens,
                    "target_forwards": r.target_forwards,
                    "tau": r.mean_accepted,
                    "prefill_s": r.prefill_s,
                    "decode_s": r.decode_s,
                }
            )
            log(f"[ablation] {arm}: prompt {i} ({r.prompt_tokens} tokens): tau {r.mean_accepted:.2f}")
        emitted = sum(r["new_tokens"] - 1 for r in rows)  # the first token comes from prefill
        steps = sum(r["target_forwards"] - 1 for r in rows)
        out[arm] = {
            "tau": emitted / max(steps, 1),
            "tokens_per_s": emitted / max(sum(r["decode_s"] for r in rows), 1e-9),
            "prompts": rows,
            "compile_s": compile_s,
            "wall_s": time.perf_counter() - t0,
        }
    return out


# ----------------------------------------------------------------------------- report


def _bucket_name(b: dict) -> str:
    return f"[{b['lo']}, {b['hi']})"


def markdown(result: dict) -> str:
    m, arms = result["meta"], result["arms"]
    ev, tau = m["eval"], m["tau"]
    lines = [
        "## Draft training ablations (LongSpec Table 2 / Figure 4)",
        "",
        f"{m['date']}; {m['steps']} steps per arm from `{m['config']}`; by position: {ev['sequences']} dev sequences "
        f"of {ev['seq_len']} tokens at plain positions, lag 1; tau: tree `{tau['tree']}`, {tau['prompts']} dev "
        f"prompts of ~{tau['prompt_tokens']} tokens, {tau['max_new_tokens']} new tokens, greedy.",
        "",
        "| arm | anchor-offset | flash noisy | train loss | dev CE | dev acc | dev acc vs target | tau | tok/s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def f(v, spec=".3f"):
        return "-" if v is None else format(v, spec)

    for name, a in arms.items():
        o, t = a["position"]["overall"], a.get("tau") or {}
        yes = {True: "yes", False: "no"}
        lines.append(
            f"| {name} | {yes[a['anchor_offset']]} | {yes[a['flash_noisy']]} | {f(a['train'].get('final_loss'))} "
            f"| {f(o['ce'])} | {f(o['acc'])} | {f(o['target_acc'])} | {f(t.get('tau'), '.2f')} "
            f"| {f(t.get('tokens_per_s'), '.1f')} |"
        )
    buckets = next(iter(arms.values()))["position"]["buckets"]
    lines += [
        "",
        "Accuracy against the target's argmax by position (dev, plain positions, lag 1):",
        "",
        "| arm | " + " | ".join(_bucket_name(b) for b in buckets) + " | all |",
        "|---|" + "---|" * (len(buckets) + 1),
    ]
    for name, a in arms.items():
        p = a["position"]
        lines.append(
            f"| {name} | "
            + " | ".join(f(b["target_acc"]) for b in p["buckets"])
            + f" | {f(p['overall']['target_acc'])} |"
        )
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = result["arms"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4), gridspec_kw={"width_ratios": [3, 2]})
    for name, a in arms.items():
        b = a["position"]["buckets"]
        left.plot(range(len(b)), [x["target_acc"] for x in b], "o-", label=name)
    buckets = next(iter(arms.values()))["position"]["buckets"]
    left.set_xticks(range(len(buckets)), [_bucket_name(b) for b in buckets])
    left.set_xlabel("position")
    left.set_ylabel("draft accuracy vs target argmax")
    left.set_title("by position (dev, plain positions, lag 1)")
    left.grid(alpha=0.3)
    left.legend()
    names = list(arms)
    taus = [(arms[n].get("tau") or {}).get("tau", np.nan) for n in names]
    right.bar(names, taus, color=[f"C{i}" for i in range(len(names))])
    for i, t in enumerate(taus):
        if np.isfinite(t):
            right.text(i, t, f"{t:.2f}", ha="center", va="bottom")
    right.set_ylabel("tau (tokens / target forward)")
    right.set_title(f"greedy decoding, tree {result['meta']['tau']['tree']}")
    right.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ----------------------------------------------------------------------------- the run


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(DEFAULT_CONFIG), help="the base configs/train/*.yaml")
    p.add_argument("--set", action="append", default=[], metavar="a.b=value", help="override a base config field")
    p.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    p.add_argument("--resume", action="store_true", help="continue each arm from its latest checkpoint")
    p.add_argument("--overwrite", action="store_true", help="start every arm afresh, removing its old checkpoints")
    p.add_argument("--out", type=Path, default=Path("bench_results/ablation"))
    p.add_argument("--eval-len", type=int, default=4096, help="tokens per dev sequence for the loss by position")
    p.add_argument("--eval-seqs", type=int, default=4)
    p.add_argument("--buckets", type=int, nargs="+", default=[256, 1024, 2048], help="inner position bucket edges")
    p.add_argument("--tree", default="cpu", help="tree preset or widths for tau (lsjax.tree.TREE_PRESETS)")
    p.add_argument("--tau-prompts", type=int, default=3, help="dev prompts for tau; 0 = no tau")
    p.add_argument("--tau-len", type=int, default=4096, help="tokens per tau prompt (about)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    args = p.parse_args(argv)
    if args.max_new_tokens < 2:
        p.error("--max-new-tokens must be >= 2 (the first token comes from prefill)")
    return args


def run(argv=None) -> dict:
    """Trains the arms, measures them, writes --out; returns the result dict."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)

    from lsjax import train as tr
    from lsjax.bench.run import machine_info
    from lsjax.config import ConfigError, to_dict
    from lsjax.methods.longspec import train as ls_train
    from lsjax.methods.longspec.checkpoint import load_draft
    from lsjax.methods.longspec.export import export_run
    from lsjax.tree import parse_tree

    base = load_base(args.config, args.set)
    tree = parse_tree(args.tree)
    cfgs = {arm: arm_config(base, arm) for arm in args.arms}
    edges = tuple(sorted({0, *(e for e in args.buckets if 0 < e < args.eval_len), args.eval_len}))
    result = {
        "meta": {
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "command": shlex.join(["python", "-m", "studies.ablation.ablation", *argv]),
            "machine": machine_info(),
            "config": str(args.config),
            "overrides": args.set,
            "base": to_dict(base),
            "steps": base.num_steps,
            "eval": {"split": "dev", "seq_len": args.eval_len, "sequences": args.eval_seqs, "lag": 1, "edges": edges},
            "tau": {
                "tree": args.tree,
                "widths": list(tree.widths),
                "prompts": args.tau_prompts,
                "prompt_tokens": args.tau_len,
                "max_new_tokens": args.max_new_tokens,
            },
        },
        "arms": {},
    }

    # --- training: one run per arm
    for arm, cfg in cfgs.items():
        print(
            f"[ablation] {arm}: {cfg.num_steps} steps in {cfg.resolved_run_dir} (anchor_offset="
            f"{cfg.positions.anchor_offset}, flash_noisy={cfg.loss.flash_noisy})",
            flush=True,
        )
        out = ls_train.fit(cfg, resume=args.resume, overwrite=args.overwrite, progress=False, config_dict=to_dict(cfg))
        summary = tr.training_summary(cfg.resolved_run_dir)
        print(f"[ablation] {arm}: trained, loss {summary.get('final_loss')}, {out['wall_s']:.0f} s", flush=True)
        result["arms"][arm] = {
            "anchor_offset": cfg.positions.anchor_offset,
            "flash_noisy": cfg.loss.flash_noisy,
            "run_dir": cfg.resolved_run_dir,
            "config": to_dict(cfg),
            "train": summary,
            "wall_s": {"train": out["wall_s"]},
        }
        del out

    # --- drafts, the target once, dev data
    drafts = {arm: Path(cfg.resolved_run_dir) / "draft" for arm, cfg in cfgs.items()}
    for arm, cfg in cfgs.items():
        export_run(cfg, drafts[arm], tree=tree, extra={"ablation_arm": arm})
    config, target_params, tokenizer = tr.load_target(base)
    eos = tr.eos_id(config)
    if args.eval_len > config.max_position:
        raise ConfigError(f"--eval-len: {args.eval_len} is beyond the target's max_position {config.max_position}")
    tokens, mask = dev_sequences(base, tokenizer, eos, config.vocab_size, args.eval_len, args.eval_seqs)
    result["meta"]["eval"]["sequences"] = len(tokens)
    feats = tr.build_feature_cache(  # plain positions: offset 0
        target_params,
        config,
        tokens,
        np.zeros(len(tokens), np.int32),
        run_root(base) / f"eval-features-{args.eval_len}",
        num_anchors=base.positions.num_anchors,
        batch_size=1,
        fingerprint=f"{config.name}:{config.num_layers}:{config.hidden_size}:{base.target.path}",
    )
    seqs = [
        {
            "tokens": tokens[i : i + 1].astype(np.int32),
            "loss_mask": mask[i : i + 1].astype(np.float32),
            **{k: np.asarray(v[i : i + 1]) for k, v in feats.items() if k != "target_hidden"},
        }
        for i in range(len(tokens))
    ]

    # --- loss and accuracy by position
    evaluate = make_position_eval(config, base.draft, edges, max(base.loss.chunk_size, 512))
    for arm in cfgs:
        t0 = time.perf_counter()
        params, _, _ = load_draft(drafts[arm])
        a = result["arms"][arm]
        a["position"] = position_metrics(evaluate, params, target_params, seqs, edges)
        a["wall_s"]["position_eval"] = time.perf_counter() - t0
        o = a["position"]["overall"]
        print(f"[ablation] {arm}: dev CE {o['ce']:.3f}, acc vs target {o['target_acc']:.3f}", flush=True)

    # --- tau
    if args.tau_prompts > 0:
        prompts = tau_prompts(base, tokenizer, eos, config.vocab_size, args.tau_prompts, args.tau_len)
        for arm, t in measure_tau(config, target_params, drafts, tree, prompts, args.max_new_tokens, print).items():
            result["arms"][arm]["wall_s"]["tau"] = t.pop("wall_s")
            result["arms"][arm]["tau"] = t

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ablation.json").write_text(json.dumps(result, indent=1, default=float) + "\n")
    md = markdown(result)
    (args.out / "ablation.md").write_text(md)
    plot(result, args.out / "ablation.png")
    print(md)
    return result


def main(argv=None) -> int:
    from lsjax.errors import LsjaxError
    from lsjax.train import TrainingDiverged

    try:
        run(argv)
    except (LsjaxError, FileNotFoundError) as e:  # configs, arguments, missing models: one line
        print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    except TrainingDiverged as e:
        print(f"error: {e}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
