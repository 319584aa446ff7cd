"""What would one more input or more capacity buy the shipped LongSpec draft? The arms of issue 92, item 1.

    python -m studies.draft_ceiling.arms --stage data      # train-split rows + the target's features, once
    python -m studies.draft_ceiling.arms --stage train     # every arm, the same steps on the same rows (resumable)
    python -m studies.draft_ceiling.arms --stage eval      # dev (and held-out, reported beside) acceptance
    python -m studies.draft_ceiling.arms --stage export    # base, lag1, depth2 as lsjax draft directories

Every arm starts from the shipped draft (SmolLM2-135M-Instruct) and grows it *function-preserving*: each new
weight that writes into the residual stream starts at zero, so at step 0 every arm drafts exactly what the
shipped draft drafts, and after the same steps on the same rows the difference between an arm and the control
(`base`: the shipped draft fine-tuned as it is) is what its extra input or capacity learned. A CPU cannot train
29.5M tokens per arm from scratch; it can fine-tune each arm on the same few hundred thousand, which ranks the
arms and says whether one moves the acceptance at all.

Arms (their weights beside the shipped draft's):
- `base`: none (the control);
- `feature`: EAGLE's feature: the target's final hidden state at the last position the target has verified
  (t - lag, exactly what the cross-attention may read) added after the self-attention through
  `feat_norm` (RMSNorm) and `feat_w` [D, D] (zero). The self-attention's K/V still depend on tokens only, so a
  ring of committed tokens would still serve it;
- `depth2`: a second cross-attention + MLP block (`c2_*`, `m2_*`: copies of the first, output projections zero):
  depth where the draft reads the target, without a second self-attention (whose K/V would then depend on
  the target and break the token-only ring);
- `wide2x`: the MLP twice as wide (`w_gate2`, `w_up2` random, `w_down2` zero);
- `lag1`: the control's weights trained at lag 1 only (gamma 2) instead of j ~ U{1..5}.
And without training (`--stage eval` measures them on the shipped draft): the full 49K vocabulary against the
pruned 8K (the head is the target's tied embedding, so no weight changes), and the window at 256 / 1024.

The loss is the shipped draft's last stage's (`configs/train/smollm2-device.yaml`): CE on the next token + CE on
the target's argmax at every position, at a flash-noisy lag j ~ U{1, ..., gamma - 1}. Rows: plain text of the
train split of `--sources` (the dev prompts come from those sources' dev split; the held-out suite from outside
the project), packed to `--seq-len`, with the target's last-layer K/V, argmax and final hidden state cached once.

Measured like `lsjax.bench.draft_accept` (teacher-forced on the target's own continuations, seed 0; T = 0:
`first`, `chain4`; T = 1: `sampled`), with each arm's forward in place of the draft's. Writes
`--out`/{data,arms/<arm>,continuations-<suite>.json,eval.json}.
"""

from __future__ import annotations

import argparse
import json
import pickle
import time
from pathlib import Path

import numpy as np

ARMS = ("base", "feature", "depth2", "wide2x", "lag1")
PAD = 256
NEW = 96


# ----------------------------------------------------------------------------- the arms' forward


def grow(params: dict, arm: str, config, key) -> dict:
    """The shipped draft's weights plus the arm's, each output projection zero (the same function at step 0)."""
    import jax
    import jax.numpy as jnp

    p = dict(params)
    D, F = config.hidden_size, config.intermediate_size
    if arm == "feature":
        p["feat_norm"] = jnp.ones((D,), jnp.float32)
        p["feat_w"] = jnp.zeros((D, D), jnp.float32)
    elif arm == "depth2":  # copies (jnp.array), not aliases: the train step donates every leaf
        for name in ("cross_norm", "cross_wq", "cross_bq"):
            if name in params:
                p["c2_" + name.split("_", 1)[1]] = jnp.array(params[name])
        p["c2_wo"] = jnp.zeros_like(params["cross_wo"])
        p["m2_norm"], p["m2_gate"], p["m2_up"] = (jnp.array(params[n]) for n in ("mlp_norm", "w_gate", "w_up"))
        p["m2_down"] = jnp.zeros_like(params["w_down"])
    elif arm == "wide2x":
        k1, k2 = jax.random.split(key)
        p["w_gate2"] = 0.02 * jax.random.normal(k1, (D, F), jnp.float32)
        p["w_up2"] = 0.02 * jax.random.normal(k2, (D, F), jnp.float32)
        p["w_down2"] = jnp.zeros((F, D), jnp.float32)
    return p


def arm_forward(p, tp, config, dcfg, tokens, positions, tk, tv, th, shift):
    """hidden [B, T, D] before the final norm; the shipped draft's `draft_forward_train` plus the arm's weights
    present in `p`. th [B, T, D]: the target's final hidden states (read only by `feature`)."""
    import jax.numpy as jnp

    from lsjax.methods.longspec.model import cross_attention_train, self_attention_train
    from lsjax.models.layers import embed, mlp, rms_norm

    eps = config.rms_norm_eps
    x = embed(tp, tokens).astype(jnp.float32)
    x = x + self_attention_train(p, tp, config, dcfg, tokens, positions)
    if "feat_w" in p:  # the target's state at t - shift: the last position its cache holds at lag `shift`
        T = tokens.shape[1]
        src = jnp.arange(T) - shift
        f = jnp.take(th, jnp.maximum(src, 0), axis=1) * (src >= 0)[None, :, None]
        x = x + rms_norm(f, p["feat_norm"], eps) @ p["feat_w"]
    x = x + cross_attention_train(p, config, x, positions, tk, tv, shift)
    h = rms_norm(x, p["mlp_norm"], eps)
    x = x + mlp(p, h)
    if "w_down2" in p:
        x = x + mlp({"w_gate": p["w_gate2"], "w_up": p["w_up2"], "w_down": p["w_down2"]}, h)
    if "c2_wo" in p:
        c2 = {"cross_" + k[3:]: v for k, v in p.items() if k.startswith("c2_")}
        x = x + cross_attention_train(c2, config, x, positions, tk, tv, shift)
        m2 = {"w_gate": p["m2_gate"], "w_up": p["m2_up"], "w_down": p["m2_down"]}
        x = x + mlp(m2, rms_norm(x, p["m2_norm"], eps))
    return x


def head_logits(p, tp, config, hidden, vocab_ids):
    """[..., V or Vd] fp32 logits: the draft's final norm, then the target's (tied) head rows."""
    import jax.numpy as jnp

    from lsjax.methods.longspec.model import draft_logits

    return draft_logits({"final_norm": p["final_norm"]}, tp, config, hidden, vocab_ids).astype(jnp.float32)


# ----------------------------------------------------------------------------- data


def load_target():
    import jax
    import jax.numpy as jnp

    from lsjax.loading import load_model

    model = load_model()
    return model, jax.tree.map(jnp.asarray, model.params)


def stage_data(args, out: Path) -> None:
    from lsjax.train.config import DataConfig
    from lsjax.train.data import load_sequences
    from lsjax.train.features import build_feature_cache
    from lsjax.train.inputs import eos_id

    model, tp = load_target()
    d = DataConfig(sources=tuple(args.sources.split(",")), seq_len=args.seq_len, max_sequences=args.rows, seed=0)
    seqs, mask = load_sequences(d, model.tokenizer, eos_id(model.config), model.config.vocab_size)
    (out / "data").mkdir(parents=True, exist_ok=True)
    np.save(out / "data" / "tokens.npy", seqs)
    print(f"rows: {seqs.shape} ({seqs.size} tokens) from {args.sources}", flush=True)
    build_feature_cache(
        tp,
        model.config,
        seqs,
        np.zeros(len(seqs), np.int32),
        out / "data" / "features",
        batch_size=2,
        with_hidden=True,
    )


# ----------------------------------------------------------------------------- training


def shipped(model):
    from lsjax.methods.longspec.checkpoint import load_longspec

    drafter, dp = load_longspec(model, None, "1")
    return drafter.draft, dp


def stage_train(args, out: Path) -> None:
    import jax
    import jax.numpy as jnp

    from lsjax.methods.longspec.losses import lm_losses, next_token_targets, text_weights
    from lsjax.train.config import OptimConfig
    from lsjax.train.step import apply_grads, init_state, make_optimizer

    model, tp = load_target()
    config = model.config
    dcfg, dp = shipped(model)
    vocab_ids = jnp.asarray(dp.vocab_ids, jnp.int32)
    toks = np.load(out / "data" / "tokens.npy")
    feats = {
        n: np.load(out / "data" / "features" / f"{n}.npy", mmap_mode="r")
        for n in ("target_k", "target_v", "target_argmax", "target_hidden")
    }
    done = json.loads((out / "data" / "features" / "progress.json").read_text())["done"]
    toks = toks[:done]  # the rows whose features are built (the cache fills in order and resumes)
    S, T = toks.shape
    print(f"training on {S} rows of {T} tokens", flush=True)
    B = args.batch
    optim = OptimConfig(lr=args.lr, warmup_steps=10, total_steps=args.steps, min_lr_ratio=0.1, weight_decay=0.0)
    optimizer = make_optimizer(optim)
    ones = jnp.ones((B, T), jnp.float32)

    def loss_fn(p, batch, shift):
        pos = jnp.broadcast_to(jnp.arange(T)[None], (B, T))
        h = arm_forward(p, tp, config, dcfg, batch["tokens"], pos, batch["k"], batch["v"], batch["h"], shift)
        labels, weights = next_token_targets(batch["tokens"], ones)
        sums = lm_losses(
            {"final_norm": p["final_norm"]},
            tp,
            config,
            h,
            labels,
            weights,
            chunk_size=256,
            vocab_ids=vocab_ids,
            distill="argmax",
            target_labels=batch["argmax"],
            distill_weights=text_weights(ones),
        )
        loss = sums["ce"] / jnp.maximum(sums["weight"], 1) + sums["distill"] / jnp.maximum(sums["distill_weight"], 1)
        return loss, sums

    def step(state, batch, shift):
        (loss, sums), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, batch, shift)
        return apply_grads(state, grads, optimizer), {"loss": loss, "acc": sums["correct"] / sums["weight"]}

    step = jax.jit(step, donate_argnums=0)
    for arm in args.arms.split(","):
        d = out / "arms" / arm
        d.mkdir(parents=True, exist_ok=True)
        if (d / "params.pkl").exists() and json.loads((d / "done.json").read_text())["steps"] >= args.steps:
            print(f"{arm}: trained", flush=True)
            continue
        gamma = 2 if arm == "lag1" else 6
        rng = np.random.default_rng(0)  # the same rows and lags for every arm
        order = rng.permutation(np.tile(np.arange(S), -(-args.steps * B // S)))[: args.steps * B]
        shifts = rng.integers(1, gamma, args.steps)
        p0 = grow(jax.tree.map(jnp.array, dict(dp.weights)), arm, config, jax.random.key(1))  # copies: the step donates
        state = init_state(p0, optimizer)
        start = 0
        if (d / "state.pkl").exists():
            start, state = pickle.loads((d / "state.pkl").read_bytes())
            print(f"{arm}: resumed at step {start}", flush=True)
        log = open(d / "log.jsonl", "a")  # noqa: SIM115
        t0 = time.perf_counter()
        for i in range(start, args.steps):
            rows = np.sort(order[i * B : (i + 1) * B])
            batch = {
                "tokens": jnp.asarray(toks[rows]),
                "k": jnp.asarray(feats["target_k"][rows]),
                "v": jnp.asarray(feats["target_v"][rows]),
                "h": jnp.asarray(feats["target_hidden"][rows]),
                "argmax": jnp.asarray(feats["target_argmax"][rows]),
            }
            state, m = step(state, batch, jnp.int32(shifts[i]))
            if (i + 1) % 10 == 0 or i + 1 == args.steps:
                m = {k: float(v) for k, v in m.items()}
                rate = (i + 1 - start) / (time.perf_counter() - t0)
                print(
                    f"{arm} step {i + 1}/{args.steps} loss {m['loss']:.3f} acc {m['acc']:.3f} ({rate:.2f} step/s)",
                    flush=True,
                )
                log.write(json.dumps({"step": i + 1, **m}) + "\n")
                log.flush()
            if (i + 1) % 50 == 0 and i + 1 < args.steps:
                (d / "state.pkl").write_bytes(pickle.dumps((i + 1, jax.device_get(state))))
        (d / "params.pkl").write_bytes(pickle.dumps(jax.device_get(state.params)))
        (d / "done.json").write_text(json.dumps({"steps": args.steps, "batch": B, "seq_len": T, "lr": args.lr}))
        (d / "state.pkl").unlink(missing_ok=True)


# ----------------------------------------------------------------------------- evaluation


def continuations(model, tp, suite: str, out: Path) -> list[dict]:
    """Per prompt of the suite (1K-2K and 2K-4K, as draft_accept) and T in (0, 1): prompt + the target's AR
    continuation of NEW tokens (seed 0), cached."""
    f = out / f"continuations-{suite}.json"
    if f.exists():
        return json.loads(f.read_text())
    import jax
    import jax.numpy as jnp

    from lsjax.config import GenerateConfig, SamplingConfig
    from lsjax.engine.host import Generator
    from lsjax.methods import registry
    from lsjax.models import target
    from lsjax.prompts import encode, load_suite

    ar = Generator(
        model.config,
        jax.tree.map(jnp.asarray, target.prepare_for_decode(model.params, model.config)),
        *registry.build("ar", model),
    )
    rows = []
    for prompt in load_suite(model.tokenizer, suite, None, 1, buckets=("1K-2K", "2K-4K")):
        ids = encode(model.tokenizer, prompt)
        for temp in (0.0, 1.0):
            gen = GenerateConfig(NEW, SamplingConfig(temperature=temp), ignore_eos=True)
            cont = ar.run(ids, gen, seed=0).tokens[:NEW]
            rows.append({"id": prompt.id, "T": temp, "tokens": [int(t) for t in ids + cont]})
            print(f"{suite} {prompt.id} T={temp:g}: {len(ids)} + {len(cont)}", flush=True)
    f.write_text(json.dumps(rows))
    return rows


def measure_fns(config):
    """(features, measure), both jitted, the target's params an argument (a closure would make XLA fold them as
    constants at every compile): features(tp, tokens [1, T]) -> the target's k, v, hidden (once per sequence,
    shared by every variant); measure(tp, params, tokens, length, features, vocab_ids, temperature, dcfg) ->
    per-root keys (draft_accept's: T = 0 `first`, `chain4`; T > 0 `sampled`)."""
    import jax
    import jax.numpy as jnp

    from lsjax.bench.draft_accept import _sampled_keys
    from lsjax.train.features import target_features, target_logits

    def features(tp, tokens):
        return target_features(tp, config, tokens, jnp.arange(tokens.shape[1])[None])

    def measure(tp, p, tokens, length, f, vocab_ids, temperature, dcfg):
        T = tokens.shape[1]
        pos = jnp.arange(T)[None]
        first = length - NEW - 1

        def roots(x):
            return jax.lax.dynamic_slice_in_dim(x, first, NEW, axis=1)

        def draft_at(shift):
            h = arm_forward(p, tp, config, dcfg, tokens, pos, f["k"], f["v"], f["hidden"], jnp.int32(shift))
            return head_logits(p, tp, config, roots(h), vocab_ids)[0]

        def to_ids(local):
            return local if vocab_ids is None else jnp.take(vocab_ids, local)

        q = draft_at(1)
        if temperature == 0:
            y = jax.lax.dynamic_slice_in_dim(tokens[0], first + 1, NEW)
            hit = [to_ids(jnp.argmax(q, -1)) == y]
            for d in range(2, 5):  # depth d at root r: the draft at r + d - 1, lag d, must give y[r + d - 1]
                g = to_ids(jnp.argmax(draft_at(d), axis=-1)) == y
                hit.append(jnp.concatenate([g[d - 1 :], jnp.zeros((d - 1,), bool)]))
            run = jnp.cumprod(jnp.stack(hit).astype(jnp.float32), axis=0)
            return {"first": run[0], "chain4": 1.0 + jnp.sum(run, axis=0)}
        p_logits = target_logits(tp, config, roots(f["hidden"]), None)[0]
        return {"sampled": _sampled_keys(p_logits, q, vocab_ids, temperature)["sampled"]}

    return jax.jit(features), jax.jit(measure, static_argnums=(6, 7))


def stage_eval(args, out: Path) -> None:
    import dataclasses

    import jax
    import jax.numpy as jnp

    model, tp = load_target()
    config = model.config
    dcfg, dp = shipped(model)
    pruned = jnp.asarray(dp.vocab_ids, jnp.int32)
    base = jax.tree.map(jnp.asarray, dict(dp.weights))
    variants = {"shipped": (base, dcfg, pruned)}
    if not args.skip_untrained:
        variants["shipped, full vocab"] = (base, dcfg, None)
        for w in (256, 1024):
            variants[f"shipped, window {w}"] = (base, dataclasses.replace(dcfg, window=w), pruned)
    for arm in args.arms.split(","):
        f = out / "arms" / arm / "params.pkl"
        if f.exists():
            variants[arm] = (jax.tree.map(jnp.asarray, pickle.loads(f.read_bytes())), dcfg, pruned)
            if arm == "base" and not args.skip_untrained:
                variants["base, full vocab"] = (variants[arm][0], dcfg, None)
    features, measure = measure_fns(config)
    result_file = out / "eval.json"
    results = json.loads(result_file.read_text()) if result_file.exists() else {}
    for suite in args.suites.split(","):
        rows = continuations(model, tp, suite, out)
        padded, feats = [], []
        width = -(-max(len(r["tokens"]) for r in rows) // PAD) * PAD  # one width: one program per variant and T
        for r in rows:
            toks = np.zeros((1, width), np.int32)
            toks[0, : len(r["tokens"])] = r["tokens"]
            padded.append(jnp.asarray(toks))
            feats.append(features(tp, padded[-1]))
        for name, (p, dc, vids) in variants.items():
            key = f"{suite}|{name}"
            if key in results and not args.redo:
                continue
            acc: dict[str, list] = {}
            for r, toks, f in zip(rows, padded, feats, strict=True):
                got = measure(tp, p, toks, jnp.int32(len(r["tokens"])), f, vids, float(r["T"]), dc)
                for k, v in got.items():
                    acc.setdefault(k, []).append(float(np.mean(np.asarray(v))))
            results[key] = {k: round(float(np.mean(v)), 4) for k, v in acc.items()} | {"prompts": len(rows) // 2}
            print(f"{suite:8s} {name:22s} " + "  ".join(f"{k} {v}" for k, v in results[key].items()), flush=True)
            result_file.write_text(json.dumps(results, indent=1) + "\n")


# The depth2 arm's second block in lsjax's layout (`DraftConfig.depth` 2: `deep_*` stacked on a leading axis).
AS_DEEP = {"c2_norm": "cross_norm", "c2_wq": "cross_wq", "c2_bq": "cross_bq", "c2_wo": "cross_wo"} | {
    "m2_norm": "mlp_norm",
    "m2_gate": "w_gate",
    "m2_up": "w_up",
    "m2_down": "w_down",
}


def stage_export(args, out: Path) -> None:
    """Each trained arm lsjax's drafts can express (base, lag1, depth2 as `depth: 2`) as a draft directory
    `out/arms/ARM/draft`, for `python -m lsjax.bench.draft_accept --draft DIR` and `decode.py --draft DIR`."""
    import dataclasses

    from lsjax.methods.longspec.export import save_draft
    from lsjax.methods.longspec.model import DEEP

    model, _ = load_target()
    dcfg, dp = shipped(model)
    for arm in args.arms.split(","):
        f = out / "arms" / arm / "params.pkl"
        if not f.exists():
            continue
        p = {k: np.asarray(v) for k, v in pickle.loads(f.read_bytes()).items()}
        extra = set(p) - set(dp.weights) - set(AS_DEEP)
        if extra:
            print(f"{arm}: not expressible as a LongSpec draft ({', '.join(sorted(extra))}); skipped")
            continue
        deep = {DEEP + AS_DEEP[k]: v[None] for k, v in p.items() if k in AS_DEEP}
        weights = {k: v for k, v in p.items() if k not in AS_DEEP} | deep
        depth = 2 if deep else 1
        path = out / "arms" / arm / "draft"
        save_draft(
            path,
            {**weights, "vocab_ids": np.asarray(dp.vocab_ids)},
            dataclasses.replace(dcfg, depth=depth),
            model.config.name,
            extra={"study": f"studies/draft_ceiling arm {arm}"},
        )
        print(f"{arm}: {path} (depth {depth})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stage", choices=("data", "train", "eval", "export"), required=True)
    ap.add_argument("--out", default="runs/draft_ceiling/arms")
    ap.add_argument("--sources", default="sharegpt,stdlib,sotu")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--rows", type=int, default=256, help="packed rows of the train split (the data budget)")
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--steps", type=int, default=150, help="optimizer steps per arm (the same for every arm)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--suites", default="dev,heldout", help="dev chooses; held-out is reported beside")
    ap.add_argument("--skip-untrained", action="store_true", help="eval: leave out the vocabulary/window rows")
    ap.add_argument("--redo", action="store_true")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    {"data": stage_data, "train": stage_train, "eval": stage_eval, "export": stage_export}[args.stage](args, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
