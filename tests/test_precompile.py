"""decode.py's warm start: `--precompile` makes a method's programs ready in the compile cache; a later run on
another prompt of the width and another --max-new-tokens compiles nothing, and says what it loaded
(`programs_compiled`, `programs_loaded`, the status line). In a fresh process: decode.py as a program sets JAX's
persistent cache process-wide."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import contextlib, io, json, sys
sys.path.insert(0, {root!r})
import lsjax.loading
from lsjax.cli import decode
from lsjax.loading import LoadedModel
from tests.decode_matrix import id_tokenizer
from tests.tiny import fake_loading, tiny_model
config, params = tiny_model()
model = LoadedModel(config, params, id_tokenizer(), __import__("pathlib").Path({work!r}) / "tiny.gguf")
lsjax.loading.__dict__.update(fake_loading(model))
def main(*argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = decode.main(["--compile-cache", {cache!r}, "--method", {method!r}, *argv], as_program=True)
    return code, out.getvalue(), err.getvalue()
code, out, err = main("--prompt", "abc abc abc", "--precompile", "256", "--max-new-tokens", "40", "--json")
print(json.dumps({{"code": code, "out": out, "err": err}}))
code, out, err = main("--prompt", "another prompt of another length", "--max-new-tokens", "9", "--json")
print(json.dumps({{"code": code, "out": out, "err": err}}))
code, out, err = main("--prompt", "a third one", "--max-new-tokens", "5")
print(json.dumps({{"code": code, "out": out, "err": err}}))
code, out, err = main("--prompt", "a fourth", "--max-new-tokens", "7", "--json")
print(json.dumps({{"code": code, "out": out, "err": err}}))
"""


@pytest.mark.parametrize("method", ["pld"])
def test_precompile_then_a_new_prompt_and_length_compile_nothing(tmp_path, method):
    script = SCRIPT.format(root=str(ROOT), work=str(tmp_path), cache=str(tmp_path / "cache"), method=method)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    warm, later, plain, fourth = (json.loads(line) for line in proc.stdout.strip().splitlines()[-4:])
    assert warm["code"] == 0 and later["code"] == 0 and plain["code"] == 0, (warm["err"], later["err"])
    made = json.loads(warm["out"])["precompiled"]
    assert [r["width"] for r in made] == [256]
    assert {p["name"]: p["how"] for p in made[0]["programs"]} == {"start": "compiled", "decode": "compiled"}
    summary = json.loads(later["out"])
    assert summary["programs_compiled"] == 0 and summary["programs_loaded"] == 2 and summary["new_tokens"] == 9
    assert summary["first_token_s"] <= summary["decode_program_in_use_s"] <= summary["last_token_s"]
    assert "programs: start loaded, decode loaded" in plain["err"]
    # The starts before it noted the programs they needed first: this one read them while the model loaded.
    assert summary["programs_read_ahead"] == 0 and fourth["code"] == 0
    assert json.loads(fourth["out"])["programs_read_ahead"] == 2


def decode_py(*args):
    return subprocess.run(
        [sys.executable, str(ROOT / "decode.py"), *args], capture_output=True, text=True, cwd=ROOT, timeout=300
    )


def test_precompile_names_a_bad_width_and_a_combination_that_keeps_nothing():
    proc = decode_py("--method", "ar", "--precompile", "300", "--prompt", "x")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "--precompile: 300 is not a prompt width below the context window; choose from [256, 512" in proc.stderr
    proc = decode_py("--precompile", "--compile-cache", "off", "--prompt", "x")
    assert proc.returncode == 2 and "--precompile with --compile-cache off: nothing is kept" in proc.stderr
    proc = decode_py("--precompile", "1024", "--mesh", "model=1", "--prompt", "x")
    assert proc.returncode == 2 and "--precompile with --mesh: programs over a mesh are not kept" in proc.stderr


def test_the_status_line_says_loading_for_a_program_read_from_the_cache(monkeypatch):
    from lsjax.cli import decode
    from lsjax.methods.pld.drafter import PLDDrafter

    assert decode.loading_label(PLDDrafter()) == "loading the decode program from the compile cache"

    class Auto:
        cost_names = ("ar", "pld-4", "ls-tree", "shadow")

    assert decode.loading_label(Auto()) == "loading auto's program (3 candidates) from the compile cache"
    assert decode.loading_label(Auto(), 3) == (
        "loading auto's first program from the compile cache (2 more as it asks for them)"
    )
    assert decode.loading_label(Auto(), 2) == "loading auto's 2 programs from the compile cache"  # (both at once)
    assert decode.compiling_label(Auto(), 3) == "compiling auto's 3 candidates (ar, pld-4, ls-tree) as 3 programs"
