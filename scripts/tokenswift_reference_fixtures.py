"""Fixtures for lsjax's parity test with TokenSwift's released heads, produced by the reference implementation.

Reference: bigai-nlco/TokenSwift at commit f927281485c15dcd5ff3d60e3046fd22ea3d40ec, the `MedusaModel` and RMSNorm
classes of `models/modeling_llama3_1.py` (Llama-3.1 releases) and `models/modeling_qwen2_5.py` (Qwen2.5 and the
Qwen-based releases). Only those classes are executed, taken from a local clone at run time (never copied into
lsjax): the modules around them need TokenSwift's cache and flash-attention code, which the heads do not use.

    python scripts/tokenswift_reference_fixtures.py --tokenswift-repo PATH_TO_CLONE [--out tests/fixtures/tokenswift]

For each it writes a released-layout directory (config.json with `medusa_heads`; model.safetensors with the
reference modules' own `model.medusa_layers.*` tensors beside a stand-in target tensor) and `<name>.npz`: `h0`
[n, D] (the target's last hidden state before its final norm), `lm_head` [V, D] and `logits` [n, heads, V], the
reference's head logits: lm_head(post_layernorm(h_i)) with h_i = h_{i-1} + linear(input_layernorm(h_{i-1})).
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import types
from pathlib import Path

import numpy as np

REPO = "bigai-nlco/TokenSwift"
COMMIT = "f927281485c15dcd5ff3d60e3046fd22ea3d40ec"
SOURCES = {
    "llama": ("models/modeling_llama3_1.py", "LlamaRMSNorm"),
    "qwen2": ("models/modeling_qwen2_5.py", "Qwen2RMSNorm"),
}
SHAPES = {
    "llama": dict(hidden_size=32, vocab_size=61, rms_norm_eps=1e-5),
    "qwen2": dict(hidden_size=40, vocab_size=53, rms_norm_eps=1e-6),
}


def reference_classes(repo: Path, source: str, norm: str) -> dict:
    """The reference's MedusaModel and its RMSNorm class, executed from the file at COMMIT."""
    import torch
    from torch import nn

    git_dir = repo / ".git" if (repo / ".git").exists() else repo
    text = subprocess.run(
        ["git", f"--git-dir={git_dir}", "show", f"{COMMIT}:{source}"], check=True, capture_output=True, text=True
    ).stdout
    tree = ast.parse(text)
    keep = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name in (norm, "MedusaModel")]
    namespace = {"torch": torch, "nn": nn, "dist": None}
    exec(compile(ast.Module(body=keep, type_ignores=[]), source, "exec"), namespace)  # noqa: S102
    return namespace


def make(repo: Path, name: str, out: Path, seed: int) -> None:
    import torch
    from safetensors.torch import save_file

    source, norm = SOURCES[name]
    ns = reference_classes(repo, source, norm)
    shape = SHAPES[name]
    config = types.SimpleNamespace(**shape, tp_size=1)
    torch.manual_seed(seed)
    heads = [ns["MedusaModel"](config).float().eval() for _ in range(3)]
    with torch.no_grad():
        for head in heads:
            for p in head.parameters():
                if p.ndim == 1:
                    p.copy_(1.0 + 0.2 * torch.randn_like(p))
                else:
                    p.copy_(0.3 * torch.randn_like(p) / p.shape[-1] ** 0.5)
        D, V, n = shape["hidden_size"], shape["vocab_size"], 7
        h0 = torch.randn(n, D)
        lm_head = 0.3 * torch.randn(V, D)
        h, logits = h0, []
        for head in heads:
            h, normed = head(h)
            logits.append(normed @ lm_head.T)
    logits = torch.stack(logits, dim=1)
    d = out / name
    d.mkdir(parents=True, exist_ok=True)
    state = {f"model.medusa_layers.{i}.{k}": v for i, head in enumerate(heads) for k, v in head.state_dict().items()}
    state |= {"lm_head.weight": lm_head, "model.norm.weight": torch.ones(D)}
    save_file({k: v.contiguous() for k, v in state.items()}, str(d / "model.safetensors"))
    hf = {
        "model_type": name,
        "hidden_size": D,
        "vocab_size": V,
        "rms_norm_eps": shape["rms_norm_eps"],
        "medusa_heads": 3,
    }
    (d / "config.json").write_text(json.dumps(hf, indent=2))
    np.savez_compressed(out / f"{name}.npz", h0=h0.numpy(), lm_head=lm_head.numpy(), logits=logits.numpy())
    print(f"{name}: logits {tuple(logits.shape)}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenswift-repo", required=True, type=Path, help="a clone (work tree or git dir)")
    ap.add_argument("--out", type=Path, default=Path("tests/fixtures/tokenswift"))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(SOURCES):
        make(args.tokenswift_repo, name, args.out, seed=200 + i)
    (args.out / "SOURCE.txt").write_text(f"made by scripts/tokenswift_reference_fixtures.py from {REPO} at {COMMIT}\n")


if __name__ == "__main__":
    main()
