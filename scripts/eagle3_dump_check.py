"""How often lsjax's EAGLE-3 first-level proposals on real text agree with the reference implementation's.

Reference: SafeAILab/EAGLE at commit cb7e0841fe0c206c6ed74a197ad5e2a1f13f5a2b (`eagle/model/cnets.py`, `Model`), read
from a local clone at run time as `scripts/eagle3_reference_fixtures.py` does (never copied into lsjax).

    python -m lsjax.bench.draft_accept --method eagle3 --draft DRAFT --prompts P.jsonl --temperatures 0 --dump D.jsonl
    python scripts/eagle3_dump_check.py --dump D.jsonl --draft DRAFT --eagle-repo PATH_TO_EAGLE_CLONE

For every dumped sequence the target's three streams come from lsjax's target (`draft_accept.target_streams`, the
same the dump was made with; the target's own parity with transformers is tested elsewhere); the reference draft,
loaded from DRAFT's tensors (a speculators directory's `layers.0.*` renamed `midlayer.*`; norm_before_residual must
be off, which the reference does not implement), runs teacher-forced over the pairs, and its top-1 at each dumped
root is compared with the dump's. Prints the agreement and the largest logit difference at the top-1 ids.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from eagle3_reference_fixtures import COMMIT, REPO, extract  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dump", required=True, type=Path)
    ap.add_argument("--draft", required=True, type=Path, help="the draft directory the dump was made with")
    ap.add_argument("--eagle-repo", required=True, type=Path)
    args = ap.parse_args(argv)

    import jax
    import jax.numpy as jnp
    import torch
    from safetensors.torch import load_file

    from lsjax.bench.draft_accept import target_streams
    from lsjax.loading import load_model
    from lsjax.methods.eagle3.checkpoint import read_draft

    model = load_model()
    cfg, _, info = read_draft(args.draft, model.config)
    if cfg.norm_before_residual:
        ap.error("the reference draft has no norm_before_residual")
    state = {}
    for f in sorted(args.draft.glob("*.safetensors")):
        state |= load_file(str(f))
    state = {
        k.replace("layers.0.", "midlayer.", 1): v.float() if v.is_floating_point() else v for k, v in state.items()
    }
    hf = json.loads((args.draft / "config.json").read_text())
    layer_hf = hf.get("transformer_layer_config", hf)

    with tempfile.TemporaryDirectory() as tmp:
        extract(args.eagle_repo, Path(tmp))
        sys.path.insert(0, tmp)
        from cnets import Model

        from configs import EConfig

        econf = EConfig(
            vocab_size=model.config.vocab_size,
            hidden_size=layer_hf["hidden_size"],
            intermediate_size=layer_hf["intermediate_size"],
            num_attention_heads=layer_hf["num_attention_heads"],
            num_key_value_heads=layer_hf["num_key_value_heads"],
            rms_norm_eps=layer_hf["rms_norm_eps"],
            max_position_embeddings=max(layer_hf.get("max_position_embeddings", 2048), model.config.max_position),
            draft_vocab_size=cfg.draft_vocab_size,
            pad_token_id=0,
        )
        econf.rope_scaling = None  # as in eagle3_reference_fixtures.py: the reference reads transformers 4.x configs
        econf.rope_theta = cfg.layer.rope_theta
        if cfg.target_hidden_size != cfg.hidden_size:
            econf.target_hidden_size = cfg.target_hidden_size
        ref = Model(econf, load_emb=False).float().eval()
        if "embed_tokens.weight" not in state:
            state["embed_tokens.weight"] = torch.from_numpy(np.asarray(model.params["embed"], np.float32))
        missing, unexpected = ref.load_state_dict(state, strict=False)
        if [m for m in missing if m not in ("d2t", "t2d")] or unexpected:
            ap.error(f"the reference module does not take this draft's tensors: missing {missing}, extra {unexpected}")
        d2t = ref.d2t if "d2t" in state else torch.zeros(cfg.draft_vocab_size, dtype=torch.long)

        tp = jax.tree.map(jnp.asarray, model.params)
        streams = jax.jit(lambda t: target_streams(tp, model.config, t, cfg.aux_layers)[0])
        agree = total = 0
        worst = 0.0
        for line in args.dump.read_text().splitlines():
            entry = json.loads(line)
            toks = np.asarray(entry["tokens"], np.int64)
            aux = np.asarray(streams(jnp.asarray(toks[None], jnp.int32)), np.float32)
            with torch.no_grad():
                out = ref(torch.from_numpy(aux[:, :-1]), input_ids=torch.from_numpy(toks[None, 1:]))
                logits = ref.lm_head(ref.norm(out))[0]  # pair t = (streams at t, token t + 1)
            roots = np.asarray(entry["roots"])
            at = logits[torch.from_numpy(roots - 1)]
            top = at.argmax(-1)
            ref_ids = (top + d2t[top]).numpy()
            ours = np.asarray(entry["top_ids"])[:, 0]
            agree += int((ref_ids == ours).sum())
            total += len(roots)
            mine = np.asarray(entry["top_logits"])[:, 0]
            worst = max(worst, float(np.abs(at.max(-1).values.numpy() - mine).max()))
            print(f"{entry['id']:24s} top-1 agrees at {int((ref_ids == ours).sum())}/{len(roots)} roots")
    print(
        f"{info.format} layout, {total} roots: top-1 agreement {agree / max(total, 1):.4f}; largest top-1 logit "
        f"difference {worst:.2e} (reference {REPO} at {COMMIT[:7]})"
    )
    return 0 if agree >= 0.99 * total else 1


if __name__ == "__main__":
    raise SystemExit(main())
