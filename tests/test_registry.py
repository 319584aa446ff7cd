"""The drafter registry: a drafter defined and registered in this file, with no edit to any lsjax file, runs
through decode.py's code path and the bench's method list; and decoding never imports the trainer.

The toy drafter is deliberately minimal (a fixed chain repeating the root token, no state, no params), so it
follows the drafter interface however that evolves.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp
import pytest

from lsjax.engine.types import Drafter
from lsjax.methods import registry
from lsjax.methods.pld.config import PLD_TOKENS
from lsjax.tree import TreeConfig, chain_parents, make_tree
from tests.tiny import fake_loading, tiny_model

ROOT = Path(__file__).resolve().parents[1]
TRAINER_MODULES = ("optax", "orbax", "grain")


@dataclasses.dataclass(frozen=True)
class RepeatDrafter(Drafter):
    """Proposes the root token `depth` more times, as a chain: lossless like any proposal, and accepted
    whenever the target's greedy output repeats a token."""

    depth: int = 3

    name = "toy-repeat"

    @property
    def tree(self) -> TreeConfig:
        return TreeConfig((1,) * self.depth)

    def propose(self, ctx, state, draft_state, key):
        B, T = state.root.shape[0], self.depth + 1
        tokens = jnp.broadcast_to(state.root[:, None], (B, T))
        parents = jnp.broadcast_to(jnp.asarray(chain_parents(T)), (B, T))
        return make_tree(tokens, parents, jnp.ones((B, T), bool), self.tree)


class ByteTokenizer:
    """Just enough of lsjax's Tokenizer for decode.py and the bench: bytes -> ids in [3, 93)."""

    def encode(self, text, add_special_tokens=True):
        return [3 + b % 90 for b in text.encode()]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(32 + (i - 3) % 90) for i in ids)

    def stream_decoder(self, skip_special_tokens=True):
        tok = self

        class Stream:
            def push(self, ids):
                return tok.decode(ids)

            def flush(self):
                return ""

        return Stream()


@dataclasses.dataclass(frozen=True)
class ToyOptions:
    toy_depth: int = registry.option(3, "tokens the chain repeats")


@pytest.fixture
def toy():
    @registry.register("toy-repeat", ToyOptions, help="repeat the last token (a test drafter)")
    def build(model, opts: ToyOptions, cache):
        return RepeatDrafter(depth=opts.toy_depth), None

    yield "toy-repeat"
    registry.unregister("toy-repeat")


@pytest.fixture(scope="module")
def tiny_loaded(tmp_path_factory):
    from lsjax.loading import LoadedModel

    config, params = tiny_model()
    return LoadedModel(config, params, ByteTokenizer(), tmp_path_factory.mktemp("toy") / "toy.gguf")


def test_registry_builds_the_builtin_methods():
    assert registry.names()[:4] == ("ar", "longspec", "hybrid", "pld")
    config, params = tiny_model()
    model = type("M", (), {"config": config, "params": params, "path": None})()
    pld, none = registry.build("pld", model, pld_tokens=None, pld_ngram=2)
    assert (pld.num_tokens, pld.ngram_max, none) == (PLD_TOKENS, 2, None)
    with pytest.raises(registry.ConfigError, match="method: unknown method 'nope'"):
        registry.build("nope", model)


def test_toy_drafter_runs_through_decode_py(toy, tiny_loaded, monkeypatch, capsys):
    import lsjax.loading
    from lsjax.cli import decode

    for name, fn in fake_loading(tiny_loaded).items():
        monkeypatch.setattr(lsjax.loading, name, fn)
    argv = ["--prompt", "abcabcabc abcabc", "--method", toy, "--max-new-tokens", "12", "--ignore-eos"]
    assert decode.main([*argv, "--compare", "ar"]) == 0
    err = capsys.readouterr().err
    assert f"method {toy}" in err and "12 tokens" in err
    assert "outputs identical" in err  # the engine verifies any drafter's proposal losslessly


def _bench_args(tmp_path, toy, *more):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "loop", "prompt": "xyzxyzxyz xyzxyz xyz"}) + "\n")
    return ["--prompts", str(prompts), "--methods", f"lsjax-{toy}", "--out", str(tmp_path / "out"), *more]


def test_toy_drafter_is_a_bench_method(toy, tiny_loaded, tmp_path):
    from lsjax.bench import run as bench
    from lsjax.config import GenerateConfig

    methods = bench.available_methods()
    assert list(methods)[:4] == ["lsjax-ar", "lsjax-longspec", "lsjax-hybrid", "lsjax-pld"]
    assert f"lsjax-{toy}" in methods and bench.parse_args(_bench_args(tmp_path, toy)).methods == [f"lsjax-{toy}"]
    ctx = bench._context(tiny_loaded, bench.parse_args(_bench_args(tmp_path, toy)))
    ours, ar = methods[f"lsjax-{toy}"](ctx), methods["lsjax-ar"](ctx)
    assert ours.speculative and ours.lossless and not ar.speculative
    ids, gen = tiny_loaded.tokenizer.encode("xyzxyzxyz xyzxyz xyz"), GenerateConfig(max_new_tokens=8, ignore_eos=True)
    out = ours.run(ids, gen, 0)
    assert out.tokens == ar.run(ids, gen, 0).tokens and out.target_forwards <= 8


@pytest.mark.slow
def test_toy_drafter_in_a_full_bench_run(toy, tiny_loaded, monkeypatch, tmp_path):
    from lsjax.bench import run as bench

    monkeypatch.setattr(bench, "_SHARED", {"model": tiny_loaded})  # the tiny model instead of SmolLM2
    result = bench.run(_bench_args(tmp_path, toy, "--temperatures", "0", "--max-new-tokens", "8", "--split-steps", "1"))
    assert result["passed"] and result["meta"]["methods"] == ["lsjax-ar", f"lsjax-{toy}"]
    row = next(r for r in result["rows"] if r["method"] == f"lsjax-{toy}")
    assert row["equal_to_lsjax_ar"] is True and row["new_tokens"] == 8


def test_decoding_never_imports_the_trainer():
    """`import lsjax.engine.step` and `decode.py --help` (which lists every registered drafter) leave optax,
    orbax and grain unloaded: decoding must not pay for, or depend on, the training stack."""
    script = f"""
import json, runpy, sys
def loaded():
    return sorted(m for m in sys.modules if m.split(".")[0] in {TRAINER_MODULES!r} or m.startswith("lsjax.train"))
import lsjax.engine.step
first = loaded()
sys.argv = ["decode.py", "--help"]
try:
    runpy.run_path({str(ROOT / "decode.py")!r}, run_name="__main__")
except SystemExit:
    pass
import lsjax.methods.longspec.checkpoint, lsjax.loading
print(json.dumps([first, loaded()]))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    first, after_help = json.loads(proc.stdout.strip().splitlines()[-1])
    assert first == [] and after_help == []
    assert "--method {ar,longspec,hybrid,pld" in proc.stdout
