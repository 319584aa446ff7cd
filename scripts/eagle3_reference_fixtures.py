"""Fixtures for lsjax's EAGLE-3 parity tests, produced by the reference implementation.

Reference: SafeAILab/EAGLE at commit cb7e0841fe0c206c6ed74a197ad5e2a1f13f5a2b, `eagle/model/cnets.py` (`Model`, the
EAGLE-3 draft and its `topK_genrate` tree search) with `configs.py`, `utils_c.py`, `choices.py` and `utils.py`
beside it. The reference code is read from a local clone at run time (never copied into lsjax):

    python scripts/eagle3_reference_fixtures.py --eagle-repo PATH_TO_EAGLE_CLONE [--out tests/fixtures/eagle3]

For each tiny random config ("llama": draft vocabulary a subset of the target's through d2t, the draft's own
embedding; "qwen": GQA 6:1, rope_theta 1e6, target hidden size != the draft's, the whole vocabulary) it writes
a draft directory in the published EAGLE layout (config.json + model.safetensors: the reference module's own
state dict) and `<name>.npz` with the inputs and the reference's outputs, fp32 on CPU:

- `hidden`, `ids`: the target features [1, n, 3 Dt] and tokens [1, n + 1] of the first `topK_genrate` call;
  `hidden2`, `ids2`: the second call's (a accepted tokens + the new root, the draft's cache kept);
- `logits_prompt` [n, Vd]: the draft's logits at every prompt pair, teacher-forced (no tree);
- `head_1`, `head_2`: every LM-head output of each call, in order (the root's [1, Vd], then each expansion's
  [k, Vd]): logits at the first draft step and at later steps inside the tree;
- `tokens_1`, `positions_1`, `mask_1` (and `_2`): the tree the call returned (tokens, depths, ancestor mask).
The tree budget is `TOTAL`, `DEPTH`, `TOP_K`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = "SafeAILab/EAGLE"
COMMIT = "cb7e0841fe0c206c6ed74a197ad5e2a1f13f5a2b"
FILES = ("cnets.py", "configs.py", "utils_c.py", "choices.py", "utils.py")
TOTAL, DEPTH, TOP_K = 12, 3, 3  # topK_genrate's total_tokens (root included), depth (expansions) and top_k

CONFIGS = {
    "llama": dict(
        vocab_size=61,
        draft_vocab_size=40,
        hidden_size=32,
        intermediate_size=48,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        max_position_embeddings=256,
    ),
    "qwen": dict(
        vocab_size=53,
        draft_vocab_size=53,
        hidden_size=48,
        intermediate_size=64,
        num_attention_heads=6,
        num_key_value_heads=1,
        rms_norm_eps=1e-6,
        max_position_embeddings=256,
        rope_theta=1000000.0,
        target_hidden_size=40,
    ),
}


def extract(repo: Path, dest: Path) -> None:
    """The reference's modules at COMMIT, from a clone (a work tree or a bare git directory)."""
    git_dir = repo / ".git" if (repo / ".git").exists() else repo
    for name in FILES:
        text = subprocess.run(
            ["git", f"--git-dir={git_dir}", "show", f"{COMMIT}:eagle/model/{name}"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        (dest / name).write_text(text)


def make(name: str, cfg: dict, out: Path, seed: int) -> None:
    import torch
    from cnets import Model
    from safetensors.torch import save_file

    from configs import EConfig  # the reference's, from the extracted directory

    torch.manual_seed(seed)
    config = EConfig(**cfg, pad_token_id=0)
    # The reference targets transformers 4.x, where an unset rope_scaling stays None and rope_theta stays an
    # attribute; 5.x fills in rope_parameters, which the reference's `_init_rope` cannot read.
    config.rope_scaling = None
    if "rope_theta" in cfg:
        config.rope_theta = cfg["rope_theta"]
    elif hasattr(config, "rope_theta"):
        del config.rope_theta
    model = Model(config, load_emb=False, total_tokens=TOTAL, depth=DEPTH, top_k=TOP_K).float().eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:  # norms: near 1, not exactly (a skipped norm must show)
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.25 * torch.randn_like(p) / p.shape[-1] ** 0.25)
        V, Vd = cfg["vocab_size"], cfg["draft_vocab_size"]
        if Vd < V:
            ids = torch.sort(torch.randperm(V)[:Vd]).values
            model.d2t.copy_(ids - torch.arange(Vd))
            model.t2d.zero_()
            model.t2d[ids] = True
        else:
            del model.d2t, model.t2d  # as EaModel does when the vocabularies are the same
    model.init_tree()
    Dt = cfg.get("target_hidden_size", cfg["hidden_size"])
    g = torch.Generator().manual_seed(seed + 1)
    n, a = 9, 2
    hidden = torch.randn(1, n, 3 * Dt, generator=g)
    ids = torch.randint(0, cfg["vocab_size"], (1, n + 1), generator=g)

    heads = []
    hook = model.lm_head.register_forward_hook(lambda m, i, o: heads.append(o.detach().clone()))
    with torch.no_grad():
        prompt_out = model(hidden, input_ids=ids[:, 1:])
        logits_prompt = model.lm_head(model.norm(prompt_out))[0]
        heads.clear()
        model.reset_kv()
        t1, _, m1, p1 = model.topK_genrate(hidden, ids, None, None)
        head_1 = [h.numpy() for h in heads]
        heads.clear()
        # The second call: `a` tokens accepted after the root, then a new root; their features are new.
        accepted = t1[0, 1 : 1 + a].tolist()  # any tokens do: the draft only sees ids and features
        ids2 = torch.cat([ids, torch.tensor([accepted + [int(torch.randint(0, V, (1,), generator=g))]])], dim=1)
        hidden2 = torch.randn(1, a + 1, 3 * Dt, generator=g)
        t2, _, m2, p2 = model.topK_genrate(hidden2, ids2, None, None)
        head_2 = [h.numpy() for h in heads]
    hook.remove()

    draft_dir = out / name
    draft_dir.mkdir(parents=True, exist_ok=True)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(draft_dir / "model.safetensors"))
    hf = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1, **cfg}
    (draft_dir / "config.json").write_text(json.dumps(hf, indent=2))
    arrays = {
        "hidden": hidden[0].numpy(),
        "ids": ids[0].numpy(),
        "hidden2": hidden2[0].numpy(),
        "ids2": ids2[0].numpy(),
        "logits_prompt": logits_prompt.numpy(),
        "tokens_1": t1[0].numpy(),
        "positions_1": p1.numpy(),
        "mask_1": m1[0, 0].numpy().astype(bool),
        "tokens_2": t2[0].numpy(),
        "positions_2": p2.numpy(),
        "mask_2": m2[0, 0].numpy().astype(bool),
        "budget": np.array([TOTAL - 1, DEPTH + 1, TOP_K]),
    }
    arrays |= {f"head_1_{i}": h for i, h in enumerate(head_1)} | {f"head_2_{i}": h for i, h in enumerate(head_2)}
    np.savez_compressed(out / f"{name}.npz", **arrays)
    print(f"{name}: tree of {len(t1[0])} nodes, then {len(t2[0])}; {len(head_1)} + {len(head_2)} head outputs")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--eagle-repo", required=True, type=Path, help="a clone of SafeAILab/EAGLE (work tree or git dir)")
    ap.add_argument("--out", type=Path, default=Path("tests/fixtures/eagle3"))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        extract(args.eagle_repo, Path(tmp))
        sys.path.insert(0, tmp)
        for i, (name, cfg) in enumerate(CONFIGS.items()):
            make(name, cfg, args.out, seed=10 * i + 1)
    source = args.out / "SOURCE.txt"
    kept = [line for line in (source.read_text().splitlines() if source.exists() else []) if "speculators" in line]
    line = f"made by scripts/eagle3_reference_fixtures.py from {REPO} at {COMMIT}"
    source.write_text("\n".join([line, *kept]) + "\n")


if __name__ == "__main__":
    main()
