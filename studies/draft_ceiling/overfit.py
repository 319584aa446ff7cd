"""Can the LongSpec draft learn one text? The overfit check of issue 92.

    python -m studies.draft_ceiling.overfit        # dev dialogue/1K-2K, 384 tokens, from the shipped draft
    python -m studies.draft_ceiling.overfit --task code --init target --out runs/draft_ceiling/code-target

The target writes `--new-tokens` greedily after one dev prompt (AR, as `lsjax.bench.draft_accept` does); the
draft is trained on exactly that row with the trainer's own step (`lsjax.methods.longspec.step`: flash-noisy lag
j ~ U{1, ..., gamma - 1}, CE on the continuation + CE on the target's argmax, the loss settings of
`configs/train/smollm2-device.yaml`, the config of the shipped draft's last stage) until its first-level
acceptance on that very text, measured by `draft_accept`'s own teacher-forced function, reaches `--goal`.
The target's features are computed once (the row never changes), so a step costs only the draft.

Then the decode side, on the same text:
- at every root, the drafter's own `propose` (a one-node tree from a decode state: the target cache holding the
  tokens before the root, the draft's ring the W before it) against the training forward at lag 1: the top-1
  child and the largest logit difference;
- a greedy decode of the prompt with the trained draft at one node (`Generator`, what `decode.py` runs): its
  output must be the continuation and its tokens per target forward 1 + the first-level acceptance.

A draft that cannot reach the goal here, or whose decode path disagrees with its training forward, has a bug
between training and drafting. Writes `--out`/log.jsonl (one line per evaluation) and result.json; the train
state is saved at every evaluation, and `--resume` continues from it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pickle
import time
from pathlib import Path

import numpy as np

DEVICE_CONFIG = "configs/train/smollm2-device.yaml"
PAD = 256


def build_config(args, seq_len: int):
    """The trainer's config: the device stage's loss and draft sections, this study's optimiser and row."""
    import yaml

    from lsjax.config import from_dict
    from lsjax.methods.longspec.train_config import LongSpecTrainConfig

    raw = yaml.safe_load(Path(DEVICE_CONFIG).read_text())
    raw["target"] = {"path": "", "dtype": "float32"}
    raw["data"] = {"sources": ["sharegpt"], "seq_len": seq_len, "batch_size": 1, "grad_accum": 1}
    raw["positions"] = {"anchor_offset": False, "max_len": 8192}
    raw["loss"]["distill_on"] = args.distill_on
    raw["optim"] = {
        "lr": args.lr,
        "warmup_steps": 10,
        "total_steps": args.max_steps,
        "min_lr_ratio": 1.0,  # constant after warmup: the step count is not known in advance
        "weight_decay": 0.0,  # memorising one text: nothing to regularise towards
        "clip_norm": 1.0,
    }
    raw["checkpoint"] = {"init_from": ""}
    return from_dict(LongSpecTrainConfig, raw)


def main(argv=None) -> int:
    from lsjax.prompts import BUCKETS, TASKS

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", choices=("dev", "heldout"), default="dev")
    p.add_argument("--task", choices=TASKS, default="dialogue")
    p.add_argument("--bucket", choices=list(BUCKETS), default="1K-2K")
    p.add_argument("--new-tokens", type=int, default=384, help="the continuation the draft learns")
    p.add_argument(
        "--init",
        choices=("shipped", "target"),
        default="shipped",
        help="the shipped draft, or the target's last layer (stage 1's init)",
    )
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--distill-on", choices=("answers", "text"), default="text")
    p.add_argument("--max-steps", type=int, default=600)
    p.add_argument("--eval-every", type=int, default=20)
    p.add_argument("--goal", type=float, default=0.95)
    p.add_argument("--out", default="runs/draft_ceiling/overfit")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--skip-decode", action="store_true", help="train and measure teacher-forced only")
    args = p.parse_args(argv)

    import jax
    import jax.numpy as jnp

    from lsjax import engine
    from lsjax.bench.draft_accept import first_level
    from lsjax.config import GenerateConfig, SamplingConfig
    from lsjax.engine.host import Generator
    from lsjax.engine.types import DraftContext
    from lsjax.loading import load_model
    from lsjax.methods import registry
    from lsjax.methods.longspec import model as draft_lib
    from lsjax.methods.longspec.checkpoint import load_longspec
    from lsjax.methods.longspec.step import make_train_step
    from lsjax.models import target
    from lsjax.models.draft_params import DraftParams
    from lsjax.prompts import encode, load_suite
    from lsjax.train.features import target_features, target_logits
    from lsjax.train.step import init_state, make_optimizer

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = load_model()
    config = model.config
    tp = jax.tree.map(jnp.asarray, model.params)
    prompt = load_suite(model.tokenizer, args.suite, None, 1, [args.task], [args.bucket])[0]
    ids = encode(model.tokenizer, prompt)
    decode_params = jax.tree.map(jnp.asarray, target.prepare_for_decode(model.params, config))
    greedy = GenerateConfig(args.new_tokens, SamplingConfig(temperature=0.0), ignore_eos=True)
    ar = Generator(config, decode_params, *registry.build("ar", model))
    cont = ar.run(ids, greedy, seed=0).tokens[: args.new_tokens]
    seq = ids + cont
    n, new, P = len(seq), len(cont), len(ids)
    T = -(-n // PAD) * PAD
    distinct4 = len({tuple(cont[i : i + 4]) for i in range(new - 3)}) / (new - 3)
    print(f"{prompt.id}: prompt {P} tokens, continuation {new} (distinct 4-grams {distinct4:.2f}), row {T}")

    tokens = np.zeros((1, T), np.int32)
    tokens[0, :n] = seq
    toks = jnp.asarray(tokens)
    pos = jnp.arange(T)[None]
    feats = jax.jit(target_features, static_argnums=1)(tp, config, toks, pos)
    argmax = jnp.argmax(target_logits(tp, config, feats["hidden"], None), axis=-1).astype(jnp.int32)  # [1, T]
    # What the training forward of the target calls greedy against what AR decoded: numerics, not the draft.
    agree = float(np.mean(np.asarray(argmax[0, P - 1 : n - 1]) == np.asarray(cont)))
    print(f"the target's teacher-forced argmax equals the decoded continuation at {agree:.4f} of its tokens")

    drafter, shipped = load_longspec(model, None, "1")
    dcfg = drafter.draft
    vocab_ids = shipped.vocab_ids
    outside = float(np.mean(~np.isin(np.asarray(cont), np.asarray(vocab_ids))))
    print(f"continuation tokens outside the draft's {len(vocab_ids)}-token vocabulary: {outside:.4f}")
    cfg = build_config(args, T)
    if args.init == "shipped":
        weights = {k: jnp.asarray(v, jnp.float32) for k, v in shipped.weights.items()}
    else:
        weights = draft_lib.init_draft_params(config, cfg.draft, tp)
    optimizer = make_optimizer(cfg.optim)
    state = init_state(weights, optimizer)
    ckpt = out / "state.pkl"
    if args.resume and ckpt.exists():
        leaves = pickle.loads(ckpt.read_bytes())
        state = jax.tree.unflatten(jax.tree.structure(state), [jnp.asarray(x) for x in leaves])
        print(f"resumed at step {int(state.step)}")
    loss_mask = np.zeros((1, T), np.int32)
    loss_mask[0, P:n] = 1  # token t is a training target: the continuation's
    batch = {
        "tokens": toks[None],
        "loss_mask": jnp.asarray(loss_mask)[None],
        "offset": jnp.zeros((1, 1), jnp.int32),
        "target_k": feats["k"][None],
        "target_v": feats["v"][None],
        "target_argmax": argmax[None],
    }
    step = jax.jit(make_train_step(config, cfg, jnp.asarray(vocab_ids)), donate_argnums=0)
    # The target's weights and the row are arguments, not constants folded into the programs.
    measure = jax.jit(
        lambda tp, w, toks: first_level(tp, config, DraftParams(w, vocab_ids), dcfg, toks, new, 0.0, jnp.int32(n))
    )

    # A token outside the pruned vocabulary can never be drafted: the goal is judged on the roots it can.
    inside = np.isin(np.asarray(cont), np.asarray(vocab_ids))

    def evaluate(w) -> dict:
        got = measure(tp, w, toks)
        acc = {k: float(np.mean(np.asarray(got[k]))) for k in ("first", "top2", "chain2", "chain4")}
        return acc | {"first_in_vocab": float(np.mean(np.asarray(got["first"])[inside]))}

    log = open(out / "log.jsonl", "a")  # noqa: SIM115 (written as the run goes)
    key = jax.random.key(int(state.step))
    t0 = time.perf_counter()
    metrics = {}
    acc = evaluate(state.params)
    print(
        f"step {int(state.step):4d}  first {acc['first']:.3f} ({acc['first_in_vocab']:.3f} in vocabulary)", flush=True
    )
    while acc["first_in_vocab"] < args.goal and int(state.step) < args.max_steps:
        for _ in range(args.eval_every):
            key, k = jax.random.split(key)
            state, metrics = step(state, tp, batch, k)
        acc = evaluate(state.params)
        line = {"step": int(state.step), "s": round(time.perf_counter() - t0, 1)} | acc
        line |= {k: round(float(metrics[k]), 4) for k in ("loss", "ce", "distill", "acc", "shift")}
        log.write(json.dumps(line) + "\n")
        log.flush()
        ckpt.write_bytes(pickle.dumps([np.asarray(x) for x in jax.tree.leaves(state)]))
        print(
            f"step {line['step']:4d}  first {acc['first']:.3f} ({acc['first_in_vocab']:.3f} in vocabulary)  "
            f"chain4 {acc['chain4']:.3f}  "
            f"loss {line['loss']:.3f}  train acc {line['acc']:.3f}  ({line['s']:.0f} s)",
            flush=True,
        )
    log.close()
    result = {
        "prompt": prompt.id,
        "prompt_tokens": P,
        "new_tokens": new,
        "distinct_4grams": round(distinct4, 3),
        "target_argmax_agrees": agree,
        "outside_vocab": outside,
        "init": args.init,
        "lr": args.lr,
        "distill_on": args.distill_on,
        "steps": int(state.step),
        "reached_goal": acc["first_in_vocab"] >= args.goal,
        "teacher_forced": acc,
    }
    weights = state.params

    if not args.skip_decode:
        dp = DraftParams(weights, vocab_ids).with_vocab_head(tp, config)
        # Decode side, per root: the state a decode would hold there (target cache [0, m), ring below m).
        two = GenerateConfig(max_new_tokens=2, ignore_eos=True)
        start = jax.jit(
            lambda tp, dp, buf: engine.start(
                tp, dp, config, drafter, two, buf, jnp.array([n], jnp.int32), jax.random.key(0)
            )
        )
        full = start(tp, dp, toks)

        @jax.jit
        def at_root(tp, dp, full, buf, m):
            ctx = DraftContext(tp, dp, config, capacity=full.cache.k.shape[3])
            init = dataclasses.replace(ctx, prompt_tokens=buf, prompt_lengths=m[None])
            st = dataclasses.replace(full, cache=dataclasses.replace(full.cache, lengths=m[None]), root=buf[:, m])
            ring = drafter.init(init, st)
            return drafter.level_logits(ctx, st, ring)[0][0, 0]  # [Vd] the root's logits, as `propose` ranks them

        net = draft_lib.LongSpecDraft(config, dcfg).bind({"params": weights})
        h = jax.jit(lambda tp, k, v: net.forward_train(tp, toks, pos, k, v, jnp.int32(1)))(tp, feats["k"], feats["v"])
        train_logits = np.asarray(net.logits(tp, h[0, P - 1 : n - 1], jnp.asarray(vocab_ids)))  # [new, Vd]
        dec = np.stack([np.asarray(at_root(tp, dp, full, toks, jnp.int32(m))) for m in range(P - 1, n - 1)])
        same_top = float(np.mean(dec.argmax(-1) == train_logits.argmax(-1)))
        dec_first = float(np.mean(np.asarray(vocab_ids)[dec.argmax(-1)] == np.asarray(cont)))
        max_diff = float(np.max(np.abs(dec - train_logits)))
        print(
            f"decode's propose vs the training forward at lag 1, {new} roots: same top-1 at {same_top:.4f}, "
            f"max |logit diff| {max_diff:.2e}; propose's first-level acceptance {dec_first:.3f}"
        )
        spec = Generator(config, decode_params, drafter, dp)
        run = spec.run(ids, greedy, seed=0)
        got = run.tokens[: args.new_tokens]
        tau = (len(got) - 1) / max(run.target_forwards - 1, 1)
        print(f"decode.py's path, one node: output equals AR's {got == cont}, tokens per target forward {tau:.3f}")
        result["decode"] = {
            "propose_same_top1": same_top,
            "propose_max_logit_diff": max_diff,
            "propose_first": dec_first,
            "generator_equals_ar": got == cont,
            "generator_tau_one_node": round(tau, 4),
        }
    (out / "result.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
