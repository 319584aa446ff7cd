"""What the shipped LongSpec draft's acceptance comes from: its branches removed one at a time, no training.

    python -m studies.draft_ceiling.reads --out runs/draft_ceiling/reads
    python -m lsjax.bench.draft_accept --draft shipped --draft runs/draft_ceiling/reads/no-cross \\
        --draft runs/draft_ceiling/reads/no-self --suite dev

The draft's layer is embedding + self-attention over its window + cross-attention over the target's last-layer
K/V + MLP, each branch added to the residual stream. Zeroing a branch's output projection removes it exactly:
`no-cross` (cross_wo = 0) drafts from the tokens of its window alone, never reading the target; `no-self`
(self_wo = 0) from the root token and the target's K/V. Each variant is written as a draft directory that
`draft_accept` and `decode.py --draft` load, the shipped draft's config and vocabulary unchanged.
"""

from __future__ import annotations

import argparse
from pathlib import Path

VARIANTS = {"no-cross": ("cross_wo",), "no-self": ("self_wo",)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/draft_ceiling/reads")
    args = p.parse_args(argv)

    import numpy as np

    from lsjax import artifacts
    from lsjax.methods.longspec.checkpoint import DEFAULT_TARGET, DRAFTS_DIR

    src = DRAFTS_DIR / DEFAULT_TARGET
    arrays, meta = artifacts.load_weights(src, "longspec")
    for name, zeroed in VARIANTS.items():
        out = Path(args.out) / name
        variant = {k: np.zeros_like(v) if k in zeroed else v for k, v in arrays.items()}
        note = {"variant": f"the shipped draft with {', '.join(zeroed)} = 0 (studies/draft_ceiling/reads.py)"}
        artifacts.save_weights(out, variant, meta | note, kind="longspec")
        print(f"{out}: {', '.join(zeroed)} zeroed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
