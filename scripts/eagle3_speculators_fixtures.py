"""Fixtures for lsjax's EAGLE-3 parity tests in the vLLM speculators layout, produced by the reference layer.

Reference: vllm-project/speculators at commit c05b95b303f7d4f21e8d7624e0ffa1c2d9b4d73b,
`src/speculators/models/eagle3/model_definitions.py` (`LlamaDecoderEagle3FirstLayer`, `Qwen3DecoderEagle3FirstLayer`:
transformers' decoder layers with EAGLE-3's first-layer changes), read from a local clone at run time and never
copied into lsjax:

    python scripts/eagle3_speculators_fixtures.py --speculators-repo PATH_TO_CLONE [--out tests/fixtures/eagle3]

The rest of the draft (fc over the concatenated target states, the draft's embedding, the final norm and the LM
head) is composed here as `Eagle3DraftModel.forward` composes it (`core.py`, first TTT step), with plain torch:
the package itself (pydantic configs, flex attention) is not installed, so the layer runs with eager attention
and a causal mask, and `speculators.models.base_components` is stubbed (only its model table imports it).

For "llama" (norm_before_residual, a 40-of-61 draft vocabulary through d2t) and "qwen3" (the layer's per-head q/k
norms, GQA 6:1, rope_theta 1e6) it writes a draft directory in the speculators layout and `<name>.npz`: `hidden`
[n, 3 D] and `ids` [n + 1] (pair t is (hidden[t], ids[t + 1]) at position t) and `logits_prompt` [n, Vd], the
draft's logits at every pair, teacher-forced, fp32 on CPU.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import numpy as np

REPO = "vllm-project/speculators"
COMMIT = "c05b95b303f7d4f21e8d7624e0ffa1c2d9b4d73b"
SOURCE = "src/speculators/models/eagle3/model_definitions.py"

CONFIGS = {
    "spec-llama": dict(
        model_type="llama", vocab_size=61, draft_vocab_size=40, hidden_size=32, intermediate_size=48,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-5, rope_theta=10000.0,
        norm_before_residual=True, aux=[1, 3, 6],
    ),
    "spec-qwen3": dict(
        model_type="qwen3", vocab_size=53, draft_vocab_size=53, hidden_size=48, intermediate_size=64,
        num_attention_heads=6, num_key_value_heads=1, head_dim=8, rms_norm_eps=1e-6, rope_theta=1000000.0,
        norm_before_residual=False, aux=None,
    ),
}  # fmt: skip


def load_reference(repo: Path):
    git_dir = repo / ".git" if (repo / ".git").exists() else repo
    text = subprocess.run(
        ["git", f"--git-dir={git_dir}", "show", f"{COMMIT}:{SOURCE}"], check=True, capture_output=True, text=True
    ).stdout
    stub = types.ModuleType("speculators.models.base_components")
    stub.override_components = lambda *a, **k: None
    stub.ModelComponents = object
    for name in ("speculators", "speculators.models"):
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules["speculators.models"].base_components = stub
    sys.modules["speculators.models.base_components"] = stub
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "eagle3_model_definitions.py"
        path.write_text(text)
        sys.path.insert(0, tmp)
        import eagle3_model_definitions as defs  # the reference's module, as it is at COMMIT

        sys.path.remove(tmp)
    return defs


def make(defs, name: str, spec: dict, out: Path, seed: int) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, Qwen3Config
    from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding

    spec = dict(spec)
    nbr, aux, Vd = spec.pop("norm_before_residual"), spec.pop("aux"), spec.pop("draft_vocab_size")
    kind = spec.pop("model_type")
    cls = Qwen3Config if kind == "qwen3" else LlamaConfig
    config = cls(**spec, num_hidden_layers=1, max_position_embeddings=256, attention_bias=False)
    config._attn_implementation = "eager"
    layer_cls = defs.Qwen3DecoderEagle3FirstLayer if kind == "qwen3" else defs.LlamaDecoderEagle3FirstLayer
    torch.manual_seed(seed)
    layer = layer_cls(config, layer_idx=0, norm_before_residual=nbr).float().eval()
    D, V = config.hidden_size, config.vocab_size
    fc = torch.nn.Linear(3 * D, D, bias=False)
    norm = LlamaRMSNorm(D, eps=config.rms_norm_eps)
    lm_head = torch.nn.Linear(D, Vd, bias=False)
    embed = torch.nn.Embedding(V, D)
    with torch.no_grad():
        for module in (layer, fc, norm, lm_head, embed):
            for p in module.parameters():
                if p.ndim == 1:
                    p.copy_(1.0 + 0.2 * torch.randn_like(p))
                else:
                    p.copy_(0.25 * torch.randn_like(p) / p.shape[-1] ** 0.25)
    ids_map = torch.sort(torch.randperm(V)[:Vd]).values if Vd < V else torch.arange(V)
    g = torch.Generator().manual_seed(seed + 1)
    n = 9
    hidden = torch.randn(1, n, 3 * D, generator=g)
    ids = torch.randint(0, V, (1, n + 1), generator=g)
    with torch.no_grad():
        x = torch.cat([embed(ids[:, 1:]), fc(hidden)], dim=-1)
        positions = torch.arange(n)[None]
        rope = LlamaRotaryEmbedding(config)(x, positions)
        causal = torch.full((n, n), torch.finfo(torch.float32).min).triu(1)[None, None]
        y = layer(x, attention_mask=causal, position_ids=positions, position_embeddings=rope)
        y = y[0] if isinstance(y, tuple) else y
        logits = lm_head(norm(y))[0]

    draft_dir = out / name
    draft_dir.mkdir(parents=True, exist_ok=True)
    state = {f"layers.0.{k}": v for k, v in layer.state_dict().items()}
    state |= {"fc.weight": fc.weight, "norm.weight": norm.weight, "lm_head.weight": lm_head.weight}
    state |= {"embed_tokens.weight": embed.weight, "d2t": ids_map - torch.arange(Vd)}
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[ids_map] = True
    state["t2d"] = t2d
    save_file({k: v.detach().contiguous() for k, v in state.items()}, str(draft_dir / "model.safetensors"))
    layer_hf = {**spec, "model_type": kind, "num_hidden_layers": 1, "max_position_embeddings": 256}
    hf = {
        "speculators_model_type": "eagle3",
        "architectures": ["Eagle3Speculator"],
        "transformer_layer_config": layer_hf,
        "draft_vocab_size": Vd,
        "norm_before_residual": nbr,
        "eagle_aux_hidden_state_layer_ids": aux,
    }
    (draft_dir / "config.json").write_text(json.dumps(hf, indent=2))
    arrays = {"hidden": hidden[0].numpy(), "ids": ids[0].numpy(), "logits_prompt": logits.numpy()}
    np.savez_compressed(out / f"{name}.npz", **arrays)
    print(f"{name}: logits {tuple(logits.shape)}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--speculators-repo", required=True, type=Path, help="a clone (work tree or git dir)")
    ap.add_argument("--out", type=Path, default=Path("tests/fixtures/eagle3"))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    defs = load_reference(args.speculators_repo)
    for i, (name, spec) in enumerate(CONFIGS.items()):
        make(defs, name, spec, args.out, seed=100 + 10 * i)
    source = args.out / "SOURCE.txt"
    kept = [line for line in (source.read_text().splitlines() if source.exists() else []) if "speculators" not in line]
    line = f"spec-*: made by scripts/eagle3_speculators_fixtures.py from {REPO} at {COMMIT}"
    source.write_text("\n".join([*kept, line]) + "\n")


if __name__ == "__main__":
    main()
