"""The default method on a mesh, as a user runs it: `decode.py --mesh model=3` with no --method against one
device, on SmolLM2-135M (3 KV heads) with 3 fake CPU devices, on two long prompts (the bundled speech, prose;
a repository-level code prompt from the dev split), greedy. Prints one JSON row per prompt and a last line
saying whether every pair is identical.

    python -m studies.mesh_default.mesh_default [--max-new-tokens 48] [--code-tokens 1024]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def decode(prompt_args: list[str], extra: list[str], new: int, work: Path) -> dict:
    env = {
        **os.environ,
        "XLA_FLAGS": "--xla_force_host_platform_device_count=3",
        "LSJAX_PROFILE_DIR": str(work / "profiles"),
    }
    cmd = [sys.executable, str(ROOT / "decode.py"), *prompt_args, "--max-new-tokens", str(new), "--json"]
    proc = subprocess.run(
        [*cmd, "--compile-cache", str(work / "cache"), *extra], capture_output=True, text=True, env=env, cwd=ROOT
    )
    if proc.returncode != 0:
        sys.exit(f"mesh_default: decode.py {' '.join(extra)} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--code-tokens", type=int, default=1024)
    args = p.parse_args()
    from lsjax.loading import load_model
    from lsjax.prompts import stdlib_code_prompt

    code = stdlib_code_prompt(load_model().tokenizer, args.code_tokens)
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "code.txt").write_text(code.text)
        prompts = {"prose (bundled speech, chat)": [], "code (dev stdlib)": ["--prompt-file", str(work / "code.txt")]}
        for name, prompt in prompts.items():
            one = decode(prompt, [], args.max_new_tokens, work)
            mesh = decode(prompt, ["--mesh", "model=3"], args.max_new_tokens, work)
            same = one["text"] == mesh["text"]
            ok &= same
            row = {"prompt": name, "prompt_tokens": one["prompt_tokens"], "new_tokens": one["new_tokens"]}
            row.update(method=one["method"], mesh=mesh["mesh"], identical=same)
            row.update(tau_one_device=one["mean_accepted"], tau_mesh=mesh["mean_accepted"])
            print(json.dumps(row), flush=True)
    print(json.dumps({"identical_on_every_prompt": ok}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
