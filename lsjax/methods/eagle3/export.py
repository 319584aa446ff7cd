"""Exporting an EAGLE-3 draft trained by lsjax to the published layouts (safetensors + config.json):

    python train.py --config configs/train/eagle3-smollm2.yaml --export DIR                               # EAGLE
    python train.py --config configs/train/eagle3-smollm2.yaml --export DIR --set export.format=speculators

* `eagle`: SafeAILab/EAGLE and SpecForge's `midlayer.*`, a Llama config of the one layer with
  `draft_vocab_size`; the reference reads the target layers 2, L // 2 and L - 3, adds the raw state (not its
  norm) to the attention output, and has head_dim = hidden_size / num_heads.
* `speculators`: vLLM speculators' `layers.0.*` with `eagle_aux_hidden_state_layer_ids` and
  `norm_before_residual`; its fc reads A x the draft's hidden size, so the draft must be as wide as the target.

Both load back through `--method eagle3 --draft DIR` (`checkpoint.read_draft`) as the same params. A draft a layout
cannot express is refused in one line naming the field and the layout. The tensors are written by
`checkpoint.write_draft`, the decode side's own writer.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from lsjax.config import ConfigError
from lsjax.methods.eagle3 import model as em
from lsjax.methods.eagle3.checkpoint import write_draft


def layout_problem(dcfg: em.Eagle3Config, target_layers: int, fmt: str) -> str | None:
    """Why the `fmt` layout cannot express this draft (one line), or None."""
    c = dcfg.layer
    if c.num_layers != 1:
        return f"draft.num_layers: {c.num_layers} decoder layers do not fit the {fmt} layout's single layer"
    if fmt == "eagle":
        published = em.default_aux_layers(target_layers)
        if tuple(dcfg.aux_layers) != published:
            return (
                f"draft.aux_layers: {list(dcfg.aux_layers)} cannot be expressed in the eagle layout (it always reads "
                f"{list(published)}); export with export.format=speculators"
            )
        if dcfg.norm_before_residual:
            return (
                "draft.norm_before_residual: true cannot be expressed in the eagle layout; "
                "export with export.format=speculators"
            )
        if c.head_dim * c.num_heads != c.hidden_size:
            return (
                f"draft.num_heads: head_dim {c.head_dim} x {c.num_heads} heads != hidden size {c.hidden_size}, which "
                "the eagle layout assumes"
            )
    elif dcfg.target_hidden_size != c.hidden_size:
        return (
            f"draft hidden size {c.hidden_size} != the target's {dcfg.target_hidden_size}: the speculators layout's fc "
            "reads the draft's width"
        )
    if c.qk_norm:
        return f"draft.qk_norm: q/k norms are not written by lsjax's {fmt} export"
    return None


# The verifier's `architectures` in a speculators config, by lsjax's architecture name.
ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "mistral": "MistralForCausalLM",
}


def export_draft(
    out_dir: str | Path,
    dcfg: em.Eagle3Config,
    params: dict,
    vocab_ids,
    *,
    target_layers: int,
    fmt: str = "eagle",
    dtype: str = "bfloat16",
    verifier: str | None = None,
    target_arch: str = "llama",
    speculative_tokens: int = 3,
) -> Path:
    """Trained params (without the vocabulary) + the draft vocabulary's target ids -> a draft directory in the
    published layout `fmt`. Raises ConfigError (one line) when the layout cannot express the draft. A speculators
    config also names the verifier (`verifier`: its path or hub id, None when unknown) and the tokens a greedy
    proposal drafts, as speculators' own saves do."""
    if (problem := layout_problem(dcfg, target_layers, fmt)) is not None:
        raise ConfigError(problem)
    arrays = {k: np.asarray(v, np.float32) for k, v in params.items()}
    arrays["draft_to_target"] = np.asarray(vocab_ids, np.int32)
    path = write_draft(out_dir, dcfg, arrays, fmt, dtype=dtype)
    if fmt == "speculators":
        hf = json.loads((path / "config.json").read_text())
        arch = ARCHITECTURES.get(target_arch)
        hf["speculators_config"] = {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": speculative_tokens}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier, "architectures": [arch] if arch else []},
        }
        (path / "config.json").write_text(json.dumps(hf, indent=2))
    return path


def export_run(run_dir: str | Path, out_dir: str | Path, *, fmt: str = "eagle", dtype: str = "bfloat16") -> dict:
    """A run's latest checkpoint -> a published-layout draft directory."""
    from lsjax.methods.eagle3.train import read_draft_shape
    from lsjax.train.checkpoint import load_draft_params

    run_dir = Path(run_dir)
    dcfg, info = read_draft_shape(run_dir)
    params = load_draft_params(run_dir)
    vocab_ids = np.load(run_dir / "vocab_ids.npy")
    path = export_draft(
        out_dir,
        dcfg,
        params,
        vocab_ids,
        target_layers=info["target_layers"],
        fmt=fmt,
        dtype=dtype,
        verifier=info.get("target_path"),
        target_arch=info.get("target_arch", "llama"),
        speculative_tokens=info.get("ttt_steps", 3),
    )
    return {"format": fmt, "dtype": dtype, "draft_vocab_size": int(len(vocab_ids)), "dir": str(path)}


def export_kind(cfg, out_dir, *, config_path: str | None = None, tree: str | None = None) -> dict:
    """`train.py --export DIR` of an eagle3 run: the layout and dtype of the config's `export` section."""
    return export_run(cfg.resolved_run_dir, out_dir, fmt=cfg.export.format, dtype=cfg.export.dtype)
