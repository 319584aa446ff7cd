"""Did moving the models to Flax modules change anything a user sees? Two copies of the repository (`git worktree
add DIR COMMIT`), the code before the change and after, each run in its own processes, interleaved:

    python -m studies.flax_ab.ab --before DIR_A --after DIR_B --out OUT [--parts logits drafts decode repeat train]

- logits: the target's logits, every family on a tiny random config and SmolLM2 on the bundled prompt (the
  module's `apply` where the copy has it, the functions before);
- drafts: `lsjax.bench.draft_accept --dump` for the LongSpec, EAGLE-3 (random) and TokenSwift drafts: the top
  logits each proposes at every root of real text;
- decode: `decode.py --json` per method from an empty compile cache, rounds alternating the copies: the text
  (hashed) and the compile seconds;
- repeat: `lsjax.bench.repeat` (AR, longspec, auto; dev) run alternately in each copy: decode speed per method;
- hlo: `lsjax.generate` lowered and compiled in-process per method (no compile cache), rounds alternating: whether
  the programs are the same HLO, and the lowering and compile seconds;
- train: 20 steps of `configs/train/smollm2-smoke.yaml`: the losses and the step speed.

Prints one line per comparison and writes the rows to OUT/ab.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

LOGITS = r"""
import sys, numpy as np, jax, jax.numpy as jnp
from lsjax.config import ModelConfig
from lsjax.cache import KVCache
from lsjax.models import target
import lsjax

def run(cfg, params, tokens):
    pos = jnp.arange(tokens.shape[1])[None]
    cache = KVCache.zeros(cfg, 1, tokens.shape[1])
    if hasattr(target, "Transformer"):
        return target.Transformer(cfg).apply({"params": params}, tokens, pos, cache)[0]
    return target.forward(params, cfg, tokens, pos, cache)[0]

out = {}
base = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_layers=3, num_heads=4, num_kv_heads=2,
            head_dim=16, max_position=256, bos_token_id=None, eos_token_ids=(1,), pad_token_id=0)
families = {"llama": {}, "qwen2": {"qkv_bias": True}, "qwen3": {"qk_norm": True}, "mistral": {}}
tokens = jnp.asarray(np.random.default_rng(0).integers(0, 96, (1, 48)), jnp.int32)
for arch, extra in families.items():
    cfg = ModelConfig(arch=arch, **base, **extra)
    params = target.init_params(cfg, jax.random.key(3), scale=0.3)
    out[arch] = np.asarray(run(cfg, params, tokens))
model = lsjax.load_model()
ids = model.tokenizer.encode(open("lsjax/assets/default_prompt.txt").read())[:256]
out["smollm2"] = np.asarray(run(model.config, model.params, jnp.asarray([ids], jnp.int32)))
np.savez(sys.argv[1], **out)
"""


HLO = r"""
import hashlib, json, sys, time, jax, jax.numpy as jnp
import lsjax
from lsjax.methods import registry

model = lsjax.load_model()
params = jax.tree.map(jnp.asarray, model.params)
ids, lengths = lsjax.pad_prompts([model.tokenizer.encode(open("lsjax/assets/default_prompt.txt").read())[:900]])
out = {}
for method in sys.argv[1:]:
    drafter, draft = registry.build(method, model)
    spec = lsjax.SpecConfig(model=model.config, gen=lsjax.GenerateConfig(max_new_tokens=64), drafter=drafter)
    fn = jax.jit(lsjax.generate, static_argnums=3)
    t = time.perf_counter()
    lowered = fn.lower(params, draft, ids, spec, jax.random.key(0), lengths)
    lower_s = time.perf_counter() - t
    text = lowered.as_text()
    t = time.perf_counter()
    lowered.compile()
    out[method] = {"hlo": hashlib.sha256(text.encode()).hexdigest()[:16], "lower_s": lower_s,
                   "compile_s": time.perf_counter() - t}
print(json.dumps(out))
"""


def hlo(dirs: dict, out: Path, rounds: int) -> list[dict]:
    rows = []
    for r in range(rounds):
        order = list(dirs.items()) if r % 2 == 0 else list(dirs.items())[::-1]
        for name, d in order:
            env = {"JAX_ENABLE_COMPILATION_CACHE": "false"}
            res = sh([sys.executable, "-c", HLO, "ar", "pld", "longspec", "tokenswift"], d, extra_env=env)
            for method, row in json.loads(res.stdout.strip().splitlines()[-1]).items():
                rows.append({"part": "hlo", "round": r, "copy": name, "method": method} | row)
    return rows


def sh(args, cwd: Path, extra_env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(cwd), **(extra_env or {})}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, check=True, **kw)


def logits(dirs: dict, out: Path) -> list[dict]:
    got = {}
    for name, d in dirs.items():
        sh([sys.executable, "-c", LOGITS, str(out / f"logits_{name}.npz")], d)
        got[name] = np.load(out / f"logits_{name}.npz")
    rows = []
    for key in got["before"].files:
        a, b = got["after"][key], got["before"][key]
        rel = float(np.max(np.abs(a - b)) / np.max(np.abs(b)))
        rows.append({"part": "logits", "model": key, "identical": bool(np.array_equal(a, b)), "max_rel": rel})
    return rows


DRAFTS = {"longspec": "shipped", "eagle3": "random", "tokenswift": "shipped"}


def drafts(dirs: dict, out: Path) -> list[dict]:
    rows = []
    for method, draft in DRAFTS.items():
        dumps = {}
        for name, d in dirs.items():
            file = out / f"dump_{method}_{name}.jsonl"
            args = ["--method", method, "--draft", draft, "--suite", "dev", "--buckets", "1K-2K", "--per-cell", "1"]
            args += ["--new-tokens", "32", "--temperatures", "0", "--dump", str(file)]
            sh([sys.executable, "-m", "lsjax.bench.draft_accept", *args], d)
            dumps[name] = [json.loads(line) for line in file.read_text().splitlines()]
        a = np.asarray([r["top_logits"] for r in dumps["after"]], dtype=np.float64)
        b = np.asarray([r["top_logits"] for r in dumps["before"]], dtype=np.float64)
        ids_equal = [r["top_ids"] for r in dumps["after"]] == [r["top_ids"] for r in dumps["before"]]
        rel = float(np.max(np.abs(a - b)) / np.max(np.abs(b)))
        rows.append({"part": "drafts", "method": method, "top_ids_equal": ids_equal, "max_rel": rel})
    return rows


def decode(dirs: dict, out: Path, rounds: int) -> list[dict]:
    rows = []
    for r in range(rounds):
        for method in ("ar", "longspec", "auto"):
            order = list(dirs.items()) if r % 2 == 0 else list(dirs.items())[::-1]
            for name, d in order:
                with tempfile.TemporaryDirectory() as cache:
                    args = ["decode.py", "--method", method, "--max-new-tokens", "64", "--json"]
                    res = sh([sys.executable, *args, "--compile-cache", cache], d)
                report = json.loads(res.stdout.strip().splitlines()[-1])
                text = hashlib.sha256(report["text"].encode()).hexdigest()[:12]
                rows.append(
                    {"part": "decode", "round": r, "copy": name, "method": method, "text": text}
                    | {"compile_s": report["compile_s"]}
                )
    return rows


def repeat(dirs: dict, out: Path, rounds: int) -> list[dict]:
    rows = []
    for r in range(rounds):
        order = list(dirs.items()) if r % 2 == 0 else list(dirs.items())[::-1]
        for name, d in order:
            file = out / f"repeat_{name}_{r}.json"
            args = ["--methods", "ar", "longspec", "auto", "--suite", "dev", "--buckets", "1K-2K", "--per-cell", "1"]
            args += ["--max-new-tokens", "64", "--repeats", "2", "--temperatures", "0", "--out", str(file)]
            if not file.exists():  # a rerun resumes: a finished run's rows are kept
                sh([sys.executable, "-m", "lsjax.bench.repeat", *args], d)
            for row in json.loads(file.read_text())["rows"]:
                rows.append({"part": "repeat", "round": r, "copy": name} | row)
    return rows


def train(dirs: dict, out: Path) -> list[dict]:
    rows = []
    for name, d in dirs.items():
        run_dir = out / f"train_{name}"
        sets = ["steps=20", "optim.total_steps=20", "checkpoint.every=20", f"run_dir={run_dir}", "log.every=1"]
        args = ["train.py", "--config", "configs/train/smollm2-smoke.yaml", "--overwrite", "--no-progress"]
        sh([sys.executable, *args, *[x for s in sets for x in ("--set", s)]], d)
        for line in (run_dir / "metrics.jsonl").read_text().splitlines():
            rows.append({"part": "train", "copy": name} | json.loads(line))
    return rows


def summary(rows: list[dict]) -> None:
    for row in rows:
        if row["part"] in ("logits", "drafts"):
            print(json.dumps(row))
    dec = [r for r in rows if r["part"] == "decode"]
    for method in sorted({r["method"] for r in dec}):
        per = {c: [r for r in dec if r["method"] == method and r["copy"] == c] for c in ("before", "after")}
        texts = {c: {r["text"] for r in v} for c, v in per.items()}
        comp = {c: statistics.median(r["compile_s"] for r in v) for c, v in per.items() if v}
        if len(comp) == 2:
            ratio = comp["after"] / comp["before"]
            print(f"decode {method}: texts equal {texts['before'] == texts['after']}, compile s {comp} ({ratio:.3f}x)")
    rep = [r for r in rows if r["part"] == "repeat" and "tok_s" in r]
    for method in sorted({r["method"] for r in rep}):
        med = {
            c: statistics.median(r["tok_s"] for r in rep if r["method"] == method and r["copy"] == c)
            for c in ("before", "after")
        }
        print(f"repeat {method}: median tok/s {med} (after/before {med['after'] / med['before']:.3f})")
    hl = [r for r in rows if r["part"] == "hlo"]
    for method in sorted({r["method"] for r in hl}):
        per = {c: [r for r in hl if r["method"] == method and r["copy"] == c] for c in ("before", "after")}
        same = {r["hlo"] for r in per["before"]} == {r["hlo"] for r in per["after"]}
        low = {c: statistics.median(r["lower_s"] for r in v) for c, v in per.items()}
        comp = {c: statistics.median(r["compile_s"] for r in v) for c, v in per.items()}
        print(f"hlo {method}: identical {same}; lower s {low}; compile s {comp}")
    tr = [r for r in rows if r["part"] == "train"]
    if tr:
        losses = {c: [r["loss"] for r in tr if r["copy"] == c and "loss" in r] for c in ("before", "after")}
        speed = {
            c: statistics.median(r["tokens_per_s"] for r in tr if r["copy"] == c and "tokens_per_s" in r)
            for c in losses
        }
        diff = max(abs(a - b) for a, b in zip(losses["before"], losses["after"]))
        print(f"train: {len(losses['after'])} losses, max |diff| {diff:.2e}; tokens/s {speed}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", required=True, type=Path)
    p.add_argument("--after", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--parts", nargs="+", default=["logits", "drafts", "decode", "repeat", "train"])
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    dirs = {"before": args.before.resolve(), "after": args.after.resolve()}
    rows = []
    for part in args.parts:
        if part in ("decode", "repeat", "hlo"):
            rows += globals()[part](dirs, args.out, args.rounds)
        else:
            rows += globals()[part](dirs, args.out)
        (args.out / "ab.json").write_text(json.dumps(rows, indent=1))
    summary(rows)


if __name__ == "__main__":
    main()
