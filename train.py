"""Train a draft: python train.py --config configs/train/X.yaml (`lsjax.cli.train`; installed as lsjax-train)."""

import sys

from lsjax.cli.train import main

if __name__ == "__main__":
    sys.exit(main())
