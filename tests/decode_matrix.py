"""Every registered method in every decode.py mode, through decode.py's own `main()`, on a tiny target, in a
fresh process with fake CPU devices (tests/test_decode_matrix.py starts it). Prints one JSON line per cell:

    python tests/decode_matrix.py DEVICES WORKDIR [METHOD:MODE,...]      # default *:* (every cell)

A cell "ran" (exit 0: its JSON output), was "refused" (exit 2 with its one error line) or "crashed" (anything
else: the traceback). The methods come from the registry, so a method folder added later is in the matrix
without editing this file; the draft arguments below are only for the built-in methods that need a trained
draft, which a tiny random target has none of (a new method without an entry runs with its defaults).
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":  # the devices are fixed before jax is imported
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={int(sys.argv[1])}"
    os.environ["LSJAX_PROFILE_DIR"] = os.path.join(sys.argv[2], "profiles")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import contextlib  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402

PROMPT = "the cat sat on the mat. the cat sat on the mat. the cat sat on the"
NEW = 12

# mode -> decode.py flags. T = 0 modes are compared token for token with AR on one device.
MODES = {
    "one": [],
    "mesh": ["--mesh", "model=2"],
    "invariant": ["--invariant-rows", "auto"],
    "sampled": ["--temperature", "1", "--top-p", "0.9", "--seed", "3"],
    "compare": ["--compare", "ar"],
    "profile": ["--cost-profile", "measure"],  # then a second run reads what it cached
    "mesh-profile": ["--mesh", "model=2", "--cost-profile", "measure"],
}
GREEDY = ("one", "mesh", "invariant", "compare", "profile", "mesh-profile")


def id_tokenizer():
    """decode.py's tokenizer interface with one character per id, so equal text means equal tokens."""
    from tests.test_registry import ByteTokenizer

    class IdTokenizer(ByteTokenizer):
        def decode(self, ids, skip_special_tokens=True):
            return "".join(chr(0x4E00 + int(i)) for i in ids)

    return IdTokenizer()


def drafts(model, work: Path) -> dict[str, list[str]]:
    """Per built-in method that reads a trained draft: flags naming untrained ones made for the tiny target."""
    import jax
    import numpy as np

    from lsjax.config import BlockConfig, DraftConfig, LocalHeadConfig
    from lsjax.methods.dels import local_head as lh
    from lsjax.methods.dels.checkpoint import save_block_draft, save_local_head
    from lsjax.methods.dels.model import init_block_params

    config, params = model.config, model.params
    block, head = work / "block", work / "local-head"
    if not block.exists():
        dp = init_block_params(config, DraftConfig(window=8, init_head_scale=1.0), params)
        save_block_draft(block, dp, DraftConfig(window=8), BlockConfig(4), config.name)
        hcfg = LocalHeadConfig(kind="gru", hidden=16, rank=8, block_size=4)
        hp = lh.init_params(hcfg, config.hidden_size, jax.random.key(1))
        save_local_head(head, hp, hcfg, np.zeros(config.vocab_size, np.float32), config.name)
    return {
        "longspec": ["--draft", "random"],
        "hybrid": ["--draft", "random"],
        "auto": ["--draft", "random"],
        "streams": ["--draft", "random"],
        "tokenswift": ["--draft", "zero"],
        "block": ["--draft", str(block)],
        "dels": ["--draft", str(block), "--local-head", str(head)],
        "eagle3": ["--draft", "random", "--eagle-tree", "cpu"],
        "dflash": ["--draft", "random", "--dflash-tree", "cpu"],
    }


def run_cell(decode, argv: list[str]) -> dict:
    out, err = io.StringIO(), io.StringIO()
    t0 = time.perf_counter()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = decode.main(argv)
    except SystemExit as e:
        code = e.code
    except BaseException:  # noqa: BLE001 - a crash is the cell's result
        return {"status": "crashed", "error": traceback.format_exc()[-3000:], "stderr": err.getvalue()[-2000:]}
    seconds = round(time.perf_counter() - t0, 1)
    if code == 0:
        lines = out.getvalue().strip().splitlines()
        said = err.getvalue()
        # What auto said of its cost profile: measured it (the progress bar), and the one-line reasons why.
        profile = [x for x in said.splitlines() if "profile" in x and "profiling auto's" not in x or "measuring" in x]
        return {"status": "ran", "seconds": seconds, "out": json.loads(lines[-1]), "stderr": said[-2000:],
                "profiled": "profiling auto's candidates" in said, "profile_lines": profile}  # fmt: skip
    errors = [line for line in err.getvalue().splitlines() if "error" in line.lower()]
    return {"status": "refused" if code == 2 else "crashed", "code": code, "seconds": seconds, "errors": errors,
            "stderr": err.getvalue()[-2000:]}  # fmt: skip


def cells(selection: str, methods: tuple[str, ...]) -> list[tuple[str, str]]:
    """The (method, mode) cells a selection names: comma-separated METHOD:MODE, either part `*` (all), in the
    registry's and MODES' order. The profile modes run only for methods with a cost profile (others would run
    their plain cell again, with a warning that the flag does not apply)."""
    from lsjax.methods import registry

    wanted = [part.split(":") for part in selection.split(",")]
    return [
        (m, mode)
        for m in methods
        for mode in MODES
        if any(w[0] in ("*", m) and w[1] in ("*", mode) for w in wanted)
        and (not mode.endswith("profile") or "cost_profile" in registry.get(m).options())
    ]


def main(devices: int, work: Path, selection: str) -> None:
    import lsjax.loading
    from lsjax.cli import decode
    from lsjax.loading import LoadedModel
    from lsjax.methods import registry
    from lsjax.runtime.cache import enable
    from tests.tiny import fake_loading, tiny_model

    # A cell's second start (the profile modes) reads its programs from JAX's cache as a user's would; without
    # one it compiled auto's whole program again (~35 s of the default suite's ~3 min here).
    enable(str(work / "jax-cache"), "decode_matrix")
    config, params = tiny_model(arch=os.environ.get("LSJAX_MATRIX_ARCH", "llama"))
    model = LoadedModel(config, params, id_tokenizer(), work / "tiny.gguf")
    lsjax.loading.__dict__.update(fake_loading(model))
    extra = drafts(model, work)
    base = ["--prompt", PROMPT, "--max-new-tokens", str(NEW), "--ignore-eos", "--json"]
    for method, mode in cells(selection, registry.names()):
        argv = [*base, "--method", method, *extra.get(method, []), *MODES[mode]]
        cell = {"method": method, "mode": mode, **run_cell(decode, argv)}
        if mode.endswith("profile") and cell["status"] == "ran":  # the second start reads the cached profile
            second = run_cell(decode, [a if a != "measure" else "cached" for a in argv])
            cell["cached"] = second
        print(json.dumps(cell), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "*:*")
