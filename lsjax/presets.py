"""The authors' own decoding settings, by name: `decode.py --preset NAME` expands into the flags below, and any
flag given on the command line as well wins over the preset's.

Each preset is what the method's paper or reference code runs by default; the numbers they report were measured
with these settings (on their targets and hardware, not here).
"""

from __future__ import annotations

from lsjax.config import ConfigError

PRESETS: dict[str, tuple[str, tuple[str, ...]]] = {
    # LongSpec (sail-sg/LongSpec `tree_spec_generate`, `--tree_shape 4 16 16 16 16`), greedy as in its tables.
    "longspec-paper": (
        "LongSpec's paper tree (4,16,16,16,16 beam), T = 0",
        ("--method", "longspec", "--tree", "paper"),
    ),
    # TokenSwift (bigai-nlco/TokenSwift `main.py`): gamma 4 (3 heads), the [1,3,3,3] tree, the top-20 n-grams, a
    # partial-KV draft pass; sampling at T = 1 with min-p 0.1 and the contextual penalty 1.2 over 1024 tokens.
    "tokenswift-paper": (
        "TokenSwift's settings: 3 heads, tree 1,3,3,3, top-20 4-grams, partial KV; T = 1, min-p 0.1, penalty 1.2/1024",
        (
            "--method",
            "tokenswift",
            "--ts-preset",
            "paper",
            "--temperature",
            "1.0",
            "--min-p",
            "0.1",
            "--penalty",
            "1.2",
            "--penalty-window",
            "1024",
        ),
    ),  # fmt: skip
    # EAGLE-3 (SafeAILab/EAGLE `EaModel.from_pretrained` defaults: total_token 60, depth 7, top_k 10), greedy.
    "eagle3-paper": (
        "EAGLE-3's published tree: 59 nodes, 8 levels, top-10, T = 0",
        ("--method", "eagle3", "--eagle-tree", "eagle3"),
    ),
}


def expand(argv: list[str]) -> list[str]:
    """argv with `--preset NAME` replaced by the preset's flags, placed first so the user's own flags win."""
    out, flags, i = [], [], 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--preset" or arg.startswith("--preset="):
            if "=" in arg:
                name = arg.split("=", 1)[1]
            elif i + 1 < len(argv):
                name, i = argv[i + 1], i + 1
            else:
                raise ConfigError(f"--preset: give one of {', '.join(PRESETS)}")
            if name not in PRESETS:
                raise ConfigError(f"--preset {name}: not one of {', '.join(PRESETS)}")
            flags += list(PRESETS[name][1])
        else:
            out.append(arg)
        i += 1
    return flags + out
